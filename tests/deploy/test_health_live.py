"""The compose healthchecks, run for real: each service is started with its compose command (ports
moved to free ones, bound to loopback, the config file from the repository) and its healthcheck
command is executed against it, as Docker would inside the container. A healthcheck pointed at a
path the service does not serve must fail, so these checks can tell the difference.

The rollout worker and the learner serve ``/metrics`` through ``ServiceMetrics.serve`` on their
metrics port; their healthchecks run against that server with their own metric classes.
"""

from __future__ import annotations

import importlib
import re
import subprocess
import sys
from pathlib import Path

import pytest

from dynamo_rl.procs import free_port, grpc_healthy, http_ok
from tests.conftest import PYTHON
from tests.deploy.commands import CONFIG_MOUNT, EXPERIMENT
from tests.deploy.compose import REQUIRED_ENV, load

PORT_FLAGS = ("--port", "--metrics-port")


def compose_service(name: str) -> dict:
    return load(REQUIRED_ENV)["services"][name]


def localise(argv: list[str], extra: list[str]) -> tuple[list[str], dict[int, int]]:
    """The compose argv runnable here: loopback, free ports, the repo's config; and the port map."""
    assert argv[0] == "dynamo-rl"
    out, moved = [PYTHON, "-m", "dynamo_rl.cli", *argv[1:]], {}
    for i, a in enumerate(out):
        if out[i - 1] in PORT_FLAGS:
            moved[int(a)] = free_port()
            out[i] = str(moved[int(a)])
        elif out[i - 1] == "--host":
            out[i] = "127.0.0.1"
        elif a == CONFIG_MOUNT:
            out[i] = str(EXPERIMENT)
        elif a.startswith("engine.advertise_url="):
            out[i] = "engine.advertise_url=http://127.0.0.1:1"
    return out + extra, moved


def run_healthcheck(test: list[str], moved: dict[int, int], path: str | None = None) -> int:
    """Run a compose healthcheck (``CMD`` form) with its port moved like the service's."""
    assert test[0] == "CMD" and test[1] == "python" and test[2] == "-c"
    script = re.sub(r"127\.0\.0\.1:(\d+)", lambda m: f"127.0.0.1:{moved[int(m.group(1))]}", test[3])
    if path is not None:
        script = re.sub(r"(127\.0\.0\.1:\d+)/[^']*", rf"\1{path}", script)
    result = subprocess.run([sys.executable, "-c", script], capture_output=True, timeout=60)
    return result.returncode


def service_env(name: str, redis_url: str) -> dict[str, str]:
    env = dict(compose_service(name)["environment"])
    env["REDIS_URL"] = redis_url
    return env


def test_allocator_healthcheck(service, redis_url: str) -> None:
    spec = compose_service("allocator")
    argv, moved = localise(spec["command"], [])
    port = moved[50051]
    service(
        "allocator",
        argv,
        grpc_healthy(f"127.0.0.1:{port}"),
        env=service_env("allocator", redis_url),
    )
    assert run_healthcheck(spec["healthcheck"]["test"], moved) == 0
    # The prometheus scrape target is live too.
    assert http_ok(f"http://127.0.0.1:{moved[9101]}/metrics")()


def test_reward_healthcheck(service, redis_url: str) -> None:
    spec = compose_service("reward")
    argv, moved = localise(spec["command"], [])
    url = f"http://127.0.0.1:{moved[8080]}"
    service("reward", argv, http_ok(url + "/healthz"), env=service_env("reward", redis_url))
    assert run_healthcheck(spec["healthcheck"]["test"], moved) == 0
    assert run_healthcheck(spec["healthcheck"]["test"], moved, path="/no-such-path") != 0


def test_dashboard_healthcheck(service, redis_url: str, tmp_path: Path) -> None:
    spec = compose_service("dashboard")
    # Scrape targets are compose host names; here nothing answers them, which the dashboard
    # reports per target without failing its health.
    argv, moved = localise(spec["command"], [f"run.dir={tmp_path}/{{name}}"])
    url = f"http://127.0.0.1:{moved[8265]}"
    service("dashboard", argv, http_ok(url + "/healthz"), env=service_env("dashboard", redis_url))
    assert run_healthcheck(spec["healthcheck"]["test"], moved) == 0
    assert run_healthcheck(spec["healthcheck"]["test"], moved, path="/no-such-path") != 0


def test_engine_healthcheck(service, redis_url: str, tmp_path: Path) -> None:
    from learner.tiny_model import build_tiny_model

    model = build_tiny_model(tmp_path / "model", hidden_size=32, num_heads=2, num_kv_heads=1)
    spec = compose_service("engine")
    argv, moved = localise(spec["command"], [f"engine.model={model}", "engine.threads=1"])
    url = f"http://127.0.0.1:{moved[8000]}"
    service(
        "engine", argv, http_ok(url + "/health"), timeout=180, env=service_env("engine", redis_url)
    )
    assert run_healthcheck(spec["healthcheck"]["test"], moved) == 0
    assert run_healthcheck(spec["healthcheck"]["test"], moved, path="/no-such-path") != 0
    assert http_ok(url + "/metrics")()


@pytest.mark.parametrize(
    ("name", "module", "cls"),
    [
        ("rollout", "services.rollout.metrics", "WorkerMetrics"),
        ("learner", "learner.metrics", "LearnerMetrics"),
    ],
)
def test_metrics_port_healthchecks(name: str, module: str, cls: str) -> None:
    metrics_cls = getattr(importlib.import_module(module), cls)
    spec = compose_service(name)
    (port,) = {int(p) for p in re.findall(r"127\.0\.0\.1:(\d+)", spec["healthcheck"]["test"][3])}
    moved = {port: metrics_cls().metrics.serve(0)}
    assert run_healthcheck(spec["healthcheck"]["test"], moved) == 0
