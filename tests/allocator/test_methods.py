"""The allocation methods beyond dra (grad, knapsack, uniform) and the skip rule: budget and
bounds for any input (property-based, both ``skip_budget`` modes), knapsack against a loop twin,
grad's σ fallback and decay, and the skip rule's re-checks."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from allocator.algorithm import (
    GradStats,
    allocate_rollouts,
    freshness,
    grad_weights,
    skip_probability,
)
from dynamo_rl.contracts.allocator import METHODS, AllocationParams, InvalidParams


@st.composite
def batches(draw):
    n = draw(st.integers(0, 40))
    n_min = draw(st.integers(0, 8))
    n_max = draw(st.integers(max(1, n_min), 32))
    g = np.array(draw(st.lists(st.integers(0, 40), min_size=n, max_size=n)), dtype=float)
    k = np.array([draw(st.integers(0, int(x))) for x in g], dtype=float)
    spread = np.array(
        draw(st.lists(st.one_of(st.just(np.nan), st.floats(0, 50)), min_size=n, max_size=n))
    )
    age = np.array(draw(st.lists(st.integers(0, 30), min_size=n, max_size=n)), dtype=float)
    streak = np.array(draw(st.lists(st.integers(0, 6), min_size=n, max_size=n)), dtype=float)
    draws = np.array(draw(st.lists(st.floats(0, 0.999), min_size=n, max_size=n)))
    params = AllocationParams(
        n_min=n_min,
        n_max=n_max,
        initial_budget=draw(st.integers(0, 16)),
        method=draw(st.sampled_from(METHODS)),
        scheme=draw(st.sampled_from(["reference", "water-level"])),
        priority=draw(st.sampled_from(["variance", "std"])),
        hopeless_after=draw(st.sampled_from([0, 0, 8])),
        hopeless_n=min(n_min, 1),
        skip_after=draw(st.sampled_from([0, 1, 2])),
        skip_max=draw(st.sampled_from([0.0, 0.5, 0.9])),
        grad_half_life=draw(st.sampled_from([1.0, 4.0])),
        skip_budget=draw(st.sampled_from(["respend", "save"])),
    )
    budget = draw(st.integers(0, 40 * 40))
    return g, k, GradStats(spread, age, streak), draws, params, budget


@settings(max_examples=400, deadline=None)
@given(batches())
def test_every_method_spends_exactly_its_budget_within_the_bounds(case) -> None:
    g, k, grad, draws, params, budget = case
    n = g.size
    counts = allocate_rollouts(g, k, budget, params, grad=grad, skip_draws=draws).counts
    assert counts.dtype == np.int64 and counts.shape == (n,)
    total = int(np.clip(budget, n * params.n_min, n * params.n_max))
    skipped = draws < skip_probability(
        grad, params.skip_after, params.skip_max, params.grad_half_life
    )
    save = params.skip_budget == "save"
    if save:  # the skipped prompts' share is not spent: T·(N − S)/N, rounded down
        total = total * (n - int(skipped.sum())) // n if n else 0
        assert not counts[skipped].any()
    assert int(counts.sum()) == total
    assert (counts <= params.n_max).all() and (counts >= 0).all()
    hopeless = np.zeros(n, dtype=bool)
    if params.hopeless_after:
        explored = max(params.n_min, params.initial_budget) if params.method != "uniform" else 0
        hopeless = (g >= explored) & (g >= 8) & (k < 0.5) & ~(skipped & save)
    # Only hopeless or skipped prompts go below n_min, and they get more only once every other
    # prompt is full.
    low = counts < params.n_min
    assert not (low & ~(skipped | hopeless)).any()
    if ((counts > np.where(skipped, 0, params.hopeless_n)) & (skipped | hopeless)).any():
        assert (counts[~(skipped | hopeless)] == params.n_max).all()


@settings(max_examples=200, deadline=None)
@given(batches())
def test_saved_budget_allocates_the_kept_prompts_as_a_batch_of_their_own(case) -> None:
    """Under skip_budget save the kept prompts get what a batch of only them would get with the
    budget cut to their share (grad aside: its σ scale is set over the whole batch)."""
    g, k, grad, draws, params, budget = case
    params = params.model_copy(update={"skip_budget": "save"})
    if params.method == "grad" or not params.skip_after:
        return
    n = g.size
    counts = allocate_rollouts(g, k, budget, params, grad=grad, skip_draws=draws).counts
    half = params.grad_half_life
    kept = ~(draws < skip_probability(grad, params.skip_after, params.skip_max, half))
    total = int(np.clip(budget, n * params.n_min, n * params.n_max)) * int(kept.sum()) // max(n, 1)
    alone = allocate_rollouts(g[kept], k[kept], total, params).counts
    assert counts[kept].tolist() == alone.tolist()
    assert not counts[~kept].any()


def test_uniform_method_spreads_the_budget_evenly_without_exploring() -> None:
    params = AllocationParams(method="uniform", n_min=2, n_max=16, initial_budget=8)
    g, k = np.array([0.0, 4, 16, 16]), np.array([0.0, 2, 8, 0])  # two still explored by dra
    assert allocate_rollouts(g, k, 32, params).counts.tolist() == [8, 8, 8, 8]
    assert allocate_rollouts(g, k, 30, params).counts.tolist() == [8, 8, 7, 7]
    assert allocate_rollouts(g, k, 32, params).weights.tolist() == [1.0] * 4
    hopeless = params.model_copy(update={"hopeless_after": 16, "hopeless_n": 1})
    assert allocate_rollouts(g, k, 32, hopeless).counts.tolist() == [11, 10, 10, 1]


def test_skipped_budget_is_respent_or_saved() -> None:
    """respend: the skipped prompt's share goes to the others (the sum stays the budget); save:
    nobody gets it, and the others get exactly what they would have (uniform n)."""
    g, k = np.full(4, 16.0), np.array([0.0, 8, 8, 8])
    grad = GradStats(np.zeros(4), np.zeros(4), np.array([5.0, 0, 0, 0]))
    kw = {"method": "uniform", "n_min": 2, "n_max": 16, "skip_after": 1, "skip_max": 0.75}
    draws = [0.0, 0.9, 0.9, 0.9]  # the first prompt is skipped
    respend = AllocationParams(**kw)
    save = AllocationParams(**kw, skip_budget="save")
    assert allocate_rollouts(g, k, 32, respend, grad=grad, skip_draws=draws).counts.tolist() == [
        0, 11, 11, 10
    ]  # fmt: skip
    assert allocate_rollouts(g, k, 32, save, grad=grad, skip_draws=draws).counts.tolist() == [
        0, 8, 8, 8
    ]  # fmt: skip
    # Nothing skipped: the two modes agree.
    none = [0.9] * 4
    assert (
        allocate_rollouts(g, k, 32, save, grad=grad, skip_draws=none).counts.tolist()
        == allocate_rollouts(g, k, 32, respend, grad=grad, skip_draws=none).counts.tolist()
        == [8] * 4
    )


def loop_knapsack(rate, value, n_min, n_max, spare):
    """One response at a time to the prompt with the largest gain (lowest index on ties)."""
    counts = [n_min] * len(rate)
    for _ in range(spare):
        best, best_gain = None, 0.0
        for i, (p, v) in enumerate(zip(rate, value, strict=True)):
            if counts[i] >= n_max:
                continue
            n = counts[i]
            gain = v * ((1 - p ** (n + 1) - (1 - p) ** (n + 1)) - (1 - p**n - (1 - p) ** n))
            if gain > best_gain + 1e-15:
                best, best_gain = i, gain
        if best is None:
            break
        counts[best] += 1
    return counts


@pytest.mark.parametrize("seed", range(20))
def test_knapsack_matches_its_greedy_loop_twin(seed: int) -> None:
    rng = np.random.default_rng(seed)
    n = int(rng.integers(1, 30))
    g = rng.integers(8, 40, n).astype(float)
    k = np.floor(g * rng.choice([0.0, 0.1, 0.3, 0.5, 0.8, 1.0], n))
    params = AllocationParams(method="knapsack", n_min=2, n_max=16, initial_budget=8)
    budget = int(rng.integers(2 * n, 16 * n + 1))
    counts = allocate_rollouts(g, k, budget, params).counts
    rate = (k / g).tolist()
    value = [p * (1 - p) ** 2 for p in rate]
    want = loop_knapsack(rate, value, 2, 16, budget - 2 * n)
    assert counts.sum() == budget
    if sum(want) == budget:  # 12 of the 20 seeds: every response follows a gain
        assert counts.tolist() == want
    else:  # the rest goes round-robin on top
        assert (counts >= np.array(want)).all()


def test_knapsack_favours_hard_prompts_that_rarely_give_a_signal() -> None:
    """p = 0.1 needs many samples for a non-zero gradient; p = 0.5 gets one with few."""
    params = AllocationParams(method="knapsack", n_min=2, n_max=24, initial_budget=8)
    counts = allocate_rollouts([16, 16, 16, 16], [2, 8, 16, 0], 32, params).counts
    assert counts[0] > counts[1] > counts[2] and counts[3] == 2 and counts[2] == 2


def test_grad_follows_the_measured_spread_and_falls_back_to_sigma() -> None:
    params = AllocationParams(method="grad", n_min=2, n_max=24, initial_budget=8)
    g, k = np.full(4, 16.0), np.full(4, 8.0)  # equal σ
    grad = GradStats(np.array([1.0, 4.0, np.nan, 0.0]), np.zeros(4), np.zeros(4))
    counts = allocate_rollouts(g, k, 32, params, grad=grad).counts
    assert counts[1] > counts[0] > counts[3] and counts[3] == 2
    # The unmeasured prompt gets σ scaled to the measured ones: c = (1 + 4 + 0) / 3 σ-units.
    w = grad_weights(np.full(4, 0.5), grad, params.grad_half_life)
    assert w[2] == pytest.approx(5 / 3)


def test_a_stale_spread_decays_toward_the_sigma_allocation() -> None:
    g = np.full(6, 16.0)
    k = np.array([1.0, 4, 8, 12, 15, 8])
    spread = np.array([9.0, 1, 1, 1, 9, 1])
    grad_params = AllocationParams(method="grad", n_min=2, n_max=24, grad_half_life=2.0)
    sigma_params = AllocationParams(
        method="dra", scheme="water-level", priority="std", n_min=2, n_max=24
    )

    def counts(age: float):
        stats = GradStats(spread, np.full(6, age), np.zeros(6))
        return allocate_rollouts(g, k, 60, grad_params, grad=stats).counts

    sigma = allocate_rollouts(g, k, 60, sigma_params).counts
    fresh, aged = counts(0), counts(2)
    assert fresh[0] > sigma[0]  # the measured spread, not σ, at the current weights
    assert abs(aged[0] - sigma[0]) < abs(fresh[0] - sigma[0])  # half-way after a half-life
    assert counts(200).tolist() == sigma.tolist()  # σ once the statistic has decayed away
    assert freshness([0, 2, 4], 2.0).tolist() == [1.0, 0.5, 0.25]


def test_skip_rule_skips_zero_advantage_streaks_with_growing_probability() -> None:
    grad = GradStats(np.zeros(5), np.zeros(5), np.array([0.0, 1, 2, 3, 20]))
    p = skip_probability(grad, skip_after=2, skip_max=0.75, half_life=4.0)
    assert p.tolist() == [0.0, 0.0, 0.5, 0.75, 0.75]
    aged = GradStats(grad.spread, np.full(5, 4.0), grad.streak)
    assert skip_probability(aged, 2, 0.75, 4.0).tolist() == [0.0, 0.0, 0.25, 0.375, 0.375]
    assert not skip_probability(grad, 0, 0.75, 4.0).any()  # off


@pytest.mark.parametrize("budget_mode", ["respend", "save"])
def test_skipped_prompts_are_rechecked_now_and_then(budget_mode: str) -> None:
    """A prompt whose group never has signal is still re-checked about 1 − skip_max of the time;
    meanwhile its share goes to the others (respend) or is not spent (save)."""
    params = AllocationParams(
        method="grad", n_min=2, n_max=8, skip_after=1, skip_max=0.75, skip_budget=budget_mode
    )
    g, k = np.full(3, 16.0), np.array([0.0, 8, 8])
    grad = GradStats(np.array([0.0, 1, 1]), np.zeros(3), np.array([10.0, 0, 0]))
    rng = np.random.default_rng(0)
    visits = []
    for _ in range(2000):
        counts = allocate_rollouts(g, k, 12, params, grad=grad, skip_draws=rng.random(3)).counts
        visits.append(counts[0] > 0)
        if counts[0] == 0:
            assert counts[1:].tolist() == ([6, 6] if budget_mode == "respend" else [4, 4])
        else:
            assert counts.sum() == 12
    rate = float(np.mean(visits))
    assert 0.22 < rate < 0.28  # re-checked with probability 1 − 0.75
    rechecked = allocate_rollouts(g, k, 12, params, grad=grad, skip_draws=[0.8, 0.0, 0.0]).counts
    assert rechecked[0] >= params.n_min


@pytest.mark.parametrize(
    ("field", "value", "match"),
    [
        ("method", "neyman", "method: 'neyman' is not one of dra, grad, knapsack, uniform"),
        ("skip_budget", "spend", "skip_budget: 'spend' is not one of respend, save"),
        ("skip_max", 1.0, r"skip_max: must be in \[0, 1\), got 1.0"),
        ("grad_half_life", 0.0, "grad_half_life: must be > 0, got 0.0"),
        ("skip_after", -1, "skip_after: must be >= 0, got -1"),
    ],
)
def test_bad_method_settings_name_the_field(field: str, value, match: str) -> None:
    with pytest.raises(InvalidParams, match=match):
        AllocationParams().with_overrides({field: value})


def test_mismatched_grad_statistics_are_rejected() -> None:
    with pytest.raises(ValueError, match="one entry per prompt"):
        allocate_rollouts([8, 8], [1, 2], 8, grad=GradStats.unmeasured(3))
    with pytest.raises(ValueError, match="skip_draws has 1 entries for 2 prompts"):
        allocate_rollouts([8, 8], [1, 2], 8, AllocationParams(skip_after=1), skip_draws=[0.1])


def test_a_vanishing_spread_counts_as_no_signal() -> None:
    """Found by the property test: a spread of 1e-219 beside 0.5 made the water level's search
    run out of steps and overspend the budget."""
    params = AllocationParams(method="grad", n_min=2, n_max=5, initial_budget=0)
    grad = GradStats(np.array([np.nan, 2e-219, 1.0]), np.zeros(3), np.zeros(3))
    counts = allocate_rollouts([2, 2, 8], [0, 0, 4], 9, params, grad=grad).counts
    assert counts.sum() == 9 and counts[1] == 2
    assert grad_weights(np.full(3, 0.1), grad, 4.0)[1] == 0.0


def test_the_registry_holds_exactly_the_contracts_methods() -> None:
    """A method named in the contract (what the config and a request accept) and missing from the
    registry, or the other way round, fails here rather than at a server's first Allocate."""
    from allocator.algorithm import METHODS as REGISTRY

    assert tuple(REGISTRY) == METHODS


def test_an_unknown_method_names_the_allowed_ones() -> None:
    """The model refuses an unknown method; one that gets past it (model_copy does not validate)
    is refused by the registry with the same allowed names."""
    from allocator.algorithm import method

    params = AllocationParams().model_copy(update={"method": "neyman"})
    with pytest.raises(ValueError, match="'neyman' is not one of dra, grad, knapsack, uniform"):
        allocate_rollouts([8, 8], [1, 2], 16, params)
    with pytest.raises(
        ValueError, match=r"allocator\.method: 'x' is not one of dra, grad, knapsack, uniform"
    ):
        method("x")


@pytest.mark.parametrize("name", METHODS)
def test_every_method_returns_one_result_type_with_its_weights(name: str) -> None:
    """Counts and the step-3 weights come back together whatever the method: −1 exactly where a
    prompt is still explored, the method's own weight elsewhere."""
    from allocator.algorithm import UNEXPLORED, Allocation, compute_priorities

    params = AllocationParams(method=name, n_min=2, n_max=16, initial_budget=8)
    g, k = np.array([4.0, 16, 16, 16]), np.array([2.0, 8, 2, 15])
    result = allocate_rollouts(g, k, 4 * 8, params)
    assert isinstance(result, Allocation)
    assert result.counts.dtype == np.int64 and result.counts.sum() == 32
    assert result.weights.dtype == np.float64 and result.weights.shape == (4,)
    if name == "uniform":  # explores nothing: weight 1 everywhere, the budget spread evenly
        assert result.weights.tolist() == [1.0] * 4 and result.counts.tolist() == [8] * 4
        return
    assert result.weights[0] == UNEXPLORED and (result.weights[1:] > 0).all()
    if name == "dra":
        np.testing.assert_array_equal(result.weights, compute_priorities(g, k, params))
    elif name == "knapsack":
        rate = k[1:] / g[1:]
        np.testing.assert_allclose(result.weights[1:], rate * (1 - rate) ** 2)
