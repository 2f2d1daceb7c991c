"""The learner → allocator gradient-statistics contract through real Redis and the real gRPC
allocator: what the learner writes (``dynamo_rl.contracts.gradstats``) steers ``method: grad``,
never-measured prompts fall back to σ, a stale statistic decays with the weight-version distance,
and the skip rule skips a zero-advantage prompt but re-checks it."""

from __future__ import annotations

import numpy as np
import pytest
import redis

from dynamo_rl.clients.allocator import AllocatorClient
from dynamo_rl.contracts import gradstats
from dynamo_rl.contracts.gradstats import GradRecord
from dynamo_rl.keys import weight_version_key
from tests.allocator.helpers import start_allocator

IDS = ["a", "b", "c", "d"]


@pytest.fixture
def rclient(redis_url: str):
    c = redis.Redis.from_url(redis_url)
    yield c
    c.close()


def _allocate(redis_url: str, rclient, **cfg):
    """Counts for IDS from a fresh server with ``cfg`` (equal success statistics for all)."""
    running = start_allocator(redis_url, n_min=2, n_max=24, initial_budget=8, **cfg)
    try:
        with AllocatorClient(f"127.0.0.1:{running.port}", timeout_s=5.0, retries=0) as client:
            client.report_outcomes("ns", [(pid, 16, 8) for pid in IDS])
            return np.array(client.allocate("ns", IDS, budget=40).counts), running
    finally:
        running.stop(grace=0.5)


def test_written_statistics_read_back_with_version_and_streak(rclient) -> None:
    gradstats.write(
        rclient, "ns", 3, [GradRecord("a", 1.0, 2.0, False), GradRecord("b", 0, 0, True)]
    )
    gradstats.write(rclient, "ns", 5, [GradRecord("b", 0, 0, True), GradRecord("c", 1, 3, False)])
    rclient.set(weight_version_key("ns"), "9")
    got = gradstats.read(rclient, "ns", ["a", "b", "c", "never"])
    assert got.spread[:3].tolist() == [2.0, 0.0, 3.0] and np.isnan(got.spread[3])
    assert got.version[:3].tolist() == [3.0, 5.0, 5.0]
    assert got.streak[:3].tolist() == [0.0, 2.0, 0.0]  # b: zero advantage twice in a row
    assert got.current_version == 9 and got.age[:3].tolist() == [6.0, 4.0, 4.0]
    gradstats.write(rclient, "ns", 6, [GradRecord("b", 1, 1, False)])
    assert gradstats.read(rclient, "ns", ["b"]).streak.tolist() == [0.0]  # signal: reset


def test_grad_method_follows_the_learners_statistics_through_the_service(
    redis_url: str, rclient
) -> None:
    rclient.set(weight_version_key("ns"), "10")
    records = [GradRecord("a", 1, 1.0, False), GradRecord("b", 1, 6.0, False)]
    records.append(GradRecord("c", 0, 0.0, True))  # d: never measured
    gradstats.write(rclient, "ns", 10, records)
    counts, _ = _allocate(redis_url, rclient, method="grad", grad_half_life=2.0)
    assert counts.sum() == 40
    assert counts[1] > counts[3] > counts[0] > counts[2] == 2  # d: σ in the spreads' units
    sigma, _ = _allocate(redis_url, rclient, method="dra", scheme="water-level", priority="std")
    assert sigma.tolist() == [10, 10, 10, 10]  # equal σ: dra cannot tell them apart
    # The same statistics 4 versions (two half-lives) later count a quarter: halfway gone to σ.
    rclient.set(weight_version_key("ns"), "14")
    aged, _ = _allocate(redis_url, rclient, method="grad", grad_half_life=2.0)
    assert aged[1] < counts[1] and aged[2] > counts[2]
    rclient.set(weight_version_key("ns"), "1000")
    gone, _ = _allocate(redis_url, rclient, method="grad", grad_half_life=2.0)
    assert gone.tolist() == sigma.tolist()


@pytest.mark.parametrize("budget_mode", ["respend", "save"])
def test_skip_rule_through_the_service_skips_and_rechecks(
    redis_url: str, rclient, budget_mode: str
) -> None:
    for _ in range(4):  # four visits in a row without signal
        gradstats.write(rclient, "ns", 0, [GradRecord("a", 0, 0.0, True)])
    gradstats.write(rclient, "ns", 0, [GradRecord(p, 1, 1.0, False) for p in IDS[1:]])
    running = start_allocator(
        redis_url, n_min=2, n_max=24, skip_after=2, skip_max=0.75, skip_budget=budget_mode
    )
    try:
        with AllocatorClient(f"127.0.0.1:{running.port}", timeout_s=5.0, retries=0) as client:
            client.report_outcomes("ns", [(pid, 16, 0 if pid == "a" else 8) for pid in IDS])
            first = [client.allocate("ns", IDS, budget=40).counts for _ in range(60)]
    finally:
        running.stop(grace=0.5)
    # save: a skipped prompt's share (a quarter of the budget) is not spent.
    spent = {"respend": 40, "save": 30}[budget_mode]
    assert all(sum(c) == (spent if c[0] == 0 else 40) for c in first)
    skipped = sum(c[0] == 0 for c in first)
    assert 25 < skipped < 59  # about 3/4 skipped, the rest re-checked
    assert all(min(c[1:]) >= 2 for c in first)
