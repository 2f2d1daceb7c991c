"""``dynamo-rl engine`` refuses bad configs before loading anything (no engine process needed)."""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

import pytest

from tests.conftest import PYTHON, REPO, dynamo_rl_argv


def run(*args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    base = {k: v for k, v in os.environ.items() if k != "DYNAMO_CONTROL_TOKEN"}
    return subprocess.run(
        dynamo_rl_argv("engine", *args),
        capture_output=True,
        text=True,
        cwd=REPO,
        env={**base, **(env or {})},
        timeout=60,
    )


@pytest.fixture
def fake_model(tmp_path: Path) -> Path:
    (tmp_path / "config.json").write_text("{}")
    return tmp_path


def test_help_is_fast_and_torch_free() -> None:
    code = (
        "import sys\n"
        "from services.engine import cli as engine_cli\n"
        "try:\n"
        "    engine_cli.main(['--help'])\n"
        "except SystemExit as e:\n"
        "    assert e.code == 0\n"
        "assert 'torch' not in sys.modules, 'engine --help imported torch'\n"
    )
    out = subprocess.run([PYTHON, "-c", code], capture_output=True, text=True, cwd=REPO)
    assert out.returncode == 0, out.stderr
    assert "--model" in out.stdout and "--port" in out.stdout


def test_refuses_public_bind_without_token(fake_model: Path) -> None:
    out = run("--model", str(fake_model), "--host", "0.0.0.0")
    assert out.returncode == 2
    assert "engine.host" in out.stderr and "control_token" in out.stderr


@pytest.mark.parametrize(
    ("args", "expected"),
    [
        ((), "engine.model"),
        (("--model", "/nonexistent/model"), "engine.model"),
        (("engine.dtype=fp8",), "engine.dtype"),
        (("engine.max_batch_size=0",), "engine.max_batch_size"),
        (("engine.bogus=1",), "engine.bogus"),
    ],
)
def test_bad_config_names_the_key(args: tuple[str, ...], expected: str) -> None:
    out = run(*args)
    assert out.returncode == 2, out.stderr
    assert expected in out.stderr
    assert "Traceback" not in out.stderr


def test_registers_and_unregisters_in_redis(redis_url: str, tmp_path: Path) -> None:
    """A real engine registers at start and removes its entry on SIGTERM (graceful shutdown)."""
    import json

    import redis

    from dynamo_rl.keys import engines_key
    from learner.tiny_model import build_tiny_model
    from tests.services.engine.engine_util import start_engine

    model = build_tiny_model(tmp_path / "m", hidden_size=32, num_layers=1, num_heads=2,
                             num_kv_heads=1)  # fmt: skip
    proc, url = start_engine(
        model, tmp_path, f"endpoints.redis_url={redis_url}", "run.name=cli-test"
    )
    client = redis.Redis.from_url(redis_url)
    try:
        entry = json.loads(client.hget(engines_key("cli-test"), url))
        assert entry["url"] == url and entry["weight_version"] == 0
        # uvicorn re-raises SIGTERM after its graceful shutdown, hence -15 rather than 0.
        assert proc.stop() in (0, -15)
        assert client.hget(engines_key("cli-test"), url) is None
    finally:
        proc.stop()
        client.close()
