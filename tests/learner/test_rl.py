"""The RL mode's own parts, in process against a real Redis: the stream source
(``learner/stream_source.py``: filters, skipped groups counted as consumed, acknowledgement only
at commit, the last batch before a wait timeout) and the trainer that joins it to the step
(``learner/rl.py``: the checkpointed state, the gradient statistics written at the weight
version)."""

from __future__ import annotations

from pathlib import Path

import pytest
import redis

from dynamo_rl import keys
from dynamo_rl.codec import Response, TrajectoryGroup
from dynamo_rl.config.learner import LearnerConfig
from dynamo_rl.contracts import gradstats
from dynamo_rl.contracts.stream import TrajectoryReader
from learner.stream_source import StreamSource
from tests.learner.helpers import make_groups, write_groups

NS = "rlsource"


def pending(url: str, ns: str = NS) -> int:
    client = redis.Redis.from_url(url)
    try:
        return client.xpending(keys.trajectory_stream(ns), keys.learner_group(ns))["pending"]
    finally:
        client.close()


def source(url: str, lc: LearnerConfig, version: int = 0) -> StreamSource:
    reader = TrajectoryReader(redis.Redis.from_url(url), NS)
    reader.setup()
    return StreamSource(lc, reader, weight_version=lambda: version, push=lambda: None,
                        engines_behind=lambda: [])  # fmt: skip


def uniform(prompt_id: str) -> TrajectoryGroup:
    """A group whose two responses scored the same: no signal."""
    r = Response(token_ids=[5, 6], logprobs=[-1.0, -1.0], reward=1.0, correct=True)
    return TrajectoryGroup(
        prompt_id=prompt_id, prompt_token_ids=[7, 8], responses=[r, r], weight_version=4
    )


def test_filters_skip_stale_and_signal_free_groups_and_count_them_consumed(redis_url: str) -> None:
    stale = make_groups(1, seed=9)[0]
    stale.prompt_id, stale.weight_version = "stale", 0
    fresh = make_groups(3, seed=1)
    for g in fresh:
        g.weight_version = 4
    ids = write_groups(redis_url, NS, [fresh[0], stale, uniform("flat"), fresh[1], fresh[2]])
    lc = LearnerConfig(
        train_batch_size=3,
        stream={"max_staleness": 2, "block_ms": 50},
        algorithm={"dapo": {"dynamic_sampling": True}},
    )
    src = source(redis_url, lc, version=5)
    batch = src.next_batch()
    assert batch is not None
    assert batch.prompt_ids == [g.prompt_id for g in fresh]
    assert batch.skipped == 2 and batch.entry_ids == ids
    assert {s.group for s in batch.samples} == {0, 1, 2}
    assert all(s.staleness == 1 for s in batch.samples)
    # Nothing is acknowledged until the checkpoint holding the step commits, skipped ones included.
    assert src.uncommitted == ids and pending(redis_url) == len(ids)
    src.commit()
    assert src.uncommitted == [] and pending(redis_url) == 0


def test_a_wait_timeout_trains_the_batch_in_hand_then_stops(redis_url: str) -> None:
    write_groups(redis_url, NS, make_groups(2))
    lc = LearnerConfig(train_batch_size=4, stream={"block_ms": 50, "wait_timeout_s": 0.3})
    src = source(redis_url, lc)
    batch = src.next_batch()
    assert batch is not None and batch.groups == 2
    assert src.next_batch() is None


def test_nothing_read_before_the_timeout_stops_at_once(redis_url: str) -> None:
    lc = LearnerConfig(train_batch_size=4, stream={"block_ms": 50, "wait_timeout_s": 0.2})
    assert source(redis_url, lc).next_batch() is None


@pytest.mark.slow
@pytest.mark.usefixtures("one_rank")
def test_the_trainer_writes_gradient_statistics_and_checkpoints_its_state(
    redis_url: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from dynamo_rl.config import load_config
    from learner.rl import RLTrainer
    from learner.tiny_model import build_tiny_model

    # The one-rank group is up (one_rank); these keep init_distributed off os.environ.
    for name, value in (("RANK", "0"), ("WORLD_SIZE", "1"), ("LOCAL_RANK", "0")):
        monkeypatch.setenv(name, value)
    model = build_tiny_model(tmp_path / "m", hidden_size=32, num_layers=1)
    write_groups(redis_url, NS, make_groups(2, sizes=[3, 4]))
    cfg = load_config(None, [
        f"learner.model={model}", f"run.name={NS}", f"run.dir={tmp_path / 'run'}",
        f"endpoints.redis_url={redis_url}", "learner.push.every=0", "learner.train_batch_size=2",
        "learner.stream.block_ms=50", "allocator.method=grad",
    ])  # fmt: skip
    trainer = RLTrainer(cfg)
    trainer.resume()
    trainer.weight_version = 7
    record = trainer.train_step(trainer.next_batch())
    assert record["grad_stats_prompts"] == 2 and record["time_grad_stats"] > 0
    client = redis.Redis.from_url(redis_url)
    stats = gradstats.read(client, NS, ["p0", "p1", "never"])
    assert stats.version[:2].tolist() == [7.0, 7.0] and (stats.spread[:2] > 0).all()
    state = trainer.extra_state()
    assert len(state["consumed"]) == 2 and state["kl_beta"] == 0.0
    trainer.load_extra_state({"consumed": state["consumed"], "kl_beta": 0.5})
    assert trainer.rl_step.kl_ctl.beta == 0.5 and trainer.committed_ids == state["consumed"]
    client.close()
