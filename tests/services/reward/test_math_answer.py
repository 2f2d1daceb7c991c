"""The math scorer in-process: extraction helpers and verdicts, without the reward server.

test_math.py sends the same cases through a real server, whose worker processes import their own
copy of :mod:`services.reward.math_answer`; these tests call it directly so that a change to the
module (a mutant, in scripts/mutation.py) is seen by the test process too.
"""

from __future__ import annotations

import threading

import pytest

from services.reward.math_answer import (
    answer_line,
    extract_gsm8k,
    extract_last_boxed,
    last_boxed,
    score_gsm8k,
    score_math,
)
from tests.services.reward.math_cases import CASES


@pytest.mark.parametrize(("response", "ground_truth", "mode", "correct", "reason"), CASES)
def test_math_case_in_process(
    response: str, ground_truth: str, mode: str, correct: bool, reason: str
) -> None:
    res = score_math(response, ground_truth, mode)  # type: ignore[arg-type]
    assert (res["correct"], res["reason"]) == (correct, reason), res
    assert res["format_ok"] is (reason != "no_answer")


@pytest.mark.parametrize(
    ("text", "boxed"),
    [
        (r"\boxed{1} then \boxed{2}", "2"),  # the last box
        (r"\boxed{\frac{1}{2}}", r"\frac{1}{2}"),  # nested braces
        (r"\boxed {  7 }", "7"),  # spaces before the brace and inside are dropped
        (r"\fbox{3}", "3"),
        (r"\boxed{a\}b}", r"a\}b"),  # an escaped brace does not close the box
        (r"\boxed{a\{b}", r"a\{b"),  # nor does an escaped one open a level
        (r"\boxed{5} and \boxed{6", "5"),  # the unbalanced last box: the one before
        (r"\boxed 5$ more", "5"),  # no brace: one token up to whitespace or '$'
        (r"\boxed 12 apples", "12"),
        (r"\boxed{\frac{a}{b}}", r"\frac{a}{b}"),
        (r"\boxed{\left\{1,2\right\}}", r"\left\{1,2\right\}"),
        (r"\boxed{ 7 }", "7"),
        (r"\boxed 5$", "5"),
        (r"\fbox{x}", "x"),
        (r"\boxed{2} and an unbalanced \boxed{3", "2"),
        (r"\boxed{}", None),  # an empty box is no answer
        (r"\boxed{ }", None),
        (r"\boxed", None),
        (r"\boxed$", None),
        (r"\boxedx", None),  # not the box command followed by a token
        ("no box", None),
    ],
)
def test_last_boxed(text: str, boxed: str | None) -> None:
    assert last_boxed(text) == boxed


@pytest.mark.parametrize(
    ("text", "answer"),
    [
        ("Work\nAnswer: 34", "34"),
        ("Answer: 1\nAnswer: 2", "2"),  # the last line
        ("**Final Answer:** $x^2$.", "x^2"),  # markup, dollars and the final period dropped
        ("answer is: 7", "7"),
        ("ANSWER：  9  ", "9"),  # a full-width colon, case-insensitive, spaces trimmed
        ("> Answer: $5", "$5"),  # one dollar sign is part of the answer
        ("Answer: $", "$"),  # a lone dollar is not a pair
        ("Answer: .", None),  # nothing left after the period
        ("Answer: $ $", None),
        ("Answer: $$", None),  # an empty pair
        ("Answer: **X**", "X"),  # only markup and dollars are stripped, not letters
        ("Answer: __5__", "5"),
        ("Answer: $X$", "X"),
        ("My answer 3", None),
        ("Answer: 12", "12"),
        ("work\nFinal answer: $\\frac{1}{2}$.", "\\frac{1}{2}"),
        ("**Answer:** 7", "7"),
        ("answer: 1\nAnswer: 2", "2"),
        ("The answer is below", None),
    ],
)
def test_answer_line(text: str, answer: str | None) -> None:
    assert answer_line(text) == answer


def test_extract_last_boxed_falls_back_to_the_answer_line() -> None:
    assert extract_last_boxed("Answer: 3") == "3"
    assert extract_last_boxed("\\boxed{4}\nAnswer: 3") == "4"
    assert extract_last_boxed("\\boxed{3}\nAnswer: 4") == "3"  # the box wins
    assert extract_last_boxed("\\boxed{}\nAnswer: 3") == "3"
    assert extract_last_boxed("nothing") is None


@pytest.mark.parametrize(
    ("text", "flexible", "number"),
    [
        ("#### 1,234", False, "1234"),
        ("#### $72.", False, "72"),
        ("#### -3\n#### 4", False, "4"),
        ("####-.5", False, "-.5"),
        ("the answer is 72", False, None),  # strict needs the hashes
        ("I got 7 then 8.", True, "8"),
        ("costs $1,000.", True, "1000"),
        ("-.25 or -", True, "-.25"),
        ("no digits", True, None),
    ],
)
def test_extract_gsm8k(text: str, flexible: bool, number: str | None) -> None:
    assert extract_gsm8k(text, flexible) == number


def test_extract_gsm8k_default_is_strict() -> None:
    assert extract_gsm8k("I got 7") is None


def test_score_gsm8k_verdicts_and_details() -> None:
    assert score_gsm8k("#### 72.0", "72", False) == {
        "correct": True, "format_ok": True, "reason": "ok", "detail": "answer '72.0'",
        "answer": "72.0",
    }  # fmt: skip
    assert score_gsm8k("#### 73", "So 9 + 63 = 72.\n#### 72", False) == {
        "correct": False, "format_ok": True, "reason": "wrong_answer", "detail": "answer '73'",
        "answer": "73",
    }  # fmt: skip
    assert score_gsm8k("72", "72", False) == {
        "correct": False, "format_ok": False, "reason": "no_answer", "detail": "no '#### N' line",
    }  # fmt: skip
    assert score_gsm8k("words", "72", True)["detail"] == "no number in the response"
    assert score_gsm8k("it is 72", "72", True)["correct"] is True
    res = score_gsm8k("#### 1", "#### none", False)
    assert (res["correct"], res["format_ok"], res["reason"]) == (False, False, "bad_ground_truth")
    assert res["detail"] == "no number in the ground truth '#### none'"
    assert score_gsm8k("#### 1", "", False)["reason"] == "bad_ground_truth"
    # a non-number compares as text
    assert score_gsm8k("#### 1.2.3", "1.2.3", False)["correct"] is True
    assert score_gsm8k("#### 1.2.3", "1.2.4", False)["correct"] is False


def test_score_math_routes_gsm8k_modes_and_reports_each_reason() -> None:
    assert score_math("#### 5", "5", "gsm8k")["correct"] is True
    assert score_math("it is 5", "5", "gsm8k")["reason"] == "no_answer"
    assert score_math("it is 5", "5", "gsm8k_flexible")["correct"] is True
    res = score_math("\\boxed{2}", "2", "last_boxed")
    assert res == {
        "correct": True, "format_ok": True, "reason": "ok", "detail": "answer '2'", "answer": "2",
    }  # fmt: skip
    res = score_math("\\boxed{3}", "2", "last_boxed")
    assert (res["reason"], res["detail"]) == ("wrong_answer", "answer '3'")
    res = score_math("nothing", "2", "last_boxed")
    assert res["detail"] == "no \\boxed{} answer and no 'Answer:' line"
    assert score_math("\\boxed{2}", "2", "answer_line")["detail"] == "no 'Answer:' line"
    assert score_math("Answer: 2", "2", "answer_line")["correct"] is True
    res = score_math("no maths here", "2", "math_verify")
    assert (res["reason"], res["detail"]) == ("no_answer", "math-verify found no answer")
    res = score_math("so $x = 2$", "2", "math_verify")
    assert res["correct"] is True and res["detail"] == "answer 'x = 2'"
    res = score_math("\\boxed{1}", "\\boxed{}", "last_boxed")
    assert (res["correct"], res["format_ok"], res["reason"]) == (False, False, "bad_ground_truth")
    assert res["detail"].startswith("math-verify could not parse the ground truth '\\\\boxed{}'")
    res = score_math("Answer: }", "2", "answer_line")  # extracted, but not an expression
    assert (res["correct"], res["format_ok"], res["reason"]) == (False, True, "wrong_answer")
    assert res["detail"] == "answer '}' could not be parsed"


def test_a_long_bad_ground_truth_is_quoted_up_to_200_characters() -> None:
    truth = "#### " + "x" * 300
    assert score_gsm8k("#### 1", truth, False)["detail"] == (
        f"no number in the ground truth {truth[:200]!r}"
    )


def test_gsm8k_flexible_is_scored_by_the_gsm8k_rules_not_math_verify() -> None:
    for text in ("so the total is 1,234 dollars", "no digits here"):
        assert score_math(text, "1234", "gsm8k_flexible") == score_gsm8k(text, "1234", True)
    assert (
        score_math("no digits here", "1", "gsm8k_flexible")["detail"]
        != (score_math("no digits here", "1", "math_verify")["detail"])
    )


def test_score_math_runs_off_the_main_thread() -> None:
    """math-verify's own timeouts (signal.alarm, main thread only) are off: the service bounds
    the time itself, in worker processes."""
    out: list[dict] = []

    def score_both() -> None:
        out.extend(score_math(r"\boxed{5}", "5", mode) for mode in ("math_verify", "last_boxed"))

    t = threading.Thread(target=score_both)
    t.start()
    t.join(60)
    assert [r["correct"] for r in out] == [True, True]


def test_long_answers_and_ground_truths_are_quoted_up_to_200_characters() -> None:
    bad = "}" * 300
    res = score_math("Answer: " + bad, "2", "answer_line")
    assert res["detail"] == f"answer {bad[:200]!r} could not be parsed" and res["answer"] == bad
    long = "1+" * 150 + "1"
    res = score_math("Answer: " + long, "2", "answer_line")
    assert res["detail"] == f"answer {long[:200]!r}" and res["answer"] == long
    res = score_math(r"\boxed{1}", bad, "last_boxed")
    assert res["detail"] == f"math-verify could not parse the ground truth {bad[:200]!r}"
    digits = "1" * 300
    assert score_gsm8k("#### " + digits, "2", False)["detail"] == f"answer {digits[:200]!r}"
