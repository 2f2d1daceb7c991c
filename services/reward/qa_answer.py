"""Question answering by exact match (the ``qa_exact_match`` extraction; Search-R1-style data).

The answer is the last ``<answer>…</answer>`` of the response. It is correct when, normalised, it
equals one of the accepted answers normalised the same way: lower case, punctuation removed, the
articles "a", "an" and "the" removed, runs of whitespace made one space (the SQuAD/Search-R1
normalisation). The accepted answers are the ground truth, or, when the ground truth is a JSON list
of strings (``["Paris", "City of Paris"]``, what the dataset loader makes of a verl row's
``{"target": [...]}``), each of them.

Stricter than verl's scorer in two places: an answer that normalises to nothing never matches, and a
response with more than :data:`MAX_TAGS` answer tags scores 0 (verl gives a quarter of the score).
"""

from __future__ import annotations

import json
import re
import string
from typing import Any

from services.reward.verdicts import bad_ground_truth, no_answer, verdict

_ANSWER = re.compile(r"<answer>(.*?)</answer>", re.DOTALL)
_ARTICLES = re.compile(r"\b(?:a|an|the)\b")
_PUNCTUATION = str.maketrans("", "", string.punctuation)
MAX_TAGS = 10
"""More opening or closing answer tags than this scores 0: a response cannot list candidates."""


def normalize(text: str) -> str:
    """Lower case, no punctuation, no articles, single spaces."""
    return " ".join(_ARTICLES.sub(" ", text.lower().translate(_PUNCTUATION)).split())


def targets(ground_truth: str) -> list[str]:
    """The accepted answers: a JSON list of strings, else the ground truth itself."""
    if ground_truth.lstrip().startswith("["):
        try:
            value = json.loads(ground_truth)
        except ValueError:
            return [ground_truth]
        if isinstance(value, list) and value and all(isinstance(v, str) for v in value):
            return value
    return [ground_truth]


def score_qa(response: str, ground_truth: str) -> dict[str, Any]:
    """The verdict (``correct``, ``format_ok``, ``reason``, ``detail`` and ``answer``)."""
    accepted = {normalize(t) for t in targets(ground_truth)} - {""}
    if not accepted:
        return bad_ground_truth(f"no answer left after normalising {ground_truth[:200]!r}")
    found = _ANSWER.findall(response)
    if not found or not normalize(found[-1]):
        return no_answer("an empty <answer></answer>" if found else "no <answer>...</answer>")
    answer = found[-1].strip()
    if max(response.count("<answer>"), response.count("</answer>")) > MAX_TAGS:
        return {**verdict(False, answer), "detail": f"more than {MAX_TAGS} answer tags"}
    return verdict(normalize(answer) in accepted, answer)
