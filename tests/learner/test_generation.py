"""Generation spent per learner step (``dynamo_rl/contracts/generation.py``), on the learner's
side: the shared no-signal rule is the learner's own (DAPO's ``dapo_keep_groups``), and the
stream source (real Redis) hands the step exact kept and dropped figures — the dropped groups the
entries carry, each entry counted once, plus the groups the learner's filters skipped — which the
step record (``RLStep`` on a tiny model), the Prometheus counters and a torchrun learner's step
log (slow) then hold."""

from __future__ import annotations

from pathlib import Path

import pytest
import redis
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from dynamo_rl.codec import Response, TrajectoryGroup, Turn
from dynamo_rl.config.learner import LearnerConfig
from dynamo_rl.contracts.generation import RECORD_FIELDS, uniform_group
from dynamo_rl.contracts.step_allocation import StepAllocation
from dynamo_rl.contracts.stream import TrajectoryReader
from learner.algorithms import dapo_keep_groups
from learner.batch import episode_ids, response_episode
from learner.metrics import LearnerMetrics
from learner.step import RLStep, adamw
from learner.steplog import read_log
from learner.stream_source import StreamSource
from learner.tiny_model import build_tiny_model
from tests.learner.helpers import base_overrides, make_groups, run_learner, write_groups

NS = "gencount"

# Rewards that differ below float32's resolution (equal to the learner), and some that do not.
REWARDS = [0.0, 1.0, 1.0 + 1e-12, 0.5, -1.0]


def segment(reward: float, episode: int, seg: int) -> Response:
    """One segment of a multi-turn episode: 2 model tokens, 1 observation token, 1 model token."""
    return Response(
        token_ids=[11, 12, 13, 14], logprobs=[-1.0] * 4, reward=reward, loss_mask=[1, 1, 0, 1],
        turns=[Turn(start=0, end=2, observation_end=3), Turn(start=3, end=4, observation_end=4)],
        episode=episode, segment=seg, finish_reason="stop",
    )  # fmt: skip


@st.composite
def groups(draw: st.DrawFn) -> TrajectoryGroup:
    """A group of single-turn responses, or of multi-turn episodes some of them forked (later
    segments with rewards of their own)."""
    if draw(st.booleans()):
        rewards = draw(st.lists(st.sampled_from(REWARDS), min_size=1, max_size=5))
        responses = [Response(token_ids=[5], logprobs=[-1.0], reward=r) for r in rewards]
    else:
        responses = []
        for e in range(draw(st.integers(1, 4))):
            for s in range(draw(st.integers(1, 3))):
                responses.append(segment(draw(st.sampled_from(REWARDS)), e, s))
    return TrajectoryGroup(prompt_id="p", prompt_token_ids=[3], responses=responses)


@settings(max_examples=300, deadline=None)
@given(groups())
def test_the_shared_rule_is_the_learners_dapo_test(group: TrajectoryGroup) -> None:
    """``uniform_group`` (torch-free, what the rollout worker drops by) says no signal exactly
    when the learner's DAPO test keeps no row of the group: episodes, forks and float32 alike."""
    rewards = torch.tensor([r.reward for r in group.responses])
    n = len(rewards)
    episodes = episode_ids([0] * n, [response_episode(r) for r in group.responses])
    keep = dapo_keep_groups(rewards, torch.zeros(n, dtype=torch.long), episode_ids=episodes)
    assert uniform_group(group) == (not bool(keep.any()))


def carrying(group: TrajectoryGroup, groups: int, rollouts: int, tokens: int) -> TrajectoryGroup:
    group.dropped_groups, group.dropped_rollouts, group.dropped_tokens = groups, rollouts, tokens
    return group


def test_a_step_counts_what_its_entries_carried_and_what_it_skipped(redis_url: str, policy) -> None:
    fresh = make_groups(4, sizes=[3, 2, 4, 2], seed=3)
    for g in fresh:
        g.weight_version = 5
    stale = make_groups(1, sizes=[5], seed=4)[0]
    stale.prompt_id, stale.weight_version = "stale", 1
    flat = make_groups(1, sizes=[3], seed=5)[0]
    flat.prompt_id, flat.weight_version = "flat", 5
    for r in flat.responses:
        r.reward = 1.0
    # A kept group of two episodes, the first forked into two segments: 2 rollouts, 3 model
    # tokens per segment (the observation token is not generated).
    forked = TrajectoryGroup(
        prompt_id="forked", prompt_token_ids=[3, 4], weight_version=5,
        responses=[segment(1.0, 0, 0), segment(0.5, 0, 1), segment(0.0, 1, 0)],
    )  # fmt: skip
    entries = [
        carrying(fresh[0], 3, 7, 50),  # kept, carries what a worker dropped before
        carrying(stale, 1, 2, 9),  # skipped (stale): its own cost and its carry are dropped
        carrying(flat, 2, 6, 33),  # skipped (all rewards equal), carry and all
        forked,
        fresh[1],  # step 2 from here
        carrying(fresh[2], 4, 12, 70),
    ]
    ids = write_groups(redis_url, NS, entries)
    lc = LearnerConfig(
        train_batch_size=2,
        micro_batch_size=8,
        stream={"max_staleness": 2, "block_ms": 50},
        algorithm={"dapo": {"dynamic_sampling": True}},
    )
    reader = TrajectoryReader(redis.Redis.from_url(redis_url), NS)
    reader.setup()
    source = StreamSource(lc, reader, weight_version=lambda: 5, push=lambda: None,
                          engines_behind=lambda: [])  # fmt: skip
    step = RLStep(lc, policy, adamw(policy, lc), pad_id=0)
    metrics = LearnerMetrics()
    records = []
    for _ in range(2):
        batch = source.next_batch()
        assert batch is not None
        records.append(step(batch).record)
        metrics.record_step(records[-1])

    def tokens(g: TrajectoryGroup) -> int:
        return sum(len(r.token_ids) for r in g.responses)

    first, second = records
    assert first["entry_ids"] == ids[:4] and second["entry_ids"] == ids[4:]
    assert {k: first[k] for k in RECORD_FIELDS} == {
        "gen_groups_kept": 2,
        "gen_rollouts_kept": 3 + 2,  # fresh[0]'s 3 responses, forked's 2 episodes
        "gen_tokens_kept": tokens(fresh[0]) + 3 * 3,
        "gen_groups_dropped": 3 + 1 + 2 + 1 + 1,  # carried, and the two skipped groups
        "gen_rollouts_dropped": 7 + 2 + 6 + 5 + 3,
        "gen_tokens_dropped": 50 + 9 + 33 + tokens(stale) + tokens(flat),
    }
    assert {k: second[k] for k in RECORD_FIELDS} == {
        "gen_groups_kept": 2,
        "gen_rollouts_kept": 2 + 4,
        "gen_tokens_kept": tokens(fresh[1]) + tokens(fresh[2]),
        "gen_groups_dropped": 4,
        "gen_rollouts_dropped": 12,
        "gen_tokens_dropped": 70,
    }
    exposition = metrics.metrics.exposition().decode()
    kept = first["gen_tokens_kept"] + second["gen_tokens_kept"]
    assert f'dynamo_learner_generated_tokens_total{{fate="kept"}} {float(kept)}' in exposition
    assert 'dynamo_learner_generated_groups_total{fate="dropped"} 12.0' in exposition
    assert "dynamo_learner_gen_tokens_dropped 70.0" in exposition  # the last step's gauge


@pytest.mark.slow
def test_the_learners_step_log_holds_the_streams_figures(redis_url: str, tmp_path: Path) -> None:
    """A torchrun learner on a stream whose entries carry dropped groups' cost: each line of
    ``metrics.jsonl`` holds the sums over the entries its step consumed, and the run's add up to
    the stream's."""
    model = build_tiny_model(tmp_path / "m", hidden_size=32, num_layers=1, num_heads=2,
                             num_kv_heads=1)  # fmt: skip
    groups = make_groups(6, sizes=[2, 3, 2, 4, 3, 2], seed=7)
    for i, g in enumerate(groups):
        if i % 2 == 0:
            carrying(g, i + 1, 3 * (i + 1), 40 + i)
    ids = write_groups(redis_url, "genlog", groups)
    by_id = dict(zip(ids, groups, strict=True))
    overrides = base_overrides(model, tmp_path / "run", redis_url, "genlog")
    run_learner(1, [*overrides, "learner.train_batch_size=2", "learner.max_steps=3"],
                tmp_path / "learner.log")  # fmt: skip
    steps = read_log(tmp_path / "run" / "metrics.jsonl")
    assert len(steps) == 3
    for record in steps:
        consumed = [by_id[i] for i in record["entry_ids"]]
        assert {k: record[k] for k in RECORD_FIELDS} == {
            "gen_groups_kept": len(consumed),
            "gen_rollouts_kept": sum(len(g.responses) for g in consumed),
            "gen_tokens_kept": sum(len(r.token_ids) for g in consumed for r in g.responses),
            "gen_groups_dropped": sum(g.dropped_groups for g in consumed),
            "gen_rollouts_dropped": sum(g.dropped_rollouts for g in consumed),
            "gen_tokens_dropped": sum(g.dropped_tokens for g in consumed),
        }
        # The RL trainer tells the source uniform n: every step record holds its allocation too.
        allocation = StepAllocation.from_record(record)
        assert allocation is not None
        assert allocation.above + allocation.at + allocation.below == len(consumed)
    assert sum(r["gen_groups_dropped"] for r in steps) == 1 + 3 + 5
