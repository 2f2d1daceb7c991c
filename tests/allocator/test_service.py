"""The allocator service's calls over a real gRPC channel and a real Redis: allocation moving with
the reported outcomes, the server's defaults, statistics, export and reset, and the store beneath.

The server runs in this process (``tests/allocator/conftest.py``); the reporters of the concurrency
test are separate processes.
"""

from __future__ import annotations

import asyncio
import subprocess
import sys
import textwrap
import time

import grpc
import pytest

from allocator.server import RunningServer
from allocator.stats import StatsStore
from dynamo_rl.clients.allocator import AllocatorClient
from dynamo_rl.config import AllocatorConfig
from tests.allocator.helpers import start_allocator
from tests.conftest import REPO


def test_allocate_report_allocate_moves_counts_to_half_solved(client: AllocatorClient) -> None:
    ids = ["half", "hard", "easy", "never"]
    first = client.allocate("exp", ids, 16, n_min=4, n_max=24)
    assert first.counts == [16, 16, 16, 16]  # all explored: exploration, then round-robin
    assert first.priorities == [-1.0] * 4 and first.budget == 64
    updated = client.report_outcomes(
        "exp", [("half", 32, 16), ("hard", 32, 1), ("easy", 32, 31), ("never", 32, 0)]
    )
    assert updated == 4
    second = client.allocate("exp", ids, 16, n_min=4, n_max=24)
    assert sum(second.counts) == 64
    assert second.counts[0] == 24  # half-solved: up to n_max; its overflow follows priority
    assert second.counts[1] > second.counts[2] and abs(second.counts[2] - second.counts[3]) <= 1
    assert second.priorities[0] == pytest.approx(16 * 16 / (32 * 31))
    # Another namespace is untouched.
    assert client.allocate("other", ids, 16).priorities == [-1.0] * 4


def test_budget_scheme_and_server_defaults(client: AllocatorClient) -> None:
    ids = [f"p{i}" for i in range(8)]
    client.report_outcomes("exp", [(pid, 20, 2 + 2 * i) for i, pid in enumerate(ids)])
    by_budget = client.allocate("exp", ids, budget=100, scheme="water-level", priority="std")
    assert by_budget.budget == sum(by_budget.counts) == 100
    defaults = client.allocate("exp", ids)  # server defaults: n_per_prompt 8, n 2..16
    assert defaults.budget == 8 * 8 and min(defaults.counts) >= 2 and max(defaults.counts) <= 16
    clipped = client.allocate("exp", ids, budget=10**6)
    assert clipped.counts == [16] * 8


def test_hopeless_prompts_get_hopeless_n_through_the_service(redis_url: str) -> None:
    """allocator.hopeless_after/hopeless_n reach the algorithm: a prompt with no success after
    enough samples gets hopeless_n, and its n_min - hopeless_n go to the others."""
    running = start_allocator(redis_url, hopeless_after=16, hopeless_n=1, n_min=4, n_max=24)
    try:
        with AllocatorClient(f"127.0.0.1:{running.port}", timeout_s=5.0, retries=0) as c:
            c.report_outcomes("exp", [("never", 32, 0), ("half", 32, 16), ("young", 8, 0)])
            got = c.allocate("exp", ["never", "half", "young"], budget=30)
            # "young" has too few samples to be hopeless (8 < 16): it is still explored.
            assert got.counts[0] == 1 and sum(got.counts) == 30, got.counts
            assert got.counts[1] > 4 and got.counts[2] >= 4, got.counts
            with pytest.raises(grpc.RpcError) as err:
                c.allocate("exp", ["never"], budget=4, n_min=0)
            assert err.value.code() == grpc.StatusCode.INVALID_ARGUMENT
            assert "hopeless_n" in (err.value.details() or "")
    finally:
        running.stop(grace=0.5)


def test_hopeless_config_is_checked() -> None:
    with pytest.raises(ValueError, match=r"allocator\.hopeless_n"):
        AllocatorConfig(hopeless_after=8, hopeless_n=5, n_min=4)
    AllocatorConfig(hopeless_after=0, hopeless_n=5, n_min=4)  # off: not checked


def test_stats_export_and_reset(client: AllocatorClient) -> None:
    before = time.time()
    client.report_outcomes("exp", [("a", 8, 3), ("b", 4, 4)])
    client.report_outcomes("exp", [("a", 8, 1)])
    stats = client.get_stats("exp", ["a", "b", "unknown"])
    assert [(s.prompt_id, s.samples, s.successes) for s in stats] == [
        ("a", 16, 4),
        ("b", 4, 4),
        ("unknown", 0, 0),
    ]
    assert stats[0].updated_unix >= before - 1 and stats[2].updated_unix == 0
    exported = client.export_namespace("exp")
    assert exported["namespace"] == "exp"
    assert exported["prompts"]["a"]["samples"] == 16 and exported["prompts"]["b"]["successes"] == 4
    assert client.reset_namespace("exp") == 2
    assert client.get_stats("exp", ["a"])[0].samples == 0
    assert client.export_namespace("exp")["prompts"] == {}


def test_decay_scales_old_counts(redis_url: str) -> None:
    store = StatsStore.from_url(redis_url, decay=0.5)
    store.report("exp", [("a", 10, 6)])
    store.report("exp", [("a", 10, 2)])
    stats = store.get("exp", ["a"])
    assert stats.samples[0] == pytest.approx(15.0) and stats.successes[0] == pytest.approx(5.0)
    store.close()


def test_repeated_prompt_in_one_library_report_is_merged(redis_url: str) -> None:
    store = StatsStore.from_url(redis_url)
    store.report("exp", [("x", 2, 1), ("y", 1, 1), ("x", 3, 1)])
    stats = store.get("exp", ["x", "y"])
    assert list(stats.samples) == [5.0, 1.0] and list(stats.successes) == [2.0, 1.0]
    with pytest.raises(ValueError, match="NUL"):
        store.get("exp", ["a\0b"])
    store.close()


def test_large_report_is_chunked_and_counted(redis_url: str) -> None:
    store = StatsStore.from_url(redis_url)
    outcomes = [(f"p{i}", 3, i % 4) for i in range(5000)]  # more than one script chunk
    assert store.report("exp", outcomes) == 5000
    stats = store.get("exp", [f"p{i}" for i in range(0, 5000, 999)])
    assert list(stats.samples) == [3.0] * 6
    assert list(stats.successes) == [float(i % 4) for i in range(0, 5000, 999)]
    store.close()


REPORTER = textwrap.dedent(
    """
    import sys
    from dynamo_rl.clients.allocator import AllocatorClient
    addr, worker = sys.argv[1], int(sys.argv[2])
    with AllocatorClient(addr, retries=5) as c:
        for step in range(40):
            c.report_outcomes("exp", [(f"p{i}", 2, (i + worker + step) % 3 // 2)
                                      for i in range(25)])
    """
)


@pytest.mark.slow
def test_concurrent_reporters_from_several_processes_sum_exactly(
    server: RunningServer, client: AllocatorClient
) -> None:
    addr = f"127.0.0.1:{server.port}"
    workers = 4
    procs = [
        subprocess.Popen([sys.executable, "-c", REPORTER, addr, str(w)], cwd=REPO)
        for w in range(workers)
    ]
    for p in procs:
        assert p.wait(timeout=120) == 0
    stats = client.get_stats("exp", [f"p{i}" for i in range(25)])
    for i, s in enumerate(stats):
        expected = sum((i + w + step) % 3 // 2 for w in range(workers) for step in range(40))
        assert s.samples == workers * 40 * 2
        assert s.successes == expected


def test_async_client_calls_a_live_server(server: RunningServer) -> None:
    async def scenario(c: AllocatorClient) -> list[int]:
        assert await c.areport_outcomes("exp", [("a", 4, 2), ("b", 4, 4)]) == 2
        return (await c.aallocate("exp", ["a", "b"], 8, n_min=2, n_max=14)).counts

    with AllocatorClient(f"127.0.0.1:{server.port}") as c:
        counts = asyncio.run(scenario(c))
        assert [s.samples for s in c.get_stats("exp", ["a", "b"])] == [4, 4]
    assert len(counts) == 2 and sum(counts) == 16


def test_concurrent_allocates_answer_each_its_own_batch(
    server: RunningServer, client: AllocatorClient
) -> None:
    ids = [f"p{i}" for i in range(90)]
    client.report_outcomes("exp", [(pid, 16, i % 17) for i, pid in enumerate(ids)])
    batches = [ids[i : i + 30] for i in range(0, 61, 10)]
    expected = [client.allocate("exp", b, 12, n_min=4, n_max=24) for b in batches]

    async def scenario(c: AllocatorClient) -> list:
        calls = [c.aallocate("exp", b, 12, n_min=4, n_max=24) for b in batches for _ in range(3)]
        return await asyncio.gather(*calls)

    with AllocatorClient(f"127.0.0.1:{server.port}", max_in_flight=64) as c:
        results = asyncio.run(scenario(c))
    for i, result in enumerate(results):
        assert result == expected[i // 3]
