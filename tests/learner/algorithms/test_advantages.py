"""Advantage estimators: hand-computed cases, plain-loop twins, hypothesis properties."""

from __future__ import annotations

import math

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from learner.algorithms import (
    ADVANTAGE_ESTIMATORS,
    dapo_keep_groups,
    discounted_returns,
    drgrpo_advantages,
    gae_advantages,
    grpo_advantages,
    outcome_token_rewards,
    overlong_penalty,
    reinforce_pp_advantages,
    rloo_advantages,
)

# ---- plain-loop twins -------------------------------------------------------------------------


def loop_grpo(rewards: list[float], groups: list[int], norm_by_std: bool, eps: float = 1e-6):
    out = []
    for i, g in enumerate(groups):
        members = [rewards[j] for j in range(len(groups)) if groups[j] == g]
        n = len(members)
        if n == 1:
            mean, std = 0.0, 1.0
        else:
            mean = sum(members) / n
            std = math.sqrt(sum((x - mean) ** 2 for x in members) / (n - 1))
        out.append((rewards[i] - mean) / (std + eps) if norm_by_std else rewards[i] - mean)
    return out


def loop_rloo(rewards: list[float], groups: list[int]):
    out = []
    for i, g in enumerate(groups):
        others = [rewards[j] for j in range(len(groups)) if groups[j] == g and j != i]
        out.append(rewards[i] - sum(others) / len(others) if others else 0.0)
    return out


def loop_whiten(rows: list[list[float]], masks: list[list[int]], eps: float = 1e-8):
    vals = [x for row, m in zip(rows, masks, strict=True) for x, k in zip(row, m, strict=True) if k]
    n = len(vals)
    mean = sum(vals) / max(n, 1)
    var = sum((x - mean) ** 2 for x in vals) / max(n - 1, 1)
    return [
        [(x - mean) / math.sqrt(var + eps) if k else 0.0 for x, k in zip(row, m, strict=True)]
        for row, m in zip(rows, masks, strict=True)
    ]


def loop_returns(rewards: list[float], mask: list[int], gamma: float) -> list[float]:
    out = [0.0] * len(rewards)
    running = 0.0
    for t in reversed(range(len(rewards))):
        if mask[t]:
            running = rewards[t] + gamma * running
            out[t] = running
    return out


def loop_gae(rewards, values, mask, gamma, lam):
    adv = [0.0] * len(rewards)
    next_v, last = 0.0, 0.0
    for t in reversed(range(len(rewards))):
        if not mask[t]:
            continue
        delta = rewards[t] + gamma * next_v - values[t]
        last = delta + gamma * lam * last
        adv[t] = last
        next_v = values[t]
    return adv


def random_batch(seed: int, max_groups: int = 6, max_size: int = 5):
    """Rewards with variable group sizes (including groups of one) in shuffled order."""
    gen = torch.Generator().manual_seed(seed)
    sizes = torch.randint(
        1,
        max_size + 1,
        (int(torch.randint(1, max_groups + 1, (1,), generator=gen)),),
        generator=gen,
    )
    groups = torch.repeat_interleave(torch.arange(len(sizes)) * 7 + 3, sizes)  # sparse ids
    perm = torch.randperm(len(groups), generator=gen)
    groups = groups[perm]
    rewards = (
        torch.randint(0, 3, (len(groups),), generator=gen).double()
        + torch.rand(len(groups), generator=gen, dtype=torch.float64).round()
    )
    return rewards, groups


def random_mask(b: int, t: int, gen: torch.Generator) -> torch.Tensor:
    lengths = torch.randint(0, t + 1, (b,), generator=gen)
    lengths[0] = t  # at least one full row
    return (torch.arange(t)[None, :] < lengths[:, None]).float()


# ---- hand-computed cases ----------------------------------------------------------------------


def test_grpo_hand_computed():
    rewards = torch.tensor([1.0, 0.0, 1.0, 0.0, 5.0])
    groups = torch.tensor([0, 0, 0, 0, 1])
    # group 0: mean 0.5, unbiased std sqrt(4 * 0.25 / 3) = 0.57735; group of one: mean 0, std 1
    expected = torch.tensor(
        [0.5 / 0.57735027, -0.5 / 0.57735027, 0.5 / 0.57735027, -0.5 / 0.57735027, 5.0]
    )
    assert torch.allclose(grpo_advantages(rewards, groups, eps=0.0), expected, atol=1e-5)
    assert torch.allclose(
        drgrpo_advantages(rewards, groups), torch.tensor([0.5, -0.5, 0.5, -0.5, 5.0])
    )
    assert torch.equal(
        grpo_advantages(rewards, groups, norm_by_std=False), drgrpo_advantages(rewards, groups)
    )


def test_rloo_hand_computed():
    rewards = torch.tensor([1.0, 0.0, 0.0, 3.0, 7.0])
    groups = ["p", "p", "p", "q", "r"]
    # p: 1 - (0+0)/2 = 1, 0 - (1+0)/2 = -0.5 twice; q and r are groups of one -> 0
    assert torch.allclose(
        rloo_advantages(rewards, groups), torch.tensor([1.0, -0.5, -0.5, 0.0, 0.0])
    )


def test_string_and_tensor_group_ids_agree():
    rewards, groups = random_batch(3)
    names = [f"prompt-{int(g)}" for g in groups]
    assert torch.allclose(grpo_advantages(rewards, groups), grpo_advantages(rewards, names))
    assert torch.allclose(rloo_advantages(rewards, groups), rloo_advantages(rewards, names))


def test_reinforce_pp_hand_computed():
    token_rewards = torch.tensor([[0.0, 0.0, 1.0], [0.0, 2.0, 9.0]])
    mask = torch.tensor([[1, 1, 1], [1, 1, 0]])
    returns = discounted_returns(token_rewards, mask, gamma=0.5)
    # row 0: 0.25, 0.5, 1; row 1 (last token masked, its reward ignored): 1, 2, 0
    assert torch.allclose(returns, torch.tensor([[0.25, 0.5, 1.0], [1.0, 2.0, 0.0]]))
    adv = reinforce_pp_advantages(token_rewards, mask, gamma=0.5)
    vals = [0.25, 0.5, 1.0, 1.0, 2.0]
    mean = sum(vals) / 5
    std = math.sqrt(sum((v - mean) ** 2 for v in vals) / 4)
    assert torch.allclose(adv[0], (torch.tensor([0.25, 0.5, 1.0]) - mean) / std, atol=1e-5)
    assert adv[1, 2] == 0.0


def test_gae_hand_computed():
    # One row, gamma 1, lam 1: advantages are return minus value; returns are the rewards-to-go.
    token_rewards = torch.tensor([[0.0, 0.0, 1.0, 0.0]])
    values = torch.tensor([[0.5, 0.2, 0.9, 3.0]])
    mask = torch.tensor([[1, 1, 1, 0]])
    adv, returns = gae_advantages(token_rewards, values, mask, gamma=1.0, lam=1.0)
    assert torch.allclose(returns, torch.tensor([[1.0, 1.0, 1.0, 0.0]]))
    raw = [0.5, 0.8, 0.1]
    mean = sum(raw) / 3
    std = math.sqrt(sum((v - mean) ** 2 for v in raw) / 2)
    assert torch.allclose(adv[0, :3], (torch.tensor(raw) - mean) / std, atol=1e-5)
    assert adv[0, 3] == 0.0 and returns[0, 3] == 0.0


def test_gae_lambda_zero_is_one_step_td():
    token_rewards = torch.tensor([[1.0, 2.0, 3.0]])
    values = torch.tensor([[0.5, 1.0, 2.0]])
    mask = torch.ones(1, 3)
    _, returns = gae_advantages(token_rewards, values, mask, gamma=0.9, lam=0.0)
    # returns = r_t + gamma V_{t+1}
    assert torch.allclose(returns, torch.tensor([[1.0 + 0.9 * 1.0, 2.0 + 0.9 * 2.0, 3.0]]))


def test_dapo_keep_groups():
    rewards = torch.tensor([1.0, 1.0, 0.0, 1.0, 1.0, 0.5])
    groups = torch.tensor([0, 0, 0, 1, 1, 2])
    assert dapo_keep_groups(rewards, groups).tolist() == [True, True, True, False, False, False]


def test_overlong_penalty():
    lengths = torch.tensor([10, 80, 90, 100, 101, 500])
    pen = overlong_penalty(lengths, max_len=100, buffer_len=20, factor=2.0)
    assert torch.allclose(pen, torch.tensor([0.0, 0.0, -1.0, -2.0, -2.0, -2.0]))
    with pytest.raises(ValueError, match="buffer_len"):
        overlong_penalty(lengths, max_len=100, buffer_len=0)


def test_outcome_token_rewards_last_valid_token():
    mask = torch.tensor([[1, 1, 0], [0, 0, 0], [1, 1, 1]])
    out = outcome_token_rewards(torch.tensor([2.0, 3.0, 4.0]), mask)
    assert torch.equal(out, torch.tensor([[0.0, 2.0, 0.0], [0.0, 0.0, 0.0], [0.0, 0.0, 4.0]]))


def test_bad_shapes_name_the_argument():
    with pytest.raises(ValueError, match="group_ids"):
        grpo_advantages(torch.zeros(3), torch.zeros(4, dtype=torch.long))
    with pytest.raises(ValueError, match="values"):
        gae_advantages(torch.zeros(2, 3), torch.zeros(2, 4), torch.ones(2, 3), gamma=1, lam=1)
    with pytest.raises(ValueError, match="values"):
        ADVANTAGE_ESTIMATORS["gae"](rewards=torch.zeros(2), mask=torch.ones(2, 3), group_ids=[0, 0])


# ---- loop twins on random inputs --------------------------------------------------------------


@pytest.mark.parametrize("seed", range(8))
def test_group_estimators_match_loops(seed: int):
    rewards, groups = random_batch(seed)
    r, g = rewards.tolist(), groups.tolist()
    for norm in (True, False):
        got = grpo_advantages(rewards, groups, norm_by_std=norm)
        assert torch.allclose(got, torch.tensor(loop_grpo(r, g, norm), dtype=got.dtype), atol=1e-9)
    assert torch.allclose(
        rloo_advantages(rewards, groups), torch.tensor(loop_rloo(r, g), dtype=torch.float64)
    )


@pytest.mark.parametrize("seed", range(6))
@pytest.mark.parametrize("gamma", [1.0, 0.9])
def test_token_estimators_match_loops(seed: int, gamma: float):
    gen = torch.Generator().manual_seed(seed)
    b, t = 6, 9
    mask = random_mask(b, t, gen)
    token_rewards = torch.randn(b, t, generator=gen, dtype=torch.float64)
    token_rewards[mask == 0] = float("nan")  # padding content must not matter
    values = torch.randn(b, t, generator=gen, dtype=torch.float64)
    rows, masks = token_rewards.tolist(), mask.int().tolist()

    returns = [loop_returns(rows[i], masks[i], gamma) for i in range(b)]
    assert torch.allclose(
        discounted_returns(token_rewards, mask, gamma), torch.tensor(returns, dtype=torch.float64)
    )
    assert torch.allclose(
        reinforce_pp_advantages(token_rewards, mask, gamma=gamma),
        torch.tensor(loop_whiten(returns, masks), dtype=torch.float64),
        atol=1e-9,
    )

    groups = [i // 2 for i in range(b - 1)] + [99]  # pairs plus a group of one
    seq = [returns[i][masks[i].index(1)] if 1 in masks[i] else 0.0 for i in range(b)]
    base = []
    for i in range(b):
        members = [seq[j] for j in range(b) if groups[j] == groups[i]]
        base.append(sum(members) / len(members) if len(members) > 1 else 0.0)
    centred = [
        [(x - base[i]) if masks[i][k] else 0.0 for k, x in enumerate(returns[i])] for i in range(b)
    ]
    assert torch.allclose(
        reinforce_pp_advantages(token_rewards, mask, gamma=gamma, group_ids=groups),
        torch.tensor(loop_whiten(centred, masks), dtype=torch.float64),
        atol=1e-9,
    )

    adv, ret = gae_advantages(token_rewards, values, mask, gamma=gamma, lam=0.95)
    raw = [loop_gae(rows[i], values[i].tolist(), masks[i], gamma, 0.95) for i in range(b)]
    expected_returns = [
        [raw[i][k] + values[i, k].item() if masks[i][k] else 0.0 for k in range(t)]
        for i in range(b)
    ]
    assert torch.allclose(ret, torch.tensor(expected_returns, dtype=torch.float64), atol=1e-9)
    assert torch.allclose(
        adv, torch.tensor(loop_whiten(raw, masks), dtype=torch.float64), atol=1e-9
    )


def test_every_registered_estimator_has_the_uniform_signature():
    gen = torch.Generator().manual_seed(0)
    rewards, groups = random_batch(5)
    b, t = len(rewards), 7
    mask = random_mask(b, t, gen)
    for name, estimator in ADVANTAGE_ESTIMATORS.items():
        adv, ret = estimator(
            rewards=rewards,
            mask=mask,
            group_ids=groups,
            token_rewards=None,
            values=torch.randn(b, t, generator=gen),
            gamma=1.0,
            lam=0.95,
        )
        assert adv.shape == ret.shape == (b, t), name
        assert torch.all(adv[mask == 0] == 0), name
    assert {"grpo", "drgrpo", "rloo", "reinforce_pp", "gae"} <= set(ADVANTAGE_ESTIMATORS)
    adv, _ = ADVANTAGE_ESTIMATORS["grpo"](rewards=rewards, mask=mask, group_ids=groups)
    expected = torch.where(mask.bool(), grpo_advantages(rewards, groups)[:, None], 0.0)
    assert torch.allclose(adv, expected.to(adv.dtype))


# ---- properties -------------------------------------------------------------------------------

group_sizes = st.lists(st.integers(1, 6), min_size=1, max_size=6)
reward_value = st.floats(-10, 10, allow_nan=False, width=32)


@settings(max_examples=60, deadline=None)
@given(sizes=group_sizes, data=st.data())
def test_grpo_zero_mean_per_group(sizes: list[int], data: st.DataObject):
    groups = torch.repeat_interleave(torch.arange(len(sizes)), torch.tensor(sizes))
    rewards = torch.tensor(
        data.draw(st.lists(reward_value, min_size=len(groups), max_size=len(groups))),
        dtype=torch.float64,
    )
    for norm in (True, False):
        adv = grpo_advantages(rewards, groups, norm_by_std=norm)
        for g, size in enumerate(sizes):
            if size > 1:
                assert abs(adv[groups == g].sum().item()) < 1e-6 * size * (
                    1 + rewards.abs().max().item()
                )


@settings(max_examples=60, deadline=None)
@given(sizes=group_sizes, value=reward_value)
def test_rloo_and_grpo_of_constant_group_is_zero(sizes: list[int], value: float):
    groups = torch.repeat_interleave(torch.arange(len(sizes)), torch.tensor(sizes))
    rewards = torch.full((len(groups),), value)
    assert torch.all(rloo_advantages(rewards, groups) == 0)
    multi = torch.tensor([sizes[g] > 1 for g in groups.tolist()])
    assert torch.all(grpo_advantages(rewards, groups)[multi] == 0)
    assert torch.all(~dapo_keep_groups(rewards, groups))
