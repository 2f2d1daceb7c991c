"""The informative-batch filler: DAPO's dynamic sampling done on the rollout side
(``rollout.drop_uniform_groups``).

DAPO fills a batch with groups that carry a signal by sampling more until it has enough. In an
asynchronous system the learner should neither wait for a synchronous resample nor read groups it
will throw away, so the workers do the filtering: they keep generating, and each batch's groups
whose episodes all scored the same (:func:`dynamo_rl.contracts.generation.uniform_group`, the
rule the learner's own ``dapo.dynamic_sampling`` applies) are counted and left out of the push.
Their outcomes still go to the allocator: a prompt that is all right or all wrong is exactly what
its statistics must see. So do their visits to the gradient statistics when the skip rule or
method ``grad`` reads them (:meth:`Filler.visits`): the learner, which writes those for the groups
it trains on, never sees a dropped group, and the skip rule's zero-advantage streak would miss
exactly the visits it counts. The learner reads ``train_batch_size`` groups as ever, every one
with a signal.

**Accounting, exact and once.** What the dropped groups cost
(:class:`~dynamo_rl.contracts.generation.Spent`: groups, episodes, model tokens) is counted in
``dynamo_rollout_dropped_*_total`` and added to :attr:`Filler.carry`. The next push that holds a
group writes the carry on its first group (``TrajectoryGroup.dropped_*``), and the carry is
cleared only once that push has returned. A push lands whole and once — a retry after a lost
reply finds the batch's marker and adds nothing — so each dropped group reaches the stream
exactly once, and a batch left with nothing to push hands its carry on to the next. A worker that
dies takes the carry since its last push with it, as it does the batch it was generating.

**Skipped prompts ride along.** The prompts the allocator gave 0 responses (the skip rule) make no
group, filter on or off; :meth:`Filler.split` counts them into :attr:`Filler.skipped`, and the
same push writes that count on the same first group (``TrajectoryGroup.skipped_prompts``,
:class:`~dynamo_rl.contracts.step_allocation.StepAllocation`), cleared the same way, so the
learner counts each skipped prompt once too.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Sequence
from typing import Any

from dynamo_rl.codec import TrajectoryGroup
from dynamo_rl.contracts import gradstats
from dynamo_rl.contracts.allocator import AllocationParams
from dynamo_rl.contracts.generation import Spent, uniform_group
from dynamo_rl.contracts.step_allocation import StepAllocation
from services.rollout.metrics import WorkerMetrics

__all__ = ["Filler"]

Push = Callable[[Sequence[TrajectoryGroup], str], Awaitable[list[str]]]


class Filler:
    """A worker's filter (on when ``enabled``) and its dropped cost not yet on the stream."""

    def __init__(self, enabled: bool, metrics: WorkerMetrics) -> None:
        self.enabled = enabled
        self.metrics = metrics
        self.carry = Spent()
        """What the groups dropped since the last push that carried it cost."""
        self.skipped = 0
        """Prompts allocated 0 responses since the last push that carried the count."""

    def split(
        self, groups: Sequence[TrajectoryGroup], skipped: int = 0
    ) -> tuple[list[TrajectoryGroup], list[TrajectoryGroup]]:
        """``(kept, dropped)`` in order; the dropped ones counted and carried, and ``skipped``
        (the batch's prompts allocated 0, which made no group) carried. Off: all kept."""
        self.skipped += skipped
        if not self.enabled:
            return list(groups), []
        kept: list[TrajectoryGroup] = []
        dropped: list[TrajectoryGroup] = []
        for g in groups:
            (dropped if uniform_group(g) else kept).append(g)
        cost = Spent.total(Spent.of_group(g) for g in dropped)
        self.carry = self.carry + cost
        self.metrics.dropped_groups.inc(cost.groups)
        self.metrics.dropped_rollouts.inc(cost.rollouts)
        self.metrics.dropped_tokens.inc(cost.tokens)
        return kept, dropped

    @staticmethod
    def writes_visits(allocation: AllocationParams) -> bool:
        """Whether the run reads gradient statistics (method ``grad`` or the skip rule): the
        learner writes its own then, and the filler the dropped groups'."""
        return allocation.method == "grad" or allocation.skip_after > 0

    @staticmethod
    def visits(
        dropped: Sequence[TrajectoryGroup], allocation: AllocationParams, version: int
    ) -> Callable[[Any, str], Awaitable[int]]:
        """The write of the dropped groups' visits (:func:`gradstats.dropped_records`: zero
        advantage, zero gradient, at the weight ``version`` they were sampled at) with the run's
        ``stats_half_life``: called with a ``redis.asyncio`` client and the namespace."""
        records = gradstats.dropped_records([g.prompt_id for g in dropped])
        half_life = getattr(allocation, "stats_half_life", None)

        async def write(client: Any, namespace: str) -> int:
            return await gradstats.awrite(client, namespace, version, records, half_life)

        return write

    async def push(self, push: Push, groups: Sequence[TrajectoryGroup], batch_id: str) -> list[str]:
        """``push(groups, batch_id)`` with the carry and the skipped count on the first group,
        cleared once it landed (``push`` must be at most once per ``batch_id``:
        ``TrajectoryWriter.push``). With no group to push both wait for the next batch."""
        if not groups:
            return await push(groups, batch_id)
        self.carry.stamp(groups[0])
        StepAllocation.stamp(self.skipped, groups[0])
        ids = await push(groups, batch_id)
        self.carry = Spent()
        self.skipped = 0
        return ids
