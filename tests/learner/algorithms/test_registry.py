"""The name -> function registries."""

from __future__ import annotations

import pytest
import torch

from learner.algorithms import ADVANTAGE_ESTIMATORS, POLICY_LOSSES, Registry, UnknownNameError


def test_required_names_are_registered():
    assert {"grpo", "drgrpo", "rloo", "reinforce_pp", "gae"} <= set(ADVANTAGE_ESTIMATORS)
    assert {"ppo", "gspo"} <= set(POLICY_LOSSES)


def test_unknown_name_lists_the_known_ones():
    with pytest.raises(UnknownNameError) as info:
        POLICY_LOSSES["ppo2"]
    message = str(info.value)
    assert "'ppo2'" in message and "gspo, ppo" in message
    assert isinstance(info.value, KeyError) and isinstance(info.value, ValueError)
    assert "ppo2" not in POLICY_LOSSES
    assert POLICY_LOSSES.get("ppo2") is None


def test_duplicate_names_are_an_error():
    reg: Registry = Registry("thing")
    reg.register("a")(len)
    with pytest.raises(ValueError, match="already registered"):
        reg.register("a")(abs)
    assert reg["a"] is len
    with pytest.raises(ValueError, match="already registered"):
        POLICY_LOSSES.register("ppo")(lambda *a, **k: None)
    with pytest.raises(ValueError, match="non-empty"):
        reg.add("", len)


def test_policy_losses_share_one_call():
    gen = torch.Generator().manual_seed(0)
    logp = torch.randn(2, 5, generator=gen).requires_grad_()
    old = logp.detach() + 0.01
    adv = torch.randn(2, 5, generator=gen)
    mask = torch.ones(2, 5)
    for name, fn in POLICY_LOSSES.items():
        loss, metrics = fn(
            logp, old, adv, mask, clip_low=0.2, clip_high=0.28, dual_clip=3.0, agg="token-mean"
        )
        assert loss.dim() == 0 and loss.requires_grad, name
        assert {"clipfrac_upper", "clipfrac_lower", "clipfrac_dual", "approx_kl"} <= set(metrics)
