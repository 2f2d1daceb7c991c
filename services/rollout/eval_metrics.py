"""Evaluation metrics as papers report them: avg@k, unbiased pass@k, maj@k, bootstrap intervals.

For one prompt with ``n`` samples of which ``c`` are correct:

- **avg@n** = c / n: pass@1 averaged over the n samples (the unbiased estimate of pass@1);
- **pass@k** = 1 − C(n−c, k) / C(n, k) for k ≤ n: the unbiased estimator of the chance that at
  least one of k samples is correct (Chen et al. 2021, "Evaluating Large Language Models Trained
  on Code"); pass@n is "any sample correct" and pass@1 equals avg@n;
- **maj@n**: 1 when the answer most samples agree on is correct (majority voting, self-
  consistency). Samples vote with their extracted final answer (the reward service's ``answer``),
  normalised so that spacing, ``$``, ``\\left``/``\\right`` and ``72`` vs ``72.0`` do not split a
  vote; samples without an answer do not vote; a tie goes to the answer that reached the top count
  first. Undefined (None) where no sample of a benchmark has an answer (code).

A benchmark's figure is the mean over its prompts; its 95% interval is a percentile bootstrap over
prompts (``resamples`` draws of the prompts with replacement, seeded, the same draws for every
metric). Torch-free and numpy-only, so ``dynamo-rl eval`` and ``up`` share it. The episodes of
multi-turn environments are summed up by :func:`episode_summary` (turns, tool calls, drops).
"""

from __future__ import annotations

import math
import re
from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass
from decimal import Decimal, InvalidOperation
from typing import Any

__all__ = [
    "PromptOutcome",
    "default_ks",
    "episode_summary",
    "majority_correct",
    "normalise_answer",
    "pass_at_k",
    "summarize",
]


def pass_at_k(n: int, c: int, k: int) -> float:
    """The unbiased pass@k of one prompt: 1 − C(n−c, k) / C(n, k)."""
    if not 0 <= c <= n:
        raise ValueError(f"pass@k needs 0 <= correct <= samples, got {c} of {n}")
    if not 1 <= k <= n:
        raise ValueError(f"pass@k needs 1 <= k <= samples ({n}), got k={k}")
    if n - c < k:
        return 1.0
    return 1.0 - math.comb(n - c, k) / math.comb(n, k)


_NOISE = re.compile(r"\s+|\$|\\left|\\right|\\!|\\,|\\;|\\displaystyle|\\text\{\s*\}")


def normalise_answer(answer: str) -> str:
    """The vote key of an extracted answer."""
    text = _NOISE.sub("", answer).rstrip(".")
    try:
        number = Decimal(text.replace(",", ""))
    except InvalidOperation:
        return text
    return format(number.normalize(), "f") if number.is_finite() else text


def majority_correct(answers: Sequence[str | None], correct: Sequence[bool]) -> bool | None:
    """Whether the majority answer is correct; None when no sample has an answer."""
    votes: Counter[str] = Counter()
    verdict: dict[str, bool] = {}
    best: str | None = None
    for answer, ok in zip(answers, correct, strict=True):
        if answer is None:
            continue
        key = normalise_answer(answer)
        votes[key] += 1
        verdict.setdefault(key, bool(ok))
        if best is None or votes[key] > votes[best]:
            best = key  # strictly more: on a tie the answer that got there first stays
    return None if best is None else verdict[best]


@dataclass(frozen=True)
class PromptOutcome:
    """One prompt's verdicts (and extracted answers, for maj@k), in sample order."""

    correct: Sequence[bool]
    answers: Sequence[str | None] | None = None


def default_ks(n: int) -> list[int]:
    """pass@k reported by default: k = 1 and n (pass@1 is avg@n; pass@n is any correct)."""
    return sorted({1, n})


def _interval(values: Any, draws: Any, confidence: float) -> list[float]:
    import numpy as np

    means = values[draws].mean(axis=1)
    tail = (1.0 - confidence) / 2 * 100
    lo, hi = np.percentile(means, [tail, 100 - tail])
    return [float(lo), float(hi)]


def summarize(
    outcomes: Sequence[PromptOutcome],
    ks: Sequence[int] | None = None,
    *,
    resamples: int = 1000,
    seed: int = 0,
    confidence: float = 0.95,
) -> dict[str, Any]:
    """A benchmark's avg@n, pass@k per k, maj@n, each ``{"mean", "ci"}``; every prompt must have
    the same number of samples n."""
    import numpy as np

    if not outcomes:
        raise ValueError("no prompts to summarize")
    n = len(outcomes[0].correct)
    if n < 1 or any(len(o.correct) != n for o in outcomes):
        raise ValueError("every prompt needs the same number (>= 1) of samples")
    ks = sorted(set(ks or default_ks(n)))
    if any(not 1 <= k <= n for k in ks):
        raise ValueError(f"pass@k: every k must be in 1..{n} (the samples per prompt), got {ks}")
    columns: dict[str, list[float]] = {f"avg@{n}": [], **{f"pass@{k}": [] for k in ks}}
    counts = [sum(bool(x) for x in o.correct) for o in outcomes]
    columns[f"avg@{n}"] = [c / n for c in counts]
    for k in ks:
        columns[f"pass@{k}"] = [pass_at_k(n, c, k) for c in counts]
    majority = [
        majority_correct(o.answers, o.correct) if o.answers is not None else None for o in outcomes
    ]
    if any(m is not None for m in majority):
        columns[f"maj@{n}"] = [1.0 if m else 0.0 for m in majority]
    draws = np.random.default_rng(seed).integers(0, len(outcomes), (resamples, len(outcomes)))
    metrics: dict[str, Any] = {}
    for name, values in columns.items():
        arr = np.asarray(values, dtype=float)
        ci = _interval(arr, draws, confidence) if resamples else [float("nan")] * 2
        metrics[name] = {"mean": float(arr.mean()), "ci": ci}
    if f"maj@{n}" not in metrics:
        metrics[f"maj@{n}"] = None
    return {"prompts": len(outcomes), "n": n, "metrics": metrics}


def format_table(benchmarks: dict[str, dict[str, Any]]) -> str:
    """One row per benchmark: prompts, then each metric as ``mean [lo, hi]`` in percent."""
    names = []
    for result in benchmarks.values():
        for name in result["metrics"]:
            if name not in names:
                names.append(name)
    header = ["benchmark", "prompts", *names]
    rows = []
    for bench, result in benchmarks.items():
        cells = [bench, str(result["prompts"])]
        for name in names:
            m = result["metrics"].get(name)
            if m is None:
                cells.append("-")
            else:
                lo, hi = m["ci"]
                cells.append(f"{100 * m['mean']:.1f} [{100 * lo:.1f}, {100 * hi:.1f}]")
        rows.append(cells)
    widths = [max(len(r[i]) for r in [header, *rows]) for i in range(len(header))]
    lines = ["  ".join(c.ljust(w) for c, w in zip(r, widths, strict=True)).rstrip()
             for r in [header, *rows]]  # fmt: skip
    lines.insert(1, "  ".join("-" * w for w in widths))
    return "\n".join(lines)


def episode_summary(stats: list[dict[str, Any]], env: str) -> dict[str, Any]:
    """What the evaluated episodes did: turns per episode, the share that called a tool, tool
    calls per episode, the share of calls that failed, episodes dropped."""
    count = max(len(stats), 1)
    calls = sum(s["tool_calls"] for s in stats)
    return {
        "env": env,
        "episodes": len(stats),
        "turns_mean": sum(s["turns"] for s in stats) / count,
        "tool_call_rate": sum(1 for s in stats if s["tool_calls"]) / count,
        "tool_calls_mean": calls / count,
        "tool_error_rate": sum(s["tool_errors"] for s in stats) / calls if calls else 0.0,
        "dropped": sum(1 for s in stats if s["dropped"]),
    }
