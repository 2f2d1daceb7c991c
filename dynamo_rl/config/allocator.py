"""The allocator section: the run's allocation parameters, where the allocator server listens,
how statistics are kept in Redis, and the limits that protect the server.

The allocation parameters are the fields of :class:`dynamo_rl.contracts.allocator.AllocationParams`
(the one declaration of those parameters, shared with the server, the algorithm, the client and the
rollout worker): ``allocator.n_per_prompt``, ``allocator.n_min`` and the rest are that model's
fields, with its bounds and checks, and nowhere else declared. The rollout worker reads its budget
and bounds here (``rollout.n``, ``rollout.n_min`` and ``rollout.n_max`` are accepted spellings of
the same three keys: :data:`dynamo_rl.config.ALIASES`)."""

from __future__ import annotations

from typing import Annotated, ClassVar

from pydantic import ConfigDict, Field, model_validator

from dynamo_rl.config.base import Section
from dynamo_rl.config.common import Host, Port
from dynamo_rl.contracts.allocator import AllocationParams


class AllocatorConfig(Section, AllocationParams):
    # A section is edited in place (overrides, tests); the parameters alone are frozen.
    model_config = ConfigDict(frozen=False)
    key_prefix: ClassVar[str] = "allocator."

    host: Host = "127.0.0.1"
    """Address the gRPC server binds (0.0.0.0 in a container)."""
    port: Port = 50051
    """gRPC port (0: a free port, printed on start)."""
    metrics_port: Port = 9101
    """Prometheus /metrics port (0: a free port)."""

    # Statistics.
    decay: Annotated[float, Field(gt=0, le=1)] = 1.0
    """Multiplies a prompt's old counts each time new outcomes for it arrive (1: keep the whole
    history, as the reference does; < 1 forgets, so a since-mastered prompt stops looking
    half-solved). Keep attempts/(1 - decay) >= initial_budget or prompts never leave exploration."""
    stats_half_life: Annotated[float, Field(gt=0)] | None = None
    """Weight versions after which a prompt's earlier visits count half, in its success counts and
    in the learner's gradient statistics (which the learner writes with this section's value):
    a visit's statistics are added to the old ones times 0.5^(Δversion/stats_half_life), applied
    atomically when the visit is written. None: success counts fade only by ``decay`` (per
    report) and the gradient statistic is the last visit's alone."""

    allow_token_mean: bool = False
    """Let ``rollout.allocation: dynamic`` run with ``learner.algorithm.agg: token-mean``, which
    the config refuses otherwise: under token-mean a prompt's weight grows with its responses, and
    every allocator measured raised the batch gradient's error (1.13-2.51x uniform's)."""

    # Limits.
    max_prompts_per_request: Annotated[int, Field(ge=1)] = 65536
    """Most prompt ids (or outcomes) one request may carry; more is INVALID_ARGUMENT."""
    redis_timeout_s: Annotated[float, Field(gt=0)] = 2.0
    """Socket timeout of every Redis call; past it the request fails with UNAVAILABLE."""

    @model_validator(mode="after")
    def _mean_within_bounds(self) -> AllocatorConfig:
        # Not a check of AllocationParams itself: a request's n_per_prompt outside the bounds is
        # clipped (the budget is), while a run whose mean lies outside them is a config mistake.
        if not self.n_min <= self.n_per_prompt <= self.n_max:
            raise ValueError(
                "allocator.n_min <= allocator.n_per_prompt <= allocator.n_max must hold, got "
                f"{self.n_min} <= {self.n_per_prompt} <= {self.n_max} (rollout.n_min, rollout.n "
                "and rollout.n_max are the same keys)"
            )
        return self
