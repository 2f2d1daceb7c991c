"""The rollout worker with ``rollout.env.name: verifiers``: a real embedded engine, allocator and
Redis; the environments of ``vf_envs/`` written in the library's own API.

What the engine sampled is read from its HTTP answers (verifiers' own client with an ``httpx``
hook, :class:`~tests.services.rollout.test_verifiers_env.Recorded`), and the stream is read back
the way the learner reads it (:class:`TrajectoryReader`, :func:`samples_from_groups`), so the
checks that the trained ids are the sampled ids do not go through the code under test. No reward
service runs: its URL is never reachable, and a verify call would fail the batch.
"""

from __future__ import annotations

import logging
import re
from collections import Counter
from pathlib import Path

import pytest
import redis

from dynamo_rl.clients.allocator import AllocatorClient
from dynamo_rl.config import ExperimentConfig, load_config
from dynamo_rl.contracts.stream import StreamEntry, TrajectoryReader
from learner.batch import Sample, samples_from_groups
from services.rollout.worker import RolloutWorker, build_worker
from tests.services.rollout.helpers import run_worker
from tests.services.rollout.test_verifiers_env import MULTI, SINGLE, Recorded

UNREACHABLE = "http://127.0.0.1:9"
"""The reward service's URL: nothing listens there."""


def config(ns: str, redis_url: str, engine: str, allocator: str, model: Path, *extra: str):
    return load_config(
        None,
        [
            f"endpoints.redis_url={redis_url}",
            f"endpoints.engine_urls=[{engine}]",
            f"endpoints.reward_url={UNREACHABLE}",
            f"endpoints.allocator_addr={allocator}",
            f"rollout.namespace={ns}",
            f"rollout.tokenizer={model}",
            "rollout.worker_id=w0",
            "rollout.poll_interval_s=0.1",
            "rollout.backoff_s=0.1",
            "rollout.backoff_max_s=0.5",
            "rollout.reward_max_wait_s=1",
            "rollout.env.name=verifiers",
            "rollout.sampling.max_tokens=4",
            "rollout.sampling.seed=5",
            *extra,
        ],
        env={},
    )


def recorded_worker(cfg: ExperimentConfig) -> tuple[RolloutWorker, list[Recorded]]:
    """The worker of ``cfg``, its chat clients recording every answer of the engine."""
    worker = build_worker(cfg)
    assert worker.verifiers is not None
    recs: list[Recorded] = []

    def client_of(url: str):
        recs.append(Recorded(url))
        return recs[-1].client

    worker.verifiers.client_of = client_of
    return worker, recs


def read_like_the_learner(redis_url: str, ns: str) -> list[StreamEntry]:
    reader = TrajectoryReader(redis.Redis.from_url(redis_url), ns)
    reader.setup()
    entries = reader.read(100, block_ms=50)
    reader.ack(e.entry_id for e in entries)
    return entries


def check_trained_ids_are_the_sampled_ones(samples: list[Sample], recs: list[Recorded]) -> None:
    """Each model turn of each sample is one of the engine's answers to exactly the tokens before
    it (ids and log-probs), mask 1 on it; every answer is trained exactly once; what lies between
    two turns of a sample is what the engine's next prompt added to them (mask 0, log-prob 0)."""
    answers: dict[tuple[int, ...], list[tuple[list[int], list[float]]]] = {}
    for rec in recs:
        for prompt, ids, lps, _ in rec.turns():
            answers.setdefault(tuple(prompt), []).append((ids, lps))
    sampled = Counter((p, tuple(ids)) for p, got in answers.items() for ids, _ in got)
    trained: Counter[tuple[tuple[int, ...], tuple[int, ...]]] = Counter()
    for s in samples:
        assert s.loss_mask is not None and len(s.loss_mask) == len(s.response)
        whole = list(s.prompt) + s.response
        k, context = 0, tuple(s.prompt)
        while True:
            match = [(ids, lps) for ids, lps in answers.get(context, [])
                     if s.response[k : k + len(ids)] == ids]  # fmt: skip
            assert match, "a model turn the engine did not sample after these tokens"
            ids, lps = match[0]
            assert s.sampling_logprobs[k : k + len(ids)] == pytest.approx(lps)
            assert s.loss_mask[k : k + len(ids)] == [1] * len(ids)
            trained[(context, tuple(ids))] += 1
            k += len(ids)
            if k == len(s.response):
                break
            # The engine's next prompt: the tokens so far, then the environment's (mask 0).
            after = len(s.prompt) + k
            nxt = [p for p in answers if len(p) > after and list(p) == whole[: len(p)]]
            assert nxt, "tokens after a turn that no later prompt of the engine holds"
            context = min(nxt, key=len)
            between = len(context) - after
            assert s.loss_mask[k : k + between] == [0] * between
            assert s.sampling_logprobs[k : k + between] == [0.0] * between
            k += between
    assert trained == sampled


@pytest.mark.slow
def test_single_turn_env_through_the_worker_with_dynamic_allocation(
    redis_url, chat_engine, allocator, chat_model
) -> None:
    ns = "vfw1"
    cfg = config(
        ns, redis_url, chat_engine, allocator, chat_model,
        f"rollout.env.verifiers.module={SINGLE}", "rollout.env.verifiers.args.n=3",
        "rollout.batch_size=3", "rollout.allocation=dynamic", "allocator.allow_token_mean=true",
        "rollout.n=2", "rollout.n_min=1", "rollout.n_max=4",
    )  # fmt: skip
    worker, recs = recorded_worker(cfg)
    assert sorted(r.prompt_id for r in worker.sampler.records) == [
        f"vf_single-{i}" for i in range(3)
    ]
    run_worker(worker, 1)
    entries = read_like_the_learner(redis_url, ns)
    groups = [e.group for e in entries]
    assert sorted(g.prompt_id for g in groups) == ["vf_single-0", "vf_single-1", "vf_single-2"]
    text_of = {tuple(ids): text for rec in recs for _, ids, _, text in rec.turns()}
    for g in groups:
        assert len(g.responses) == g.allocated_n >= 1  # the allocator's count, played whole
        assert g.data_source == "vf_single"
        for r in g.responses:
            # The rubric's reward: the length of the text the engine answered with.
            assert r.reward == float(len(text_of[tuple(r.token_ids)]))
            assert r.correct == (r.reward > 0)
    samples = samples_from_groups(groups, 0)
    check_trained_ids_are_the_sampled_ones(samples, recs)
    assert all(s.loss_mask == [1] * len(s.response) for s in samples)
    # The allocator counted each prompt's episodes and their successes (reward > 0).
    with AllocatorClient(allocator) as client:
        stats = client.get_stats(ns, [g.prompt_id for g in groups])
    for g, st in zip(groups, stats, strict=True):
        assert st.samples == len(g.responses)
        assert st.successes == sum(r.correct for r in g.responses)
    registry = worker.metrics.metrics.registry
    assert registry.get_sample_value("dynamo_rollout_allocator_fallbacks_total") == 0


@pytest.mark.slow
def test_multi_turn_env_through_the_worker_masks_env_turns_and_a_learner_step_trains_it(
    redis_url, chat_engine, allocator, chat_model
) -> None:
    import torch

    from dynamo_rl.config.learner import LearnerConfig
    from learner.model import load_policy
    from learner.step import RLBatch, RLStep, adamw

    ns = "vfw2"
    cfg = config(
        ns, redis_url, chat_engine, allocator, chat_model,
        f"rollout.env.verifiers.module={MULTI}", "rollout.env.verifiers.args.max_turns=3",
        "rollout.batch_size=2", "rollout.n=3", "rollout.sampling.max_tokens=1",
    )  # fmt: skip
    worker, recs = recorded_worker(cfg)
    metrics = worker.metrics.metrics.registry
    run_worker(worker, 1)
    groups = [e.group for e in read_like_the_learner(redis_url, ns)]
    assert sorted(g.prompt_id for g in groups) == ["vf_multi-0", "vf_multi-1"]
    for g in groups:
        assert sorted({r.episode for r in g.responses}) == [0, 1, 2]
        for r in g.responses:
            assert r.reward == 3.0  # the rubric counts the episode's 3 turns
    samples = samples_from_groups(groups, 0)
    check_trained_ids_are_the_sampled_ones(samples, recs)
    assert sum(len(rec.answers) for rec in recs) == 2 * 3 * 3
    forks = metrics.get_sample_value("dynamo_rollout_episode_forks_total")
    assert forks == sum(len(g.responses) for g in groups) - 2 * 3
    # The byte tokenizer reads most sampled bytes back differently (a fork, a new sample); a
    # one-token ASCII turn is read back as sampled, so some samples hold the environment's
    # message between two turns, mask 0 (seed 5: several of the 6 episodes).
    assert any(0 in (s.loss_mask or []) for s in samples)
    # One learner step on those groups: the policy is the engine's model.
    policy = load_policy(str(chat_model)).float()
    lc = LearnerConfig(train_batch_size=2)
    before = [p.detach().clone() for p in policy.parameters()]
    # Rewards are all 3.0: a group-relative advantage is 0; give the step a signal.
    for i, s in enumerate(samples):
        s.reward = float(s.episode == 0 if s.episode is not None else i % 2)
        s.correct = s.reward > 0
    step = RLStep(lc, policy, adamw(policy, lc), pad_id=0)
    record = step(RLBatch(samples, [g.prompt_id for g in groups])).record
    assert record["tokens"] == sum(sum(s.loss_mask or []) for s in samples) == 2 * 3 * 3
    # The learner's log-probs of the trained tokens are the engine's: the same ids, in place.
    assert record["mismatch_kl_token_mean"] < 1e-6
    changed = any(not torch.equal(a, b) for a, b in zip(before, policy.parameters(), strict=True))
    assert changed


@pytest.mark.slow
def test_dropped_episodes_are_counted_by_reason_and_never_pushed(
    redis_url, chat_engine, allocator, chat_model, caplog: pytest.LogCaptureFixture
) -> None:
    """vf_multi's environment raises at its first turn (env_error): every episode is dropped."""
    ns = "vfw3"
    cfg = config(
        ns, redis_url, chat_engine, allocator, chat_model,
        f"rollout.env.verifiers.module={MULTI}", "rollout.env.verifiers.args.fail_at=1",
        "rollout.batch_size=2", "rollout.n=2",
    )  # fmt: skip
    worker = build_worker(cfg)
    metrics = worker.metrics.metrics.registry
    with caplog.at_level(logging.WARNING, logger="services.rollout.verifiers_env"):
        run_worker(worker, 1)
    assert read_like_the_learner(redis_url, ns) == []
    dropped = metrics.get_sample_value(
        "dynamo_rollout_verifiers_episodes_dropped_total", {"reason": "env_error"}
    )
    assert dropped == 4
    logged = [r.getMessage() for r in caplog.records if "dropped" in r.getMessage()]
    assert len(logged) == 4
    assert all("env_error" in m and "environment broke at turn 1" in m for m in logged)
    assert {m.split(" dropped")[0] for m in logged} == {
        "verifiers episode of prompt vf_multi-0",
        "verifiers episode of prompt vf_multi-1",
    }


def test_config_selects_verifiers_and_refuses_what_does_not_go_with_it(tmp_path: Path) -> None:
    from dynamo_rl.config import ConfigError
    from dynamo_rl.envs import check_env_config

    def load(*overrides: str) -> ExperimentConfig:
        return load_config(None, list(overrides), env={})

    module = f"rollout.env.verifiers.module={SINGLE}"
    cfg = load("rollout.env.name=verifiers", module, "rollout.env.verifiers.args.n=3")
    assert cfg.rollout.env.verifiers is not None
    assert cfg.rollout.env.verifiers.args == {"n": 3}
    check_env_config(cfg.rollout.env, verifiers=True)
    with pytest.raises(ValueError, match="played by the rollout worker and eval only"):
        check_env_config(cfg.rollout.env)  # the task generators do not play it
    refused = {
        "rollout.env.verifiers": ["rollout.env.name=verifiers"],
        "name 'single_turn'": [module],
        "rollout.dataset": ["rollout.env.name=verifiers", module, f"rollout.dataset={tmp_path}/d"],
        "rollout.prompt_len_policy": [
            "rollout.env.name=verifiers",
            module,
            "rollout.prompt_len_policy=truncate_left",
        ],
        "rollout.round_size": ["rollout.env.name=verifiers", module, "rollout.round_size=2"],
    }
    for expected, overrides in refused.items():
        with pytest.raises(ConfigError, match=re.escape(expected)):
            load(*overrides)


def test_a_module_that_does_not_load_names_the_setting(tmp_path: Path) -> None:
    cfg = load_config(
        None,
        [
            "rollout.env.name=verifiers",
            f"rollout.env.verifiers.module={tmp_path}/none.py",
            f"rollout.tokenizer={tmp_path}",
            "endpoints.engine_urls=[http://127.0.0.1:9]",
        ],
        env={},
    )
    with pytest.raises(ValueError, match=r"rollout\.env\.verifiers\.module: no file"):
        build_worker(cfg)
    cfg.rollout.env.verifiers.module = SINGLE  # type: ignore[union-attr]
    cfg.rollout.env.verifiers.args = {"no_such_arg": 1}  # type: ignore[union-attr]
    with pytest.raises(ValueError, match=r"rollout\.env\.verifiers\.args: load_environment"):
        build_worker(cfg)
