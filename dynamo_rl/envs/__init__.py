"""Multi-turn environments (``rollout.env``): the interface, the registry, the built-ins, the
tool-call parsers and the sandbox client. Torch-free. See ``docs/agents.md``."""

from __future__ import annotations

from dynamo_rl.envs.base import (
    ENVIRONMENTS,
    EnvContext,
    Environment,
    EnvUnavailable,
    Message,
    Step,
    ToolCallRecord,
    env_names,
    make_env,
    register_env,
)
from dynamo_rl.envs.builtin import TOOL_FUNCTIONS, register_tool
from dynamo_rl.envs.parsers import TOOL_PARSERS, register_parser

__all__ = [
    "ENVIRONMENTS",
    "TOOL_FUNCTIONS",
    "TOOL_PARSERS",
    "EnvContext",
    "EnvUnavailable",
    "Environment",
    "Message",
    "Step",
    "ToolCallRecord",
    "env_names",
    "make_env",
    "register_env",
    "register_parser",
    "register_tool",
]
