"""DynaMO modulation at its edges: validation messages, ratio exactly at the clip bound, the
log-ratio clamp, tiny entropy and entropy-change ranges, one valid token, empty and bf16 inputs.

Each case here was added for a mutant of ``learner/algorithms/dynamo.py`` that the twin and hand
tests of test_dynamo.py let through (docs/testing.md lists them).
"""

from __future__ import annotations

import math

import pytest
import torch

from learner.algorithms import DYNAMO_PRESETS, dynamo_modulate, dynamo_params
from tests.learner.algorithms.test_dynamo import loop_modulate, random_inputs


def _twin(adv, logp, old, ent, mask, clip_low, clip_high, preset="decay6", **overrides):
    p = dynamo_params(preset, **overrides)
    return loop_modulate(
        adv.tolist(), logp.tolist(), old.tolist(), ent.tolist(), mask.int().tolist(),
        clip_low, clip_high, p.lambda_min, p.gamma, p.tau, p.mu_max,
    )  # fmt: skip


def test_clip_bounds_may_be_zero_but_not_negative():
    z = torch.zeros(1, 2)
    dynamo_modulate(z, z, z, z, z + 1, clip_low=0.0, clip_high=0.0)  # zero is a bound
    for low, high in ((-0.1, 0.2), (0.2, -0.1)):
        with pytest.raises(ValueError, match=r"clip_low and clip_high must be >= 0, got"):
            dynamo_modulate(z, z, z, z, z + 1, clip_low=low, clip_high=high)


@pytest.mark.parametrize("name", ["logp", "old_logp", "entropy", "mask"])
def test_a_shape_mismatch_names_the_input(name: str):
    args = {k: torch.zeros(1, 2) for k in ("logp", "old_logp", "entropy")}
    args["mask"] = torch.ones(1, 2)
    args[name] = torch.zeros(1, 3)
    with pytest.raises(ValueError, match=rf"^{name} must have the shape of advantages \(1, 2\)"):
        dynamo_modulate(torch.zeros(1, 2), **args, clip_low=0.2, clip_high=0.2)


def test_parameter_validation_bounds_and_messages():
    assert dynamo_params() == DYNAMO_PRESETS["decay6"]  # the default preset
    assert dynamo_params(lambda_min=0.0).lambda_min == 0.0  # the closed ends are allowed
    assert dynamo_params(gamma=0.0).gamma == 0.0
    assert dynamo_params(gamma=0.5).gamma == 0.5
    with pytest.raises(ValueError, match=r"dynamo gamma must be >= 0, got -1.0"):
        dynamo_params(gamma=-1.0)
    with pytest.raises(ValueError, match=r"dynamo mu_max must be >= 1, got 0.5"):
        dynamo_params(mu_max=0.5)
    with pytest.raises(ValueError, match=r"unknown dynamo override\(s\) a, b; allowed: lambda_min"):
        dynamo_params(a=1.0, b=2.0)


def test_ratio_exactly_at_the_clip_bound_is_not_clipped():
    # clip 0 and r = 1 exactly: r ≤ 1 + ε_high and r ≥ 1 − ε_low both hold, so every token counts
    # (I = 1) and its entropy change is damped; the twin says by how much.
    adv, logp, _, ent, mask = random_inputs(3)
    adv[adv == 0] = 0.5
    got, _ = dynamo_modulate(adv, logp, logp.clone(), ent, mask, clip_low=0.0, clip_high=0.0,
                             gamma=5.0, tau=0.3)  # fmt: skip
    want, _ = _twin(adv, logp, logp, ent, mask, 0.0, 0.0, gamma=5.0, tau=0.3)
    assert torch.allclose(got, torch.tensor(want), atol=1e-5, rtol=1e-5)


def _two_tokens(log_ratio: float):
    # token 0 at the given log-ratio (A > 0: never clipped from below), token 1 a plain one.
    logp = torch.tensor([[-1.0, -0.5]])
    old = logp - torch.tensor([[log_ratio, 0.05]])
    ent = torch.tensor([[0.3, 1.7]])
    adv = torch.tensor([[1.0, 1.0]])
    return adv, logp, old, ent, torch.ones(1, 2)


def test_log_ratio_is_clamped_below_at_minus_twenty():
    # Beyond −20 the ratio is e^−20 whatever the log-ratio: the output equals that at −20 exactly.
    # Both tokens far below: every Ξ is ~1e-9, so the 1e-8 guard makes x (and β_stab) depend on
    # the ratio's size, not only on the tokens' relative changes.
    kw = dict(clip_low=0.2, clip_high=0.28, gamma=50.0, tau=0.0, mu_max=1.0)

    def both(log_ratio: float):
        adv, logp, _, ent, mask = _two_tokens(0.0)
        return adv, logp, logp - log_ratio, ent, mask

    at, _ = dynamo_modulate(*both(-20.0), **kw)
    beyond, _ = dynamo_modulate(*both(-60.0), **kw)
    assert torch.equal(at, beyond)
    assert not torch.equal(at, dynamo_modulate(*both(-19.0), **kw)[0])  # the clamp is what binds


def test_log_ratio_is_clamped_above_so_nothing_overflows():
    # e^100 overflows float32; clamped at 20 the ratio is finite and so is every output. A < 0 so
    # the huge ratio is not clipped (r ≥ 1 − ε_low).
    adv, logp, old, ent, mask = _two_tokens(100.0)
    got, stats = dynamo_modulate(-adv, logp, old, ent, mask, clip_low=0.2, clip_high=0.28)
    assert torch.isfinite(got).all() and all(torch.isfinite(v) for v in stats.values())
    ref, _ = dynamo_modulate(-adv, *_two_tokens(20.0)[1:], clip_low=0.2, clip_high=0.28)
    assert torch.equal(got, ref)


def test_tiny_entropy_range_and_tiny_entropy_changes_follow_the_formula():
    # The 1e-8 guards are added, never subtracted: with an entropy range of 1e-8 the most
    # confident token gets half the boost, and with all Ξ around 1e-8 x stays in [0, 1].
    adv, logp, old, ent, mask = random_inputs(4)
    adv = adv * 1e-8
    ent = ent * 1e-8
    got, _ = dynamo_modulate(adv, logp, old, ent, mask, clip_low=0.2, clip_high=0.28,
                             mu_max=2.0, gamma=5.0, tau=0.3)  # fmt: skip
    want, _ = _twin(adv, logp, old, ent, mask, 0.2, 0.28, mu_max=2.0, gamma=5.0, tau=0.3)
    assert torch.allclose(got.double(), torch.tensor(want, dtype=torch.float64), rtol=1e-4, atol=0)

    ent2 = torch.tensor([[0.0, 1e-8]])
    got2, _ = dynamo_modulate(torch.ones(1, 2), torch.zeros(1, 2) - 1, torch.zeros(1, 2) - 1,
                              ent2, torch.ones(1, 2), clip_low=0.2, clip_high=0.28,
                              mu_max=3.0, lambda_min=1.0)  # fmt: skip
    assert got2[0, 0].item() == pytest.approx(1.0 + 2.0 * 1e-8 / 2e-8, rel=1e-5)
    assert got2[0, 1].item() == pytest.approx(1.0, rel=1e-6)


def test_one_valid_token_stats_are_its_own_betas():
    adv = torch.tensor([[0.7, 5.0]])
    logp = torch.tensor([[-0.4, 0.0]])
    ent = torch.tensor([[1.1, 0.0]])
    mask = torch.tensor([[1.0, 0.0]])
    got, stats = dynamo_modulate(adv, logp, logp - 0.1, ent, mask, clip_low=0.2, clip_high=0.28)
    multiplier = got[0, 0].item() / 0.7
    assert stats["multiplier_mean"].item() == pytest.approx(multiplier, rel=1e-6)
    assert stats["beta_stab_mean"].item() == pytest.approx(multiplier, rel=1e-6)  # H = H_max: …
    assert stats["beta_comp_mean_pos"].item() == 1.0  # … no boost, β_comp = 1


def test_beta_comp_mean_pos_averages_only_positive_advantages():
    for seed in range(3):
        adv, logp, old, ent, mask = random_inputs(seed)  # adv[0, :3] is 0: not positive
        _, stats = dynamo_modulate(adv, logp, old, ent, mask, clip_low=0.2, clip_high=0.28)
        _, betas = _twin(adv, logp, old, ent, mask, 0.2, 0.28)
        cells = [(i, k) for i in range(adv.shape[0]) for k in range(adv.shape[1]) if mask[i, k]]
        pos = [c for (i, k), (c, _) in zip(cells, betas, strict=True) if adv[i, k] > 0]
        assert stats["beta_comp_mean_pos"].item() == pytest.approx(sum(pos) / len(pos), rel=1e-5)


def test_no_tokens_at_all_is_no_error():
    z = torch.zeros(2, 0)
    got, stats = dynamo_modulate(z, z, z, z, z, clip_low=0.2, clip_high=0.28)
    assert got.shape == (2, 0) and all(torch.isfinite(v) for v in stats.values())


def test_output_keeps_the_dtype_of_the_advantages():
    adv, logp, old, ent, mask = random_inputs(5)
    got, _ = dynamo_modulate(adv.bfloat16(), logp, old, ent, mask, clip_low=0.2, clip_high=0.28)
    assert got.dtype == torch.bfloat16
    assert math.isfinite(got.float().sum().item())
