"""``dynamo-rl data``: each converter on hand-written rows of its dataset's published layout.

The rows are written from the datasets' documented field names (the first rows of GSM8K, MATH-500
and AIME 2024 as published, others shortened). Each converted file is read by the rollout
worker's own loader, and the converted row's reference response (``extra_info.answer``) is scored
by a real reward service under the default routes: it must score correct, and the same response
with another answer must not.
"""

from __future__ import annotations

import json
import subprocess
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from dynamo_rl.config.reward import RewardConfig
from services.reward.routes import Routes
from services.rollout.datasets import load_records, reward_item
from tasks.convert import FORMATS, ConvertError, convert_rows, main, read_rows
from tests.conftest import REPO, dynamo_rl_argv
from tests.services.reward.conftest import RewardServer, start_reward_server

GSM8K_ANSWER = (
    "Natalia sold 48/2 = <<48/2=24>>24 clips in May.\n"
    "Natalia sold 48+24 = <<48+24=72>>72 clips altogether in April and May.\n#### 72"
)
DAPO_PROMPT = (
    "Solve the following math problem step by step. The last line of your response should be of "
    "the form Answer: $Answer (without quotes) where $Answer is the answer to the problem.\n\n"
    'What is $17 \\cdot 2$?\n\nRemember to put your answer on its own line after "Answer:".'
)

# format -> (rows in the published layout, rows expected after conversion, skip reasons)
ROWS: dict[str, list[dict[str, Any]]] = {
    "gsm8k": [
        {"question": "Natalia sold clips to 48 of her friends in April, and then she sold half "
         "as many clips in May. How many clips did Natalia sell altogether in April and May?",
         "answer": GSM8K_ANSWER},
        {"question": "A shop sells 1,000 pens a day for 2 days. How many pens?",
         "answer": "1,000 * 2 = <<1000*2=2000>>2,000\n#### 2,000"},
        {"question": "No final line here.", "answer": "It is 5."},
    ],
    "math": [
        {"problem": "What is $\\frac{1}{2} + \\frac{1}{4}$?", "level": "Level 1",
         "type": "Prealgebra",
         "solution": "$\\frac12 + \\frac14 = \\frac24 + \\frac14 = \\boxed{\\frac{3}{4}}$."},
        {"problem": "Compute $\\sin 60^\\circ$.", "level": "Level 2", "type": "Precalculus",
         "solution": "From the 30-60-90 triangle, $\\sin 60^\\circ = \\boxed{\\frac{\\sqrt{3}}{2}}$."},
        {"problem": "Prove it.", "level": "Level 5", "type": "Algebra", "solution": "Done."},
    ],
    "math500": [
        {"problem": "Convert the point $(0,3)$ in rectangular coordinates to polar coordinates.  "
         "Enter your answer in the form $(r,\\theta),$ where $r > 0$ and $0 \\le \\theta < 2 \\pi.$",
         "solution": "We have that $r = \\sqrt{0^2 + 3^2} = 3.$  Also, the point makes an angle of "
         "$\\frac{\\pi}{2}$ with the positive $x$-axis.\n\nTherefore, the polar coordinates are "
         "$\\boxed{\\left( 3, \\frac{\\pi}{2} \\right)}.$",
         "answer": "\\left( 3, \\frac{\\pi}{2} \\right)", "subject": "Precalculus", "level": 2,
         "unique_id": "test/precalculus/807.json"},
    ],
    "aime2024": [
        {"id": 60, "problem": "Every morning Aya goes for a $9$-kilometer-long walk ... Find the "
         "number of minutes the walk takes her, including the $t$ minutes spent in the coffee "
         "shop.", "solution": "... so the answer is $\\boxed{204}$.", "answer": "204",
         "url": "https://artofproblemsolving.com/wiki/index.php/2024_AIME_I_Problems/Problem_1",
         "year": "2024"},
        # Maxwell-Jia/AIME_2024's capitalised layout, the answer an integer.
        {"ID": "2024-II-4", "Problem": "Let $x,y$ and $z$ be positive real numbers ... Find $m+n$.",
         "Solution": "...", "Answer": 33},
    ],
    "aime2025": [
        {"question": "Find the sum of all integer bases $b>9$ for which $17_{b}$ is a divisor of "
         "$97_{b}$.", "answer": "70"},
    ],
    "amc23": [
        {"id": 0, "question": "Cities $A$ and $B$ are $45$ miles apart. Alicia bikes towards $B$ "
         "at 18 miles per hour. Leaving at the same time, Beth bikes toward $A$ at 12 miles per "
         "hour. How many miles from City $A$ will they be when they meet?", "answer": 27.0,
         "url": "https://artofproblemsolving.com/wiki/index.php/2023_AMC_12A_Problems/Problem_1"},
    ],
    "minerva": [
        # Qwen2.5-Math's minerva_math layout: the answer in the solution's box.
        {"idx": 0, "problem": "Each of the two Magellan telescopes has a diameter of $6.5$ m. ... "
         "what is the ratio?", "solution": "The ratio is $\\boxed{1.6}$.", "type": "Astronomy"},
        # math-ai/minervamath's layout.
        {"question": "A photon has energy 2 eV. How many eV do two photons have?", "answer": "4"},
    ],
    "olympiadbench": [
        {"id": 1606, "question": "Find all real $x$ with $x^2 - 5x + 6 = 0$.",
         "solution": ["Factor: $(x-2)(x-3)=0$."], "final_answer": ["$2, 3$"], "context": None,
         "image_1": None, "modality": "Text-only", "difficulty": "Competition",
         "is_multiple_answer": True, "unit": None, "answer_type": "Numerical", "error": None,
         "question_type": "Open-ended", "subfield": "Algebra", "subject": "Math",
         "language": "English"},
        {"id": 1607, "question": "Prove that $\\sqrt{2}$ is irrational.", "solution": ["..."],
         "final_answer": None, "context": None, "modality": "Text-only",
         "is_multiple_answer": False, "question_type": "Theorem proof", "subject": "Math",
         "language": "English"},
    ],
    "deepscaler": [
        {"problem": "What is $\\frac{2}{4}$ in lowest terms?", "answer": "\\frac{1}{2}",
         "solution": "Divide by 2: $\\boxed{\\frac{1}{2}}$."},
    ],
    "dapo": [
        {"data_source": "math_dapo", "prompt": [{"content": DAPO_PROMPT, "role": "user"}],
         "ability": "MATH", "reward_model": {"ground_truth": "34", "style": "rule-lighteval/MATH_v2"},
         "extra_info": {"index": "9a9b6eb4-a1cb-49d1-8c1e-62eaf2f74079"}},
        # DAPO-Math-17k repeats its problems: the same prompt and answer again is kept once.
        {"data_source": "math_dapo", "prompt": [{"content": DAPO_PROMPT, "role": "user"}],
         "ability": "MATH", "reward_model": {"ground_truth": "34", "style": "rule-lighteval/MATH_v2"},
         "extra_info": {"index": "b426d104-244d-4831-a2c4-cd756b61700a"}},
    ],
    "apps": [
        {"problem_id": 4000, "question": "Read n and print n + 1.\n\n-----Input-----\nOne integer.",
         "solutions": json.dumps(["n = int(input())\nprint(n + 1)\n"]),
         "input_output": json.dumps({"inputs": ["1\n", "5\n"], "outputs": ["2\n", "6\n"]}),
         "difficulty": "introductory", "url": "https://codeforces.com/problemset/problem/1/A",
         "starter_code": ""},
        {"problem_id": 2, "question": "Write add(a, b).",
         "solutions": json.dumps(["def add(a, b):\n    return a + b\n"]),
         "input_output": json.dumps({"fn_name": "add", "inputs": [[1, 2], [3, 4]],
                                     "outputs": [[3], [7]]}),
         "difficulty": "introductory", "url": "https://www.codewars.com/kata/x",
         "starter_code": "def add(a, b):\n\t"},
        {"problem_id": 3, "question": "No tests.", "solutions": "", "input_output": "",
         "difficulty": "interview", "url": "", "starter_code": ""},
    ],
    "codecontests": [
        {"name": "1_A. Add", "description": "Print the sum of two integers.",
         "public_tests": {"input": ["1 2\n"], "output": ["3\n"]},
         "private_tests": {"input": ["10 20\n"], "output": ["30\n"]},
         "generated_tests": {"input": ["0 0\n"], "output": ["0\n"]},
         "source": 2, "difficulty": 7,
         "solutions": {"language": [2, 3],
                       "solution": ["#include <cstdio>\nint main(){}",
                                    "a, b = map(int, input().split())\nprint(a + b)\n"]},
         "incorrect_solutions": {"language": [], "solution": []},
         "cf_contest_id": 1, "cf_index": "A", "cf_points": 500.0, "cf_rating": 800,
         "cf_tags": ["math"], "is_description_translated": False, "untranslated_description": "",
         "time_limit": {"seconds": 2, "nanos": 0}, "memory_limit_bytes": 256000000,
         "input_file": "", "output_file": ""},
    ],
    "taco": [
        {"question": "Print the input doubled.",
         "solutions": json.dumps(["print(int(input()) * 2)\n"]), "starter_code": "",
         "input_output": json.dumps({"inputs": ["2\n", "7\n"], "outputs": ["4\n", "14\n"]}),
         "difficulty": "EASY", "raw_tags": "[]", "name": None, "source": "codechef",
         "tags": "[]", "skill_types": "[]", "url": "https://www.codechef.com/problems/X",
         "Expected Auxiliary Space": None, "time_limit": None, "date": None, "picture_num": None,
         "memory_limit": None, "Expected Time Complexity": None},
    ],
}  # fmt: skip
EXPECTED_IDS = {
    "gsm8k": ["openai/gsm8k-train-0", "openai/gsm8k-train-1"],
    "math": ["DigitalLearningGmbH/MATH-lighteval-train-0",
             "DigitalLearningGmbH/MATH-lighteval-train-1"],
    "math500": ["HuggingFaceH4/MATH-500-test/precalculus/807.json"],
    "aime2024": ["aime2024-60", "aime2024-2024-II-4"],
    "aime2025": ["aime2025-test-0"],
    "amc23": ["amc23-0"],
    "minerva": ["minerva_math-0", "minerva_math-test-1"],
    "olympiadbench": ["olympiadbench-1606"],
    "deepscaler": ["deepscaler-train-0"],
    "dapo": ["math_dapo-9a9b6eb4-a1cb-49d1-8c1e-62eaf2f74079"],
    "apps": ["apps-4000", "apps-2"],
    "codecontests": ["codecontests-1_A. Add"],
    "taco": ["taco-train-0"],
}  # fmt: skip
TRUTHS = {
    "gsm8k": ["72", "2000"], "math": ["\\frac{3}{4}", "\\frac{\\sqrt{3}}{2}"],
    "math500": ["\\left( 3, \\frac{\\pi}{2} \\right)"], "aime2024": ["204", "33"],
    "aime2025": ["70"], "amc23": ["27"], "minerva": ["1.6", "4"], "olympiadbench": ["2, 3"],
    "deepscaler": ["\\frac{1}{2}"], "dapo": ["34"],
}  # fmt: skip
SKIPPED = {
    "gsm8k": {"no '#### N' in the answer": 1},
    "math": {"no \\boxed{} answer in the solution": 1},
    "olympiadbench": {"a proof question (no final answer)": 1},
    "dapo": {"duplicate of an earlier row": 1},
    "apps": {"no test cases": 1},
}
WRONG_PROGRAM = "```python\nprint(0)\n```"


def test_every_format_has_hand_written_rows_and_a_default_route_matching_its_instruction() -> None:
    assert set(ROWS) == set(FORMATS)
    routes = Routes(RewardConfig().routes)
    for fmt in FORMATS.values():
        found = routes.find(fmt.data_source)
        assert found is not None, f"{fmt.name}: {fmt.data_source!r} has no default route"
        route = found[1]
        if fmt.scorer == "code":
            assert route.kind == "code", fmt.name
        else:
            assert (route.kind, route.extraction) == ("math", fmt.scorer), fmt.name


@pytest.fixture(scope="module")
def reward(tmp_path_factory: pytest.TempPathFactory) -> Iterator[RewardServer]:
    server = start_reward_server(tmp_path_factory.mktemp("convert-reward"))
    try:
        yield server
    finally:
        server.proc.stop()


def _wrong(fmt: str, answer: str, truth: str) -> str:
    """The reference response with its final answer replaced by a wrong one."""
    if FORMATS[fmt].scorer == "code":
        return WRONG_PROGRAM
    if fmt == "gsm8k":
        return answer.rsplit("####", 1)[0] + "#### 999"
    return answer.replace(truth, "999") if truth in answer else answer + " \\boxed{999}"


@pytest.mark.parametrize("fmt", list(FORMATS))
def test_converter_writes_our_layout_and_its_reference_scores_correct(
    fmt: str, tmp_path: Path, reward: RewardServer
) -> None:
    src = tmp_path / "in.jsonl"
    src.write_text("".join(json.dumps(r) + "\n" for r in ROWS[fmt]))
    out = tmp_path / "out.parquet"
    assert main([fmt, str(src), "--out", str(out)]) == 0
    records = load_records(out)  # the rollout worker's own loader
    assert [r.prompt_id for r in records] == EXPECTED_IDS[fmt]
    rows = list(read_rows(out))
    _, skipped = convert_rows(FORMATS[fmt], ROWS[fmt])
    assert dict(skipped) == SKIPPED.get(fmt, {})
    spec = FORMATS[fmt]
    for record, row in zip(records, rows, strict=True):
        assert record.data_source == spec.data_source
        assert isinstance(record.prompt, list) and record.prompt[0]["role"] == "user"
        assert record.kind == ("code" if spec.scorer == "code" else "math")
        assert row["extra_info"]["split"] == spec.split
    if fmt in TRUTHS:
        assert [r.ground_truth for r in records] == TRUTHS[fmt]
    items, wrong = [], []
    for i, (record, row) in enumerate(zip(records, rows, strict=True)):
        answer = row["extra_info"]["answer"]
        items.append(reward_item(record, f"ok{i}", answer))
        wrong.append(reward_item(record, f"bad{i}", _wrong(fmt, answer, record.ground_truth)))
    results = reward.verify(*(it.model_dump(mode="json", exclude_unset=True)
                              for it in items + wrong))  # fmt: skip
    for res in results[: len(items)]:
        assert (res["correct"], res["reason"]) == (True, "ok"), (fmt, res)
        # The extracted answer comes back with the verdict: what eval's maj@k votes on.
        assert ("answer" in res) == (spec.scorer != "code"), (fmt, res)
    for res in results[len(items) :]:
        assert not res["correct"], (fmt, res)


def test_instructions_match_the_scorers() -> None:
    """Each prompt asks for the form its route reads (the '####' line, a box, an 'Answer:' line,
    a fenced program; call-based code names the function)."""
    wants = {"gsm8k": '"####"', "last_boxed": "\\boxed{}", "math_verify": "\\boxed{}",
             "answer_line": "Answer:", "code": "```python"}  # fmt: skip
    for name, spec in FORMATS.items():
        rows, _ = convert_rows(spec, ROWS[name])
        for row in rows:
            assert wants[spec.scorer] in row["prompt"][0]["content"], (name, row["prompt"])
    rows, _ = convert_rows(FORMATS["apps"], ROWS["apps"])
    assert "`add`" in rows[1]["prompt"][0]["content"]
    assert json.loads(rows[1]["reward_model"]["ground_truth"])["fn_name"] == "add"


def test_code_tests_are_capped_and_codecontests_joins_its_test_sets() -> None:
    rows, _ = convert_rows(FORMATS["codecontests"], ROWS["codecontests"])
    assert json.loads(rows[0]["reward_model"]["ground_truth"]) == {
        "inputs": ["1 2\n", "10 20\n", "0 0\n"], "outputs": ["3\n", "30\n", "0\n"]}  # fmt: skip
    rows, _ = convert_rows(FORMATS["codecontests"], ROWS["codecontests"], max_tests=2)
    assert len(json.loads(rows[0]["reward_model"]["ground_truth"])["inputs"]) == 2
    # The Python 3 solution is the reference, not the C++ one listed first.
    assert rows[0]["extra_info"]["answer"].startswith("```python\na, b = map")


def test_a_row_missing_a_required_field_names_the_row_and_the_layout(tmp_path: Path) -> None:
    with pytest.raises(ConvertError, match=r"row 1: missing field 'answer'.*gsm8k layout"):
        convert_rows(FORMATS["gsm8k"], [ROWS["gsm8k"][0], {"question": "q"}])
    with pytest.raises(ConvertError, match="'Problem'"):
        convert_rows(FORMATS["aime2025"], [{"answer": "1"}])
    bad = tmp_path / "bad.jsonl"
    bad.write_text('{"question": "q", "answer": "#### 1"}\nnot json\n')
    assert main(["gsm8k", str(bad), "--out", str(tmp_path / "o.jsonl")]) == 2


def test_json_array_input_and_jsonl_output(tmp_path: Path) -> None:
    src = tmp_path / "aime.json"
    src.write_text(json.dumps(ROWS["aime2024"]))
    out = tmp_path / "aime.jsonl"
    assert main(["aime2024", str(src), "--out", str(out), "--split", "eval"]) == 0
    rows = [json.loads(x) for x in out.read_text().splitlines()]
    assert [r["extra_info"]["split"] for r in rows] == ["eval", "eval"]
    assert [r.prompt_id for r in load_records(out)] == EXPECTED_IDS["aime2024"]


def test_help_lists_every_format() -> None:
    done = subprocess.run(dynamo_rl_argv("data", "--help"), cwd=REPO, capture_output=True,
                          text=True, timeout=60, check=True)  # fmt: skip
    for name, spec in FORMATS.items():
        assert f"  {name} " in done.stdout and spec.data_source in done.stdout
    top = subprocess.run(dynamo_rl_argv("--help"), cwd=REPO, capture_output=True, text=True,
                         timeout=60, check=True)  # fmt: skip
    assert "data" in top.stdout


def test_parquet_input_as_published(tmp_path: Path) -> None:
    """CodeContests ships parquet with nested test and solution structs: read batch by batch."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    src = tmp_path / "test-00000-of-00001.parquet"
    pq.write_table(pa.Table.from_pylist(ROWS["codecontests"] * 3), src, row_group_size=1)
    rows = list(read_rows(src))
    assert len(rows) == 3 and rows[0]["public_tests"] == {"input": ["1 2\n"], "output": ["3\n"]}
    out = tmp_path / "cc.jsonl"
    assert main(["codecontests", str(src), "--out", str(out)]) == 0
    assert [r.prompt_id for r in load_records(out)] == EXPECTED_IDS["codecontests"]  # kept once
