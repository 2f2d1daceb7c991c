"""The math worker pool with real worker processes (the answer extraction itself:
``test_math_answer.py``)."""

from __future__ import annotations

import os
import signal
from collections.abc import Iterator

import pytest

from dynamo_rl.config import RewardConfig
from services.reward.math_pool import MathPool
from services.reward.math_scorer import MathScorer
from services.reward.metrics import RewardMetrics


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


HANG = r"\boxed{9^{9^{9^{9^{9}}}}}"  # sympy never finishes this within the 3 s timeout


def _results(futures: list, deadline_s: float = 180.0) -> list[dict]:
    return [f.result(timeout=deadline_s) for f in futures]


def test_items_are_batched_and_answered_in_order(pool: MathPool) -> None:
    jobs = [
        (rf"\boxed{{x+{k}}}", f"{k}+x" if k % 3 else f"{k + 1}+x", "last_boxed") for k in range(40)
    ]
    before = pool.batches
    results = _results(pool.submit_many(jobs))
    assert [r["correct"] for r in results] == [bool(k % 3) for k in range(40)]
    assert pool.batches - before < len(jobs)  # not one worker call per item


def test_a_hang_mid_batch_fails_that_item_and_answers_the_rest(pool: MathPool) -> None:
    jobs = [(r"\boxed{x+1}", "1+x", "last_boxed"), (HANG, "1", "last_boxed")]
    jobs += [(rf"\boxed{{x+{k}}}", f"{k}+x", "last_boxed") for k in range(2, 6)]
    before = pool.restarts
    results = _results(pool.submit_many(jobs))
    assert [r["reason"] for r in results] == ["ok", "timeout", "ok", "ok", "ok", "ok"]
    assert "no answer within 3s" in results[1]["detail"]
    assert pool.restarts == before + 1


def test_a_worker_killed_mid_batch_fails_one_item_and_answers_the_rest(pool: MathPool) -> None:
    (worker,) = list(pool._all)
    futures = pool.submit_many(
        [(HANG, "1", "last_boxed")] + [(r"\boxed{7}", "7", "last_boxed")] * 3
    )
    os.kill(worker.proc.pid, signal.SIGKILL)
    results = _results(futures)
    assert (results[0]["correct"], results[0]["reason"]) == (False, "timeout")
    assert "worker died" in results[0]["detail"]
    assert [r["correct"] for r in results[1:]] == [True, True, True]


def test_when_no_worker_can_be_replaced_every_item_fails_clearly() -> None:
    pool = MathPool(workers=1, timeout_s=3.0)
    pool.start()
    try:
        pool.start_timeout_s = 1e-3  # a replacement can no longer start in time
        results = _results(
            pool.submit_many([(HANG, "1", "last_boxed")] + [(r"\boxed{2}", "2", "last_boxed")] * 3)
        )
        assert [r["reason"] for r in results] == ["timeout"] * 4
        assert all("no math worker is running" in r["detail"] for r in results[1:])
        late = pool.score(r"\boxed{2}", "2", "last_boxed")  # answered at once, not left waiting
        assert (late["correct"], late["reason"]) == (False, "timeout")
    finally:
        pool.close()


def test_hung_worker_is_killed_after_timeout(pool: MathPool) -> None:
    (worker,) = list(pool._all)
    res = pool.score(r"\boxed{9^{9^{9^{9^{9}}}}}", "1", "last_boxed")
    assert res["reason"] == "timeout"
    worker.proc.join(timeout=5)
    assert not worker.proc.is_alive()
    assert pool.score(r"\boxed{2}", "2", "last_boxed")["correct"] is True


def test_workers_default_to_the_cpus_the_service_may_use() -> None:
    cfg = RewardConfig()
    assert cfg.math.workers is None
    scorer = MathScorer(cfg, RewardMetrics())  # no process starts before start()
    assert scorer.workers == scorer.pool.size == len(os.sched_getaffinity(0))
    three = MathScorer(RewardConfig.model_validate({"math": {"workers": 3}}), RewardMetrics())
    assert three.pool.size == 3
