"""The verdict dictionaries the answer scorers return (``correct``, ``format_ok``, ``reason``,
``detail`` and, when an answer was found, ``answer``): one place for their shape, shared by the math
and question-answering scorers."""

from __future__ import annotations

from typing import Any


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


def bad_ground_truth(detail: str) -> dict[str, Any]:
    """The verdict when the ground truth cannot be read."""
    return {"correct": False, "format_ok": False, "reason": "bad_ground_truth", "detail": detail}


def no_answer(detail: str) -> dict[str, Any]:
    """The verdict when the response holds no answer to compare."""
    return {"correct": False, "format_ok": False, "reason": "no_answer", "detail": detail}
