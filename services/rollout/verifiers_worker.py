"""verifiers environments in the rollout worker (``rollout.env.name: verifiers``; ``docs/agents.md``).

:func:`load_verifiers` loads ``rollout.env.verifiers`` once, when the worker is built: its
environment, and its dataset's rows as the worker's prompts (:func:`verifiers_records`: prompt id
``<env>-<row index>``, stable across runs, so the allocator's per-prompt statistics carry over;
``rollout.max_prompts``, sharding and the length check apply as to a dataset).

:class:`VerifiersPlayer` then plays each batch in place of the pipeline's generate-and-verify
step (:func:`services.rollout.pipeline.play_batch`): each prompt's count -- the allocator's, as
for every environment -- is played by :func:`~services.rollout.verifiers_env.play_verifiers_group`
on one engine of the pool (prompts spread over the replicas in turn), each episode with its own
seed (:class:`~services.rollout.pipeline.Seeds`); the environment's rubric gives the reward, and
no ``/v1/verify`` call is made. Each kept episode becomes an
:class:`~services.rollout.episodes.Episode` (its segments as they were assembled: the engine's
token ids, mask 1 on model turns, mask 0 between them) with a verdict (score: the rubric's
reward; correct, the allocator's success: reward > 0), so the worker builds, filters, pushes and
reports its groups as for any multi-turn environment. A dropped episode is counted in
``dynamo_rollout_verifiers_episodes_dropped_total{reason}`` and logged with its prompt and reason;
it is not an attempt the allocator is told of.
"""

from __future__ import annotations

import asyncio
import itertools
import time
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any

import httpx

from dynamo_rl.config import ExperimentConfig
from dynamo_rl.contracts.reward import ItemResult
from dynamo_rl.contracts.sampling import SamplingParams
from services.rollout.datasets import PromptRecord
from services.rollout.engines import EnginePool
from services.rollout.episodes import Episode, Segment, TurnRecord
from services.rollout.metrics import WorkerMetrics
from services.rollout.pipeline import Played, Seeds
from services.rollout.verifiers_env import (
    Drops,
    VerifiersConfigError,
    VerifiersEpisode,
    chat_client,
    load_verifiers_env,
    play_verifiers_group,
    sampling_args,
    verifiers_rows,
)

__all__ = [
    "VerifiersPlayer",
    "answer_rows",
    "load_env_of",
    "load_verifiers",
    "source_of",
    "to_episode",
    "verdict",
    "verifiers_prompts",
    "verifiers_records",
]

KIND = "verifiers"
"""The records' reward kind: scored by the environment's rubric, never routed."""


def env_label(module: str) -> str:
    """The environment's name in its prompt ids: a ``.py`` file's stem, else the module name."""
    return Path(module).stem if module.endswith(".py") else module


def verifiers_records(rows: Sequence[Mapping[str, Any]], label: str) -> list[PromptRecord]:
    """The worker's prompts of the environment's rows: id ``<label>-<row index>``, the row's chat
    messages, its ``answer`` as ground truth (the sample log's; the rubric reads the row)."""
    return [
        PromptRecord(
            prompt_id=f"{label}-{i}",
            prompt=[{"role": str(m["role"]), "content": str(m["content"])} for m in row["prompt"]],
            ground_truth=str(row.get("answer", "")),
            data_source=label,
            kind=KIND,
        )
        for i, row in enumerate(rows)
    ]


def to_episode(ep: VerifiersEpisode) -> Episode:
    """A verifiers episode as the pipeline's (multi-turn) episode: the same segments, ids, masks
    and log-probs; the engine reports no weight version through the chat route."""
    segments = []
    for s in ep.segments:
        seg = Segment(list(s.prompt_ids))
        seg.token_ids, seg.logprobs = list(s.token_ids), list(s.logprobs)
        seg.loss_mask, seg.versions = list(s.loss_mask), [None] * len(s.token_ids)
        seg.turns = [TurnRecord(t.start, t.end, t.observation_end) for t in s.turns]
        segments.append(seg)
    segments[-1].turns[-1].finish_reason = ep.finish_reason
    return Episode(segments, [ep.text], end_reason="done", forks=ep.forks)


def verdict(ep: VerifiersEpisode, item: str) -> ItemResult:
    """The episode's rubric reward as a verdict: correct (the allocator's success) is reward > 0."""
    ok = ep.reward > 0
    return ItemResult(id=item, score=ep.reward, correct=ok, format_ok=True,
                      reason="ok" if ok else "wrong_answer", components=ep.metrics)  # fmt: skip


class VerifiersPlayer:
    """Plays a worker's batches of a verifiers environment (see the module docstring)."""

    def __init__(
        self,
        env: Any,
        rows: Mapping[str, Mapping[str, Any]],
        sampling: SamplingParams,
        metrics: WorkerMetrics,
        model: str | None = None,
    ) -> None:
        self.env = env
        self.rows = dict(rows)
        """The environment's row of each prompt id."""
        self.sampling = sampling_args(sampling.max_tokens, sampling.temperature, sampling.top_p)
        self.metrics = metrics
        self.model = model
        """The chat requests' ``model`` (``rollout.model_name``; None: the engine's first id)."""
        self.client_of: Callable[[str], Any] = chat_client
        """The chat client of an engine's base URL (verifiers' own, :func:`chat_client`)."""
        self._clients: dict[str, Any] = {}
        self._turn = itertools.count()

    async def _model(self, url: str) -> str:
        if self.model is None:
            async with httpx.AsyncClient(timeout=10.0) as http:
                reply = await http.get(f"{url.rstrip('/')}/v1/models")
                reply.raise_for_status()
                self.model = str(reply.json()["data"][0]["id"])
        return self.model

    def _client(self, url: str) -> Any:
        if url not in self._clients:
            self._clients[url] = self.client_of(url)
        return self._clients[url]

    async def play_group(
        self, pool: EnginePool, record: PromptRecord, count: int, seeds: Seeds
    ) -> tuple[list[Episode], list[ItemResult]]:
        """``count`` episodes of one prompt on the pool's next engine, and their verdicts; the
        dropped ones counted and left out."""
        if count == 0:
            return [], []
        urls = pool.urls
        url = urls[next(self._turn) % len(urls)]
        drops = Drops(about=f"prompt {record.prompt_id}")
        played = await play_verifiers_group(
            self.env, self.rows[record.prompt_id], self._client(url), await self._model(url),
            self.sampling, count, drops, seed_of=seeds.episode,
        )  # fmt: skip
        for reason, n in drops.counts.items():
            self.metrics.verifiers_dropped.labels(reason).inc(n)
        episodes = [to_episode(e) for e in played]
        return episodes, [verdict(e, f"{record.prompt_id}:{j}") for j, e in enumerate(played)]

    async def play_batch(
        self,
        pool: EnginePool,
        records: Sequence[PromptRecord],
        counts: Sequence[int],
        seed: int | None,
        parts: tuple[object, ...],
    ) -> Played:
        """Every prompt's count at once, scored by the rubric as they end (``verify_s`` 0);
        prompt ``r``'s episode seeds are ``Seeds(seed, (*parts, r.prompt_id))``'s (the worker:
        its id and the batch index, as its other environments' seeds)."""
        t0 = time.monotonic()
        groups = await asyncio.gather(*(
            self.play_group(pool, r, c, Seeds(seed, (*parts, r.prompt_id)))
            for r, c in zip(records, counts, strict=True)
        ))  # fmt: skip
        rounds = [int(c > 0) for c in counts]
        return Played(
            [g[0] for g in groups], [g[1] for g in groups], time.monotonic() - t0, 0.0, rounds
        )


def load_env_of(cfg: ExperimentConfig) -> tuple[Any, str]:
    """``rollout.env.verifiers``'s environment and its label (:func:`env_label`); ValueError
    naming the setting at fault."""
    vc = cfg.rollout.env.verifiers
    if vc is None:
        raise ValueError("rollout.env.verifiers (module, args) is not set")
    try:
        env = load_verifiers_env(vc.module, vc.args)
    except VerifiersConfigError as e:
        raise ValueError(f"rollout.env.verifiers.{e}") from None
    return env, env_label(vc.module)


def source_of(cfg: ExperimentConfig) -> str:
    """Where a verifiers environment's rows come from, in words (the data check's ``dataset``)."""
    vc = cfg.rollout.env.verifiers
    return f"rollout.env.verifiers {vc.module if vc else '?'}"


def verifiers_prompts(
    cfg: ExperimentConfig,
) -> tuple[Any, list[dict[str, Any]], list[PromptRecord]]:
    """``rollout.env.verifiers``'s environment, its dataset's rows and those rows as prompts
    (:func:`verifiers_records`); ValueError naming the setting at fault."""
    env, label = load_env_of(cfg)
    rows = verifiers_rows(env)
    return env, rows, verifiers_records(rows, label)


def answer_rows(cfg: ExperimentConfig) -> list[dict[str, Any]]:
    """The environment's rows as supervised rows (``up``'s warm start): its chat ``prompt`` and
    its ``answer`` as the reply (``extra_info.answer``, which ``dynamo-rl sft`` reads) -- for a
    multi-turn environment, the reply to its first turn. Rows without an answer are left out."""
    _env, _rows, records = verifiers_prompts(cfg)
    return [
        {"prompt": r.prompt, "data_source": r.data_source, "extra_info": {"answer": r.ground_truth}}
        for r in records
        if r.ground_truth
    ]


def load_verifiers(
    cfg: ExperimentConfig, metrics: WorkerMetrics
) -> tuple[VerifiersPlayer, tuple[str, list[PromptRecord]]]:
    """The player of ``rollout.env.verifiers`` and its rows as the worker's prompts (where they
    come from, the records); ValueError naming the setting at fault."""
    rc = cfg.rollout
    if cfg.learner.lora.enabled:
        raise ValueError(
            "learner.lora.enabled must be false with rollout.env.name 'verifiers': the "
            "environment's chat requests do not name the learner's adapter"
        )
    env, rows, records = verifiers_prompts(cfg)
    player = VerifiersPlayer(
        env,
        {r.prompt_id: row for r, row in zip(records, rows, strict=True)},
        rc.sampling,
        metrics,
        model=rc.model_name,
    )
    return player, (source_of(cfg), records)
