"""The rollout worker's section."""

from __future__ import annotations

from dynamo_rl.config.base import Section
from dynamo_rl.config.common import Port


class RolloutConfig(Section):
    metrics_port: Port = 9102
    """Prometheus /metrics port (0: a free port)."""
