"""Faults injected into a real ``dynamo-rl up`` run: training goes on, nothing lost or trained twice.

One run (to keep CI's CPU time small) with an external Redis the test can inspect afterwards. In
order, each after training has made progress since the previous fault:

1. ``kill -9`` the learner's rank mid-run → ``up`` restarts it, it resumes from its last checkpoint
   and re-trains the entries of the steps it lost;
2. ``kill -9`` the allocator (kept down, ``up`` frozen, until a worker has fallen back) → workers
   fall back to uniform counts (logged, counted in ``dynamo_rollout_allocator_fallbacks_total``)
   and return to DRA once it is restarted;
3. ``kill -9`` the reward service (kept down, ``up`` frozen, until a worker has retried against
   it; a 30 s outage is the same mechanism, only longer) → workers back off and retry; nothing
   unscored reaches the stream;
4. ``kill -9`` a rollout worker mid-batch → restarted; its batch never lands, the prompts of its
   lease are re-issued, no group is half-written, the allocator's statistics (decay 1) count each
   response in the stream exactly once.

Then: every stream entry the learner's group read is listed by exactly one committed checkpoint
(``consumed`` in ``trainer_state.json``; the step records' ``entry_ids`` agree), nothing is
pending, nothing was dead-lettered, every group is whole and every response was scored.
"""

from __future__ import annotations

import json
import os
import signal
import time
from pathlib import Path

import pytest
import redis

from dynamo_rl import keys
from dynamo_rl.codec import decode_entry
from tests.reliability.helpers import UpRun, frozen, kill_until_the_worker_meets_it, process_tree

STEPS = 24
NS = "faults"


def _children(pid: int) -> list[int]:
    text = Path(f"/proc/{pid}/task/{pid}/children").read_text()
    return [int(p) for p in text.split()]


def _freeze_holding_a_lease(run: UpRun, redis_url: str, timeout: float = 60.0) -> dict:
    """SIGSTOP the worker at a moment it holds a lease; returns the lease (worker still stopped).

    The worker's pid is read afresh on every try: ``pids.json`` is rewritten on every restart."""
    client = redis.Redis.from_url(redis_url)
    deadline = time.monotonic() + timeout
    try:
        while True:
            assert time.monotonic() < deadline, "the worker never held a lease"
            pid = run.pid("rollout0")
            try:
                os.kill(pid, signal.SIGSTOP)
            except ProcessLookupError:  # between a restart and the new pids.json
                time.sleep(0.2)
                continue
            raw = client.get(keys.lease_key(NS, "worker0"))
            if raw is not None:
                return json.loads(raw)
            os.kill(pid, signal.SIGCONT)  # between batches: try again
            time.sleep(0.1)
    finally:
        client.close()


def _last_record_per_step(records: list[dict]) -> dict[int, dict]:
    out: dict[int, dict] = {}
    for r in records:  # a step redone after a restart replaces the lost one
        out[int(r["step"])] = r
    return out


@pytest.mark.slow
def test_up_survives_learner_allocator_reward_and_worker_kills(tmp_path: Path, redis_url: str):
    run = UpRun(
        tmp_path / "run",
        NS,
        STEPS,
        "learner.checkpoint.keep=100",
        "learner.checkpoint.every=2",
        "allocator.decay=1.0",
        "up.restart.backoff_s=1.0",
        "up.restart.max_restarts=3",
        redis_url=redis_url,
    )
    try:
        # 1. The learner, mid-run, after its first checkpoint (step 2) and before the next one.
        run.wait("step 3", lambda: any(r["step"] >= 3 for r in run.records()))
        ranks = _children(run.pid("learner"))
        assert ranks, "torchrun has no rank process"
        for rank in ranks:
            os.kill(rank, signal.SIGKILL)
        run.wait_restart("learner")
        run.wait_steps(2)
        # 2. The allocator. ``up`` is frozen while it is down, so it comes back only once the
        # worker has met the outage (a worker waiting for room could otherwise miss it whole).
        kill_until_the_worker_meets_it(
            run, "allocator", "allocator unavailable", "the worker's uniform fallback"
        )
        # 3. The reward service, down (``up`` frozen) until the worker has retried against it.
        kill_until_the_worker_meets_it(
            run, "reward", "reward service ", "the worker's reward retry"
        )
        # 4. A rollout worker mid-batch: frozen first so its lease can be read, then killed.
        lease = _freeze_holding_a_lease(run, redis_url)
        # The learner held from here until the restarted worker is up: the stream holds at most
        # max_pending_groups (one step), so the remaining steps must train the restarted worker's
        # groups, the lease's re-issued prompts among them (an idle machine could otherwise finish
        # the run on what is already in the stream).
        with frozen(process_tree(run.pid("learner"))):
            done = max((int(r["step"]) for r in run.records()), default=0)
            assert STEPS - done >= 3, f"the run got to step {done} of {STEPS} before the last fault"
            os.kill(run.pid("rollout0"), signal.SIGKILL)
            run.wait_restart("rollout0")
        run.wait("the run to finish", lambda: run.proc.poll() is not None)
    finally:
        run.stop()
    out = run.output()
    assert run.proc.returncode == 0, out[-4000:]
    for name in ("learner", "allocator", "reward", "rollout0"):
        assert f"{name} exited with code" in out and f"restarted {name} (pid" in out
    summary = json.loads((run.run_dir / "summary.json").read_text())
    learner_log = (run.run_dir / "logs" / "learner.log").read_text()
    # (A service restarted more often than killed says why in its log: the learner's is shown.)
    assert summary["restarts"] == {"learner": 1, "allocator": 1, "reward": 1, "rollout0": 1}, (
        "\n".join(ln for ln in out.splitlines() if "exited with code" in ln)
        + "\n"
        + learner_log[-6000:]
    )

    # The learner resumed from its checkpoint rather than starting over.
    assert "resumed from" in learner_log

    # Exactly once, from the learner's own durable record: each committed checkpoint lists the
    # entry ids consumed since the previous one (all kept: learner.checkpoint.keep). A checkpoint
    # the killed learner wrote stays in the lineage; the steps after it were redone.
    committed: list[str] = []
    folders = sorted((run.run_dir / "checkpoints").glob("step_*"))
    for folder in folders:
        if (folder / "COMMITTED").exists():
            committed += json.loads((folder / "trainer_state.json").read_text())["extra"][
                "consumed"
            ]
    assert folders[-1].name == f"step_{STEPS:06d}"
    assert len(committed) == len(set(committed)), "an entry was trained twice"
    # The step records agree: no id in two steps of the final lineage (a step redone after the
    # restart replaces the lost record).
    trained = [eid for r in _last_record_per_step(run.records()).values() for eid in r["entry_ids"]]
    assert len(trained) == len(set(trained)) and set(trained) <= set(committed)
    client = redis.Redis.from_url(redis_url)
    stream, group = keys.trajectory_stream(NS), keys.learner_group(NS)
    info = {g["name"].decode(): g for g in client.xinfo_groups(stream)}[group]
    assert info["pending"] == 0
    last_read = info["last-delivered-id"].decode()
    entries = client.xrange(stream)
    read = {
        eid.decode()
        for eid, _ in entries
        if tuple(map(int, eid.decode().split("-"))) <= tuple(map(int, last_read.split("-")))
    }
    assert set(committed) == read, "an entry the learner read was lost (or one never read trained)"
    assert client.xlen(keys.dead_letter_stream(NS)) == 0

    # Whole groups, every response scored by the reward service.
    responses = 0
    groups = [decode_entry(fields) for _eid, fields in entries]
    # The killed worker's batch never landed; its restart re-issued every prompt of the lease.
    assert not [g for g in groups if g.batch_id == lease["batch_id"]]
    killed_session = lease["batch_id"].split(":")[1]
    sessions = {g.batch_id.split(":")[1] for g in groups} - {killed_session}
    assert len(sessions) == 1  # the restarted worker's
    # Its very first batch is the lease's prompts (a fresh sampler would start the epoch over).
    first_batch = f"worker0:{sessions.pop()}:0"
    first = {g.prompt_id for g in groups if g.batch_id == first_batch}
    assert first == set(lease["prompt_ids"])
    for g in groups:
        assert len(g.responses) == g.allocated_n, "a half-written group"
        for resp in g.responses:
            assert resp.reason, "a response reached the stream without a verdict"
        responses += len(g.responses)
    stats = client.hgetall(keys.stats_key(NS))
    from allocator.stats import VALUE  # the stored layout, declared once

    counted = sum(VALUE.unpack(v)[0] for v in stats.values())
    # The allocator's statistics (decay 1) count each response in the stream once.
    assert counted == responses
    client.close()

    # Allocator down: uniform fallback flagged, then DRA again.
    worker_log = (run.run_dir / "logs" / "rollout0.log").read_text()
    assert "allocator unavailable" in worker_log
    after = worker_log.split("allocator unavailable", 1)[1]
    batches_after = [line for line in after.splitlines() if "groups," in line]
    assert any("[uniform fallback]" in line for line in batches_after)
    assert any("[uniform fallback]" not in line for line in batches_after[1:])
    # Reward down: the worker retried rather than pushing anything unscored.
    assert "reward service " in after and "; retry " in after
