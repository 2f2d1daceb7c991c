"""The math fast path gives math-verify's verdict: per rule, on a generated set of thousands of
pairs and on property-generated numbers, each compared with real math-verify (``score_math``,
in this process, on pytest's main thread as math-verify needs)."""

from __future__ import annotations

import logging
import random
from decimal import Decimal

import pytest
from hypothesis import given
from hypothesis import strategies as st

from services.reward.math_answer import score_math
from services.reward.math_fast import canonical_number, dedup_key, fast_verdict

logging.getLogger("math_verify").setLevel(logging.ERROR)


def same(fast: dict, slow: dict) -> bool:
    """``fast`` carries every field of math-verify's verdict, with the same values (it may add
    ``answer``, which score_math reports only in some versions)."""
    return {k: fast.get(k) for k in slow} == slow and set(fast) <= set(slow) | {"answer"}


B, A = "last_boxed", "answer_line"

# (response, ground truth, mode, decided by the fast path, correct)
RULES = [
    # 1a: canonical ground truth, no answer -> no_answer
    ("I am not sure.", "12", B, True, False),
    ("no answer line here", "3.5", A, True, False),
    # 1b: canonical numbers compared as decimals, as math-verify does
    (r"so \boxed{12}", "12", B, True, True),
    (r"\boxed{13}", "12", B, True, False),
    (r"\boxed{1.0}", "1", B, True, True),
    (r"\boxed{1}", "1.0", B, True, True),
    (r"\boxed{2.50}", "2.5", B, True, True),
    (r"\boxed{-7}", "-7", B, True, True),
    (r"\boxed{-7}", "7", B, True, False),
    (r"\boxed{0.5}", "50", B, True, False),
    (r"\boxed{50}", "0.5", B, True, False),
    (r"\boxed{1.000001}", "1", B, True, False),
    (r"\boxed{0}", "0.0", B, True, True),
    (r"\boxed{12}", " 12 \n", B, True, True),
    ("work\nAnswer: 42", "42", A, True, True),
    ("work\nFinal answer: $42$.", "42.0", A, True, True),
    (r"\boxed{123456789012345}", "123456789012345", B, True, True),
    (r"\boxed{123456789012345}", "123456789012346", B, True, False),
    # 1b: after a dollar sign
    (r"\boxed{\$ 5}", "5", B, True, True),
    (r"\boxed{\$5.50}", "5.5", B, True, True),
    (r"\boxed{\$5}", "6", B, True, False),
    # 1c: percentages: N or N/100
    (r"\boxed{50\%}", "0.5", B, True, True),
    (r"\boxed{50\%}", "50", B, True, True),
    (r"\boxed{50\%}", "1", B, True, False),
    (r"\boxed{12.5\%}", "0.125", B, True, True),
    (r"\boxed{0.12345\%}", "0.0012345", B, False, True),
    (r"\boxed{12.5\%}", "12.5", B, False, False),
    (r"\boxed{-5\%}", "-5", B, False, False),
    # 1d: fractions: exact against integers, rounded to 6 places against decimals
    (r"\boxed{\frac{1}{2}}", "0.5", B, True, True),
    (r"\boxed{\dfrac{4}{2}}", "2", B, True, True),
    (r"\boxed{\frac{1}{3}}", "0", B, True, False),
    (r"\boxed{\frac{1}{3}}", "0.333333", B, True, True),
    (r"\boxed{\frac{2}{3}}", "0.666667", B, True, True),
    (r"\boxed{\frac{1}{3}}", "0.333334", B, True, False),
    (r"\boxed{-\tfrac{5}{2}}", "-2.5", B, True, True),
    (r"\boxed{\frac{1}{2000000}}", "0.000001", B, False, False),  # a rounding tie
    (r"\boxed{\frac{x}{2}}", "0.5", B, False, False),
    # 1e: outside these forms or the limits -> math-verify decides
    (r"\boxed{1,000}", "1000", B, False, True),
    (r"\boxed{007}", "7", B, False, True),
    (r"\boxed{+3}", "3", B, False, True),
    (r"\boxed{-0}", "0", B, False, True),
    (r"\boxed{0.1234565}", "0.123457", B, False, False),
    (r"\boxed{1234567890123456}", "1234567890123456", B, False, True),
    (r"\boxed{12}", "1,2", B, False, False),
    # 2: identical simple forms -> correct; different ones -> math-verify
    (r"\boxed{\frac{3}{4}}", r"\frac{3}{4}", B, True, True),
    (r"\boxed{-2\sqrt{3}}", r"-2\sqrt{3}", B, True, True),
    (r"\boxed{\sqrt{2}}", r"\sqrt{2}", B, True, True),
    (r"\boxed{\pi}", r"\pi", B, True, True),
    (r"Answer: $3\pi$", r"3\pi", A, True, True),
    (r"\boxed{\frac{2}{4}}", r"\frac{1}{2}", B, False, True),
    (r"\boxed{x^2}", "x^2", B, False, True),
    (r"\boxed{\frac{1}{0}}", r"\frac{1}{0}", B, False, True),
    # the gsm8k modes never used math-verify: decided here by the same scorer
    ("#### 72", "72.0", "gsm8k", True, True),
    ("it is 71 apples", "72", "gsm8k_flexible", True, False),
    # math_verify mode extracts with math-verify itself: never decided here
    (r"\boxed{12}", "12", "math_verify", False, True),
]


@pytest.mark.parametrize(("response", "truth", "mode", "decided", "correct"), RULES)
def test_rule_gives_math_verify_verdict(
    response: str, truth: str, mode: str, decided: bool, correct: bool
) -> None:
    slow = score_math(response, truth, mode)
    fast = fast_verdict(response, truth, mode)
    assert slow["correct"] is correct, slow  # the case says what math-verify says
    assert (fast is not None) is decided
    if fast is not None:
        assert same(fast, slow)


def _number(rng: random.Random) -> str:
    """A canonical number, or a near-canonical one, of the shapes answers take."""
    whole = rng.choice(["0", str(rng.randint(1, 9)), str(rng.randint(10, 10**6)),
                        str(rng.randint(10**6, 10**15 - 1)), str(rng.randint(10**15, 10**17))])  # fmt: skip
    text = whole
    if rng.random() < 0.4:
        text += "." + "".join(rng.choice("0123456789") for _ in range(rng.randint(1, 8)))
    if rng.random() < 0.3:
        text = "-" + text
    return text


def _variant(rng: random.Random, truth: str) -> str:
    """An answer to compare with ``truth``: equal, equal in another form, near, or other."""
    roll = rng.random()
    if roll < 0.3:
        return truth
    if roll < 0.45:
        return truth + (".0" if "." not in truth else "0")
    if roll < 0.55 and "." in truth:
        return truth.rstrip("0").rstrip(".") or "0"
    if roll < 0.7:
        step = rng.choice(["1", "0.1", "0.000001", "0.0000001", "0.01"])
        return str(float(truth) + float(step)) if rng.random() < 0.5 else f"{truth}{step[-1]}"
    if roll < 0.8:
        return rng.choice(["-" + truth.lstrip("-"), "0" + truth.lstrip("-"), "+" + truth,
                           truth.replace(".", ","), truth + r"\%", f"{truth}e0",
                           rf"\${truth}", rf"\$ {truth}", f"{Decimal(truth) * 100}\\%",
                           f"{Decimal(truth) * 100:f}\\%"])  # fmt: skip
    if roll < 0.9:
        return _fraction(rng, truth)
    return _number(rng)


def _fraction(rng: random.Random, truth: str) -> str:
    """A fraction near or equal to ``truth``, or one that rounds to it (1/3 for 0.333333)."""
    b = rng.choice([2, 3, 4, 6, 7, 8, 9, 11, 16, 125, 2000000, rng.randint(1, 10**6)])
    value = abs(Decimal(truth)) if abs(Decimal(truth)) < 10**9 else Decimal(rng.randint(0, 99))
    a = int((value * b).to_integral_value()) + rng.choice([0, 0, 0, 1, -1])
    if a <= 0:
        a = rng.randint(1, 9)
    sign = "-" if truth.startswith("-") and rng.random() < 0.8 else ""
    return rf"{sign}\{rng.choice(['frac', 'dfrac', 'tfrac'])}{{{a}}}{{{b}}}"


def _response(rng: random.Random, answer: str, mode: str) -> str:
    if rng.random() < 0.05:
        return "I could not finish."
    if mode == A:
        return f"Working...\n{rng.choice(['Answer', 'Final answer', '**Answer**'])}: {answer}"
    return rng.choice([rf"The answer is \boxed{{{answer}}}.", rf"\boxed{{ {answer} }}",
                       f"so\nAnswer: {answer}", rf"\boxed{{1}} no, \boxed{{{answer}}}"])  # fmt: skip


def _simple(rng: random.Random) -> str:
    a, b = rng.randint(1, 400), rng.randint(1, 400)
    form = rng.choice([rf"\frac{{{a}}}{{{b}}}", rf"\sqrt{{{a}}}", rf"{a}\sqrt{{{b}}}", r"\pi",
                       rf"{a}\pi", rf"\dfrac{{{a}}}{{{b}}}", rf"{a}^{{{b % 5}}}"])  # fmt: skip
    return ("-" if rng.random() < 0.3 else "") + form


def generated_pairs(n: int, seed: int = 0) -> list[tuple[str, str, str]]:
    rng = random.Random(seed)
    pairs = []
    for _ in range(n):
        mode = B if rng.random() < 0.8 else A
        if rng.random() < 0.85:
            truth = _number(rng)
            answer = _variant(rng, truth)
            if rng.random() < 0.05:
                truth = f" {truth}\n"
        else:
            truth = _simple(rng)
            answer = truth if rng.random() < 0.6 else _simple(rng)
        pairs.append((_response(rng, answer, mode), truth, mode))
    return pairs


def test_generated_pairs_agree_with_math_verify() -> None:
    """3,000 generated pairs: every verdict the fast path gives is math-verify's, and it gives
    one for most of them (so a rule that stopped firing fails here too)."""
    pairs = generated_pairs(3000)
    decided, mismatches = 0, []
    for response, truth, mode in pairs:
        fast = fast_verdict(response, truth, mode)
        if fast is None:
            continue
        decided += 1
        slow = score_math(response, truth, mode)
        if not same(fast, slow):
            mismatches.append((response, truth, mode, fast, slow))
    assert not mismatches, mismatches[:5]
    assert decided >= 0.35 * len(pairs), decided  # 45% with seed 0


_digits = st.text("0123456789", min_size=1, max_size=8).map(lambda s: s.lstrip("0") or "0")


@st.composite
def canonical(draw: st.DrawFn) -> str:
    whole = draw(_digits)
    frac = draw(st.one_of(st.just(""), st.text("0123456789", min_size=1, max_size=6)))
    text = f"{whole}.{frac}" if frac else whole
    if draw(st.booleans()) and text.strip("0.") != "":
        text = "-" + text
    return text


@given(truth=canonical(), answer=canonical(), mode=st.sampled_from([B, A]))
def test_canonical_numbers_are_decided_as_math_verify_does(
    truth: str, answer: str, mode: str
) -> None:
    response = rf"\boxed{{{answer}}}" if mode == B else f"Answer: {answer}"
    fast = fast_verdict(response, truth, mode)
    assert fast is not None  # both canonical and within the limits: always decided here
    assert same(fast, score_math(response, truth, mode))


@given(truth=canonical())
def test_an_equal_value_in_another_form_is_correct(truth: str) -> None:
    answer = truth + ("0" if "." in truth else ".0")
    if canonical_number(answer) is None:
        return  # one digit past the limits
    fast = fast_verdict(rf"\boxed{{{answer}}}", truth, B)
    assert fast is not None and fast["correct"] is True
    assert same(fast, score_math(rf"\boxed{{{answer}}}", truth, B))


def test_dedup_key_is_the_extracted_answer() -> None:
    a = dedup_key(r"long reasoning one \boxed{x+1}", "1+x", B)
    assert a == dedup_key(r"other words \boxed{x+1}", "1+x", B)
    assert a != dedup_key(r"\boxed{x+1}", "1+x", A)  # another mode
    assert a != dedup_key(r"\boxed{x+1}", "x+1", B)  # another ground truth
    assert a != dedup_key(r"\boxed{x+2}", "1+x", B)
    # math_verify mode extracts from the whole response: the response is the key
    assert dedup_key("a $x$", "x", "math_verify") != dedup_key("b $x$", "x", "math_verify")
