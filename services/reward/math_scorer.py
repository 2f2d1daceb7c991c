"""The ``math`` kind: free-text answers compared with a ground truth by math-verify.

Extraction (``last_boxed`` or ``math_verify``) and comparison live in
:mod:`services.reward.math_answer`; they run in :class:`services.reward.math_pool.MathPool`
worker processes, at most one item per worker, with the pool's hard timeout.
"""

from __future__ import annotations

import asyncio
import time
from concurrent.futures import ThreadPoolExecutor

from dynamo_rl.config import RewardConfig
from dynamo_rl.contracts.reward import ItemResult, MathItem
from services.reward.base import Scorer
from services.reward.math_pool import MathPool
from services.reward.metrics import RewardMetrics


class MathScorer(Scorer):
    kind = "math"
    item_model = MathItem

    def __init__(self, cfg: RewardConfig, metrics: RewardMetrics) -> None:
        super().__init__(cfg, metrics)
        mc = cfg.math
        self.pool = MathPool(mc.workers, mc.timeout_s, memory_mb=mc.memory_mb)
        self._sem = asyncio.Semaphore(mc.workers)
        self._executor = ThreadPoolExecutor(mc.workers, thread_name_prefix="math")
        self._restarts_seen = 0

    @property
    def capacity(self) -> int:
        return self.cfg.math.max_pending

    async def start(self) -> None:
        await asyncio.get_running_loop().run_in_executor(self._executor, self.pool.start)

    async def close(self) -> None:
        self.pool.close()
        self._executor.shutdown(wait=False, cancel_futures=True)

    async def score(self, item: MathItem) -> ItemResult:
        async with self._sem:
            start = time.monotonic()
            out = await asyncio.get_running_loop().run_in_executor(
                self._executor,
                self.pool.score,
                item.response,
                item.ground_truth,
                item.extraction or "last_boxed",
            )
            self.metrics.item_seconds.labels(self.kind).observe(time.monotonic() - start)
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
