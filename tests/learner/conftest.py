"""Fixtures of the learner tests."""

from __future__ import annotations

from pathlib import Path

import pytest

from learner.tiny_model import build_tiny_model


@pytest.fixture(scope="module")
def policy(tmp_path_factory: pytest.TempPathFactory):
    """A one-layer tiny Qwen2 (width 32, 64 positions) as the learner loads it, in float32."""
    from learner.model import load_policy

    path: Path = build_tiny_model(
        tmp_path_factory.mktemp("tiny") / "m", hidden_size=32, num_layers=1, num_heads=2,
        num_kv_heads=1, max_positions=64,
    )  # fmt: skip
    return load_policy(str(path)).float()
