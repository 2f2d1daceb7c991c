"""What the rollout worker and ``dynamo-rl eval`` build alike from the config, before any batch.

- :func:`prepare_prompts` renders the prompts with the tokenizer (:func:`load_tokenizer`) exactly
  as the learner's warm start does, applies the length policy
  (:func:`~services.rollout.datasets.check_prompt_lengths`) with the limit :func:`prompt_limit`
  resolves (``rollout.max_prompt_len``, default: the model's context minus
  ``sampling.max_tokens``), and resolves the episode token budget from it
  (:func:`episode_limits`);
- :func:`sampling_of` gives a request's sampling settings: ``rollout.sampling``, with eval's own
  temperature and seed;
- :func:`make_engine_factory` builds an engine client from ``rollout``'s protocol settings;
- :func:`make_sandbox` the ``/run_code`` client of environments that run code;
- :func:`make_reward_client` the reward service's client, its retries counted;
- :func:`short_error` a failure in one line (a gRPC error's code and details) for the logs.

The generation itself is :mod:`services.rollout.pipeline`.
"""

from __future__ import annotations

import dataclasses
import functools
import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

from dynamo_rl.config import ExperimentConfig
from dynamo_rl.config.rollout import EnvConfig
from dynamo_rl.contracts.sampling import SamplingParams
from dynamo_rl.envs import ENVIRONMENTS, VERIFIERS
from dynamo_rl.envs.sandbox import SandboxClient
from services.rollout.datasets import (
    LengthCheck,
    PromptRecord,
    PromptRenderer,
    check_prompt_lengths,
)
from services.rollout.engines import Engine, make_engine
from services.rollout.metrics import WorkerMetrics
from services.rollout.reward_client import RewardClient

__all__ = [
    "episode_limits",
    "load_tokenizer",
    "make_engine_factory",
    "make_reward_client",
    "make_sandbox",
    "model_context",
    "prepare_prompts",
    "prompt_limit",
    "sampling_of",
    "short_error",
]


def load_tokenizer(path: str) -> Any:
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(path)


_CONTEXT_KEYS = ("max_position_embeddings", "n_positions", "max_sequence_length", "seq_length")


def model_context(model_dir: str | None) -> int | None:
    """The model's context in tokens, from ``config.json`` in its directory (what the embedded
    engine serves; a vLLM ``--max-model-len`` below it is not known here); None when unknown."""
    if not model_dir:
        return None
    try:
        config = json.loads((Path(model_dir) / "config.json").read_text())
    except (OSError, ValueError):
        return None
    for key in _CONTEXT_KEYS:
        if isinstance(config.get(key), int) and config[key] > 0:
            return int(config[key])
    return None


def prompt_limit(cfg: ExperimentConfig, model_dir: str | None) -> int | None:
    """``rollout.max_prompt_len``, or the model's context minus ``rollout.sampling.max_tokens``
    (None: neither is known, no limit). Raises ValueError when ``max_tokens`` leaves no room."""
    rc = cfg.rollout
    if rc.max_prompt_len is not None:
        return rc.max_prompt_len
    context = model_context(model_dir)
    if context is None:
        return None
    if context <= rc.sampling.max_tokens:
        raise ValueError(
            f"rollout.sampling.max_tokens ({rc.sampling.max_tokens}) leaves no room for a prompt "
            f"in the model's context of {context} tokens; lower it or set rollout.max_prompt_len"
        )
    return context - rc.sampling.max_tokens


def episode_limits(env: EnvConfig, prompt_limit: int | None, max_tokens: int) -> EnvConfig:
    """``rollout.env`` with its token budget resolved: ``max_episode_tokens`` as set, else the
    prompt limit + ``max_tokens`` (so a response to a prompt within the limit is never cut by
    the budget), else None (no budget)."""
    if env.max_episode_tokens is not None or prompt_limit is None:
        return env
    return env.model_copy(update={"max_episode_tokens": prompt_limit + max_tokens})


def prepare_prompts(
    cfg: ExperimentConfig, records: list[PromptRecord], tokenizer_dir: str
) -> tuple[PromptRenderer, LengthCheck, EnvConfig]:
    """The renderer, the prompts rendered and checked against the length limit (``rollout.
    prompt_len_policy``; DatasetError under ``error``), and ``rollout.env`` with its token budget
    resolved: what the worker and eval both do when the data loads."""
    rc = cfg.rollout
    renderer = PromptRenderer(load_tokenizer(tokenizer_dir), rc.prompt_template)
    limit = prompt_limit(cfg, tokenizer_dir)
    lengths = check_prompt_lengths(records, renderer, limit, rc.prompt_len_policy)
    return renderer, lengths, episode_limits(rc.env, limit, rc.sampling.max_tokens)


def sampling_of(
    s: SamplingParams, *, temperature: float | None = None, seed: int | None = None
) -> SamplingParams:
    """``rollout.sampling`` with ``temperature``/``seed`` in place of the config's when given
    (eval samples at its own temperature, seeded from ``run.seed``)."""
    return dataclasses.replace(
        s,
        temperature=s.temperature if temperature is None else temperature,
        seed=s.seed if seed is None else seed,
    )


def make_engine_factory(cfg: ExperimentConfig) -> Callable[[str], Engine]:
    """Engine clients for base URLs, speaking ``rollout.engine_api``/``weight_api``; with
    ``learner.lora`` on, requests name the newest adapter the engine serves."""
    rc = cfg.rollout
    token = cfg.endpoints.control_token.get_secret_value() if cfg.endpoints.control_token else None
    lora = cfg.learner.lora
    return functools.partial(
        make_engine, engine_api=rc.engine_api, weight_api=rc.weight_api, model=rc.model_name,
        timeout_s=rc.request_timeout_s, control_token=token,
        adapter=lora.name if lora.enabled else None,
        continue_aborted=rc.update_mode == "interrupt",
    )  # fmt: skip


def make_reward_client(cfg: ExperimentConfig, metrics: WorkerMetrics) -> RewardClient:
    """The reward service's client (``endpoints.reward_url``), each retry counted in
    ``metrics`` (``reward_retries`` and the ``reward`` wait)."""
    rc = cfg.rollout

    def reward_retried(_reason: str, seconds: float) -> None:
        metrics.reward_retries.inc()
        metrics.waited("reward", seconds)

    return RewardClient(
        cfg.endpoints.reward_url,
        timeout_s=rc.reward_timeout_s,
        batch_items=rc.reward_batch_items,
        backoff_s=rc.backoff_s,
        backoff_max_s=rc.backoff_max_s,
        max_wait_s=rc.reward_max_wait_s,
        on_retry=reward_retried,
    )


def make_sandbox(cfg: ExperimentConfig) -> SandboxClient | None:
    """The ``/run_code`` client shared by a process's episodes (``rollout.env.sandbox_url``, else
    the reward service's); None for an environment of the single-turn shape, which runs no code,
    and for a verifiers environment, which runs its own tools. ``rollout.env`` must have passed
    :func:`dynamo_rl.envs.check_env_config`."""
    rc = cfg.rollout
    if rc.env.name == VERIFIERS or not getattr(ENVIRONMENTS[rc.env.name], "multi_turn", True):
        return None
    return SandboxClient(
        rc.env.sandbox_url or cfg.endpoints.reward_url,
        timeout_s=rc.env.tool_timeout_s + 30.0,
        backoff_s=rc.backoff_s,
        backoff_max_s=rc.backoff_max_s,
        max_wait_s=rc.env.sandbox_max_wait_s,
    )


def short_error(e: BaseException) -> str:
    """``e`` in one line: a gRPC error's code and details, else its type and message."""
    details = getattr(e, "details", None)
    if callable(details):
        try:
            return f"{e.code().name}: {details()}"  # type: ignore[attr-defined]
        except Exception:
            pass
    return f"{type(e).__name__}: {e}"
