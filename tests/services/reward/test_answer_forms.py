"""The answer forms verl's scorers accept, in-process: the ``Answer:`` line, the whole-response
parse, Search-R1 exact match, call-based code rows, and routes' partial-credit option.

test_verl_parity.py sends the same kinds of cases through a real service; these call the modules
directly so that a change to them is seen by the test process too.
"""

from __future__ import annotations

import pytest

from dynamo_rl.config import ConfigError, load_config
from dynamo_rl.contracts.reward import CodeItem
from services.reward.code_scorer import CALL_IMPORTS, _check_call, with_call_imports
from services.reward.math_answer import (
    extract,
    find_answer_line,
    is_prose,
    prose_words,
    reads_as_math_verify,
    score_math,
    whole_response,
)
from services.reward.math_fast import dedup_key, fast_verdict
from services.reward.qa_answer import normalize, score_qa, targets
from services.reward.routes import Routes
from services.rollout.datasets import DatasetError, record_from_row


@pytest.mark.parametrize(
    ("text", "answer"),
    [
        ("Therefore, the final answer: 34", "34"),
        ("so the answer is: $\\frac{1}{2}$.", "\\frac{1}{2}"),
        ("**Final Answer:** 7", "7"),
        ("Answer: x = 1 or x = 2", "x = 1 or x = 2"),  # 'or' is not prose
        ("Answer: 5 cm", "5 cm"),  # one word (a unit) may follow
        ("Answer: 13\n\nI hope this helps.", "13"),  # later lines without a marker do not count
        ("My answer: 3\nThe answer: 4", "4"),  # the last marker
        ("answer: 1 and the answer: 2", "2"),  # the last marker on the line
        ("Reanswer: 5", None),  # 'answer' must start a word
        ("Answer: $34$ since 2 times 17", None),
        ("Answer: $34$ apples", None),  # text after the closing $
        ("If the answer: 12 were right, it would be odd.", None),
        ("Answer: 13\nThe answer: 12 is wrong here.", None),  # the last marker line decides
        ("Answer: 12 是错的", None),  # prose in another script
        ("答案是 answer: 12", "12"),
    ],
)
def test_answer_line_anywhere_on_a_line_that_ends_with_the_answer(
    text: str, answer: str | None
) -> None:
    assert find_answer_line(text)[0] == answer


def test_answer_line_reasons() -> None:
    assert find_answer_line("no marker") == (None, "no 'Answer:' line")
    assert find_answer_line("Answer: **") == (None, "nothing after the last 'Answer:'")
    why = find_answer_line("The answer: 12 is wrong")[1]
    assert why == "the last 'Answer:' line goes on after its answer: 'The answer: 12 is wrong'"
    assert extract("nothing", "last_boxed")[1] == "no \\boxed{} answer and no 'Answer:' line"
    assert extract("The answer: 1 is odd", "last_boxed")[1].startswith(
        "no \\boxed{} answer, and the last 'Answer:' line goes on"
    )
    assert extract("\\boxed{2}\nThe answer: 1 is odd", "last_boxed") == ("2", "")


def test_prose_words_ignore_latex_and_math_words() -> None:
    assert prose_words(r"\begin{pmatrix} 1 \end{pmatrix} \text{cm} \sqrt{x} sin or and") == []
    assert prose_words("12 is wrong, x") == ["is", "wrong"]
    assert is_prose("12 is wrong") and is_prose("12 错的") and not is_prose("12 cm")


MATRIX = r"\begin{pmatrix} 1 & 2 \\ 3 & 19 \end{pmatrix}"


@pytest.mark.parametrize(
    ("text", "answer"),
    [
        (MATRIX, MATRIX),
        ("x^2 + 3x + 5.", "x^2 + 3x + 5"),  # the final period dropped
        ("There are 5 apples.", "5"),  # words around one number
        ("It is -3 degrees", "-3"),
        ("It is 1,000 metres", "1,000"),
        ("Yes", "Yes"),  # one word is an answer, not prose
        ("Work\nAnswer: 7", "7"),
        ("I added 2 and 3 to get 5", None),  # several numbers
        ("It is x + 1 apples for sure", None),  # words around a formula
        ("There are no numbers here", None),
        ("   ", None),
        ("The answer: 12 is wrong", None),  # the answer line's refusal stands
        ("所以答案是 5。", "5"),  # words in another script around one number
        ("x = 5 所以", None),
    ],
)
def test_whole_response(text: str, answer: str | None) -> None:
    assert whole_response(text)[0] == answer


def test_whole_response_reads_delimited_text_as_math_verify() -> None:
    assert reads_as_math_verify(r"so \boxed{2}")
    assert reads_as_math_verify("so $x = 2$") and reads_as_math_verify(r"so \(x\)")
    assert not reads_as_math_verify("so $x$\nAnswer: 2")  # the answer line first
    assert reads_as_math_verify("Answer: 3 \\boxed{2}")  # a box first
    assert not reads_as_math_verify(MATRIX)


@pytest.mark.parametrize(
    ("response", "truth", "correct", "reason"),
    [
        (MATRIX, MATRIX, True, "ok"),
        (MATRIX, "19", False, "wrong_answer"),
        ("x^2 + 3x + 5", "5", False, "wrong_answer"),
        (r"2\sqrt{3}", r"\sqrt{12}", True, "ok"),
        (r"2\sqrt{3}", "2", False, "wrong_answer"),
        ("There are 5 apples.", "5", True, "ok"),
        ("I added 2 and 3 to get 5", "5", False, "no_answer"),
        (r"The roots are \boxed{2} and \boxed{3}.", "2, 3", True, "ok"),  # boxes combined
        ("Final answer: $12$ was a slip, so go on", "12", False, "no_answer"),
    ],
)
def test_score_math_whole_response(response: str, truth: str, correct: bool, reason: str) -> None:
    res = score_math(response, truth, "whole_response")
    assert (res["correct"], res["reason"]) == (correct, reason), res


def test_whole_response_is_never_decided_by_the_fast_path() -> None:
    assert fast_verdict("42", "42", "whole_response") is None


def test_refusals_quoting_their_line_do_not_share_a_verdict() -> None:
    one = dedup_key("The answer: 1 is odd", "x", "answer_line")
    assert one != dedup_key("The answer: 2 is even", "x", "answer_line")
    assert dedup_key("no marker", "x", "answer_line") == dedup_key("none", "x", "answer_line")


def test_qa_normalisation_and_targets() -> None:
    assert normalize("  The  Eiffel-Tower!! ") == "eiffeltower"
    assert normalize("a cat and an owl") == "cat and owl"
    assert targets('["Paris", "City of Paris"]') == ["Paris", "City of Paris"]
    assert targets("[1, 2]") == ["[1, 2]"]  # not a list of strings: one answer
    assert targets("[unclosed") == ["[unclosed"]
    assert targets("[]") == ["[]"]
    assert targets("Paris") == ["Paris"]


@pytest.mark.parametrize(
    ("response", "truth", "correct", "reason"),
    [
        ("<answer>paris.</answer>", '["Paris"]', True, "ok"),
        ("<answer>Lyon</answer><answer>The Paris</answer>", "Paris", True, "ok"),
        ("<answer>Paris</answer><answer>Lyon</answer>", "Paris", False, "wrong_answer"),
        ("<answer>Paris, France</answer>", "Paris", False, "wrong_answer"),
        ("Paris", "Paris", False, "no_answer"),
        ("<answer>the</answer>", "The", False, "bad_ground_truth"),
        ("<answer> . </answer>", "Paris", False, "no_answer"),
        ("<answer>x</answer>" * 10 + "<answer>Paris</answer>", "Paris", False, "wrong_answer"),
        ("<answer>x</answer>" * 9 + "<answer>Paris</answer>", "Paris", True, "ok"),
    ],
)
def test_score_qa(response: str, truth: str, correct: bool, reason: str) -> None:
    res = score_qa(response, truth)
    assert (res["correct"], res["reason"]) == (correct, reason), res
    assert score_math(response, truth, "qa_exact_match") == res
    assert fast_verdict(response, truth, "qa_exact_match") == res


def test_call_imports_come_first_but_after_future_imports() -> None:
    code = "from __future__ import annotations\nx: List[int] = []\n"
    out = with_call_imports(code)
    assert out.startswith("from __future__ import annotations\n" + CALL_IMPORTS)
    assert out.count("from __future__") == 1 and out.endswith("x: List[int] = []\n")
    assert "from typing import *\n" in CALL_IMPORTS and "import collections\n" in CALL_IMPORTS
    # builtins come back after the star imports (math's pow would shadow the 3-argument one).
    assert CALL_IMPORTS.index("from builtins import *") > CALL_IMPORTS.index("from math import *")
    namespace: dict[str, object] = {}
    exec(compile(with_call_imports("y = defaultdict(int)\nz = pow(2, 5, 3)\n"), "p", "exec"),
         namespace)  # fmt: skip
    assert namespace["z"] == 2


def test_check_call_matches_the_expected_text_only_for_a_string() -> None:
    assert _check_call("M", 5, b'M"5"\n', expected_text="5\n") == (True, "")
    assert _check_call("M", 5, b'M"5"\n') == (False, 'expected 5, got "5"')
    assert _check_call("M", 5, b'M"6"\n', expected_text="5")[0] is False


def test_loader_reads_json_line_arguments_and_text_outputs() -> None:
    tests = {"fn_name": "f", "inputs": ["[1, 2]\n3\n", [4]], "outputs": ["[1, 2]", 7]}
    record = record_from_row({"prompt": "q", "kind": "code", "tests": tests}, 0)
    assert record.reward_extra["tests"]["cases"] == [
        {"args": [[1, 2], 3], "expected": [1, 2], "expected_text": "[1, 2]"},
        {"args": [4], "expected": 7},
    ]
    apps = {"fn_name": "f", "inputs": [[1]], "outputs": ["5"]}  # APPS: a string is the value
    case = record_from_row({"prompt": "q", "kind": "code", "tests": apps}, 0)
    assert case.reward_extra["tests"]["cases"] == [{"args": [1], "expected": "5"}]
    text = {"fn_name": "f", "inputs": ['"a"'], "outputs": ["not json"]}
    case = record_from_row({"prompt": "q", "kind": "code", "tests": text}, 0)
    assert case.reward_extra["tests"]["cases"][0]["expected"] == "not json"
    bad = {"fn_name": "f", "inputs": ["[1,\n2]"], "outputs": ["3"]}
    with pytest.raises(DatasetError, match=r"row 4: tests case 0: input is not one JSON value"):
        record_from_row({"prompt": "q", "kind": "code", "tests": bad}, 4)
    bad = {"fn_name": "f", "inputs": [3], "outputs": ["3"]}
    with pytest.raises(DatasetError, match="a list of arguments or JSON lines per input"):
        record_from_row({"prompt": "q", "kind": "code", "tests": bad}, 0)


def test_loader_turns_search_r1_targets_into_a_json_list() -> None:
    row = {"prompt": "q", "data_source": "searchR1_nq",
           "reward_model": {"ground_truth": {"target": ["Paris", "City of Paris"]}}}  # fmt: skip
    record = record_from_row(row, 0)
    assert (record.kind, record.ground_truth) == ("math", '["Paris", "City of Paris"]')
    row["reward_model"] = {"ground_truth": {"target": "Paris"}}
    assert record_from_row(row, 0).ground_truth == '["Paris"]'


def code_item(**kw: object) -> CodeItem:
    tests = {"type": "stdio", "cases": [{"stdin": "", "stdout": "1"}]}
    return CodeItem.model_validate({"id": 1, "kind": "code", "response": "", "tests": tests, **kw})


def test_routes_fill_first_cases_where_the_item_has_none() -> None:
    cfg = load_config(overrides=["reward.routes.apps.first_cases=10"]).reward
    routes = Routes(cfg.routes)
    assert routes.apply(code_item(data_source="apps")).first_cases == 10
    assert routes.apply(code_item(data_source="apps", first_cases=3)).first_cases == 3
    assert routes.apply(code_item(data_source="taco")).first_cases is None  # the default: all
    assert cfg.routes["apps"] is not None and cfg.routes["apps"].scoring == "fraction"  # merged
    with pytest.raises(ConfigError, match="scoring and first_cases are for kind 'code'"):
        load_config(overrides=["reward.routes.math.first_cases=10"])
    with pytest.raises(ConfigError, match=r"reward\.routes\.apps\.first_cases"):
        load_config(overrides=["reward.routes.apps.first_cases=0"])
