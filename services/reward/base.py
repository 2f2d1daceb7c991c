"""What every scorer shares: the result shape, the item base model and the scorer interface.

A *kind* (``math``, ``code``, ``model`` for a reward model, ``judge`` for an LLM judge) is one
:class:`Scorer` subclass with its own pydantic item model (``kind: Literal["..."]`` is the
discriminator) and an entry in :data:`services.reward.registry.SCORERS`. The dispatcher in ``app.py`` knows scorers only
through this interface, so a new kind is a new module plus one registry line.
"""

from __future__ import annotations

import abc
from typing import Annotated, Any, ClassVar, Literal

from pydantic import BaseModel, ConfigDict, Field

from dynamo_rl.config import RewardConfig
from services.reward.metrics import RewardMetrics

Reason = Literal[
    "ok",
    "wrong_answer",
    "no_answer",
    "timeout",
    "memory_limit",
    "runtime_error",
    "compile_error",
    "output_limit",
    "sandbox_error",
    "bad_ground_truth",
    "internal_error",
    "unparseable",
    "upstream_error",
    "model_error",
]
"""Why an item scored what it did (see docs/reward.md for each)."""

ItemId = Annotated[
    str | int, Field(description="caller's id, echoed back", union_mode="left_to_right")
]


class ItemBase(BaseModel):
    """Fields every item has; subclasses add ``kind`` and their own fields."""

    model_config = ConfigDict(extra="forbid")

    id: ItemId
    data_source: str | None = Field(
        None,
        description="routes the item to reward.composite.<data_source> (or '*') when the "
        "server has such a spec; otherwise the item is scored by its kind alone",
    )
    prompt: str | None = Field(
        None, description="the prompt's text (what reward-model and judge components read)"
    )
    response_length: int | None = Field(
        None, ge=0, description="the response's length in tokens (length components)"
    )


class ItemResult(BaseModel):
    """One item's verdict, in the order the items came."""

    id: ItemId
    score: float = Field(description="1/0 for math; fraction of passed cases for code")
    correct: bool = Field(description="full marks")
    format_ok: bool = Field(description="an answer (math) or a program (code) was found")
    reason: Reason
    detail: str = ""
    raw_score: float | None = Field(
        None, description="model kind: the reward model's raw output (score is normalised)"
    )
    components: dict[str, float] | None = Field(
        None,
        description="composite items: each component's unweighted score (0 when gated off; "
        "reward models also '<name>_raw'); score is the weighted total",
    )


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
