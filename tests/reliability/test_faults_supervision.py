"""``dynamo-rl up``'s restart policy on real processes (fast: no model, no training).

A service killed with SIGKILL is restarted with a new pid after its backoff; one that keeps
crashing stops the run with its last log lines; ``up.restart.enabled=false`` stops at the first exit.
"""

from __future__ import annotations

import io
import json
import os
import signal
import sys
import time
from pathlib import Path

import pytest

from dynamo_rl.config import ExperimentConfig
from dynamo_rl.up import Launcher


def _launcher(tmp_path: Path, **restart: object) -> tuple[Launcher, io.StringIO]:
    cfg = ExperimentConfig.model_validate(
        {"run": {"dir": str(tmp_path / "run")}, "up": {"restart": restart}}
    )
    out = io.StringIO()
    launcher = Launcher(cfg, out=out)
    launcher.run_dir.mkdir(parents=True)
    return launcher, out


def _supervise_until(launcher: Launcher, done, timeout: float = 30.0) -> None:
    deadline = time.monotonic() + timeout
    while not done():
        assert time.monotonic() < deadline, "supervision did not get there in time"
        launcher.check_services()
        time.sleep(0.05)


def test_a_killed_service_is_restarted_after_its_backoff(tmp_path: Path) -> None:
    launcher, out = _launcher(tmp_path, backoff_s=0.3, max_restarts=3)
    try:
        launcher.spawn_supervised("sleeper", [sys.executable, "-c", "import time; time.sleep(120)"])
        first = json.loads((launcher.run_dir / "pids.json").read_text())["sleeper"]
        os.kill(first, signal.SIGKILL)
        killed_at = time.monotonic()
        _supervise_until(launcher, lambda: launcher.restart_counts.get("sleeper") == 1)
        assert time.monotonic() - killed_at >= 0.3  # the backoff was honoured
        second = json.loads((launcher.run_dir / "pids.json").read_text())["sleeper"]
        assert second != first and launcher.supervised["sleeper"].proc.alive()
        text = out.getvalue()
        assert "sleeper exited with code -9: restarting in 0.3s" in text
        assert f"restarted sleeper (pid {second}, restart 1)" in text
    finally:
        launcher.stop_all()
    assert not launcher.children


def test_a_crash_loop_stops_the_run_with_the_last_log_lines(tmp_path: Path) -> None:
    launcher, out = _launcher(tmp_path, backoff_s=0.1, max_restarts=2, window_s=60)
    crash = "import sys; print('config file is broken: boom', flush=True); sys.exit(3)"
    try:
        launcher.spawn_supervised("crasher", [sys.executable, "-c", crash])
        with pytest.raises(RuntimeError) as err:
            _supervise_until(launcher, lambda: False)
    finally:
        launcher.stop_all()
    message = str(err.value)
    assert "crasher keeps crashing: exited with code 3 after 2 restarts" in message
    assert "config file is broken: boom" in message  # the log tail
    text = out.getvalue()
    # Exponential backoff: 0.1 s, then 0.2 s.
    first, later = text.split("restart 1)", 1)
    assert "restarting in 0.1s" in first and "restarting in 0.2s" in later
    assert launcher.restart_counts["crasher"] == 2


def test_with_restarts_disabled_the_first_exit_stops_the_run(tmp_path: Path) -> None:
    launcher, _ = _launcher(tmp_path, enabled=False)
    try:
        launcher.spawn_supervised("once", [sys.executable, "-c", "raise SystemExit(5)"])
        with pytest.raises(RuntimeError, match="once exited with code 5"):
            _supervise_until(launcher, lambda: False)
    finally:
        launcher.stop_all()
    assert launcher.restart_counts == {}
