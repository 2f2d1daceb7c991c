"""The allocator service's health, reflection and metrics, its recovery when Redis comes back, and
the real ``dynamo-rl allocator`` command (``-m slow`` end to end; ``--help`` imports nothing heavy).
"""

from __future__ import annotations

import json
import signal
import subprocess
import sys
import time
from pathlib import Path

import grpc
import httpx
import pytest
from grpc_health.v1 import health_pb2, health_pb2_grpc

from allocator.metrics import AllocatorMetrics
from allocator.server import SERVICE_NAME, RunningServer
from dynamo_rl.clients.allocator import AllocatorClient
from dynamo_rl.procs import free_port, grpc_healthy, start_redis
from dynamo_rl.service_table import SERVICES
from tests.allocator.helpers import requests_total, start_allocator
from tests.conftest import REPO


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
    assert requests_total(server, "ReportOutcomes", "OK") == 1


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
    running = start_allocator(url)
    addr = f"127.0.0.1:{running.port}"
    try:
        with AllocatorClient(addr, timeout_s=3, retries=1, backoff_s=0.05) as c:
            c.report_outcomes("exp", [("a", 4, 2)])
            redis_proc.stop()
            with pytest.raises(grpc.RpcError) as err:
                c.allocate("exp", ["a"], 8)
            assert err.value.code() == grpc.StatusCode.UNAVAILABLE
            assert "redis" in err.value.details()
            assert (
                requests_total(running, "Allocate", "UNAVAILABLE") == 2
            )  # retried once, then raised
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
