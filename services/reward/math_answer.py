"""Math answers: extraction from free text and comparison with math-verify.

Extraction modes:

- ``last_boxed`` (default; what verl/OpenRLHF recipes do): the last ``\\boxed{…}`` (or ``\\fbox``)
  with balanced braces, else the ``Answer:`` line (below). The extracted text is parsed as a boxed
  LaTeX answer.
- ``answer_line``: the ``Answer:`` line only (DAPO-Math and AIME prompts ask for one). The last
  line with an ``answer:`` marker (``Answer:``, ``Final answer:``, ``the final answer: 34``,
  ``answer is:``; anywhere on the line, markdown emphasis allowed) holds the answer, which is the
  rest of that line. The line must end with the answer: when the rest of the line goes on in
  words ("Answer: 12 is what I first thought") or after a ``$…$`` answer, there is no answer.
- ``math_verify``: math-verify's own LaTeX extraction over the whole response, boxed answers first;
  several boxes are combined into one answer, which multi-part answers such as "(2, 3) and (6, 2)"
  need.
- ``whole_response`` (verl's ``numina_*`` sources, whose answers are often written bare): a response
  with a box is read as ``math_verify`` reads it; else the ``Answer:`` line when there is one; else,
  with a LaTeX delimiter (``$``, ``\\(``, ``\\[``), as ``math_verify``; else the whole response is
  one LaTeX expression (a matrix, ``\\frac{1+\\sqrt{5}}{2}``, ``x^2+3x+5``). A response in words
  falls back to its number only when it has exactly one number and no mathematical sign, so the
  fallback can never pick one number out of a formula.
- ``gsm8k``: the last ``#### N`` (GSM8K's own answer format); ``gsm8k_flexible``: the last number
  anywhere. Both compare numbers, not LaTeX: commas and ``$`` removed, ``72.0`` equals ``72``; a
  ground truth that is a whole GSM8K solution counts by its ``#### N``.
- ``qa_exact_match`` (Search-R1-style question answering): the last ``<answer>…</answer>`` compared
  with the ground truth after normalisation (:mod:`services.reward.qa_answer`).

The comparison of the math modes is ``math_verify.verify(gold, prediction)`` — gold first:
math-verify's comparison is deliberately asymmetric. :func:`score_math` imports math-verify and must run on a process's main
thread with a timeout of the caller's (math-verify's own timeouts use ``signal.alarm`` and are
disabled here); the worker pool in :mod:`services.reward.math_pool` provides both.
"""

from __future__ import annotations

import re
from decimal import Decimal, InvalidOperation
from typing import Any

from dynamo_rl.contracts.reward import Extraction as ExtractionMode
from services.reward.qa_answer import score_qa
from services.reward.verdicts import bad_ground_truth, no_answer, verdict

_BOX = re.compile(r"\\(?:boxed|fbox)")
_MARKER = re.compile(r"(?<![A-Za-z])answer[ \t*_]*(?:is[ \t*_]*)?[:：]", re.IGNORECASE)
_LATEX_NAMES = re.compile(r"\\(?:begin|end|text|mathrm|textbf|operatorname)\{[^{}]*\}|\\[A-Za-z]+")
_WORD = re.compile(r"[^\W\d_]{2,}")
MATH_WORDS = frozenset({"and", "or", "sqrt", "pi", "inf", "infty", "sin", "cos", "tan", "cot",
                        "sec", "csc", "log", "ln", "exp", "mod", "arcsin", "arccos", "arctan"})  # fmt: skip
"""Words an answer may contain ("x = 1 or x = 2", "sqrt(2)") without counting as prose."""


def last_boxed(text: str) -> str | None:
    """Content of the last ``\\boxed{...}`` with balanced braces (or ``\\boxed x``), else None."""
    for match in reversed(list(_BOX.finditer(text))):
        i = match.end()
        while i < len(text) and text[i] == " ":
            i += 1
        if i < len(text) and text[i] == "{":
            depth = 0
            for j in range(i, len(text)):
                c = text[j]
                if c == "{" and text[j - 1] != "\\":  # an escaped brace (\{) does not count
                    depth += 1
                elif c == "}" and text[j - 1] != "\\":
                    depth -= 1
                    if depth == 0:
                        content = text[i + 1 : j].strip()
                        return content or None
            continue  # unbalanced: try an earlier box
        if i > match.end():  # "\boxed 5": one token up to whitespace or a dollar sign
            token = re.match(r"[^\s$]+", text[i:])
            if token:
                return token.group(0)
    return None


def prose_words(text: str) -> list[str]:
    """The words of ``text`` that are neither LaTeX (command names, environment names, text in
    ``\\text{}``) nor in :data:`MATH_WORDS`."""
    plain = _LATEX_NAMES.sub(" ", text)
    return [w for w in _WORD.findall(plain) if w.lower() not in MATH_WORDS]


def is_prose(text: str) -> bool:
    """Two or more words of prose, or one in a script other than ASCII (Chinese runs its words
    together)."""
    words = prose_words(text)
    return len(words) >= 2 or any(not w.isascii() for w in words)


def _goes_on(answer: str) -> bool:
    """Whether an answer line's text goes on past its answer: prose, or anything but punctuation
    after a closing ``$``."""
    if is_prose(answer):
        return True
    return answer.count("$") >= 2 and bool(answer.rstrip(" \t.,;!").rsplit("$", 1)[1].strip())


def find_answer_line(text: str) -> tuple[str | None, str]:
    """``(answer, "")`` from the last line with an ``answer:`` marker, or ``(None, why not)``."""
    for line in reversed(text.splitlines()):
        markers = list(_MARKER.finditer(line))
        if not markers:
            continue
        ans = line[markers[-1].end() :].strip().strip("*_").strip()
        ans = ans.removesuffix(".").strip()
        if len(ans) >= 2 and ans[0] == "$" and ans[-1] == "$":
            ans = ans.strip("$").strip()
        if not ans:
            return None, "nothing after the last 'Answer:'"
        if _goes_on(ans):
            return None, f"the last 'Answer:' line goes on after its answer: {line.strip()[:200]!r}"
        return ans, ""
    return None, "no 'Answer:' line"


def answer_line(text: str) -> str | None:
    """The answer of the last ``Answer: ...`` line (without surrounding ``$`` and a final period),
    or None: no such line, or the line goes on after its answer."""
    return find_answer_line(text)[0]


def extract_last_boxed(text: str) -> str | None:
    """The ``last_boxed`` mode's answer text: the last box, else the answer line."""
    return extract(text, "last_boxed")[0]


_DELIMITED = re.compile(r"\$|\\\(|\\\[")
_ONE_NUMBER = re.compile(r"-?\d+(?:[.,]\d+)*")
_MATH_SIGN = re.compile(r"[=+*/^_\\{}\[\]()<>|&%]")


def reads_as_math_verify(text: str) -> bool:
    """Whether ``whole_response`` reads ``text`` as ``math_verify`` does: it has a box, or a LaTeX
    delimiter and no ``Answer:`` line (whose own rules, refusals included, come first)."""
    return bool(_BOX.search(text) or (_DELIMITED.search(text) and not _MARKER.search(text)))


def whole_response(text: str) -> tuple[str | None, str]:
    """The ``whole_response`` mode's answer in an undelimited response (see the module's
    docstring): ``(answer, "")`` or ``(None, why not)``."""
    answer, why = find_answer_line(text)
    if answer is not None or why != "no 'Answer:' line":
        return answer, why
    body = text.strip().removesuffix(".").strip()
    words = prose_words(body)
    numbers = _ONE_NUMBER.findall(body)
    if words and len(numbers) == 1 and not _MATH_SIGN.search(body):
        return numbers[0], ""  # words around one number, nothing else it could be
    if body and not is_prose(body):
        return body, ""  # one expression: parsed whole
    return None, (
        "no box, no $...$, no 'Answer:' line, and the response is words, not one expression "
        "or one number"
    )


EXTRACTING = ("last_boxed", "answer_line", "whole_response")
"""The modes whose answer is extracted here and then parsed as a boxed LaTeX answer."""


def extract(response: str, mode: str) -> tuple[str | None, str]:
    """``(answer, "")`` in one of the :data:`EXTRACTING` modes, or ``(None, why not)``."""
    if mode == "last_boxed":
        boxed = last_boxed(response)
        if boxed is not None:
            return boxed, ""
        answer, why = find_answer_line(response)
        if answer is None and why == "no 'Answer:' line":
            why = "no \\boxed{} answer and no 'Answer:' line"
        elif answer is None:
            why = f"no \\boxed{{}} answer, and {why}"
        return answer, why
    if mode == "answer_line":
        return find_answer_line(response)
    return whole_response(response)


_GSM8K_STRICT = re.compile(r"####\s*\$?\s*(-?[0-9][0-9.,]*|-?\.[0-9]+)")
_NUMBER = re.compile(r"-?\$?[0-9][0-9.,]*|-?\.[0-9]+")


def _gsm8k_number(text: str) -> str:
    """``1,234.`` -> ``1234``: commas, dollar signs and a sentence's final period removed."""
    return text.replace(",", "").replace("$", "").strip().rstrip(".")


def extract_gsm8k(text: str, flexible: bool = False) -> str | None:
    """The last ``#### N`` (or, ``flexible``, the last number) of ``text``, normalised."""
    if flexible:
        found = [_gsm8k_number(m) for m in _NUMBER.findall(text)]
    else:
        found = [_gsm8k_number(m) for m in _GSM8K_STRICT.findall(text)]
    return found[-1] if found else None


def _same_number(a: str, b: str) -> bool:
    try:
        return Decimal(a) == Decimal(b)
    except InvalidOperation:
        return a == b


def score_gsm8k(response: str, ground_truth: str, flexible: bool) -> dict[str, Any]:
    """The ``gsm8k`` / ``gsm8k_flexible`` modes (no math-verify: plain numbers)."""
    gold = extract_gsm8k(ground_truth) if "####" in ground_truth else _gsm8k_number(ground_truth)
    if not gold:
        return bad_ground_truth(f"no number in the ground truth {ground_truth[:200]!r}")
    answer = extract_gsm8k(response, flexible)
    if answer is None:
        return no_answer("no number in the response" if flexible else "no '#### N' line")
    return verdict(_same_number(answer, gold), answer)


PLAIN = ("gsm8k", "gsm8k_flexible", "qa_exact_match")
"""The modes scored without math-verify (string and decimal work only)."""


def score_plain(response: str, ground_truth: str, mode: str) -> dict[str, Any] | None:
    """The verdict of a :data:`PLAIN` mode; None for the other modes."""
    if mode in ("gsm8k", "gsm8k_flexible"):
        return score_gsm8k(response, ground_truth, flexible=mode == "gsm8k_flexible")
    if mode == "qa_exact_match":
        return score_qa(response, ground_truth)
    return None


def _boxed(text: str) -> str:
    return text if "\\boxed" in text else "\\boxed{" + text + "}"


def score_math(response: str, ground_truth: str, mode: ExtractionMode) -> dict[str, Any]:
    """Score one answer: ``{"correct", "format_ok", "reason", "detail"}`` and, when one was found,
    ``"answer"`` (the extracted text). math-verify's own timeouts (``signal.alarm``, main thread
    only) are off: the caller bounds the time (the service scores in worker processes)."""
    plain = score_plain(response, ground_truth, mode)
    if plain is not None:
        return plain
    from math_verify import ExprExtractionConfig, LatexExtractionConfig, parse, verify

    config = [LatexExtractionConfig(boxed_match_priority=0), ExprExtractionConfig()]
    gold = parse(_boxed(ground_truth), extraction_config=config, parsing_timeout=None)
    if not gold:
        return bad_ground_truth(
            f"math-verify could not parse the ground truth {ground_truth[:200]!r}"
        )
    if mode == "whole_response" and reads_as_math_verify(response):
        mode = "math_verify"
    if mode in EXTRACTING:
        answer, missing = extract(response, mode)
        if answer is None:
            return no_answer(missing)
        pred = parse(_boxed(answer), extraction_config=config, parsing_timeout=None)
    else:
        pred = parse(response, extraction_config=config, parsing_timeout=None)
        answer = str(pred[-1]) if pred else None
        if not pred:
            return no_answer("math-verify found no answer")
    if not pred:
        return {
            "correct": False,
            "format_ok": True,
            "reason": "wrong_answer",
            "detail": f"answer {answer[:200]!r} could not be parsed",
            "answer": answer,
        }
    return verdict(bool(verify(gold, pred, timeout_seconds=None)), answer)
