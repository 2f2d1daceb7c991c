"""Math items through a real server: equivalent and non-equivalent answers in both modes."""

from __future__ import annotations

import pytest

from tests.services.reward.conftest import RewardServer
from tests.services.reward.math_cases import CASES, MATH_VERIFY_YARDSTICK


@pytest.mark.parametrize(("response", "ground_truth", "mode", "correct", "reason"), CASES)
def test_math_case(
    reward: RewardServer, response: str, ground_truth: str, mode: str, correct: bool, reason: str
) -> None:
    res = reward.one(
        {"kind": "math", "response": response, "ground_truth": ground_truth, "extraction": mode}
    )
    assert res["correct"] is correct, res
    assert res["reason"] == reason, res
    assert res["score"] == (1.0 if correct else 0.0)
    assert res["format_ok"] is (reason != "no_answer")


@pytest.mark.parametrize(("ground_truth", "response", "correct"), MATH_VERIFY_YARDSTICK)
def test_math_verify_mode_yardstick(
    reward: RewardServer, ground_truth: str, response: str, correct: bool
) -> None:
    res = reward.one(
        {"kind": "math", "response": response, "ground_truth": ground_truth,
         "extraction": "math_verify"}
    )  # fmt: skip
    assert res["correct"] is correct, res


def test_batch_keeps_item_order(reward: RewardServer) -> None:
    items = [
        {"id": i, "kind": "math", "response": r, "ground_truth": g, "extraction": m}
        for i, (r, g, m, _c, _reason) in enumerate(CASES)
    ]
    results = reward.verify(*items)
    assert [r["id"] for r in results] == list(range(len(CASES)))
    assert [r["correct"] for r in results] == [c for _r, _g, _m, c, _reason in CASES]


def test_default_extraction_is_last_boxed(reward: RewardServer) -> None:
    # math_verify mode would combine both boxes into a set; last_boxed takes only the last.
    res = reward.one({"kind": "math", "response": r"\boxed{1} and \boxed{2}", "ground_truth": "2"})
    assert res["correct"] is True


def test_unparseable_ground_truth_is_reported(reward: RewardServer) -> None:
    res = reward.one({"kind": "math", "response": r"\boxed{1}", "ground_truth": "}{"})
    assert res["correct"] is False
    assert res["reason"] in {"bad_ground_truth", "wrong_answer"}
