"""Fixtures shared by the rollout worker's tests."""

from __future__ import annotations

from pathlib import Path

import pytest

from learner.tiny_model import build_tiny_model


@pytest.fixture(scope="module")
def model(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The default tiny model (seed 0) saved in Hugging Face format."""
    return build_tiny_model(tmp_path_factory.mktemp("model") / "m", seed=0)
