"""The ``reasoning_gym`` kind: a response to a reasoning-gym entry, scored by the library's own
``score_answer`` for the entry's task (data source ``reasoning_gym/<task>``).

The scoring runs in a pool of worker processes like math-verify's
(:class:`services.reward.math_pool.MathPool` with :func:`services.reward.rg_answer.runner`): a
hard per-item timeout, a memory limit, a hung or crashed worker replaced, and every item answered.
The pool starts at the first item, so a service that never scores one never imports the library
(about 1.5 s and matplotlib, sympy); if it cannot start (the library is missing or broken), the
items score 0 with reason ``internal_error`` naming why, and the next item tries again. The kind is
served when ``reward.reasoning_gym.enabled`` and the library is installed; otherwise its items
are refused with 422, as a disabled kind's are.
"""

from __future__ import annotations

import asyncio
import contextlib
import importlib.metadata
import importlib.util
import logging
import time
from typing import Any

from dynamo_rl.config import RewardConfig
from dynamo_rl.contracts import rg_entry
from dynamo_rl.contracts.reward import ItemResult, ReasoningGymItem
from services.reward.base import Scorer
from services.reward.math_pool import MathPool
from services.reward.math_scorer import PoolQueue, default_workers
from services.reward.metrics import RewardMetrics
from services.reward.rg_answer import runner

log = logging.getLogger("services.reward")


def installed_version() -> str | None:
    """The reasoning-gym version installed here, or None (the library is not installed)."""
    if importlib.util.find_spec("reasoning_gym") is None:
        return None
    try:
        return importlib.metadata.version("reasoning-gym")
    except importlib.metadata.PackageNotFoundError:
        return "unknown"


class ReasoningGymScorer(Scorer):
    kind = "reasoning_gym"
    item_model = ReasoningGymItem

    def __init__(self, cfg: RewardConfig, metrics: RewardMetrics) -> None:
        super().__init__(cfg, metrics)
        self.pool, self._queue = self._new_pool()
        self._start: asyncio.Future[None] | None = None
        self._logged = False

    def _new_pool(self) -> tuple[MathPool, PoolQueue]:
        rc = self.cfg.reasoning_gym
        pool = MathPool(
            rc.workers or default_workers(), rc.timeout_s, memory_mb=rc.memory_mb,
            batch_size=rc.batch_size, runner=runner, what="reasoning-gym", name="reasoning-gym",
        )  # fmt: skip
        return pool, PoolQueue(pool)

    @classmethod
    def enabled(cls, cfg: RewardConfig) -> bool:
        if not cfg.reasoning_gym.enabled:
            return False
        if installed_version() is None:
            log.warning("reasoning_gym items are refused: the reasoning-gym library is not "
                        "installed (pip install 'reasoning-gym==%s')", rg_entry.VERSION)  # fmt: skip
            return False
        return True

    @property
    def capacity(self) -> int:
        return self.cfg.reasoning_gym.max_pending

    async def close(self) -> None:
        if self._start is not None:
            with contextlib.suppress(Exception):
                await self._start
        await asyncio.to_thread(self.pool.close)

    async def _started(self) -> str | None:
        """None once the pool runs (started by the first item); else why it could not start."""
        if self._start is None:
            self._start = asyncio.ensure_future(asyncio.to_thread(self.pool.start))
        start = self._start
        try:
            await asyncio.shield(start)
        except Exception as e:
            if self._start is start:  # the next item tries again, with a fresh pool
                log.error("reasoning-gym workers could not start: %s", e)
                self._start = None
                self.pool, self._queue = self._new_pool()
            return str(e)
        if not self._logged:
            self._logged = True
            version = installed_version()
            log.info("reasoning-gym %s: %d workers started", version, self.pool.size)
            if version != rg_entry.VERSION:
                log.warning("reasoning-gym %s is installed; the data check knows the tasks of "
                            "%s (pinned)", version, rg_entry.VERSION)  # fmt: skip
        return None

    async def score(self, item: ReasoningGymItem) -> ItemResult:
        begin = time.monotonic()
        problem = await self._started()
        if problem is not None:
            out: dict[str, Any] = {"correct": False, "format_ok": False,
                                   "reason": "internal_error",
                                   "detail": f"reasoning-gym workers could not start: {problem}"}  # fmt: skip
        else:
            task = rg_entry.task_of(item.data_source)
            out = await self._queue.put((task, item.config, item.entry, item.response))
        self.metrics.item_seconds.labels(self.kind).observe(time.monotonic() - begin)
        return ItemResult(
            id=item.id,
            score=float(out.get("score", 0.0)),
            correct=bool(out["correct"]),
            format_ok=bool(out["format_ok"]),
            reason=out["reason"],
            detail=out["detail"],
            answer=out.get("answer"),
        )
