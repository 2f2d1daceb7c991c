"""Base class of every config section and the error every config mistake raises."""

from __future__ import annotations

from pydantic import BaseModel, ConfigDict


class ConfigError(ValueError):
    """A config mistake; the message names the dotted key, the value and what is allowed."""


class Section(BaseModel):
    """A config section: unknown keys are errors, assignments are validated."""

    model_config = ConfigDict(
        extra="forbid",
        validate_assignment=True,
        protected_namespaces=(),
        use_attribute_docstrings=True,
    )
