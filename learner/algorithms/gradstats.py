"""Per-prompt gradient statistics from the step's own forward and backward (no extra pass).

The allocator's ``grad`` method gives each prompt samples in proportion to the spread of its
per-sample gradient. The learner measures a cheap proxy of it on every batch it trains on: the
gradient its loss puts on the **output layer** (the LM head's weight W, logits z = W·h), whose
per-token form is known in closed form — the "ghost norm". For a token with hidden state h,
sampling temperature τ and sampled token y, ∂logp/∂W = (e_y − π)·hᵀ / τ with π = softmax(z/τ), so

    ‖∂logp/∂W‖_F = ‖e_y − π‖ · ‖h‖ / τ,   ‖e_y − π‖² = 1 − 2·π_y + Σ_v π_v²

(:func:`output_ghost_norms`, one pass over the logits the forward made anyway, in blocks). The
backward the step runs anyway gives every token's ∂loss/∂logp = c_t (a hook on the log-probs):
everything the objective does — advantages, clipping, IS weights, modulation, the normaliser —
is in it. A response's statistic is then

    s_j = normaliser · Σ_t |c_t| · ghost_t

the triangle-inequality bound of the norm of its output-layer gradient, in the units of the
unnormalised loss (:func:`response_grad_norms`). Per prompt, over its group of n responses,
u_j = n·s_j is one sample's share of the group-mean gradient under prompt-mean weighting, and the
prompt's statistics are their mean and spread √(mean u_j²) (:func:`group_grad_stats`): with
GRPO's zero-mean advantages the group's mean gradient mostly cancels, so the root mean square is
the spread a Neyman allocation (n_i ∝ spread_i) wants. A group with zero advantage has spread 0.

Pure functions of tensors (this package's rule); the trainer collects and reports them
(``learner/grad_report.py``).
"""

from __future__ import annotations

import torch

from learner.algorithms.logits import _blocks, default_block_elements

__all__ = ["group_grad_stats", "output_ghost_norms", "response_grad_norms"]


@torch.no_grad()
def output_ghost_norms(
    logits: torch.Tensor,
    tokens: torch.Tensor,
    hidden_norms: torch.Tensor,
    temperature: torch.Tensor | None = None,
    *,
    block_elements: int | None = None,
) -> torch.Tensor:
    """‖∂logp_t/∂W‖ per token, ``[B, T]``: ‖e_y − softmax(z/τ)‖ · ‖h‖ / τ.

    ``logits`` ``[B, T, V]`` (the LM head's output), ``hidden_norms`` ``[B, T]`` its input's
    norms, ``temperature`` ``[B]`` each row's τ (None: 1). Blockwise in float32 like the
    log-probs; no copy of the logits."""
    b, t, _ = logits.shape
    out = torch.empty((b, t), dtype=torch.float32, device=logits.device)
    if logits.dim() != 3 or tokens.shape != (b, t) or hidden_norms.shape != (b, t):
        raise ValueError(
            f"need logits [B, T, V] with tokens and hidden_norms [B, T], got "
            f"{tuple(logits.shape)}, {tuple(tokens.shape)}, {tuple(hidden_norms.shape)}"
        )
    tau = torch.ones(b) if temperature is None else temperature.float().reshape(b)
    taus = tau.tolist()
    blk = block_elements or default_block_elements(logits.device)
    for i, sl in _blocks(logits.shape, blk)[1]:
        p = torch.softmax(logits[i, sl].float() / taus[i], dim=-1)
        p_y = p.gather(-1, tokens[i, sl, None].long()).squeeze(-1)
        sq = 1.0 - 2.0 * p_y + p.square().sum(-1)
        out[i, sl] = sq.clamp_min_(0.0).sqrt_()
    return out * hidden_norms.float() / tau.to(out.device)[:, None]


def response_grad_norms(
    coef: torch.Tensor, ghost: torch.Tensor, mask: torch.Tensor, normalizer: float
) -> torch.Tensor:
    """s_j = normaliser · Σ_t |c_t| · ghost_t over each response's trained tokens, ``[B]``."""
    return (coef.abs() * ghost * mask).sum(-1) * normalizer


def group_grad_stats(
    norms: torch.Tensor, group_ids: torch.Tensor
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Per group (``torch.unique`` order of ``group_ids``): its ids, mean u and spread √mean u²
    with u_j = n·s_j, n the group's size in ``norms``."""
    groups, inverse, sizes = torch.unique(group_ids, return_inverse=True, return_counts=True)
    u = norms.double() * sizes[inverse].double()
    total = torch.zeros(groups.numel(), dtype=torch.float64).index_add_(0, inverse, u)
    square = torch.zeros(groups.numel(), dtype=torch.float64).index_add_(0, inverse, u * u)
    return groups, total / sizes, (square / sizes).sqrt()
