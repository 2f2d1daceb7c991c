"""Offline data of the sft and dpo modes: rows from JSONL or parquet, turned into token ids.

Rows are read whole (every rank reads the same file, so every rank holds the same examples and
knows every loss denominator without communication). A field is named by a dotted key into the
row (``extra_info.answer``). Layouts understood:

- sft, prompt + response: ``prompt`` text or chat messages; the response from ``response_key``
  (text, or messages whose last one is the answer) — the verl layout with
  ``response_key=extra_info.answer`` is this case;
- sft, chat: ``messages`` only; the last message (the assistant's) is the response, the ones
  before it the prompt;
- dpo: ``prompt``, ``chosen``, ``rejected``; each response text or messages (TRL's conversational
  layout: when the prompt field is missing, ``chosen`` minus its last message is the prompt).

The prompt is rendered by :func:`dynamo_rl.prompts.render_prompt`, exactly as the rollout worker
renders it; the response is the answer's tokens followed by EOS — what the engine generates.

:class:`DataOrder` is the visiting order: a seeded permutation per epoch, addressed by a single
integer position (examples consumed so far), which is what a checkpoint stores, so a resumed run
continues mid-epoch at the very next example.
"""

from __future__ import annotations

import json
import random
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from dynamo_rl.prompts import render_prompt

RESPONSE_KEYS = ("response", "completion", "extra_info.answer")
_MISSING = object()


class DataError(ValueError):
    """A data file or row that the configured keys cannot read; names the config key."""


@dataclass(frozen=True)
class SftExample:
    prompt: list[int]
    response: list[int]  # answer tokens + EOS
    group: str | None = None  # the row's value at ``group_key`` (per-group evaluation figures)


@dataclass(frozen=True)
class PrefExample:
    prompt: list[int]
    chosen: list[int]  # + EOS
    rejected: list[int]  # + EOS


def read_rows(path: str | Path) -> list[dict[str, Any]]:
    """Rows of a ``.parquet`` file or of JSON lines (``.jsonl``, ``.json``, anything else)."""
    p = Path(path)
    if not p.is_file():
        raise DataError(f"learner.data.path: no such file {str(p)!r}")
    if p.suffix == ".parquet":
        import pyarrow.parquet as pq

        return pq.read_table(p).to_pylist()
    rows = []
    with open(p) as f:
        for n, line in enumerate(f, 1):
            if not line.strip():
                continue
            try:
                row = json.loads(line)
            except json.JSONDecodeError as e:
                raise DataError(f"learner.data.path: {p} line {n} is not JSON: {e}") from None
            if not isinstance(row, dict):
                raise DataError(f"learner.data.path: {p} line {n} is not a JSON object")
            rows.append(row)
    return rows


def get_dotted(row: Mapping[str, Any], key: str, default: Any = _MISSING) -> Any:
    node: Any = row
    for part in key.split("."):
        if isinstance(node, Mapping) and part in node:
            node = node[part]
        elif default is not _MISSING:
            return default
        else:
            raise KeyError(key)
    return node


def filter_rows(rows: list[dict[str, Any]], key: str | None, values: Sequence[str] | None):
    if key is None:
        return rows
    keep = {str(v) for v in values or ()}
    return [r for r in rows if str(get_dotted(r, key, None)) in keep]


def _is_messages(value: Any) -> bool:
    return isinstance(value, list | tuple) and all(
        isinstance(m, Mapping) and "role" in m and "content" in m for m in value
    )


def _text_of(value: Any, what: str, key: str) -> str:
    """A response: text, or the content of the last of some messages."""
    if isinstance(value, str):
        return value
    if _is_messages(value) and value:
        return str(value[-1]["content"])
    raise DataError(f"{key}: {what} must be text or chat messages, got {type(value).__name__}")


class Encoder:
    """Prompt and response token ids for one tokenizer (EOS ends every response)."""

    def __init__(self, tokenizer: Any, template: str = "auto") -> None:
        self.tokenizer = tokenizer
        self.template = template
        eos = tokenizer.eos_token_id
        if eos is None:
            raise DataError("learner.model: the tokenizer has no EOS token to end responses with")
        self.eos = int(eos)

    def prompt(self, prompt: Any, key: str) -> list[int]:
        if not isinstance(prompt, str) and not _is_messages(prompt):
            raise DataError(
                f"{key}: a prompt must be text or chat messages, got {type(prompt).__name__}"
            )
        return render_prompt(self.tokenizer, prompt, self.template)[1]

    def response(self, text: str) -> list[int]:
        return [*self.tokenizer.encode(text, add_special_tokens=False), self.eos]


def sft_examples(rows: list[dict[str, Any]], enc: Encoder, cfg: Any) -> list[SftExample]:
    """SFT examples of ``rows`` under ``cfg`` (a ``DataConfig``)."""
    out = []
    response_key = cfg.response_key
    for i, row in enumerate(rows):
        prompt = get_dotted(row, cfg.prompt_key, None)
        if prompt is None:
            messages = get_dotted(row, cfg.messages_key, None)
            if not _is_messages(messages) or len(messages) < 2:
                raise DataError(
                    f"learner.data.prompt_key: row {i} has no {cfg.prompt_key!r} field and no "
                    f"chat messages under learner.data.messages_key {cfg.messages_key!r} "
                    f"(fields: {sorted(row)})"
                )
            prompt, response = list(messages[:-1]), str(messages[-1]["content"])
        else:
            if response_key is None:
                response_key = next(
                    (k for k in RESPONSE_KEYS if get_dotted(row, k, None) is not None), None
                )
                if response_key is None:
                    raise DataError(
                        f"learner.data.response_key: row {i} has none of {', '.join(RESPONSE_KEYS)}"
                        f" (fields: {sorted(row)}); name the response field"
                    )
            value = get_dotted(row, response_key, None)
            if value is None:
                raise DataError(
                    f"learner.data.response_key: row {i} has no field {response_key!r} "
                    f"(fields: {sorted(row)})"
                )
            response = _text_of(value, "a response", "learner.data.response_key")
        group = None
        if cfg.group_key is not None:
            value = get_dotted(row, cfg.group_key, None)
            group = None if value is None else str(value)
        out.append(
            SftExample(enc.prompt(prompt, "learner.data.prompt_key"), enc.response(response), group)
        )
    return out


def pref_examples(rows: list[dict[str, Any]], enc: Encoder, cfg: Any) -> list[PrefExample]:
    """Preference pairs of ``rows`` under ``cfg`` (a ``DataConfig``)."""
    out = []
    for i, row in enumerate(rows):
        pair = []
        for key in (cfg.chosen_key, cfg.rejected_key):
            value = get_dotted(row, key, None)
            if value is None:
                which = "chosen_key" if key == cfg.chosen_key else "rejected_key"
                raise DataError(
                    f"learner.data.{which}: row {i} has no field {key!r} (fields: {sorted(row)})"
                )
            pair.append(value)
        prompt = get_dotted(row, cfg.prompt_key, None)
        if prompt is None and _is_messages(pair[0]) and len(pair[0]) >= 2:
            prompt = list(pair[0][:-1])  # TRL conversational: the prompt is in the conversation
        if prompt is None:
            raise DataError(
                f"learner.data.prompt_key: row {i} has no field {cfg.prompt_key!r} "
                f"(fields: {sorted(row)})"
            )
        chosen = _text_of(pair[0], "chosen", "learner.data.chosen_key")
        rejected = _text_of(pair[1], "rejected", "learner.data.rejected_key")
        out.append(
            PrefExample(
                enc.prompt(prompt, "learner.data.prompt_key"),
                enc.response(chosen),
                enc.response(rejected),
            )
        )
    return out


def load_examples(
    path: str | Path, tokenizer: Any, cfg: Any, mode: str
) -> list[SftExample] | list[PrefExample]:
    """Read, filter and encode a data file for ``mode`` (``sft`` or ``dpo``)."""
    rows = filter_rows(read_rows(path), cfg.filter_key, cfg.filter_values)
    if not rows:
        extra = f" after learner.data.filter_key {cfg.filter_key!r}" if cfg.filter_key else ""
        raise DataError(f"learner.data.path: no rows in {str(path)!r}{extra}")
    enc = Encoder(tokenizer, cfg.template)
    if mode == "dpo":
        return pref_examples(rows, enc, cfg)
    return sft_examples(rows, enc, cfg)


class DataOrder:
    """Which examples a batch holds: a seeded permutation per epoch, indexed by the position
    (examples consumed so far); batches run straight across epoch boundaries."""

    def __init__(self, n: int, seed: int, shuffle: bool = True) -> None:
        if n < 1:
            raise ValueError("no examples")
        self.n, self.seed, self.shuffle = n, seed, shuffle
        self._cache: dict[int, list[int]] = {}

    def epoch_order(self, epoch: int) -> list[int]:
        order = self._cache.get(epoch)
        if order is None:
            order = list(range(self.n))
            if self.shuffle:
                random.Random(self.seed * 1_000_003 + epoch).shuffle(order)
            self._cache = {epoch: order}  # batches move forward: keep one epoch
        return order

    def batch(self, position: int, size: int) -> list[int]:
        out = []
        for p in range(position, position + size):
            epoch, i = divmod(p, self.n)
            out.append(self.epoch_order(epoch)[i])
        return out


def check_data_paths(cfg: Any) -> str | None:
    """A message naming the key when a configured data file does not exist (before torch)."""
    for key in ("path", "eval_path"):
        value = getattr(cfg, key)
        if value is not None and not Path(value).is_file():
            return f"learner.data.{key}: no such file {value!r}"
    return None
