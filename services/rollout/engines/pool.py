"""Several engine replicas behind one client.

Each request goes to the healthy replica with the fewest requests in flight (round-robin among
equals), so a prompt's chunks spread across replicas. A replica that fails with
:class:`EngineUnavailable` is benched for a back-off that doubles with each consecutive failure
(the project's :class:`dynamo_rl.retry.Backoff`: ``backoff_s`` up to ``backoff_max_s``, jittered,
so replicas that failed together do not come back in lock-step) and the request moves to another
replica at once. When every replica is benched the pool waits for the
earliest to come back and tries again — forever by default, or until ``max_wait_s`` — so a worker
rides out an engine restart instead of dying. A request error (4xx) or protocol error is not the
replica's fault and is raised immediately.

A replica back from a failure may have restarted on the weights it was started with: with
``admit`` (the worker's: within ``rollout.max_staleness`` of the learner), it serves again only
once ``admit`` accepts its weight version — held back (benched for ``backoff_s`` at a time) until
the learner has pushed the current weights to it.
"""

from __future__ import annotations

import asyncio
import itertools
import logging
import time
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass

from dynamo_rl.contracts.sampling import SamplingParams
from dynamo_rl.retry import Backoff
from services.rollout.engines.base import Engine, EngineUnavailable, Sample

__all__ = ["EnginePool"]

log = logging.getLogger(__name__)


@dataclass
class _Replica:
    engine: Engine
    in_flight: int = 0
    failures: int = 0
    benched_until: float = 0.0
    held: bool = False  # back from a failure, its weight version not admitted yet (logged once)


class EnginePool:
    """Spread requests over replicas; retry another on failure; wait when none is left."""

    def __init__(
        self,
        engines: Sequence[Engine],
        *,
        backoff_s: float = 0.5,
        backoff_max_s: float = 10.0,
        max_wait_s: float = 0.0,
        on_failure: Callable[[str, Exception], None] | None = None,
        on_wait: Callable[[float], None] | None = None,
        admit: Callable[[int], Awaitable[bool]] | None = None,
    ) -> None:
        # An empty pool is allowed when replicas are discovered later (EnginePool.add).
        self.replicas = [_Replica(e) for e in engines]
        self.backoff = Backoff(base_s=backoff_s, cap_s=backoff_max_s)
        self.max_wait_s = max_wait_s
        self._on_failure = on_failure
        self._on_wait = on_wait
        self.admit = admit
        """Whether a replica back from a failure may serve at the weight version it reports."""
        self._turn = itertools.count()

    @property
    def urls(self) -> list[str]:
        return [r.engine.url for r in self.replicas]

    def add(self, engine: Engine) -> bool:
        """Add a replica unless one with the same URL is already in the pool."""
        if engine.url in self.urls:
            return False
        self.replicas.append(_Replica(engine))
        log.info("engine %s joined the pool (%d replicas)", engine.url, len(self.replicas))
        return True

    def _pick(self, now: float) -> _Replica | None:
        ready = [r for r in self.replicas if r.benched_until <= now]
        if not ready:
            return None
        fewest = min(r.in_flight for r in ready)
        candidates = [r for r in ready if r.in_flight == fewest]
        return candidates[next(self._turn) % len(candidates)]

    def _bench(self, replica: _Replica, error: Exception) -> None:
        replica.failures += 1
        delay = self.backoff.delay(replica.failures - 1)
        replica.benched_until = time.monotonic() + delay
        # Warn once per outage; a replica that stays down would otherwise flood the log.
        level = logging.WARNING if replica.failures == 1 else logging.DEBUG
        log.log(level, "engine %s failed (%s); benched for %.1fs", replica.engine.url, error, delay)
        if self._on_failure is not None:
            self._on_failure(replica.engine.url, error)

    async def _admitted(self, replica: _Replica) -> bool:
        """A replica back from a failure: whether ``admit`` accepts its weight version now (else
        it is benched for ``backoff_s`` and asked again)."""
        if self.admit is None or not replica.failures:
            return True
        try:
            version = await replica.engine.weight_version()
        except EngineUnavailable as e:
            self._bench(replica, e)
            return False
        if await self.admit(version):
            if replica.held:
                log.info("engine %s serves again at weight version %d", replica.engine.url, version)
            replica.held = False
            return True
        if not replica.held:
            log.warning("engine %s is back at weight version %d, too old to serve: held until "
                        "the learner pushes to it", replica.engine.url, version)  # fmt: skip
        replica.held = True
        replica.benched_until = time.monotonic() + self.backoff.base_s
        return False

    async def _wait_for_replica(self, waiting_since: float) -> None:
        now = time.monotonic()
        if self.max_wait_s and now - waiting_since > self.max_wait_s:
            raise EngineUnavailable(
                f"no engine replica answered for {now - waiting_since:.0f}s "
                f"(rollout.engine_max_wait_s={self.max_wait_s}): {', '.join(self.urls)}"
            )
        if self.replicas:
            delay = max(0.01, min(r.benched_until for r in self.replicas) - now)
        else:
            delay = self.backoff.base_s
        if self._on_wait is not None:
            self._on_wait(delay)
        await asyncio.sleep(delay)

    async def generate(
        self,
        prompt_token_ids: Sequence[int],
        n: int,
        sampling: SamplingParams,
        *,
        prefer: str | None = None,
    ) -> list[Sample]:
        """``n`` samples from one replica, moving to another (or waiting) on failure.

        ``prefer``: the URL of the replica to use while it is healthy (a multi-turn episode
        keeps its engine, for prefix-cache reuse); each sample's ``engine_url`` names the one
        that answered."""
        waiting_since: float | None = None
        while True:
            now = time.monotonic()
            pinned = [r for r in self.replicas if r.engine.url == prefer and r.benched_until <= now]
            replica = pinned[0] if pinned else self._pick(now)
            if replica is None:
                if waiting_since is None:
                    waiting_since = time.monotonic()
                    log.warning("every engine replica is down; waiting for one to come back")
                await self._wait_for_replica(waiting_since)
                continue
            if not await self._admitted(replica):
                continue
            replica.in_flight += 1
            try:
                samples = await replica.engine.generate(prompt_token_ids, n, sampling)
            except EngineUnavailable as e:
                self._bench(replica, e)
                continue
            finally:
                replica.in_flight -= 1
            replica.failures = 0
            return samples

    async def weight_versions(self) -> dict[str, int]:
        """The weight version of every replica that answers now (benched ones are skipped)."""
        now = time.monotonic()
        live = [r for r in self.replicas if r.benched_until <= now]

        async def one(r: _Replica) -> int | None:
            try:
                return await r.engine.weight_version()
            except EngineUnavailable as e:
                self._bench(r, e)
                return None

        versions = await asyncio.gather(*(one(r) for r in live))
        return {r.engine.url: v for r, v in zip(live, versions, strict=True) if v is not None}

    async def aclose(self) -> None:
        await asyncio.gather(*(r.engine.aclose() for r in self.replicas))
