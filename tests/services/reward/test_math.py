"""Math items through a real server: equivalent and non-equivalent answers in both modes."""

from __future__ import annotations

import re

import httpx
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


def _path_counts(reward: RewardServer) -> dict[str, float]:
    text = httpx.get(f"{reward.url}/metrics", timeout=10).text
    found = re.findall(
        r'^dynamo_reward_math_items_by_path_total\{path="(\w+)"\} (\S+)$', text, re.M
    )
    return {path: float(v) for path, v in found}


def test_identical_answers_share_one_verdict_and_keep_request_order(reward: RewardServer) -> None:
    """16 samples of one prompt with two distinct answers: 2 math-verify calls, 14 shared; each
    item keeps its own id and verdict in request order."""
    answers = [r"\boxed{(x+1)^2}", r"\boxed{x^2+1}"]
    items = [
        {"id": f"s{i}", "kind": "math", "response": f"sample {i}: " + answers[i % 3 == 0],
         "ground_truth": "x^2+2x+1"}
        for i in range(16)
    ]  # fmt: skip
    before = _path_counts(reward)
    results = reward.verify(*items)
    after = _path_counts(reward)
    assert [r["id"] for r in results] == [f"s{i}" for i in range(16)]
    assert [r["correct"] for r in results] == [i % 3 != 0 for i in range(16)]
    assert after.get("worker", 0) - before.get("worker", 0) == 2
    assert after.get("dedup", 0) - before.get("dedup", 0) == 14


def test_plain_numbers_take_the_fast_path(reward: RewardServer) -> None:
    items = [
        {"id": k, "kind": "math", "response": rf"\boxed{{{k}.0}}", "ground_truth": str(k + k % 2)}
        for k in range(8)
    ]
    before = _path_counts(reward)
    results = reward.verify(*items)
    after = _path_counts(reward)
    assert [r["correct"] for r in results] == [k % 2 == 0 for k in range(8)]
    assert after.get("fast", 0) - before.get("fast", 0) == 8
