"""The server's fast paths: batched metrics, batched reads."""

from __future__ import annotations

import asyncio

import numpy as np
import pytest

from allocator.stats import StatsStore
from dynamo_rl.procs import free_port


def test_observe_many_matches_observe_one_by_one() -> None:
    from dynamo_rl.metrics import ServiceMetrics, observe_many

    m = ServiceMetrics("check")
    one, many = (
        m.histogram("one", "x", buckets=(1, 2, 4)),
        m.histogram("many", "x", buckets=(1, 2, 4)),
    )
    values = [0.0, 1.0, 1.5, 2.0, 2.0, 3.9, 4.0, 4.5, 100.0, -1.0]  # bounds themselves included
    for v in values:
        one.observe(v)
    observe_many(many, np.array(values))
    observe_many(many, [])
    reg = m.registry
    for le in ("1.0", "2.0", "4.0", "+Inf"):
        assert reg.get_sample_value("dynamo_check_many_bucket", {"le": le}) == reg.get_sample_value(
            "dynamo_check_one_bucket", {"le": le}
        ), le
    assert reg.get_sample_value("dynamo_check_many_sum") == pytest.approx(sum(values))
    assert reg.get_sample_value("dynamo_check_many_count") == len(values)


def _evalsha_calls(url: str) -> int:
    import redis

    with redis.Redis.from_url(url) as r:
        return int(r.info("commandstats").get("cmdstat_evalsha", {}).get("calls", 0))


def test_concurrent_reads_go_together_and_each_gets_its_own(redis_url: str) -> None:
    store = StatsStore.from_url(redis_url)
    store.report("a", [(f"p{i}", 10 + i, i % 7) for i in range(300)])
    store.report("b", [(f"p{i}", 100 + i, i % 3) for i in range(50)])
    requests = [("a", [f"p{j}" for j in range(i * 20, i * 20 + 40)]) for i in range(8)]
    requests += [("b", ["p3", "p1", "unknown"]), ("a", ["p299", "zz"])]
    expected = [store.get(ns, ids) for ns, ids in requests]

    async def scenario() -> list:
        before = _evalsha_calls(redis_url)
        results = await asyncio.gather(*(store.aget(ns, ids) for ns, ids in requests))
        scripts = _evalsha_calls(redis_url) - before
        after = await store.aget("b", ["p1"])  # the reader is free again
        await store.aclose()
        return [results, scripts, after]

    results, scripts, after = asyncio.run(scenario())
    assert scripts == 2  # ten reads that arrived together: one script per namespace
    for got, want in zip(results, expected, strict=True):
        assert got.samples.tolist() == want.samples.tolist()
        assert got.successes.tolist() == want.successes.tolist()
        assert got.updated_unix.tolist() == want.updated_unix.tolist()
    assert after.samples.tolist() == [101.0]
    store.close()


def test_every_waiting_read_gets_the_redis_error() -> None:
    import redis

    store = StatsStore.from_url(f"redis://127.0.0.1:{free_port()}/0", timeout_s=1.0)

    async def scenario() -> list:
        reads = [store.aget("exp", [f"p{i}"]) for i in range(5)]
        return await asyncio.wait_for(asyncio.gather(*reads, return_exceptions=True), 20)

    results = asyncio.run(scenario())
    assert all(isinstance(r, redis.exceptions.ConnectionError) for r in results), results
    store.close()
