"""verifiers environments played against our engine, token in and token out (``docs/agents.md``).

An environment module of PyPI ``verifiers`` (:data:`VERIFIERS_VERSION`, its classic API: a module
exposing ``load_environment(**args)`` that returns a ``vf.SingleTurnEnv``, ``vf.MultiTurnEnv`` or
another ``vf.Environment`` with a dataset and a ``vf.Rubric``) is loaded by
:func:`load_verifiers_env`, from an installed package or a local ``.py`` file. Its dataset gives
the prompts (:func:`verifiers_rows`); its own protocol (``env.rollout``) plays the turns against
our engine through the OpenAI-compatible ``POST /v1/chat/completions``, asked for vLLM's
``return_token_ids`` and log-probs (:func:`chat_client`, :func:`sampling_args`); its rubric gives
the reward. The library's code runs as it is: nothing of it is re-implemented here. The rollout
worker plays it with ``rollout.env.name: verifiers`` (:mod:`services.rollout.verifiers_worker`:
the prompts, the allocator's counts, the stream and the drop counter).

The rules (:func:`assemble_segments`):

1. the learner trains the token ids the engine sampled, as it sampled them: each model turn's
   ``token_ids`` with their log-probs, loss mask 1. Nothing of the conversation is re-tokenised;
2. the engine answers every turn with the prompt ids it sampled after (``prompt_token_ids``).
   The first turn's prompt is the sample's prompt; a later turn's prompt must extend everything
   so far (prompt and turns) and what it adds -- the environment's messages and the template's
   markers around them -- is appended with loss mask 0 (log-prob 0). A prompt that does not extend
   it (the engine re-tokenised the conversation's text differently from the sampled ids, or a
   template dropped earlier ``<think>`` blocks) starts a new sample from that prompt: a **fork**,
   counted, the episode's reward on every sample; what the model sampled is never re-tokenised;
3. a turn the engine answered without token ids or log-probs drops the episode
   (``no_token_ids``), since what was sampled is then unknown.

Bad input never stops the run: an environment whose protocol raises or records an error
(``env_error``), a rubric whose reward function raises or gives no finite number -- which the
library logs and scores 0.0; we read its log (``rubric_error``) -- drop that
episode, counted by reason in :class:`Drops` and logged with the field at fault; the others go on.

Simplified: group-level reward functions (``Rubric.score_group``) are not called, each episode is
scored on its own with ``Rubric.score_rollout``. Every turn is sampled from the conversation's
messages (verifiers' plain chat client), so the engine renders and tokenises earlier turns again
and a byte-level tokenizer forks often; sending the token ids kept so far instead (vLLM's
``/v1/chat/completions/tokens``) is not served by our engine yet.
"""

from __future__ import annotations

import importlib
import importlib.util
import logging
import math
import sys
from collections import Counter
from collections.abc import Callable, Mapping, Sequence
from contextvars import ContextVar
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from dynamo_rl.codec import Response, Turn

__all__ = [
    "DROP_REASONS",
    "VERIFIERS_VERSION",
    "Drops",
    "EpisodeDropped",
    "Segment",
    "VerifiersConfigError",
    "VerifiersEpisode",
    "assemble_segments",
    "chat_client",
    "load_verifiers_env",
    "play_verifiers_episode",
    "play_verifiers_group",
    "sampling_args",
    "verifiers_rows",
]

log = logging.getLogger(__name__)

VERIFIERS_VERSION = "0.2.1"
"""The ``verifiers`` release whose environment API this module plays (pinned in pyproject)."""
DROP_REASONS = ("env_error", "rubric_error", "no_token_ids")


class VerifiersConfigError(ValueError):
    """An environment that cannot be loaded; ``field`` names the setting at fault."""

    def __init__(self, field: str, message: str) -> None:
        super().__init__(f"{field}: {message}")
        self.field = field


class EpisodeDropped(Exception):
    """One episode that gives no training sample; ``reason`` is one of :data:`DROP_REASONS`,
    ``field`` what was at fault."""

    def __init__(self, reason: str, field: str, message: str) -> None:
        super().__init__(f"{reason}: {field}: {message}")
        self.reason = reason
        self.field = field


@dataclass
class Drops:
    """Dropped episodes by reason (:data:`DROP_REASONS`), each logged once as it happens."""

    counts: Counter[str] = field(default_factory=Counter)
    forks: int = 0
    """Samples started anew within kept episodes (rule 2)."""
    about: str = ""
    """What the episodes are of, for the log (the worker: ``prompt <id>``)."""

    def add(self, err: EpisodeDropped) -> None:
        self.counts[err.reason] += 1
        of = f" of {self.about}" if self.about else ""
        log.warning("verifiers episode%s dropped (%s)", of, err)

    @property
    def total(self) -> int:
        return sum(self.counts.values())


def load_verifiers_env(module: str, args: Mapping[str, Any] | None = None) -> Any:
    """The environment ``load_environment(**args)`` of ``module`` returns: an importable module
    name (an installed environment package) or the path of a ``.py`` file."""
    import verifiers as vf

    where = "module"
    try:
        if module.endswith(".py"):
            path = Path(module)
            if not path.is_file():
                raise VerifiersConfigError(where, f"no file {module!r}")
            name = f"_verifiers_env_{path.stem}"
            spec = importlib.util.spec_from_file_location(name, path)
            assert spec is not None and spec.loader is not None
            mod = importlib.util.module_from_spec(spec)
            sys.modules[name] = mod
            spec.loader.exec_module(mod)
        else:
            mod = importlib.import_module(module)
    except VerifiersConfigError:
        raise
    except Exception as e:  # an import error, or the module's own
        raise VerifiersConfigError(where, f"cannot import {module!r}: {e!r}") from e
    load = getattr(mod, "load_environment", None)
    if not callable(load):
        raise VerifiersConfigError(where, f"{module!r} has no load_environment()")
    try:
        env = load(**dict(args or {}))
    except Exception as e:
        raise VerifiersConfigError(
            "args", f"load_environment({dict(args or {})!r}) raised {e!r}"
        ) from e
    if not isinstance(env, vf.Environment):
        raise VerifiersConfigError(
            where, f"load_environment() returned {type(env).__name__}, not a verifiers Environment"
        )
    return env


def verifiers_rows(env: Any, n: int = -1) -> list[dict[str, Any]]:
    """The environment's dataset rows as its protocol takes them (``prompt`` as chat messages,
    ``answer``, ``info``, ``example_id``, ``task``); ``n`` first rows (-1: all)."""
    return [dict(row) for row in env.get_dataset(n=n)]


def chat_client(base_url: str) -> Any:
    """verifiers' own chat-completions client on one of our engines (``base_url`` without
    ``/v1``); no retries: a failed turn is the episode's error."""
    from openai import AsyncOpenAI
    from verifiers.clients import OpenAIChatCompletionsClient

    return OpenAIChatCompletionsClient(
        AsyncOpenAI(base_url=f"{base_url.rstrip('/')}/v1", api_key="unused", max_retries=0)
    )


def sampling_args(
    max_tokens: int, temperature: float = 1.0, top_p: float = 1.0, seed: int | None = None
) -> dict[str, Any]:
    """Per-turn sampling of the chat requests, with the sampled token ids and their log-probs
    asked for (vLLM's ``return_token_ids``, which our engine serves)."""
    out: dict[str, Any] = {
        "max_tokens": max_tokens,
        "temperature": temperature,
        "top_p": top_p,
        "logprobs": True,
        "extra_body": {"return_token_ids": True},
    }
    if seed is not None:
        out["seed"] = seed
    return out


@dataclass
class Segment:
    """One training sample of an episode: the prompt the engine sampled its first turn after,
    then every token after it (the model's turns, mask 1, the environment's tokens between them,
    mask 0)."""

    prompt_ids: list[int]
    token_ids: list[int] = field(default_factory=list)
    logprobs: list[float] = field(default_factory=list)
    loss_mask: list[int] = field(default_factory=list)
    turns: list[Turn] = field(default_factory=list)


@dataclass
class VerifiersEpisode:
    """One scored episode: its samples (more than one when it forked, rule 2) and its reward."""

    segments: list[Segment]
    reward: float
    metrics: dict[str, float]
    finish_reason: str
    text: str

    @property
    def forks(self) -> int:
        return len(self.segments) - 1

    def responses(self, group_prompt: Sequence[int], episode: int = 0) -> list[Response]:
        """The stream's responses of this episode, one per segment, each with its mask and turns;
        ``prompt_token_ids`` set only on a segment whose prompt is not ``group_prompt``."""
        out = []
        for k, seg in enumerate(self.segments):
            own = [] if seg.prompt_ids == list(group_prompt) else seg.prompt_ids
            out.append(Response(
                token_ids=seg.token_ids, logprobs=seg.logprobs, reward=self.reward,
                correct=self.reward > 0, format_ok=True, finish_reason=self.finish_reason,
                reward_components=self.metrics, text=self.text if k == self.forks else "",
                loss_mask=seg.loss_mask, turns=seg.turns, prompt_token_ids=own,
                episode=episode, segment=k, end_reason="done",
            ))  # fmt: skip
        return out


def assemble_segments(steps: Sequence[Mapping[str, Any]]) -> list[Segment]:
    """An episode's samples from its turns' ``tokens`` (verifiers' trajectory steps:
    ``prompt_ids``, ``completion_ids``, ``completion_logprobs``), by the module's rules 1-3."""
    if not steps:
        raise EpisodeDropped("env_error", "state.trajectory", "the episode has no model turn")
    segments: list[Segment] = []
    for k, step in enumerate(steps):
        tokens = step.get("tokens")
        where = f"state.trajectory.{k}.tokens"
        if not tokens or tokens.get("completion_ids") is None:
            raise EpisodeDropped("no_token_ids", where, "the engine returned no token ids")
        turn_prompt = list(tokens["prompt_ids"])
        completion = list(tokens["completion_ids"])
        logprobs = [float(x) for x in tokens.get("completion_logprobs") or []]
        if len(logprobs) != len(completion):
            raise EpisodeDropped(
                "no_token_ids", where, f"{len(logprobs)} log-probs for {len(completion)} tokens"
            )
        seg = segments[-1] if segments else None
        so_far = seg.prompt_ids + seg.token_ids if seg else None
        if seg is not None and so_far is not None and turn_prompt[: len(so_far)] == so_far:
            between = turn_prompt[len(so_far) :]
            seg.token_ids += between
            seg.logprobs += [0.0] * len(between)
            seg.loss_mask += [0] * len(between)
            seg.turns[-1].observation_end = len(seg.token_ids)
        else:  # the first turn, or a fork
            seg = Segment(prompt_ids=turn_prompt)
            segments.append(seg)
        start = len(seg.token_ids)
        seg.token_ids += completion
        seg.logprobs += logprobs
        seg.loss_mask += [1] * len(completion)
        seg.turns.append(
            Turn(start=start, end=len(seg.token_ids), observation_end=start + len(completion))
        )
    return segments


_scoring: ContextVar[list[str] | None] = ContextVar("verifiers_scoring", default=None)


class _RewardFunctionErrors(logging.Handler):
    """The errors the library logs while it scores the current task's episode: a reward
    function that raises or returns no number is logged there and counted as 0.0, which must not
    be trained as a real score."""

    def emit(self, record: logging.LogRecord) -> None:
        errors = _scoring.get()
        if errors is not None and record.levelno >= logging.ERROR:
            errors.append(record.getMessage())


async def _score(env: Any, state: Any) -> None:
    rubric_log = logging.getLogger("verifiers.rubrics.rubric")  # every Rubric's logs pass here
    if not any(isinstance(h, _RewardFunctionErrors) for h in rubric_log.handlers):
        rubric_log.addHandler(_RewardFunctionErrors())
    errors: list[str] = []
    token = _scoring.set(errors)
    try:
        await env.rubric.score_rollout(state)
    except Exception as e:
        raise EpisodeDropped("rubric_error", "env.rubric", repr(e)) from e
    finally:
        _scoring.reset(token)
    if errors:
        raise EpisodeDropped("rubric_error", "env.rubric", "; ".join(errors))


def _finite_reward(state: Mapping[str, Any]) -> float:
    reward = state.get("reward")
    if isinstance(reward, bool) or not isinstance(reward, (int, float)):
        raise EpisodeDropped("rubric_error", "state.reward", f"is not a number: {reward!r}")
    if not math.isfinite(reward):
        raise EpisodeDropped("rubric_error", "state.reward", f"is not finite: {reward!r}")
    return float(reward)


def _metrics(state: Mapping[str, Any]) -> dict[str, float]:
    out = {}
    for k, v in (state.get("metrics") or {}).items():
        if isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v):
            out[str(k)] = float(v)
    return out


async def play_verifiers_episode(
    env: Any, row: Mapping[str, Any], client: Any, model: str, sampling: Mapping[str, Any]
) -> VerifiersEpisode:
    """One episode of ``row`` by the environment's own protocol and rubric
    (:class:`EpisodeDropped` when it gives no sample)."""
    try:
        state = await env.rollout(dict(row), client, model, dict(sampling))
    except Exception as e:
        raise EpisodeDropped("env_error", "env.rollout", repr(e)) from e
    if state.get("error") is not None:
        raise EpisodeDropped("env_error", "state.error", repr(state["error"]))
    steps = state.get("trajectory") or []
    segments = assemble_segments(steps)
    await _score(env, state)
    reward = _finite_reward(state)
    last = steps[-1]
    response = last.get("response")
    finish = getattr(getattr(response, "message", None), "finish_reason", None) or "stop"
    completion = last.get("completion") or []
    text = str(getattr(completion[-1], "content", "") or "") if completion else ""
    return VerifiersEpisode(
        segments=segments,
        reward=reward,
        metrics=_metrics(state),
        finish_reason=str(finish),
        text=text,
    )


async def play_verifiers_group(
    env: Any,
    row: Mapping[str, Any],
    client: Any,
    model: str,
    sampling: Mapping[str, Any],
    n: int,
    drops: Drops,
    seed_of: Callable[[int], int | None] | None = None,
) -> list[VerifiersEpisode]:
    """``n`` episodes of one row, concurrently; the dropped ones counted in ``drops``.
    ``seed_of(j)``: episode ``j``'s sampling seed in place of ``sampling``'s (the same seed for
    every episode would give every episode the same turns)."""
    import asyncio

    def episode_sampling(j: int) -> Mapping[str, Any]:
        if seed_of is None or (seed := seed_of(j)) is None:
            return sampling
        return {**sampling, "seed": seed}

    results = await asyncio.gather(
        *(play_verifiers_episode(env, row, client, model, episode_sampling(j)) for j in range(n)),
        return_exceptions=True,
    )
    kept = []
    for r in results:
        if isinstance(r, EpisodeDropped):
            drops.add(r)
        elif isinstance(r, BaseException):
            raise r
        else:
            drops.forks += r.forks
            kept.append(r)
    return kept
