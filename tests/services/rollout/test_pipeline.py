"""The one rollout pipeline (``services/rollout/pipeline.py``), shared by the worker and eval.

Its pure parts against stand-ins (a pool that records its requests, a reward client that scores
by text): request sizes and seeds, sampling a prompt, the chunks of episodes whose first prompts
differ, verification in one call, the group for the stream and the allocator's outcome. One test
runs sampling, episodes and verification on the real embedded engine and reward service and
builds a group of what came back.
"""

from __future__ import annotations

import asyncio
import dataclasses
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import pytest

from dynamo_rl.codec import Response, Timing, TrajectoryGroup, decode_group
from dynamo_rl.config import load_config
from dynamo_rl.config.rollout import EnvConfig
from dynamo_rl.contracts.reward import ItemResult
from dynamo_rl.contracts.sampling import SamplingParams as Sampling
from dynamo_rl.envs import EnvContext, Environment, Step, make_env
from services.rollout.build import load_tokenizer, make_engine_factory, sampling_of
from services.rollout.datasets import PromptRecord
from services.rollout.engines import EnginePool, Sample
from services.rollout.episodes import Conversation, Episode, Segment, TurnRecord, episode_responses
from services.rollout.pipeline import (
    Seeds,
    generate_group,
    has_signal,
    outcome,
    play_batch,
    request_seed,
    sample_prompt,
    split_count,
    trajectory_group,
    verify_groups,
)
from services.rollout.reward_client import RewardClient

SAMPLING = Sampling(max_tokens=4, temperature=1.0, seed=3)


def test_split_count_cuts_a_count_into_requests_of_at_most_chunk() -> None:
    assert split_count(0, 3) == []
    assert split_count(7, 3) == [3, 3, 1]
    assert split_count(6, 3) == [3, 3]
    assert split_count(3, 8) == [3]


def test_request_seed_is_per_request_and_zero_is_a_seed() -> None:
    assert request_seed(None, "w", 0, "p", 1) is None  # unseeded stays unseeded
    seed = request_seed(0, "w", 0, "p", 1)
    assert seed is not None and seed == request_seed(0, "w", 0, "p", 1)
    assert 0 <= seed < 2**31 - 1
    others = {request_seed(0, "w", 0, "p", 2), request_seed(1, "w", 0, "p", 1),
              request_seed(0, "w", 1, "p", 1), request_seed(0, "w", 0, "q", 1)}  # fmt: skip
    assert seed not in others and len(others) == 4


def test_seeds_of_a_prompts_chunks_episodes_and_later_turns() -> None:
    seeds = Seeds(5, ("w0", 2, "p"))
    assert seeds.chunk(1) == request_seed(5, "w0", 2, "p", 1)
    assert seeds.episode(3) == request_seed(5, "w0", 2, "p", 3)
    assert seeds.turn(3, 1) == request_seed(5, "w0", 2, "p", 3, 1)
    assert len({seeds.turn(3, 1), seeds.turn(3, 2), seeds.turn(4, 1), seeds.episode(3)}) == 4
    unseeded = Seeds(None, ("w0", 2, "p"))
    assert unseeded.chunk(0) is unseeded.episode(0) is unseeded.turn(0, 1) is None


class StubPool:
    """Answers ``generate`` with ``n`` samples naming the prompt, the request and the sample
    (``[prompt's last id, request, i]``); request ``k`` takes longer the earlier it was made, so
    they finish in reverse. Keeps each request's prompt, n and seed, and the most in flight."""

    def __init__(self) -> None:
        self.requests: list[tuple[list[int], int, int | None]] = []
        self.in_flight = self.most_in_flight = 0

    async def generate(
        self, prompt: Sequence[int], n: int, sampling: Sampling, **_kw: Any
    ) -> list[Sample]:
        k = len(self.requests)
        self.requests.append((list(prompt), n, sampling.seed))
        self.in_flight += 1
        self.most_in_flight = max(self.most_in_flight, self.in_flight)
        try:
            await asyncio.sleep(0.02 * (8 - k))
        finally:
            self.in_flight -= 1
        return [
            Sample([prompt[-1], k, i], [-0.5, -0.25, -0.125], f"{prompt[-1]}/{k}/{i}", "stop")
            for i in range(n)
        ]


def test_sample_prompt_sends_seeded_requests_at_once_and_keeps_their_order() -> None:
    pool = StubPool()
    samples = asyncio.run(
        sample_prompt(
            pool,
            [5, 6, 7],
            7,
            SAMPLING,
            max_per_request=3,
            seed_of=lambda chunk: 100 + chunk,
        )
    )
    assert pool.requests == [([5, 6, 7], 3, 100), ([5, 6, 7], 3, 101), ([5, 6, 7], 1, 102)]
    assert pool.most_in_flight == 3
    # Request order, not the order they finished in (the last request finished first).
    assert [s.token_ids[1:] for s in samples] == [[0, 0], [0, 1], [0, 2], [1, 0], [1, 1], [1, 2],
                                                  [2, 0]]  # fmt: skip


class TwoOpenings(Environment):
    """Episode ``j`` (in the order they are built) opens with prompt "a" when ``j`` is even, "b"
    when odd; done after the first turn."""

    built = 0

    def __init__(self) -> None:
        self.question = "a" if TwoOpenings.built % 2 == 0 else "b"
        TwoOpenings.built += 1

    async def reset(self, row: Mapping[str, Any]) -> list[dict[str, str]]:
        return [{"role": "user", "content": self.question}]

    async def step(self, turn: str) -> Step:
        return Step([], None, True)


@pytest.fixture(scope="module")
def conversation(model: Path) -> Conversation:
    return Conversation(load_tokenizer(str(model)), "auto")


def test_episodes_sharing_a_first_prompt_are_sampled_together_chunks_numbered_across_prompts(
    conversation: Conversation,
) -> None:
    """Five episodes, first prompts a, b, a, b, a, at most two samples a request: prompt a's three
    are requests (chunks) 0 and 1, prompt b's two chunk 2; each episode's first turn is one of
    its own prompt's samples, in episode order."""
    TwoOpenings.built = 0
    pool = StubPool()
    seeds = Seeds(9, ("w0", 0, "p"))
    record = PromptRecord("p", "?", "2", "arith", "math")
    episodes = asyncio.run(
        generate_group(
            pool,
            record,
            ("?", [1, 2]),
            5,
            new_env=lambda _seed: TwoOpenings(),
            conversation=conversation,
            sampling=SAMPLING,
            limits=EnvConfig(max_turns=1),
            max_per_request=2,
            seeds=seeds,
        )
    )
    a = conversation.prompt_ids(conversation.text([{"role": "user", "content": "a"}]))
    b = conversation.prompt_ids(conversation.text([{"role": "user", "content": "b"}]))
    assert a != b
    assert pool.requests == [
        (a, 2, seeds.chunk(0)), (a, 1, seeds.chunk(1)), (b, 2, seeds.chunk(2))
    ]  # fmt: skip
    assert [e.segments[0].prompt_ids for e in episodes] == [a, b, a, b, a]
    # (request, sample within it) of each episode's first turn
    assert [e.segments[0].token_ids[1:] for e in episodes] == [[0, 0], [2, 0], [0, 1], [2, 1],
                                                               [1, 0]]  # fmt: skip


def episode(text: str, *segment_versions: list[int | None]) -> Episode:
    """An episode whose final text is ``text``; one segment per entry of
    ``segment_versions``, one turn of two tokens per version in it (a second segment: a fork)."""
    segments = []
    for versions in segment_versions:
        seg = Segment(prompt_ids=[1, 2, 3])
        for v in versions:
            seg.turns.append(
                TurnRecord(
                    len(seg.token_ids),
                    len(seg.token_ids) + 2,
                    len(seg.token_ids) + 2,
                    weight_version=v,
                    text=text,
                )
            )
            seg.append([7, 8], [-0.5, -0.5], 1, [v, v])
        segments.append(seg)
    return Episode(segments, model_texts=[text])


class ScoringReward:
    """A reward client: "right" is correct (score 1), "close" scores 0.5 but is not correct,
    anything else 0. Keeps every verify call's items."""

    def __init__(self) -> None:
        self.calls: list[list[Any]] = []

    async def verify(self, items: Sequence[Any]) -> list[ItemResult]:
        self.calls.append(list(items))
        score = {"right": 1.0, "close": 0.5}
        return [
            ItemResult(
                id=it.id,
                score=score.get(it.response, 0.0),
                correct=it.response == "right",
                format_ok=True,
                reason="ok" if it.response == "right" else "wrong_answer",
            )
            for it in items
        ]


RECORDS = [PromptRecord(f"p{i}", f"{i}+{i}=", str(2 * i), "arith", "math") for i in range(3)]


def test_verify_groups_scores_all_episodes_in_one_call_verdicts_back_per_prompt() -> None:
    groups = [
        [episode("right", [1]), episode("wrong", [1])],
        [],
        [episode("close", [1]), episode("right", [1], [1]), episode("wrong", [1, 1])],
    ]
    reward = ScoringReward()
    verdicts = asyncio.run(verify_groups(reward, RECORDS, groups, lambda p, j: f"{p}:{j}"))
    (items,) = reward.calls
    assert [it.id for it in items] == ["0:0", "0:1", "2:0", "2:1", "2:2"]
    assert [it.response for it in items] == ["right", "wrong", "close", "right", "wrong"]
    assert [it.ground_truth for it in items] == ["0", "0", "4", "4", "4"]
    assert [it.response_length for it in items] == [2, 2, 2, 4, 4]  # model tokens
    assert [[v.id for v in vs] for vs in verdicts] == [["0:0", "0:1"], [], ["2:0", "2:1", "2:2"]]
    assert [[v.correct for v in vs] for vs in verdicts] == [[True, False], [], [False, True, False]]
    # No episode, no call.
    none = asyncio.run(verify_groups(reward, RECORDS[:1], [[]], lambda p, j: f"{p}:{j}"))
    assert none == [[]]
    assert len(reward.calls) == 1


def test_outcome_counts_episodes_not_their_forks_and_correct_not_scored() -> None:
    """Three episodes, one forked into two samples, one correct and one half-scored: three
    attempts, one success."""
    group = [episode("right", [1], [1]), episode("close", [1]), episode("wrong", [1])]
    verdicts = asyncio.run(
        verify_groups(ScoringReward(), RECORDS[:1], [group], lambda p, j: f"{j}")
    )
    assert outcome(RECORDS[0], verdicts[0]) == ("p0", 3, 1)
    assert outcome(RECORDS[0], []) == ("p0", 0, 0)


def test_trajectory_group_is_as_old_as_its_oldest_turn_and_keeps_prompt_and_sampling() -> None:
    record = PromptRecord("p7", "7+7=", "14", "arith", "math")
    episodes = [episode("a", [7, None]), episode("b", [9], [5])]
    episodes[0].segments[0].prompt_ids = [4, 5, 6]  # the episode's prompt, not the rendering's
    sampling = dataclasses.replace(SAMPLING, seed=0)
    timing = Timing(created_unix=1.0, generate_s=2.0, verify_s=3.0)
    group = trajectory_group(
        record,
        ("rendered", [1, 2]),
        episodes,
        [Response(token_ids=[7, 8], logprobs=[-0.5, -0.5])],
        sampling=sampling,
        engine_version=11,
        timing=timing,
        namespace="ns",
        worker_id="w1",
        allocated_n=2,
        priority=0.5,
        batch_id="b",
    )
    assert group.weight_version == 5  # the oldest any turn reports, not the engine's
    assert list(group.prompt_token_ids) == [4, 5, 6]
    assert (group.prompt_id, group.prompt_text, group.data_source) == ("p7", "rendered", "arith")
    assert group.sampling.HasField("seed") and group.sampling.seed == 0  # 0 is a seed
    assert (group.sampling.max_tokens, group.sampling.temperature) == (4, 1.0)
    assert (group.namespace, group.worker_id, group.allocated_n, group.batch_id) == (
        "ns",
        "w1",
        2,
        "b",
    )
    assert group.priority == 0.5 and group.timing == timing
    assert [list(r.token_ids) for r in group.responses] == [[7, 8]]
    unreported = trajectory_group(
        record,
        ("rendered", [1, 2]),
        [episode("a", [None])],
        [],
        sampling=dataclasses.replace(SAMPLING, seed=None),
        engine_version=11,
        timing=timing,
    )
    assert unreported.weight_version == 11  # no turn reports one: the engine's
    assert not unreported.sampling.HasField("seed")
    empty = trajectory_group(
        record, ("rendered", [1, 2]), [], [], sampling=SAMPLING, engine_version=11, timing=timing
    )
    assert list(empty.prompt_token_ids) == [1, 2] and empty.weight_version == 11


def test_sampling_episodes_verification_and_the_group_on_the_real_engine_and_reward_service(
    engine: str, reward: str, model: Path
) -> None:
    """The pipeline worker and eval share, on the real embedded engine and reward service."""
    cfg = load_config(
        None,
        [
            f"endpoints.engine_urls=[{engine}]",
            f"endpoints.reward_url={reward}",
            "rollout.sampling.max_tokens=8",
        ],
        env={},
    )
    sampling = sampling_of(cfg.rollout.sampling, temperature=1.0, seed=3)
    assert sampling.max_tokens == 8 and sampling.seed == 3 and sampling.temperature == 1.0
    chunks: list[int] = []

    def seed_of(chunk: int) -> int | None:
        chunks.append(chunk)
        return request_seed(3, "p", chunk)

    records = [PromptRecord(f"q{i}", "1+1=", "2", "t", "math") for i in range(2)]
    conv = Conversation(load_tokenizer(str(model)), "auto")

    async def go() -> tuple[list, list, list, list, list]:
        pool = EnginePool([make_engine_factory(cfg)(engine)])
        client = RewardClient(cfg.endpoints.reward_url)
        try:
            first = await sample_prompt(
                pool, [5, 6, 7], 7, sampling, max_per_request=3, seed_of=seed_of
            )
            again = await sample_prompt(
                pool, [5, 6, 7], 7, sampling, max_per_request=3, seed_of=seed_of
            )
            one = await sample_prompt(
                pool,
                [5, 6, 7],
                3,
                sampling,
                max_per_request=8,
                seed_of=lambda _c: request_seed(3, "p", 0),
            )
            # The single-turn episodes of a prompt: its first turns are exactly sample_prompt's.
            groups = [
                await generate_group(
                    pool, r, ("1+1=", [5, 6, 7]), count, conversation=conv, sampling=sampling,
                    new_env=lambda seed: make_env(EnvContext(cfg.rollout.env, None, seed=seed)),
                    limits=cfg.rollout.env, max_per_request=3, seeds=Seeds(3, ("p",)),
                )
                for r, count in zip(records, [2, 5], strict=True)
            ]  # fmt: skip
            verdicts = await verify_groups(client, records, groups, lambda p, j: f"{p}/{j}")
            return first, again, one, groups, verdicts
        finally:
            await pool.aclose()
            await client.aclose()

    first, again, one, groups, verdicts = asyncio.run(go())
    assert len(first) == 7 and sorted(set(chunks)) == [0, 1, 2]  # requests of 3, 3 and 1
    assert [x.token_ids for x in first] == [x.token_ids for x in again]  # seeded
    # Each request has a seed of its own: the second chunk does not repeat the first.
    assert [x.token_ids for x in first[:3]] != [x.token_ids for x in first[3:6]]
    assert [x.token_ids for x in one] == [x.token_ids for x in first[:3]]  # chunk 0's seed
    assert [e.segments[0].token_ids for e in groups[1]] == [x.token_ids for x in first[:5]]
    assert [e.final_text for e in groups[1]] == [x.text for x in first[:5]]  # the engine's text
    assert [len(v) for v in verdicts] == [2, 5]
    assert all(isinstance(v.correct, bool) and v.reason for group in verdicts for v in group)
    # The group the worker would push of prompt q1, through the codec.
    responses = [
        r
        for j, (e, v) in enumerate(zip(groups[1], verdicts[1], strict=True))
        for r in episode_responses(e, j, v, [5, 6, 7], cfg.rollout.env, conv)
    ]
    group = decode_group(
        trajectory_group(
            records[1],
            ("1+1=", [5, 6, 7]),
            groups[1],
            responses,
            sampling=sampling,
            engine_version=0,
            timing=Timing(),
        ).SerializeToString()
    )
    assert isinstance(group, TrajectoryGroup) and list(group.prompt_token_ids) == [5, 6, 7]
    assert [list(r.token_ids) for r in group.responses] == [x.token_ids for x in first[:5]]
    assert [r.correct for r in group.responses] == [v.correct for v in verdicts[1]]
    assert outcome(records[1], verdicts[1]) == ("q1", 5, sum(v.correct for v in verdicts[1]))


class ScriptedGenerate:
    """``generate(p, n, r)`` of :func:`play_batch`: episodes whose texts come from ``script[p]``
    in order (past its end: "wrong"), recording every call (prompt, n, round)."""

    def __init__(self, script: dict[int, list[str]]) -> None:
        self.script = {p: list(texts) for p, texts in script.items()}
        self.calls: list[tuple[int, int, int]] = []

    async def __call__(self, p: int, n: int, r: int) -> list[Episode]:
        self.calls.append((p, n, r))
        await asyncio.sleep(0.001 * (3 - p % 3))  # prompts' rounds interleave
        texts = self.script.get(p, [])
        out = [texts.pop(0) if texts else "wrong" for _ in range(n)]
        return [episode(t, [1]) for t in out]


def test_without_rounds_the_batch_is_generated_at_once_and_verified_in_one_call() -> None:
    gen, reward = ScriptedGenerate({0: ["right", "wrong"]}), ScoringReward()
    played = asyncio.run(play_batch(
        reward, RECORDS, [2, 0, 3], gen, round_size=0, item_prefix="7",
    ))  # fmt: skip
    assert sorted(gen.calls) == [(0, 2, 0), (1, 0, 0), (2, 3, 0)]
    (items,) = reward.calls
    assert [it.id for it in items] == ["7:0:0", "7:0:1", "7:2:0", "7:2:1", "7:2:2"]
    assert [len(e) for e in played.episodes] == [2, 0, 3] and played.rounds == [1, 0, 1]
    assert [[v.correct for v in vs] for vs in played.verdicts] == [
        [True, False], [], [False] * 3
    ]  # fmt: skip


def test_rounds_stop_a_prompt_once_its_group_has_signal_or_its_count_is_reached() -> None:
    """Rounds of 2: prompt 0 has signal after its first round; prompt 1 is never right and runs
    to its count (2, 2, 1); prompt 2 is allocated nothing; prompt 3 is right twice, then wrong in
    its second round, and stops there with 4 of its 8."""
    records = [*RECORDS, PromptRecord("p3", "3+3=", "6", "arith", "math")]
    gen = ScriptedGenerate({0: ["right", "wrong"], 3: ["right", "right", "wrong", "right"]})
    reward = ScoringReward()
    played = asyncio.run(play_batch(
        reward, records, [8, 5, 0, 8], gen, round_size=2, item_prefix="4",
    ))  # fmt: skip
    assert sorted(gen.calls) == [(0, 2, 0), (1, 1, 2), (1, 2, 0), (1, 2, 1), (3, 2, 0), (3, 2, 1)]
    assert played.rounds == [1, 3, 0, 2]
    assert [len(e) for e in played.episodes] == [2, 5, 0, 4]
    assert [[e.final_text for e in g] for g in played.episodes][3] == [
        "right", "right", "wrong", "right"
    ]  # fmt: skip
    assert [[v.correct for v in vs] for vs in played.verdicts][3] == [True, True, False, True]
    assert all(len(vs) == len(g) for vs, g in zip(played.verdicts, played.episodes, strict=True))
    # One verify call per prompt and round, each item id naming prompt, round and response.
    ids = sorted(it.id for call in reward.calls for it in call)
    assert len(reward.calls) == 6 and len(set(ids)) == len(ids) == 11
    assert {"4:0:0:0", "4:0:0:1", "4:1:2:0", "4:3:1:1"} <= set(ids)
    assert played.generate_s >= 0 and played.verify_s >= 0


def test_rounds_stop_when_the_engine_refuses_the_prompt() -> None:
    async def refused(p: int, n: int, r: int) -> list[Episode]:
        return []

    played = asyncio.run(play_batch(
        ScoringReward(), RECORDS[:1], [6], refused, round_size=2, item_prefix="0",
    ))  # fmt: skip
    assert played.rounds == [1] and played.episodes == [[]] and played.verdicts == [[]]


def test_has_signal_needs_a_correct_and_an_incorrect_episode() -> None:
    def v(correct: bool) -> ItemResult:
        return ItemResult(
            id="x", score=float(correct), correct=correct, format_ok=True, reason="ok"
        )

    assert has_signal([v(True), v(False)]) and has_signal([v(False), v(False), v(True)])
    assert not has_signal([]) and not has_signal([v(True)] * 3) and not has_signal([v(False)] * 2)


def test_a_rounds_seeds_are_its_own_and_round_zeros_are_the_prompts() -> None:
    seeds = Seeds(5, ("w0", 2, "p"))
    assert seeds.round(0) is seeds
    assert seeds.round(1).chunk(0) == request_seed(5, "w0", 2, "p", "round1", 0)
    chunks = {seeds.round(r).chunk(c) for r in range(3) for c in range(3)}
    assert len(chunks) == 9


def test_rounds_need_a_single_turn_environment() -> None:
    with pytest.raises(Exception, match=r"rollout\.round_size \(2\) needs rollout\.env\.name "
                       r"single_turn \(got 'guess_number'\)"):  # fmt: skip
        load_config(None, ["rollout.round_size=2", "rollout.env.name=guess_number"], env={})
    assert load_config(None, ["rollout.round_size=2"], env={}).rollout.round_size == 2
