"""Fixtures shared by the engine's tests."""

from __future__ import annotations

from pathlib import Path

import pytest

from learner.tiny_model import build_tiny_model


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A tiny Qwen2 model (2 layers, width 32, 256 positions) saved in Hugging Face format."""
    return build_tiny_model(
        tmp_path_factory.mktemp("tiny") / "model",
        hidden_size=32,
        num_layers=2,
        num_heads=2,
        num_kv_heads=1,
        max_positions=256,
    )
