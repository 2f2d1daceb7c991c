"""Group estimators over episodes: a forked episode (several rows sharing an ``episode_ids``
entry) counts once in its group's statistics, against plain-loop twins."""

from __future__ import annotations

import math

import pytest
import torch

from learner.algorithms import (
    ADVANTAGE_ESTIMATORS,
    dapo_keep_groups,
    drgrpo_advantages,
    grpo_advantages,
    reinforce_pp_advantages,
    rloo_advantages,
)
from tests.learner.algorithms.test_advantages import loop_returns, loop_whiten, random_mask


def episodic_batch(seed: int) -> tuple[torch.Tensor, list[int], list[int]]:
    """Rewards, group ids and episode ids of groups of 1-4 episodes of 1-3 segments each; an
    episode's rows come in segment order (its first row holds its return), episodes of the
    batch interleaved."""
    gen = torch.Generator().manual_seed(seed)
    rows: list[list[tuple[int, int, float]]] = []
    episode = 0
    for g in range(int(torch.randint(1, 5, (1,), generator=gen))):
        for _ in range(int(torch.randint(1, 5, (1,), generator=gen))):
            segments = int(torch.randint(1, 4, (1,), generator=gen))
            ret = float(torch.randint(0, 3, (1,), generator=gen))
            # Later segments: credited with less (earlier turn rewards left out) or the same.
            credit = [ret - k * float(torch.rand(1, generator=gen).round()) / 4
                      for k in range(segments)]  # fmt: skip
            rows.append([(10 * g + 1, 100 + episode, c) for c in credit])
            episode += 1
    order: list[tuple[int, int, float]] = []
    while rows:  # interleave the episodes, each in its own segment order
        k = int(torch.randint(0, len(rows), (1,), generator=gen))
        order.append(rows[k].pop(0))
        rows = [r for r in rows if r]
    return (
        torch.tensor([c for _, _, c in order], dtype=torch.float64),
        [g for g, _, _ in order],
        [e for _, e, _ in order],
    )


def episode_returns(values: list[float], groups: list[int], episodes: list[int], g: int):
    """The return (first row's value) of each episode of group ``g``, by episode id."""
    out: dict[int, float] = {}
    for v, gi, e in zip(values, groups, episodes, strict=True):
        if gi == g:
            out.setdefault(e, v)
    return out


def loop_grpo(r: list[float], groups: list[int], episodes: list[int], norm: bool,
              eps: float = 1e-6) -> list[float]:  # fmt: skip
    out = []
    for i, g in enumerate(groups):
        members = list(episode_returns(r, groups, episodes, g).values())
        n = len(members)
        mean = sum(members) / n if n > 1 else 0.0
        std = math.sqrt(sum((x - mean) ** 2 for x in members) / (n - 1)) if n > 1 else 1.0
        out.append((r[i] - mean) / (std + eps) if norm else r[i] - mean)
    return out


def loop_rloo(r: list[float], groups: list[int], episodes: list[int]) -> list[float]:
    out = []
    for i, g in enumerate(groups):
        returns = episode_returns(r, groups, episodes, g)
        others = [v for e, v in returns.items() if e != episodes[i]]
        out.append(r[i] - sum(others) / len(others) if others else 0.0)
    return out


@pytest.mark.parametrize("seed", range(10))
def test_outcome_estimators_take_group_statistics_over_episodes(seed: int) -> None:
    rewards, groups, episodes = episodic_batch(seed)
    r = rewards.tolist()
    for norm in (True, False):
        got = grpo_advantages(rewards, groups, episode_ids=episodes, norm_by_std=norm)
        assert got.tolist() == pytest.approx(loop_grpo(r, groups, episodes, norm), abs=1e-9)
    got = drgrpo_advantages(rewards, groups, episode_ids=episodes)
    assert got.tolist() == pytest.approx(loop_grpo(r, groups, episodes, False), abs=1e-9)
    got = rloo_advantages(rewards, groups, episode_ids=episodes)
    assert got.tolist() == pytest.approx(loop_rloo(r, groups, episodes), abs=1e-9)
    keep = dapo_keep_groups(rewards, groups, episode_ids=episodes).tolist()
    for i, g in enumerate(groups):
        returns = list(episode_returns(r, groups, episodes, g).values())
        assert keep[i] == (len(returns) > 1 and max(returns) > min(returns))


@pytest.mark.parametrize("seed", range(6))
@pytest.mark.parametrize("gamma", [1.0, 0.9])
def test_reinforce_pp_baseline_is_the_mean_over_episodes(seed: int, gamma: float) -> None:
    _, groups, episodes = episodic_batch(seed)
    gen = torch.Generator().manual_seed(seed)
    b, t = len(groups), 7
    mask = random_mask(b, t, gen)
    token_rewards = torch.randn(b, t, generator=gen, dtype=torch.float64)
    rows, masks = token_rewards.tolist(), mask.int().tolist()
    returns = [loop_returns(rows[i], masks[i], gamma) for i in range(b)]
    seq = [returns[i][masks[i].index(1)] if 1 in masks[i] else 0.0 for i in range(b)]
    base = []
    for g in groups:
        members = list(episode_returns(seq, groups, episodes, g).values())
        base.append(sum(members) / len(members) if len(members) > 1 else 0.0)
    centred = [[x - base[i] if masks[i][k] else 0.0 for k, x in enumerate(returns[i])]
               for i in range(b)]  # fmt: skip
    got = reinforce_pp_advantages(
        token_rewards, mask, gamma=gamma, group_ids=groups, episode_ids=episodes
    )
    assert torch.allclose(got, torch.tensor(loop_whiten(centred, masks), dtype=torch.float64),
                          atol=1e-9)  # fmt: skip


@pytest.mark.parametrize("seed", range(4))
def test_rows_that_are_their_own_episodes_give_exactly_the_row_statistics(seed: int) -> None:
    """Single-turn batches (every row an episode) train exactly as before: bit for bit."""
    rewards, groups, _ = episodic_batch(seed)
    own = list(range(len(groups)))
    for fn in (grpo_advantages, drgrpo_advantages, rloo_advantages, dapo_keep_groups):
        assert torch.equal(fn(rewards, groups, episode_ids=own), fn(rewards, groups)), fn
    mask = torch.ones(len(groups), 3)
    tr = torch.randn(len(groups), 3, dtype=torch.float64)
    assert torch.equal(
        reinforce_pp_advantages(tr, mask, group_ids=groups, episode_ids=own),
        reinforce_pp_advantages(tr, mask, group_ids=groups),
    )


def test_the_registry_passes_episode_ids_to_every_group_estimator() -> None:
    """[1, 1, 0, 0] with episode 0 forked into 3 rows: ±0.866 on every row (GRPO)."""
    rewards = torch.tensor([1.0, 1.0, 1.0, 1.0, 0.0, 0.0])
    groups, episodes = [0] * 6, [0, 0, 0, 1, 2, 3]
    mask = torch.ones(6, 2)
    adv, _ = ADVANTAGE_ESTIMATORS["grpo"](
        rewards=rewards, mask=mask, group_ids=groups, episode_ids=episodes
    )
    want = 0.5 / math.sqrt(1 / 3)
    assert adv[:, 0].tolist() == pytest.approx([want] * 4 + [-want] * 2, abs=1e-5)
    rows, _ = ADVANTAGE_ESTIMATORS["grpo"](rewards=rewards, mask=mask, group_ids=groups)
    assert rows[:, 0].tolist() == pytest.approx([0.6455] * 4 + [-1.291] * 2, abs=1e-3)
    for name in ("drgrpo", "rloo"):
        a, _ = ADVANTAGE_ESTIMATORS[name](
            rewards=rewards, mask=mask, group_ids=groups, episode_ids=episodes
        )
        b, _ = ADVANTAGE_ESTIMATORS[name](rewards=rewards, mask=mask, group_ids=groups)
        assert not torch.allclose(a, b), name  # the episodes change what the group is


def test_episode_ids_are_checked() -> None:
    rewards = torch.zeros(3)
    with pytest.raises(ValueError, match=r"episode_ids must have shape \[B\]=\[3\]"):
        grpo_advantages(rewards, [0, 0, 1], episode_ids=[0, 1])
    with pytest.raises(ValueError, match=r"episode_ids: episode .* spans groups"):
        grpo_advantages(rewards, [0, 0, 1], episode_ids=[0, 1, 1])
