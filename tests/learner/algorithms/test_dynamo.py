"""DynaMO advantage modulation: a plain-loop twin, a hand case, identity, padding, detachment."""

from __future__ import annotations

import math

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from learner.algorithms import DYNAMO_PRESETS, dynamo_modulate, dynamo_params


def loop_modulate(adv, logp, old, ent, mask, clip_low, clip_high, lam, gamma, tau, mu):
    """docs/architecture.md's formulas, one token at a time on Python floats."""
    b, t = len(adv), len(adv[0])
    cells = [(i, k) for i in range(b) for k in range(t) if mask[i][k]]
    big_t = {}
    for i, k in cells:
        pi = math.exp(logp[i][k])
        big_t[i, k] = pi * (logp[i][k] + ent[i][k])
    e_seq = {}
    for i in range(b):
        row = [big_t[i, k] for k in range(t) if mask[i][k]]
        e_seq[i] = sum(row) / len(row) if row else 0.0
    xi_big = {}
    for i, k in cells:
        a = adv[i][k]
        r = math.exp(logp[i][k] - old[i][k])
        ind = (a > 0 and r <= 1 + clip_high) or (a < 0 and r >= 1 - clip_low)
        xi = (1.0 if ind else 0.0) * r * a
        xi_big[i, k] = abs(-xi * (big_t[i, k] - e_seq[i]))
    mx = max(xi_big.values(), default=0.0)
    h_max = max((ent[i][k] for i, k in cells), default=0.0)
    h_min = min((ent[i][k] for i, k in cells), default=0.0)
    out = [row[:] for row in adv]
    betas = []
    for i, k in cells:
        x = xi_big[i, k] / (mx + 1e-8)
        stab = lam + (1 - lam) / (1 + math.exp(gamma * (x - tau)))
        comp = 1 + (mu - 1) * (h_max - ent[i][k]) / (h_max - h_min + 1e-8) if adv[i][k] > 0 else 1.0
        out[i][k] = adv[i][k] * comp * stab
        betas.append((comp, stab))
    return out, betas


def random_inputs(seed: int, b: int = 5, t: int = 12):
    gen = torch.Generator().manual_seed(seed)
    logp = -torch.rand(b, t, generator=gen) * 3
    old = logp + torch.randn(b, t, generator=gen) * 0.25  # some ratios outside the clip range
    ent = torch.rand(b, t, generator=gen) * 4
    adv = torch.randn(b, t, generator=gen)
    adv[0, :3] = 0.0
    lengths = torch.randint(0, t + 1, (b,), generator=gen)
    lengths[0] = t
    mask = (torch.arange(t)[None] < lengths[:, None]).float()
    return adv, logp, old, ent, mask


@pytest.mark.parametrize("seed", range(6))
@pytest.mark.parametrize(
    ("preset", "overrides"),
    [("decay6", {}), ("decay5", {}), ("decay6", {"gamma": 5.0, "tau": 0.3, "mu_max": 2.0})],
)
def test_matches_loop_twin(seed: int, preset: str, overrides: dict):
    adv, logp, old, ent, mask = random_inputs(seed)
    p = dynamo_params(preset, **overrides)
    got, stats = dynamo_modulate(
        adv, logp, old, ent, mask, clip_low=0.2, clip_high=0.28, preset=preset, **overrides
    )
    want, betas = loop_modulate(
        adv.tolist(),
        logp.tolist(),
        old.tolist(),
        ent.tolist(),
        mask.int().tolist(),
        0.2,
        0.28,
        p.lambda_min,
        p.gamma,
        p.tau,
        p.mu_max,
    )
    assert torch.allclose(got, torch.tensor(want), atol=1e-5, rtol=1e-5)
    n = len(betas)
    assert stats["beta_comp_mean"].item() == pytest.approx(sum(c for c, _ in betas) / n, rel=1e-5)
    assert stats["beta_stab_mean"].item() == pytest.approx(sum(b for _, b in betas) / n, rel=1e-5)
    assert stats["multiplier_mean"].item() == pytest.approx(
        sum(c * b for c, b in betas) / n, rel=1e-5
    )


def test_hand_computed():
    # One sequence; r = 1 everywhere; π = (0.5, 0.25); H = (0.5, 2.0); A = (1, −1).
    logp = torch.tensor([[math.log(0.5), math.log(0.25)]])
    ent = torch.tensor([[0.5, 2.0]])
    adv = torch.tensor([[1.0, -1.0]])
    t0 = 0.5 * (math.log(0.5) + 0.5)
    t1 = 0.25 * (math.log(0.25) + 2.0)
    e = (t0 + t1) / 2
    xi = [abs(-1.0 * (t0 - e)), abs(1.0 * (t1 - e))]  # equal: both x = 1 (up to 1e-8)
    stab = [0.6 + 0.4 / (1 + math.exp(50 * (x / (max(xi) + 1e-8) - 0.99))) for x in xi]
    comp0 = 1 + 0.2 * (2.0 - 0.5) / (1.5 + 1e-8)  # = 1.2: the most confident token, A > 0
    got, stats = dynamo_modulate(
        adv, logp, logp.clone(), ent, torch.ones(1, 2), clip_low=0.2, clip_high=0.28
    )
    assert got[0, 0].item() == pytest.approx(comp0 * stab[0], rel=1e-5)
    assert got[0, 1].item() == pytest.approx(-stab[1], rel=1e-5)
    assert stab[0] == pytest.approx(0.6 + 0.4 / (1 + math.exp(0.5)), rel=1e-6)
    assert stats["beta_comp_mean"].item() == pytest.approx((1.2 + 1.0) / 2, rel=1e-6)
    assert stats["beta_comp_mean_pos"].item() == pytest.approx(1.2, rel=1e-6)


def test_clipped_tokens_have_no_entropy_change():
    # A > 0 with r far above 1 + ε_high: I = 0, so Ξ = 0 and β_stab is near 1 for that token.
    logp = torch.tensor([[-1.0, -1.0, -2.0]])
    old = torch.tensor([[-2.0, -1.0, -2.0]])  # token 0: r = e > 1.28
    ent = torch.tensor([[1.0, 2.0, 0.1]])
    adv = torch.ones(1, 3)
    got, _ = dynamo_modulate(
        adv, logp, old, ent, torch.ones(1, 3), clip_low=0.2, clip_high=0.28, mu_max=1.0
    )
    assert got[0, 0].item() == pytest.approx(1.0, abs=1e-6)


def test_presets_and_errors():
    assert DYNAMO_PRESETS["decay6"] == dynamo_params("decay6")
    p6, p5 = dynamo_params("decay6"), dynamo_params("decay5")
    assert (p6.lambda_min, p6.gamma, p6.tau, p6.mu_max) == (0.6, 50.0, 0.99, 1.2)
    assert (p5.lambda_min, p5.gamma, p5.tau, p5.mu_max) == (0.6, 50.0, 0.9, 1.4)
    z = torch.zeros(1, 2)
    with pytest.raises(ValueError, match="known: decay6, decay5"):
        dynamo_modulate(z, z, z, z, z + 1, clip_low=0.2, clip_high=0.2, preset="decay7")
    with pytest.raises(ValueError, match="lambda_min, gamma, tau, mu_max"):
        dynamo_modulate(z, z, z, z, z + 1, clip_low=0.2, clip_high=0.2, lamda_min=0.5)
    with pytest.raises(ValueError, match="lambda_min"):
        dynamo_params("decay6", lambda_min=1.5)
    with pytest.raises(ValueError, match="entropy"):
        dynamo_modulate(z, z, z, torch.zeros(1, 3), z + 1, clip_low=0.2, clip_high=0.2)


def test_multiplier_is_detached():
    adv, logp, old, ent, mask = random_inputs(0)
    adv = adv.requires_grad_()
    logp = logp.requires_grad_()
    ent = ent.requires_grad_()
    got, _ = dynamo_modulate(adv, logp, old, ent, mask, clip_low=0.2, clip_high=0.28)
    g_adv, g_lp, g_h = torch.autograd.grad(got.sum(), (adv, logp, ent), allow_unused=True)
    assert g_lp is None and g_h is None  # no gradient path through the multiplier
    ratio = torch.where(adv.detach() != 0, got.detach() / adv.detach(), g_adv)
    assert torch.allclose(g_adv, ratio, atol=1e-6)


def test_empty_micro_batch_is_untouched():
    adv, logp, old, ent, _ = random_inputs(2)
    got, stats = dynamo_modulate(
        adv, logp, old, ent, torch.zeros_like(adv), clip_low=0.2, clip_high=0.2
    )
    assert torch.equal(got, adv)
    assert all(torch.isfinite(v) for v in stats.values())


@settings(max_examples=50, deadline=None)
@given(seed=st.integers(0, 2**31 - 1), preset=st.sampled_from(["decay6", "decay5"]))
def test_identity_when_mu_max_and_lambda_min_are_one(seed: int, preset: str):
    adv, logp, old, ent, mask = random_inputs(seed)
    got, stats = dynamo_modulate(
        adv,
        logp,
        old,
        ent,
        mask,
        clip_low=0.2,
        clip_high=0.28,
        preset=preset,
        mu_max=1.0,
        lambda_min=1.0,
    )
    assert torch.equal(got, adv)
    assert stats["beta_comp_mean"].item() == 1.0 and stats["beta_stab_mean"].item() == 1.0


@settings(max_examples=50, deadline=None)
@given(
    seed=st.integers(0, 2**31 - 1), junk=st.sampled_from([float("nan"), float("inf"), -1e30, 7.0])
)
def test_padding_never_affects_valid_tokens(seed: int, junk: float):
    adv, logp, old, ent, mask = random_inputs(seed)
    clean, clean_stats = dynamo_modulate(adv, logp, old, ent, mask, clip_low=0.2, clip_high=0.28)
    pad = mask == 0
    dirty_in = []
    for x in (adv, logp, old, ent):
        y = x.clone()
        y[pad] = junk
        dirty_in.append(y)
    dirty, dirty_stats = dynamo_modulate(*dirty_in, mask, clip_low=0.2, clip_high=0.28)
    valid = mask.bool()
    assert torch.equal(dirty[valid], clean[valid])
    # masked positions are returned untouched (bit for bit, NaN included)
    assert torch.equal(dirty[pad].nan_to_num(), dirty_in[0][pad].nan_to_num())
    assert torch.equal(clean[pad], adv[pad])
    assert all(torch.equal(clean_stats[k], dirty_stats[k]) for k in clean_stats)
