"""``dynamo-rl up``'s restart policy (:class:`launcher.supervisor.Supervisor`) on real processes
(fast: no model, no training).

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
from launcher.supervisor import Supervisor


def _launcher(tmp_path: Path, **restart: object) -> tuple[Supervisor, io.StringIO]:
    cfg = ExperimentConfig.model_validate(
        {"run": {"dir": str(tmp_path / "run")}, "up": {"restart": restart}}
    )
    out = io.StringIO()
    launcher = Supervisor(Path(cfg.run.run_dir), cfg.up.restart, out=out)
    launcher.run_dir.mkdir(parents=True)
    return launcher, out


def _supervise_until(launcher: Supervisor, done, timeout: float = 30.0) -> None:
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


def test_restart_delays_are_the_projects_backoff() -> None:
    from dynamo_rl.config.up import RestartConfig
    from launcher.supervisor import restart_backoff

    exact = restart_backoff(RestartConfig(backoff_s=0.1, backoff_max_s=0.25))
    assert [exact.delay(i) for i in range(4)] == [0.1, 0.2, 0.25, 0.25]
    # A first delay above the cap is the cap.
    assert restart_backoff(RestartConfig(backoff_s=5, backoff_max_s=2)).delay(0) == 2
    jittered = restart_backoff(RestartConfig(backoff_s=1.0, backoff_max_s=8.0, jitter=0.5))
    delays = [jittered.delay(3) for _ in range(200)]
    assert all(4.0 <= d <= 8.0 for d in delays) and len(set(delays)) > 1
