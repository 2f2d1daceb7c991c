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

The result sums to exactly the clipped budget and every count lies in [n_min, n_max] (hopeless
prompts: [hopeless_n, n_max]). Differences
from the released code, on purpose: (a) its step 1 could leave a prompt below n_min when
exploration used the whole budget — here n_min is reserved for everyone first; (b) unexplored
prompts take no part in step 3 (the reference gave them a stale per-epoch rank instead).

The parameters (n_min, n_max, initial_budget, ...) come as one
:class:`~dynamo_rl.contracts.allocator.AllocationParams`, the model the config's ``allocator``
section and the server's request validation share; it is valid by construction (n_min ≤ n_max,
hopeless_n ≤ n_min, known priority and scheme), so only the statistics and the budget are checked
here.

Everything is vectorised numpy: no Python loop over prompts. ``tests/allocator`` keeps a plain loop
twin of every step and compares the two on random inputs.
"""

from __future__ import annotations

from bisect import bisect_left, bisect_right

import numpy as np
import numpy.typing as npt

from dynamo_rl.contracts.allocator import AllocationParams

__all__ = ["DEFAULTS", "UNEXPLORED", "allocate_rollouts", "compute_priorities"]

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


def allocate_rollouts(
    sample_counts: npt.ArrayLike,
    success_counts: npt.ArrayLike,
    budget: int,
    params: AllocationParams = DEFAULTS,
    *,
    return_priorities: bool = False,
) -> npt.NDArray[np.int64] | tuple[npt.NDArray[np.int64], npt.NDArray[np.float64]]:
    """Responses per prompt (int64[N]) summing to the budget clipped to [N·n_min, N·n_max].

    ``sample_counts`` (G) and ``success_counts`` (k) may be floats (statistics with decay).
    ``params`` are validated already (n_min ≤ n_max, hopeless_n ≤ n_min, ...): the model
    guarantees it. With ``return_priorities`` the priorities (−1 for prompts still explored) come
    back too.
    """
    g = np.asarray(sample_counts, dtype=np.float64).reshape(-1)
    k = np.asarray(success_counts, dtype=np.float64).reshape(-1)
    if g.shape != k.shape:
        raise ValueError(f"sample_counts has {g.size} entries but success_counts has {k.size}")
    if budget < 0:
        raise ValueError(f"budget must be >= 0, got {budget}")
    if g.size and (k.min() < 0 or not np.all(k <= g)):  # also catches g < 0 (and NaN)
        raise ValueError("need 0 <= success_counts <= sample_counts for every prompt")
    n_min, n_max, scheme = params.n_min, params.n_max, params.scheme
    hopeless_after, hopeless_n = params.hopeless_after, params.hopeless_n
    initial_budget = max(n_min, params.initial_budget)
    n = g.size
    p = _priorities(g, k, params, initial_budget)
    counts = np.full(n, n_min, dtype=np.int64)
    total = int(np.clip(budget, n * n_min, n * n_max))
    spare = total - n * n_min  # what is left once everyone has n_min (step 2 done up front)
    hopeless = None
    if hopeless_after > 0:
        hopeless = (p != UNEXPLORED) & (g >= hopeless_after) & (k < 0.5)
        if hopeless.any():
            counts[hopeless] = hopeless_n
            spare += int(hopeless.sum()) * (n_min - hopeless_n)
        else:
            hopeless = None

    # Step 1: exploration above n_min, scaled down if the spare budget is short. Computed on the
    # prompts being explored only (usually few once training runs).
    fresh = np.flatnonzero(p == UNEXPLORED)
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

    # Step 3: the rest by priority. Eligible prompts are done exploring, so step 1 gave them nothing
    # and they all sit at n_min with the same room (n_max − n_min): both schemes are then
    # x_i = clip(λ·p_i − a, 0, room), with a = 0 (reference) or a = n_min (water-level).
    if spare > 0:
        eligible = p > 0  # UNEXPLORED is negative
        if hopeless is not None:
            eligible &= ~hopeless
        room = n_max - n_min
        if room > 0 and eligible.any():
            w = p[eligible]
            shift = 0.0 if scheme == "reference" else float(n_min)
            if w.size * room <= spare:
                share = np.full(w.size, float(room))
            else:
                lam = _clip_level(w, shift, room, spare)
                share = np.clip(lam * w - shift, 0.0, room)
            add = _round_shares(share, min(spare, round(float(share.sum()))), float(room))
            counts[eligible] += add
            spare -= int(add.sum())
        if spare > 0 and hopeless is not None:  # round-robin over the others first
            add = _round_robin(np.where(hopeless, 0, n_max - counts), spare)
            counts += add
            spare -= int(add.sum())
        if spare > 0:  # nothing (more) follows a priority: round-robin, lowest index first
            counts += _round_robin(n_max - counts, spare)
    if return_priorities:
        return counts, p
    return counts


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
