"""What the allocator's service tests share: an in-process server over real Redis, and its
request counter."""

from __future__ import annotations

from allocator.metrics import AllocatorMetrics
from allocator.server import RunningServer, start_server
from allocator.stats import StatsStore
from dynamo_rl.config import AllocatorConfig


def start_allocator(
    redis_url: str, control_token: str | None = None, **cfg: object
) -> RunningServer:
    """A real gRPC server on a free port, with ``cfg`` as its allocator section."""
    config = AllocatorConfig(port=0, **cfg)  # type: ignore[arg-type]
    store = StatsStore.from_url(
        redis_url, decay=config.decay, timeout_s=1.0, half_life=config.stats_half_life
    )
    return start_server(
        config, store, AllocatorMetrics(), control_token=control_token, ping_interval_s=0.2
    )


def requests_total(server: RunningServer, method: str, code: str) -> float:
    value = server.service.m.metrics.registry.get_sample_value(
        "dynamo_allocator_requests_total", {"method": method, "code": code}
    )
    return value or 0.0
