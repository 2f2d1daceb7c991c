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


def _every_estimator(ids: A.GroupIds, inputs: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """Each function of the module on the same CPU inputs (``ids`` a tensor or a list)."""
    rewards, mask, tok, values = (inputs[k] for k in ("rewards", "mask", "tok", "values"))
    adv, ret = A.gae_advantages(tok, values, mask, gamma=0.9, lam=0.8)
    return {
        "grpo": A.grpo_advantages(rewards, ids),
        "rloo": A.rloo_advantages(rewards, ids),
        "dapo": A.dapo_keep_groups(rewards, ids),
        "reinforce_pp": A.reinforce_pp_advantages(tok, mask, gamma=0.9, group_ids=ids),
        "outcome": A.outcome_token_rewards(rewards, mask),
        "gae": adv,
        "gae_returns": ret,
        "whiten": A.masked_whiten(tok, mask),
        "mean": A.masked_mean(tok, mask, dim=-1),
        "returns": A.discounted_returns(tok, mask, 0.9),
    }


@pytest.mark.parametrize(
    "ids", [torch.tensor([0, 0, 1, 1, 1]), ["a", "a", "b", "b", "b"]], ids=["tensor", "list"]
)
def test_every_tensor_an_estimator_builds_is_on_its_inputs_device(ids: A.GroupIds) -> None:
    """With the default device set to ``meta``, a tensor built without the inputs' device lands
    there and meets the CPU inputs (an error or values without data): on a GPU the same mistake
    puts CPU and CUDA tensors together. The only second device a CPU machine has."""
    gen = torch.Generator().manual_seed(3)
    inputs = {
        "rewards": torch.tensor([1.0, 0.0, 2.0, 2.0, 2.0]),  # group b all equal: DAPO drops it
        "mask": torch.tensor([[1, 1, 0], [1, 0, 0], [1, 1, 1], [0, 1, 1], [1, 1, 1]]),
        "tok": torch.randn(5, 3, generator=gen),
        "values": torch.randn(5, 3, generator=gen),
    }
    expected = _every_estimator(ids, inputs)
    with torch.device("meta"):  # tensors made from here on without a device are meta
        got = _every_estimator(ids, inputs)
    for name, value in expected.items():
        assert got[name].device.type == "cpu", name
        assert torch.equal(got[name], value), name


def test_group_index_puts_the_index_on_the_device_asked_for() -> None:
    ids = torch.tensor([3, 1, 3])
    meta = torch.device("meta")
    assert A.group_index(ids, meta)[0].device == meta
    assert A.group_index(ids)[0].device == ids.device
    with torch.device("meta"):
        index, g = A.group_index(["x", "y", "x"], torch.device("cpu"))
    assert index.device.type == "cpu" and index.tolist() == [0, 1, 0] and g == 2


def test_shape_errors_name_the_argument_and_the_shape() -> None:
    flat, two_d = torch.zeros(3), torch.zeros(2, 2)
    for fn in (A.grpo_advantages, A.rloo_advantages, A.dapo_keep_groups):
        with pytest.raises(ValueError, match=r"^rewards must be 1-D \[B\], got shape \(2, 2\)$"):
            fn(two_d, [0, 0])
        with pytest.raises(
            ValueError, match=r"^group_ids must have shape \[B\]=\[3\], got \(2,\)$"
        ):
            fn(flat, [0, 0])
    with pytest.raises(ValueError, match=r"^group_ids must be 1-D \[B\], got shape \(1, 2\)$"):
        A.group_index(torch.zeros(1, 2, dtype=torch.long))
    with pytest.raises(
        ValueError, match=r"^group_ids must be an integer \(or bool\) tensor, not floating point$"
    ):
        A.group_index(torch.zeros(2))
    mask = torch.ones(2, 3)
    for bad, name in ((0, "token_rewards"), (1, "values")):
        args = [torch.zeros(2, 3), torch.zeros(2, 3)]
        args[bad] = torch.zeros(2, 2)
        with pytest.raises(
            ValueError,
            match=rf"^{name} must have the shape of mask \[B, T\]=\(2, 3\), got \(2, 2\)$",
        ):
            A.gae_advantages(*args, mask, gamma=1.0, lam=1.0)


def test_estimators_work_in_float32_or_float64_whatever_the_reward_dtype() -> None:
    ids = [0, 0, 1, 1]
    for dtype, want in ((torch.bfloat16, torch.float32), (torch.int64, torch.float32),
                        (torch.float64, torch.float64)):  # fmt: skip
        r = torch.tensor([1, 0, 1, 1]).to(dtype)
        assert A.grpo_advantages(r, ids).dtype == want, dtype
        assert A.rloo_advantages(r, ids).dtype == want, dtype
    # DAPO tells rewards apart below float32's resolution when they come as float64.
    close = torch.tensor([1.0, 1.0 + 1e-12, 2.0, 2.0], dtype=torch.float64)
    assert A.dapo_keep_groups(close, ids).tolist() == [True, True, False, False]


def test_grpo_divides_by_std_plus_eps_exactly() -> None:
    eps = 1e-6
    r = torch.tensor([0.0, 2e-6, 3.0], dtype=torch.float64)
    got = A.grpo_advantages(r, [0, 0, 1], eps=eps)
    std = (2e-6**2 / 2) ** 0.5  # unbiased std of (0, 2e-6)
    assert got.tolist() == pytest.approx([-1e-6 / (std + eps), 1e-6 / (std + eps), 3 / (1 + eps)],
                                         rel=1e-12)  # fmt: skip


def test_masked_whiten_with_one_two_or_equal_valid_values() -> None:
    mask = torch.tensor([[1, 0, 0]])
    assert A.masked_whiten(torch.tensor([[5.0, 9.0, 9.0]]), mask).tolist() == [[0.0, 0.0, 0.0]]
    two = A.masked_whiten(torch.tensor([[1.0, 3.0, 7.0]]), torch.tensor([[1, 1, 0]]))
    # mean 2, unbiased variance 2: (∓1) / sqrt(2)
    assert two[0].tolist() == pytest.approx([-(0.5**0.5), 0.5**0.5, 0.0], rel=1e-6)
    # Equal values: variance 0 gives 0, not NaN from a negative under the root.
    assert A.masked_whiten(torch.full((2, 2), 4.0), torch.ones(2, 2)).tolist() == [[0.0] * 2] * 2


def test_gae_on_one_token_rows() -> None:
    adv, ret = A.gae_advantages(torch.tensor([[1.0], [0.0]]), torch.tensor([[0.25], [0.5]]),
                                torch.ones(2, 1), gamma=0.9, lam=0.8)  # fmt: skip
    # δ = r − V (nothing after the only token): 0.75 and −0.5; returns = δ + V = r.
    assert ret.tolist() == [[1.0], [0.0]]
    assert adv.flatten().tolist() == pytest.approx([2**-0.5, -(2**-0.5)], rel=1e-6)
