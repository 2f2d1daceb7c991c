"""Fixtures shared by the benchmarks' tests: one tiny model for the objective and update checks."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch


@pytest.fixture(scope="module")
def tiny_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A one-layer tiny Qwen2 (width 32, 64 positions) saved in Hugging Face format."""
    from learner.tiny_model import build_tiny_model

    return build_tiny_model(
        tmp_path_factory.mktemp("tiny") / "m", hidden_size=32, num_layers=1, num_heads=2,
        num_kv_heads=1, max_positions=64,
    )  # fmt: skip


@pytest.fixture(scope="module")
def tiny(tiny_dir: Path):
    """That model loaded in float32, in eval mode."""
    from transformers import AutoModelForCausalLM

    return AutoModelForCausalLM.from_pretrained(tiny_dir, dtype=torch.float32).eval()
