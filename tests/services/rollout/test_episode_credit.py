"""Forked episodes in the learner: group statistics per episode, per-segment credit, staleness.

Episodes are played on a real embedded engine with a chat template that hides earlier assistant
turns, so every turn after the first starts a new segment (a fork); their responses go through
``episode_responses``, ``trajectory_group``, the codec, ``samples_from_groups`` and the learner's
own ``learner.step.plan_batch`` and ``batch_advantages``. The outcome scores are given by hand (what a reward
service would have said), so every expected number is computed on paper in the test.
"""

from __future__ import annotations

import asyncio
import math
from pathlib import Path
from types import SimpleNamespace

import pytest
import torch

from dynamo_rl.codec import Timing, TrajectoryGroup, decode_group, encode_group
from dynamo_rl.config.learner import AlgorithmConfig, PpoLoss
from dynamo_rl.config.rollout import EnvConfig
from dynamo_rl.contracts.generation import uniform_group
from dynamo_rl.contracts.reward import ItemResult
from dynamo_rl.contracts.sampling import SamplingParams as Sampling
from learner.batch import Sample, batch_mask, placed_turn_rewards, samples_from_groups
from learner.step import batch_advantages, plan_batch
from services.rollout.build import load_tokenizer
from services.rollout.datasets import PromptRecord
from services.rollout.engines import make_engine
from services.rollout.episodes import Conversation, Episode, episode_responses, run_episode
from services.rollout.pipeline import trajectory_group
from tests.services.rollout.test_episodes import HIDING, Fixed, RecordingPool

SAMPLING = Sampling(max_tokens=6, temperature=1.0, seed=7)
RECORD = PromptRecord("p0", "1+1=", "2", "arith", "math")


@pytest.fixture(scope="module")
def conversation(model: Path) -> Conversation:
    tok = load_tokenizer(str(model))
    tok.chat_template = HIDING  # every turn after the first forks the episode
    return Conversation(tok, "chat")


def play(engine: str, conv: Conversation, turns: list[int]) -> list[Episode]:
    """One episode per entry of ``turns`` (that many model turns, one segment each); each
    episode's ``sampled`` attribute: the engine's samples of its turns."""

    async def go() -> list[Episode]:
        lim = EnvConfig(max_turns=8, max_episode_tokens=512)
        out = []
        for j, n in enumerate(turns):
            pool = RecordingPool([make_engine(engine)])
            try:
                e = await run_episode(pool, Fixed(turns=n), {"prompt": "1+1="}, conv, SAMPLING,
                                      lim, seed_of=lambda t, j=j: 100 * j + t)  # fmt: skip
            finally:
                await pool.aclose()
            e.sampled = pool.sampled  # type: ignore[attr-defined]
            out.append(e)
        return out

    episodes = asyncio.run(go())
    assert [len(e.segments) for e in episodes] == turns  # each turn after the first forked
    return episodes


def group_of(
    episodes: list[Episode], scores: list[float], conv: Conversation, env: EnvConfig,
    engine_version: int = 0,
) -> TrajectoryGroup:  # fmt: skip
    """The group the worker would push for these episodes scored ``scores``, through the codec."""
    prompt = episodes[0].segments[0].prompt_ids
    responses = []
    for j, (e, score) in enumerate(zip(episodes, scores, strict=True)):
        res = ItemResult(id=str(j), score=score, correct=score > 0, format_ok=True, reason="ok")
        responses += episode_responses(e, j, res, prompt, env, conv)
    group = trajectory_group(RECORD, ("1+1=", prompt), episodes, responses, sampling=SAMPLING,
                             engine_version=engine_version, timing=Timing())  # fmt: skip
    return decode_group(encode_group(group))


def learner_advantages(samples: list[Sample], estimator: str) -> list[torch.Tensor]:
    """Each row's advantages at its trained tokens, as the learner computes them for a step."""
    algo = AlgorithmConfig(policy_loss=PpoLoss(), advantage={"type": estimator})
    lc = SimpleNamespace(algorithm=algo, critic=SimpleNamespace(enabled=False),
                         mini_batch_size=None, train_batch_size=1, micro_batch_size=64)  # fmt: skip
    _, plan = plan_batch(samples, lc, pad_id=0)
    batch_advantages(samples, plan, lc)
    out: dict[int, torch.Tensor] = {}
    for mbs in plan:
        for mb in mbs:
            for j, row in enumerate(mb.rows):
                adv = mb.advantages[j]
                assert not adv[mb.mask[j] == 0].any()  # observation tokens and padding: 0
                out[row] = adv[mb.mask[j] == 1]
    return [out[i] for i in range(len(samples))]


# Episodes scoring [1, 1, 0, 0] whose first episode forked into 3 segments: 6 rows, 4 episodes.
# Over episodes: mean 0.5, unbiased std sqrt(1/3), so GRPO gives ±0.5 / sqrt(1/3) = ±0.866 (over
# rows it would be mean 2/3, std 0.516: +0.645 and -1.29); Dr.GRPO ±0.5; RLOO 1 - 1/3 = 2/3 and
# 0 - 2/3 = -2/3.
PER_EPISODE = {
    "grpo": 0.5 / math.sqrt(1 / 3),
    "drgrpo": 0.5,
    "rloo": 2 / 3,
}


@pytest.mark.parametrize("estimator", sorted(PER_EPISODE))
def test_group_statistics_count_a_forked_episode_once(
    engine: str, conversation: Conversation, estimator: str
) -> None:
    episodes = play(engine, conversation, [3, 1, 1, 1])
    group = group_of(episodes, [1.0, 1.0, 0.0, 0.0], conversation, EnvConfig())
    assert [(r.episode, r.segment) for r in group.responses] == [
        (0, 0), (0, 1), (0, 2), (1, 0), (2, 0), (3, 0)
    ]  # fmt: skip
    samples = samples_from_groups([group], 0)
    advantages = learner_advantages(samples, estimator)
    up = PER_EPISODE[estimator]
    want = [up, up, up, up, -up, -up]  # every segment of episode 0 gets episode 0's advantage
    for adv, a in zip(advantages, want, strict=True):
        assert adv.numel() > 0
        assert adv.tolist() == pytest.approx([a] * adv.numel(), abs=1e-5)


def test_each_segment_is_credited_with_its_own_and_later_turns(
    engine: str, conversation: Conversation
) -> None:
    """Four turns, one per segment; turn k's reward k/10 discounted by 0.5^(3-k): placed 0,
    0.025, 0.1, 0.3. Segment k's reward is the outcome plus the placed rewards of turns k..3,
    and the learner puts nothing of an earlier segment's turns on a later segment's tokens."""
    [episode] = play(engine, conversation, [4])
    env = EnvConfig(turn_rewards=True, turn_reward_discount=0.5)
    group = group_of([episode], [1.0], conversation, env)
    placed = [0.0, 0.025, 0.1, 0.3]
    credit = [1.0 + sum(placed[k:]) for k in range(4)]  # 1.425, 1.425, 1.4, 1.3
    assert [r.reward for r in group.responses] == pytest.approx(credit)
    assert [len(r.turns) for r in group.responses] == [1] * 4
    assert [r.turns[0].reward for r in group.responses] == pytest.approx(placed)
    samples = samples_from_groups([group], 0)
    token_rewards = placed_turn_rewards(samples, batch_mask(samples))
    assert token_rewards is not None
    for k, (s, r) in enumerate(zip(samples, group.responses, strict=True)):
        # One turn per segment: its own reward and the later turns' and outcome on its last
        # model token, nothing anywhere else.
        want = [0.0] * token_rewards.shape[1]
        want[r.turns[0].end - 1] = credit[k]
        assert token_rewards[k].tolist() == pytest.approx(want), f"segment {k}"
        assert s.reward == pytest.approx(credit[k])


def test_dapo_dynamic_sampling_judges_a_group_by_its_episodes(
    engine: str, conversation: Conversation
) -> None:
    """A group is uniform (no learning signal, skipped) when its episodes' returns are equal,
    however the segments of a forked episode were credited."""
    episodes = play(engine, conversation, [3, 1])
    env = EnvConfig(turn_rewards=True)
    alone = group_of(episodes[:1], [1.0], conversation, env)
    assert [r.reward for r in alone.responses] == pytest.approx([1.3, 1.3, 1.2])  # one episode
    assert uniform_group(alone)
    same = 1.0 + sum([0.0, 0.1, 0.2])  # episode 1 (one turn, reward 0) returns what episode 0 does
    assert uniform_group(group_of(episodes, [1.0, same], conversation, env))
    assert not uniform_group(group_of(episodes, [1.0, 0.0], conversation, env))


def test_malformed_calls_cost_the_segments_up_to_them(
    engine: str, conversation: Conversation
) -> None:
    """The malformed-call penalty belongs to its turn: segments after it do not pay it."""
    [episode] = play(engine, conversation, [3])
    episode.segments[1].turns[0].tool_calls[0].malformed = True  # turn 1's call
    env = EnvConfig(malformed_penalty=0.5)
    group = group_of([episode], [1.0], conversation, env)
    assert [r.reward for r in group.responses] == pytest.approx([0.5, 0.5, 1.0])


def test_weight_version_0_counts_when_a_group_mixes_versions_0_and_1(
    engine: str, conversation: Conversation
) -> None:
    """Episode 0's turns were sampled at version 0, the others' at version 1 (a push landed in
    between): the group is as old as its oldest turn, 0, and the learner at version 2 sees every
    row 2 versions stale (a truthiness test on the version would say 1 and 1)."""
    episodes = play(engine, conversation, [2, 1, 1])
    assert {t.weight_version for t in episodes[0].turns} == {0}  # what the engine reported
    for e in episodes[1:]:
        for t in e.turns:
            t.weight_version = 1
    group = group_of(episodes, [1.0, 0.0, 1.0], conversation, EnvConfig(), engine_version=1)
    assert group.weight_version == 0
    assert [s.staleness for s in samples_from_groups([group], 2)] == [2] * 4


def test_each_segment_has_its_own_finish_reason(engine: str, conversation: Conversation) -> None:
    """A segment's finish reason is its last turn's, as the engine reported it."""
    [episode] = play(engine, conversation, [3])
    sampled = episode.sampled  # type: ignore[attr-defined]
    assert [t.finish_reason for t in episode.turns] == [x.finish_reason for x in sampled]
    reasons = ["length", "stop", "length"]
    for t, reason in zip(episode.turns, reasons, strict=True):
        t.finish_reason = reason
    group = group_of([episode], [1.0], conversation, EnvConfig())
    assert [r.finish_reason for r in group.responses] == reasons
    assert [s.truncated for s in samples_from_groups([group], 0)] == [True, False, True]


def test_the_tool_call_cost_reaches_the_learners_reward_but_not_correct(
    engine: str, conversation: Conversation
) -> None:
    """``tool_call_cost`` is charged once per call of a segment's own and later turns, on the
    reward the learner reads from the stream; the outcome's ``correct`` (accuracy, the
    allocator's successes) is untouched."""
    [episode, other] = play(engine, conversation, [3, 1])
    calls = [sum(len(t.tool_calls) for t in seg.turns) for seg in episode.segments]
    assert sum(calls) >= 2
    env = EnvConfig(tool_call_cost=0.1)
    group = group_of([episode, other], [1.0, 0.0], conversation, env)
    expected = [1.0 - 0.1 * sum(calls[k:]) for k in range(3)]
    expected.append(0.0 - 0.1 * len(other.tool_calls))
    assert [r.reward for r in group.responses] == pytest.approx(expected)
    assert [r.correct for r in group.responses] == [True, True, True, False]
    samples = samples_from_groups([group], 0)
    assert [s.reward for s in samples] == pytest.approx(expected)
    free = group_of([episode, other], [1.0, 0.0], conversation, EnvConfig())
    assert [r.reward for r in free.responses] == [1.0, 1.0, 1.0, 0.0]


def test_the_tool_call_cost_is_checked_and_named() -> None:
    from pydantic import ValidationError

    for bad in (-0.1, 1.5, float("nan")):
        with pytest.raises(ValidationError, match="tool_call_cost"):
            EnvConfig(tool_call_cost=bad)
