"""``dynamo-rl data FORMAT INPUT... --out FILE``: a published dataset's rows in our verl layout.

The user brings the files (JSONL, a JSON array, or parquet, as the dataset's publisher ships them);
nothing is downloaded. Every output row is::

    id            the source's own id when it has one, else "<data_source>-<split>-<row>"
    data_source   a name the reward service's default routes know (reward.routes)
    prompt        [{"role": "user", "content": problem + the instruction its route's scorer reads}]
    ability       "math" | "code"
    reward_model  {"style": "rule", "ground_truth": answer | JSON test cases}
    extra_info    {"index": row, "split": split, "source_id": id or "", "answer": reference response}

``extra_info.answer`` is a reference response in the form the instruction asks for (the GSM8K
solution ending in ``#### N``, a MATH solution with its ``\\boxed{}``, ``Answer: N``, a fenced
Python program), so the converted file also serves the supervised warm start
(``dynamo-rl sft``, ``learner.data.response_key=extra_info.answer``). Rows a format cannot use
(no final answer, no test cases, a proof question) are skipped and counted, never guessed.

The instruction matches the scorer of the route: ``openai/gsm8k`` reads the last ``#### N``, the
MATH family the last ``\\boxed{}``, ``math_dapo``/``aime*`` the last ``Answer:`` line, code sources
run the test cases. :data:`FORMATS` is the table (``--help`` prints it; docs/data.md has it too).
"""

from __future__ import annotations

import argparse
import json
import re
import sys
from collections import Counter
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from tasks.rows import ConvertError, write_rows

__all__ = ["FORMATS", "ConvertError", "Format", "convert_rows", "main", "read_rows", "write_rows"]

GSM8K_INSTRUCTION = 'Let\'s think step by step and output the final answer after "####".'
BOXED_INSTRUCTION = "Let's think step by step and output the final answer within \\boxed{}."
ANSWER_LINE_PREFIX = (
    "Solve the following math problem step by step. The last line of your response should be of "
    "the form Answer: $Answer (without quotes) where $Answer is the answer to the problem.\n\n"
)
ANSWER_LINE_SUFFIX = '\n\nRemember to put your answer on its own line after "Answer:".'
STDIO_INSTRUCTION = (
    "Write a Python 3 program that reads the input from standard input and writes the answer to "
    "standard output. Give the whole program in one ```python code block."
)
CALL_INSTRUCTION = (
    "Complete the Python 3 code below. The function `{fn_name}` (a top-level function or a method "
    "of class Solution) is called with each test's arguments and its return value is checked; do "
    "not read input or print the answer. Give the whole solution in one ```python code block."
)
PYTHON3 = 3
"""CodeContests' language id of Python 3 solutions (0 unknown, 1 Python 2, 2 C++, 3 Python 3,
4 Java)."""


class Skip(Exception):
    """A row the format cannot use; the message is the reason counted in the summary."""


@dataclass(frozen=True)
class Options:
    split: str
    max_tests: int


Converter = Callable[[Mapping[str, Any], Options], dict[str, Any]]


@dataclass(frozen=True)
class Format:
    name: str
    published: str
    """Where the layout is published (the dataset names users download from)."""
    fields: str
    """The fields read."""
    data_source: str
    scorer: str
    """How the default route of ``data_source`` scores it: a math extraction mode or ``code``."""
    split: str
    """The split recorded when ``--split`` is not given."""
    convert: Converter


# -- field helpers ----------------------------------------------------------------------------


def _first(row: Mapping[str, Any], *names: str, required: bool = True) -> Any:
    for name in names:
        value = row.get(name)
        if value is not None and value != "":
            return value
    if required:
        raise ConvertError(f"missing field {' / '.join(repr(n) for n in names)}")
    return None


def _answer_text(value: Any) -> str:
    """A final answer as text: lists joined (OlympiadBench), ``27.0`` as ``27``, ``$x$`` as ``x``."""
    if isinstance(value, list):
        parts = [_answer_text(v) for v in value if v is not None and str(v).strip()]
        return ", ".join(parts)
    if isinstance(value, float) and value.is_integer():
        return str(int(value))
    text = str(value).strip()
    if len(text) >= 2 and text.startswith("$") and text.endswith("$"):
        text = text.strip("$").strip()
    return text


def last_boxed(text: str) -> str | None:
    """Content of the last ``\\boxed{...}`` (or ``\\fbox{...}``) with balanced braces in a
    reference solution, else None."""
    for match in reversed(list(re.finditer(r"\\(?:boxed|fbox)\s*\{", text))):
        depth = 0
        for j in range(match.end() - 1, len(text)):
            if text[j] == "{" and text[j - 1] != "\\":
                depth += 1
            elif text[j] == "}" and text[j - 1] != "\\":
                depth -= 1
                if depth == 0:
                    content = text[match.end() : j].strip()
                    if content:
                        return content
                    break
    return None


def _gsm8k_final(answer: str) -> str:
    if "####" not in answer:
        raise Skip("no '#### N' in the answer")
    number = answer.rsplit("####", 1)[1].strip().replace(",", "").replace("$", "").strip()
    if not number:
        raise Skip("no '#### N' in the answer")
    return number


def _user(text: str) -> list[dict[str, str]]:
    return [{"role": "user", "content": text}]


def _math_row(prompt: str, truth: str, reference: str, source_id: Any) -> dict[str, Any]:
    if not truth:
        raise Skip("no final answer")
    return {
        "prompt": _user(prompt),
        "ability": "math",
        "ground_truth": truth,
        "answer": reference,
        "source_id": source_id,
    }


# -- math converters --------------------------------------------------------------------------


def _gsm8k(row: Mapping[str, Any], _o: Options) -> dict[str, Any]:
    question, answer = _first(row, "question"), str(_first(row, "answer"))
    return _math_row(f"{question} {GSM8K_INSTRUCTION}", _gsm8k_final(answer), answer, None)


def _boxed_problem(problem: str) -> str:
    return f"{problem} {BOXED_INSTRUCTION}"


def _math(row: Mapping[str, Any], _o: Options) -> dict[str, Any]:
    problem, solution = _first(row, "problem"), str(_first(row, "solution"))
    truth = last_boxed(solution)
    if truth is None:
        raise Skip("no \\boxed{} answer in the solution")
    return _math_row(_boxed_problem(problem), truth, solution, _first(row, "id", required=False))


def _boxed_answer(row: Mapping[str, Any], *ids: str) -> dict[str, Any]:
    """Problem + final answer (MATH-500, AMC23, Minerva, DeepScaleR, OlympiadBench)."""
    problem = _first(row, "problem", "question", "Problem", "Question")
    if str(row.get("question_type", "")).lower().startswith("theorem"):
        raise Skip("a proof question (no final answer)")
    context = row.get("context")
    if context:  # OlympiadBench: some questions rely on a shared context
        problem = f"{context}\n\n{problem}"
    answer = _first(row, "answer", "final_answer", "Answer", required=False)
    solution = _first(row, "solution", "Solution", required=False)
    if isinstance(solution, list):
        solution = "\n\n".join(map(str, solution))
    truth = _answer_text(answer) if answer is not None else None
    if truth is None and solution:
        truth = last_boxed(str(solution))
    if not truth:
        raise Skip("no final answer")
    reference = f"The final answer is \\boxed{{{truth}}}."
    if solution and last_boxed(str(solution)) is not None:
        reference = str(solution)
    return _math_row(
        _boxed_problem(str(problem)), truth, reference, _first(row, *ids, required=False)
    )


def _answer_line_problem(problem: str) -> str:
    return f"{ANSWER_LINE_PREFIX}{problem}{ANSWER_LINE_SUFFIX}"


def _aime(row: Mapping[str, Any], _o: Options) -> dict[str, Any]:
    problem = _first(row, "problem", "question", "Problem", "Question")
    truth = _answer_text(_first(row, "answer", "Answer"))
    return _math_row(
        _answer_line_problem(str(problem)), truth, f"Answer: {truth}",
        _first(row, "id", "ID", "unique_id", required=False),
    )  # fmt: skip


def _dapo(row: Mapping[str, Any], _o: Options) -> dict[str, Any]:
    """DAPO-Math-17k: already verl-shaped (the prompt carries the DAPO instruction); the
    processed variant has the problem as ``prompt`` text and the answer as ``solution``."""
    prompt = _first(row, "prompt")
    truth = (row.get("reward_model") or {}).get("ground_truth") or row.get("solution")
    if truth is None:
        raise ConvertError("missing field 'reward_model.ground_truth' (or 'solution')")
    truth = _answer_text(truth)
    if isinstance(prompt, str):
        text = prompt if "Answer:" in prompt else _answer_line_problem(prompt)
    else:
        users = [m.get("content", "") for m in prompt if m.get("role") == "user"]
        if not users:
            raise ConvertError("'prompt' has no user message")
        text = users[-1]
    source_id = (row.get("extra_info") or {}).get("index")
    return _math_row(text, truth, f"Answer: {truth}", source_id)


# -- code converters --------------------------------------------------------------------------


def _json_field(value: Any, name: str) -> Any:
    if isinstance(value, str):
        if not value.strip():
            return None
        try:
            return json.loads(value)
        except json.JSONDecodeError as e:
            raise ConvertError(f"field {name!r} is not JSON: {e}") from None
    return value


def _code_row(
    question: str, tests: Mapping[str, Any] | None, starter: str, solutions: Sequence[str],
    source_id: Any, o: Options,
) -> dict[str, Any]:  # fmt: skip
    if not tests or not tests.get("inputs") or not tests.get("outputs"):
        raise Skip("no test cases")
    inputs, outputs = list(tests["inputs"]), list(tests["outputs"])
    if len(inputs) != len(outputs):
        raise Skip("inputs and outputs differ in length")
    cases: dict[str, Any] = {"inputs": inputs[: o.max_tests], "outputs": outputs[: o.max_tests]}
    if tests.get("fn_name"):
        cases["fn_name"] = str(tests["fn_name"])
        instruction = CALL_INSTRUCTION.format(fn_name=cases["fn_name"])
        if starter.strip():
            instruction += f"\n\n```python\n{starter.rstrip()}\n```"
    else:
        instruction = STDIO_INSTRUCTION
        if starter.strip():
            instruction += f"\n\nStart from:\n```python\n{starter.rstrip()}\n```"
    reference = f"```python\n{solutions[0].rstrip()}\n```" if solutions else ""
    return {
        "prompt": _user(f"{str(question).rstrip()}\n\n{instruction}"),
        "ability": "code",
        "ground_truth": json.dumps(cases),
        "answer": reference,
        "source_id": source_id,
    }


def _apps_like(row: Mapping[str, Any], o: Options, *ids: str) -> dict[str, Any]:
    tests = _json_field(row.get("input_output"), "input_output")
    solutions = _json_field(row.get("solutions"), "solutions") or []
    return _code_row(
        _first(row, "question"), tests, str(row.get("starter_code") or ""),
        [str(s) for s in solutions], _first(row, *ids, required=False), o,
    )  # fmt: skip


def _apps(row: Mapping[str, Any], o: Options) -> dict[str, Any]:
    return _apps_like(row, o, "problem_id", "id")


def _taco(row: Mapping[str, Any], o: Options) -> dict[str, Any]:
    return _apps_like(row, o, "id", "name")


def _codecontests(row: Mapping[str, Any], o: Options) -> dict[str, Any]:
    inputs: list[str] = []
    outputs: list[str] = []
    for key in ("public_tests", "private_tests", "generated_tests"):
        block = row.get(key) or {}
        inputs += list(block.get("input") or [])
        outputs += list(block.get("output") or [])
    sols = row.get("solutions") or {}
    solutions = [
        s
        for lang, s in zip(sols.get("language") or [], sols.get("solution") or [], strict=False)
        if lang == PYTHON3
    ]
    return _code_row(
        _first(row, "description"), {"inputs": inputs, "outputs": outputs}, "", solutions,
        _first(row, "name", required=False), o,
    )  # fmt: skip


# -- the table --------------------------------------------------------------------------------

_PROBLEM = "problem|question, answer|final_answer, solution (optional)"
FORMATS: dict[str, Format] = {
    f.name: f
    for f in (
        Format("gsm8k", "openai/gsm8k (main)", "question, answer ('... #### N')", "openai/gsm8k",
               "gsm8k", "train", _gsm8k),
        Format("math", "hendrycks MATH, lighteval/MATH, DigitalLearningGmbH/MATH-lighteval",
               "problem, solution (answer: its last \\boxed{})",
               "DigitalLearningGmbH/MATH-lighteval", "last_boxed", "train", _math),
        Format("math500", "HuggingFaceH4/MATH-500", "problem, solution, answer, unique_id",
               "HuggingFaceH4/MATH-500", "last_boxed", "test",
               lambda r, o: _boxed_answer(r, "unique_id", "id")),
        Format("aime2024", "HuggingFaceH4/aime_2024, Maxwell-Jia/AIME_2024, AI-MO/aimo-validation-aime",
               "problem|Problem, answer|Answer, id|ID", "aime2024", "answer_line", "test", _aime),
        Format("aime2025", "opencompass/AIME2025, yentinglin/aime_2025, math-ai/aime25",
               "problem|question, answer, id", "aime2025", "answer_line", "test", _aime),
        Format("amc23", "math-ai/amc23, AI-MO/aimo-validation-amc", "question|problem, answer, id",
               "amc23", "last_boxed", "test", lambda r, o: _boxed_answer(r, "id")),
        Format("minerva", "math-ai/minervamath, Qwen2.5-Math minerva_math",
               _PROBLEM + ", idx", "minerva_math", "last_boxed", "test",
               lambda r, o: _boxed_answer(r, "idx", "id")),
        Format("olympiadbench", "Hothan/OlympiadBench (OE_TO_*), Qwen2.5-Math olympiadbench",
               "question, final_answer (list), context, question_type, id", "olympiadbench",
               "math_verify", "test", lambda r, o: _boxed_answer(r, "id")),
        Format("deepscaler", "agentica-org/DeepScaleR-Preview-Dataset", "problem, answer, solution",
               "deepscaler", "last_boxed", "train", lambda r, o: _boxed_answer(r, "id")),
        Format("dapo", "BytedTsinghua-SIA/DAPO-Math-17k (and -Processed)",
               "prompt, reward_model.ground_truth|solution, extra_info.index", "math_dapo",
               "answer_line", "train", _dapo),
        Format("apps", "codeparrot/apps", "problem_id, question, input_output (JSON), "
               "solutions (JSON), starter_code", "apps", "code", "train", _apps),
        Format("codecontests", "deepmind/code_contests", "name, description, "
               "public/private/generated_tests {input, output}, solutions {language, solution}",
               "codecontests", "code", "train", _codecontests),
        Format("taco", "BAAI/TACO", "question, input_output (JSON), solutions (JSON), "
               "starter_code", "taco", "code", "train", _taco),
    )
}  # fmt: skip
"""Every format: its published layout, the fields read, the data source written and how the
default route of that data source scores it."""


# -- files ------------------------------------------------------------------------------------


def read_rows(path: str | Path) -> Iterator[dict[str, Any]]:
    """Rows of a JSONL file, a JSON array, or a parquet file."""
    p = Path(path)
    if not p.is_file():
        raise ConvertError(f"{p}: no such file")
    if p.suffix.lower() in (".parquet", ".pq"):
        import pyarrow.parquet as pq

        # Batch by batch: DAPO-Math-17k's file holds 1.8M rows (its problems repeated).
        for batch in pq.ParquetFile(p).iter_batches(batch_size=4096):
            yield from batch.to_pylist()
        return
    text = p.read_text()
    if text.lstrip().startswith("["):
        try:
            rows = json.loads(text)
        except json.JSONDecodeError as e:
            raise ConvertError(f"{p}: not a JSON array: {e}") from None
        yield from rows
        return
    for number, line in enumerate(text.splitlines(), start=1):
        if line.strip():
            try:
                yield json.loads(line)
            except json.JSONDecodeError as e:
                raise ConvertError(f"{p}: line {number} is not JSON: {e}") from None


def convert_rows(
    fmt: Format, rows: Iterator[Mapping[str, Any]] | Sequence[Mapping[str, Any]], *,
    split: str | None = None, max_tests: int = 64, where: str = "input",
) -> tuple[list[dict[str, Any]], Counter[str]]:  # fmt: skip
    """The rows in our layout, and the count of skipped rows by reason. Duplicates (the same
    prompt and answer, as DAPO-Math-17k repeats its problems) are kept once."""
    opts = Options(split=split or fmt.split, max_tests=max_tests)
    out: list[dict[str, Any]] = []
    skipped: Counter[str] = Counter()
    seen: set[tuple[str, str]] = set()
    ids: set[str] = set()
    for index, row in enumerate(rows):
        if not isinstance(row, Mapping):
            raise ConvertError(f"{where}: row {index} is not an object")
        try:
            got = fmt.convert(row, opts)
        except Skip as e:
            skipped[str(e)] += 1
            continue
        except ConvertError as e:
            raise ConvertError(
                f"{where}: row {index}: {e} ({fmt.name} layout: {fmt.fields})"
            ) from None
        key = (got["prompt"][0]["content"], got["ground_truth"])
        if key in seen:
            skipped["duplicate of an earlier row"] += 1
            continue
        seen.add(key)
        source_id = got["source_id"]
        row_id = (
            f"{fmt.data_source}-{source_id}"
            if source_id is not None and str(source_id) != ""
            else f"{fmt.data_source}-{opts.split}-{index}"
        )
        if row_id in ids:
            raise ConvertError(f"{where}: row {index}: the id {row_id!r} is not unique")
        ids.add(row_id)
        out.append(
            {
                "id": row_id,
                "data_source": fmt.data_source,
                "prompt": got["prompt"],
                "ability": got["ability"],
                "reward_model": {"style": "rule", "ground_truth": got["ground_truth"]},
                "extra_info": {
                    "index": index,
                    "split": opts.split,
                    "source_id": "" if source_id is None else str(source_id),
                    "answer": got["answer"],
                },
            }
        )
    return out, skipped


REASONING_GYM_HELP = (
    f"  {'reasoning-gym':<14}generated, not read: dynamo-rl data reasoning-gym --tasks A,B "
    "[--weights 1,2] --size N --seed S --out FILE\n"
    f"  {'':<14}writes data_source 'reasoning_gym/<task>', scored by the task's score_answer "
    "(dynamo-rl data reasoning-gym --help)"
)


def formats_table() -> str:
    lines = []
    for f in FORMATS.values():
        lines.append(f"  {f.name:<14}{f.published}")
        lines.append(f"  {'':<14}reads: {f.fields}")
        lines.append(f"  {'':<14}writes data_source {f.data_source!r}, scored by {f.scorer}")
    return "\n".join(lines)


def main(argv: Sequence[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else list(argv)
    if argv[:1] == ["reasoning-gym"]:  # generated, not read from files: its own arguments
        from tasks.reasoning_gym_data import main as reasoning_gym_main

        return reasoning_gym_main(argv[1:])
    parser = argparse.ArgumentParser(
        prog="dynamo-rl data",
        description="Convert a published dataset's files (JSONL, JSON array or parquet, as you "
        "have them: nothing is downloaded) into the verl layout the rollout worker, eval and sft "
        "read: chat prompt with the instruction its scorer expects, data_source of a default "
        "route, reward_model.ground_truth, the source's ids kept.",
        formatter_class=argparse.RawDescriptionHelpFormatter,
        epilog="formats:\n" + formats_table() + "\n" + REASONING_GYM_HELP + "\n\nExample: "
        "dynamo-rl data gsm8k "
        "gsm8k/train.jsonl --out data/gsm8k_train.parquet (docs/data.md).",
    )
    parser.add_argument("format", choices=list(FORMATS), metavar="FORMAT",
                        help="the published layout (listed below)")  # fmt: skip
    parser.add_argument("inputs", nargs="+", metavar="INPUT", help="the files, read in order")
    parser.add_argument("--out", required=True, metavar="FILE",
                        help="output: .parquet, or JSON lines for any other extension")  # fmt: skip
    parser.add_argument("--split", help="split recorded in extra_info (default: the format's)")
    parser.add_argument("--limit", type=int, default=0, help="keep the first N rows (0: all)")
    parser.add_argument("--max-tests", type=int, default=64, metavar="N",
                        help="code: test cases kept per problem (default 64; the reward service "
                        "takes reward.code.max_cases, 256 by default)")  # fmt: skip
    args = parser.parse_args(argv)
    if args.limit < 0 or args.max_tests < 1:
        parser.error("--limit must be >= 0 and --max-tests >= 1")
    fmt = FORMATS[args.format]

    def rows() -> Iterator[dict[str, Any]]:
        for path in args.inputs:
            yield from read_rows(path)

    try:
        out, skipped = convert_rows(
            fmt, rows(), split=args.split, max_tests=args.max_tests, where=", ".join(args.inputs)
        )
    except ConvertError as e:
        print(f"dynamo-rl data: {e}", file=sys.stderr)
        return 2
    if args.limit:
        out = out[: args.limit]
    if not out:
        reasons = ", ".join(f"{n} {r}" for r, n in skipped.items()) or "no rows"
        print(f"dynamo-rl data: nothing to write ({reasons})", file=sys.stderr)
        return 2
    path = write_rows(out, args.out)
    print(f"{len(out)} rows -> {path} (data_source {fmt.data_source!r}, scored by {fmt.scorer})")
    for reason, n in skipped.most_common():
        print(f"skipped {n}: {reason}")
    return 0
