"""No shipped config pairs dynamic allocation with a loss weighting under which the
gradient-variance benchmark shows allocation raising the batch gradient's error
(``benchmarks/grad_variance.py``: under token-mean every allocator it measured is above uniform's
error, under prompt-mean they are below; ``docs/benchmarks.md``)."""

from __future__ import annotations

from pathlib import Path

import pytest

from dynamo_rl.config import load_config

CONFIGS = sorted((Path(__file__).resolve().parents[2] / "configs").glob("*.yaml"))
SAFE_WEIGHTINGS = {"prompt-mean"}
"""Weightings under which the benchmark measured allocation lowering the error."""


@pytest.mark.parametrize("path", CONFIGS, ids=lambda p: p.name)
def test_dynamic_allocation_only_with_a_weighting_it_helps(path: Path) -> None:
    cfg = load_config(path, env={})
    if cfg.rollout.allocation == "dynamic":
        assert cfg.learner.algorithm.agg in SAFE_WEIGHTINGS, (
            f"{path.name}: rollout.allocation dynamic with learner.algorithm.agg "
            f"{cfg.learner.algorithm.agg!r}; allocation raises the gradient error under it"
        )


def test_the_shipped_configs_include_dynamic_ones() -> None:
    dynamic = [p.name for p in CONFIGS if load_config(p, env={}).rollout.allocation == "dynamic"]
    assert {"dynamo_grpo.yaml", "quickstart.yaml"} <= set(dynamic)
