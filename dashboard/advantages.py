"""Group advantages of the outcome-reward estimators in pure Python, for displays.

The learner computes advantages with torch over a whole batch (``learner.algorithms``); tools in
this torch-free package (the dashboard's samples page) only need what one trajectory group's
responses get. For the estimators whose advantage is a function of the response's own group —
``grpo``, ``drgrpo``, ``rloo`` — :func:`group_advantages` is a twin of the learner's formula (the
tests compare the two on random groups). ``reinforce_pp``, ``reinforce_pp_baseline`` and ``gae``
depend on the whole batch (whitening) or on a critic, so no per-group figure exists: None.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

GROUP_ESTIMATORS = ("grpo", "drgrpo", "rloo")
"""Estimators whose advantage is a function of the response's group alone."""
GRPO_EPS = 1e-6
"""The ``eps`` of GRPO's ``(r − mean) / (std + eps)`` (the learner's default)."""


def group_advantages(rewards: Sequence[float], estimator: str) -> list[float] | None:
    """Each response's advantage within its group under ``estimator``; None when it has none.

    - ``grpo``: ``(r_i − mean) / (std + 1e-6)``, ``std`` the unbiased (n − 1) standard deviation;
      a group of one gets ``r_i / (1 + 1e-6)`` (mean 0, std 1, as the learner and verl do);
    - ``drgrpo``: ``r_i − mean`` (a group of one: ``r_i``);
    - ``rloo``: ``r_i − mean of the others`` (a group of one: 0).
    """
    r = [float(x) for x in rewards]
    n = len(r)
    if estimator not in GROUP_ESTIMATORS:
        return None
    if n == 0:
        return []
    if estimator == "rloo":
        if n == 1:
            return [0.0]
        total = math.fsum(r)
        return [x - (total - x) / (n - 1) for x in r]
    if n == 1:
        return [r[0] / (1.0 + GRPO_EPS)] if estimator == "grpo" else [r[0]]
    mean = math.fsum(r) / n
    centred = [x - mean for x in r]
    if estimator == "drgrpo":
        return centred
    std = math.sqrt(math.fsum(c * c for c in centred) / (n - 1))
    return [c / (std + GRPO_EPS) for c in centred]
