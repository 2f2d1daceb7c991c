"""The allocator service's section."""

from __future__ import annotations

from dynamo_rl.config.base import Section
from dynamo_rl.config.common import Host, Port


class AllocatorConfig(Section):
    host: Host = "127.0.0.1"
    port: Port = 50051
    metrics_port: Port = 9101
    """Prometheus /metrics port (0: a free port)."""
