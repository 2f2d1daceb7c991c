"""``dynamo-rl up`` end to end with the smallest settings: real processes, real Redis."""

from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path

import pytest
import redis

from dynamo_rl import keys
from tests.conftest import REPO, dynamo_rl_argv

STEPS = 3


def _processes_mentioning(text: str) -> list[str]:
    found = []
    for pid in os.listdir("/proc"):
        if not pid.isdigit():
            continue
        try:
            cmdline = Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode()
            state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
        except (FileNotFoundError, ProcessLookupError, PermissionError):
            continue
        if text in cmdline and state != "Z":
            found.append(f"{pid}: {cmdline}")
    return found


@pytest.mark.slow
def test_up_trains_a_few_steps_and_leaves_nothing_behind(tmp_path: Path, redis_url: str) -> None:
    run_dir = tmp_path / "run"
    argv = dynamo_rl_argv(
        "up", "--config", str(REPO / "configs" / "quickstart.yaml"), "--steps", str(STEPS),
        f"run.dir={run_dir}", "run.name=uptest", "up.warm_start.steps=0", "up.eval.prompts=8",
        "up.eval.samples=2", "up.task_train=200", "up.task_test=50", "up.tiny_model.hidden_size=32",
        "up.tiny_model.num_layers=1", "rollout.batch_size=8", "learner.train_batch_size=8",
    )  # fmt: skip
    env = {**os.environ, "REDIS_URL": redis_url}  # external Redis: its state outlives the run
    result = subprocess.run(argv, capture_output=True, text=True, env=env, timeout=600, check=False)
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    out = result.stdout
    assert f"step {STEPS}/{STEPS}" in out
    assert "held-out accuracy before RL" in out and "held-out accuracy after RL" in out

    client = redis.Redis.from_url(redis_url)
    stream, group = keys.trajectory_stream("uptest"), keys.learner_group("uptest")
    # Every group the learner trained on is acknowledged; at least a step's worth was produced.
    info = {g["name"].decode(): g for g in client.xinfo_groups(stream)}[group]
    assert info["pending"] == 0
    assert client.xlen(stream) >= 8 * STEPS
    # The learner pushed after every step and the engine took each version.
    assert int(client.get(keys.weight_version_key("uptest"))) == STEPS
    after = json.loads((run_dir / "eval_after.json").read_text())
    assert list(after["weight_versions"].values()) == [STEPS]  # the engine served the last push
    # The allocator's statistics filled: one entry per prompt it was told about.
    assert client.hlen(keys.stats_key("uptest")) >= 8
    client.close()

    summary = json.loads((run_dir / "summary.json").read_text())
    assert 0.0 <= summary["accuracy_before"] <= 1.0 and 0.0 <= summary["accuracy_after"] <= 1.0
    for name in ("allocator", "reward", "engine0", "rollout0", "learner"):
        assert (run_dir / "logs" / f"{name}.log").exists()
    assert _processes_mentioning(str(run_dir)) == []


def test_up_refuses_a_bad_config_before_starting_anything(tmp_path: Path) -> None:
    run_dir = tmp_path / "run"
    result = subprocess.run(
        dynamo_rl_argv("up", "--steps", "2", f"run.dir={run_dir}", "up.engines=0"),
        capture_output=True,
        text=True,
        check=False,
    )
    assert result.returncode == 2
    assert "up.engines" in result.stderr
    assert not run_dir.exists()
    missing = subprocess.run(dynamo_rl_argv("up", f"run.dir={run_dir}"), capture_output=True,
                             text=True, check=False)  # fmt: skip
    assert missing.returncode == 2 and "learner.max_steps" in missing.stderr
