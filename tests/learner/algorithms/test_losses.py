"""Policy, value, KL, DPO losses and aggregation: hand cases, gradients, properties."""

from __future__ import annotations

import math

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from learner.algorithms import (
    AGG_MODES,
    KL_KINDS,
    POLICY_LOSSES,
    aggregate_loss,
    dpo_loss,
    gspo_loss,
    kl_penalty,
    policy_loss,
    value_loss,
)


def test_kl_penalty_hand_computed():
    logp = torch.tensor([[0.0]])
    ref = torch.tensor([[math.log(0.5)]])
    d = -math.log(0.5)
    assert kl_penalty(logp, ref, "k1").item() == pytest.approx(d)
    assert kl_penalty(ref, logp, "abs").item() == pytest.approx(d)
    assert kl_penalty(logp, ref, "k2").item() == pytest.approx(0.5 * d * d)
    # k3 = exp(ref − logp) − (ref − logp) − 1 = 0.5 + d − 1
    for kind in ("k3", "low_var_kl"):
        assert kl_penalty(logp, ref, kind).item() == pytest.approx(0.5 + d - 1, rel=1e-6)


def test_k3_clamps_ratio_and_result():
    logp = torch.tensor([[-100.0, 0.0]])
    ref = torch.tensor([[0.0, -100.0]])
    out = kl_penalty(logp, ref, "k3")
    assert out[0, 0].item() == 10.0  # exp(20) − 20 − 1, clamped to 10
    # ref − logp = −100 is clamped to −20: exp(−20) + 20 − 1 = 19, clamped to 10
    assert out[0, 1].item() == 10.0
    assert torch.isfinite(out).all()


def test_kl_unknown_kind_lists_known():
    with pytest.raises(ValueError, match="k3"):
        kl_penalty(torch.zeros(1, 1), torch.zeros(1, 1), "k4")
    with pytest.raises(ValueError, match="ref_logp"):
        kl_penalty(torch.zeros(2, 3), torch.zeros(1, 3), "k1")


def test_bfloat16_inputs_are_upcast():
    logp = torch.tensor([[-1.0, -2.0]]).bfloat16().requires_grad_()
    old = torch.tensor([[-1.1, -2.0]]).bfloat16()
    adv = torch.tensor([[1.0, -1.0]]).bfloat16()
    loss, _ = policy_loss(logp, old, adv, torch.ones(1, 2), clip_low=0.2, clip_high=0.2)
    assert loss.dtype == torch.float32
    ref, _ = policy_loss(logp.float(), old.float(), adv.float(), torch.ones(1, 2))
    assert loss.item() == pytest.approx(ref.item())
    (grad,) = torch.autograd.grad(loss, logp)
    assert grad.dtype == torch.bfloat16


@settings(max_examples=100, deadline=None)
@given(
    logp=st.floats(-50, 0, allow_nan=False, width=32),
    ref=st.floats(-50, 0, allow_nan=False, width=32),
)
def test_k3_is_non_negative(logp: float, ref: float):
    out = kl_penalty(torch.tensor([[logp]]), torch.tensor([[ref]]), "k3")
    assert out.item() >= 0.0


LOSS = torch.tensor([[1.0, 2.0, 3.0], [4.0, 5.0, 6.0], [7.0, 8.0, 9.0]])
MASK = torch.tensor([[1, 1, 0], [1, 0, 0], [0, 0, 0]])


@pytest.mark.parametrize(
    ("mode", "expected"),
    [
        ("token-mean", 7 / 3),
        ("seq-mean-token-sum", (3 + 4) / 2),
        ("seq-mean-token-mean", (1.5 + 4) / 2),
        ("seq-mean-token-sum-norm", (3 / 3 + 4 / 3) / 2),
    ],
)
def test_aggregate_loss_hand_computed(mode: str, expected: float):
    # row 2 has no valid token: it is left out of the sequence means
    assert aggregate_loss(LOSS, MASK, mode).item() == pytest.approx(expected)


def test_aggregate_loss_normalizer_and_errors():
    assert aggregate_loss(LOSS, MASK, "token-mean", normalizer=7.0).item() == pytest.approx(1.0)
    assert aggregate_loss(LOSS, MASK, "seq-mean-token-sum", normalizer=7.0).item() == pytest.approx(
        1.0
    )
    empty = aggregate_loss(LOSS.clone().requires_grad_(), torch.zeros(3, 3), "token-mean")
    assert empty.item() == 0.0 and empty.requires_grad
    with pytest.raises(ValueError, match="seq-mean-token-mean"):
        aggregate_loss(LOSS, MASK, "mean")
    assert set(AGG_MODES) == {
        "token-mean",
        "seq-mean-token-sum",
        "seq-mean-token-mean",
        "seq-mean-token-sum-norm",
        "prompt-mean",
    }


def test_policy_loss_hand_computed():
    ratios = torch.tensor([[1.5, 0.5, 0.5, 5.0]])
    adv = torch.tensor([[1.0, 1.0, -1.0, -1.0]])
    old = torch.zeros(1, 4)
    logp = ratios.log().requires_grad_()
    mask = torch.ones(1, 4)
    loss, metrics = policy_loss(logp, old, adv, mask, clip_low=0.2, clip_high=0.2, dual_clip=3.0)
    # −1.2 (upper clip), −0.5 (unclipped), 0.8 (lower clip), 3 (dual clip caps −A·5 at 3)
    assert loss.item() == pytest.approx((-1.2 - 0.5 + 0.8 + 3.0) / 4)
    assert metrics["clipfrac_upper"].item() == pytest.approx(0.25)
    assert metrics["clipfrac_lower"].item() == pytest.approx(0.25)
    assert metrics["clipfrac_dual"].item() == pytest.approx(0.25)
    lr = ratios.log()
    assert metrics["approx_kl"].item() == pytest.approx((ratios - 1 - lr).mean().item(), rel=1e-5)
    (grad,) = torch.autograd.grad(loss, logp)
    # only the unclipped token has a gradient: d(−A r)/dlogp = −A r / 4
    assert torch.allclose(grad, torch.tensor([[0.0, -0.5 / 4, 0.0, 0.0]]))
    no_dual, _ = policy_loss(logp, old, adv, mask, clip_low=0.2, clip_high=0.2)
    assert no_dual.item() == pytest.approx((-1.2 - 0.5 + 0.8 + 5.0) / 4)


def test_policy_loss_asymmetric_clip_higher():
    logp = torch.tensor([[math.log(1.25)]])
    loss, m = policy_loss(
        logp, torch.zeros(1, 1), torch.ones(1, 1), torch.ones(1, 1), clip_low=0.2, clip_high=0.28
    )
    assert loss.item() == pytest.approx(-1.25) and m["clipfrac_upper"].item() == 0.0
    loss, m = policy_loss(
        logp, torch.zeros(1, 1), torch.ones(1, 1), torch.ones(1, 1), clip_low=0.2, clip_high=0.2
    )
    assert loss.item() == pytest.approx(-1.2) and m["clipfrac_upper"].item() == 1.0


def test_policy_loss_rejects_bad_dual_clip():
    z = torch.zeros(1, 1)
    with pytest.raises(ValueError, match="dual_clip"):
        policy_loss(z, z, z, torch.ones(1, 1), dual_clip=0.5)


@pytest.mark.parametrize("name", ["ppo", "gspo"])
def test_padding_never_leaks(name: str):
    gen = torch.Generator().manual_seed(0)
    logp = torch.randn(3, 5, generator=gen) * 0.1
    old = logp + torch.randn(3, 5, generator=gen) * 0.05
    adv = torch.randn(3, 5, generator=gen)
    mask = torch.tensor([[1, 1, 1, 0, 0], [1, 1, 1, 1, 1], [1, 0, 0, 0, 0]]).float()
    dirty = [t.clone() for t in (logp, old, adv)]
    for t, bad in zip(dirty, (float("nan"), float("inf"), float("-inf")), strict=True):
        t[mask == 0] = bad
    fn = POLICY_LOSSES[name]
    clean_in = logp.clone().requires_grad_()
    dirty_in = dirty[0].clone().requires_grad_()
    kw = {"clip_low": 0.2, "clip_high": 0.28, "dual_clip": 3.0}
    clean_loss, clean_m = fn(clean_in, old, adv, mask, **kw)
    dirty_loss, dirty_m = fn(dirty_in, dirty[1], dirty[2], mask, **kw)
    assert torch.equal(clean_loss, dirty_loss)
    assert all(torch.equal(clean_m[k], dirty_m[k]) for k in clean_m)
    g_clean = torch.autograd.grad(clean_loss, clean_in)[0]
    g_dirty = torch.autograd.grad(dirty_loss, dirty_in)[0]
    assert torch.equal(g_clean, g_dirty) and torch.all(g_dirty[mask == 0] == 0)


@settings(max_examples=60, deadline=None)
@given(
    seed=st.integers(0, 2**31 - 1), clip_low=st.floats(0.05, 0.5), clip_high=st.floats(0.05, 0.5)
)
def test_gradient_is_zero_where_clip_is_active(seed: int, clip_low: float, clip_high: float):
    gen = torch.Generator().manual_seed(seed)
    logp = (torch.randn(4, 16, generator=gen) * 0.5).requires_grad_()
    old = torch.randn(4, 16, generator=gen) * 0.5
    adv = torch.randn(4, 16, generator=gen)
    mask = (torch.rand(4, 16, generator=gen) > 0.2).float()
    dual = 2.0
    loss, _ = policy_loss(
        logp, old, adv, mask, clip_low=clip_low, clip_high=clip_high, dual_clip=dual
    )
    (grad,) = torch.autograd.grad(loss, logp)
    r = (logp - old).exp().detach()
    clipped = (
        ((adv > 0) & (r > 1 + clip_high))
        | ((adv < 0) & (r < 1 - clip_low))
        | ((adv < 0) & (r > dual))
    )
    assert torch.all(grad[clipped] == 0)
    assert torch.all(grad[mask == 0] == 0)
    live = ~clipped & mask.bool() & (adv != 0)
    assert torch.all(grad[live] != 0)
    # where it is live, the gradient is the plain −A r / N_tokens
    assert torch.allclose(grad[live], (-adv * r / mask.sum())[live], rtol=1e-5, atol=1e-7)


def test_gspo_gives_every_token_the_sequence_weight():
    gen = torch.Generator().manual_seed(1)
    b, t = 4, 6
    mask = torch.ones(b, t)
    mask[1, 4:] = 0
    mask[3, 2:] = 0
    old = torch.randn(b, t, generator=gen) * 0.3
    logp = (old + torch.randn(b, t, generator=gen) * 0.05).requires_grad_()
    seq_adv = torch.tensor([1.0, -0.5, 2.0, -1.5])
    adv = seq_adv[:, None].expand(b, t).clone()
    loss, _ = gspo_loss(logp, old, adv, mask, clip_low=10.0, clip_high=10.0)  # no clipping
    (grad,) = torch.autograd.grad(loss, logp)

    lengths = mask.sum(-1)
    s = (((logp.detach() - old) * mask).sum(-1) / lengths).exp()
    expected = (-seq_adv * s / lengths / b)[:, None] * mask
    assert torch.allclose(grad, expected, atol=1e-7)
    for i in range(b):  # the same weight on every valid token of a sequence
        row = grad[i][mask[i].bool()]
        assert torch.allclose(row, row[0].expand_as(row))
    # and it is the gradient of the sequence-level objective −mean_i A_i s_i
    logp2 = logp.detach().clone().requires_grad_()
    s2 = (((logp2 - old) * mask).sum(-1) / lengths).exp()
    (ref_grad,) = torch.autograd.grad(-(seq_adv * s2).mean(), logp2)
    assert torch.allclose(grad, ref_grad, atol=1e-7)
    assert loss.item() == pytest.approx(-(seq_adv * s).mean().item(), rel=1e-5)


def test_gspo_clips_whole_sequences():
    old = torch.zeros(2, 3)
    logp = torch.tensor([[0.3, 0.3, 0.3], [0.0, 0.0, 0.0]], requires_grad=True)
    adv = torch.tensor([[1.0] * 3, [1.0] * 3])
    loss, m = gspo_loss(logp, old, adv, torch.ones(2, 3), clip_low=0.1, clip_high=0.1)
    (grad,) = torch.autograd.grad(loss, logp)
    assert torch.all(grad[0] == 0) and torch.all(grad[1] != 0)  # s_0 = e^0.3 > 1.1: clipped
    assert m["clipfrac_upper"].item() == pytest.approx(0.5)


def test_value_loss_hand_computed():
    values = torch.tensor([[1.0, 0.5, 3.0]], requires_grad=True)
    old = torch.tensor([[0.0, 0.5, 0.0]])
    returns = torch.tensor([[0.0, 1.5, 0.0]])
    mask = torch.tensor([[1, 1, 0]])
    loss, m = value_loss(values, old, returns, mask, clip=0.2)
    # token 0: unclipped 1, clipped (0.2)^2 = 0.04 -> 1; token 1: both (−1)^2 -> 1
    assert loss.item() == pytest.approx(0.5 * (1.0 + 1.0) / 2)
    assert m["vf_clipfrac"].item() == 0.0
    values2 = torch.tensor([[-1.0, 0.5, 0.0]])
    loss2, _ = value_loss(values2, old, returns, mask, clip=0.2)
    # token 0: unclipped 1, clipped (−0.2)^2; token 1: 1
    assert loss2.item() == pytest.approx(0.5 * (1.0 + 1.0) / 2)
    returns3 = torch.tensor([[2.0, 1.5, 0.0]])
    loss3, m3 = value_loss(values, old, returns3, mask, clip=0.2)
    # token 0: unclipped (1−2)^2 = 1, clipped (0.2−2)^2 = 3.24 -> clipped wins
    assert loss3.item() == pytest.approx(0.5 * (3.24 + 1.0) / 2)
    assert m3["vf_clipfrac"].item() == pytest.approx(0.5)
    plain, _ = value_loss(values, old, returns3, mask, clip=None)
    assert plain.item() == pytest.approx(0.5 * (1.0 + 1.0) / 2)


def test_dpo_hand_computed():
    pc, pr = torch.tensor([-1.0]), torch.tensor([-3.0])
    rc, rr = torch.tensor([-2.0]), torch.tensor([-2.0])
    loss, m = dpo_loss(pc, pr, rc, rr, beta=0.1)
    assert loss.item() == pytest.approx(math.log1p(math.exp(-0.2)))
    assert m["reward_accuracy"].item() == 1.0
    assert m["reward_margin"].item() == pytest.approx(0.2)
    assert m["reward_chosen"].item() == pytest.approx(0.1)
    ipo, _ = dpo_loss(pc, pr, rc, rr, beta=0.1, kind="ipo")
    assert ipo.item() == pytest.approx((2.0 - 5.0) ** 2)
    with pytest.raises(ValueError, match="ipo"):
        dpo_loss(pc, pr, rc, rr, kind="hinge")


def test_dpo_gradient_pushes_chosen_up():
    pc = torch.tensor([-2.0, -1.0], requires_grad=True)
    pr = torch.tensor([-1.0, -2.0], requires_grad=True)
    ref = torch.tensor([-1.5, -1.5])
    loss, _ = dpo_loss(pc, pr, ref, ref)
    gc, gr = torch.autograd.grad(loss, (pc, pr))
    assert torch.all(gc < 0) and torch.all(gr > 0)


def test_kl_kinds_exported():
    assert set(KL_KINDS) == {"k1", "abs", "k2", "k3", "low_var_kl"}
