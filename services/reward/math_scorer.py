"""The ``math`` kind: free-text answers compared with a ground truth by math-verify.

Extraction (``last_boxed``, ``answer_line``, ``math_verify``, ``whole_response``, ``gsm8k``,
``gsm8k_flexible``, ``qa_exact_match``) and comparison live in :mod:`services.reward.math_answer`. Per item, in order:

1. the fast path (:mod:`services.reward.math_fast`, ``reward.math.fast_path``): plain numbers and
   identical simple forms are decided here, with math-verify's verdict, without a worker;
2. de-duplication (``reward.math.dedup``): an item whose (ground truth, mode, extracted answer)
   is already in flight waits for that item's verdict instead of asking math-verify again;
3. the rest are queued for :class:`services.reward.math_pool.MathPool`: the items a request
   submits within one event-loop turn enter the queue together, and each worker takes a batch of
   them per call, with the pool's hard per-item timeout.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import time
from typing import Any

from dynamo_rl.config import RewardConfig
from dynamo_rl.contracts.reward import ItemResult, MathItem
from services.reward.base import Scorer
from services.reward.math_fast import dedup_key, fast_verdict
from services.reward.math_pool import Job, MathPool
from services.reward.metrics import RewardMetrics


def default_workers() -> int:
    """One math worker per CPU this process may run on."""
    try:
        return max(1, len(os.sched_getaffinity(0)))
    except AttributeError:  # not Linux
        return max(1, os.cpu_count() or 1)


class PoolQueue:
    """Hands the jobs queued during one event-loop turn to a pool in one call (so they enter its
    queue together and spread over its workers); each job's result comes back as an awaitable."""

    def __init__(self, pool: MathPool) -> None:
        self.pool = pool
        self._outbox: list[tuple[Job, asyncio.Future[dict[str, Any]]]] = []

    def _flush(self) -> None:
        outbox, self._outbox = self._outbox, []
        loop = asyncio.get_running_loop()
        for (_, waiter), done in zip(
            outbox, self.pool.submit_many([job for job, _ in outbox]), strict=True
        ):
            done.add_done_callback(lambda f, w=waiter: _hand_back(loop, w, f.result()))

    def put(self, job: Job) -> asyncio.Future[dict[str, Any]]:
        loop = asyncio.get_running_loop()
        waiter: asyncio.Future[dict[str, Any]] = loop.create_future()
        if not self._outbox:
            loop.call_soon(self._flush)
        self._outbox.append((job, waiter))
        return waiter


class MathScorer(Scorer):
    kind = "math"
    item_model = MathItem

    def __init__(self, cfg: RewardConfig, metrics: RewardMetrics) -> None:
        super().__init__(cfg, metrics)
        mc = cfg.math
        self.workers = mc.workers or default_workers()
        self.pool = MathPool(
            self.workers, mc.timeout_s, memory_mb=mc.memory_mb, batch_size=mc.batch_size
        )
        self._restarts_seen = 0
        self._inflight: dict[Any, asyncio.Future[dict[str, Any]]] = {}
        self._queue = PoolQueue(self.pool).put

    @property
    def capacity(self) -> int:
        return self.cfg.math.max_pending

    async def start(self) -> None:
        await asyncio.to_thread(self.pool.start)

    async def close(self) -> None:
        await asyncio.to_thread(self.pool.close)

    async def _verdict(self, job: Job) -> tuple[dict[str, Any], str]:
        mc = self.cfg.math
        if mc.fast_path:
            out = fast_verdict(*job)
            if out is not None:
                return out, "fast"
        if not mc.dedup:
            return await self._queue(job), "worker"
        key = dedup_key(*job)
        shared = self._inflight.get(key)
        if shared is not None:
            return await asyncio.shield(shared), "dedup"
        waiter = self._queue(job)
        self._inflight[key] = waiter
        try:
            return await asyncio.shield(waiter), "worker"
        finally:
            if self._inflight.get(key) is waiter:
                del self._inflight[key]

    async def score(self, item: MathItem) -> ItemResult:
        start = time.monotonic()
        out, path = await self._verdict(
            (item.response, item.ground_truth, item.extraction or "last_boxed")
        )
        self.metrics.item_seconds.labels(self.kind).observe(time.monotonic() - start)
        self.metrics.math_path.labels(path).inc()
        new = self.pool.restarts - self._restarts_seen
        if new > 0:
            self._restarts_seen += new
            self.metrics.math_worker_restarts.inc(new)
        return ItemResult(
            id=item.id,
            score=1.0 if out["correct"] else 0.0,
            correct=bool(out["correct"]),
            format_ok=bool(out["format_ok"]),
            reason=out["reason"],
            detail=out["detail"],
            answer=out.get("answer"),
        )


def _hand_back(
    loop: asyncio.AbstractEventLoop, waiter: asyncio.Future[dict[str, Any]], result: dict[str, Any]
) -> None:
    """From a feeder thread: resolve ``waiter`` on its loop (gone at shutdown: nothing to do)."""
    with contextlib.suppress(RuntimeError):
        loop.call_soon_threadsafe(_resolve, waiter, result)


def _resolve(waiter: asyncio.Future[dict[str, Any]], result: dict[str, Any]) -> None:
    if not waiter.done():
        waiter.set_result(result)
