"""``dynamo-rl reward``: help, config errors, refusing to run code without a sandbox, and the
loudly logged ``--unsafe-no-sandbox`` mode (a real server)."""

from __future__ import annotations

import subprocess
from pathlib import Path

import httpx
import pytest

from tests.conftest import REPO, dynamo_rl_argv
from tests.services.reward.conftest import start_reward_server


def cli(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        dynamo_rl_argv("reward", *args), capture_output=True, text=True, cwd=REPO, timeout=120
    )


def test_help_lists_the_flags() -> None:
    out = cli("--help")
    assert out.returncode == 0
    for flag in ("--host", "--port", "--unsafe-no-sandbox", "--math-workers", "--config"):
        assert flag in out.stdout


def test_bad_config_exits_2_naming_the_key() -> None:
    out = cli("reward.math.workers=0")
    assert out.returncode == 2
    assert "reward.math.workers" in out.stderr
    out = cli("reward.code.sandbox=1")
    assert out.returncode == 2 and "reward.code.sandbox" in out.stderr and "allowed" in out.stderr


def test_refuses_to_run_code_without_bubblewrap(free_port: int) -> None:
    out = cli("--port", str(free_port), "reward.code.bwrap=/nonexistent/bwrap")
    assert out.returncode == 1
    assert "refusing to run code" in out.stderr
    assert "--unsafe-no-sandbox" in out.stderr
    assert "Traceback" not in out.stderr


@pytest.mark.slow
def test_unsafe_no_sandbox_is_loud_and_works(tmp_path: Path) -> None:
    server = start_reward_server(
        tmp_path,
        ["--unsafe-no-sandbox", "reward.code.bwrap=/nonexistent/bwrap", "--math-workers", "1"],
    )
    try:
        assert httpx.get(f"{server.url}/healthz").json()["sandbox"] == "unsafe-no-sandbox"
        assert "WITHOUT bubblewrap" in server.proc.log_tail(100)
        r = httpx.post(f"{server.url}/run_code", json={"code": "print(6*7)", "language": "python"})
        assert r.json()["run_result"]["stdout"] == "42\n"
        server.assert_serving()
    finally:
        server.proc.stop()


@pytest.mark.slow
def test_math_only_server_needs_no_sandbox(tmp_path: Path) -> None:
    server = start_reward_server(
        tmp_path,
        [
            "reward.code.enabled=false",
            "reward.reasoning_gym.enabled=false",
            "reward.code.bwrap=/nonexistent/bwrap",
            "--math-workers",
            "1",
        ],
    )
    try:
        assert httpx.get(f"{server.url}/healthz").json()["kinds"] == ["math"]
        code = {
            "id": 1,
            "kind": "code",
            "response": "print(1)",
            "tests": {"type": "stdio", "cases": [{"stdout": "1"}]},
        }
        r = httpx.post(f"{server.url}/v1/verify", json={"items": [code]})
        assert r.status_code == 422
        assert r.json()["detail"][0]["field"] == "items.0.kind"
        assert "disabled" in r.json()["detail"][0]["msg"]
        r = httpx.post(f"{server.url}/run_code", json={"code": "print(1)", "language": "python"})
        assert r.status_code == 422
        server.assert_serving()
    finally:
        server.proc.stop()
