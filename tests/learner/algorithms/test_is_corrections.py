"""The engine/learner mismatch corrections (``IS_CORRECTIONS``): each mode against a loop twin
written in plain Python, the config names and their errors, and the objective using the configured
mode."""

from __future__ import annotations

import math
import typing

import pytest
import torch
from pydantic import ValidationError

from dynamo_rl.config.learner import AlgorithmConfig, IsMode, PpoLoss
from learner.algorithms import IS_CORRECTIONS, UnknownNameError
from learner.objective import ObjectiveInputs, importance_weights, rl_objective

CAP = 1.5


def truncated_is_weights(
    old_logp: torch.Tensor, sampling_logp: torch.Tensor, mask: torch.Tensor, cap: float
) -> torch.Tensor:
    """The default correction's weights, ``min(exp(old − sampling), cap)`` (0 at padding)."""
    return IS_CORRECTIONS["token-truncate"](old_logp, sampling_logp, mask, cap=cap).weights


def batch(seed: int) -> dict[str, torch.Tensor]:
    """Rows of different lengths (one empty), log-ratios on both sides of the band, garbage (inf,
    NaN) in the padding."""
    gen = torch.Generator().manual_seed(seed)
    b, t = 5, 6
    old = -torch.rand(b, t, generator=gen) * 3
    shift = torch.tensor([0.0, -0.6, 0.0, 0.9, 0.05])[:, None]  # rows 1, 3 leave any band
    sampling = old + torch.randn(b, t, generator=gen) * 0.05 + shift
    lengths = torch.tensor([6, 3, 0, 1, 5])
    mask = (torch.arange(t)[None] < lengths[:, None]).float()
    sampling = torch.where(mask.bool(), sampling, torch.tensor(float("nan")))
    old = torch.where(mask.bool(), old, torch.tensor(float("-inf")))
    return {"old": old, "sampling": sampling, "mask": mask}


def loop_weights(
    mode: str, old: list[list[float]], sampling: list[list[float]], mask: list[list[float]],
    cap: float, low: float,
) -> tuple[list[list[float]], list[list[bool]]]:  # fmt: skip
    """The weights and the dropped tokens of ``mode``, one token at a time."""
    level, kind = mode.split("-")
    weights, dropped = [], []
    for o_row, s_row, m_row in zip(old, sampling, mask, strict=True):
        logs = [o - s for o, s, m in zip(o_row, s_row, m_row, strict=True) if m]
        if level == "sequence":
            row_ratio = math.exp(max(-20.0, min(20.0, sum(logs))))
        elif level == "geometric":
            row_ratio = math.exp(sum(logs) / len(logs)) if logs else 1.0
        w_row, d_row = [], []
        for k, m in enumerate(m_row):
            if not m:
                w_row.append(0.0)
                d_row.append(False)
                continue
            r = math.exp(o_row[k] - s_row[k]) if level == "token" else row_ratio
            if kind == "truncate":
                w_row.append(min(r, cap))
                d_row.append(False)
            else:
                inside = low <= r <= cap
                w_row.append(r if inside else 0.0)
                d_row.append(not inside)
        weights.append(w_row)
        dropped.append(d_row)
    return weights, dropped


@pytest.mark.parametrize("mode", typing.get_args(IsMode))
@pytest.mark.parametrize("seed", [0, 1, 2])
def test_each_mode_equals_its_loop_twin(mode: str, seed: int) -> None:
    x = batch(seed)
    low = 0.8
    got = IS_CORRECTIONS[mode](x["old"], x["sampling"], x["mask"], cap=CAP, low=low)
    want_w, want_d = loop_weights(
        mode, x["old"].tolist(), x["sampling"].tolist(), x["mask"].tolist(), CAP, low
    )
    torch.testing.assert_close(got.weights, torch.tensor(want_w), rtol=1e-5, atol=1e-6)
    assert got.dropped.tolist() == want_d
    if mode.endswith("-mask"):  # the seeds put ratios on both sides of the band
        assert any(map(any, want_d)) and not all(
            d for row, m in zip(want_d, x["mask"].tolist(), strict=True)
            for d, v in zip(row, m, strict=True) if v
        )  # fmt: skip


def test_the_band_defaults_to_one_over_the_cap() -> None:
    x = batch(3)
    default = IS_CORRECTIONS["token-mask"](x["old"], x["sampling"], x["mask"], cap=CAP)
    explicit = IS_CORRECTIONS["token-mask"](
        x["old"], x["sampling"], x["mask"], cap=CAP, low=1 / CAP
    )
    torch.testing.assert_close(default.weights, explicit.weights)
    with pytest.raises(ValueError, match="0 < low < cap"):
        IS_CORRECTIONS["sequence-mask"](x["old"], x["sampling"], x["mask"], cap=CAP, low=2.0)


def test_a_long_row_does_not_overflow_the_sequence_ratio() -> None:
    old = torch.zeros(1, 400)
    sampling = torch.full((1, 400), -1.0)  # Σ log r = 400: exp would overflow float32
    mask = torch.ones(1, 400)
    w = IS_CORRECTIONS["sequence-truncate"](old, sampling, mask, cap=CAP).weights
    assert torch.isfinite(w).all() and torch.equal(w, torch.full_like(w, CAP))
    d = IS_CORRECTIONS["sequence-mask"](old, sampling, mask, cap=CAP).dropped
    assert bool(d.all())


def test_token_truncate_is_todays_correction() -> None:
    x = batch(4)
    mask = x["mask"]
    old = torch.where(mask.bool(), x["old"], 0.0)
    sampling = torch.where(mask.bool(), x["sampling"], 0.0)
    want = torch.exp((old - sampling) * mask).clamp(max=CAP) * mask  # the formula before modes
    torch.testing.assert_close(truncated_is_weights(old, sampling, mask, CAP), want)


def test_config_names_are_the_registry_names_and_bad_values_are_named() -> None:
    assert set(typing.get_args(IsMode)) == set(IS_CORRECTIONS)
    with pytest.raises(ValidationError, match="is_mode") as e:
        AlgorithmConfig(is_mode="token-clip")
    assert "geometric-mask" in str(e.value)  # the allowed values are listed
    with pytest.raises(ValidationError, match="is_low is only used by the masked IS modes"):
        AlgorithmConfig(is_mode="sequence-truncate", is_low=0.5)
    with pytest.raises(ValidationError, match="is_low"):
        AlgorithmConfig(is_mode="token-mask", is_low=1.5)
    with pytest.raises(UnknownNameError, match="known: geometric-mask"):
        IS_CORRECTIONS["token-clip"]


@pytest.mark.parametrize("mode", ["geometric-mask", "sequence-truncate"])
def test_the_objective_uses_the_configured_mode(mode: str) -> None:
    x = batch(5)
    mask = x["mask"]
    gen = torch.Generator().manual_seed(9)
    logp = torch.where(mask.bool(), x["old"] + torch.randn(mask.shape, generator=gen) * 0.1, 0.0)
    old = torch.where(mask.bool(), x["old"], 0.0)
    adv = torch.randn(mask.shape, generator=gen)
    algo = AlgorithmConfig(policy_loss=PpoLoss(), is_cap=CAP, is_mode=mode)
    corr = importance_weights(algo, old, x["sampling"], mask)
    assert corr is not None
    want_w, _ = loop_weights(
        mode, old.tolist(), x["sampling"].tolist(), mask.tolist(), CAP, 1 / CAP
    )
    torch.testing.assert_close(corr.weights, torch.tensor(want_w), rtol=1e-5, atol=1e-6)
    out = rl_objective(
        ObjectiveInputs(logp=logp, old_logp=old, advantages=adv, mask=mask,
                        is_weights=corr.weights), algo,
    )  # fmt: skip
    assert out.advantages is not None
    torch.testing.assert_close(out.advantages, adv * torch.tensor(want_w))
    off = AlgorithmConfig(policy_loss=PpoLoss(), is_cap=None, is_mode=mode)
    assert importance_weights(off, old, x["sampling"], mask) is None
