"""Sections every service reads: the run itself and where the services are."""

from __future__ import annotations

from typing import Annotated, Literal

from pydantic import Field, SecretStr

from dynamo_rl.config.base import Section

Port = Annotated[int, Field(ge=0, le=65535, description="TCP port; 0 picks a free one")]
Host = Annotated[str, Field(min_length=1, description="address to bind")]


class HistoryConfig(Section):
    """Each service's metrics, appended to the run folder while it runs
    (``<run.dir>/metrics/<service>-<instance>.jsonl``; see :class:`dynamo_rl.metrics.History`)."""

    interval_s: Annotated[float, Field(ge=0)] = 5.0
    """Seconds between snapshots of a service's metrics (0: no history is written)."""
    max_mb: Annotated[float, Field(gt=0)] = 16.0
    """Size bound of one service's file: past it, every other snapshot is dropped and the
    interval doubles (the file keeps spanning the whole run, more coarsely)."""


class RunConfig(Section):
    name: Annotated[str, Field(min_length=1, pattern=r"^[A-Za-z0-9_.-]+$")] = "dynamo"
    """Experiment name: the allocator namespace, stream names and run folder derive from it."""
    seed: int = 0
    """Seed for every random generator of every service."""
    dir: str = "runs/{name}"
    """Run folder (logs, checkpoints, metrics); ``{name}`` is replaced by the run name."""
    log_level: Literal["debug", "info", "warning", "error"] = "info"
    history: HistoryConfig = HistoryConfig()
    """Run-folder time series of every service (the dashboard reads them after the run)."""

    @property
    def run_dir(self) -> str:
        return self.dir.format(name=self.name)


class EndpointsConfig(Section):
    """Addresses of the shared services; usually set from the environment (see ENV_VARS)."""

    redis_url: str = "redis://127.0.0.1:6379/0"
    """Redis holding statistics, the trajectory stream and the weight version (REDIS_URL)."""
    allocator_addr: str = "127.0.0.1:50051"
    """host:port of the allocator's gRPC server (ALLOCATOR_ADDR)."""
    reward_url: str = "http://127.0.0.1:8080"
    """Base URL of the reward service (REWARD_URL)."""
    engine_urls: list[str] = ["http://127.0.0.1:8000"]
    """Base URLs of the inference engine replicas (ENGINE_URLS, comma-separated)."""
    control_token: SecretStr | None = None
    """Bearer token for control endpoints (weight updates, stats reset) (DYNAMO_CONTROL_TOKEN)."""
