"""Token log-probabilities and entropies from logits, without a full-vocabulary softmax copy.

For logits ``z[B, T, V]`` (V = vocabulary) the obvious ``log_softmax(z).gather(...)`` materialises
another ``[B, T, V]`` tensor (1 GiB at B=8, T=1024, V=32k in float32), and autograd keeps it for
the backward pass. Here the work is done in blocks of rows (a few MiB each), inside a custom
autograd function that saves only the logits (which exist anyway) and two numbers per token
(``lse`` and the entropy), and writes the gradient block by block into one buffer.

Formulas, per token with ``lse = log Σ_v exp z_v`` and ``p = softmax(z)``:
- ``logp = z_y − lse`` (y the sampled token), ``∂logp/∂z = onehot(y) − p``;
- ``H = lse − Σ_v p_v z_v``, ``∂H/∂z = −p (log p + H) = −p (z − lse + H)``.
Computation is in float32 whatever the logits' dtype (bf16 logits are upcast block by block).
Divide the logits by the sampling temperature before calling these.
"""

from __future__ import annotations

from typing import Any

import torch

DEFAULT_BLOCK_ELEMENTS = 1 << 21
"""Logit elements per block (8 MiB in float32): large enough to amortise the Python loop, small
enough that the block temporaries stay in cache-sized chunks."""


def _as_3d(logits: torch.Tensor) -> torch.Tensor:
    """View as ``[B, T, V]``; merge B and T when the memory layout allows it without a copy."""
    if logits.dim() == 2:
        logits = logits.unsqueeze(0)
    if logits.dim() != 3:
        raise ValueError(f"logits must be [B, T, V] or [N, V], got shape {tuple(logits.shape)}")
    b, t, v = logits.shape
    try:
        return logits.view(1, b * t, v)
    except RuntimeError:  # e.g. logits[:, prompt_len - 1 : -1] of a larger tensor: loop per row
        return logits


def _blocks(shape: torch.Size, block_elements: int) -> list[tuple[int, slice]]:
    b, t, v = shape
    rows = max(1, block_elements // max(v, 1))
    return [(i, slice(s, min(s + rows, t))) for i in range(b) for s in range(0, t, rows)]


class _LogprobEntropy(torch.autograd.Function):
    """``(logp[B, T], entropy[B, T])`` of ``logits[B, T, V]`` at ``tokens[B, T]``, blockwise."""

    @staticmethod
    def forward(
        ctx: Any,
        logits: torch.Tensor,
        tokens: torch.Tensor,
        with_entropy: bool,
        block_elements: int,
    ) -> tuple[torch.Tensor, torch.Tensor]:
        z3 = _as_3d(logits)
        tok3 = tokens.reshape(z3.shape[:2])
        out_shape = z3.shape[:2]
        logp = torch.empty(out_shape, dtype=torch.float32, device=logits.device)
        lse = torch.empty_like(logp)
        entropy = torch.zeros_like(logp)
        for b, sl in _blocks(z3.shape, block_elements):
            z = z3[b, sl].float()
            m = z.amax(-1, keepdim=True)
            shifted = z - m  # temp block; its exp cannot overflow
            e = shifted.exp()
            s = e.sum(-1)
            log_s = s.log()
            logp[b, sl] = shifted.gather(-1, tok3[b, sl, None]).squeeze(-1) - log_s
            lse[b, sl] = log_s + m.squeeze(-1)
            if with_entropy:
                # H = log s − Σ e·(z − m) / s, the max-shifted form (no cancellation of big lse).
                entropy[b, sl] = log_s - e.mul_(shifted).sum(-1) / s
        ctx.save_for_backward(logits, tokens, lse, entropy)
        ctx.block_elements = block_elements
        ctx.set_materialize_grads(False)
        shape = tokens.shape
        return logp.view(shape), entropy.view(shape)

    @staticmethod
    @torch.autograd.function.once_differentiable
    def backward(
        ctx: Any, grad_logp: torch.Tensor | None, grad_entropy: torch.Tensor | None
    ) -> tuple[torch.Tensor | None, None, None, None]:
        logits, tokens, lse, entropy = ctx.saved_tensors
        if grad_logp is None and grad_entropy is None:
            return None, None, None, None
        z3 = _as_3d(logits)
        tok3 = tokens.reshape(z3.shape[:2])
        lse3 = lse.view(z3.shape[:2])
        h3 = entropy.view(z3.shape[:2])
        g_lp = None if grad_logp is None else grad_logp.reshape(z3.shape[:2]).float()
        g_h = None if grad_entropy is None else grad_entropy.reshape(z3.shape[:2]).float()
        # A fresh contiguous buffer can be viewed in whichever block layout z3 uses.
        grad = torch.empty(logits.shape, dtype=logits.dtype, device=logits.device)
        grad3 = grad.view(z3.shape)
        for b, sl in _blocks(z3.shape, ctx.block_elements):
            z = z3[b, sl].float()
            centred = z - lse3[b, sl, None]  # = log p
            p = centred.exp()
            if g_h is not None:
                # −p · (g_lp + g_H (log p + H)), then + g_lp at the sampled token.
                coef = centred.add_(h3[b, sl, None]).mul_(g_h[b, sl, None])
                if g_lp is not None:
                    coef.add_(g_lp[b, sl, None])
                block = coef.mul_(p).neg_()
            else:
                block = p.mul_(-g_lp[b, sl, None])
            if g_lp is not None:
                block.scatter_add_(-1, tok3[b, sl, None], g_lp[b, sl, None])
            grad3[b, sl] = block
        return grad, None, None, None


def _check_tokens(logits: torch.Tensor, tokens: torch.Tensor) -> None:
    if tokens.shape != logits.shape[:-1]:
        raise ValueError(
            f"tokens must have shape {tuple(logits.shape[:-1])} (logits without the vocabulary "
            f"axis), got {tuple(tokens.shape)}"
        )
    if tokens.dtype not in (torch.int64, torch.int32):
        raise ValueError(f"tokens must be an int64/int32 tensor, got {tokens.dtype}")


def token_logprobs(
    logits: torch.Tensor, tokens: torch.Tensor, *, block_elements: int = DEFAULT_BLOCK_ELEMENTS
) -> torch.Tensor:
    """``log softmax(logits)[..., tokens]``: ``[B, T, V], [B, T] -> [B, T]`` (float32).

    Differentiable; memory-lean (see the module docstring).
    """
    _check_tokens(logits, tokens)
    logp, _ = _LogprobEntropy.apply(logits, tokens.long(), False, block_elements)
    return logp


def entropy_from_logits(
    logits: torch.Tensor, *, block_elements: int = DEFAULT_BLOCK_ELEMENTS
) -> torch.Tensor:
    """Entropy of ``softmax(logits)`` per position: ``[B, T, V] -> [B, T]`` (float32).

    ``H = lse − Σ_v p_v z_v``; differentiable; memory-lean.
    """
    tokens = torch.zeros(logits.shape[:-1], dtype=torch.long, device=logits.device)
    _, entropy = _LogprobEntropy.apply(logits, tokens, True, block_elements)
    return entropy


def token_logprobs_and_entropy(
    logits: torch.Tensor, tokens: torch.Tensor, *, block_elements: int = DEFAULT_BLOCK_ELEMENTS
) -> tuple[torch.Tensor, torch.Tensor]:
    """Both ``token_logprobs`` and ``entropy_from_logits`` in one pass over the logits.

    The entropy shares the block's ``exp`` with the log-probability, so it costs far less than a
    separate pass; both outputs are differentiable (use ``.detach()`` on the entropy for DynaMO).
    """
    _check_tokens(logits, tokens)
    return _LogprobEntropy.apply(logits, tokens.long(), True, block_elements)
