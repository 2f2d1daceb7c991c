"""The scorer interface every item kind implements.

A *kind* (``math``, ``code``, ``model``, ``judge``) is an item model in the wire contract
(:mod:`dynamo_rl.contracts.reward`: ``kind: Literal["..."]`` is the discriminator of
``VerifyItem``), one :class:`Scorer` subclass here and an entry in
:data:`services.reward.registry.SCORERS`. The dispatcher in ``app.py`` knows scorers only through
this interface, so a new kind is a contract model, a new module and one registry line.
"""

from __future__ import annotations

import abc
import asyncio
from typing import Any, ClassVar

from dynamo_rl.config import RewardConfig
from dynamo_rl.contracts.reward import ItemBase, ItemResult
from services.reward.metrics import RewardMetrics


class Scorer(abc.ABC):
    """Scores items of one kind. Built once per app from the config; used from the event loop."""

    kind: ClassVar[str]
    item_model: ClassVar[type[ItemBase]]

    def __init__(self, cfg: RewardConfig, metrics: RewardMetrics) -> None:
        self.cfg = cfg
        self.metrics = metrics

    @classmethod
    def enabled(cls, cfg: RewardConfig) -> bool:
        """Whether this server serves the kind; disabled kinds are refused with 422."""
        return True

    @property
    @abc.abstractmethod
    def capacity(self) -> int:
        """Items admitted at once (running + waiting); beyond it requests get 429."""

    async def start(self) -> None:  # noqa: B027 - optional hook
        """Start workers; raise to refuse to start the service."""

    async def close(self) -> None:  # noqa: B027 - optional hook
        """Stop workers."""

    def check(self, item: Any) -> list[tuple[tuple[str | int, ...], str]]:
        """Config-dependent validation beyond the model: ``(location in item, message)`` pairs."""
        return []

    @abc.abstractmethod
    async def score(self, item: Any) -> ItemResult:
        """Score one admitted item; never raises for anything the item contains."""


class NamedScorer(Scorer):
    """A scorer whose items name one entry of a config table (``reward.models``,
    ``reward.judges``) in the item field ``field``; an item may leave the name out when the table
    has exactly one entry. Each entry's ``max_pending`` adds to the capacity; ``clients`` holds one
    client per entry, closed with the scorer."""

    field: ClassVar[str]
    """The item's field that names the entry, and the config table's name without its ``s``."""

    def __init__(self, cfg: RewardConfig, metrics: RewardMetrics) -> None:
        super().__init__(cfg, metrics)
        self.clients: dict[str, Any] = {}

    @classmethod
    def table(cls, cfg: RewardConfig) -> dict[str, Any]:
        return getattr(cfg, f"{cls.field}s")

    @classmethod
    def enabled(cls, cfg: RewardConfig) -> bool:
        return bool(cls.table(cfg))

    @property
    def capacity(self) -> int:
        return sum(spec.max_pending for spec in self.table(self.cfg).values())

    async def close(self) -> None:
        await asyncio.gather(*(c.close() for c in self.clients.values()))

    def _pick(self, item: Any) -> tuple[str | None, str]:
        return pick(getattr(item, self.field), self.table(self.cfg), f"reward.{self.field}s")

    def check(self, item: Any) -> list[tuple[tuple[str | int, ...], str]]:
        _, problem = self._pick(item)
        return [((self.field,), problem)] if problem else []

    def entry(self, item: Any) -> str:
        """The entry an admitted item names (``check`` refused the item otherwise)."""
        name, _ = self._pick(item)
        assert name is not None
        return name


def pick(name: str | None, table: dict[str, Any], key: str) -> tuple[str | None, str]:
    """Resolve an item's model/judge name: ``(name, "")`` or ``(None, error message)``."""
    if name is None:
        if len(table) == 1:
            return next(iter(table)), ""
        return None, f"required: this server has {len(table)} entries in {key}"
    if name not in table:
        return None, f"{name!r} is not one of {key}: {', '.join(table) or 'none'}"
    return name, ""
