"""Kill an engine replica of a real ``dynamo-rl up`` run (2 engines): training goes on.

``kill -9`` one engine: the workers' pool benches it and sends every request to the other; ``up``
restarts it on its port and the workers use it again. The learner's push group held the dead
engine: that push fails after ``learner.push.timeout_s`` (15 s here, 300 s by default — training
pauses that long) and the next one forms a new group with the restarted engine.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import time
from pathlib import Path

import pytest

from tests.conftest import REPO, dynamo_rl_argv

STEPS = 10


def _steps(run_dir: Path) -> int:
    path = run_dir / "metrics.jsonl"
    return len(path.read_text().splitlines()) if path.exists() else 0


@pytest.mark.slow
def test_a_killed_engine_replica_is_routed_around_and_restarted(tmp_path: Path, redis_url: str):
    run_dir, stdout = tmp_path / "run", tmp_path / "up.out"
    argv = dynamo_rl_argv(
        "up", "--config", str(REPO / "configs" / "quickstart.yaml"), "--steps", str(STEPS),
        f"run.dir={run_dir}", "run.name=enginefault", "up.warm_start.steps=0", "up.eval.prompts=0",
        "up.task_train=200", "up.task_test=20", "up.tiny_model.hidden_size=32",
        "up.tiny_model.num_layers=1", "up.engines=2", "rollout.batch_size=8", "rollout.n=4",
        "rollout.n_min=2", "rollout.n_max=8", "learner.train_batch_size=8",
        "rollout.max_pending_groups=8", "up.restart.backoff_s=1.0",
        # A push group with a dead member fails after this long (then the disk fallback).
        "learner.push.timeout_s=15",
    )  # fmt: skip
    env = {**os.environ, "REDIS_URL": redis_url}
    with open(stdout, "w") as out:
        proc = subprocess.Popen(argv, stdout=out, stderr=subprocess.STDOUT, env=env)

    def wait(what: str, cond, timeout: float = 240.0) -> None:
        deadline = time.monotonic() + timeout
        while not cond():
            text = stdout.read_text()[-4000:]
            if proc.poll() is not None:
                pytest.fail(f"up exited ({proc.returncode}) waiting for {what}:\n{text}")
            if time.monotonic() > deadline:
                pytest.fail(f"timed out waiting for {what}:\n{text}")
            time.sleep(0.3)

    try:
        wait("step 2", lambda: _steps(run_dir) >= 2)
        pid = json.loads((run_dir / "pids.json").read_text())["engine1"]
        os.kill(pid, signal.SIGKILL)
        steps_at_kill = _steps(run_dir)
        wait("the engine restart", lambda: "restarted engine1 (pid" in stdout.read_text())
        wait("three more steps", lambda: _steps(run_dir) >= steps_at_kill + 3)
        proc.wait(timeout=300)
    finally:
        if proc.poll() is None:
            proc.send_signal(signal.SIGTERM)
            proc.wait(timeout=60)
    text = stdout.read_text()
    assert proc.returncode == 0, text[-4000:]
    assert json.loads((run_dir / "summary.json").read_text())["restarts"] == {"engine1": 1}
    import yaml

    url = yaml.safe_load((run_dir / "config.yaml").read_text())["endpoints"]["engine_urls"][1]
    worker_log = (run_dir / "logs" / "rollout0.log").read_text()
    # The pool benched the killed replica (the other one kept serving: training went on) ...
    assert f"engine {url} failed" in worker_log
    after_failure = worker_log.split(f"engine {url} failed", 1)[1]
    # ... and sent requests to it again once it was back.
    assert f"POST {url}/v1/completions" in after_failure, worker_log[-3000:]
