"""The torch-free group advantages (dashboard) against the learner's torch estimators."""

from __future__ import annotations

import random

import pytest
import torch

from dashboard.advantages import GROUP_ESTIMATORS, group_advantages
from learner.algorithms import ADVANTAGE_ESTIMATORS


def random_groups(seed: int) -> list[list[float]]:
    rng = random.Random(seed)
    groups = []
    for _ in range(12):
        n = rng.choice([1, 2, 3, 4, 7, 16])
        kind = rng.random()
        if kind < 0.3:  # binary rewards, as verifiers give
            groups.append([float(rng.random() < 0.5) for _ in range(n)])
        elif kind < 0.4:  # all equal
            groups.append([rng.choice([0.0, 1.0])] * n)
        else:  # shaped rewards
            groups.append([rng.uniform(-2.0, 3.0) for _ in range(n)])
    return groups


@pytest.mark.parametrize("seed", range(8))
@pytest.mark.parametrize("estimator", GROUP_ESTIMATORS)
def test_matches_the_learner_on_random_groups(seed: int, estimator: str) -> None:
    groups = random_groups(seed)
    rewards = torch.tensor([r for g in groups for r in g], dtype=torch.float32)
    group_ids = torch.tensor([i for i, g in enumerate(groups) for _ in g])
    mask = torch.ones(len(rewards), 3)
    want, _ = ADVANTAGE_ESTIMATORS[estimator](rewards=rewards, mask=mask, group_ids=group_ids)
    got = [a for g in groups for a in group_advantages(g, estimator)]
    assert got == pytest.approx(want[:, 0].tolist(), rel=1e-4, abs=1e-4)


def test_grpo_uses_the_unbiased_std() -> None:
    # Two right of four: mean 0.5, unbiased std sqrt(1/3) (the population std would be 0.5).
    got = group_advantages([1.0, 0.0, 1.0, 0.0], "grpo")
    assert got[0] == pytest.approx(0.5 / (3**-0.5 + 1e-6))
    assert group_advantages([1.0, 0.0, 0.0], "rloo") == pytest.approx([1.0, -0.5, -0.5])
    assert group_advantages([1.0, 0.0, 0.0], "drgrpo") == pytest.approx([2 / 3, -1 / 3, -1 / 3])


@pytest.mark.parametrize("estimator", ["reinforce_pp", "reinforce_pp_baseline", "gae"])
def test_batch_level_estimators_have_no_group_figure(estimator: str) -> None:
    assert estimator in ADVANTAGE_ESTIMATORS
    assert group_advantages([1.0, 0.0], estimator) is None
