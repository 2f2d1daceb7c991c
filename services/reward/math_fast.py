"""The math fast path: verdicts that need no symbolic work, computed in the service process.

Most math answers in RL rollouts are plain numbers ("\\boxed{42}" against "42"). For those,
math-verify spends milliseconds in its LaTeX parser (ANTLR) and sympy to reach a verdict that a
string or decimal comparison gives in microseconds. :func:`fast_verdict` returns the verdict
:func:`services.reward.math_answer.score_math` would (same ``correct``, ``format_ok``,
``reason`` and ``detail``) for the pairs it recognises, and ``None`` for everything else, which
then goes to the worker pool. The rules, for the ``last_boxed`` and ``answer_line`` modes (the
answer is extracted by the same functions ``score_math`` uses):

1. **canonical numbers**: the ground truth (surrounding whitespace stripped) is a canonical
   number — ``-?(0|[1-9][0-9]*)(.[0-9]+)?``, not a negative zero, at most
   :data:`MAX_DIGITS` digits and at most :data:`MAX_FRACTION_DIGITS` after the point — then:

   a. no answer found: ``no_answer`` (the ground truth parses, so math-verify would say the same);
   b. the answer is a canonical number too, or one after a dollar sign (``\\$ 12``, ``\\$12``):
      correct iff the two are equal as decimals (``2.50`` = ``2.5``, ``2.0`` = ``2``).
      math-verify compares an integer with an integer exactly and a decimal with anything after
      rounding both to 6 places; with at most 6 fractional digits and 15 significant ones that
      rounding changes nothing, so decimal equality is its verdict;
   c. the answer is a percentage ``N\\%`` (N canonical, at most 4 fractional digits): correct
      when N/100 equals the ground truth (``50\\%`` = ``0.5``), and when N does and both are
      non-negative integers (``50\\%`` = ``50``: math-verify accepts that, but not
      ``12.5\\%`` = ``12.5`` or ``-5\\%`` = ``-5``, which are left to it); wrong otherwise;
   d. the answer is a fraction ``\\frac{a}{b}`` (or ``\\dfrac``, ``\\tfrac``, with an optional
      minus sign; a, b positive integers of at most 9 digits): against an integer, correct iff
      a/b equals it exactly (math-verify compares rationals and integers exactly); against a
      decimal, correct iff a/b rounded to 6 places equals it (math-verify rounds both sides when
      one is a float) — except when |a/b| >= 10^8 or a/b lies within a relative 10^-12 of a
      rounding tie: those are left to math-verify;
   e. anything else (``1,000``, ``+3``, ``007``, ``\\frac{x}{2}``): not decided here.

2. **exact match of a simple form**: answer and ground truth are the same string and that string
   is a signed canonical integer fraction, square root or multiple of pi (``\\frac{3}{4}``,
   ``-2\\sqrt{3}``, ``\\pi``; :data:`_SIMPLE`) — forms math-verify always parses, and both sides
   go through the same ``parse`` call, so ``verify`` compares a parse with itself: correct.
   Different strings of these forms (``\\frac{2}{4}`` against ``\\frac{1}{2}``) are not decided.

``gsm8k`` / ``gsm8k_flexible`` and ``qa_exact_match`` never used math-verify: their scorers are pure
string and decimal work and run here unchanged. ``math_verify`` mode extracts with math-verify
itself over the whole response, and ``whole_response`` often parses the whole response, so both
always go to the pool.

Each rule is checked against real math-verify on thousands of generated pairs and by property
tests (``tests/services/reward/test_math_fast.py``); ``reward.math.fast_path=false`` turns the
fast path off.
"""

from __future__ import annotations

import re
from decimal import Decimal
from fractions import Fraction
from typing import Any

from services.reward.math_answer import extract, score_plain
from services.reward.verdicts import verdict

MAX_DIGITS = 15
"""Digits of a canonical number (math-verify's numeric comparison works to 15 significant
digits; beyond that its verdict and decimal equality could differ)."""
MAX_FRACTION_DIGITS = 6
"""Digits after the point (math-verify rounds floats to 6 places before comparing)."""

_CANONICAL = re.compile(r"-?(?:0|[1-9][0-9]*)(?:\.[0-9]+)?")
_DOLLAR = re.compile(r"\\\$ ?(?P<n>\S+)")
_PERCENT = re.compile(r"(?P<n>\S+?)\\%")
_FRACTION = re.compile(
    r"(?P<sign>-?)\\[dt]?frac\{(?P<a>[1-9][0-9]{0,8})\}\{(?P<b>[1-9][0-9]{0,8})\}"
)
_TIE_MARGIN = Fraction(1, 10**12)
_INT = r"[1-9][0-9]{0,14}"
_SIMPLE = re.compile(
    rf"-?(?:\\frac\{{{_INT}\}}\{{{_INT}\}}|(?:{_INT})?\\sqrt\{{{_INT}\}}|(?:{_INT})?\\pi)"
)


def canonical_number(text: str) -> Decimal | None:
    """``text`` as a decimal when it is a canonical number within the limits, else None."""
    if not _CANONICAL.fullmatch(text):
        return None
    digits = text.lstrip("-")
    whole, _, fraction = digits.partition(".")
    if len(whole) + len(fraction) > MAX_DIGITS or len(fraction) > MAX_FRACTION_DIGITS:
        return None
    value = Decimal(text)
    if value == 0 and text.startswith("-"):
        return None  # "-0": left to math-verify
    return value


def fast_verdict(response: str, ground_truth: str, mode: str) -> dict[str, Any] | None:
    """``score_math``'s verdict when a rule above decides it, else None."""
    plain = score_plain(response, ground_truth, mode)
    if plain is not None:
        return plain
    if mode not in ("last_boxed", "answer_line"):
        return None
    answer, missing = extract(response, mode)
    gold = canonical_number(ground_truth.strip())
    if gold is not None:
        if answer is None:
            return {"correct": False, "format_ok": False, "reason": "no_answer", "detail": missing}
        correct = _compare(answer, ground_truth.strip(), gold)
        return None if correct is None else verdict(correct, answer)
    if answer is not None and answer == ground_truth and _SIMPLE.fullmatch(answer):
        return verdict(True, answer)
    return None


def _compare(answer: str, truth: str, gold: Decimal) -> bool | None:
    """Rules 1b-1d: whether ``answer`` equals the canonical ground truth, or None (undecided)."""
    dollar = _DOLLAR.fullmatch(answer)
    pred = canonical_number(dollar.group("n") if dollar else answer)
    if pred is not None:
        return pred == gold
    percent = _PERCENT.fullmatch(answer)
    if percent:
        n = canonical_number(percent.group("n"))
        if n is None or len(percent.group("n").partition(".")[2]) > MAX_FRACTION_DIGITS - 2:
            return None
        if n / 100 == gold:
            return True
        if n == gold:  # math-verify takes "50\\%" for 50 only for whole numbers
            plain = "." not in truth and not percent.group("n").startswith("-")
            return True if plain and "." not in percent.group("n") else None
        return False
    fraction = _FRACTION.fullmatch(answer)
    if fraction:
        value = Fraction(int(fraction.group("a")), int(fraction.group("b")))
        if fraction.group("sign"):
            value = -value
        if "." not in truth:
            return value == Fraction(gold)
        if abs(value) >= 10**8:  # 6 decimals would lie past math-verify's 15 digits
            return None
        scaled = value * 10**MAX_FRACTION_DIGITS
        whole = scaled.numerator // scaled.denominator
        rest = scaled - whole
        if abs(rest - Fraction(1, 2)) < _TIE_MARGIN * max(1, abs(scaled)):
            return None
        rounded = whole + (1 if rest > Fraction(1, 2) else 0)
        return Fraction(rounded, 10**MAX_FRACTION_DIGITS) == Fraction(gold)
    return None


def dedup_key(response: str, ground_truth: str, mode: str) -> tuple[str, str, str | None, str]:
    """What ``score_math``'s verdict depends on: in the extracting modes only the extracted
    answer (or, with none, why: the detail may quote the response), so two responses with the
    same final answer share one math-verify call."""
    if mode in ("last_boxed", "answer_line"):
        return (mode, ground_truth, *extract(response, mode))
    return (mode, ground_truth, response, "")
