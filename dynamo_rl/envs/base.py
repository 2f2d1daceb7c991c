"""The environment interface of multi-turn episodes, and the registry of environments by name.

An episode is one conversation between the policy and an :class:`Environment`:

1. ``await env.reset(row)`` returns the first messages (chat messages, ``role`` and
   ``content``) from a dataset row;
2. the rollout loop samples the model's turn and calls ``await env.step(turn)`` with its text,
   which returns a :class:`Step` — the observation messages to append, an optional reward for this
   turn, whether the episode is done, and ``info`` (tool calls made, their errors);
3. until ``done`` or a limit of ``rollout.env`` ends the episode (``docs/agents.md``).

Environments are registered by name with :func:`register_env` and built per episode by
:func:`make_env` from ``rollout.env``; they import no torch and no tokenizer: the rollout
pipeline turns messages into tokens.

**Single-turn shape.** An environment whose class sets ``multi_turn = False`` (the built-in
``single_turn``) plays episodes of one model turn that keep today's single-turn trajectories: the
first prompt is the row's prompt as the dataset renders it (text used verbatim, chat messages
through the template, cut by ``rollout.prompt_len_policy``), and the response is the engine's
sample as it came (its text, no loss mask, no turns), scored on the engine's text. The pipeline
reads this attribute; it never looks at an environment's name.

This module is the interface and the registry only; :mod:`dynamo_rl.envs.builtin` registers the
built-ins when :mod:`dynamo_rl.envs` is imported.
"""

from __future__ import annotations

import abc
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any, ClassVar, NamedTuple

from dynamo_rl.config.rollout import EnvConfig

__all__ = [
    "ENVIRONMENTS",
    "EnvContext",
    "EnvUnavailable",
    "Environment",
    "Message",
    "Step",
    "ToolCallRecord",
    "env_names",
    "make_env",
    "register_env",
]

Message = dict[str, str]


class EnvUnavailable(RuntimeError):
    """A service the environment depends on (the sandbox) stayed down past its retries: the
    rollout loop drops the episode and counts it."""


@dataclass
class ToolCallRecord:
    """One tool call of a turn, as ``info["tool_calls"]`` lists them."""

    name: str
    arguments: str = ""
    """The call's arguments (JSON text, or the code of a code cell)."""
    error: str = ""
    """Empty when the call ran; else why not (``malformed: …``, ``timeout``, ``unknown tool``,
    ``bad arguments: …``)."""
    latency_s: float = 0.0
    malformed: bool = False
    """The model's call could not be parsed (counted, and penalised with
    ``rollout.env.malformed_penalty``)."""


class Step(NamedTuple):
    """What :meth:`Environment.step` returns (a tuple: ``obs, reward, done, info = step``)."""

    observation: list[Message]
    reward: float | None = None
    done: bool = False
    info: dict[str, Any] = {}


class Environment(abc.ABC):
    """One episode's environment (built per episode: state lives in the instance)."""

    multi_turn: ClassVar[bool] = True
    """False: one model turn in the single-turn shape (see the module docstring)."""

    @abc.abstractmethod
    async def reset(self, row: Mapping[str, Any]) -> list[Message]:
        """The first messages of the episode for a dataset row (``prompt`` is the row's prompt,
        text or chat messages; ``ground_truth``, ``data_source`` and the row's extra fields)."""

    @abc.abstractmethod
    async def step(self, turn: str) -> Step:
        """React to the model's turn (its text): observation messages, reward, done, info."""

    async def aclose(self) -> None:  # noqa: B027 (optional hook: most environments hold nothing)
        """Release what the episode holds (called once, whatever ended it)."""


@dataclass
class EnvContext:
    """What the rollout worker hands every environment it builds."""

    config: EnvConfig
    """``rollout.env``."""
    sandbox: Any | None = None
    """A :class:`dynamo_rl.envs.sandbox.SandboxClient` (shared by the worker's episodes), or
    None when no sandbox URL is known."""
    seed: int | None = None
    """A per-episode seed (None: unseeded)."""
    extra: dict[str, Any] = field(default_factory=dict)


EnvFactory = Callable[[EnvContext], Environment]
ENVIRONMENTS: dict[str, EnvFactory] = {}
"""Environment factories by name (``rollout.env.name``)."""


def register_env(name: str) -> Callable[[EnvFactory], EnvFactory]:
    """Register a factory (or an :class:`Environment` subclass taking an :class:`EnvContext`)
    under ``name``; a second registration of a name is an error."""

    def deco(factory: EnvFactory) -> EnvFactory:
        if name in ENVIRONMENTS and ENVIRONMENTS[name] is not factory:
            raise ValueError(f"environment {name!r} is already registered")
        ENVIRONMENTS[name] = factory
        return factory

    return deco


def env_names() -> list[str]:
    """Registered names (the built-ins once :mod:`dynamo_rl.envs` is imported)."""
    return sorted(ENVIRONMENTS)


def make_env(ctx: EnvContext) -> Environment:
    """A fresh environment for one episode, by ``ctx.config.name``."""
    name = ctx.config.name
    if name not in ENVIRONMENTS:
        raise ValueError(
            f"rollout.env.name: unknown environment {name!r}; registered: {env_names()}"
        )
    return ENVIRONMENTS[name](ctx)
