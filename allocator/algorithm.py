"""Dynamic Rollout Allocation: how many responses each prompt of a batch gets.

Every prompt has k successes out of G sampled responses. Its *priority* says how much it can still
teach: unset while G < initial_budget (it is still explored), ``min_priority`` once its success rate
reaches ``mastery_threshold``, otherwise the unbiased Bernoulli variance k(G−k)/(G(G−1)) floored at
``min_priority`` (``priority="variance"``, the authors' code) or its square root (``"std"``, the
theory's optimum n ∝ σ for the gradient-variance proxy Σσ²/n).

A batch's budget T is clipped to [N·n_min, N·n_max] and shared out in three steps:

1. explored prompts get ``min(initial_budget − G, n_max)`` (at least n_min); when T cannot cover
   that, the part above n_min is scaled down proportionally;
2. everyone is topped up to n_min;
3. the rest follows the priorities, by one of two schemes:

   - ``reference``: water-filling in proportion to priority under the n_max caps with capped
     overflow redistributed, as the authors' code does pass by pass. Its fixed point is
     n_i = base_i + min(c·p_i, n_max − base_i) for one level c, which is solved here exactly from
     the sorted breakpoints instead of pass by pass;
   - ``water-level``: n_i = clip(λ·p_i, n_min, n_max) with λ set so the sum meets the budget — the
     KKT solution of min Σσ²/n under the bounds when p = σ.

   Real-valued shares are rounded by largest remainder (ties to the lower index). Whatever cannot
   follow a priority (no prompt has one, or every prioritised prompt is at n_max) is spread evenly
   over the prompts still below n_max, lowest index first (the reference's round-robin).

Hopeless prompts (``hopeless_after`` > 0): a prompt done exploring with at least
``hopeless_after`` samples and no success among them (k < 0.5, so decayed statistics forget an old
success) gets ``hopeless_n`` ≤ n_min responses instead of n_min, and the budget it frees goes to the
others by priority (step 3). Such a prompt's group is all wrong with near certainty, so its
responses carry no advantage; ``hopeless_n`` ≥ 1 keeps its statistics fresh so that it is noticed
once the policy starts to solve it. Round-robin reaches hopeless prompts only when every other
prompt is at n_max.

Methods (``params.method``) change only step 3: its weights and how the rest follows them. Each is
a :class:`Method` (a weight function and a share function, one signature for all) in the registry
:data:`METHODS`, looked up by name (:func:`method`); :func:`allocate_rollouts` returns one
:class:`Allocation` (counts and those weights) whichever it is:

- ``dra``: the priorities above, by ``scheme`` (the paper's; the default);
- ``grad``: water-level on the learner's measured gradient spread (:class:`GradStats`), blended
  toward the σ fallback by its age in weight versions (:func:`grad_weights`); prompts never
  measured get σ scaled to the spreads' units;
- ``knapsack``: Knapsack RL — one response at a time where value·P(non-zero gradient) gains most,
  value = p(1−p)² of the success rate p (:func:`_knapsack`);
- ``uniform``: weight 1 for every prompt and no exploration step (no prompt is ``UNEXPLORED``):
  the rest goes round-robin, so every prompt gets the budget's even share, ⌊T/N⌋ or one more,
  lowest index first. Uniform n with the skip rule or hopeless prompts on.

The skip rule (``skip_after`` > 0, any method): a prompt whose last visits gave zero advantage is
skipped — 0 responses — with a probability growing with that streak, capped at ``skip_max``
(:func:`skip_probability`), so it is re-checked now and then. Its share of the budget:
``skip_budget="respend"`` (default): its n_min goes to the others and it is demoted like a
hopeless prompt; ``"save"``: nobody gets it — the batch is allocated as if only the N − S kept
prompts were in it, with the clipped budget T cut to ⌊T·(N − S)/N⌋ (each kept prompt's mean share
unchanged), and the skipped prompts get exactly 0.

The result sums to exactly the clipped budget (``save`` with S skipped: ⌊T·(N − S)/N⌋) and every
count lies in [n_min, n_max] (hopeless prompts: [hopeless_n, n_max]; skipped ones [0, n_max],
above 0 only under ``respend`` and only once every other prompt is at n_max). Differences
from the released code, on purpose: (a) its step 1 could leave a prompt below n_min when
exploration used the whole budget — here n_min is reserved for everyone first; (b) unexplored
prompts take no part in step 3 (the reference gave them a stale per-epoch rank instead).

The parameters (n_min, n_max, initial_budget, ...) come as one
:class:`~dynamo_rl.contracts.allocator.AllocationParams`, the model the config's ``allocator``
section and the server's request validation share; it is valid by construction (n_min ≤ n_max,
hopeless_n ≤ n_min, known priority and scheme), so only the statistics and the budget are checked
here.

Everything is vectorised numpy: no Python loop over prompts. ``tests/allocator`` keeps a plain loop
twin of every step (``test_algorithm.py``; knapsack's in ``test_methods.py``) and compares the two
on random inputs; ``test_methods.py`` checks every method's budget and bounds property-based.
"""

from __future__ import annotations

from bisect import bisect_left, bisect_right
from collections.abc import Callable
from dataclasses import dataclass

import numpy as np
import numpy.typing as npt

from dynamo_rl.contracts.allocator import AllocationParams

__all__ = [
    "DEFAULTS",
    "METHODS",
    "UNEXPLORED",
    "Allocation",
    "Batch",
    "GradStats",
    "Method",
    "allocate_rollouts",
    "compute_priorities",
    "freshness",
    "grad_weights",
    "method",
    "skip_probability",
]

UNEXPLORED = -1.0
"""Priority reported for a prompt that is still explored."""

DEFAULTS = AllocationParams()
"""The parameters' defaults (those of the config's ``allocator`` section)."""


def compute_priorities(
    sample_counts: npt.ArrayLike,
    success_counts: npt.ArrayLike,
    params: AllocationParams = DEFAULTS,
) -> npt.NDArray[np.float64]:
    """Priority per prompt; ``UNEXPLORED`` (−1) where G < initial_budget.

    Uses ``initial_budget``, ``mastery_threshold``, ``min_priority`` and ``priority`` of
    ``params``."""
    return _priorities(sample_counts, success_counts, params, params.initial_budget)


def _priorities(
    sample_counts: npt.ArrayLike,
    success_counts: npt.ArrayLike,
    params: AllocationParams,
    initial_budget: int,
) -> npt.NDArray[np.float64]:
    min_priority = params.min_priority
    g = np.asarray(sample_counts, dtype=np.float64)
    k = np.asarray(success_counts, dtype=np.float64)
    # In-place arithmetic: at 100k prompts the temporaries, not the flops, are the cost.
    den = g - 1.0
    den *= g  # G(G−1); zero or negative only for G ≤ 1, where the variance is taken as 0
    p = g - k
    p *= k
    np.divide(p, den, out=p, where=den > 0)
    p[den <= 0] = 0.0
    np.maximum(p, min_priority, out=p)
    acc = np.divide(k, g, out=den, where=g > 0)  # den is free again
    acc[g <= 0] = 0.0
    p[acc >= params.mastery_threshold] = min_priority
    if params.priority == "std":
        np.sqrt(p, out=p)
    p[g < initial_budget] = UNEXPLORED
    return p


@dataclass(frozen=True)
class GradStats:
    """What the learner measured per prompt (``dynamo_rl.contracts.gradstats``), in batch order.

    ``spread``: the prompt's gradient spread at its last visit, NaN where never measured;
    ``age``: weight versions since that visit (0: measured at the current weights);
    ``streak``: visits in a row, up to that one, whose group had zero advantage.
    """

    spread: npt.NDArray[np.float64]
    age: npt.NDArray[np.float64]
    streak: npt.NDArray[np.float64]

    @staticmethod
    def unmeasured(n: int) -> GradStats:
        return GradStats(np.full(n, np.nan), np.zeros(n), np.zeros(n))


def freshness(age: npt.ArrayLike, half_life: float) -> npt.NDArray[np.float64]:
    """How much a statistic measured ``age`` weight versions ago still counts: 0.5^(age/half_life)
    (1 when fresh, ½ after ``half_life`` versions)."""
    return np.exp2(-np.maximum(np.asarray(age, dtype=np.float64), 0.0) / half_life)


def grad_weights(
    sigma: npt.NDArray[np.float64], grad: GradStats, half_life: float
) -> npt.NDArray[np.float64]:
    """The ``grad`` method's weight per prompt: its measured spread blended with the σ fallback by
    freshness, α·spread + (1 − α)·c·σ, α = :func:`freshness` (0 where never measured); weights
    below 1e-9 of the largest count as 0.

    c = Σ α_i·spread_i / Σ α_i·σ_i over the measured prompts puts σ in the spread's units (1 when
    none is measured), so a never-measured prompt ranks among the measured ones as its σ does."""
    measured = ~np.isnan(grad.spread)
    alpha = np.where(measured, freshness(grad.age, half_life), 0.0)
    spread = np.where(measured, grad.spread, 0.0)
    den = float((alpha * sigma).sum())
    scale = float((alpha * spread).sum()) / den if den > 0 else 1.0
    w = alpha * spread + (1.0 - alpha) * scale * sigma
    # Below 1e-9 of the largest is no signal: such weights would only stretch the water level's
    # search over hundreds of orders of magnitude.
    w[w < 1e-9 * (float(w.max()) if w.size else 0.0)] = 0.0
    return w


def skip_probability(
    grad: GradStats, skip_after: int, skip_max: float, half_life: float
) -> npt.NDArray[np.float64]:
    """The skip rule: a prompt whose last s ≥ ``skip_after`` visits gave zero advantage is skipped
    with probability min(skip_max, 1 − 2^−(s − skip_after + 1)) (½, ¾, ... capped) times the
    streak's :func:`freshness`; so it is re-checked with probability ≥ 1 − skip_max every time,
    and more often as its verdict ages. 0 everywhere when ``skip_after`` is 0 (off)."""
    if skip_after <= 0:
        return np.zeros(grad.streak.shape)
    over = grad.streak - skip_after + 1.0
    p = np.where(over > 0, np.minimum(skip_max, 1.0 - np.exp2(-np.maximum(over, 0.0))), 0.0)
    return p * freshness(grad.age, half_life)


@dataclass(frozen=True)
class Allocation:
    """What :func:`allocate_rollouts` returns, whatever the method."""

    counts: npt.NDArray[np.int64]
    """Responses per prompt, in batch order."""
    weights: npt.NDArray[np.float64]
    """The step-3 weight per prompt, ``UNEXPLORED`` (−1) for prompts still explored: the
    priority (dra), the blended spread (grad) or p(1−p)² (knapsack)."""


@dataclass(frozen=True)
class Batch:
    """One batch as every method sees it (validated by :func:`allocate_rollouts`)."""

    g: npt.NDArray[np.float64]
    """Samples per prompt (G)."""
    k: npt.NDArray[np.float64]
    """Successes per prompt (k)."""
    params: AllocationParams
    grad: GradStats
    initial_budget: int
    """``max(n_min, params.initial_budget)``: below it a prompt is still explored."""
    priority: npt.NDArray[np.float64]
    """dra's priority per prompt (:func:`compute_priorities`), ``UNEXPLORED`` where explored."""

    @property
    def rate(self) -> npt.NDArray[np.float64]:
        """Success rate k/G (0 where G is 0)."""
        return np.divide(self.k, self.g, out=np.zeros(self.g.size), where=self.g > 0)


@dataclass(frozen=True)
class Method:
    """An allocation method: what changes from one to another is step 3 alone.

    ``weights(batch)`` gives every prompt its step-3 weight (``UNEXPLORED`` exactly where
    ``batch.priority`` is, or nowhere for a method without exploration: uniform); ``share(batch, eligible, spare)`` hands ``spare`` responses (at most
    n_max − n_min each) to the ``eligible`` prompts — done exploring, weight > 0, all at n_min —
    and returns what each of them gets, in the order of ``eligible``'s true entries."""

    weights: Callable[[Batch], npt.NDArray[np.float64]]
    share: Callable[
        [Batch, npt.NDArray[np.float64], npt.NDArray[np.bool_], int], npt.NDArray[np.int64]
    ]


def _dra_weights(b: Batch) -> npt.NDArray[np.float64]:
    return b.priority


def _grad_weights(b: Batch) -> npt.NDArray[np.float64]:
    std = b.params.model_copy(update={"priority": "std"})
    sigma = _priorities(b.g, b.k, std, b.initial_budget)
    w = grad_weights(sigma, b.grad, b.params.grad_half_life)
    return np.where(b.priority == UNEXPLORED, UNEXPLORED, w)


def _knapsack_weights(b: Batch) -> npt.NDArray[np.float64]:
    rate = b.rate
    return np.where(b.priority == UNEXPLORED, UNEXPLORED, rate * np.square(1.0 - rate))


def _uniform_weights(b: Batch) -> npt.NDArray[np.float64]:
    return np.ones(b.g.size)


def _dra_share(b: Batch, w, eligible, spare: int) -> npt.NDArray[np.int64]:
    """x_i = clip(λ·p_i − a, 0, room): a = 0 for the reference scheme (a share proportional to
    priority above n_min), a = n_min for water-level (n = clip(λ·p, n_min, n_max))."""
    n_min = b.params.n_min
    shift = 0.0 if b.params.scheme == "reference" else float(n_min)
    return _water_fill(w, shift, b.params.n_max - n_min, spare)


def _grad_share(b: Batch, w, eligible, spare: int) -> npt.NDArray[np.int64]:
    """Water-level on the blended spreads, whatever the scheme."""
    n_min = b.params.n_min
    return _water_fill(w, float(n_min), b.params.n_max - n_min, spare)


def _knapsack_share(b: Batch, w, eligible, spare: int) -> npt.NDArray[np.int64]:
    n_min = b.params.n_min
    return _knapsack(w, b.rate[eligible], n_min, b.params.n_max - n_min, spare)


def _uniform_share(b: Batch, w, eligible, spare: int) -> npt.NDArray[np.int64]:
    """One more each, lowest index first, round and round (an even split)."""
    return _round_robin(np.full(w.size, b.params.n_max - b.params.n_min), spare)


METHODS: dict[str, Method] = {
    "dra": Method(_dra_weights, _dra_share),
    "grad": Method(_grad_weights, _grad_share),
    "knapsack": Method(_knapsack_weights, _knapsack_share),
    "uniform": Method(_uniform_weights, _uniform_share),
}
"""``params.method`` → its :class:`Method`; the names are those of
:data:`dynamo_rl.contracts.allocator.METHODS` (a test keeps the two equal)."""


def method(name: str) -> Method:
    """The registered method ``name``; a ``ValueError`` naming the allowed ones otherwise."""
    try:
        return METHODS[name]
    except KeyError:
        raise ValueError(f"allocator.method: {name!r} is not one of {', '.join(METHODS)}") from None


def allocate_rollouts(
    sample_counts: npt.ArrayLike,
    success_counts: npt.ArrayLike,
    budget: int,
    params: AllocationParams = DEFAULTS,
    *,
    grad: GradStats | None = None,
    skip_draws: npt.ArrayLike | None = None,
) -> Allocation:
    """Responses per prompt (``.counts``, int64[N]) summing to the budget clipped to
    [N·n_min, N·n_max] (less the skipped prompts' share under ``skip_budget="save"``), and the
    step-3 weights behind them (``.weights``).

    ``sample_counts`` (G) and ``success_counts`` (k) may be floats (statistics with decay).
    ``params`` are validated already (n_min ≤ n_max, hopeless_n ≤ n_min, ...): the model
    guarantees it; ``params.method`` picks the :class:`Method` from :data:`METHODS`. ``grad``: the
    learner's statistics (method grad and the skip rule; missing: none measured). ``skip_draws``:
    one uniform [0, 1) number per prompt for the skip rule (a prompt is skipped where it is below
    :func:`skip_probability`); without them nothing is skipped.
    """
    chosen = method(params.method)
    g = np.asarray(sample_counts, dtype=np.float64).reshape(-1)
    k = np.asarray(success_counts, dtype=np.float64).reshape(-1)
    if g.shape != k.shape:
        raise ValueError(f"sample_counts has {g.size} entries but success_counts has {k.size}")
    if budget < 0:
        raise ValueError(f"budget must be >= 0, got {budget}")
    if g.size and (k.min() < 0 or not np.all(k <= g)):  # also catches g < 0 (and NaN)
        raise ValueError("need 0 <= success_counts <= sample_counts for every prompt")
    n_min, n_max = params.n_min, params.n_max
    hopeless_after, hopeless_n = params.hopeless_after, params.hopeless_n
    initial_budget = max(n_min, params.initial_budget)
    n = g.size
    if grad is None:
        grad = GradStats.unmeasured(n)
    elif not grad.spread.shape == grad.age.shape == grad.streak.shape == (n,):
        raise ValueError(f"grad statistics must have one entry per prompt ({n})")
    batch = Batch(g, k, params, grad, initial_budget, _priorities(g, k, params, initial_budget))
    p = chosen.weights(batch)
    counts = np.full(n, n_min, dtype=np.int64)
    total = int(np.clip(budget, n * n_min, n * n_max))
    skipped = np.zeros(n, dtype=bool)
    if skip_draws is not None and params.skip_after > 0:
        draws = np.asarray(skip_draws, dtype=np.float64).reshape(-1)
        if draws.shape != (n,):
            raise ValueError(f"skip_draws has {draws.size} entries for {n} prompts")
        half = params.grad_half_life
        skipped = draws < skip_probability(grad, params.skip_after, params.skip_max, half)
    # Out of the batch (skip_budget save): 0 responses, no share of the budget, no round-robin.
    out = skipped if params.skip_budget == "save" else np.zeros(n, dtype=bool)
    kept = n - int(out.sum())
    if kept < n:
        total = total * kept // n  # the skipped prompts' share is not spent
    counts[out] = 0
    spare = total - kept * n_min  # what is left once everyone has n_min (step 2 done up front)
    # Demoted prompts (hopeless, skipped under respend) start below n_min, take no part in steps
    # 1 and 3 and get more only once every other prompt is at n_max.
    demoted = np.zeros(n, dtype=bool)
    if hopeless_after > 0:
        hopeless = (p != UNEXPLORED) & (g >= hopeless_after) & (k < 0.5) & ~out
        counts[hopeless] = hopeless_n
        demoted |= hopeless
    if params.skip_budget == "respend":
        counts[skipped] = 0
        demoted |= skipped
    spare += int(n_min * demoted.sum() - counts[demoted].sum())
    demoted |= out

    # Step 1: exploration above n_min, scaled down if the spare budget is short. Computed on the
    # prompts being explored only (usually few once training runs).
    fresh = np.flatnonzero((p == UNEXPLORED) & ~demoted)
    if fresh.size:
        need = np.minimum(np.maximum(initial_budget - g[fresh], 0.0), n_max)
        extra = np.maximum(np.ceil(need) - n_min, 0.0)
        extra_sum = float(extra.sum())
        if 0 < extra_sum <= spare:
            counts[fresh] += extra.astype(np.int64)
            spare -= int(extra_sum)
        elif extra_sum > spare:
            counts[fresh] += _round_shares(extra * (spare / extra_sum), spare, extra)
            spare = 0

    # Step 3: the rest by the method's weights. Eligible prompts are done exploring, so step 1
    # gave them nothing and they all sit at n_min with the same room (n_max − n_min).
    if spare > 0:
        eligible = (p > 0) & ~demoted  # UNEXPLORED is negative
        if n_max > n_min and eligible.any():
            add = chosen.share(batch, p[eligible], eligible, spare)
            counts[eligible] += add
            spare -= int(add.sum())
        if spare > 0 and demoted.any():  # round-robin over the others first
            add = _round_robin(np.where(demoted, 0, n_max - counts), spare)
            counts += add
            spare -= int(add.sum())
        if spare > 0:  # nothing (more) follows a priority: round-robin, lowest index first
            counts += _round_robin(np.where(out, 0, n_max - counts), spare)
    return Allocation(counts, p)


def _water_fill(w: npt.NDArray[np.float64], shift: float, room: int, spare: int):
    """x_i = clip(λ·w_i − shift, 0, room) summing to at most ``spare``, rounded to integers."""
    if w.size * room <= spare:
        share = np.full(w.size, float(room))
    else:
        lam = _clip_level(w, shift, room, spare)
        share = np.clip(lam * w - shift, 0.0, room)
    return _round_shares(share, min(spare, round(float(share.sum()))), float(room))


def _knapsack(
    value: npt.NDArray[np.float64], rate: npt.NDArray[np.float64], n_min: int, room: int, spare: int
) -> npt.NDArray[np.int64]:
    """Knapsack RL's allocation: ``spare`` more responses over prompts at n_min, at most ``room``
    each, maximising Σ value_i·(1 − p_i^n − (1 − p_i)^n) (the chance of a non-zero GRPO gradient
    times the prompt's value). One more response for a prompt at n gains
    value·(p^n·(1 − p) + (1 − p)^n·p), which falls with n: the best allocation takes the
    ``spare`` largest gains over all (prompt, n), ties to the lower index. Only gains > 0 count.
    """
    steps = n_min + np.arange(room, dtype=np.float64)  # n before each added response
    r = rate[:, None]
    gain = value[:, None] * (r**steps * (1.0 - r) + (1.0 - r) ** steps * r)  # [prompts, room]
    flat = gain.reshape(-1)
    take = min(spare, int((flat > 0).sum()))
    if take <= 0:
        return np.zeros(value.size, dtype=np.int64)
    # Within a prompt the gains fall with n, so the chosen ones are a prefix of its row.
    chosen = _top_indices(flat, take)
    return np.bincount(chosen // room, minlength=value.size).astype(np.int64)


def _clip_level(w: npt.NDArray[np.float64], shift: float, room: float, amount: float) -> float:
    """λ ≥ 0 with Σ clip(λ·w_i − shift, 0, room) = amount, for w > 0 and amount < N·room.

    The sum is piecewise linear and nondecreasing in λ: prompt i rises from 0 at λ = shift/w_i and
    is capped from λ = (shift + room)/w_i. With w sorted, which prompts are rising or capped at a
    given λ is two binary searches, and the sum follows from prefix sums in O(log N). Bisection
    stops as soon as both ends of its bracket lie on the same linear piece (no breakpoint in
    between); one linear solve on that piece gives λ exactly.
    """
    ws = np.sort(w)
    prefix = np.concatenate(([0.0], np.cumsum(ws)))
    n = ws.size
    top = shift + room
    # Small batches (the service's usual case) bisect a Python list: no numpy call per step;
    # large ones would pay more for the list than they save.
    ws_list = ws.tolist() if n <= 4096 else None

    def piece(lam: float) -> tuple[int, int]:
        """(first rising, first capped) index into the sorted weights at λ > 0."""
        if ws_list is not None:
            return bisect_right(ws_list, shift / lam), bisect_left(ws_list, top / lam)
        return (
            int(np.searchsorted(ws, shift / lam, side="right")),
            int(np.searchsorted(ws, top / lam, side="left")),
        )

    def total(lam: float, first_rising: int, first_capped: int) -> float:
        rise_w = float(prefix[first_capped] - prefix[first_rising])
        return (n - first_capped) * room + lam * rise_w - shift * (first_capped - first_rising)

    lo, hi = 0.0, top / float(ws[0])  # at hi every prompt is capped
    at_lo = (0 if shift == 0 else n, n)  # just above λ = 0: nothing capped
    at_hi = piece(hi)
    for _ in range(200):
        if at_lo == at_hi:
            break
        mid = 0.5 * (lo + hi)
        if not lo < mid < hi:
            break
        at_mid = piece(mid)
        if total(mid, *at_mid) < amount:
            lo, at_lo = mid, at_mid
        else:
            hi, at_hi = mid, at_mid
    first_rising, first_capped = at_hi
    rise_w = float(prefix[first_capped] - prefix[first_rising])
    if rise_w <= 0.0:
        return hi
    rising = first_capped - first_rising
    return (amount - (n - first_capped) * room + shift * rising) / rise_w


def _round_robin(room: npt.NDArray[np.int64], amount: int) -> npt.NDArray[np.int64]:
    """One more each, lowest index first, cycling over the prompts with room left (the
    reference's round-robin), in O(N): full rounds from a histogram of the integer room."""
    room = np.maximum(room, 0)
    if amount >= int(room.sum()):
        return room.copy()
    at_least = np.cumsum(np.bincount(room)[::-1])[::-1]  # at_least[L] = #{room_i >= L}
    filled = np.concatenate(([0], np.cumsum(at_least[1:])))  # filled[L] = Σ min(room_i, L)
    level = int(np.searchsorted(filled, amount, side="right")) - 1
    add = np.minimum(room, level)
    left = amount - int(add.sum())
    if left > 0:
        add[np.flatnonzero(room > level)[:left]] += 1
    return add


def _round_shares(
    share: npt.NDArray[np.float64], total: int, cap: npt.NDArray[np.float64]
) -> npt.NDArray[np.int64]:
    """Integers summing to ``total``: floors plus one for the largest remainders, within ``cap``."""
    # A hair of tolerance so 4.9999999999 (float error) counts as 5, not 4 + remainder.
    base = share + 1e-9
    np.floor(base, out=base)
    np.minimum(base, np.floor(cap), out=base)
    out = base.astype(np.int64)
    left = total - int(out.sum())
    if left > 0:
        frac = share - base
        frac[out >= np.floor(cap)] = -np.inf
        out[_top_indices(frac, left)] += 1
    elif left < 0:  # float error the other way: take back from the smallest remainders
        frac = base - share
        frac[out <= 0] = -np.inf
        out[_top_indices(frac, -left)] -= 1
    return out


def _top_indices(key: npt.NDArray[np.float64], m: int) -> npt.NDArray[np.intp]:
    """Indices of the ``m`` largest keys, equal keys taken lowest index first; O(N)."""
    if m >= key.size:
        return np.flatnonzero(key > -np.inf)
    threshold = np.partition(key, key.size - m)[key.size - m]
    above = np.flatnonzero(key > threshold)
    tied = np.flatnonzero(key == threshold)[: m - above.size]
    return np.concatenate([above, tied])
