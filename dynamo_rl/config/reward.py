"""The reward service's section."""

from __future__ import annotations

from dynamo_rl.config.base import Section
from dynamo_rl.config.common import Host, Port


class RewardConfig(Section):
    host: Host = "127.0.0.1"
    port: Port = 8080
