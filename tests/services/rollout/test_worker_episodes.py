"""The rollout worker with ``rollout.env``: real engine, reward service, allocator and Redis.

A ``guess_number`` batch goes to the stream with its loss masks and turns, the allocator counts
episodes, and the default ``single_turn`` keeps today's trajectories (none of the new fields).
"""

from __future__ import annotations

from pathlib import Path

import pytest

from dynamo_rl.clients.allocator import AllocatorClient
from dynamo_rl.codec import Response, TrajectoryGroup
from dynamo_rl.envs import ENVIRONMENTS, EnvContext, Environment, Step, ToolCallRecord, register_env
from learner.batch import batch_mask, samples_from_groups
from services.rollout.metrics import TOOL_ERROR_KINDS
from services.rollout.worker import RolloutWorker, build_worker
from tests.services.rollout.conftest import write_sums
from tests.services.rollout.helpers import run_worker, stream_groups, worker_config

NS = "eptest"


@pytest.fixture(scope="module")
def dataset(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return write_sums(tmp_path_factory.mktemp("data") / "train.parquet", 3)


def make(redis_url, engine, reward, allocator, dataset, model, *extra: str) -> RolloutWorker:
    cfg = worker_config(
        NS, redis_url, engine, reward, allocator, dataset, f"rollout.tokenizer={model}",
        "rollout.batch_size=3", "rollout.n=2", "rollout.n_min=1", "rollout.n_max=4",
        "rollout.allocation=uniform", "rollout.sampling.max_tokens=4",
        "rollout.sampling.seed=11", *extra,
    )  # fmt: skip
    return build_worker(cfg)


def stream(redis_url: str) -> list[TrajectoryGroup]:
    return stream_groups(redis_url, NS)


def run(worker: RolloutWorker, batches: int) -> None:
    run_worker(worker, batches)


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


class ToolProbe(Environment):
    """Two turns; each makes a call that runs (latency 0.25 s, then 0.5 s) and one that fails;
    the first turn also makes a malformed one. The model's text is not read."""

    def __init__(self, ctx: EnvContext) -> None:
        self.k = 0

    async def reset(self, row: dict) -> list[dict[str, str]]:
        return [{"role": "user", "content": str(row["prompt"])}]

    async def step(self, turn: str) -> Step:
        self.k += 1
        calls = [ToolCallRecord("probe", "{}", "", 0.25 * self.k),
                 ToolCallRecord("probe", "{}", "failed: exit 1", 0.125)]  # fmt: skip
        if self.k == 1:
            calls.append(ToolCallRecord("", "", "malformed: no name", 0.0, malformed=True))
        obs = [{"role": "user", "content": "ok"}]
        return Step(obs, None, self.k == 2, {"tool_calls": calls})


@pytest.mark.slow
def test_tool_metrics_count_calls_errors_latency_and_rates(
    redis_url, engine, reward, allocator, dataset, model
) -> None:
    """6 episodes (3 prompts x 2) of 2 turns and 5 tool calls each: the counters, the latency
    histogram and the per-second rates of the batch (over its generation time)."""
    register_env("tool_probe")(ToolProbe)
    try:
        worker = make(redis_url, engine, reward, allocator, dataset, model,
                      "rollout.env.name=tool_probe")  # fmt: skip
        registry = worker.metrics.metrics.registry
        run(worker, 1)
    finally:
        ENVIRONMENTS.pop("tool_probe", None)
    groups = stream(redis_url)
    assert len(groups) == 3

    def value(name: str, **labels: str) -> float:
        return registry.get_sample_value(f"dynamo_rollout_{name}", labels) or 0.0

    assert value("episodes_total", end="done") == 6
    assert value("episode_turns_count") == 6 and value("episode_turns_sum") == 12
    assert value("tool_calls_total") == 30
    assert value("tool_errors_total", kind="failed") == 12
    assert value("tool_errors_total", kind="malformed") == 6
    assert sum(value("tool_errors_total", kind=k) for k in TOOL_ERROR_KINDS) == 18
    assert value("tool_latency_seconds_count") == 30
    assert value("tool_latency_seconds_sum") == pytest.approx(6 * (0.25 + 0.5 + 2 * 0.125))
    generate_s = groups[0].timing.generate_s
    assert generate_s > 0
    assert value("episodes_per_second") == pytest.approx(6 / generate_s, rel=1e-4)
    assert value("tool_calls_per_second") == pytest.approx(30 / generate_s, rel=1e-4)


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
