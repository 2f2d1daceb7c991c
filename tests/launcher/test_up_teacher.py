"""``dynamo-rl up`` with ``up.teacher``: on-policy distillation end to end with the smallest
settings, real processes, real Redis. Mid-run the teacher's engine is killed and kept down (``up``
frozen) until the rollout worker has retried against it; ``up`` restarts it, training goes on, and
the stream audit finds nothing lost, nothing trained twice, every token scored by the teacher."""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

import pytest
import redis
import yaml

from dynamo_rl import keys
from dynamo_rl.codec import decode_entry
from tests.conftest import dynamo_rl_argv
from tests.launcher.test_up import _processes_mentioning
from tests.reliability.helpers import UpRun, audit_stream, kill_until_the_worker_meets_it

STEPS = 8
NS = "upteacher"


@pytest.mark.slow
def test_up_serves_a_teacher_through_a_kill_and_nothing_is_lost(
    tmp_path: Path, redis_url: str
) -> None:
    teacher = tmp_path / "teacher"  # another tiny model (its own seed), the same tokenizer
    built = subprocess.run(
        dynamo_rl_argv("init-model", "--out", str(teacher), "--hidden-size", "32", "--layers",
                       "1", "--heads", "4", "--kv-heads", "2", "--seed", "7"),
        capture_output=True, text=True, timeout=120, check=False,
    )  # fmt: skip
    assert built.returncode == 0, built.stderr[-2000:]
    run = UpRun(
        tmp_path / "run", NS, STEPS, f"up.teacher.model={teacher}", "learner.checkpoint.keep=100", "learner.checkpoint.every=2",
        "learner.checkpoint.export_every=0", "up.restart.backoff_s=1.0",
        redis_url=redis_url, config="distill",
    )  # fmt: skip
    try:
        run.wait("step 2", lambda: any(r["step"] >= 2 for r in run.records()))
        kill_until_the_worker_meets_it(run, "teacher0", "teacher: ", "the worker's teacher retry")
        run.wait("the run to finish", lambda: run.proc.poll() is not None)
    finally:
        run.stop()
    out = run.output()
    assert run.proc.returncode == 0, out[-4000:]
    assert "teacher0 ready at http://" in out and "restarted teacher0 (pid" in out
    assert f"step {STEPS}/{STEPS}" in out and "kl to teacher" in out
    summary = json.loads((run.run_dir / "summary.json").read_text())
    assert summary["restarts"] == {"teacher0": 1}

    config = yaml.safe_load((run.run_dir / "config.yaml").read_text())
    assert config["rollout"]["teacher"]["tokenizer"] == str(teacher)
    teacher_urls = config["rollout"]["teacher"]["engine_urls"]
    assert len(teacher_urls) == 1 and teacher_urls != config["endpoints"]["engine_urls"]

    client = redis.Redis.from_url(redis_url)
    audit_stream(run.run_dir, client, NS)  # exactly once, nothing pending or dead-lettered
    # Every pushed token carries the teacher's log-prob, and they are not the student's own.
    entries = client.xrange(keys.trajectory_stream(NS))
    differ = 0
    for _, fields in entries:
        for r in decode_entry(fields).responses:
            assert len(r.teacher_logprobs) == len(r.token_ids) > 0
            differ += any(
                abs(t - s) > 1e-3 for t, s in zip(r.teacher_logprobs, r.logprobs, strict=True)
            )
    assert differ > 0
    # The learner pushed every step to the student's engine, never to the teacher's (which is not
    # in the Redis registry the push reads).
    assert int(client.get(keys.weight_version_key(NS))) == STEPS
    client.close()
    joined = "joined weight-update group"
    assert joined in run.log("engine0") and joined not in run.log("teacher0")

    last = {r["step"]: r for r in run.records()}
    assert sorted(last) == list(range(1, STEPS + 1))
    assert all(r["opd_reverse_kl"] > 0 for r in last.values())
    assert _processes_mentioning(str(run.run_dir)) == []
