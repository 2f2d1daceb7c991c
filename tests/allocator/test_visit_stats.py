"""Statistics that survive between visits (``allocator.stats_half_life``): the success counts
(``allocator/stats.py``) and the learner's gradient statistics (``dynamo_rl/contracts/gradstats.py``)
against a loop twin — a plain Python reimplementation of the weighting — over random sequences of
visits, through the real Lua scripts on a real Redis. The twin shares no code with the scripts."""

from __future__ import annotations

import math
import random
import struct

import numpy as np
import pytest
import redis

from allocator.stats import StatsStore
from dynamo_rl.clients.allocator import AllocatorClient
from dynamo_rl.contracts import gradstats
from dynamo_rl.contracts.gradstats import GradRecord
from dynamo_rl.keys import grad_stats_key, stats_key, weight_version_key
from tests.allocator.helpers import start_allocator

IDS = [f"p{i}" for i in range(7)]


@pytest.fixture
def rclient(redis_url: str):
    c = redis.Redis.from_url(redis_url)
    yield c
    c.close()


def _age_weight(current: float, stored: float, half_life: float | None) -> float:
    """0.5^(Δversion/half_life), Δversion at least 0; 1 without a half-life."""
    if half_life is None:
        return 1.0
    return 0.5 ** (max(current - stored, 0.0) / half_life)


def _versions(rng: random.Random, steps: int) -> list[int]:
    """A weight-version sequence: mostly forward by 0..5, now and then one step back (a reader
    of an older version's statistics, or a restarted learner)."""
    out, v = [], 0
    for _ in range(steps):
        v = max(0, v - 1) if rng.random() < 0.1 else v + rng.choice([0, 0, 1, 2, 5])
        out.append(v)
    return out


@pytest.mark.parametrize("half_life", [None, 0.5, 2.0, 7.0])
@pytest.mark.parametrize("decay", [1.0, 0.8])
def test_success_counts_match_their_loop_twin(
    redis_url: str, rclient, half_life: float | None, decay: float
) -> None:
    rng = random.Random(f"{half_life}-{decay}")
    store = StatsStore.from_url(redis_url, decay=decay, half_life=half_life)
    twin: dict[str, tuple[float, float, float]] = {}  # samples, successes, version
    try:
        for version in _versions(rng, 40):
            rclient.set(weight_version_key("ns"), str(version))
            outcomes = []
            for pid in rng.sample(IDS, rng.randint(1, len(IDS))):
                a = rng.randint(0, 16)
                outcomes.append((pid, a, rng.randint(0, a)))
            if rng.random() < 0.3:  # a prompt twice in one report: merged before the script
                a = rng.randint(0, 4)
                outcomes.append((outcomes[0][0], a, rng.randint(0, a)))
            merged: dict[str, list[int]] = {}
            for pid, a, s in outcomes:
                row = merged.setdefault(pid, [0, 0])
                row[0] += a
                row[1] += s
            for pid, (a, s) in merged.items():
                g, k, v = twin.get(pid, (0.0, 0.0, float(version)))
                w = decay * _age_weight(version, v, half_life)
                twin[pid] = (w * g + a, w * k + s, float(version))
            assert store.report("ns", outcomes) == len(merged)
            got = store.get("ns", IDS)
            want = np.array([twin.get(pid, (0.0, 0.0, 0.0)) for pid in IDS])
            np.testing.assert_allclose(got.samples, want[:, 0], rtol=1e-12, atol=1e-12)
            np.testing.assert_allclose(got.successes, want[:, 1], rtol=1e-12, atol=1e-12)
            assert got.version.tolist() == want[:, 2].tolist()  # the last report's version
    finally:
        store.close()


def test_half_life_fades_by_weight_versions_not_by_report(redis_url: str, rclient) -> None:
    """At the same weights a revisit keeps the whole history; one half-life later the past
    counts half; a value from before versions were kept is not aged."""
    store = StatsStore.from_url(redis_url, half_life=2.0)
    try:
        store.report("ns", [("a", 8, 2)])
        store.report("ns", [("a", 8, 6)])
        assert store.get("ns", ["a"]).samples.tolist() == [16.0]  # version 0 both times
        rclient.set(weight_version_key("ns"), "2")
        store.report("ns", [("a", 4, 4)])
        got = store.get("ns", ["a"])
        assert (got.samples[0], got.successes[0], got.version[0]) == (12.0, 8.0, 2.0)
        rclient.hset(stats_key("ns"), "old", struct.pack("<ddd", 10.0, 5.0, 1.0))  # 24 bytes
        assert store.get("ns", ["old"]).version.tolist() == [0.0]
        store.report("ns", [("old", 2, 1)])
        assert store.get("ns", ["old"]).samples.tolist() == [12.0]
        assert store.export("ns")["prompts"]["old"]["weight_version"] == 2.0
    finally:
        store.close()


def test_the_allocator_service_writes_with_its_configs_half_life(redis_url: str, rclient) -> None:
    running = start_allocator(redis_url, stats_half_life=1.0)
    try:
        with AllocatorClient(f"127.0.0.1:{running.port}", timeout_s=5.0, retries=0) as client:
            client.report_outcomes("ns", [("a", 8, 4)])
            rclient.set(weight_version_key("ns"), "3")
            client.report_outcomes("ns", [("a", 8, 0)])
            (stats,) = client.get_stats("ns", ["a"])
    finally:
        running.stop(grace=0.5)
    assert (stats.samples, stats.successes) == (9.0, 0.5)  # 8·2^−3 + 8, 4·2^−3 + 0


def _grad_twin(
    old: tuple[float, float, float, float, float] | None,
    record: GradRecord,
    version: int,
    half_life: float | None,
) -> tuple[float, float, float, float, float]:
    """(mean, spread, version, streak, weight) after one visit."""
    streak = 0.0
    if record.zero_advantage:
        streak = old[3] + 1 if old else 1.0
    if old is None or half_life is None:
        return record.mean, record.spread, float(version), streak, 1.0
    w = old[4] * _age_weight(version, old[2], half_life)
    weight = w + 1
    mean = (w * old[0] + record.mean) / weight
    spread = math.sqrt((w * old[1] ** 2 + record.spread**2) / weight)
    return mean, spread, float(version), streak, weight


@pytest.mark.parametrize("half_life", [None, 1.0, 3.0])
def test_gradient_statistics_match_their_loop_twin(rclient, half_life: float | None) -> None:
    rng = random.Random(f"grad-{half_life}")
    twin: dict[str, tuple[float, float, float, float, float]] = {}
    for version in _versions(rng, 40):
        records = []
        for pid in rng.sample(IDS, rng.randint(1, len(IDS))):
            zero = rng.random() < 0.3
            spread = 0.0 if zero else rng.uniform(0.0, 5.0)
            records.append(GradRecord(pid, rng.uniform(-1.0, 3.0), spread, zero))
        if rng.random() < 0.3:  # a prompt twice in one batch: the last counts
            records.append(GradRecord(records[0].prompt_id, 1.0, 2.0, False))
        last = {r.prompt_id: r for r in records}
        for pid, r in last.items():
            twin[pid] = _grad_twin(twin.get(pid), r, version, half_life)
        assert gradstats.write(rclient, "ns", version, records, half_life=half_life) == len(last)
        got = gradstats.read(rclient, "ns", IDS)
        seen = [i for i, pid in enumerate(IDS) if pid in twin]
        want = np.array([twin[IDS[i]] for i in seen]).reshape(-1, 5)
        for j, field in enumerate(("mean", "spread", "version", "streak", "weight")):
            np.testing.assert_allclose(
                getattr(got, field)[seen], want[:, j], rtol=1e-12, atol=1e-12, err_msg=field
            )
        unseen = [i for i in range(len(IDS)) if IDS[i] not in twin]
        assert np.isnan(got.spread[unseen]).all() and not got.weight[unseen].any()


def test_gradient_spread_is_the_root_of_a_visit_weighted_mean_of_squares(rclient) -> None:
    gradstats.write(rclient, "ns", 0, [GradRecord("a", 1.0, 3.0, False)], half_life=2.0)
    gradstats.write(rclient, "ns", 2, [GradRecord("a", 4.0, 0.0, True)], half_life=2.0)
    got = gradstats.read(rclient, "ns", ["a"])
    # The first visit, two versions old, weighs 1/2 against the new visit's 1.
    assert got.spread[0] == pytest.approx(math.sqrt(0.5 * 9 / 1.5))
    assert got.mean[0] == pytest.approx((0.5 * 1 + 4) / 1.5)
    assert (got.weight[0], got.version[0], got.streak[0]) == (1.5, 2.0, 1.0)
    # Off: the visit replaces what was there (today's overwrite), weight 1.
    gradstats.write(rclient, "ns", 3, [GradRecord("a", 7.0, 2.0, False)])
    got = gradstats.read(rclient, "ns", ["a"])
    assert (got.mean[0], got.spread[0], got.weight[0]) == (7.0, 2.0, 1.0)
    # A value written before the weight was kept (32 bytes) reads with weight 1.
    rclient.hset(grad_stats_key("ns"), "old", struct.pack("<dddd", 1.0, 2.0, 3.0, 0.0))
    assert gradstats.read(rclient, "ns", ["old"]).weight.tolist() == [1.0]
    gradstats.write(rclient, "ns", 3, [GradRecord("old", 1.0, 0.0, False)], half_life=1.0)
    assert gradstats.read(rclient, "ns", ["old"]).spread[0] == pytest.approx(math.sqrt(2.0))
    with pytest.raises(ValueError, match="half_life must be > 0"):
        gradstats.write(rclient, "ns", 3, [GradRecord("a", 1.0, 0.0, False)], half_life=0.0)
