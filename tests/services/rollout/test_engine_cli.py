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
        "from services.rollout import engine_cli\n"
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
