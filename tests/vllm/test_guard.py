"""Without .venv-vllm the real-vLLM tests fail with the command that creates it (CI must not pass
by skipping them), unless DYNAMO_RL_SKIP_VLLM=1 asks for a skip. No vLLM needed here."""

from __future__ import annotations

import subprocess
from pathlib import Path

import pytest

from tests.conftest import REPO
from tests.vllm import conftest as vllm_conftest


def test_missing_env_fails_with_the_setup_command(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    monkeypatch.setattr(vllm_conftest, "VLLM_PYTHON", REPO / "no-such-venv" / "bin" / "python")
    monkeypatch.delenv("DYNAMO_RL_SKIP_VLLM", raising=False)
    with pytest.raises(pytest.fail.Exception, match=r"bash scripts/setup\.sh --vllm"):
        vllm_conftest.require_vllm_env()


def test_missing_env_skips_when_asked(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(vllm_conftest, "VLLM_PYTHON", REPO / "no-such-venv" / "bin" / "python")
    monkeypatch.setenv("DYNAMO_RL_SKIP_VLLM", "1")
    with pytest.raises(pytest.skip.Exception, match=r"setup\.sh --vllm"):
        vllm_conftest.require_vllm_env()


def test_present_env_passes(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    python = tmp_path / "python"
    python.touch()
    monkeypatch.setattr(vllm_conftest, "VLLM_PYTHON", python)
    vllm_conftest.require_vllm_env()


def test_setup_refuses_unknown_flags() -> None:
    # Parsed before anything is installed, so this is instant.
    done = subprocess.run(
        ["bash", str(REPO / "scripts" / "setup.sh"), "--dev", "--vlm"],
        capture_output=True,
        text=True,
        timeout=30,
    )
    assert done.returncode == 2
    assert "usage: bash scripts/setup.sh [--dev] [--vllm]" in done.stderr
