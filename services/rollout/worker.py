"""The rollout worker: dataset → allocator → engines → reward service → trajectory stream.

One batch, in order:

1. **Gates.** Wait until the engines' weights are at most ``max_staleness`` versions behind the
   learner's latest (``weight_version_key``), and until the stream holds fewer than
   ``max_pending_groups`` groups the learner has not read yet (backpressure).
2. **Allocate.** Ask the allocator for each prompt's count (``allocator.n_per_prompt`` on
   average, within ``allocator.n_min..n_max``: the run's allocation parameters, sent with the
   request). If it cannot answer, every prompt gets ``n_per_prompt`` — logged and counted in
   ``dynamo_rollout_allocator_fallbacks_total`` — and the next batch asks again.
3. **Generate and verify** each prompt's count of episodes of ``rollout.env`` through the one
   pipeline eval uses too (:mod:`services.rollout.pipeline`: first turns in requests of at most
   ``max_n_per_request`` samples over the replica pool, failures moved to another replica; all
   scored in one ``/v1/verify`` call, matched back by id; or in rounds, ``rollout.round_size``).
   The reward service being down means wait and retry: nothing is pushed unscored. A verifiers
   environment (``rollout.env.name: verifiers``) plays and scores its own episodes instead
   (:mod:`services.rollout.verifiers_worker`).
4. **Push** one ``TrajectoryGroup`` per prompt with one Lua script, so a batch lands whole or not
   at all, and at most once (see :meth:`RolloutWorker.push`), then **report**
   ``(prompt_id, episodes, correct)`` to the allocator (kept and re-sent with the next batch if
   the allocator is down): statistics count only episodes that were scored and pushed — or
   dropped by the informative-batch filler (``rollout.drop_uniform_groups``,
   :mod:`services.rollout.filler`: groups whose episodes all scored the same stay off the
   stream, and what they cost rides on the next pushed group).

**Leases.** While a batch runs, the worker holds a lease on the batch's prompt ids, renewed every
third of ``lease_ttl_s``; the push releases it in the same transaction as the groups. A worker
killed mid-batch leaves its lease behind: before each batch, a worker claims every lapsed lease —
and its own worker id's at once, since that can only be a dead earlier run — and re-issues those
prompts first. The stream protocol (push script, leases, lag) is
:class:`dynamo_rl.contracts.stream.TrajectoryWriter`; this module keeps the batch logic.

Each prompt's episodes are played by that prompt's own task, so a group can only ever hold its
own prompt's responses (the reference code's repeat/metadata bug cannot happen). A prompt
allocated 0 gets no group; a multi-turn episode dropped because the sandbox stayed down is
counted and left out.

**Bad input is not a crash.** Prompts longer than ``rollout.max_prompt_len`` are dropped, truncated
or refuse the dataset when it loads (``rollout.prompt_len_policy``), and a dataset whose
``data_source`` has no reward route, or an unknown ``rollout.env``, refuses to start
(:func:`build_worker`). A prompt an engine still refuses (HTTP 4xx) is dead-lettered with the
engine's reason, counted, and not served again; the batch goes on without it (connection errors
and 5xx are retried as before).
"""

from __future__ import annotations

import asyncio
import functools
import logging
import os
import secrets
import socket
import time
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass, field
from typing import Any, TypeVar

from redis.exceptions import ConnectionError as RedisConnectionError
from redis.exceptions import TimeoutError as RedisTimeoutError

from dynamo_rl.codec import Timing, TrajectoryGroup
from dynamo_rl.config import ExperimentConfig, RolloutConfig
from dynamo_rl.config.rollout import EnvConfig
from dynamo_rl.contracts.allocator import AllocationParams
from dynamo_rl.contracts.engine import alist_engines
from dynamo_rl.contracts.stream import TrajectoryWriter
from dynamo_rl.envs import VERIFIERS, EnvContext, check_env_config, make_env
from dynamo_rl.envs.sandbox import SandboxClient
from dynamo_rl.keys import weight_version_key
from dynamo_rl.notices import Notices
from dynamo_rl.redis_client import async_client
from dynamo_rl.retry import Backoff, Retrying, aretry_call
from services.rollout.build import (
    make_engine_factory,
    make_reward_client,
    make_sandbox,
    sampling_of,
    short_error,
)
from services.rollout.data_check import data_inputs, load_prompts
from services.rollout.datasets import PromptRecord, PromptRenderer, PromptSampler, check_routes
from services.rollout.engines import Engine, EnginePool, EngineRequestError
from services.rollout.episodes import Conversation, Episode
from services.rollout.filler import Filler
from services.rollout.metrics import WorkerMetrics
from services.rollout.pipeline import (
    Seeds,
    batch_groups,
    generate_group,
    play_batch,
    split_count,
)
from services.rollout.reward_client import RewardClient
from services.rollout.teacher import TeacherStage, build_teacher
from services.rollout.verifiers_worker import VerifiersPlayer, load_verifiers

__all__ = ["BatchResult", "RolloutWorker", "build_worker", "check_routes", "split_count"]

log = logging.getLogger(__name__)
T = TypeVar("T")


@dataclass
class BatchResult:
    index: int
    groups: list[TrajectoryGroup]
    """The groups pushed (with ``rollout.drop_uniform_groups``: those with a signal)."""
    entry_ids: list[str]
    used_fallback: bool
    dropped: list[TrajectoryGroup] = field(default_factory=list)
    """The groups the filler kept off the stream (their outcomes reported all the same)."""


class RolloutWorker:
    """One rollout worker; ``run`` produces batches until ``num_batches`` or cancellation."""

    def __init__(
        self,
        *,
        cfg: RolloutConfig,
        namespace: str,
        worker_id: str,
        sampler: PromptSampler,
        renderer: PromptRenderer,
        pool: EnginePool,
        reward: RewardClient,
        redis: Any,
        allocator: Any | None,
        metrics: WorkerMetrics | None = None,
        engine_factory: Callable[[str], Engine] | None = None,
        engines_namespace: str | None = None,
        allocator_factory: Callable[[], Any] | None = None,
        rendered: dict[str, tuple[str, list[int]]] | None = None,
        sandbox: SandboxClient | None = None,
        limits: EnvConfig | None = None,
        notices: Notices | None = None,
        allocation: AllocationParams | None = None,
        verifiers: VerifiersPlayer | None = None,
    ) -> None:
        self.cfg = cfg
        # The run's budget and bounds (the config's allocator section), sent with every Allocate.
        self.allocation = allocation or AllocationParams()
        self.notices = notices or Notices(None, "rollout")
        self.namespace = namespace
        self.worker_id = worker_id
        self.sampler = sampler
        self.renderer = renderer
        self.pool = pool
        self.reward = reward
        self.redis = redis
        self.allocator = allocator
        self.metrics = metrics or WorkerMetrics()
        self.filler = Filler(cfg.drop_uniform_groups, self.metrics)
        self.engine_factory = engine_factory
        self.allocator_factory = allocator_factory
        self.engines_namespace = engines_namespace or namespace
        self.writer = TrajectoryWriter(redis, namespace, worker_id, guard=self._redis)
        self.sampling = sampling_of(cfg.sampling)
        self._unreported: dict[str, list[int]] = {}
        # Prompt renderings (text, token ids), as the length check at load left them.
        self._rendered: dict[str, tuple[str, list[int]]] = dict(rendered or {})
        self.refused = 0  # prompts dead-lettered because an engine refused them
        self.batches_done = 0
        # Tells this run's batches from an earlier run of a worker with the same id.
        self.session = secrets.token_hex(4)
        self.lease = self.writer.lease
        self.reissued = 0  # prompts taken over from lapsed leases
        self.sample_log: Any = None  # a dynamo_rl.sample_log.SampleLog, set by the CLI
        self.sandbox = sandbox  # the /run_code client of multi-turn environments (rollout.env)
        # rollout.env with its token budget resolved (services.rollout.build.episode_limits).
        self.limits = limits or cfg.env
        self.verifiers = verifiers  # plays the batches of rollout.env.name verifiers
        self.teacher: TeacherStage | None = None  # rollout.teacher's scoring, set by build_worker

    @functools.cached_property
    def conversation(self) -> Conversation:
        """Episodes' conversations, rendered like the prompts (built on first use)."""
        return Conversation(self.renderer.tokenizer, self.renderer.template)

    # -- waiting --------------------------------------------------------------------------------

    async def _redis(self, call: Callable[[], Awaitable[T]]) -> T:
        """A Redis call retried with back-off while Redis is unreachable (never dropped)."""
        retrying = Retrying(
            "redis",
            Backoff(base_s=self.cfg.backoff_s, cap_s=self.cfg.backoff_max_s),
            on_retry=lambda _reason, delay: self.metrics.waited("redis", delay),
        )
        return await aretry_call(
            call, retry_on=(RedisConnectionError, RedisTimeoutError), retrying=retrying
        )

    async def learner_version(self) -> int:
        raw = await self._redis(lambda: self.redis.get(weight_version_key(self.namespace)))
        return int(raw) if raw is not None else 0

    async def _sleep(self, reason: str) -> None:
        """One poll interval of a wait, counted in wait_seconds_total as it happens."""
        await asyncio.sleep(self.cfg.poll_interval_s)
        self.metrics.wait_seconds.labels(reason).inc(self.cfg.poll_interval_s)

    async def fresh(self, version: int) -> bool:
        """Whether an engine at ``version`` is within ``max_staleness`` (the pool's ``admit``)."""
        return await self.learner_version() - version <= self.cfg.max_staleness

    async def wait_for_fresh_weights(self) -> int:
        """Block until the engines are at most ``max_staleness`` behind; returns their version."""
        reason = ""
        while True:
            latest = await self.learner_version()
            versions = await self.pool.weight_versions()
            if versions:
                oldest = min(versions.values())
                staleness = max(0, latest - oldest)
                self.metrics.staleness.set(staleness)
                self.metrics.weight_version.set(oldest)
                if staleness <= self.cfg.max_staleness:
                    return oldest
                if reason != "staleness":
                    log.info(
                        "engines at weight version %d, learner at %d (max_staleness %d): "
                        "waiting for the push", oldest, latest, self.cfg.max_staleness,
                    )  # fmt: skip
                    self.metrics.waits.labels("staleness").inc()
                reason = "staleness"
            else:
                if reason != "engine":
                    log.warning("no engine replica reports a weight version; waiting")
                    self.metrics.waits.labels("engine").inc()
                reason = "engine"
                await self.discover_engines()
            await self._sleep(reason)

    async def pending_groups(self) -> int:
        """Groups in the stream the learner has not read yet (the writer's ``lag``)."""
        return await self.writer.lag()

    async def wait_for_room(self) -> None:
        if not self.cfg.max_pending_groups:
            return
        waiting = False
        while True:
            pending = await self.pending_groups()
            self.metrics.pending_groups.set(pending)
            if pending < self.cfg.max_pending_groups:
                return
            if not waiting:
                log.info(
                    "stream holds %d unconsumed groups (max_pending_groups %d): pausing",
                    pending, self.cfg.max_pending_groups,
                )  # fmt: skip
                self.metrics.waits.labels("backpressure").inc()
                waiting = True
            await self._sleep("backpressure")

    async def discover_engines(self) -> int:
        """Add engines registered in Redis that the pool lacks; returns how many were added."""
        if not self.cfg.discover_engines or self.engine_factory is None:
            return 0
        entries = await self._redis(lambda: alist_engines(self.redis, self.engines_namespace))
        added = 0
        for entry in entries:
            if entry.url not in self.pool.urls:
                added += self.pool.add(self.engine_factory(entry.url))
        return added

    # -- allocator ------------------------------------------------------------------------------

    async def allocate(self, prompt_ids: Sequence[str]) -> tuple[list[int], list[float], bool]:
        """Counts and priorities per prompt, and whether the uniform fallback was used."""
        a = self.allocation
        uniform = [a.n_per_prompt] * len(prompt_ids), [-1.0] * len(prompt_ids)
        if self.cfg.allocation == "uniform" or self.allocator is None:
            return *uniform, False
        try:
            result = await self.allocator.aallocate(
                self.namespace,
                list(prompt_ids),
                n_per_prompt=a.n_per_prompt,
                n_min=a.n_min,
                n_max=a.n_max,
            )
        except Exception as e:  # grpc.RpcError above all; any failure means "use uniform n"
            log.warning("allocator unavailable (%s); uniform n=%d for this batch",
                        short_error(e), a.n_per_prompt)  # fmt: skip
            self.metrics.allocator_fallbacks.inc()
            await self._reset_allocator()
            return *uniform, True
        if len(result.counts) != len(prompt_ids):
            log.error(
                "allocator returned %d counts for %d prompts; uniform n",
                len(result.counts),
                len(prompt_ids),
            )
            self.metrics.allocator_fallbacks.inc()
            return *uniform, True
        return list(result.counts), list(result.priorities), False

    async def _reset_allocator(self) -> None:
        """Replace the client after a failure: a gRPC channel that failed to connect backs off
        reconnecting for up to minutes, while a fresh one tries at once, so DRA resumes with the
        first batch after the allocator is back."""
        if self.allocator_factory is None or self.allocator is None:
            return
        old = self.allocator
        self.allocator = self.allocator_factory()
        await asyncio.to_thread(old.close)

    async def report(self, outcomes: Sequence[tuple[str, int, int]]) -> None:
        for pid, attempts, successes in outcomes:
            acc = self._unreported.setdefault(pid, [0, 0])
            acc[0] += attempts
            acc[1] += successes
        if self.allocator is None or not self._unreported:
            return
        batch = [(pid, a, s) for pid, (a, s) in self._unreported.items()]
        try:
            await self.allocator.areport_outcomes(self.namespace, batch)
        except Exception as e:
            log.warning(
                "ReportOutcomes failed (%s); %d prompts kept for the next batch",
                short_error(e),
                len(batch),
            )
            self.metrics.report_failures.inc()
            await self._reset_allocator()
            return
        self._unreported.clear()

    # -- leases -------------------------------------------------------------------------------

    async def hold_lease(self, prompt_ids: Sequence[str], batch_id: str) -> None:
        await self.writer.hold_lease(prompt_ids, batch_id, self.cfg.lease_ttl_s)

    async def renew_lease(self, prompt_ids: Sequence[str], batch_id: str) -> None:
        """Runs beside a batch: keeps its lease from lapsing (cancelled when the batch ends)."""
        while True:
            await asyncio.sleep(self.cfg.lease_ttl_s / 3)
            await self.hold_lease(prompt_ids, batch_id)

    async def claim_lapsed(self) -> list[PromptRecord]:
        """Take every lapsed lease (and our own id's, left by a dead earlier run): their prompts."""
        known = {r.prompt_id: r for r in self.sampler.records}
        out: list[PromptRecord] = []
        for lease in await self.writer.claim_lapsed():
            missing = [p for p in lease.prompt_ids if p not in known]
            if missing:
                log.warning("lease %s: %d prompts not in this worker's shard, dropped",
                            lease.key, len(missing))  # fmt: skip
            out += [known[p] for p in lease.prompt_ids if p in known]
            log.info(
                "re-issuing %d prompts of the lapsed lease %s",
                len(lease.prompt_ids) - len(missing),
                lease.key,
            )
        self.reissued += len(out)
        self.metrics.leases_reissued.inc(len(out))
        return out

    # -- one batch ------------------------------------------------------------------------------

    def render(self, record: PromptRecord) -> tuple[str, list[int]]:
        cached = self._rendered.get(record.prompt_id)
        if cached is None:
            cached = self.renderer.render(record.prompt)
            self._rendered[record.prompt_id] = cached
        return cached

    async def refuse(self, record: PromptRecord, prompt_tokens: int, reason: str) -> None:
        """Dead-letter a prompt an engine refused, count it, and serve it no more."""
        self.notices.warn(log, "prompt_refused", f"prompt {record.prompt_id} refused by the engine, "
                          f"dead-lettered: {reason}")  # fmt: skip
        await self.writer.dead_letter(
            record.prompt_id, reason, data_source=record.data_source, prompt_tokens=prompt_tokens
        )
        self.refused += 1
        self.metrics.prompts_refused.inc()
        self.sampler.discard(record.prompt_id)

    async def run_batch(self, batch_index: int) -> BatchResult:
        t0 = time.monotonic()
        batch_id = f"{self.worker_id}:{self.session}:{batch_index}"
        await self.discover_engines()
        engine_version = await self.wait_for_fresh_weights()
        await self.wait_for_room()
        records = (await self.claim_lapsed())[: self.cfg.batch_size]
        taken = {r.prompt_id for r in records}
        records += [
            r for r in self.sampler.next_batch(self.cfg.batch_size) if r.prompt_id not in taken
        ][: self.cfg.batch_size - len(records)]
        await self.hold_lease([r.prompt_id for r in records], batch_id)
        renewer = asyncio.create_task(self.renew_lease([r.prompt_id for r in records], batch_id))
        try:
            return await self._run_leased_batch(batch_index, batch_id, records, engine_version, t0)
        finally:
            renewer.cancel()

    async def _generate(
        self,
        record: PromptRecord,
        rendered: tuple[str, list[int]],
        count: int,
        batch_index: int,
        round_index: int = 0,
    ) -> list[Episode]:
        """``count`` episodes of one prompt (:func:`generate_group`) in round ``round_index``;
        dropped ones are counted and left out; none when an engine refuses it (dead-lettered)."""
        try:
            episodes = await generate_group(
                self.pool, record, rendered, count,
                new_env=lambda seed: make_env(EnvContext(self.limits, self.sandbox, seed=seed)),
                conversation=self.conversation, sampling=self.sampling, limits=self.limits,
                max_per_request=self.cfg.max_n_per_request,
                seeds=Seeds(self.sampling.seed, (self.worker_id, batch_index, record.prompt_id))
                .round(round_index),
            )  # fmt: skip
        except EngineRequestError as e:
            await self.refuse(record, len(rendered[1]), str(e))
            return []
        kept = []
        for e in episodes:
            if e.dropped is not None:
                log.warning("episode of prompt %s dropped: %s", record.prompt_id, e.dropped)
                self.metrics.episodes_dropped.inc()
            else:
                kept.append(e)
        return kept

    async def _run_leased_batch(
        self,
        batch_index: int,
        batch_id: str,
        records: list[PromptRecord],
        engine_version: int,
        t0: float,
    ) -> BatchResult:
        rendered = [self.render(r) for r in records]

        t_alloc = time.monotonic()
        counts, priorities, fallback = await self.allocate([r.prompt_id for r in records])
        for c in counts:
            self.metrics.allocation.observe(c)

        t_gen = time.monotonic()  # generate and verify, at once or in rounds (rollout.round_size)
        if self.verifiers is not None:  # the environment's rubric scores: no verify call
            played = await self.verifiers.play_batch(self.pool, records, counts, self.sampling.seed,
                                                     (self.worker_id, batch_index))  # fmt: skip
        else:
            played = await play_batch(
                self.reward, records, counts, round_size=self.cfg.round_size, item_prefix=f"{batch_index}",
                generate=lambda p, n, rnd: self._generate(records[p], rendered[p], n, batch_index, rnd),
            )  # fmt: skip
        episodes, verdicts = played.episodes, played.verdicts
        generate_s, verify_s = played.generate_s, played.verify_s

        made = batch_groups(
            records, rendered, episodes, verdicts, counts, priorities, limits=self.limits,
            conversation=self.conversation, sampling=self.sampling, engine_version=engine_version,
            timing=Timing(created_unix=time.time(), generate_s=generate_s, verify_s=verify_s),
            namespace=self.namespace, worker_id=self.worker_id, batch_id=batch_id,
        )  # fmt: skip
        if self.teacher is not None:  # on-policy distillation: the teacher's log-probs
            await self.teacher.score(made.groups)
        groups, dropped = self.filler.split(made.groups, skipped=counts.count(0))
        rewards, outcomes = made.rewards, made.outcomes

        t_push = time.monotonic()
        entry_ids = await self.push(groups, batch_id)
        t_end = time.monotonic()
        # After the push: statistics count what was pushed, and what was dropped as uniform.
        await self.report(outcomes)
        if self.filler.writes_visits(self.allocation):
            visits = self.filler.visits(dropped, self.allocation, engine_version)
            await self._redis(lambda: visits(self.redis, self.namespace))
        played = [e for group in episodes for e in group]
        n_tokens = sum(e.model_tokens for e in played)
        self.metrics.record_episodes([e for e in played if e.multi_turn], generate_s)
        self.metrics.record_batch(
            groups, sum(len(g.responses) for g in groups), rewards,
            sum(o[2] for o in outcomes), n_tokens, {
                "allocate": t_gen - t_alloc, "generate": generate_s, "verify": verify_s,
                "push": t_end - t_push, "total": t_end - t0,
            },
        )  # fmt: skip
        log.info(
            "batch %d: %d groups, %d dropped (all equal), %d episodes, %d model tokens "
            "(%.0f tok/s), reward %.3f%s", batch_index, len(groups), len(dropped), len(rewards),
            n_tokens, n_tokens / generate_s if generate_s > 0 else 0.0,
            sum(rewards) / len(rewards) if rewards else 0.0,
            " [uniform fallback]" if fallback else "",
        )  # fmt: skip
        return BatchResult(batch_index, groups, entry_ids, fallback, dropped)

    async def push(self, groups: Sequence[TrajectoryGroup], batch_id: str) -> list[str]:
        """Add a batch's groups atomically and at most once, releasing the lease; their ids
        (:meth:`TrajectoryWriter.push`: a retry after a lost reply adds nothing twice). The first
        group carries what the groups dropped since the last push cost (:meth:`Filler.push`)."""
        return await self.filler.push(self.writer.push, groups, batch_id)

    async def run(self, num_batches: int | None = None) -> int:
        """Produce batches until ``num_batches`` (None: the config's; 0: forever)."""
        limit = self.cfg.num_batches if num_batches is None else num_batches
        while not limit or self.batches_done < limit:
            result = await self.run_batch(self.batches_done)
            if self.sample_log is not None:
                self.sample_log.write(result.groups)
            self.batches_done += 1
        return self.batches_done

    async def aclose(self) -> None:
        await self.pool.aclose()
        if self.teacher is not None:
            await self.teacher.aclose()
        if self.sandbox is not None:
            await self.sandbox.aclose()
        await self.reward.aclose()
        await self.redis.aclose()
        if self.allocator is not None:
            await asyncio.to_thread(self.allocator.close)


def build_worker(
    cfg: ExperimentConfig, metrics: WorkerMetrics | None = None, notices: Notices | None = None
) -> RolloutWorker:
    """A worker wired to the endpoints of ``cfg`` (raises ValueError naming a missing setting);
    its warnings for the user go to ``notices`` (default: its log only)."""
    rc = cfg.rollout
    check_env_config(rc.env, verifiers=True)
    _dataset, tokenizer_path = data_inputs(cfg)
    if not cfg.endpoints.engine_urls and not rc.discover_engines:
        raise ValueError(
            "endpoints.engine_urls is empty: give at least one engine base URL "
            "(or set rollout.discover_engines=true)"
        )
    metrics = metrics or WorkerMetrics()
    notices = notices or Notices(None, "rollout")
    player, rows = load_verifiers(cfg, metrics) if rc.env.name == VERIFIERS else (None, None)
    _records, renderer, lengths, limits = load_prompts(cfg, tokenizer_path, notices, rows)
    if lengths.over:
        action = "truncated" if rc.prompt_len_policy.startswith("truncate") else "dropped"
        metrics.prompts_over_length.labels(action).inc(lengths.over)
    sampler = PromptSampler(
        lengths.records,
        shuffle=rc.shuffle,
        seed=cfg.run.seed,
        num_shards=rc.num_workers,
        shard=rc.worker_index,
    )
    token = cfg.endpoints.control_token.get_secret_value() if cfg.endpoints.control_token else None

    engine_factory = make_engine_factory(cfg)
    engines = [engine_factory(url) for url in cfg.endpoints.engine_urls]

    pool = EnginePool(
        engines,
        backoff_s=rc.backoff_s,
        backoff_max_s=rc.backoff_max_s,
        max_wait_s=rc.engine_max_wait_s,
        on_failure=lambda url, _e: metrics.engine_failures.labels(url).inc(),
        on_wait=lambda seconds: metrics.waited("engine", seconds),
    )

    reward = make_reward_client(cfg, metrics)
    from dynamo_rl.clients.allocator import AllocatorClient

    def allocator_factory() -> AllocatorClient:
        return AllocatorClient(
            cfg.endpoints.allocator_addr,
            timeout_s=rc.allocator_timeout_s,
            retries=1,
            control_token=token,
        )

    worker = RolloutWorker(
        cfg=rc,
        namespace=rc.namespace or cfg.run.name,
        worker_id=rc.worker_id or f"{socket.gethostname()}-{os.getpid()}",
        sampler=sampler,
        renderer=renderer,
        pool=pool,
        reward=reward,
        # A push script carries a whole batch (megabytes): more than the default command timeout.
        redis=async_client(cfg.endpoints.redis_url, timeout_s=10.0),
        allocator=allocator_factory(),
        allocator_factory=allocator_factory,
        metrics=metrics,
        engine_factory=engine_factory,
        engines_namespace=cfg.run.name,
        rendered=lengths.rendered,
        sandbox=make_sandbox(cfg),
        limits=limits,
        notices=notices,
        allocation=cfg.allocator,
        verifiers=player,
    )
    pool.admit = worker.fresh  # a replica back from a failure serves once within max_staleness
    worker.teacher = build_teacher(cfg, tokenizer_path, metrics)
    return worker
