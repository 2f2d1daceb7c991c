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
   turn's text with its model tokens, and hands the verdicts back per prompt, matched by id;
3. :func:`trajectory_group` builds the prompt's group for the stream from the episodes'
   responses (:func:`~services.rollout.episodes.episode_responses`), and :func:`outcome` what
   the allocator is told: episodes attempted and episodes correct (:func:`batch_groups`: both
   for every prompt of a worker's batch).

The worker adds allocation, leases, the stream and its metrics; eval adds accuracy.
"""

from __future__ import annotations

import asyncio
import dataclasses
import zlib
from collections.abc import Callable, Sequence
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
    "Seeds",
    "batch_groups",
    "generate_group",
    "outcome",
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
