"""No shipped config pairs dynamic allocation with a loss weighting under which the
gradient-variance benchmark shows allocation raising the batch gradient's error
(``benchmarks/grad_variance.py``: under token-mean every allocator it measured is above uniform's
error, under prompt-mean they are below; ``docs/benchmarks.md``)."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from dynamo_rl.config import load_config

REPO = Path(__file__).resolve().parents[2]
CONFIGS = sorted([*(REPO / "configs").glob("*.yaml"), *(REPO / "deploy").rglob("*.yaml")])
SAFE_WEIGHTINGS = {"prompt-mean"}
"""Weightings under which the benchmark measured allocation lowering the error."""


def _experiments() -> list[Path]:
    """Shipped experiment configs: every YAML of configs/ and deploy/ with a top-level rollout
    section (the Kubernetes manifests have none)."""
    return [p for p in CONFIGS if re.search(r"^rollout:", p.read_text(), re.M)]


@pytest.mark.parametrize("path", _experiments(), ids=lambda p: str(p.relative_to(REPO)))
def test_dynamic_allocation_only_with_a_weighting_it_helps(path: Path) -> None:
    cfg = load_config(path, env={})
    if cfg.rollout.allocation == "dynamic":
        assert cfg.learner.algorithm.agg in SAFE_WEIGHTINGS, (
            f"{path.name}: rollout.allocation dynamic with learner.algorithm.agg "
            f"{cfg.learner.algorithm.agg!r}; allocation raises the gradient error under it"
        )


def test_the_shipped_configs_include_dynamic_ones() -> None:
    dynamic = {
        str(p.relative_to(REPO))
        for p in _experiments()
        if load_config(p, env={}).rollout.allocation == "dynamic"
    }
    assert {"configs/dynamo_grpo.yaml", "configs/quickstart.yaml"} <= dynamic
    assert "deploy/compose/quickstart.yaml" in dynamic
