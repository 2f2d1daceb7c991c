"""The allocation parameters: how a batch's budget is shared out, declared once.

:class:`AllocationParams` is the one declaration of those parameters, their defaults, bounds and
documentation. Every end uses it:

- the config's ``allocator`` section (:class:`dynamo_rl.config.AllocatorConfig`) is an
  ``AllocationParams`` plus the server's own settings, so ``allocator.n_min`` etc. are these fields
  (the older keys ``rollout.n``, ``rollout.n_min``, ``rollout.n_max`` load into
  ``allocator.n_per_prompt``, ``allocator.n_min``, ``allocator.n_max``:
  :data:`dynamo_rl.config.ALIASES`);
- the rollout worker sends the run's ``n_per_prompt``, ``n_min`` and ``n_max`` from that section
  with every ``Allocate`` (and uses ``n_per_prompt`` for uniform allocation);
- the server (``allocator/server.py``) validates an ``Allocate`` request by merging the request's
  fields over its config with :meth:`AllocationParams.with_overrides`;
- the algorithm (``allocator.algorithm.allocate_rollouts``) takes an ``AllocationParams``;
- the client (``dynamo_rl/clients/allocator.py``) sets the request fields named by
  :data:`REQUEST_FIELDS`.

The wire format stays ``proto/dynamo/v1/allocator.proto``: ``AllocateRequest`` carries every field
of :data:`REQUEST_FIELDS` (unset: the server's config) besides the batch (``namespace``,
``prompt_ids``) and its total (``budget``, the alternative to ``n_per_prompt``). The fields of
:data:`CONFIG_ONLY` are the server's alone. ``tests/dynamo_rl/test_allocator_contract.py`` checks
the model against the proto field by field, so a field added to one and not the other fails it.

Importing this module imports neither protobuf nor numpy (the config imports it).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Annotated, Any, ClassVar, Literal, get_args

from annotated_types import Ge, Gt, Le, Lt
from pydantic import BaseModel, ConfigDict, Field, ValidationError, model_validator
from pydantic.fields import FieldInfo

__all__ = [
    "CONFIG_ONLY",
    "METHODS",
    "PRIORITIES",
    "REQUEST_FIELDS",
    "SCHEMES",
    "AllocationParams",
    "InvalidParams",
    "Method",
    "Priority",
    "Scheme",
    "SkipBudget",
]

Priority = Literal["variance", "std"]
Scheme = Literal["reference", "water-level"]
Method = Literal["dra", "grad", "knapsack", "uniform"]
SkipBudget = Literal["respend", "save"]
PRIORITIES: tuple[str, ...] = get_args(Priority)
SCHEMES: tuple[str, ...] = get_args(Scheme)
METHODS: tuple[str, ...] = get_args(Method)


class InvalidParams(ValueError):
    """Parameters outside their domain; the message names each field and what it allows."""


class AllocationParams(BaseModel):
    """How a batch's budget is shared out (``allocator.algorithm`` explains each step)."""

    model_config = ConfigDict(extra="forbid", frozen=True, use_attribute_docstrings=True)

    key_prefix: ClassVar[str] = ""
    """Written before a field's name in the cross-field errors ("allocator." in the config)."""

    n_per_prompt: Annotated[int, Field(ge=1)] = 8
    """Mean responses per prompt, uniform GRPO's n: a batch's budget is n_per_prompt x its
    prompts (the rollout worker's request; the server's when a request gives neither budget nor
    n_per_prompt), and what every prompt gets under uniform allocation or the worker's fallback."""
    n_min: Annotated[int, Field(ge=0)] = 2
    """Fewest responses any prompt gets."""
    n_max: Annotated[int, Field(ge=1)] = 16
    """Most responses any prompt gets."""
    initial_budget: Annotated[int, Field(ge=0)] = 8
    """Samples a prompt needs before its success rate is trusted; until then it is explored."""
    mastery_threshold: Annotated[float, Field(gt=0, le=1)] = 0.85
    """Success rate at or above which a prompt counts as mastered (priority = min_priority)."""
    min_priority: Annotated[float, Field(ge=0, le=1)] = 0.01
    """Floor of every explored prompt's priority."""
    priority: Priority = "variance"
    """Priority from the success statistics: the Bernoulli variance (the authors' code) or its
    square root (the theory's optimum n ∝ σ)."""
    scheme: Scheme = "reference"
    """reference: n_min plus a share proportional to priority (the authors' code); water-level:
    n = clip(λ·priority, n_min, n_max), the bounded optimum of Σσ²/n when priority is std."""

    hopeless_after: Annotated[int, Field(ge=0)] = 0
    """Samples after which a prompt with no success (k < 0.5) counts as hopeless and gets only
    ``hopeless_n`` responses, its n_min - hopeless_n going to the others (0: off)."""
    hopeless_n: Annotated[int, Field(ge=0)] = 1
    """Responses a hopeless prompt gets (at most n_min; >= 1 keeps its statistics fresh)."""

    method: Method = "dra"
    """The allocation scheme: dra (the paper's: the success-rate priority, by ``scheme``), grad
    (n ∝ the gradient spread the learner measured, σ where none was measured), knapsack (Knapsack
    RL: n maximising Σ P(non-zero gradient)·p(1−p)²), uniform (the budget spread evenly, no
    exploration step: uniform n where the skip rule or hopeless prompts are wanted)."""
    grad_half_life: Annotated[float, Field(gt=0)] = 4.0
    """grad: weight versions after which a measured gradient spread counts half (it decays toward
    the σ fallback as the policy moves on)."""
    skip_after: Annotated[int, Field(ge=0)] = 0
    """Skip rule, any method: a prompt whose last ``skip_after`` or more visits in a row gave zero
    advantage is skipped (0 responses) with a probability growing with that streak (0: off)."""
    skip_max: Annotated[float, Field(ge=0, lt=1)] = 0.75
    """Most a prompt is ever skipped with: 1 − skip_max is the least chance it is re-checked."""
    skip_budget: SkipBudget = "respend"
    """What a skipped prompt's share of the budget does: respend (to the other prompts of the
    batch, so the allocation sums to the budget) or save (nobody gets it: the batch's budget
    shrinks by the skipped prompts' share, ⌊T·(N − S)/N⌋ is spent, and the worker moves on)."""

    @model_validator(mode="after")
    def _bounds(self) -> AllocationParams:
        p = self.key_prefix
        if self.n_min > self.n_max:
            raise ValueError(f"{p}n_min ({self.n_min}) must be <= {p}n_max ({self.n_max})")
        if self.hopeless_after and self.hopeless_n > self.n_min:
            raise ValueError(
                f"{p}hopeless_n ({self.hopeless_n}) must be <= {p}n_min ({self.n_min}) "
                f"when {p}hopeless_after is on"
            )
        return self

    def with_overrides(self, overrides: Mapping[str, Any]) -> AllocationParams:
        """These parameters with ``overrides`` in place of some, validated as a whole.

        Raises :class:`InvalidParams` naming each bad field (``n_min: must be >= 0, got -1``).
        Works on any subclass (the config): the result is a plain ``AllocationParams``.
        """
        merged = {name: getattr(self, name) for name in AllocationParams.model_fields}
        merged.update(overrides)
        try:
            return AllocationParams.model_validate(merged)
        except ValidationError as e:
            raise InvalidParams("; ".join(_describe(err) for err in e.errors())) from None


CONFIG_ONLY: tuple[str, ...] = (
    "hopeless_after",
    "hopeless_n",
    "method",
    "grad_half_life",
    "skip_after",
    "skip_max",
    "skip_budget",
)
"""Parameters only the server's config sets: no request field carries them."""

REQUEST_FIELDS: tuple[str, ...] = tuple(
    name for name in AllocationParams.model_fields if name not in CONFIG_ONLY
)
"""Parameters an ``Allocate`` request may set, each a field of ``AllocateRequest``."""


def _bounds_text(info: FieldInfo) -> str:
    """A field's numeric domain as text: ">= 0", "in (0, 1]"."""
    low = high = None
    for m in info.metadata:
        if isinstance(m, Ge):
            low = f"[{m.ge}"
        elif isinstance(m, Gt):
            low = f"({m.gt}"
        elif isinstance(m, Le):
            high = f"{m.le}]"
        elif isinstance(m, Lt):
            high = f"{m.lt})"
    if low and high:
        return f"in {low}, {high}"
    if low:
        return f"{'>=' if low[0] == '[' else '>'} {low[1:]}"
    if high:
        return f"{'<=' if high[-1] == ']' else '<'} {high[:-1]}"
    return "valid"


def _describe(err: Mapping[str, Any]) -> str:
    """One pydantic error in the words of the service's other errors."""
    if not err["loc"]:  # a cross-field check: its message names the fields already
        return str(err["ctx"]["error"]) if "ctx" in err else str(err["msg"])
    name = str(err["loc"][0])
    value = err.get("input")
    if err["type"] == "literal_error":
        allowed = get_args(AllocationParams.model_fields[name].annotation)
        return f"{name}: {value!r} is not one of {', '.join(allowed)}"
    info = AllocationParams.model_fields.get(name)
    if info is not None and err["type"] in {
        "greater_than",
        "greater_than_equal",
        "less_than",
        "less_than_equal",
    }:
        return f"{name}: must be {_bounds_text(info)}, got {value}"
    return f"{name}: {err['msg']}, got {value!r}"
