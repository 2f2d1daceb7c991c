"""Stream entries are acknowledged only once the checkpoint holding their steps is durable.

A checkpoint save that raises must leave every entry consumed since the previous checkpoint
pending in the consumer group, and the restarted learner must train on exactly those entries
again. The save is made to fail by a regular file where the step's checkpoint folder goes: the
learner's save clears such a leftover with ``rmtree``, which refuses a file.
"""

from __future__ import annotations

import subprocess
from pathlib import Path

import pytest
import redis

from dynamo_rl import keys
from learner.steplog import read_log
from learner.tiny_model import build_tiny_model
from tests.conftest import REPO
from tests.learner.helpers import (
    base_overrides,
    learner_argv,
    learner_env,
    make_groups,
    run_learner,
    write_groups,
)

pytestmark = pytest.mark.slow

NS = "commitorder"


@pytest.fixture(scope="module")
def tiny_model(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return build_tiny_model(tmp_path_factory.mktemp("model") / "m", hidden_size=32, num_layers=2)


def test_a_failed_checkpoint_save_leaves_its_entries_pending_and_they_are_retrained(
    tiny_model: Path, redis_url: str, tmp_path: Path
) -> None:
    run_dir = tmp_path / "run"
    overrides = [
        *base_overrides(tiny_model, run_dir, redis_url, NS),
        "learner.train_batch_size=2",
        "learner.max_steps=2",
        "learner.checkpoint.every=2",
    ]
    ids = write_groups(redis_url, NS, make_groups(4))
    obstacle = run_dir / "checkpoints" / "step_000002"
    obstacle.parent.mkdir(parents=True)
    obstacle.write_text("not a checkpoint folder")

    log = tmp_path / "first.log"
    with open(log, "wb") as out:
        first = subprocess.run(
            learner_argv(1, overrides), stdout=out, stderr=subprocess.STDOUT, env=learner_env(),
            cwd=REPO, timeout=240, check=False,
        )  # fmt: skip
    text = log.read_text()
    assert first.returncode != 0, text[-3000:]
    assert "NotADirectoryError" in text, text[-3000:]  # it failed in the save, not elsewhere
    client = redis.Redis.from_url(redis_url)
    stream, group = keys.trajectory_stream(NS), keys.learner_group(NS)
    try:
        # Both steps trained, the save of step 2 failed: nothing may have been acknowledged.
        pending = client.xpending_range(stream, group, min="-", max="+", count=100)
        assert sorted(p["message_id"].decode() for p in pending) == sorted(ids)

        obstacle.unlink()
        before = len(read_log(run_dir / "metrics.jsonl"))
        run_learner(1, overrides, tmp_path / "second.log")
        records = read_log(run_dir / "metrics.jsonl")[before:]
        assert [r["step"] for r in records] == [1, 2]  # no checkpoint: from the start again
        assert sorted(i for r in records for i in r["entry_ids"]) == sorted(ids)
        assert client.xpending(stream, group)["pending"] == 0  # committed now, so acknowledged
    finally:
        client.close()
