"""The scorer interface every item kind implements.

A *kind* (``math``, ``code``, ``model``, ``judge``) is an item model in the wire contract
(:mod:`dynamo_rl.contracts.reward`: ``kind: Literal["..."]`` is the discriminator of
``VerifyItem``), one :class:`Scorer` subclass here and an entry in
:data:`services.reward.registry.SCORERS`. The dispatcher in ``app.py`` knows scorers only through
this interface, so a new kind is a contract model, a new module and one registry line.
"""

from __future__ import annotations

import abc
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
