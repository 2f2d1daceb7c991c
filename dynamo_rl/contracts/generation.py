"""Generation spent per learner step, kept and dropped, and the rule that says which groups
carry no learning signal. Both ends use it: the rollout worker to drop groups before the stream
(``rollout.drop_uniform_groups``, :mod:`services.rollout.filler`), the learner to skip them
(``learner.algorithm.dapo.dynamic_sampling``) and to count what a step cost.

**The rule** (:func:`uniform_group`): a group whose episodes all returned the same reward has zero
group-relative advantage — nothing to learn from. A forked multi-turn episode counts once, with
its first segment's reward (its return, credited with every turn); a group of one episode is
uniform. Rewards are compared as float32, the precision the learner computes advantages in, so a
group the worker drops is exactly one whose advantages the learner would find zero.

**The cost of a group** (:meth:`Spent.of_group`): one group, its episodes (rollouts), and the
model tokens of its responses (every token of a single-turn response, the loss-mask-1 tokens of a
multi-turn one: what the engines generated, not the observations an environment added).

**The stream's share** (:meth:`Spent.carried`): the worker writes what it dropped since its
previous push on the first group of the next pushed batch (``TrajectoryGroup.dropped_groups``,
``dropped_rollouts``, ``dropped_tokens``; :meth:`Spent.stamp`). A push lands whole and once
(:class:`dynamo_rl.contracts.stream.TrajectoryWriter`), so summing the carried figures over the
entries a learner step consumed counts each dropped group exactly once. The learner's
:class:`StepGeneration` adds the kept groups' own cost and the cost of the groups its own filters
skipped (stale, uniform) to the dropped side; its :meth:`StepGeneration.record` is the step
record's ``gen_*`` fields.

Nothing here imports torch (the rollout worker uses it).
"""

from __future__ import annotations

import math
import struct
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any

from dynamo_rl.codec import response_loss_mask

__all__ = [
    "RECORD_FIELDS",
    "Spent",
    "StepGeneration",
    "episode_returns",
    "response_episode",
    "uniform_group",
]


def response_episode(response: Any) -> int | None:
    """The episode a stream response is a segment of (its ``episode``); None for a single-turn
    response (no turns), which is an episode of its own."""
    return int(response.episode) if response.turns else None


def episode_returns(group: Any) -> list[float]:
    """Each episode's return in a stream ``TrajectoryGroup``, in order of first appearance: the
    reward of its first segment (a single-turn response is an episode of its own)."""
    seen: set[tuple[str, int]] = set()
    out: list[float] = []
    for i, r in enumerate(group.responses):
        episode = response_episode(r)
        key = ("episode", episode) if episode is not None else ("row", i)
        if key not in seen:
            seen.add(key)
            out.append(float(r.reward))
    return out


def _float32(x: float) -> float:
    """``x`` rounded to float32, as ``torch.tensor([x])`` holds it (overflow: ±inf)."""
    try:
        return float(struct.unpack("f", struct.pack("f", x))[0])
    except OverflowError:
        return math.copysign(math.inf, x)


def uniform_group(group: Any) -> bool:
    """DAPO dynamic sampling's test of a stream ``TrajectoryGroup``: True when its episodes all
    scored the same (a group of one episode included) — no learning signal. A forked episode
    counts once, with its first segment's reward (its return)."""
    return len({_float32(r) for r in episode_returns(group)}) <= 1


@dataclass(frozen=True)
class Spent:
    """Generation spent: groups, rollouts (episodes) and generated (model) tokens."""

    groups: int = 0
    rollouts: int = 0
    tokens: int = 0

    def __add__(self, other: Spent) -> Spent:
        return Spent(
            self.groups + other.groups,
            self.rollouts + other.rollouts,
            self.tokens + other.tokens,
        )

    def __bool__(self) -> bool:
        return bool(self.groups or self.rollouts or self.tokens)

    @classmethod
    def total(cls, parts: Iterable[Spent]) -> Spent:
        out = cls()
        for p in parts:
            out = out + p
        return out

    @classmethod
    def of_group(cls, group: Any) -> Spent:
        """What generating a stream ``TrajectoryGroup`` cost: itself, its episodes, the model
        tokens of its responses."""
        tokens = sum(sum(response_loss_mask(r)) for r in group.responses)
        return cls(1, len(episode_returns(group)), tokens)

    @classmethod
    def carried(cls, group: Any) -> Spent:
        """The dropped groups' cost a stream entry carries (0 on most entries)."""
        return cls(
            int(group.dropped_groups), int(group.dropped_rollouts), int(group.dropped_tokens)
        )

    def stamp(self, group: Any) -> None:
        """Write this as the dropped groups' cost ``group`` carries (the first of a batch)."""
        group.dropped_groups = self.groups
        group.dropped_rollouts = self.rollouts
        group.dropped_tokens = self.tokens


RECORD_FIELDS = (
    "gen_groups_kept",
    "gen_groups_dropped",
    "gen_rollouts_kept",
    "gen_rollouts_dropped",
    "gen_tokens_kept",
    "gen_tokens_dropped",
)
"""The step record's generation fields (``docs/learner.md``, "Generation spent per step")."""


@dataclass(frozen=True)
class StepGeneration:
    """What one learner step's groups cost to generate: ``kept`` (the groups it trains on) and
    ``dropped`` (groups generated for nothing: dropped by the workers, carried on the entries the
    step consumed, and skipped by the learner's own filters)."""

    kept: Spent = field(default_factory=Spent)
    dropped: Spent = field(default_factory=Spent)

    @classmethod
    def of(
        cls, kept: Iterable[Any], skipped: Iterable[Any] = (), consumed: Iterable[Any] = ()
    ) -> StepGeneration:
        """From stream groups: those trained on (``kept``), those a filter skipped, and every
        group consumed (kept or skipped), whose carried figures count as dropped."""
        return cls(
            kept=Spent.total(Spent.of_group(g) for g in kept),
            dropped=Spent.total(Spent.of_group(g) for g in skipped)
            + Spent.total(Spent.carried(g) for g in consumed),
        )

    def record(self) -> dict[str, int]:
        """The step record's ``gen_*`` fields (:data:`RECORD_FIELDS`)."""
        k, d = self.kept, self.dropped
        values = (k.groups, d.groups, k.rollouts, d.rollouts, k.tokens, d.tokens)
        return dict(zip(RECORD_FIELDS, values, strict=True))
