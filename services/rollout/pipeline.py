"""The one rollout pipeline, shared by the rollout worker and ``dynamo-rl eval``.

Every rollout is an episode of ``rollout.env`` (``single_turn`` is an environment like the
others: one turn, see :mod:`dynamo_rl.envs.base`). For one prompt:

1. :func:`generate_group` builds ``count`` environments, opens their episodes, and samples the
   first turns of episodes that share a first prompt together, as requests of at most
   ``max_per_request`` samples that run concurrently over the pool, request ``i`` with its own
   seed (:class:`Seeds`: the same seed for every request would give every chunk the same
   samples); each episode then goes on alone, one request per turn
   (:func:`~services.rollout.episodes.play_episode`), all concurrently;
2. :func:`verify_groups` scores every episode of a batch in one ``/v1/verify`` call, the final
   turn's text with its model tokens, and hands the verdicts back per prompt, matched by id
   (:func:`play_batch` runs steps 1 and 2 for a batch, at once or in rounds);
3. :func:`trajectory_group` builds the prompt's group for the stream from the episodes'
   responses (:func:`~services.rollout.episodes.episode_responses`), and :func:`outcome` what
   the allocator is told: episodes attempted and episodes correct (:func:`batch_groups`: both
   for every prompt of a worker's batch).

The worker adds allocation, leases, the stream and its metrics; eval adds accuracy.

**Rounds** (``rollout.round_size`` = k > 0; Reinforce-Ada's sampling): :func:`play_batch` then
plays each prompt's episodes k at a time, verifies each round as it ends (one verify call per
prompt and round), and stops the prompt as soon as its group has both a correct and an incorrect
episode (:func:`has_signal`: the allocator's success, so a group stopped early always has a
non-zero advantage) or its count is reached. The count stays the cap: the prompt's allocation
(``allocator.n_per_prompt`` under uniform allocation), so a prompt the policy splits costs about
k episodes and one it always or never solves its whole count. Prompts run their rounds
independently and concurrently; round r > 0 samples with seeds of its own (:class:`Seeds` with
the round in its parts). Single-turn only: the config refuses rounds with a multi-turn
environment (``rollout.env``), whose episodes were not built or tested to be played in rounds.
"""

from __future__ import annotations

import asyncio
import dataclasses
import time
import zlib
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass, field

from dynamo_rl.codec import Response, Timing, TrajectoryGroup, sampling_record
from dynamo_rl.config.rollout import EnvConfig
from dynamo_rl.contracts.reward import ItemResult
from dynamo_rl.contracts.sampling import SamplingParams
from dynamo_rl.envs import Environment
from services.rollout.datasets import PromptRecord, reward_item
from services.rollout.engines import EnginePool, Sample
from services.rollout.episodes import (
    Conversation,
    Episode,
    Opening,
    episode_responses,
    open_episode,
    play_episode,
    record_row,
    turn_sampling,
)
from services.rollout.reward_client import RewardClient

__all__ = [
    "BatchGroups",
    "Played",
    "Seeds",
    "batch_groups",
    "generate_group",
    "has_signal",
    "outcome",
    "play_batch",
    "request_seed",
    "sample_prompt",
    "split_count",
    "trajectory_group",
    "verify_groups",
]


def split_count(count: int, chunk: int) -> list[int]:
    """``count`` as request sizes of at most ``chunk`` (``[]`` for 0)."""
    return [min(chunk, count - i) for i in range(0, count, chunk)]


def request_seed(base: int | None, *parts: object) -> int | None:
    """A per-request seed: the same base seed must not give every chunk the same samples."""
    if base is None:
        return None
    return (base * 1_000_003 + zlib.crc32(":".join(map(str, parts)).encode())) % (2**31 - 1)


@dataclass(frozen=True)
class Seeds:
    """The seeds of one prompt's episodes: :func:`request_seed` of ``base`` and ``parts`` (the
    worker: its id, the batch index and the prompt id; eval: ``"eval"`` and the prompt id)."""

    base: int | None
    parts: tuple[object, ...]

    def chunk(self, i: int) -> int | None:
        """First-turn request ``i`` of the prompt."""
        return request_seed(self.base, *self.parts, i)

    def episode(self, j: int) -> int | None:
        """Episode ``j``'s environment."""
        return request_seed(self.base, *self.parts, j)

    def turn(self, j: int, turn: int) -> int | None:
        """Episode ``j``'s turn ``turn`` after the first."""
        return request_seed(self.base, *self.parts, j, turn)

    def round(self, r: int) -> Seeds:
        """The seeds of round ``r`` of a prompt sampled in rounds (round 0's are these)."""
        return Seeds(self.base, (*self.parts, f"round{r}")) if r else self


async def sample_prompt(
    pool: EnginePool,
    tokens: list[int],
    count: int,
    sampling: SamplingParams,
    *,
    max_per_request: int,
    seed_of: Callable[[int], int | None],
) -> list[Sample]:
    """``count`` samples of one prompt: requests of at most ``max_per_request`` samples, request
    ``i`` seeded with ``seed_of(i)``, all in flight at once; the samples in request order."""
    sizes = split_count(count, max_per_request)
    parts = await asyncio.gather(
        *(
            pool.generate(tokens, size, dataclasses.replace(sampling, seed=seed_of(chunk)))
            for chunk, size in enumerate(sizes)
        )
    )
    return [s for part in parts for s in part]


async def _first_turns(
    pool: EnginePool,
    openings: Sequence[Opening],
    sampling: SamplingParams,
    limits: EnvConfig,
    max_per_request: int,
    seeds: Seeds,
) -> list[Sample | None]:
    """The first turn of each opened episode: episodes with the same first prompt sampled
    together (:func:`sample_prompt`), chunks numbered across prompts; None where the budget
    leaves no room (the episode ends at once)."""
    by_prompt: dict[tuple[int, ...], list[int]] = {}
    for j, o in enumerate(openings):
        by_prompt.setdefault(tuple(o.prompt_ids), []).append(j)
    jobs, offset = [], 0
    for ids, members in by_prompt.items():
        s = turn_sampling(sampling, limits, len(ids), None)
        if s is None:
            continue
        first_chunk = offset
        jobs.append((members, sample_prompt(
            pool, list(ids), len(members), s, max_per_request=max_per_request,
            seed_of=lambda c, first_chunk=first_chunk: seeds.chunk(first_chunk + c),
        )))  # fmt: skip
        offset += len(split_count(len(members), max_per_request))
    firsts: list[Sample | None] = [None] * len(openings)
    sampled = await asyncio.gather(*(job for _, job in jobs))
    for (members, _), samples in zip(jobs, sampled, strict=True):
        for j, sample in zip(members, samples, strict=True):
            firsts[j] = sample
    return firsts


async def generate_group(
    pool: EnginePool,
    record: PromptRecord,
    rendered: tuple[str, list[int]],
    count: int,
    *,
    new_env: Callable[[int | None], Environment],
    conversation: Conversation,
    sampling: SamplingParams,
    limits: EnvConfig,
    max_per_request: int,
    seeds: Seeds,
) -> list[Episode]:
    """``count`` episodes of one prompt (step 1 of the module docstring), dropped ones included
    (``Episode.dropped``); ``new_env(seed)`` builds an environment, ``rendered`` is the prompt as
    the dataset rendered it. Raises :class:`~services.rollout.engines.EngineRequestError` when an
    engine refuses the prompt."""
    envs = [new_env(seeds.episode(j)) for j in range(count)]
    try:
        row = record_row(record)
        openings = await asyncio.gather(
            *(open_episode(env, row, conversation, rendered) for env in envs)
        )
        firsts = await _first_turns(pool, openings, sampling, limits, max_per_request, seeds)
        return list(await asyncio.gather(*(
            play_episode(pool, env, o, conversation, sampling, limits, first=first,
                         seed_of=lambda turn, j=j: seeds.turn(j, turn))
            for j, (env, o, first) in enumerate(zip(envs, openings, firsts, strict=True))
        )))  # fmt: skip
    finally:
        for env in envs:
            await env.aclose()


async def verify_groups(
    reward: RewardClient,
    records: Sequence[PromptRecord],
    groups: Sequence[Sequence[Episode]],
    item_id: Callable[[int, int], str],
) -> list[list[ItemResult]]:
    """Score episode ``j`` of prompt ``p`` (id ``item_id(p, j)``: its final text, its model
    tokens sent for length terms) in one verify call; the verdicts per prompt, in order."""
    items = [
        reward_item(r, item_id(p, j), e.final_text, e.model_tokens)
        for p, (r, group) in enumerate(zip(records, groups, strict=True))
        for j, e in enumerate(group)
    ]
    results = await reward.verify(items) if items else []
    by_id = {str(it.id): res for it, res in zip(items, results, strict=True)}
    return [[by_id[item_id(p, j)] for j in range(len(group))] for p, group in enumerate(groups)]


def has_signal(verdicts: Sequence[ItemResult]) -> bool:
    """Whether a group has both a correct and an incorrect episode (a non-zero advantage)."""
    right = sum(v.correct for v in verdicts)
    return 0 < right < len(verdicts)


@dataclass(frozen=True)
class Played:
    """A batch's episodes and their verdicts per prompt, in order, and where its time went."""

    episodes: list[list[Episode]]
    verdicts: list[list[ItemResult]]
    generate_s: float
    """Wall time generating (in rounds: the batch's wall time less ``verify_s``)."""
    verify_s: float
    """Wall time verifying (in rounds: the most any prompt spent waiting for its verdicts)."""
    rounds: list[int]
    """Rounds each prompt ran (0 or 1 without rounds)."""


async def play_batch(
    reward: RewardClient,
    records: Sequence[PromptRecord],
    counts: Sequence[int],
    generate: Callable[[int, int, int], Awaitable[list[Episode]]],
    *,
    round_size: int,
    item_prefix: str,
) -> Played:
    """Steps 1 and 2 for a batch: ``generate(p, n, r)`` plays n episodes of prompt ``p`` in
    round ``r`` (none: the engine refused it). Without rounds (``round_size`` 0) every prompt's
    count at once, then one verify call for the batch (items ``{item_prefix}:{p}:{j}``); with
    rounds as the module docstring says (items ``{item_prefix}:{p}:{r}:{j}``)."""
    t0 = time.monotonic()
    if round_size <= 0:
        episodes = list(await asyncio.gather(*(generate(p, c, 0) for p, c in enumerate(counts))))
        t1 = time.monotonic()
        verdicts = await verify_groups(
            reward, records, episodes, lambda p, j: f"{item_prefix}:{p}:{j}"
        )
        rounds = [int(c > 0) for c in counts]
        return Played(episodes, verdicts, t1 - t0, time.monotonic() - t1, rounds)
    waited = [0.0] * len(counts)

    async def rounds_of(p: int) -> tuple[list[Episode], list[ItemResult], int]:
        episodes: list[Episode] = []
        verdicts: list[ItemResult] = []
        asked = r = 0
        while asked < counts[p]:
            n = min(round_size, counts[p] - asked)
            played = await generate(p, n, r)
            asked += n
            t = time.monotonic()
            (got,) = await verify_groups(
                reward, [records[p]], [played], lambda _i, j, r=r: f"{item_prefix}:{p}:{r}:{j}"
            )
            waited[p] += time.monotonic() - t
            episodes += played
            verdicts += got
            r += 1
            if not played or has_signal(verdicts):
                break
        return episodes, verdicts, r

    done = await asyncio.gather(*(rounds_of(p) for p in range(len(counts))))
    verify_s = max(waited, default=0.0)
    return Played(
        [d[0] for d in done],
        [d[1] for d in done],
        time.monotonic() - t0 - verify_s,
        verify_s,
        [d[2] for d in done],
    )


def trajectory_group(
    record: PromptRecord,
    prompt: tuple[str, list[int]],
    episodes: Sequence[Episode],
    responses: list[Response],
    *,
    sampling: SamplingParams,
    engine_version: int,
    timing: Timing,
    **fields: object,
) -> TrajectoryGroup:
    """One prompt's group for the stream: its prompt (the first episode's first prompt ids, the
    dataset's rendered text), the responses, and the oldest weight version its turns report (the
    engine's when none does), so staleness is never understated. ``fields``: the group's other
    fields (namespace, worker_id, allocated_n, priority, batch_id)."""
    text, ids = prompt
    reported = [t.weight_version for e in episodes for t in e.turns if t.weight_version is not None]
    return TrajectoryGroup(
        prompt_id=record.prompt_id,
        prompt_token_ids=episodes[0].segments[0].prompt_ids if episodes else ids,
        responses=responses,
        weight_version=min(reported) if reported else engine_version,
        sampling=sampling_record(sampling),
        data_source=record.data_source,
        prompt_text=text,
        timing=timing,
        **fields,
    )


def outcome(record: PromptRecord, verdicts: Sequence[ItemResult]) -> tuple[str, int, int]:
    """What the allocator is told of a prompt: ``(prompt_id, attempts, successes)``, counting
    episodes (forks add training samples, not attempts)."""
    return record.prompt_id, len(verdicts), sum(v.correct for v in verdicts)


@dataclass
class BatchGroups:
    """A worker batch's groups for the stream, what the allocator is told of each (one outcome
    per group, in order), and the reward of every episode that made a response."""

    groups: list[TrajectoryGroup] = field(default_factory=list)
    outcomes: list[tuple[str, int, int]] = field(default_factory=list)
    rewards: list[float] = field(default_factory=list)


def batch_groups(
    records: Sequence[PromptRecord],
    rendered: Sequence[tuple[str, list[int]]],
    episodes: Sequence[Sequence[Episode]],
    verdicts: Sequence[Sequence[ItemResult]],
    counts: Sequence[int],
    priorities: Sequence[float],
    *,
    limits: EnvConfig,
    conversation: Conversation,
    sampling: SamplingParams,
    engine_version: int,
    timing: Timing,
    **fields: object,
) -> BatchGroups:
    """Each prompt's group (:func:`trajectory_group`, with its ``allocated_n`` and ``priority``;
    ``fields``: the batch's namespace, worker_id, batch_id) and outcome; a prompt whose episodes
    made no response gets neither."""
    out = BatchGroups()
    for r, prompt, group, results, count, priority in zip(
        records, rendered, episodes, verdicts, counts, priorities, strict=True
    ):
        prompt_ids = group[0].segments[0].prompt_ids if group else []
        responses: list[Response] = []
        for j, (e, res) in enumerate(zip(group, results, strict=True)):
            made = episode_responses(e, j, res, prompt_ids, limits, conversation)
            responses += made
            out.rewards += [made[0].reward] if made else []
        if not responses:
            continue
        out.groups.append(trajectory_group(
            r, prompt, group, responses, sampling=sampling, engine_version=engine_version,
            timing=timing, allocated_n=count, priority=priority, **fields,
        ))  # fmt: skip
        out.outcomes.append(outcome(r, results))
    return out
