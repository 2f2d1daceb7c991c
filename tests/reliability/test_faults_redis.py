"""Restart ``dynamo-rl up``'s embedded Redis (AOF) mid-run: state survives, services reconnect.

The Redis that ``up`` embeds is stopped (SIGTERM: a clean stop that flushes the append-only file)
while training runs; ``up`` restarts it on the same port from the same AOF folder. Checked: the
stream, the allocator's statistics and the learner group's pending entries are all there after the
restart, training finishes, and no other service was restarted — each reconnected on its own. After
the run the AOF folder is opened again to check that every entry the learner read was consumed by
exactly one step and nothing is left pending.
"""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import time
from pathlib import Path

import pytest
import redis

from dynamo_rl import keys
from dynamo_rl.procs import start_redis
from tests.conftest import REPO, dynamo_rl_argv

STEPS = 10
NS = "redisfault"


def _records(run_dir: Path) -> list[dict]:
    path = run_dir / "metrics.jsonl"
    if not path.exists():
        return []
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


def _pending_ids(client: redis.Redis, stream: str, group: str) -> set[str]:
    rows = client.xpending_range(stream, group, min="-", max="+", count=10_000)
    return {r["message_id"].decode() for r in rows}


def _id(entry_id: bytes | str) -> tuple[int, int]:
    text = entry_id.decode() if isinstance(entry_id, bytes) else entry_id
    ms, seq = text.split("-")
    return int(ms), int(seq)


def _tree(pid: int) -> list[int]:
    """``pid`` and all its descendants."""
    out = [pid]
    for task in Path(f"/proc/{pid}/task").iterdir():
        for child in (task / "children").read_text().split():
            out += _tree(int(child))
    return out


@pytest.mark.slow
def test_redis_restart_keeps_stream_stats_and_pending_entries(tmp_path: Path) -> None:
    run_dir = tmp_path / "run"
    stdout = tmp_path / "up.out"
    argv = dynamo_rl_argv(
        "up", "--config", str(REPO / "configs" / "quickstart.yaml"), "--steps", str(STEPS),
        f"run.dir={run_dir}", f"run.name={NS}", "up.warm_start.steps=0", "up.eval.prompts=0",
        "up.task_train=200", "up.task_test=20", "up.tiny_model.hidden_size=32",
        "up.tiny_model.num_layers=1", "rollout.batch_size=8", "rollout.n=4", "rollout.n_min=2",
        "rollout.n_max=8", "learner.train_batch_size=8", "learner.checkpoint.every=3",
        "rollout.max_pending_groups=8", "up.restart.backoff_s=2.0",
    )  # fmt: skip
    env = {k: v for k, v in os.environ.items() if k != "REDIS_URL"}  # up embeds its own
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

    stream, group = keys.trajectory_stream(NS), keys.learner_group(NS)
    try:
        wait("step 2", lambda: any(r["step"] >= 2 for r in _records(run_dir)))
        url = re.search(r"embedded Redis at (\S+)", stdout.read_text()).group(1)
        # The learner is frozen (SIGSTOP) across the restart so that it cannot ack or read while
        # the pending entries are compared; it finds its connection gone when it continues.
        learner_group_pid = json.loads((run_dir / "pids.json").read_text())["learner"]
        # torchrun starts its ranks in sessions of their own: stop the whole tree, not the group.
        learner_tree = _tree(learner_group_pid)
        for pid in learner_tree:
            os.kill(pid, signal.SIGSTOP)
        client = redis.Redis.from_url(url)
        before = {
            "stream": client.xlen(stream),
            "stats": client.hlen(keys.stats_key(NS)),
            "pending": _pending_ids(client, stream, group),
            "last_id": _id(client.xrevrange(stream, count=1)[0][0]),
        }
        client.close()
        assert before["stream"] > 0 and before["stats"] > 0 and before["pending"]
        redis_pid = json.loads((run_dir / "pids.json").read_text())["redis"]
        steps_before = len(_records(run_dir))
        os.kill(redis_pid, signal.SIGTERM)
        wait("the Redis restart", lambda: "restarted redis (pid" in stdout.read_text())
        client = redis.Redis.from_url(url)
        after = {
            "stream": client.xlen(stream),
            "stats": client.hlen(keys.stats_key(NS)),
            "pending": _pending_ids(client, stream, group),
        }
        client.close()
        for pid in learner_tree:
            os.kill(pid, signal.SIGCONT)
        # Nothing written before the stop is lost (workers may have added more since).
        assert after["stream"] >= before["stream"] and after["stats"] >= before["stats"]
        # A stopped learner may still have a blocking XREADGROUP open on the server: an entry a
        # worker adds after the snapshot is delivered to it and becomes pending. Every entry that
        # was pending must still be; any new one must be newer than the snapshot.
        assert before["pending"] <= after["pending"]
        assert all(_id(e) > before["last_id"] for e in after["pending"] - before["pending"])
        wait("two more steps", lambda: len(_records(run_dir)) >= steps_before + 2)
        proc.wait(timeout=300)
    finally:
        if proc.poll() is None:
            proc.send_signal(signal.SIGTERM)
            proc.wait(timeout=60)
    text = stdout.read_text()
    assert proc.returncode == 0, text[-4000:]
    summary = json.loads((run_dir / "summary.json").read_text())
    assert summary["restarts"] == {"redis": 1}, "a service needed a restart of its own"

    # Open the AOF again: exactly once, nothing pending.
    lineage = {int(r["step"]): r for r in _records(run_dir)}
    assert sorted(lineage) == list(range(1, STEPS + 1))
    trained = [eid for r in lineage.values() for eid in r["entry_ids"]]
    assert len(trained) == len(set(trained))
    server, url = start_redis(run_dir / "redis", appendonly=True)
    try:
        client = redis.Redis.from_url(url)
        info = {g["name"].decode(): g for g in client.xinfo_groups(stream)}[group]
        assert info["pending"] == 0
        last = _id(info["last-delivered-id"])
        read = {eid.decode() for eid, _ in client.xrange(stream) if _id(eid) <= last}
        assert set(trained) == read
        client.close()
    finally:
        server.stop()
