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
import threading
from pathlib import Path

import pytest
import redis

from dynamo_rl import keys
from dynamo_rl.codec import Response, TrajectoryGroup, encode_entry
from dynamo_rl.contracts.stream import TrajectoryReader
from dynamo_rl.procs import free_port, start_redis
from dynamo_rl.redis_client import sync_client
from tests.conftest import wait_for_blocked_read
from tests.reliability.helpers import UpRun, process_tree, send_signal

STEPS = 10
NS = "redisfault"


def _pending_ids(client: redis.Redis, stream: str, group: str) -> set[str]:
    rows = client.xpending_range(stream, group, min="-", max="+", count=10_000)
    return {r["message_id"].decode() for r in rows}


def _id(entry_id: bytes | str) -> tuple[int, int]:
    text = entry_id.decode() if isinstance(entry_id, bytes) else entry_id
    ms, seq = text.split("-")
    return int(ms), int(seq)


def _snapshot(url: str, stream: str, group: str) -> dict:
    client = redis.Redis.from_url(url)
    try:
        return {
            "stream": client.xlen(stream),
            "stats": client.hlen(keys.stats_key(NS)),
            "pending": _pending_ids(client, stream, group),
            "last_id": _id(client.xrevrange(stream, count=1)[0][0]),
        }
    finally:
        client.close()


@pytest.mark.slow
def test_redis_restart_keeps_stream_stats_and_pending_entries(tmp_path: Path) -> None:
    # Without redis_url: up embeds its own Redis, the one this test restarts.
    run = UpRun(
        tmp_path / "run", NS, STEPS, "learner.checkpoint.every=3", "up.restart.backoff_s=2.0"
    )
    run_dir = run.run_dir
    stream, group = keys.trajectory_stream(NS), keys.learner_group(NS)
    frozen: list[int] = []
    try:
        run.wait("step 2", lambda: any(r["step"] >= 2 for r in run.records()))
        url = re.search(r"embedded Redis at (\S+)", run.output()).group(1)
        # The learner is frozen (SIGSTOP) across the restart so that it cannot ack or read while
        # the pending entries are compared; it finds its connection gone when it continues.
        # torchrun starts its ranks in sessions of their own: stop the whole tree, not the group.
        # A checkpoint commit may have acknowledged every pending entry just before the freeze
        # (the next batch comes only after a worker's poll): then continue it, wait until it
        # holds entries again, and freeze again.
        for _attempt in range(20):
            frozen = process_tree(run.pid("learner"))
            send_signal(frozen, signal.SIGSTOP)
            before = _snapshot(url, stream, group)
            if before["pending"]:
                break
            send_signal(frozen, signal.SIGCONT)
            frozen = []
            run.wait(
                "the learner to hold unacknowledged entries",
                lambda: bool(_snapshot(url, stream, group)["pending"]),
            )
        else:
            pytest.fail("every freeze of the learner found no unacknowledged entry (20 tries)")
        assert before["stream"] > 0 and before["stats"] > 0
        steps_before = len(run.records())
        os.kill(run.pid("redis"), signal.SIGTERM)
        run.wait_restart("redis")
        after = _snapshot(url, stream, group)
        send_signal(frozen, signal.SIGCONT)
        frozen = []
        # Nothing written before the stop is lost (workers may have added more since).
        assert after["stream"] >= before["stream"] and after["stats"] >= before["stats"]
        # A stopped learner may still have a blocking XREADGROUP open on the server: an entry a
        # worker adds after the snapshot is delivered to it and becomes pending. Every entry that
        # was pending must still be; any new one must be newer than the snapshot.
        assert before["pending"] <= after["pending"]
        assert all(_id(e) > before["last_id"] for e in after["pending"] - before["pending"])
        run.wait("two more steps", lambda: len(run.records()) >= steps_before + 2)
        run.wait("the run to finish", lambda: run.proc.poll() is not None)
    finally:
        send_signal(frozen, signal.SIGCONT)  # a failure above must not leave the learner stopped
        run.stop()
    text = run.output()
    assert run.proc.returncode == 0, text[-4000:]
    summary = json.loads((run_dir / "summary.json").read_text())
    assert summary["restarts"] == {"redis": 1}, "a service needed a restart of its own"

    # Open the AOF again: exactly once, nothing pending.
    lineage = {int(r["step"]): r for r in run.records()}
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


def test_a_read_reply_lost_to_a_redis_shutdown_is_trained_after_the_restart(tmp_path: Path) -> None:
    """Redis serves the learner's blocked read and shuts down before sending the reply (a push
    and a SHUTDOWN in one pipeline): the entry is pending for the learner's consumer in the AOF,
    the client repeats its read against the restarted server and gets only the later entries.
    The reader takes the lost one back on its next read; every entry is trained exactly once."""
    port = free_port()
    server, url = start_redis(tmp_path / "redis", port=port, appendonly=True)
    client = sync_client(url, block_s=30, retries=100)
    reader = TrajectoryReader(client, "lost")
    reader.setup()
    entry = encode_entry(
        TrajectoryGroup(
            prompt_id="p",
            prompt_token_ids=[5],
            responses=[Response(token_ids=[7], logprobs=[-1.0])],
        )
    )
    first: list = []
    blocked = threading.Thread(target=lambda: first.extend(reader.read(8, block_ms=20_000)))
    try:
        blocked.start()
        admin = redis.Redis.from_url(url)
        wait_for_blocked_read(admin)
        pipe = admin.pipeline(transaction=False)
        for _ in range(8):
            pipe.xadd(reader.stream, entry)
        pipe.execute_command("SHUTDOWN")
        with pytest.raises(redis.ConnectionError):
            pipe.execute()
        server.proc.wait(timeout=30)
        server, _ = start_redis(tmp_path / "redis", port=port, appendonly=True)
        blocked.join(timeout=60)
        assert not blocked.is_alive()
        stream = client.xrange(reader.stream)
        ids = [eid.decode() for eid, _ in stream]
        assert len(ids) == 8
        # The first entry's reply was lost: the repeated read got the other seven.
        lost = sorted(set(ids) - {e.entry_id for e in first})
        assert lost and [e.entry_id for e in first] == [i for i in ids if i not in lost]
        again = reader.read(8, block_ms=100)
        assert [e.entry_id for e in again] == lost
        assert reader.read(8, block_ms=100) == []
        reader.ack(ids)
        assert reader.pending_count() == 0
    finally:
        client.close()
        server.stop()
