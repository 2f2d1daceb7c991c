"""Prompt datasets: JSONL and the verl parquet layout, rendered to token ids, served in batches.

Row layouts (both file formats accept both):

- verl: ``prompt`` as chat messages (``[{"role": "user", "content": ...}]``), ``data_source``,
  ``reward_model.ground_truth``, ``extra_info.index``, and ``ability`` (its value is the reward
  kind when it is ``math``, ``code`` or ``reasoning_gym``); a ``reasoning_gym`` row (``dynamo-rl
  data reasoning-gym``) carries its entry and generator options as JSON in
  ``extra_info.reasoning_gym`` (``{"task", "config", "entry"}``);
- flat: ``prompt`` as text or messages, ``ground_truth`` (or ``answer``), optional ``id``,
  ``data_source``, ``kind`` (``math`` | ``code`` | ``model`` | ``judge``); code rows carry ``tests``
  (and ``language``); ``model`` and ``judge`` rows (scored by a reward model or an LLM judge) need no
  ground truth (a judge is shown it as the reference when there is one).

Code tests are the reward service's layout (``{"type": "stdio", "cases": [...]}`` or ``assert``) or
verl's layout ``{"inputs": [...], "outputs": [...]}`` (APPS, CodeContests, TACO; stdin/stdout
cases, or call cases with ``fn_name``, whose inputs are argument lists or, LeetCode-style, text
with one JSON argument per line), either as ``tests`` or as JSON in the ground truth. A verl
Search-R1 row's ground truth ``{"target": [...]}`` becomes the JSON list of accepted answers.

Every reward item carries the row's ``data_source`` and the prompt's plain text, so the reward
service can route it to a composite reward spec (``reward.composite.<data_source>``).

A prompt's id is what the allocator keeps statistics under, so it must be stable across epochs and
workers: the row's ``id`` if it has one, else ``<data_source>-<extra_info.index>``, else
``<data_source>-<row number>``.

Chat messages become text with the tokenizer's chat template when it has one (``auto``/``chat``) or
with a plain template (``Role: content`` lines, then ``Assistant:``) otherwise.

Prompt lengths are checked when the data loads (:func:`check_prompt_lengths`, used by the rollout
worker and ``dynamo-rl eval`` alike): a prompt longer than ``rollout.max_prompt_len`` tokens is
dropped, truncated on the left or the right, or refuses the dataset, by
``rollout.prompt_len_policy``.
"""

from __future__ import annotations

import json
import random
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from pydantic import TypeAdapter, ValidationError

from dynamo_rl.config import ExperimentConfig
from dynamo_rl.config.reward import unrouted
from dynamo_rl.contracts import rg_entry
from dynamo_rl.contracts.reward import KINDS, VerifyItem
from dynamo_rl.prompts import render_prompt, uses_chat_template

__all__ = [
    "LENGTH_POLICIES",
    "DatasetError",
    "LengthCheck",
    "PromptRecord",
    "PromptRenderer",
    "PromptSampler",
    "check_prompt_lengths",
    "check_routes",
    "load_records",
    "record_from_row",
    "reward_item",
]

_ITEM: TypeAdapter[VerifyItem] = TypeAdapter(VerifyItem)
TEST_TYPES = ("stdio", "assert")


class DatasetError(ValueError):
    """A dataset file or row this loader cannot use; the message names the row and field."""


@dataclass(frozen=True)
class PromptRecord:
    prompt_id: str
    prompt: str | list[dict[str, str]]
    """Text, or chat messages with 'role' and 'content'."""
    ground_truth: str
    data_source: str
    kind: str
    """Reward kind: "math" | "code" | "model" | "judge"."""
    reward_extra: dict[str, Any] = field(default_factory=dict)
    """Extra fields for the reward item (code: 'tests', 'language')."""
    tier: str | None = None
    """The row's difficulty tier (``tier`` or ``extra_info.tier``, as the built-in ``arith`` task
    writes), if it has one: evaluations report accuracy per tier."""


def _get(row: Mapping[str, Any], dotted: str) -> Any:
    node: Any = row
    for part in dotted.split("."):
        if not isinstance(node, Mapping) or node.get(part) is None:
            return None
        node = node[part]
    return node


def _messages(value: Any, where: str) -> str | list[dict[str, str]]:
    if isinstance(value, str):
        return value
    # parquet gives numpy-free lists of dicts through pyarrow's to_pylist.
    if isinstance(value, Sequence) and value and all(isinstance(m, Mapping) for m in value):
        out = []
        for i, m in enumerate(value):
            if not isinstance(m.get("role"), str) or not isinstance(m.get("content"), str):
                raise DatasetError(f"{where}: prompt[{i}] needs string 'role' and 'content'")
            out.append({"role": m["role"], "content": m["content"]})
        return out
    raise DatasetError(f"{where}: 'prompt' must be text or a non-empty list of chat messages")


def _call_case(inputs: Any, output: Any, where: str) -> dict[str, Any]:
    """One call case: arguments as a list (APPS: the output is the value), or as text with one
    JSON value per line (LeetCode: an output given as text is compared as the JSON value it holds,
    or as the text itself)."""
    if isinstance(inputs, list):
        return {"args": inputs, "expected": output}
    if not isinstance(inputs, str):
        raise DatasetError(
            f"{where}: call-based tests need a list of arguments or JSON lines per input"
        )
    try:
        inputs = [json.loads(line) for line in inputs.rstrip("\n").split("\n")]
    except ValueError as e:
        raise DatasetError(f"{where}: input is not one JSON value per line ({e})") from None
    if not isinstance(output, str):
        return {"args": inputs, "expected": output}
    try:
        expected = json.loads(output)
    except ValueError:
        expected = output
    return {"args": inputs, "expected": expected, "expected_text": output}


def _stdio_layout(tests: Any, where: str) -> Any:
    """verl's code layout (APPS, CodeContests, TACO: ``{"inputs": [...], "outputs": [...]}``, with
    ``fn_name`` when call-based) as stdio or call tests; the service's own layout passes
    through."""
    if not (isinstance(tests, Mapping) and "inputs" in tests and "outputs" in tests):
        return tests
    inputs, outputs = tests["inputs"], tests["outputs"]
    if not isinstance(inputs, list) or not isinstance(outputs, list) or len(inputs) != len(outputs):
        raise DatasetError(f"{where}: tests 'inputs' and 'outputs' must be lists of equal length")
    if tests.get("fn_name"):
        # Call-based: each input is the argument list (APPS, TACO) or its arguments as JSON lines
        # (LeetCode, LiveCodeBench), each output the return value (or its text).
        cases = [_call_case(i, o, f"{where}: tests case {n}") for n, (i, o) in
                 enumerate(zip(inputs, outputs, strict=True))]  # fmt: skip
        return {"type": "call", "fn_name": tests["fn_name"], "cases": cases}

    def text(v: Any) -> str:
        return "\n".join(map(str, v)) if isinstance(v, list) else str(v)

    cases = [{"stdin": text(i), "stdout": text(o)} for i, o in zip(inputs, outputs, strict=True)]
    return {"type": "stdio", "cases": cases}


def record_from_row(
    row: Mapping[str, Any], row_number: int, default_kind: str = "math"
) -> PromptRecord:
    """One dataset row (verl or flat layout) as a :class:`PromptRecord`."""
    where = f"row {row_number}"
    if not isinstance(row, Mapping):
        raise DatasetError(f"{where}: expected an object, got {type(row).__name__}")
    if row.get("prompt") is None:
        raise DatasetError(f"{where}: missing field 'prompt'")
    prompt = _messages(row["prompt"], where)
    data_source = str(row.get("data_source") or "data")
    ability = row.get("ability")  # verl's field: "math", "code", or free text such as "reasoning"
    kind = str(
        row.get("kind")
        or _get(row, "extra_info.kind")
        or (ability if ability in ("math", "code", "reasoning_gym") else None)
        or default_kind
    )
    if kind not in KINDS:
        raise DatasetError(f"{where}: kind must be one of {', '.join(KINDS)}, got {kind!r}")
    truth = _get(row, "reward_model.ground_truth")
    if truth is None:
        truth = row.get("ground_truth", row.get("answer"))
    if isinstance(truth, Mapping) and "target" in truth:  # Search-R1: the accepted answers
        targets = truth["target"]
        truth = json.dumps([str(t) for t in ([targets] if isinstance(targets, str) else targets)])
    extra: dict[str, Any] = {}
    if kind == "code":
        tests = row.get("tests") or _get(row, "extra_info.tests")
        if tests is None and isinstance(truth, str):
            # verl's code datasets keep the test cases as JSON in reward_model.ground_truth.
            try:
                tests = json.loads(truth)
            except ValueError:
                tests = None
        if tests is None:
            raise DatasetError(f"{where}: code rows need 'tests' (or JSON tests in ground_truth)")
        extra["tests"] = _stdio_layout(tests, where)
        extra["language"] = str(row.get("language") or _get(row, "extra_info.language") or "python")
        truth = truth if isinstance(truth, str) else ""
    elif kind == "reasoning_gym":
        extra.update(_reasoning_gym(row, where))
        truth = "" if truth is None else truth  # the entry holds the answer (or none)
    elif truth is None and kind in ("model", "judge"):
        truth = ""
    elif truth is None:
        raise DatasetError(
            f"{where}: missing field 'reward_model.ground_truth' (or 'ground_truth'/'answer')"
        )
    if row.get("id") is not None:
        prompt_id = str(row["id"])
    elif _get(row, "extra_info.index") is not None:
        prompt_id = f"{data_source}-{_get(row, 'extra_info.index')}"
    else:
        prompt_id = f"{data_source}-{row_number}"
    tier = row.get("tier") or _get(row, "extra_info.tier")
    record = PromptRecord(
        prompt_id=prompt_id,
        prompt=prompt,
        ground_truth=str(truth),
        data_source=data_source,
        kind=kind,
        reward_extra=extra,
        tier=None if tier is None else str(tier),
    )
    if kind == "code":
        # Malformed tests are the row's fault: say so at load time, not mid-run as a refused item.
        try:
            reward_item(record, prompt_id, "")
        except ValidationError as e:
            err = e.errors()[0]
            # The location starts with the union tags pydantic inserts ("code", "stdio"): drop them.
            loc = [p for i, p in enumerate(err["loc"][1:]) if not (i == 1 and p in TEST_TYPES)]
            field = ".".join(str(p) for p in loc)
            raise DatasetError(f"{where}: code item field {field!r}: {err['msg']}") from None
    return record


def _reasoning_gym(row: Mapping[str, Any], where: str) -> dict[str, Any]:
    """A reasoning-gym row's entry and generator options (``extra_info.reasoning_gym``, JSON text
    or an object), checked as the reward item will carry them."""
    field = "extra_info.reasoning_gym"
    value = _get(row, field)
    if isinstance(value, str):
        try:
            value = json.loads(value)
        except ValueError as e:
            raise DatasetError(f"{where}: {field!r} is not JSON: {e}") from None
    if not isinstance(value, Mapping) or not isinstance(value.get("entry"), Mapping):
        raise DatasetError(f"{where}: reasoning_gym rows need {field!r} with the entry "
                           "({'task', 'config', 'entry'}, as dynamo-rl data reasoning-gym writes)")  # fmt: skip
    config = value.get("config") or {}
    if not isinstance(config, Mapping):
        raise DatasetError(f"{where}: {field}.config must be an object")
    try:
        rg_entry.decode_entry(value["entry"])
    except ValueError as e:
        raise DatasetError(f"{where}: {field}.entry: {e}") from None
    return {"entry": dict(value["entry"]), "config": dict(config)}


def _rows(path: Path, fmt: str) -> Iterator[Any]:
    if fmt == "auto":
        suffix = path.suffix.lower()
        if suffix in (".jsonl", ".json", ".ndjson"):
            fmt = "jsonl"
        elif suffix in (".parquet", ".pq"):
            fmt = "parquet"
        else:
            raise DatasetError(
                f"{path}: cannot tell the format from the extension {suffix!r}; set "
                "rollout.dataset_format to 'jsonl' or 'parquet'"
            )
    if fmt == "jsonl":
        with path.open() as f:
            for number, line in enumerate(f, start=1):
                if not line.strip():
                    continue
                try:
                    yield json.loads(line)
                except json.JSONDecodeError as e:
                    raise DatasetError(f"{path}: line {number} is not JSON: {e}") from None
    elif fmt == "parquet":
        import pyarrow.parquet as pq

        yield from pq.read_table(path).to_pylist()
    else:
        raise DatasetError(f"dataset_format must be auto, jsonl or parquet, got {fmt!r}")


def load_records(
    path: str | Path, fmt: str = "auto", default_kind: str = "math"
) -> list[PromptRecord]:
    """Every row of a JSONL or parquet file; duplicate prompt ids are an error."""
    p = Path(path)
    if not p.is_file():
        raise DatasetError(f"dataset file not found: {p}")
    records = [record_from_row(row, i, default_kind) for i, row in enumerate(_rows(p, fmt))]
    if not records:
        raise DatasetError(f"{p}: no rows")
    seen: dict[str, int] = {}
    for i, r in enumerate(records):
        if r.prompt_id in seen:
            raise DatasetError(
                f"{p}: rows {seen[r.prompt_id]} and {i} share the prompt id {r.prompt_id!r}"
            )
        seen[r.prompt_id] = i
    return records


class PromptRenderer:
    """Turns a record's prompt into (text, token ids) with a tokenizer, by the one rendering the
    learner's supervised mode and evaluation share (:mod:`dynamo_rl.prompts`)."""

    def __init__(self, tokenizer: Any, template: str = "auto") -> None:
        try:
            uses_chat_template(tokenizer, template)
        except ValueError as e:
            raise ValueError(f"rollout.prompt_template: {e}; use 'plain' or 'auto'") from None
        self.tokenizer = tokenizer
        self.template = template

    def render(self, prompt: str | list[dict[str, str]]) -> tuple[str, list[int]]:
        return render_prompt(self.tokenizer, prompt, self.template)


LENGTH_POLICIES = ("drop", "truncate_left", "truncate_right", "error")
_DONE = {"drop": "dropped", "truncate_left": "truncated on the left",
         "truncate_right": "truncated on the right", "error": "refused"}  # fmt: skip


@dataclass
class LengthCheck:
    """What :func:`check_prompt_lengths` kept: the records to sample, each one's rendering (text,
    token ids; truncated where the policy truncates), and the counts to report."""

    records: list[PromptRecord]
    rendered: dict[str, tuple[str, list[int]]]
    total: int
    over: int
    limit: int | None
    policy: str

    def line(self) -> str:
        """One line for the log: ``12 of 1,319 prompts exceed 256 tokens: dropped``."""
        if self.limit is None:
            return f"{self.total:,} prompts, no length limit (the model's context is unknown)"
        return (
            f"{self.over:,} of {self.total:,} prompts exceed {self.limit:,} tokens: "
            f"{_DONE[self.policy] if self.over else 'none to handle'}"
        )


def check_prompt_lengths(
    records: Sequence[PromptRecord],
    renderer: PromptRenderer,
    max_len: int | None,
    policy: str = "drop",
) -> LengthCheck:
    """Render every prompt once and apply ``policy`` to those longer than ``max_len`` tokens
    (None: no limit): ``drop`` leaves them out, ``truncate_left`` keeps the last ``max_len``
    tokens, ``truncate_right`` the first, ``error`` raises :class:`DatasetError` with the counts.
    The rollout worker and ``dynamo-rl eval`` both load their prompts through this."""
    if policy not in LENGTH_POLICIES:
        raise DatasetError(
            f"rollout.prompt_len_policy must be one of {', '.join(LENGTH_POLICIES)}, got {policy!r}"
        )
    kept: list[PromptRecord] = []
    rendered: dict[str, tuple[str, list[int]]] = {}
    longest: list[tuple[int, str]] = []
    for r in records:
        text, ids = renderer.render(r.prompt)
        if max_len is None or len(ids) <= max_len:
            kept.append(r)
            rendered[r.prompt_id] = (text, ids)
            continue
        longest.append((len(ids), r.prompt_id))
        if policy in ("truncate_left", "truncate_right"):
            ids = ids[-max_len:] if policy == "truncate_left" else ids[:max_len]
            kept.append(r)
            rendered[r.prompt_id] = (renderer.tokenizer.decode(ids), ids)
    check = LengthCheck(kept, rendered, len(records), len(longest), max_len, policy)
    if longest and policy == "error":
        worst = ", ".join(f"{pid} ({n} tokens)" for n, pid in sorted(longest, reverse=True)[:3])
        raise DatasetError(
            f"{check.line()} by rollout.prompt_len_policy=error (longest: {worst}); raise "
            "rollout.max_prompt_len or choose drop, truncate_left or truncate_right"
        )
    if not kept:
        raise DatasetError(
            f"{check.line()}: no prompt is left (raise rollout.max_prompt_len, or truncate with "
            "rollout.prompt_len_policy=truncate_left or truncate_right)"
        )
    return check


def prompt_text(prompt: str | list[dict[str, str]]) -> str:
    """The prompt as plain text for a reward model or a judge: the text itself, or the user
    messages' contents (no chat template: the scorer applies its own)."""
    if isinstance(prompt, str):
        return prompt
    return "\n\n".join(m["content"] for m in prompt if m["role"] == "user")


def reward_item(
    record: PromptRecord, item_id: str, response: str, response_length: int | None = None
) -> VerifyItem:
    """The reward service item that scores ``response`` to ``record`` (``POST /v1/verify``).

    ``response_length`` (tokens) is what a composite spec's ``length`` component measures. Raises
    pydantic's ``ValidationError`` (a ``ValueError``) when the row's fields do not make an item
    of the contract, e.g. malformed code tests."""
    item: dict[str, Any] = {
        "id": item_id,
        "kind": record.kind,
        "response": response,
        "data_source": record.data_source,
        "prompt": prompt_text(record.prompt),
    }
    if record.kind == "math":
        item["ground_truth"] = record.ground_truth
    elif record.kind == "judge" and record.ground_truth:
        item["reference"] = record.ground_truth
    if response_length is not None:
        item["response_length"] = response_length
    item.update(record.reward_extra)
    return _ITEM.validate_python(item)


class PromptSampler:
    """Batches of records, epoch after epoch, shuffled per epoch, one shard per worker."""

    def __init__(
        self,
        records: Sequence[PromptRecord],
        *,
        shuffle: bool = True,
        seed: int = 0,
        num_shards: int = 1,
        shard: int = 0,
    ) -> None:
        mine = [r for i, r in enumerate(records) if i % num_shards == shard]
        if not mine:
            raise DatasetError(
                f"worker shard {shard} of {num_shards} holds no prompts ({len(records)} rows)"
            )
        self.records = mine
        self.shuffle = shuffle
        self.seed = seed
        self.epoch = 0
        self._order: list[int] = []
        self._pos = 0
        self.discarded: set[str] = set()

    def discard(self, prompt_id: str) -> None:
        """Serve ``prompt_id`` no more (an engine refused it); raises :class:`DatasetError` when
        no prompt is left."""
        self.discarded.add(prompt_id)
        if all(r.prompt_id in self.discarded for r in self.records):
            raise DatasetError(
                f"every prompt of this worker's shard ({len(self.records)}) was refused by the "
                "engines (see the dead-letter stream)"
            )

    def _new_epoch(self) -> None:
        self._order = list(range(len(self.records)))
        if self.shuffle:
            random.Random(self.seed * 1_000_003 + self.epoch).shuffle(self._order)
        self._pos = 0
        self.epoch += 1

    def next_batch(self, size: int) -> list[PromptRecord]:
        """``size`` distinct records while the shard holds that many; wraps into the next epoch."""
        size = min(size, len(self.records) - len(self.discarded))
        batch: list[PromptRecord] = []
        taken: set[str] = set()
        while len(batch) < size:
            if self._pos >= len(self._order):
                self._new_epoch()
            index = self._order[self._pos]
            self._pos += 1
            r = self.records[index]
            if r.prompt_id in self.discarded:
                continue
            if r.prompt_id in taken:
                # Across an epoch boundary a prompt could come twice in one batch; serve it later
                # in this epoch instead, so every epoch still covers every prompt exactly once.
                self._order.append(index)
                continue
            taken.add(r.prompt_id)
            batch.append(r)
        return batch


def check_routes(records: Sequence[PromptRecord], cfg: ExperimentConfig) -> None:
    """Refuse a dataset with a math or code ``data_source`` the reward service has no route (of
    its kind) or composite spec for (``reward.routes``, ``reward.composite``: the same table the
    service scores by) — it would be scored by the default extraction, quite possibly 0 for every
    sample. A ``*`` route or composite spec accepts every source. ``reasoning_gym`` rows need the
    data source ``reasoning_gym/<task>`` with a task of the pinned reasoning-gym version (each
    task is scored by its own ``score_answer``). Raises ValueError naming them."""
    sources: dict[str, str] = {}
    for r in records:
        sources.setdefault(r.data_source, r.kind)
    unknown = sorted(s for s, k in sources.items()
                     if k == "reasoning_gym" and rg_entry.task_of(s) is None)  # fmt: skip
    if unknown:
        raise ValueError(
            f"{cfg.rollout.dataset}: no reasoning-gym task for data_source "
            f"{', '.join(repr(s) for s in unknown)} (reasoning_gym): the form is "
            f"{rg_entry.source_form()}"
        )
    missing = unrouted(cfg.reward, sources)
    if not missing:
        return
    named = ", ".join(f"{s!r} ({k})" for s, k in sorted(missing.items()))
    if "data" in missing:
        named += " ('data' is what rows without a data_source get)"
    routes = ", ".join(f"{k} ({r.kind})" for k, r in cfg.reward.routes.items() if r is not None)
    composite = ", ".join(cfg.reward.composite) or "none"
    raise ValueError(
        f"{cfg.rollout.dataset}: no reward route for data_source {named}: its answers would be "
        f"scored by the default extraction, perhaps 0 for every sample. Routes: {routes}; "
        f"composite specs: {composite}. Add reward.routes.<data_source> (e.g. "
        "{kind: math, extraction: last_boxed}), a reward.composite spec, or a '*' route"
    )
