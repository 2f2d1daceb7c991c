"""A real reward server (``dynamo-rl reward`` under uvicorn) on a free port, shared by the tests.

Tests talk to it over HTTP only. ``SECRET_ENV`` is set in the server's environment so the
sandbox tests can check that nothing of it reaches a sandboxed program.
"""

from __future__ import annotations

import contextlib
import os
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
import pytest
import yaml

from dynamo_rl.procs import ServiceProcess
from dynamo_rl.service_table import SERVICES
from tests.conftest import REPO

SECRET_ENV = "DYNAMO_REWARD_TEST_SECRET"
SECRET_VALUE = "s3cr3t-7f1c2a9e-do-not-leak"


@dataclass
class RewardServer:
    url: str
    proc: ServiceProcess

    def verify(self, *items: dict[str, Any], timeout: float = 60.0) -> list[dict[str, Any]]:
        r = httpx.post(f"{self.url}/v1/verify", json={"items": list(items)}, timeout=timeout)
        assert r.status_code == 200, r.text
        return r.json()["results"]

    def one(self, item: dict[str, Any], timeout: float = 60.0) -> dict[str, Any]:
        return self.verify({"id": "x", **item}, timeout=timeout)[0]

    def assert_serving(self) -> None:
        """The service still answers health checks and scores a trivial item correctly."""
        assert self.proc.alive(), self.proc.log_tail()
        assert httpx.get(f"{self.url}/healthz", timeout=10).json()["status"] == "ok"
        res = self.one({"kind": "math", "response": "\\boxed{2}", "ground_truth": "2"})
        assert res["correct"] is True


@contextlib.contextmanager
def configured_reward_server(log_dir: Path, config: dict[str, Any]) -> Iterator[RewardServer]:
    """A server started with ``config`` (written to ``log_dir/reward.yaml``), stopped on exit."""
    (log_dir / "reward.yaml").write_text(yaml.safe_dump(config))
    server = start_reward_server(log_dir, ["--config", str(log_dir / "reward.yaml")])
    try:
        yield server
    finally:
        server.proc.stop()


def start_reward_server(log_dir: Path, overrides: Sequence[str] = ()) -> RewardServer:
    env = {**os.environ, SECRET_ENV: SECRET_VALUE}
    proc, url = SERVICES["reward"].start(
        log_dir / "reward.log", "--host", "127.0.0.1", *overrides, env=env, cwd=REPO, timeout=120
    )
    return RewardServer(url, proc)


@pytest.fixture(scope="package")
def reward(tmp_path_factory: pytest.TempPathFactory) -> Iterator[RewardServer]:
    """One default-config server (2 math workers, 2 sandboxes) shared by this folder's modules;
    modules that need other limits start their own with :func:`start_reward_server`."""
    server = start_reward_server(tmp_path_factory.mktemp("reward"))
    try:
        yield server
    finally:
        server.proc.stop()
