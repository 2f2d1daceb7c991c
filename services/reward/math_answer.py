"""Math answers: extraction from free text and comparison with math-verify.

Extraction modes:

- ``last_boxed`` (default; what verl/OpenRLHF recipes do): the last ``\\boxed{…}`` (or ``\\fbox``)
  with balanced braces, else the last ``Answer: …`` line. The extracted text is parsed as a boxed
  LaTeX answer.
- ``answer_line``: the last ``Answer: …`` line only (DAPO-Math and AIME prompts ask for one).
- ``math_verify``: math-verify's own LaTeX extraction over the whole response, boxed answers first;
  several boxes are combined into one answer, which multi-part answers such as "(2, 2) and (6, 2)"
  need.
- ``gsm8k``: the last ``#### N`` (GSM8K's own answer format); ``gsm8k_flexible``: the last number
  anywhere. Both compare numbers, not LaTeX: commas and ``$`` removed, ``72.0`` equals ``72``; a
  ground truth that is a whole GSM8K solution counts by its ``#### N``.

The comparison of the other modes is ``math_verify.verify(gold, prediction)`` — gold first:
math-verify's comparison is deliberately asymmetric. :func:`score_math` imports math-verify and must run on a process's main
thread with a timeout of the caller's (math-verify's own timeouts use ``signal.alarm`` and are
disabled here); the worker pool in :mod:`services.reward.math_pool` provides both.
"""

from __future__ import annotations

import re
from decimal import Decimal, InvalidOperation
from typing import Any

from dynamo_rl.contracts.reward import Extraction as ExtractionMode

_BOX = re.compile(r"\\(?:boxed|fbox)")
_ANSWER_LINE = re.compile(
    r"^[ \t*#>_-]*(?:final[ \t]+)?answer[ \t*_]*(?:is)?[ \t*_]*[:：][ \t*_]*(?P<ans>.+?)[ \t]*$",
    re.IGNORECASE | re.MULTILINE,
)


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


def answer_line(text: str) -> str | None:
    """The last ``Answer: ...`` line's answer, without surrounding ``$`` and a final period."""
    matches = list(_ANSWER_LINE.finditer(text))
    if not matches:
        return None
    ans = matches[-1].group("ans").strip().strip("*_").strip()
    ans = ans.removesuffix(".").strip()
    if len(ans) >= 2 and ans[0] == "$" and ans[-1] == "$":
        ans = ans.strip("$").strip()
    return ans or None


def extract_last_boxed(text: str) -> str | None:
    """The ``last_boxed`` mode's answer text: the last box, else the last answer line."""
    return last_boxed(text) or answer_line(text)


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
        return _bad_ground_truth(f"no number in the ground truth {ground_truth[:200]!r}")
    answer = extract_gsm8k(response, flexible)
    if answer is None:
        return _no_answer("no number in the response" if flexible else "no '#### N' line")
    return verdict(_same_number(answer, gold), answer)


def _boxed(text: str) -> str:
    return text if "\\boxed" in text else "\\boxed{" + text + "}"


def score_math(response: str, ground_truth: str, mode: ExtractionMode) -> dict[str, Any]:
    """Score one answer: ``{"correct", "format_ok", "reason", "detail"}`` and, when one was found,
    ``"answer"`` (the extracted text). math-verify's own timeouts (``signal.alarm``, main thread
    only) are off: the caller bounds the time (the service scores in worker processes)."""
    if mode in ("gsm8k", "gsm8k_flexible"):
        return score_gsm8k(response, ground_truth, flexible=mode == "gsm8k_flexible")
    from math_verify import ExprExtractionConfig, LatexExtractionConfig, parse, verify

    config = [LatexExtractionConfig(boxed_match_priority=0), ExprExtractionConfig()]
    gold = parse(_boxed(ground_truth), extraction_config=config, parsing_timeout=None)
    if not gold:
        return _bad_ground_truth(
            f"math-verify could not parse the ground truth {ground_truth[:200]!r}"
        )
    if mode in ("last_boxed", "answer_line"):
        if mode == "last_boxed":
            answer = extract_last_boxed(response)
            missing = "no \\boxed{} answer and no 'Answer:' line"
        else:
            answer, missing = answer_line(response), "no 'Answer:' line"
        if answer is None:
            return _no_answer(missing)
        pred = parse(_boxed(answer), extraction_config=config, parsing_timeout=None)
    else:
        pred = parse(response, extraction_config=config, parsing_timeout=None)
        answer = str(pred[-1]) if pred else None
        if not pred:
            return _no_answer("math-verify found no answer")
    if not pred:
        return {
            "correct": False,
            "format_ok": True,
            "reason": "wrong_answer",
            "detail": f"answer {answer[:200]!r} could not be parsed",
            "answer": answer,
        }
    return verdict(bool(verify(gold, pred, timeout_seconds=None)), answer)


def verdict(correct: bool, answer: str) -> dict[str, Any]:
    """The verdict on an answer that was found and compared with the ground truth (``answer``: the
    extracted text)."""
    return {
        "correct": correct,
        "format_ok": True,
        "reason": "ok" if correct else "wrong_answer",
        "detail": f"answer {answer[:200]!r}",
        "answer": answer,
    }


def _bad_ground_truth(detail: str) -> dict[str, Any]:
    return {"correct": False, "format_ok": False, "reason": "bad_ground_truth", "detail": detail}


def _no_answer(detail: str) -> dict[str, Any]:
    return {"correct": False, "format_ok": False, "reason": "no_answer", "detail": detail}
