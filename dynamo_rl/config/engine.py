"""The embedded inference engine's section."""

from __future__ import annotations

from dynamo_rl.config.base import Section
from dynamo_rl.config.common import Host, Port


class EngineConfig(Section):
    host: Host = "127.0.0.1"
    port: Port = 8000
    model: str | None = None
    """Hugging Face model directory to serve."""
