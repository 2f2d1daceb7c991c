"""allocate_rollouts against a plain loop twin of the same steps, plus its guarantees.

The twin below follows ``allocator/algorithm.py``'s docstring one prompt at a time: water-filling
pass by pass (as the authors' code does), bisection for the water level, largest remainder and
round-robin with explicit loops, the skip rule's probability and both ``skip_budget`` modes. It
shares no code with the vectorised version.
"""

from __future__ import annotations

import math
from fractions import Fraction

import numpy as np
import pytest

from allocator.algorithm import UNEXPLORED, GradStats, allocate_rollouts, compute_priorities
from dynamo_rl.contracts.allocator import AllocationParams

# -- the loop twin -----------------------------------------------------------------------------


def loop_priorities(g, k, initial_budget, mastery, min_p, priority):
    out = []
    for big_g, small_k in zip(g, k, strict=True):
        if big_g < initial_budget:
            out.append(-1.0)
            continue
        acc = small_k / big_g if big_g > 0 else 0.0
        if acc >= mastery:
            value = min_p
        else:
            var = small_k * (big_g - small_k) / (big_g * (big_g - 1)) if big_g > 1 else 0.0
            value = max(var, min_p)
        out.append(math.sqrt(value) if priority == "std" else value)
    return out


def loop_largest_remainder(shares, total, caps):
    ints = [min(math.floor(s + 1e-9), math.floor(c)) for s, c in zip(shares, caps, strict=True)]
    left = total - sum(ints)
    order = sorted(range(len(shares)), key=lambda i: (-(shares[i] - ints[i]), i))
    for i in order:
        if left <= 0:
            break
        if ints[i] < caps[i]:
            ints[i] += 1
            left -= 1
    return ints


def loop_allocate(
    g,
    k,
    budget,
    *,
    n_min,
    n_max,
    initial_budget,
    mastery_threshold,
    min_priority,
    priority,
    scheme,
    hopeless_after=0,
    hopeless_n=1,
    method="dra",
    skip_after=0,
    skip_max=0.75,
    grad_half_life=4.0,
    skip_budget="respend",
    streak=None,
    age=None,
    draws=None,
):
    n_max = max(n_min, n_max)
    initial_budget = max(n_min, initial_budget)
    n = len(g)
    if method == "uniform":  # no exploration, equal weights
        p = [1.0] * n
    else:
        p = loop_priorities(g, k, initial_budget, mastery_threshold, min_priority, priority)
    total = min(max(budget, n * n_min), n * n_max)
    skipped = [False] * n
    if draws is not None and skip_after > 0:
        for i in range(n):
            over = streak[i] - skip_after + 1
            prob = min(skip_max, 1 - 2.0**-over) if over > 0 else 0.0
            skipped[i] = draws[i] < prob * 0.5 ** (max(age[i], 0) / grad_half_life)
    out = [skip_budget == "save" and skipped[i] for i in range(n)]
    kept = n - sum(out)
    if kept < n:  # the skipped prompts' share, T·S/N rounded up, is not spent
        total = math.floor(Fraction(total * kept, n))
    counts = [0 if out[i] else n_min for i in range(n)]  # step 2 first: n_min is reserved
    spare = total - kept * n_min
    hopeless = [
        hopeless_after > 0 and p[i] != -1.0 and g[i] >= hopeless_after and k[i] < 0.5 and not out[i]
        for i in range(n)
    ]
    demoted = [False] * n
    for i in range(n):
        if skipped[i] and not out[i]:  # respend: its n_min goes to the others
            counts[i] = 0
            spare += n_min
        elif hopeless[i]:
            counts[i] = hopeless_n
            spare += n_min - hopeless_n
        demoted[i] = skipped[i] or hopeless[i]
    # Step 1: exploration above n_min.
    extra = []
    for i in range(n):
        if p[i] == -1.0 and not demoted[i]:
            need = min(max(initial_budget - g[i], 0), n_max)
            extra.append(max(math.ceil(need) - n_min, 0))
        else:
            extra.append(0)
    if sum(extra) <= spare:
        for i in range(n):
            counts[i] += extra[i]
        spare -= sum(extra)
    else:
        shares = [e * spare / sum(extra) for e in extra]
        add = loop_largest_remainder(shares, spare, extra)
        for i in range(n):
            counts[i] += add[i]
        spare = 0
    # Step 3: by priority.
    room = n_max - n_min
    eligible = [i for i in range(n) if p[i] != -1.0 and p[i] > 0 and not demoted[i]]
    if spare > 0 and eligible and room > 0 and method == "uniform":
        while spare > 0 and any(counts[i] < n_max for i in eligible):  # even, lowest first
            for i in eligible:
                if spare > 0 and counts[i] < n_max:
                    counts[i] += 1
                    spare -= 1
    elif spare > 0 and eligible and room > 0:
        x = dict.fromkeys(eligible, 0.0)
        if scheme == "reference":
            active = list(eligible)
            remaining = float(spare)
            while remaining > 1e-9 and active:  # one proportional pass, then cap, redistribute
                weight = sum(p[i] for i in active)
                for i in active:
                    x[i] += remaining * p[i] / weight
                remaining = 0.0
                still = []
                for i in active:
                    if x[i] > room:
                        remaining += x[i] - room
                        x[i] = float(room)
                    else:
                        still.append(i)
                active = still
        else:

            def level_sum(lam):
                return sum(min(max(lam * p[i], n_min), n_max) - n_min for i in eligible)

            lo, hi = 0.0, n_max / min(p[i] for i in eligible)
            if level_sum(hi) <= spare:
                for i in eligible:
                    x[i] = float(room)
            else:
                for _ in range(200):
                    mid = (lo + hi) / 2
                    lo, hi = (mid, hi) if level_sum(mid) < spare else (lo, mid)
                for i in eligible:
                    x[i] = min(max(hi * p[i], n_min), n_max) - n_min
        shares = [x[i] for i in eligible]
        target = min(spare, round(sum(shares)))
        add = loop_largest_remainder(shares, target, [room] * len(eligible))
        for j, i in enumerate(eligible):
            counts[i] += add[j]
        spare -= sum(add)
    for pool in ([i for i in range(n) if not demoted[i]], [i for i in range(n) if not out[i]]):
        while spare > 0 and any(counts[i] < n_max for i in pool):  # round-robin, lowest first
            for i in pool:
                if spare > 0 and counts[i] < n_max:
                    counts[i] += 1
                    spare -= 1
    return counts, p


# -- random cases ------------------------------------------------------------------------------


def _random_case(rng: np.random.Generator) -> dict:
    n = int(rng.integers(0, 80))
    n_min = int(rng.integers(0, 10))
    # n_max = n_min (no room above the floor) is a case of its own; n_max < n_min is invalid.
    n_max = max(n_min + int(rng.integers(0, 20)) if rng.random() < 0.9 else n_min, 1)
    decayed = rng.random() < 0.3
    g = rng.integers(0, 60, n).astype(float)
    if decayed:
        g = g * rng.uniform(0.3, 1.0, n)
    k = np.floor(g * rng.random(n)) if not decayed else g * rng.random(n)
    # Make some prompts all-wrong / all-right, the corner cases of the variance.
    k[rng.random(n) < 0.1] = 0
    sel = rng.random(n) < 0.1
    k[sel] = g[sel]
    budget = int(rng.integers(0, max(1, n * (max(n_max, n_min) + 4)) + 1))
    return {
        "g": g,
        "k": k,
        "budget": budget,
        "n_min": n_min,
        "n_max": n_max,
        "initial_budget": int(rng.integers(0, 16)),
        "mastery_threshold": float(rng.choice([0.85, 0.5, 1.0])),
        "min_priority": float(rng.choice([0.01, 0.0, 0.05])),
        "priority": str(rng.choice(["variance", "std"])),
        "scheme": str(rng.choice(["reference", "water-level"])),
        "hopeless_after": int(rng.choice([0, 0, 4, 16])),
        "hopeless_n": int(rng.integers(0, n_min + 1)),
        "method": str(rng.choice(["dra", "dra", "uniform"])),
        "skip_after": int(rng.choice([0, 1, 2])),
        "skip_max": float(rng.choice([0.0, 0.5, 0.9])),
        "grad_half_life": float(rng.choice([1.0, 4.0])),
        "skip_budget": str(rng.choice(["respend", "save"])),
        "streak": rng.integers(0, 5, n).astype(float),
        "age": rng.integers(0, 9, n).astype(float),
        "draws": rng.random(n),
    }


ARRAYS = ("g", "k", "budget", "streak", "age", "draws")


def _params(case: dict) -> dict:
    """A case's parameters: every key but the statistics, the skip draws and the budget."""
    return {key: value for key, value in case.items() if key not in ARRAYS}


def _vectorised(case: dict):
    params = AllocationParams(**_params(case))
    n = len(case["g"])
    grad = GradStats(np.full(n, np.nan), case["age"], case["streak"])
    result = allocate_rollouts(
        case["g"], case["k"], case["budget"], params, grad=grad, skip_draws=case["draws"]
    )
    return result.counts, result.weights


def _loop(case: dict):
    kw = {"streak": list(case["streak"]), "age": list(case["age"]), "draws": list(case["draws"])}
    return loop_allocate(list(case["g"]), list(case["k"]), case["budget"], **_params(case), **kw)


def _skipped(case: dict) -> np.ndarray:
    """The case's skipped prompts, by the twin's own arithmetic."""
    over = case["streak"] - case["skip_after"] + 1
    prob = np.where(over > 0, np.minimum(case["skip_max"], 1 - 2.0 ** -np.maximum(over, 0)), 0.0)
    prob *= 0.5 ** (case["age"] / case["grad_half_life"])
    return (case["draws"] < prob) & (case["skip_after"] > 0)


@pytest.mark.parametrize("seed", range(6))
def test_matches_loop_twin_and_keeps_guarantees(seed: int) -> None:
    rng = np.random.default_rng(seed)
    for _ in range(60):
        case = _random_case(rng)
        counts, prio = _vectorised(case)
        twin, twin_prio = _loop(case)
        n = len(case["g"])
        n_min, n_max = case["n_min"], max(case["n_min"], case["n_max"])
        expected_total = min(max(case["budget"], n * n_min), n * n_max)
        skipped = _skipped(case)
        if case["skip_budget"] == "save" and skipped.any():
            expected_total = expected_total * (n - int(skipped.sum())) // n
        assert counts.dtype == np.int64 and counts.shape == (n,)
        np.testing.assert_allclose(prio, twin_prio, rtol=1e-12, atol=1e-12)
        assert int(counts.sum()) == expected_total == sum(twin), case
        if n:
            low = np.full(n, n_min)
            if case["hopeless_after"]:
                gone = (prio != UNEXPLORED) & (case["g"] >= case["hopeless_after"])
                low[gone & (case["k"] < 0.5)] = case["hopeless_n"]
            low[skipped] = 0
            assert (counts >= low).all() and counts.max() <= n_max, case
            if case["skip_budget"] == "save":
                assert not counts[skipped].any(), case  # the skipped prompts get nothing
            assert np.abs(counts - np.array(twin)).max() <= 1, (case, counts, twin)


@pytest.mark.parametrize("seed", range(3))
def test_more_priority_never_means_fewer_samples(seed: int) -> None:
    rng = np.random.default_rng(100 + seed)
    for _ in range(40):
        case = _random_case(rng)
        counts, prio = _vectorised(case)
        done = prio != UNEXPLORED
        if case["hopeless_after"]:  # hopeless prompts are the intended exception
            done &= ~((case["g"] >= case["hopeless_after"]) & (case["k"] < 0.5))
        done = np.flatnonzero(done & ~_skipped(case))  # skipped prompts too
        n_max = max(case["n_min"], case["n_max"])
        for i in done:
            for j in done:
                if prio[i] > prio[j] and counts[i] < counts[j]:
                    assert counts[i] == n_max, (case, i, j)  # only a binding cap may do that


def test_priorities_by_hand() -> None:
    g = [4, 16, 16, 16, 20, 16]
    k = [2, 8, 0, 16, 17, 1]
    p = compute_priorities(g, k, AllocationParams(initial_budget=8))
    assert p[0] == UNEXPLORED
    assert p[1] == pytest.approx(8 * 8 / (16 * 15))
    assert p[2] == pytest.approx(0.01)  # never solved: variance 0, floored
    assert p[3] == pytest.approx(0.01)  # mastered
    assert p[4] == pytest.approx(0.01)  # 0.85 exactly counts as mastered
    assert p[5] == pytest.approx(15 / (16 * 15))
    s = compute_priorities(g, k, AllocationParams(initial_budget=8, priority="std"))
    np.testing.assert_allclose(s[1:], np.sqrt(p[1:]))


def test_counts_move_toward_half_solved_prompts() -> None:
    g = np.array([32, 32, 32, 32])
    k = np.array([16, 2, 31, 0])  # half-solved, hard, easy, never solved
    counts = allocate_rollouts(g, k, 4 * 16, AllocationParams(n_min=8, n_max=24)).counts
    assert counts.sum() == 64
    assert counts[0] == 24  # capped; its overflow goes to the others by priority
    assert counts[1] > counts[2] == counts[3] >= 8


def test_unexplored_prompts_get_their_initial_budget() -> None:
    g = np.array([0, 0, 32, 32])
    k = np.array([0, 0, 16, 16])
    counts = allocate_rollouts(
        g, k, 4 * 6, AllocationParams(n_min=4, n_max=24, initial_budget=8)
    ).counts
    assert list(counts) == [8, 8, 4, 4]
    # Budget short: the part above n_min is scaled, never below n_min for anyone.
    counts = allocate_rollouts(
        g, k, 4 * 5, AllocationParams(n_min=4, n_max=24, initial_budget=8)
    ).counts
    assert list(counts) == [6, 6, 4, 4]


def test_hopeless_prompts_give_their_share_to_the_others() -> None:
    g = np.array([32, 32, 32, 8, 32])
    k = np.array([16, 2, 0, 0, 0.3])  # half-solved, hard, never solved (32), (only 8), decayed
    kw = {"n_min": 4, "n_max": 24, "initial_budget": 8}
    base = allocate_rollouts(g, k, 5 * 8, AllocationParams(**kw)).counts
    counts = allocate_rollouts(
        g, k, 5 * 8, AllocationParams(**kw, hopeless_after=16, hopeless_n=1)
    ).counts
    assert base.min() >= 4
    # never solved after >= 16 samples (k < 0.5 also after decay): 1 each; 8 samples: not yet.
    assert counts[2] == counts[4] == 1 and counts[3] >= 4
    assert counts.sum() == base.sum() == 40
    assert counts[0] > base[0] and counts[1] >= base[1]  # the freed 6 follow the priorities
    off = allocate_rollouts(g, k, 5 * 8, AllocationParams(**kw, hopeless_after=0)).counts
    assert off.tolist() == base.tolist()
    # Everyone else capped: what is left reaches the hopeless prompts again (sum stays exact).
    full = allocate_rollouts(
        g, k, 5 * 24, AllocationParams(n_min=4, n_max=24, hopeless_after=16, hopeless_n=0)
    ).counts
    assert full.tolist() == [24] * 5


def test_round_robin_when_no_priority() -> None:
    g = np.full(3, 10.0)
    k = np.zeros(3)
    counts = allocate_rollouts(
        g, k, 3 * 4 + 2, AllocationParams(n_min=4, n_max=8, min_priority=0.0)
    ).counts
    assert list(counts) == [5, 5, 4]


def test_budget_is_clipped_and_empty_input() -> None:
    g, k = np.full(5, 20.0), np.full(5, 10.0)
    params = AllocationParams(n_min=4, n_max=24)
    assert allocate_rollouts(g, k, 0, params).counts.tolist() == [4] * 5
    assert allocate_rollouts(g, k, 10**9, params).counts.tolist() == [24] * 5
    assert allocate_rollouts([], [], 100).counts.size == 0


def test_water_level_std_beats_reference_on_the_variance_objective() -> None:
    rng = np.random.default_rng(7)
    g = np.full(2000, 32.0)
    k = rng.binomial(32, rng.random(2000)).astype(float)
    sigma2 = compute_priorities(g, k)  # variance, floored
    objective = {}
    for scheme in ("reference", "water-level"):
        params = AllocationParams(n_min=4, n_max=32, scheme=scheme, priority="std")
        counts = allocate_rollouts(g, k, 16 * 2000, params).counts
        objective[scheme] = float((sigma2 / counts).sum())
    uniform = float((sigma2 / 16).sum())
    assert objective["water-level"] < objective["reference"] < uniform


@pytest.mark.parametrize(
    ("kwargs", "match"),
    [
        ({"scheme": "nope"}, "scheme"),
        ({"priority": "nope"}, "priority"),
        ({"n_min": -1}, "n_min"),
        ({"n_min": 9, "n_max": 8}, "n_min"),
        ({"hopeless_after": -1}, "hopeless_after"),
        ({"hopeless_after": 8, "n_min": 2, "hopeless_n": 3}, "hopeless_n"),
    ],
)
def test_bad_parameters_name_the_field(kwargs: dict, match: str) -> None:
    """The parameters are checked by their model before the algorithm sees them."""
    with pytest.raises(ValueError, match=match):
        allocate_rollouts([10, 10], [5, 5], 32, AllocationParams(**kwargs))


def test_bad_budget_names_the_field() -> None:
    with pytest.raises(ValueError, match="budget"):
        allocate_rollouts([10, 10], [5, 5], -5)


def test_bad_statistics_are_rejected() -> None:
    with pytest.raises(ValueError, match="success_counts"):
        allocate_rollouts([4, 4], [5, 1], 16)
    with pytest.raises(ValueError, match="entries"):
        allocate_rollouts([4, 4], [1], 16)


def test_the_defaults_are_n_min_2_n_max_16_initial_budget_8_and_hopeless_n_1() -> None:
    """Left out, each keyword means its documented default: the floor (budget 0), the cap (a
    large budget), a prompt at G = 8 explored, and a hopeless prompt's share."""
    g, k = [8, 0, 16, 8, 12], [4, 0, 0, 8, 3]
    explicit = {"n_min": 2, "n_max": 16, "initial_budget": 8, "hopeless_n": 1}
    for budget in (0, 30, 10_000):
        assert (
            allocate_rollouts(g, k, budget, AllocationParams(hopeless_after=16)).counts.tolist()
            == allocate_rollouts(
                g, k, budget, AllocationParams(hopeless_after=16, **explicit)
            ).counts.tolist()
        ), budget
    assert compute_priorities([8, 7], [4, 3]).tolist() == (
        compute_priorities([8, 7], [4, 3], AllocationParams(initial_budget=8)).tolist()
    )
