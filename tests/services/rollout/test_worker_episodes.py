"""The rollout worker with ``rollout.env``: real engine, reward service, allocator and Redis.

A ``guess_number`` batch goes to the stream with its loss masks and turns, the allocator counts
episodes, and the default ``single_turn`` keeps today's trajectories (none of the new fields).
"""

from __future__ import annotations

import asyncio
from collections.abc import Iterator
from pathlib import Path

import pytest
import redis

from allocator.client import AllocatorClient
from dynamo_rl.codec import Response, TrajectoryGroup, decode_entry
from dynamo_rl.config import load_config
from dynamo_rl.keys import trajectory_stream
from dynamo_rl.services import SERVICES
from learner.batch import batch_mask, samples_from_groups
from services.rollout.worker import RolloutWorker, build_worker
from tests.conftest import REPO
from tests.services.rollout.conftest import write_sums

NS = "eptest"


@pytest.fixture(scope="module")
def dataset(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return write_sums(tmp_path_factory.mktemp("data") / "train.parquet", 3)


@pytest.fixture(scope="module")
def allocator(redis_server: str, tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    log = tmp_path_factory.mktemp("allocator") / "allocator.log"
    proc, addr = SERVICES["allocator"].start(log, "--redis-url", redis_server, cwd=REPO)
    try:
        yield addr
    finally:
        proc.stop()


def make(redis_url, engine, reward, allocator, dataset, model, *extra: str) -> RolloutWorker:
    cfg = load_config(
        None,
        [
            f"endpoints.redis_url={redis_url}",
            f"endpoints.engine_urls=[{engine}]",
            f"endpoints.reward_url={reward}",
            f"endpoints.allocator_addr={allocator}",
            f"rollout.dataset={dataset}",
            f"rollout.tokenizer={model}",
            f"rollout.namespace={NS}",
            "rollout.worker_id=w0",
            "rollout.batch_size=3",
            "rollout.n=2",
            "rollout.n_min=1",
            "rollout.n_max=4",
            "rollout.allocation=uniform",
            "rollout.sampling.max_tokens=4",
            "rollout.sampling.seed=11",
            "rollout.poll_interval_s=0.1",
            *extra,
        ],
        env={},
    )
    return build_worker(cfg)


def stream(redis_url: str) -> list[TrajectoryGroup]:
    client = redis.Redis.from_url(redis_url)
    try:
        return [decode_entry(f) for _, f in client.xrange(trajectory_stream(NS))]
    finally:
        client.close()


def run(worker: RolloutWorker, batches: int) -> None:
    async def go() -> None:
        try:
            await worker.run(batches)
        finally:
            await worker.aclose()

    asyncio.run(go())


@pytest.mark.slow
def test_guess_number_batch_reaches_the_stream_masked_and_counted_as_episodes(
    redis_url, engine, reward, allocator, dataset, model
) -> None:
    worker = make(redis_url, engine, reward, allocator, dataset, model,
                  "rollout.env.name=guess_number", "rollout.env.max_turns=3",
                  "rollout.env.guess_low=0", "rollout.env.guess_high=9")  # fmt: skip
    metrics = worker.metrics.metrics.registry
    run(worker, 1)
    groups = stream(redis_url)
    assert len(groups) == 3
    tok = worker.renderer.tokenizer
    for g in groups:
        assert tok.decode(list(g.prompt_token_ids)).startswith("User: Guess my number between 0")
        assert sorted({r.episode for r in g.responses}) == [0, 1]
        for r in g.responses:
            assert len(r.loss_mask) == len(r.token_ids) and r.end_reason in ("done", "max_turns")
            model_tokens = sum(t.end - t.start for t in r.turns)
            assert sum(r.loss_mask) == model_tokens
            for t in r.turns:
                assert list(r.loss_mask[t.start : t.end]) == [1] * (t.end - t.start)
                assert list(r.loss_mask[t.end : t.observation_end]) == [0] * (
                    t.observation_end - t.end
                )
                feedback = tok.decode(list(r.token_ids[t.end : t.observation_end]))
                assert feedback == "" or feedback.startswith("\nUser: ")
    # The learner trains exactly on the model tokens.
    samples = samples_from_groups(groups, 0)
    mask = batch_mask(samples)
    for i, s in enumerate(samples):
        assert mask[i, : len(s.response)].tolist() == [float(m) for m in s.loss_mask]
    # DynaMO's statistics count episodes: 2 per prompt, successes = correct outcomes.
    with AllocatorClient(allocator) as client:
        stats = client.get_stats(NS, [g.prompt_id for g in groups])
    for g, st in zip(groups, stats, strict=True):
        assert st.samples == 2
        assert st.successes == sum(r.correct for r in g.responses if r.segment == 0)
    episodes = sum(
        metrics.get_sample_value("dynamo_rollout_episodes_total", {"end": e}) or 0.0
        for e in ("done", "max_turns", "max_tool_calls", "token_budget")
    )
    assert episodes == 6
    share = metrics.get_sample_value("dynamo_rollout_masked_token_share")
    obs = sum(len(r.loss_mask) - sum(r.loss_mask) for g in groups for r in g.responses)
    model = sum(sum(r.loss_mask) for g in groups for r in g.responses)
    assert share == pytest.approx(obs / (obs + model))


OLD_FIELDS = ("token_ids", "logprobs", "reward", "correct", "format_ok", "reason",
              "finish_reason", "reward_components", "text")  # fmt: skip


@pytest.mark.slow
def test_single_turn_default_keeps_todays_trajectories(
    redis_url, engine, reward, allocator, dataset, model
) -> None:
    """The default path writes responses with none of the episode fields: each encodes to the
    bytes a response of the original fields alone does (what the stream carried before)."""
    worker = make(redis_url, engine, reward, allocator, dataset, model)
    assert worker.cfg.env.name == "single_turn" and worker.sandbox is None
    run(worker, 1)
    groups = stream(redis_url)
    assert len(groups) == 3
    for g in groups:
        for r in g.responses:
            old = Response(**{f: getattr(r, f) for f in OLD_FIELDS if f != "reward_components"})
            old.reward_components.update(r.reward_components)
            assert r.SerializeToString(deterministic=True) == old.SerializeToString(
                deterministic=True
            )
            assert not r.loss_mask and not r.turns and not r.prompt_token_ids
