"""A dataset as the rollout worker loads it, and what it will train on.

- :func:`load_prompts` is the worker's one way in: the rows (``rollout.dataset``; its first
  ``rollout.max_prompts`` when set), refused when a
  data source has no reward route (:func:`~services.rollout.datasets.check_routes`), rendered and
  checked against the length limit (:func:`~services.rollout.build.prepare_prompts`). Prompts the
  length policy dropped or truncated are a warning the user must act on (a notice,
  :mod:`dynamo_rl.notices`), with the setting to change when it is more than
  :data:`HINT_SHARE` of the rows.
- :func:`data_summary` is what ``dynamo-rl rollout --check-data FILE`` writes (and ``dynamo-rl
  up`` prints before training): rows kept and dropped, the data sources and their scorers, the
  model's context and ``max_tokens``, that hint. With ``rollout.env.name: verifiers`` the rows
  are the environment's dataset's (``dataset``: ``rollout.env.verifiers <module>``; one data
  source, the environment's label, scored by ``verifiers rubric``).
"""

from __future__ import annotations

import logging
from collections import Counter
from typing import Any

from dynamo_rl.config import ExperimentConfig
from dynamo_rl.config.reward import VERIFIERS, RewardConfig, RouteTable
from dynamo_rl.config.rollout import EnvConfig
from dynamo_rl.contracts import rg_entry
from dynamo_rl.notices import Notices
from services.rollout import datasets
from services.rollout.build import model_context, prepare_prompts
from services.rollout.datasets import LengthCheck, PromptRecord, PromptRenderer

__all__ = [
    "HINT_SHARE",
    "data_inputs",
    "data_summary",
    "length_hint",
    "load_prompts",
    "scorer_of",
]

log = logging.getLogger(__name__)

HINT_SHARE = 0.1
"""Past this share of the rows dropped or truncated, the warning names the setting to change."""


def length_hint(cfg: ExperimentConfig, lengths: LengthCheck, tokenizer_dir: str) -> str | None:
    """Which setting keeps more of the prompts, when the length policy touched more than
    :data:`HINT_SHARE` of them (None otherwise)."""
    if not lengths.total or lengths.over / lengths.total <= HINT_SHARE:
        return None
    rc = cfg.rollout
    share = f"{100 * lengths.over / lengths.total:.0f}% of the prompts"
    if rc.max_prompt_len is not None:
        limit = f"raise rollout.max_prompt_len ({rc.max_prompt_len})"
    else:
        context = model_context(tokenizer_dir)
        limit = (f"lower rollout.sampling.max_tokens ({rc.sampling.max_tokens}; prompts get the "
                 f"model's context of {context} tokens minus it) or use a model with a longer "
                 "context")  # fmt: skip
    if rc.prompt_len_policy == "drop":
        return (f"{share} are dropped: to keep them, {limit}, or set "
                "rollout.prompt_len_policy=truncate_left")  # fmt: skip
    return f"{share} are truncated: to keep them whole, {limit}"


def data_inputs(cfg: ExperimentConfig) -> tuple[str | None, str]:
    """``rollout.dataset`` (None with ``rollout.env.name: verifiers``, whose environment gives
    the rows) and the tokenizer directory (``rollout.tokenizer``, else ``engine.model``);
    ValueError naming the setting that is missing."""
    if not cfg.rollout.dataset and cfg.rollout.env.name != "verifiers":
        raise ValueError("rollout.dataset is not set: give a JSONL or verl parquet file")
    tokenizer = cfg.rollout.tokenizer or cfg.engine.model
    if not tokenizer:
        raise ValueError(
            "set rollout.tokenizer (or engine.model) to the model's tokenizer directory"
        )
    return cfg.rollout.dataset, tokenizer


def load_prompts(
    cfg: ExperimentConfig,
    tokenizer_dir: str,
    notices: Notices,
    rows: tuple[str, list[PromptRecord]] | None = None,
) -> tuple[list[PromptRecord], PromptRenderer, LengthCheck, EnvConfig]:
    """The dataset's rows, the renderer, the prompts kept and ``rollout.env`` resolved (see the
    module's docstring); raises ValueError naming an unrouted data source, DatasetError for a bad
    file or ``prompt_len_policy=error``. ``rows``: where the rows come from and the rows, instead
    of ``rollout.dataset`` (a verifiers environment's, scored by its own rubric: no routes)."""
    rc = cfg.rollout
    if rows is None:
        if rc.dataset is None:
            raise ValueError("rollout.dataset is not set: give a JSONL or verl parquet file")
        source = rc.dataset
        records = datasets.load_records(rc.dataset, rc.dataset_format, rc.default_kind)
    else:
        source, records = rows
    if rc.max_prompts is not None and len(records) > rc.max_prompts:
        log.info("%s: the first %d of %d rows (rollout.max_prompts)", source,
                 rc.max_prompts, len(records))  # fmt: skip
        records = records[: rc.max_prompts]
    if rows is None:
        datasets.check_routes(records, cfg)
    renderer, lengths, limits = prepare_prompts(cfg, records, tokenizer_dir)
    if lengths.over:
        hint = length_hint(cfg, lengths, tokenizer_dir)
        message = f"{source}: {lengths.line()}" + (f"; {hint}" if hint else "")
        notices.warn(log, "prompts_over_length", message, about=source)
    else:
        log.info("%s: %s", source, lengths.line())
    return records, renderer, lengths, limits


def scorer_of(reward: RewardConfig, data_source: str, kind: str) -> str:
    """How the reward service scores the rows of ``data_source`` (words for a summary)."""
    if kind == "verifiers":  # a verifiers environment's rows (services.rollout.verifiers_worker)
        return "verifiers rubric"
    if data_source in reward.composite:
        return f"composite reward.composite.{data_source}"
    if kind == "reasoning_gym":
        return f"reasoning_gym, {data_source.removeprefix(rg_entry.PREFIX)}'s score_answer"
    if kind not in VERIFIERS:
        return kind
    found = RouteTable(reward.routes).find(data_source)
    if found is None or found[1].kind != kind:
        return f"{kind}, no route"
    key, route = found
    how = (route.extraction or "last_boxed") if kind == "math" else (route.scoring or "fraction")
    return f"{kind}, {how} (reward.routes.{key})"


def data_summary(cfg: ExperimentConfig) -> dict[str, Any]:
    """What the worker will train on (``dynamo-rl rollout --check-data``'s file); raises what
    :func:`data_inputs` and :func:`load_prompts` raise."""
    rc = cfg.rollout
    _dataset, tokenizer_dir = data_inputs(cfg)
    given = None
    if rc.env.name == "verifiers":  # the environment's rows, as the worker loads them
        from services.rollout.verifiers_worker import source_of, verifiers_prompts

        given = (source_of(cfg), verifiers_prompts(cfg)[2])
    records, _renderer, lengths, _limits = load_prompts(
        cfg, tokenizer_dir, Notices(None, "rollout"), given
    )
    rows = Counter((r.data_source, r.kind) for r in records)
    return {
        "dataset": rc.dataset if given is None else given[0],
        "rows": lengths.total,
        "kept": len(lengths.records),
        "over": lengths.over,
        "limit": lengths.limit,
        "policy": rc.prompt_len_policy,
        "line": lengths.line(),
        "context": model_context(tokenizer_dir),
        "max_tokens": rc.sampling.max_tokens,
        "max_prompt_len": rc.max_prompt_len,
        "max_prompts": rc.max_prompts,
        "hint": length_hint(cfg, lengths, tokenizer_dir),
        "sources": [
            {"data_source": s, "kind": k, "rows": n, "scorer": scorer_of(cfg.reward, s, k)}
            for (s, k), n in sorted(rows.items())
        ],
    }
