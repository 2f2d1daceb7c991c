"""The torch-free group advantages (dashboard) against the learner's torch estimators."""

from __future__ import annotations

import random

import pytest
import torch

from dashboard.advantages import GROUP_ESTIMATORS, group_advantages
from learner.algorithms import ADVANTAGE_ESTIMATORS
from tests.learner.algorithms.test_advantages_episodes import episodic_batch


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


@pytest.mark.parametrize("seed", range(6))
@pytest.mark.parametrize("estimator", GROUP_ESTIMATORS)
def test_matches_the_learner_over_episodes(seed: int, estimator: str) -> None:
    """Groups of forked episodes (several responses sharing an episode): statistics over
    episodes, as the learner takes them."""
    rewards, groups, episodes = episodic_batch(seed)
    mask = torch.ones(len(groups), 3)
    want, _ = ADVANTAGE_ESTIMATORS[estimator](
        rewards=rewards, mask=mask, group_ids=groups, episode_ids=episodes
    )
    got: list[float] = [0.0] * len(groups)
    for g in set(groups):
        rows = [i for i, x in enumerate(groups) if x == g]
        adv = group_advantages([float(rewards[i]) for i in rows], estimator,
                               [episodes[i] for i in rows])  # fmt: skip
        assert adv is not None
        for i, a in zip(rows, adv, strict=True):
            got[i] = a
    assert got == pytest.approx(want[:, 0].tolist(), rel=1e-6, abs=1e-6)


def test_the_samples_page_counts_a_forked_episode_once() -> None:
    """Episodes scoring [1, 1, 0, 0], the first forked into 3 responses: ±0.866 on each row."""
    from dashboard.sources.samples import SampleFilter, sample_rows

    def response(reward: float, episode: int, segment: int) -> dict:
        return {"text": "", "reward": reward, "correct": reward > 0, "format_ok": True,
                "reason": "ok", "finish_reason": "stop", "tokens": 1, "episode": episode,
                "segment": segment, "turns": []}  # fmt: skip

    group = {
        "prompt_id": "p", "data_source": "arith", "prompt": "", "allocated_n": 4, "priority": 0.0,
        "weight_version": 0, "t": 0.0,
        "responses": [response(1.0, 0, 0), response(1.0, 0, 1), response(1.0, 0, 2),
                      response(1.0, 1, 0), response(0.0, 2, 0), response(0.0, 3, 0)],
    }  # fmt: skip
    rows, _, _ = sample_rows([("1-0", group)], SampleFilter(), "grpo")
    want = 0.5 / (1 / 3) ** 0.5
    assert [r["advantage"] for r in rows] == pytest.approx([want] * 4 + [-want] * 2, abs=1e-5)
