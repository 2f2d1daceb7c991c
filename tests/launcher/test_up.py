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


def test_up_never_writes_the_redis_password(tmp_path: Path) -> None:
    """A password-protected Redis given by URL: ``up`` names it redacted in its own lines, keeps the
    password out of the run folder, and the children still reach it (the allocator answers)."""
    from dynamo_rl.procs import ServiceProcess, free_port, redis_server_binary

    password = "s3cret-redis-pass-never-logged"
    port = free_port()
    server = ServiceProcess(
        "redis",
        [redis_server_binary(), "--bind", "127.0.0.1", "--port", str(port), "--save", "",
         "--appendonly", "no", "--requirepass", password, "--dir", str(tmp_path)],
        tmp_path / "redis.log",
    ).start()  # fmt: skip
    url = f"redis://:{password}@127.0.0.1:{port}/0"
    try:
        server.wait_ready(lambda: bool(redis.Redis.from_url(url, socket_timeout=1).ping()), 20)
        data = tmp_path / "train.jsonl"
        row = {"prompt": "1+1=", "answer": "2", "data_source": "arith"}
        data.write_text(json.dumps(row) + "\n")
        run_dir = tmp_path / "run"
        # A model without its weights: the data check (tokenizer, context) passes, the engine fails
        # at start-up, after the allocator and the reward service came up against the protected
        # Redis; up stops with an error.
        from learner.tiny_model import build_tiny_model

        model = build_tiny_model(tmp_path / "no-weights", hidden_size=32, num_layers=1)
        for weights in model.glob("*.safetensors"):
            weights.unlink()
        argv = dynamo_rl_argv(
            "up", "--steps", "1", f"run.dir={run_dir}", f"rollout.dataset={data}",
            f"learner.model={model}", "up.eval.prompts=0", "up.health_timeout_s=120",
        )  # fmt: skip
        env = {**os.environ, "REDIS_URL": url}
        result = subprocess.run(argv, capture_output=True, text=True, env=env, timeout=300)
    finally:
        server.stop()
    out = result.stdout + result.stderr
    assert result.returncode == 1, out[-3000:]
    assert f"using Redis at redis://:***@127.0.0.1:{port}/0" in out
    assert "allocator ready at" in out  # the children got the real URL
    assert password not in out
    written = [p for p in run_dir.rglob("*") if p.is_file()]
    assert run_dir / "config.yaml" in written
    for path in written:
        assert password.encode() not in path.read_bytes(), f"password written to {path}"


def test_up_stops_on_an_unrouted_data_source_before_training(tmp_path: Path) -> None:
    """The data check (the worker's own loading) refuses a data source no reward route scores, with
    the worker's message, before any service starts."""
    from learner.tiny_model import build_tiny_model

    model = build_tiny_model(tmp_path / "model", hidden_size=32, num_layers=1)
    data = tmp_path / "train.jsonl"
    data.write_text(json.dumps({"prompt": "1+1=", "answer": "2", "data_source": "mystery"}) + "\n")
    argv = dynamo_rl_argv("up", "--steps", "1", f"run.dir={tmp_path / 'run'}",
                          f"rollout.dataset={data}", f"learner.model={model}")  # fmt: skip
    env = {k: v for k, v in os.environ.items() if k != "REDIS_URL"}
    result = subprocess.run(argv, capture_output=True, text=True, env=env, timeout=300)
    assert result.returncode == 1, result.stdout[-3000:] + result.stderr[-3000:]
    assert "error: data-check failed" in result.stdout
    assert "no reward route for data_source 'mystery' (math)" in result.stdout
    assert "Redis" not in result.stdout and "ready at" not in result.stdout
