"""Multi-turn environments (``rollout.env``): the interface, the registry, the built-ins, the
tool-call parsers and the sandbox client. Torch-free. See ``docs/agents.md``.

Importing this package registers the built-ins (:mod:`dynamo_rl.envs.builtin` imports the
interface of :mod:`dynamo_rl.envs.base`, never the other way round). :func:`check_env_config` is
the check of ``rollout.env`` against the registries, run by whoever builds environments (the
rollout worker, ``dynamo-rl eval``, the task generators); the config itself checks only what needs
no registry.
"""

from __future__ import annotations

import importlib

from dynamo_rl.config.rollout import EnvConfig
from dynamo_rl.envs import base
from dynamo_rl.envs.base import *  # noqa: F403  (the interface and registry: base.__all__)
from dynamo_rl.envs.base import env_names
from dynamo_rl.envs.builtin import TOOL_FUNCTIONS, register_tool
from dynamo_rl.envs.parsers import TOOL_PARSERS, register_parser

__all__ = [
    *base.__all__,
    "TOOL_FUNCTIONS",
    "TOOL_PARSERS",
    "VERIFIERS",
    "check_env_config",
    "register_parser",
    "register_tool",
]


VERIFIERS = "verifiers"
"""``rollout.env.name`` of a ``verifiers`` environment (``rollout.env.verifiers``): not in the
registry, since the library plays its own turns (``services.rollout.verifiers_env``); only the
rollout worker plays it."""


def check_env_config(cfg: EnvConfig, verifiers: bool = False) -> None:
    """Import ``rollout.env.import_module`` (it registers environments), then check the
    environment name, the tool parser and the tools against what is registered; ``verifiers``:
    the caller plays ``rollout.env.name`` :data:`VERIFIERS` too. Raises ValueError naming the
    field and the allowed values."""
    if cfg.import_module:
        try:
            importlib.import_module(cfg.import_module)
        except ImportError as e:
            raise ValueError(f"rollout.env.import_module {cfg.import_module!r}: {e}") from None
    names = env_names() + ([VERIFIERS] if verifiers else [])
    if cfg.name == VERIFIERS and not verifiers:
        raise ValueError(
            f"rollout.env.name {VERIFIERS!r} is played by the rollout worker and eval only; here "
            f"it must be one of {names}"
        )
    if cfg.name not in names:
        raise ValueError(f"rollout.env.name must be one of {names}, got {cfg.name!r}")
    if cfg.tool_parser not in TOOL_PARSERS:
        raise ValueError(
            f"rollout.env.tool_parser must be one of {sorted(TOOL_PARSERS)}, "
            f"got {cfg.tool_parser!r}"
        )
    for i, t in enumerate(cfg.tools):
        name = t["function"]["name"]  # the shape is the config's own check
        if name not in TOOL_FUNCTIONS:
            raise ValueError(
                f"rollout.env.tools[{i}]: no implementation of tool {name!r}; "
                f"allowed: {sorted(TOOL_FUNCTIONS)}"
            )
