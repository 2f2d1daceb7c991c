"""Advantage helpers at their edges: the registry adapter, masked means, defaults, one-token
rows, validation bounds and messages.

Each case here was added for a mutant of ``learner/algorithms/advantages.py`` that
test_advantages.py let through (docs/testing.md lists them).
"""

from __future__ import annotations

import inspect
from collections.abc import Iterator

import pytest
import torch

from learner.algorithms import ADVANTAGE_ESTIMATORS
from learner.algorithms import advantages as A


@pytest.fixture
def probe_name() -> Iterator[str]:
    name = "probe_outcome_estimator"
    yield name
    ADVANTAGE_ESTIMATORS._items.pop(
        name, None
    )  # registered by the test: leave the registry as found


def test_the_outcome_adapter_broadcasts_the_per_response_estimator(probe_name: str) -> None:
    # Registered here (not at import) so that the adapter's own code is what runs.
    A._register_outcome_estimator(probe_name, A.rloo_advantages, "probe doc")
    est = ADVANTAGE_ESTIMATORS[probe_name]
    assert (est.__name__, est.__doc__) == (f"_{probe_name}_estimator", "probe doc")
    params = inspect.signature(est).parameters
    assert (params["gamma"].default, params["lam"].default) == (1.0, 1.0)
    rewards = torch.tensor([1.0, 0.0, 3.0, 5.0])
    mask = torch.tensor([[1, 1, 0], [1, 0, 0], [1, 1, 1], [0, 0, 0]])
    adv, ret = est(rewards=rewards, mask=mask, group_ids=["a", "a", "b", "b"])
    per = A.rloo_advantages(rewards, ["a", "a", "b", "b"])
    assert torch.equal(adv, torch.where(mask.bool(), per[:, None], 0.0)) and ret is adv
    assert per.tolist() == [1.0, -1.0, -2.0, 2.0]


def test_masked_mean_over_all_and_per_row() -> None:
    x = torch.tensor([[1.0, 2.0, float("nan")], [4.0, float("inf"), 6.0], [7.0, 8.0, 9.0]])
    mask = torch.tensor([[1, 1, 0], [1, 0, 1], [0, 0, 0]])
    assert A.masked_mean(x, mask).item() == pytest.approx((1 + 2 + 4 + 6) / 4)
    assert A.masked_mean(x, mask, dim=-1).tolist() == [1.5, 5.0, 0.0]  # an empty row is 0
    assert A.masked_mean(x, mask, dim=0).tolist() == [2.5, 2.0, 6.0]
    one = torch.tensor([[3.0, 1.0]]), torch.tensor([[1, 0]])
    assert A.masked_mean(*one).item() == 3.0  # a single valid position is its own mean
    assert A.masked_mean(*one, dim=1).tolist() == [3.0]
    assert A.masked_mean(torch.ones(2, 2), torch.zeros(2, 2)).item() == 0.0
    assert A.masked_mean(x.double(), mask).dtype == torch.float64


def test_discounted_returns_defaults_and_a_one_token_row() -> None:
    r = torch.tensor([[1.0, 2.0, 3.0]])
    mask = torch.ones(1, 3)
    assert A.discounted_returns(r, mask).tolist() == [[6.0, 5.0, 3.0]]  # gamma defaults to 1
    assert A.discounted_returns(torch.tensor([[2.0]]), torch.ones(1, 1), 0.5).tolist() == [[2.0]]
    with pytest.raises(ValueError, match=r"^token_rewards must have the shape of mask"):
        A.discounted_returns(torch.zeros(1, 2), mask)


def test_outcome_reward_lands_on_a_first_and_only_token() -> None:
    out = A.outcome_token_rewards(torch.tensor([5.0, 7.0]), torch.tensor([[1, 0, 0], [0, 0, 0]]))
    assert out.tolist() == [[5.0, 0.0, 0.0], [0.0, 0.0, 0.0]]
    with pytest.raises(ValueError, match=r"^rewards must have shape \[B\]=\[2\]"):
        A.outcome_token_rewards(torch.zeros(3), torch.ones(2, 2))


def test_overlong_penalty_bounds_defaults_and_messages() -> None:
    lengths = torch.tensor([4, 5, 6, 9])
    assert A.overlong_penalty(lengths, 6, 2).tolist() == [0.0, -0.5, -1.0, -1.0]  # factor 1
    assert A.overlong_penalty(lengths, 6, 1).tolist() == [0.0, 0.0, -1.0, -1.0]  # buffer of 1
    assert A.overlong_penalty(lengths, 6, 6).tolist() == pytest.approx([-4 / 6, -5 / 6, -1, -1])
    assert A.overlong_penalty(lengths, 6, 2, factor=0.0).tolist() == [0.0] * 4
    assert A.overlong_penalty(lengths, 6, 2, factor=0.5).tolist() == [0.0, -0.25, -0.5, -0.5]
    with pytest.raises(ValueError, match=r"^factor must be >= 0, got -1"):
        A.overlong_penalty(lengths, 6, 2, factor=-1)
    with pytest.raises(ValueError, match=r"buffer_len must satisfy 0 < buffer_len <= max_len"):
        A.overlong_penalty(lengths, 6, 7)


def test_reinforce_pp_defaults_to_gamma_one_and_checks_group_ids() -> None:
    gen = torch.Generator().manual_seed(1)
    r = torch.randn(3, 4, generator=gen)
    mask = torch.ones(3, 4)
    assert torch.equal(
        A.reinforce_pp_advantages(r, mask), A.reinforce_pp_advantages(r, mask, gamma=1.0)
    )
    with pytest.raises(ValueError, match=r"^group_ids must have shape \[B\]=\[3\]"):
        A.reinforce_pp_advantages(r, mask, group_ids=[0, 0, 1, 1])
