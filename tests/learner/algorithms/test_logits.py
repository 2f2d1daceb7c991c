"""Token log-probabilities and entropies: exactness against log_softmax, gradients, memory."""

from __future__ import annotations

import pytest
import torch

from learner.algorithms import entropy_from_logits, token_logprobs, token_logprobs_and_entropy


def reference(logits: torch.Tensor, tokens: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    logsm = torch.log_softmax(logits.float(), -1)
    logp = logsm.gather(-1, tokens[..., None]).squeeze(-1)
    return logp, -(logsm.exp() * logsm).sum(-1)


@pytest.mark.parametrize("block_rows", [1, 3, 7, 1000])  # blocks that do and do not divide T
@pytest.mark.parametrize("wants", ["logp", "entropy", "both"])
def test_values_and_gradients_match_log_softmax(block_rows: int, wants: str):
    gen = torch.Generator().manual_seed(block_rows)
    b, t, v = 3, 10, 17
    logits = (torch.randn(b, t, v, generator=gen, dtype=torch.float64) * 3).requires_grad_()
    tokens = torch.randint(0, v, (b, t), generator=gen)
    w_lp, w_h = torch.randn(b, t, generator=gen), torch.randn(b, t, generator=gen)
    blk = block_rows * v
    lp, h = token_logprobs_and_entropy(logits, tokens, block_elements=blk)
    ref_lp, ref_h = reference(logits, tokens)
    assert torch.allclose(lp, ref_lp.float(), atol=1e-5)
    assert torch.allclose(h, ref_h.float(), atol=1e-5)
    if wants == "logp":
        ours = (token_logprobs(logits, tokens, block_elements=blk) * w_lp).sum()
        ref = (ref_lp * w_lp).sum()
    elif wants == "entropy":
        ours = (entropy_from_logits(logits, block_elements=blk) * w_h).sum()
        ref = (ref_h * w_h).sum()
    else:
        ours = (lp * w_lp).sum() + (h * w_h).sum()
        ref = (ref_lp * w_lp).sum() + (ref_h * w_h).sum()
    (g,) = torch.autograd.grad(ours, logits)
    (g_ref,) = torch.autograd.grad(ref, logits)
    assert g.dtype == logits.dtype
    assert torch.allclose(g, g_ref, atol=1e-5)


def test_non_contiguous_slice_and_2d_input():
    gen = torch.Generator().manual_seed(0)
    full = torch.randn(2, 12, 9, generator=gen).requires_grad_()
    logits = full[:, 3:-1]  # the response part of a prompt+response forward pass
    assert not logits.is_contiguous()
    tokens = torch.randint(0, 9, (2, 8), generator=gen)
    lp = token_logprobs(logits, tokens, block_elements=9 * 3)
    ref_lp, _ = reference(logits, tokens)
    assert torch.allclose(lp, ref_lp, atol=1e-6)
    (g,) = torch.autograd.grad(lp.sum(), full)
    (g_ref,) = torch.autograd.grad(ref_lp.sum(), full)
    assert torch.allclose(g, g_ref, atol=1e-6)
    flat = torch.randn(5, 9, generator=gen)
    tok = torch.randint(0, 9, (5,), generator=gen)
    assert torch.allclose(token_logprobs(flat, tok), reference(flat, tok)[0], atol=1e-6)


def test_bfloat16_logits_are_upcast():
    gen = torch.Generator().manual_seed(1)
    logits = (torch.randn(2, 6, 50, generator=gen) * 4).bfloat16().requires_grad_()
    tokens = torch.randint(0, 50, (2, 6), generator=gen)
    lp, h = token_logprobs_and_entropy(logits, tokens)
    ref_lp, ref_h = reference(logits.detach().float(), tokens)
    assert lp.dtype == torch.float32
    assert torch.allclose(lp, ref_lp, atol=1e-5) and torch.allclose(h, ref_h, atol=1e-5)
    (g,) = torch.autograd.grad(lp.sum(), logits)
    assert g.dtype == torch.bfloat16


def test_extreme_logits_stay_finite():
    logits = torch.tensor([[[1e4, -1e4, 0.0], [-3e4, -3e4, -3e4]]], requires_grad=True)
    tokens = torch.tensor([[1, 2]])
    lp, h = token_logprobs_and_entropy(logits, tokens)
    assert torch.isfinite(lp).all() and torch.isfinite(h).all()
    assert lp[0, 1].item() == pytest.approx(-torch.log(torch.tensor(3.0)).item())
    assert h[0, 0].item() == pytest.approx(0.0, abs=1e-6)
    (g,) = torch.autograd.grad(lp.sum() + h.sum(), logits)
    assert torch.isfinite(g).all()


def test_saves_no_vocabulary_sized_copy():
    """Autograd keeps only the logits themselves plus per-token numbers, not a softmax copy."""
    b, t, v = 2, 64, 1000
    logits = torch.randn(b, t, v, requires_grad=True)
    tokens = torch.randint(0, v, (b, t))
    saved: list[torch.Tensor] = []

    def pack(x: torch.Tensor) -> torch.Tensor:
        saved.append(x)
        return x

    with torch.autograd.graph.saved_tensors_hooks(pack, lambda x: x):
        token_logprobs_and_entropy(logits, tokens, block_elements=4 * v)
    extra = sum(
        x.numel() * x.element_size()
        for x in saved
        if x.untyped_storage().data_ptr() != logits.untyped_storage().data_ptr()
    )
    assert saved, "the hook saw nothing: the check would be vacuous"
    assert extra <= 4 * b * t * 8  # lse, entropy, tokens: a few numbers per token
    with torch.autograd.graph.saved_tensors_hooks(pack, lambda x: x):
        saved.clear()
        reference(logits, tokens)
    ref_extra = sum(
        x.numel() * x.element_size() for x in saved if x.data_ptr() != logits.data_ptr()
    )
    assert ref_extra >= b * t * v * 4  # the naive version does keep a [B, T, V] copy


def test_bad_tokens_shape_is_named():
    with pytest.raises(ValueError, match="tokens"):
        token_logprobs(torch.zeros(2, 3, 4), torch.zeros(2, 4, dtype=torch.long))
