"""The sample-efficiency benchmark's own logic: its scorer shortcut agrees with the reward service,
and its summary arithmetic (rollouts to a target, response masks) is right."""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path

import pytest
import torch

from services.reward.math_answer import score_math

_PATH = Path(__file__).resolve().parents[2] / "benchmarks" / "sample_efficiency.py"


@pytest.fixture(scope="module")
def se():
    spec = importlib.util.spec_from_file_location("sample_efficiency", _PATH)
    module = importlib.util.module_from_spec(spec)
    sys.modules["sample_efficiency"] = module
    spec.loader.exec_module(module)
    return module


RESPONSES = [
    "\\boxed{85}",
    "\\boxed{86}",
    "\\boxed{085}",
    "\\boxed{+85}",
    "\\boxed{85.0}",
    "\\boxed{8 5}",
    "\\boxed{-7}",
    "\\boxed{7}",
    "\\boxed{85",
    "\\boxed{}",
    "85",
    "\\boxed{1}\\boxed{85}",
    "\\boxed{85}\\boxed{1}",
    "\\boxed{{85}}",
    "Answer: 85",
    "\\boxed{0}",
]


@pytest.mark.parametrize("truth", ["85", "-7", "0", "1"])
def test_is_correct_matches_the_reward_service(se, truth):
    for response in RESPONSES:
        expected = score_math(response, truth, "last_boxed")["correct"]
        assert se.is_correct(response, truth) == expected, (response, truth)


def test_rollouts_to_reach_interpolates(se):
    x = [0, 100, 200, 300]
    assert se.rollouts_to_reach(x, [0.1, 0.2, 0.4, 0.5], 0.3) == pytest.approx(150.0)
    assert se.rollouts_to_reach(x, [0.3, 0.2, 0.4, 0.5], 0.3) == 0
    assert se.rollouts_to_reach(x, [0.1, 0.2, 0.25, 0.29], 0.3) is None


def test_response_mask_keeps_the_first_eos_only(se):
    eos = 1
    resp = torch.tensor([[5, 6, eos, 0, 0], [5, 5, 5, 5, 5], [eos, 0, eos, 0, 0]])
    mask = se.response_mask(resp, eos)
    assert mask.tolist() == [[1, 1, 1, 0, 0], [1, 1, 1, 1, 1], [1, 0, 0, 0, 0]]
