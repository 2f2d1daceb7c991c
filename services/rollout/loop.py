"""What the rollout worker and ``dynamo-rl eval`` do alike: render, sample, verify.

- :func:`load_tokenizer` and :class:`~services.rollout.datasets.PromptRenderer` render a prompt
  to token ids exactly as the learner's warm start does;
- :func:`sampling_of` turns ``rollout.sampling`` into a request's :class:`Sampling`;
- :func:`make_engine_factory` builds an engine client from ``rollout``'s protocol settings;
- :func:`sample_prompt` draws ``count`` samples of one prompt, split into requests of at most
  ``max_per_request`` samples that run concurrently over the pool, each with its own seed
  (the same seed for every request would give every chunk the same samples);
- :func:`prompt_limit` resolves ``rollout.max_prompt_len`` (default: the model's context minus
  ``sampling.max_tokens``) for :func:`~services.rollout.datasets.check_prompt_lengths`, which both
  apply when the data loads;
- :func:`verify_groups` scores every sample of a batch in one ``/v1/verify`` call and hands the
  verdicts back per prompt, matched by id.

The worker adds what eval has no use for (allocation, leases, the stream); eval adds accuracy.
"""

from __future__ import annotations

import asyncio
import dataclasses
import json
import zlib
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from dynamo_rl.config import ExperimentConfig
from dynamo_rl.config.rollout import SamplingConfig
from dynamo_rl.contracts.reward import ItemResult
from services.rollout.datasets import PromptRecord, reward_item
from services.rollout.engines import Engine, EnginePool, Sample, Sampling, make_engine
from services.rollout.reward_client import RewardClient

__all__ = [
    "load_tokenizer",
    "make_engine_factory",
    "model_context",
    "prompt_limit",
    "request_seed",
    "sample_prompt",
    "sampling_of",
    "split_count",
    "verify_groups",
]


def split_count(count: int, chunk: int) -> list[int]:
    """``count`` as request sizes of at most ``chunk`` (``[]`` for 0)."""
    return [min(chunk, count - i) for i in range(0, count, chunk)]


def request_seed(base: int | None, *parts: object) -> int | None:
    """A per-request seed: the same base seed must not give every chunk the same samples."""
    if base is None:
        return None
    return (base * 1_000_003 + zlib.crc32(":".join(map(str, parts)).encode())) % (2**31 - 1)


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


def sampling_of(
    s: SamplingConfig, *, temperature: float | None = None, seed: int | None = None
) -> Sampling:
    """``rollout.sampling`` as request parameters; ``temperature``/``seed`` replace the config's
    when given (eval samples at its own temperature, seeded from ``run.seed``)."""
    return Sampling(
        max_tokens=s.max_tokens,
        temperature=s.temperature if temperature is None else temperature,
        top_p=s.top_p,
        top_k=s.top_k,
        stop=tuple(s.stop),
        stop_token_ids=tuple(s.stop_token_ids),
        seed=s.seed if seed is None else seed,
    )


def make_engine_factory(cfg: ExperimentConfig) -> Callable[[str], Engine]:
    """Engine clients for base URLs, speaking ``rollout.engine_api``/``weight_api``."""
    rc = cfg.rollout
    token = cfg.endpoints.control_token.get_secret_value() if cfg.endpoints.control_token else None

    def factory(url: str) -> Engine:
        return make_engine(
            url,
            engine_api=rc.engine_api,
            weight_api=rc.weight_api,
            model=rc.model_name,
            timeout_s=rc.request_timeout_s,
            control_token=token,
        )

    return factory


async def sample_prompt(
    pool: EnginePool,
    tokens: list[int],
    count: int,
    sampling: Sampling,
    *,
    max_per_request: int,
    seed_of: Callable[[int], int | None],
) -> list[Sample]:
    """``count`` samples of one prompt: requests of at most ``max_per_request`` samples, request
    ``i`` seeded with ``seed_of(i)``, all in flight at once; the samples in request order."""
    sizes = split_count(count, max_per_request)
    parts = await asyncio.gather(
        *(
            pool.generate(tokens, size, dataclasses.replace(sampling, seed=seed_of(chunk)))
            for chunk, size in enumerate(sizes)
        )
    )
    return [s for part in parts for s in part]


async def verify_groups(
    reward: RewardClient,
    records: Sequence[PromptRecord],
    groups: Sequence[Sequence[Sample]],
    item_id: Callable[[int, int], str],
) -> list[list[ItemResult]]:
    """Score sample ``j`` of prompt ``p`` (id ``item_id(p, j)``, its token count sent for length
    terms) in one verify call; the verdicts per prompt, in sample order."""
    items = [
        reward_item(r, item_id(p, j), s.text, len(s.token_ids))
        for p, (r, group) in enumerate(zip(records, groups, strict=True))
        for j, s in enumerate(group)
    ]
    results = await reward.verify(items) if items else []
    by_id = {str(it.id): res for it, res in zip(items, results, strict=True)}
    return [[by_id[item_id(p, j)] for j in range(len(group))] for p, group in enumerate(groups)]
