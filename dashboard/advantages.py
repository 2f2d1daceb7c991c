"""Group advantages of the outcome-reward estimators in pure Python, for displays.

The learner computes advantages with torch over a whole batch (``learner.algorithms``); tools in
this torch-free package (the dashboard's samples page) only need what one trajectory group's
responses get. For the estimators whose advantage is a function of the response's own group —
``grpo``, ``drgrpo``, ``rloo`` — :func:`group_advantages` is a twin of the learner's formula, group
statistics over episodes included (the tests compare the two on random groups). ``reinforce_pp``, ``reinforce_pp_baseline`` and ``gae``
depend on the whole batch (whitening) or on a critic, so no per-group figure exists: None.
"""

from __future__ import annotations

import math
from collections.abc import Hashable, Sequence

GROUP_ESTIMATORS = ("grpo", "drgrpo", "rloo")
"""Estimators whose advantage is a function of the response's group alone."""
GRPO_EPS = 1e-6
"""The ``eps`` of GRPO's ``(r − mean) / (std + eps)`` (the learner's default)."""


def group_advantages(
    rewards: Sequence[float], estimator: str, episodes: Sequence[Hashable | None] | None = None
) -> list[float] | None:
    """Each response's advantage within its group under ``estimator``; None when it has none.

    ``episodes``: each response's episode (None: an episode of its own, as a single-turn response
    is). The statistics are over episodes, as the learner's: a forked episode counts once, with
    its first response's reward (its return), and each response is measured with its own reward.
    Over ``n`` episodes with returns ``R``:

    - ``grpo``: ``(r_i − mean R) / (std R + 1e-6)``, ``std`` the unbiased (n − 1) standard
      deviation; a group of one episode gets ``r_i / (1 + 1e-6)`` (mean 0, std 1, as the learner
      and verl do);
    - ``drgrpo``: ``r_i − mean R`` (a group of one episode: ``r_i``);
    - ``rloo``: ``r_i − mean of the other episodes' R`` (a group of one episode: 0).
    """
    r = [float(x) for x in rewards]
    if estimator not in GROUP_ESTIMATORS:
        return None
    keys = [
        (i,) if e is None else ("episode", e) for i, e in enumerate(episodes or [None] * len(r))
    ]
    first: dict[tuple[Hashable, ...], float] = {}
    for k, x in zip(keys, r, strict=True):
        first.setdefault(k, x)
    returns = list(first.values())
    n = len(returns)
    if n == 0:
        return []
    if estimator == "rloo":
        if n == 1:
            return [0.0] * len(r)
        total = math.fsum(returns)
        return [x - (total - first[k]) / (n - 1) for x, k in zip(r, keys, strict=True)]
    if n == 1:
        return [x / (1.0 + GRPO_EPS) for x in r] if estimator == "grpo" else r
    mean = math.fsum(returns) / n
    centred = [x - mean for x in r]
    if estimator == "drgrpo":
        return centred
    std = math.sqrt(math.fsum((x - mean) ** 2 for x in returns) / (n - 1))
    return [c / (std + GRPO_EPS) for c in centred]
