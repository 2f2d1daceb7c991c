"""How the prompts behind one learner step were allocated, against uniform n.

**Uniform n** is ``allocator.n_per_prompt``: the count every prompt gets under uniform allocation
(``rollout.allocation=uniform``) and under the worker's fallback when the allocator cannot answer.
Every stream group carries the count the allocator gave its prompt (``TrajectoryGroup.allocated_n``);
a group is **above** uniform when that count is greater than uniform n, **at** when equal, and
**below** when less (:func:`compare`).

**Skipped prompts** make no group: the allocator gave them 0 responses (the skip rule,
``allocator.skip_after``; a ``hopeless_n`` of 0 too — the allocator's own
``dynamo_allocator_skipped_prompts_total`` counts the same zeros). The rollout worker counts them
per batch and carries the count since its previous push on the first group of the next pushed
batch (``TrajectoryGroup.skipped_prompts``, :meth:`StepAllocation.stamp`), exactly as it carries
the dropped groups' cost (:mod:`dynamo_rl.contracts.generation`): a push lands whole and once, so
summing the carried counts over the entries a step consumed counts each skipped prompt once.

:meth:`StepAllocation.of` counts every group a step consumed — the ones it trained on and the ones
the learner's filters skipped (stale, uniform reward). Groups the workers dropped before the
stream (``rollout.drop_uniform_groups``) never reach the learner, so they are in none of the
three counts (their cost is in the ``gen_*_dropped`` fields). :meth:`StepAllocation.record` is
the step record's ``alloc_*`` fields (:data:`RECORD_FIELDS`).

Nothing here imports torch (the rollout worker uses it).
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any, Literal

__all__ = ["RECORD_FIELDS", "StepAllocation", "compare"]

Side = Literal["above", "at", "below"]

RECORD_FIELDS = ("alloc_above", "alloc_at", "alloc_below", "alloc_skipped")
"""The step record's allocation fields (``docs/learner.md``, "Allocation per step")."""


def compare(allocated_n: int, uniform_n: int) -> Side:
    """Where a prompt's allocated count lies against uniform n."""
    if allocated_n > uniform_n:
        return "above"
    if allocated_n == uniform_n:
        return "at"
    return "below"


@dataclass(frozen=True)
class StepAllocation:
    """Prompts of one step by allocation: above, at and below uniform n, and skipped (0)."""

    above: int = 0
    at: int = 0
    below: int = 0
    skipped: int = 0

    @classmethod
    def of(cls, consumed: Iterable[Any], uniform_n: int) -> StepAllocation:
        """From the stream groups a step consumed: each by its ``allocated_n`` against
        ``uniform_n``, plus the skipped prompts they carry (:meth:`carried`)."""
        sides = {"above": 0, "at": 0, "below": 0}
        skipped = 0
        for g in consumed:
            sides[compare(int(g.allocated_n), uniform_n)] += 1
            skipped += cls.carried(g)
        return cls(sides["above"], sides["at"], sides["below"], skipped)

    @staticmethod
    def carried(group: Any) -> int:
        """The skipped prompts a stream entry carries (0 on most entries)."""
        return int(group.skipped_prompts)

    @staticmethod
    def stamp(skipped: int, group: Any) -> None:
        """Write ``skipped`` as the skipped prompts ``group`` carries (the first of a batch)."""
        group.skipped_prompts = skipped

    def record(self) -> dict[str, int]:
        """The step record's ``alloc_*`` fields (:data:`RECORD_FIELDS`)."""
        values = (self.above, self.at, self.below, self.skipped)
        return dict(zip(RECORD_FIELDS, values, strict=True))

    def line(self) -> str:
        """The step line's compact form: ``alloc +3 =4 -1 skip 2`` (above, at, below, skipped)."""
        return f"alloc +{self.above} ={self.at} -{self.below} skip {self.skipped}"

    @classmethod
    def from_record(cls, record: dict[str, Any]) -> StepAllocation | None:
        """The allocation a step record holds; None when it has no ``alloc_*`` fields."""
        if not all(isinstance(record.get(k), int | float) for k in RECORD_FIELDS):
            return None
        return cls(*(int(record[k]) for k in RECORD_FIELDS))
