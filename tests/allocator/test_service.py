"""The allocator service over a real gRPC channel and a real Redis.

Most tests run the server in this process (a real gRPC server on a free port, real Redis from the
harness); the reporters of the concurrency test are separate processes, and the end-to-end tests
(``-m slow``) start ``dynamo-rl allocator`` itself.
"""

from __future__ import annotations

import asyncio
import json
import re
import signal
import subprocess
import sys
import textwrap
import time
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import grpc
import httpx
import numpy as np
import pytest
from grpc_health.v1 import health_pb2, health_pb2_grpc

from allocator.client import AllocatorClient
from allocator.metrics import AllocatorMetrics
from allocator.server import SERVICE_NAME, RunningServer, start_server
from allocator.stats import StatsStore
from dynamo_rl.config import AllocatorConfig
from dynamo_rl.procs import free_port, grpc_healthy, start_redis
from launcher.service_table import SERVICES
from tests.conftest import REPO, dynamo_rl_argv


def _start(redis_url: str, control_token: str | None = None, **cfg: object) -> RunningServer:
    config = AllocatorConfig(port=0, **cfg)  # type: ignore[arg-type]
    store = StatsStore.from_url(redis_url, decay=config.decay, timeout_s=1.0)
    return start_server(
        config, store, AllocatorMetrics(), control_token=control_token, ping_interval_s=0.2
    )


@pytest.fixture
def server(redis_url: str) -> Iterator[RunningServer]:
    running = _start(redis_url, max_prompts_per_request=100)
    yield running
    running.stop(grace=0.5)


@pytest.fixture
def client(server: RunningServer) -> Iterator[AllocatorClient]:
    with AllocatorClient(f"127.0.0.1:{server.port}", timeout_s=5.0, retries=0) as c:
        yield c


def _requests(server: RunningServer, method: str, code: str) -> float:
    value = server.service.m.metrics.registry.get_sample_value(
        "dynamo_allocator_requests_total", {"method": method, "code": code}
    )
    return value or 0.0


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
    defaults = client.allocate("exp", ids)  # server defaults: n_per_prompt 16, n 4..24
    assert defaults.budget == 16 * 8 and min(defaults.counts) >= 4 and max(defaults.counts) <= 24
    clipped = client.allocate("exp", ids, budget=10**6)
    assert clipped.counts == [24] * 8


def test_hopeless_prompts_get_hopeless_n_through_the_service(redis_url: str) -> None:
    """allocator.hopeless_after/hopeless_n reach the algorithm: a prompt with no success after
    enough samples gets hopeless_n, and its n_min - hopeless_n go to the others."""
    running = _start(redis_url, hopeless_after=16, hopeless_n=1, n_min=4, n_max=24)
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
    from allocator.client import AllocatorClient
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


BAD_ALLOCATE = [
    ({"namespace": ""}, "namespace"),
    ({"namespace": "a b"}, "namespace"),
    ({"n_min": 10, "n_max": 8}, "n_min"),
    ({"n_min": -1}, "n_min"),
    ({"n_max": 0}, "n_max"),
    ({"budget": -1, "n_per_prompt": None}, "budget"),
    ({"n_per_prompt": 0}, "n_per_prompt"),
    ({"prompt_ids": ["a", "b", "a"]}, r"prompt_ids\[2\]: duplicate"),
    ({"prompt_ids": ["a", ""]}, r"prompt_ids\[1\]: empty"),
    ({"prompt_ids": ["a", "b\0c"]}, r"prompt_ids\[1\]: .*NUL"),
    ({"prompt_ids": [f"p{i}" for i in range(101)]}, "max_prompts_per_request"),
    ({"priority": "entropy"}, "priority"),
    ({"scheme": "greedy"}, "scheme"),
    ({"mastery_threshold": 1.5}, "mastery_threshold"),
    ({"min_priority": -0.1}, "min_priority"),
    ({"initial_budget": -2}, "initial_budget"),
]


@pytest.mark.parametrize(("change", "field"), BAD_ALLOCATE)
def test_bad_allocate_is_invalid_argument_naming_the_field(
    server: RunningServer, client: AllocatorClient, change: dict, field: str
) -> None:
    args: dict = {"namespace": "exp", "prompt_ids": ["a", "b"], "n_per_prompt": 8, **change}
    with pytest.raises(grpc.RpcError) as err:
        client.allocate(args.pop("namespace"), args.pop("prompt_ids"), **args)
    assert err.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert err.value.details() is not None

    assert re.search(field, err.value.details()), err.value.details()


BAD_REPORTS = [
    ([("a", -1, 0)], r"outcomes\[0\]\.attempts"),
    ([("a", 2, -1)], r"outcomes\[0\]\.successes"),
    ([("a", 4, 1), ("b", 2, 3)], r"outcomes\[1\]\.successes: 3 is more than attempts 2"),
    ([("a", 4, 1), ("a", 2, 1)], r"outcomes\[1\]: duplicate"),
    ([(f"p{i}", 1, 0) for i in range(101)], "max_prompts_per_request"),
]


@pytest.mark.parametrize(("outcomes", "field"), BAD_REPORTS)
def test_bad_report_is_invalid_argument_and_changes_nothing(
    server: RunningServer, client: AllocatorClient, outcomes: list, field: str
) -> None:
    with pytest.raises(grpc.RpcError) as err:
        client.report_outcomes("exp", outcomes)
    assert err.value.code() == grpc.StatusCode.INVALID_ARGUMENT

    assert re.search(field, err.value.details()), err.value.details()
    assert client.export_namespace("exp")["prompts"] == {}


def test_invalid_argument_is_not_retried(server: RunningServer) -> None:
    with (
        AllocatorClient(f"127.0.0.1:{server.port}", retries=3, backoff_s=0.01) as c,
        pytest.raises(grpc.RpcError),
    ):
        c.allocate("exp", ["a"], 8, n_min=9, n_max=8)
    assert _requests(server, "Allocate", "INVALID_ARGUMENT") == 1


def test_reset_needs_the_control_token(redis_url: str) -> None:
    running = _start(redis_url, control_token="s3cret")
    try:
        addr = f"127.0.0.1:{running.port}"
        with AllocatorClient(addr) as anonymous:
            anonymous.report_outcomes("exp", [("a", 1, 1)])
            with pytest.raises(grpc.RpcError) as err:
                anonymous.reset_namespace("exp")
            assert err.value.code() == grpc.StatusCode.UNAUTHENTICATED
        with AllocatorClient(addr, control_token="s3cret") as admin:
            assert admin.reset_namespace("exp") == 1
    finally:
        running.stop(grace=0.5)


def test_health_reflection_and_metrics(server: RunningServer, client: AllocatorClient) -> None:
    addr = f"127.0.0.1:{server.port}"
    assert grpc_healthy(addr)()
    _wait(grpc_healthy(addr, SERVICE_NAME), 5)
    from grpc_reflection.v1alpha.proto_reflection_descriptor_database import (
        ProtoReflectionDescriptorDatabase,
    )

    with grpc.insecure_channel(addr) as channel:
        services = ProtoReflectionDescriptorDatabase(channel).get_services()
    assert SERVICE_NAME in services and "grpc.health.v1.Health" in services
    client.report_outcomes("exp", [("a", 16, 8)])
    client.allocate("exp", ["a", "b"], 16)
    reg = server.service.m.metrics.registry
    assert reg.get_sample_value("dynamo_allocator_prompts_allocated_total") == 2
    assert reg.get_sample_value("dynamo_allocator_responses_allocated_total") == 32
    assert reg.get_sample_value("dynamo_allocator_outcomes_reported_total") == 1
    assert reg.get_sample_value("dynamo_allocator_unexplored_prompts_total") == 1
    assert reg.get_sample_value("dynamo_allocator_count_responses_count") == 2
    assert reg.get_sample_value("dynamo_allocator_priority_count") == 1
    # "b" has no statistics: the priority chart's "exploring" bar, from the same sample.
    assert reg.get_sample_value("dynamo_allocator_priority_exploring_total") == 1
    assert (
        reg.get_sample_value(
            "dynamo_allocator_request_latency_seconds_count", {"method": "Allocate"}
        )
        == 1
    )
    assert _requests(server, "ReportOutcomes", "OK") == 1


def test_metric_names() -> None:
    names = AllocatorMetrics().metrics.names()
    for expected in (
        "dynamo_allocator_requests_total",
        "dynamo_allocator_request_latency_seconds_bucket",
        "dynamo_allocator_prompts_allocated_total",
        "dynamo_allocator_budget_responses_bucket",
        "dynamo_allocator_count_responses_bucket",
        "dynamo_allocator_priority_bucket",
        "dynamo_allocator_redis_up",
    ):
        assert expected in names


def _wait(check, timeout: float) -> None:
    deadline = time.monotonic() + timeout
    while True:
        try:
            if check():
                return
        except Exception:
            pass
        if time.monotonic() > deadline:
            raise TimeoutError("condition not met")
        time.sleep(0.05)


def _health(addr: str, service: str) -> int:
    with grpc.insecure_channel(addr) as channel:
        stub = health_pb2_grpc.HealthStub(channel)
        return stub.Check(health_pb2.HealthCheckRequest(service=service), timeout=2).status


def test_redis_down_is_unavailable_and_the_server_recovers(tmp_path: Path) -> None:
    port = free_port()
    redis_proc, url = start_redis(tmp_path / "r1", port=port)
    running = _start(url)
    addr = f"127.0.0.1:{running.port}"
    try:
        with AllocatorClient(addr, timeout_s=3, retries=1, backoff_s=0.05) as c:
            c.report_outcomes("exp", [("a", 4, 2)])
            redis_proc.stop()
            with pytest.raises(grpc.RpcError) as err:
                c.allocate("exp", ["a"], 8)
            assert err.value.code() == grpc.StatusCode.UNAVAILABLE
            assert "redis" in err.value.details()
            assert _requests(running, "Allocate", "UNAVAILABLE") == 2  # retried once, then raised
            _wait(
                lambda: _health(addr, SERVICE_NAME) == health_pb2.HealthCheckResponse.NOT_SERVING, 5
            )
            assert _health(addr, "") == health_pb2.HealthCheckResponse.SERVING  # process alive
            redis_proc, _ = start_redis(tmp_path / "r2", port=port)  # an empty Redis comes back
            _wait(lambda: _health(addr, SERVICE_NAME) == health_pb2.HealthCheckResponse.SERVING, 10)
            c.report_outcomes("exp", [("a", 4, 2)])  # the Lua script is reloaded as needed
            assert c.get_stats("exp", ["a"])[0].samples == 4
            assert c.allocate("exp", ["a"], 8).counts == [8]
    finally:
        running.stop(grace=0.5)
        redis_proc.stop()


def test_client_gives_up_after_retries_when_no_server() -> None:
    with AllocatorClient(f"127.0.0.1:{free_port()}", timeout_s=1, retries=2, backoff_s=0.01) as c:
        with pytest.raises(grpc.RpcError) as err:
            c.allocate("exp", ["a"], 8)
        assert err.value.code() == grpc.StatusCode.UNAVAILABLE
    with pytest.raises(ValueError, match="not both"):
        AllocatorClient("127.0.0.1:1").allocate("exp", ["a"], 8, budget=8)


def test_client_delays_are_capped_and_bounded() -> None:
    """Uncapped doubling from 10 ms would sleep 0.01·(1+2+…+128) = 2.55 s over 8 retries."""
    delays: list[float] = []
    t0 = time.monotonic()
    with (
        AllocatorClient(
            f"127.0.0.1:{free_port()}",
            timeout_s=1,
            retries=8,
            backoff_s=0.01,
            backoff_max_s=0.04,
            on_retry=lambda _reason, d: delays.append(d),
        ) as c,
        pytest.raises(grpc.RpcError) as err,
    ):
        c.report_outcomes("exp", [("a", 1, 1)])
    assert err.value.code() == grpc.StatusCode.UNAVAILABLE
    assert len(delays) == 8  # exactly `retries` retries, then the error
    assert all(d <= 0.04 for d in delays) and delays[-1] >= 0.04 * 0.8
    assert time.monotonic() - t0 < 2.0


def test_async_client_gives_up_after_its_retries_with_capped_delays() -> None:
    delays: list[float] = []
    with AllocatorClient(
        f"127.0.0.1:{free_port()}",
        timeout_s=1,
        retries=5,
        backoff_s=0.02,
        backoff_max_s=0.05,
        on_retry=lambda _reason, d: delays.append(d),
    ) as c:
        with pytest.raises(grpc.RpcError) as err:
            asyncio.run(c.aallocate("exp", ["a"], 8))
        assert err.value.code() == grpc.StatusCode.UNAVAILABLE
        assert len(delays) == 5 and all(d <= 0.05 for d in delays)
        delays.clear()
        with pytest.raises(grpc.RpcError):
            asyncio.run(c.areport_outcomes("exp", [("a", 1, 1)]))
        assert len(delays) == 5


def test_async_client_backoff_holds_no_thread() -> None:
    """With one executor thread, a job submitted while the client waits out its back-off runs at
    once: the wait is an asyncio.sleep, not a sleep inside ``to_thread``."""
    delays: list[float] = []

    async def scenario(c: AllocatorClient) -> float:
        asyncio.get_running_loop().set_default_executor(ThreadPoolExecutor(max_workers=1))
        call = asyncio.create_task(c.aallocate("exp", ["a"], 8))
        deadline = time.monotonic() + 10
        while not delays:  # the first attempt failed; the back-off (>= 0.8 s) has begun
            assert time.monotonic() < deadline and not call.done()
            await asyncio.sleep(0.005)
        t = time.monotonic()
        await asyncio.to_thread(lambda: None)
        latency = time.monotonic() - t
        with pytest.raises(grpc.RpcError):
            await call
        return latency

    with AllocatorClient(
        f"127.0.0.1:{free_port()}",
        timeout_s=1,
        retries=1,
        backoff_s=1.0,
        backoff_max_s=1.0,
        on_retry=lambda _reason, d: delays.append(d),
    ) as c:
        assert asyncio.run(scenario(c)) < 0.4


def test_async_client_calls_a_live_server(server: RunningServer) -> None:
    async def scenario(c: AllocatorClient) -> list[int]:
        assert await c.areport_outcomes("exp", [("a", 4, 2), ("b", 4, 4)]) == 2
        return (await c.aallocate("exp", ["a", "b"], 8, n_min=2, n_max=14)).counts

    with AllocatorClient(f"127.0.0.1:{server.port}") as c:
        counts = asyncio.run(scenario(c))
        assert [s.samples for s in c.get_stats("exp", ["a", "b"])] == [4, 4]
    assert len(counts) == 2 and sum(counts) == 16


# -- end to end: the real command --------------------------------------------------------------


@pytest.mark.slow
def test_dynamo_rl_allocator_end_to_end(service, redis_url: str) -> None:
    port, metrics_port = free_port(), free_port()
    allocator = SERVICES["allocator"]
    argv = allocator.argv(
        "--redis-url", redis_url, "--metrics-port", str(metrics_port), "allocator.n_min=2",
        *allocator.port_overrides(port),
    )  # fmt: skip
    proc = service("allocator", argv, grpc_healthy(f"127.0.0.1:{port}", SERVICE_NAME), timeout=60)
    with AllocatorClient(f"127.0.0.1:{port}") as c:
        c.report_outcomes("e2e", [("x", 10, 5), ("y", 10, 10)])
        result = c.allocate("e2e", ["x", "y"], n_per_prompt=8, n_max=14)
        assert result.counts == [14, 2]  # n_min=2 came from the command line override
        assert json.loads(json.dumps(c.export_namespace("e2e")))["prompts"]["x"]["samples"] == 10
    text = httpx.get(f"http://127.0.0.1:{metrics_port}/metrics", timeout=5).text
    assert 'dynamo_allocator_requests_total{code="OK",method="Allocate"} 1.0' in text
    proc.signal(signal.SIGTERM)
    assert proc.proc is not None and proc.proc.wait(timeout=20) == 0


@pytest.mark.slow
def test_bad_config_exits_2_naming_the_key() -> None:
    result = subprocess.run(
        dynamo_rl_argv("allocator", "allocator.n_min=30", "allocator.n_max=8"),
        capture_output=True,
        text=True,
        timeout=60,
        cwd=REPO,
    )
    assert result.returncode == 2
    assert "allocator.n_min" in result.stderr and "Traceback" not in result.stderr


def test_help_is_true_and_light() -> None:
    code = (
        "import sys\n"
        "from dynamo_rl.cli import main\n"
        "try:\n    main(['allocator', '--help'])\nexcept SystemExit as e:\n    assert e.code == 0\n"
        "heavy = [m for m in ('grpc', 'redis', 'numpy', 'torch') if m in sys.modules]\n"
        "assert not heavy, heavy\n"
    )
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=REPO)
    assert result.returncode == 0, result.stderr
    for flag in ("--redis-url", "--port", "--metrics-port", "--decay", "--config"):
        assert flag in result.stdout


# -- the server's fast paths: the hand-written reply, batched metrics, batched reads ------------


@pytest.mark.parametrize("high", [1, 128, 300, 20_000, 2**31 - 1])
def test_allocate_reply_is_byte_identical_to_protobuf(high: int) -> None:
    from allocator.server import encode_allocate_response
    from dynamo_rl.proto.dynamo.v1 import allocator_pb2 as pb

    rng = np.random.default_rng(high)
    for n in (0, 1, 7, 512):
        counts = rng.integers(0, high, n)
        if n:
            counts[0] = high - 1  # the widest varint of the range
        priorities = np.where(rng.random(n) < 0.2, -1.0, rng.random(n))
        for budget in (0, 1, int(counts.sum()), 2**40 + 3):
            expected = pb.AllocateResponse(
                counts=counts.tolist(), priorities=priorities.tolist(), budget=budget
            ).SerializeToString()
            assert encode_allocate_response(counts, priorities, budget) == expected, (n, budget)


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
