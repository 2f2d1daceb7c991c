"""The learner's section."""

from __future__ import annotations

from typing import Annotated

from pydantic import Field

from dynamo_rl.config.base import Section


class LearnerConfig(Section):
    lr: Annotated[float, Field(gt=0)] = 1e-6
    """AdamW learning rate (the DynaMO recipe's 1e-6)."""
