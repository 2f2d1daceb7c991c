"""The speed baseline of ``bench_allocator.py``: the authors' allocation, re-implemented step by step.

The released DynaMO code allocates in one Python function that works pass by pass: one numpy
proportional share per water-filling pass (floor, then a Python loop handing out the remainder by
largest fractional part, then the n_max caps), repeated until the budget is spent, with Python
loops for the round-robin fallback and for trimming an over-scaled exploration. Its priorities come
precomputed (a per-epoch rank). This module rewrites that procedure in our own words so the
benchmark can time it on the same inputs; it is not used by the service.
"""

from __future__ import annotations

import numpy as np
import numpy.typing as npt


def reference_pass_by_pass(
    sample_counts: npt.NDArray[np.float64],
    priority: npt.NDArray[np.float64],
    total: int,
    n_min: int = 4,
    n_max: int = 24,
    initial_budget: int = 8,
) -> list[int]:
    """Counts per prompt the way the released code computes them (priorities given)."""
    n = len(priority)
    if n == 0:
        return []
    n_min = max(0, n_min)
    n_max = max(n_min, n_max)
    initial_budget = max(n_min, initial_budget)
    total = int(np.clip(total, n * n_min, n * n_max))

    # Exploration first: whatever a prompt lacks of initial_budget, at most n_max.
    want = np.minimum(np.maximum(0, initial_budget - sample_counts), n_max)
    exploring = want > 0
    want_sum = want.sum()
    counts = np.zeros(n, dtype=np.int64)
    if want_sum > 0:
        if want_sum <= total:
            counts[exploring] = want[exploring]
            left = total - want_sum
        else:
            scaled = np.maximum((want * (total / want_sum)).astype(np.int64), n_min)
            while scaled.sum() > total:  # trim the largest, one at a time
                over = np.where(scaled > n_min)[0]
                if len(over) == 0:
                    break
                scaled[over[np.argmax(scaled[over])]] -= 1
            counts = scaled
            left = total - counts.sum()
    else:
        left = total

    # Top everyone up to n_min (scaled if short).
    if left > 0:
        short = np.maximum(0, n_min - counts)
        short_sum = short.sum()
        if short_sum > 0:
            if short_sum <= left:
                counts += short
                left -= short_sum
            else:
                part = (short * (left / short_sum)).astype(np.int64)
                counts += part
                left -= part.sum()
    if left == 0:
        return counts.tolist()

    weights = priority.astype(np.float64).copy()
    weights[weights < 1e-8] = 0.0
    while left > 0:  # one proportional share per pass until the caps stop absorbing
        idx = np.where((counts < n_max) & (weights > 1e-8))[0]
        if len(idx) == 0:
            below = np.where(counts < n_max)[0]
            if len(below) == 0:
                break
            for i in range(left):
                counts[below[i % len(below)]] += 1
            left = 0
            break
        w = weights[idx]
        ideal = left * (w / w.sum())
        add = np.floor(ideal).astype(np.int64)
        rest = int(np.round(left - add.sum()))
        if rest > 0:
            by_frac = np.argsort(-(ideal - add))
            for i in range(rest):
                add[by_frac[i]] += 1
        add = np.minimum(add, n_max - counts[idx])
        counts[idx] += add
        left -= add.sum()

    diff = total - counts.sum()
    if diff > 0:
        below = np.where(counts < n_max)[0]
        for i in range(diff):
            counts[below[i % len(below)]] += 1
    elif diff < 0:
        above = np.where(counts > n_min)[0]
        for i in range(-diff):
            counts[above[i % len(above)]] -= 1
    return counts.tolist()
