"""``dynamo-rl data reasoning-gym``: reasoning-gym's generated tasks as rows in our verl layout.

::

    dynamo-rl data reasoning-gym --tasks chain_sum,graph_color --weights 3,1 --size 1000 \\
        --seed 0 [--config chain_sum.min_terms=3 ...] [--system-prompt default] --out FILE

The entries come from the library's own mixer, its ``composite`` dataset (each row's task drawn
by ``--weights``, reproducible from ``--seed``); ``--config TASK.KEY=VALUE`` sets a task's
generator option (the value read as YAML). Every row is::

    id            "reasoning_gym/<task>-<split>-<index>"
    data_source   "reasoning_gym/<task>" (the reward service scores it by that task's score_answer)
    prompt        [{"role": "system", "content": reasoning-gym's system prompt}, (unless none)
                   {"role": "user", "content": the entry's question}]
    ability       "reasoning_gym"
    reward_model  {"style": "rule", "ground_truth": the entry's answer ("" when it has none)}
    extra_info    {"index", "split", "source_id", "answer": "<answer>ANSWER</answer>" (or "" when
                   the entry has no answer), "reasoning_gym": JSON {"task", "config", "entry"}}

``extra_info.reasoning_gym`` keeps the whole entry (question, answer, metadata) in the typed JSON
form of :mod:`dynamo_rl.contracts.rg_entry`, and the task's options: the library's
``score_answer(answer, entry)`` reads both back. Five tasks of 0.1.25 have no single answer
(``boxnet``, ``graph_color``, ``propositional_logic``, ``rubiks_cube``, ``rush_hour``: their
scorers check a response against the metadata); their rows have an empty ground truth.

A task the library does not have, an option its generator does not take or a value it refuses
stops the command (exit 2) with the argument named.
"""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import difflib
import json
import sys
from collections.abc import Mapping, Sequence
from typing import Any

from dynamo_rl.contracts import rg_entry
from tasks.rows import ConvertError, write_rows

__all__ = ["SYSTEM_PROMPT", "generate", "main", "parse_options", "rows_of", "system_prompt"]

SYSTEM_PROMPT = "default"
"""The reasoning-gym system prompt put before each question unless ``--system-prompt`` says
otherwise: it asks for the answer inside ``<answer>...</answer>``, which the scorer reads."""


def _library() -> Any:
    try:
        import reasoning_gym
    except ImportError as e:
        raise ConvertError(f"the reasoning-gym library is not installed ({e}); install it with "
                           f"pip install 'reasoning-gym=={rg_entry.VERSION}'") from None  # fmt: skip
    return reasoning_gym


def _known(task: str) -> None:
    if task == "composite":
        raise ConvertError("--tasks: 'composite' is reasoning-gym's mixer, not a task: list the "
                           "tasks to mix in --tasks (and their --weights)")  # fmt: skip
    if task not in rg_entry.TASKS:
        near = difflib.get_close_matches(task, rg_entry.TASKS, n=3)
        hint = f" (did you mean {' or '.join(near)}?)" if near else ""
        raise ConvertError(f"--tasks: unknown task {task!r}{hint}; the tasks of reasoning-gym "
                           f"{rg_entry.VERSION}: {', '.join(rg_entry.TASKS)}")  # fmt: skip


def parse_options(given: Sequence[str], tasks: Sequence[str]) -> dict[str, dict[str, Any]]:
    """``--config TASK.KEY=VALUE`` arguments as options per task (values read as YAML)."""
    import yaml

    options: dict[str, dict[str, Any]] = {t: {} for t in tasks}
    for arg in given:
        key, sep, text = arg.partition("=")
        task, dot, name = key.partition(".")
        if not (sep and dot and task and name):
            raise ConvertError(f"--config {arg!r}: expected TASK.KEY=VALUE")
        if task not in options:
            raise ConvertError(f"--config {arg}: {task!r} is not one of --tasks "
                               f"({', '.join(tasks)})")  # fmt: skip
        if name in ("seed", "size"):
            raise ConvertError(f"--config {arg}: {name} is set by --{name} for every task")
        try:
            options[task][name] = yaml.safe_load(text)
        except yaml.YAMLError as e:
            raise ConvertError(f"--config {arg}: the value is not YAML: {e}") from None
    return options


def _check_options(task: str, options: Mapping[str, Any], given: Sequence[str]) -> None:
    """Refuse an option the task's generator does not take, or values it refuses, naming the
    ``--config`` argument."""
    library = _library()
    from reasoning_gym.factory import DATASETS

    config_cls = DATASETS[task][1]
    names = [f.name for f in dataclasses.fields(config_cls) if f.name not in ("seed", "size")]
    args = {n: next((a for a in reversed(given) if a.startswith(f"{task}.{n}=")),
                    f"{task}.{n}={json.dumps(v)}") for n, v in options.items()}  # fmt: skip
    for name, arg in args.items():
        if name not in names:
            raise ConvertError(f"--config {arg}: {task} has no option {name!r}; its options: "
                               f"{', '.join(names)}")  # fmt: skip
    try:
        with contextlib.redirect_stdout(sys.stderr):
            library.create_dataset(task, **options, size=1, seed=0)
    except Exception as e:
        message = f"{type(e).__name__}: {e}" if str(e) else type(e).__name__
        named = [a for n, a in args.items() if n in str(e)] or list(args.values())
        raise ConvertError(f"--config {', '.join(named)}: reasoning-gym refused the options "
                           f"of {task}: {message}") from None  # fmt: skip


def generate(
    tasks: Sequence[str], weights: Sequence[float], size: int, seed: int,
    options: Mapping[str, Mapping[str, Any]], given: Sequence[str] = (),
) -> list[dict[str, Any]]:  # fmt: skip
    """``size`` entries of ``tasks`` mixed by ``weights`` (the library's composite dataset)."""
    for task in tasks:
        _known(task)
    if len(set(tasks)) != len(tasks):
        raise ConvertError(f"--tasks: a task is given twice ({', '.join(tasks)})")
    if len(weights) != len(tasks):
        raise ConvertError(f"--weights: {len(weights)} weights for {len(tasks)} tasks")
    if any(not w > 0 for w in weights):
        raise ConvertError(f"--weights: every weight must be > 0, got {list(weights)}")
    library = _library()
    for task in tasks:
        _check_options(task, options.get(task, {}), given)
    from reasoning_gym.composite import DatasetSpec

    specs = [DatasetSpec(t, float(w), dict(options.get(t, {}))) for t, w in zip(tasks, weights, strict=True)]  # fmt: skip
    index = 0
    try:
        with contextlib.redirect_stdout(sys.stderr):  # some generators print progress
            mixed = library.create_dataset("composite", size=size, seed=seed, datasets=specs)
            entries = []
            for index in range(size):
                entries.append(mixed[index])
    except Exception as e:
        raise ConvertError(f"reasoning-gym failed on entry {index} (--seed {seed}): "
                           f"{type(e).__name__}: {e}") from None  # fmt: skip
    return entries


def system_prompt(name: str) -> str | None:
    """The text of reasoning-gym's system prompt ``name``; None for ``none``."""
    _library()
    from reasoning_gym.utils import SYSTEM_PROMPTS

    if name == "none":
        return None
    if name not in SYSTEM_PROMPTS:
        raise ConvertError(f"--system-prompt: {name!r} is not one of "
                           f"{', '.join([*SYSTEM_PROMPTS, 'none'])}")  # fmt: skip
    return str(SYSTEM_PROMPTS[name])


def rows_of(
    entries: Sequence[Mapping[str, Any]], options: Mapping[str, Mapping[str, Any]], *,
    split: str = "train", system_prompt: str | None = None,
) -> list[dict[str, Any]]:  # fmt: skip
    """The entries as rows of our layout (the module's docstring); ``system_prompt``: the text
    of a system message before each question, or None."""
    rows = []
    for index, entry in enumerate(entries):
        metadata = entry["metadata"]
        task = metadata["source_dataset"]
        source = f"{rg_entry.PREFIX}{task}"
        answer = entry["answer"]
        try:
            encoded = rg_entry.encode_entry(dict(entry))
        except TypeError as e:
            raise ConvertError(f"{task} entry {index}: {e}") from None
        prompt = [{"role": "user", "content": entry["question"]}]
        if system_prompt is not None:
            prompt.insert(0, {"role": "system", "content": system_prompt})
        reference = ""
        if answer is not None:
            reference = f"<answer>{answer}</answer>" if system_prompt is not None else answer
        kept = {"task": task, "config": dict(options.get(task, {})), "entry": encoded}
        rows.append(
            {
                "id": f"{source}-{split}-{index}",
                "data_source": source,
                "prompt": prompt,
                "ability": "reasoning_gym",
                "reward_model": {"style": "rule", "ground_truth": answer or ""},
                "extra_info": {
                    "index": index,
                    "split": split,
                    "source_id": str(metadata.get("source_index", index)),
                    "answer": reference,
                    "reasoning_gym": json.dumps(kept),
                },
            }
        )
    return rows


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="dynamo-rl data reasoning-gym",
        description="Generate reasoning-gym entries (the library's own generators, mixed by its "
        "composite dataset) as rows of the verl layout the rollout worker, eval and sft read; "
        "each row's data_source reasoning_gym/<task> is scored by the reward service with that "
        f"task's score_answer. Pinned: reasoning-gym {rg_entry.VERSION} (docs/data.md).",
    )
    parser.add_argument("--tasks", required=True, metavar="A,B,...",
                        help="the tasks to mix (reasoning-gym dataset names)")  # fmt: skip
    parser.add_argument("--weights", metavar="W,W,...",
                        help="the share of each task, in --tasks order (default: equal)")  # fmt: skip
    parser.add_argument("--size", type=int, required=True, metavar="N", help="rows to write")
    parser.add_argument("--seed", type=int, default=0, help="generator seed (default 0)")
    parser.add_argument("--config", action="append", default=[], metavar="TASK.KEY=VALUE",
                        help="a task's generator option (repeatable; the value is YAML)")  # fmt: skip
    parser.add_argument("--system-prompt", default=SYSTEM_PROMPT, metavar="NAME",
                        help="reasoning-gym's system prompt put before each question: default "
                        "(asks for <answer>...</answer>), DeepSeekZero, simple, direct, "
                        "chain_of_draft, or none (the question alone)")  # fmt: skip
    parser.add_argument("--split", default="train", help="split recorded (default train)")
    parser.add_argument("--out", required=True, metavar="FILE",
                        help="output: .parquet, or JSON lines for any other extension")  # fmt: skip
    args = parser.parse_args(argv)
    if args.size < 1:
        parser.error("--size must be >= 1")
    tasks = [t.strip() for t in args.tasks.split(",") if t.strip()]
    try:
        weights = (
            [float(w) for w in args.weights.split(",")] if args.weights else [1.0] * len(tasks)
        )
    except ValueError:
        parser.error(f"--weights: expected numbers separated by commas, got {args.weights!r}")
    try:
        options = parse_options(args.config, tasks)
        system = system_prompt(args.system_prompt)
        entries = generate(tasks, weights, args.size, args.seed, options, args.config)
        rows = rows_of(entries, options, split=args.split, system_prompt=system)
    except ConvertError as e:
        print(f"dynamo-rl data reasoning-gym: {e}", file=sys.stderr)
        return 2
    path = write_rows(rows, args.out)
    counts: dict[str, int] = {}
    for row in rows:
        counts[row["data_source"]] = counts.get(row["data_source"], 0) + 1
    shown = ", ".join(f"{s.removeprefix(rg_entry.PREFIX)} {n}" for s, n in counts.items())
    print(f"{len(rows)} rows -> {path} (reasoning-gym {rg_entry.VERSION}: {shown}; data_source "
          "reasoning_gym/<task>, scored by the task's score_answer)")  # fmt: skip
    return 0
