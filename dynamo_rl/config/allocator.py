"""The allocator service's section: where it listens, the allocation defaults a request may
override, how statistics are kept in Redis, and the limits that protect the server."""

from __future__ import annotations

from typing import Annotated, Literal

from pydantic import Field, model_validator

from dynamo_rl.config.base import Section
from dynamo_rl.config.common import Host, Port


class AllocatorConfig(Section):
    host: Host = "127.0.0.1"
    """Address the gRPC server binds (0.0.0.0 in a container)."""
    port: Port = 50051
    """gRPC port (0: a free port, printed on start)."""
    metrics_port: Port = 9101
    """Prometheus /metrics port (0: a free port)."""

    # Allocation defaults; every one can be overridden per Allocate request.
    n_per_prompt: Annotated[int, Field(ge=1)] = 16
    """Budget per prompt when a request gives neither budget nor n_per_prompt (uniform GRPO's n)."""
    n_min: Annotated[int, Field(ge=0)] = 4
    """Fewest responses any prompt gets."""
    n_max: Annotated[int, Field(ge=1)] = 24
    """Most responses any prompt gets."""
    initial_budget: Annotated[int, Field(ge=0)] = 8
    """Samples a prompt needs before its success rate is trusted; until then it is explored."""
    mastery_threshold: Annotated[float, Field(gt=0, le=1)] = 0.85
    """Success rate at or above which a prompt counts as mastered (priority = min_priority)."""
    min_priority: Annotated[float, Field(ge=0, le=1)] = 0.01
    """Floor of every explored prompt's priority."""
    priority: Literal["variance", "std"] = "variance"
    """Priority from the success statistics: the Bernoulli variance (the authors' code) or its
    square root (the theory's optimum n ∝ σ)."""
    scheme: Literal["reference", "water-level"] = "reference"
    """reference: n_min plus a share proportional to priority (the authors' code); water-level:
    n = clip(λ·priority, n_min, n_max), the bounded optimum of Σσ²/n when priority is std."""

    hopeless_after: Annotated[int, Field(ge=0)] = 0
    """Samples after which a prompt with no success (k < 0.5) counts as hopeless and gets only
    ``hopeless_n`` responses, its n_min - hopeless_n going to the others (0: off)."""
    hopeless_n: Annotated[int, Field(ge=0)] = 1
    """Responses a hopeless prompt gets (at most n_min; >= 1 keeps its statistics fresh)."""

    # Statistics.
    decay: Annotated[float, Field(gt=0, le=1)] = 1.0
    """Multiplies a prompt's old counts each time new outcomes for it arrive (1: keep the whole
    history, as the reference does; < 1 forgets, so a since-mastered prompt stops looking
    half-solved). Keep attempts/(1 - decay) >= initial_budget or prompts never leave exploration."""

    # Limits.
    max_prompts_per_request: Annotated[int, Field(ge=1)] = 65536
    """Most prompt ids (or outcomes) one request may carry; more is INVALID_ARGUMENT."""
    redis_timeout_s: Annotated[float, Field(gt=0)] = 2.0
    """Socket timeout of every Redis call; past it the request fails with UNAVAILABLE."""

    @model_validator(mode="after")
    def _bounds(self) -> AllocatorConfig:
        if self.n_min > self.n_max:
            raise ValueError(
                f"allocator.n_min ({self.n_min}) must be <= allocator.n_max ({self.n_max})"
            )
        if self.hopeless_after and self.hopeless_n > self.n_min:
            raise ValueError(
                f"allocator.hopeless_n ({self.hopeless_n}) must be <= allocator.n_min "
                f"({self.n_min}) when allocator.hopeless_after is on"
            )
        return self
