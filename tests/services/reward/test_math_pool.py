"""The math worker pool with real worker processes, and the pure answer extraction."""

from __future__ import annotations

import os
import signal
from collections.abc import Iterator

import pytest

from services.reward.math_answer import answer_line, extract_last_boxed, last_boxed
from services.reward.math_pool import MathPool


@pytest.fixture(scope="module")
def pool() -> Iterator[MathPool]:
    p = MathPool(workers=1, timeout_s=3.0)
    p.start()
    try:
        yield p
    finally:
        p.close()


def test_pool_scores(pool: MathPool) -> None:
    assert pool.score(r"\boxed{\frac{1}{2}}", "0.5", "last_boxed")["correct"] is True
    assert pool.score(r"\boxed{3}", "0.5", "last_boxed")["reason"] == "wrong_answer"


def test_crashed_worker_scores_timeout_and_is_replaced(pool: MathPool) -> None:
    (worker,) = list(pool._all)
    os.kill(worker.proc.pid, signal.SIGKILL)
    before = pool.restarts
    res = pool.score(r"\boxed{1}", "1", "last_boxed")
    assert (res["correct"], res["reason"]) == (False, "timeout")  # never 1 from a dead worker
    assert pool.restarts == before + 1
    assert pool.score(r"\boxed{1}", "1", "last_boxed")["correct"] is True


def test_hung_worker_is_killed_after_timeout(pool: MathPool) -> None:
    (worker,) = list(pool._all)
    res = pool.score(r"\boxed{9^{9^{9^{9^{9}}}}}", "1", "last_boxed")
    assert res["reason"] == "timeout"
    worker.proc.join(timeout=5)
    assert not worker.proc.is_alive()
    assert pool.score(r"\boxed{2}", "2", "last_boxed")["correct"] is True


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        (r"\boxed{1} then \boxed{2}", "2"),
        (r"\boxed{\frac{a}{b}}", r"\frac{a}{b}"),
        (r"\boxed{\left\{1,2\right\}}", r"\left\{1,2\right\}"),
        (r"\boxed{ 7 }", "7"),
        (r"\boxed 5$", "5"),
        (r"\fbox{x}", "x"),
        (r"\boxed{}", None),
        (r"\boxed{2} and an unbalanced \boxed{3", "2"),
        ("no box", None),
    ],
)
def test_last_boxed(text: str, expected: str | None) -> None:
    assert last_boxed(text) == expected


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("Answer: 12", "12"),
        ("work\nFinal answer: $\\frac{1}{2}$.", "\\frac{1}{2}"),
        ("**Answer:** 7", "7"),
        ("answer: 1\nAnswer: 2", "2"),
        ("The answer is below", None),
    ],
)
def test_answer_line(text: str, expected: str | None) -> None:
    assert answer_line(text) == expected


def test_box_wins_over_answer_line() -> None:
    assert extract_last_boxed("\\boxed{3}\nAnswer: 4") == "3"
