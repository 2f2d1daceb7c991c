"""The engine/learner mismatch of a step: per-token figures that add up over micro-batches and
ranks, and the step record's view of them.

Beside the loss, every step measures how far the engine's sampling log-probs are from the
learner's old pass: the k3 estimate of KL(π_engine ‖ π_learner) per token and per sequence, the
mean absolute log-prob gap, the IS weights the objective applies (mean, share dropped by a masked
mode, and their quantiles), and the KL by weight-version lag. :func:`mismatch_sums` gives one
micro-batch's sums and a fixed-size sketch of its IS weights; sums and sketches add up across
micro-batches and ranks (one ``all_reduce`` of 64 KB per step whatever the token count), and
:func:`mismatch_record` turns the totals into the step record's ``mismatch_*`` and
``is_weight_*`` fields. Nothing here changes the loss.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

import torch

from learner import algorithms as A

IS_QUANTILES = (0.01, 0.1, 0.5, 0.9, 0.99)
"""The IS-weight quantiles of every step record (``is_weight_p1`` … ``is_weight_p99``)."""

SKETCH_STEP = 0.005
"""Width of a weight-sketch bin in log space: a quantile is off by at most ``exp(0.0025) − 1``
(0.25%) of its value."""
SKETCH_LOG_MAX = 20.0
"""Weights beyond ``exp(±20)`` count in the sketch's end bins."""
_HALF = round(SKETCH_LOG_MAX / SKETCH_STEP)
SKETCH_SIZE = 2 * _HALF + 2
"""Bins of a weight sketch: bin 0 holds the zeros (a masked mode's dropped tokens), bin
``1 + _HALF + k`` the weights whose log rounds to ``k · SKETCH_STEP``."""


def weight_sketch(weights: torch.Tensor) -> torch.Tensor:
    """A fixed-size histogram (``SKETCH_SIZE`` int64 counts) of non-negative IS weights: sketches
    add up over micro-batches and ranks (one ``all_reduce`` of 64 KB per step, whatever the
    token count), and :func:`sketch_quantiles` reads quantiles from the sum."""
    w = weights.detach().double().flatten().cpu()
    positive = w > 0
    k = (w[positive].log() / SKETCH_STEP).round().clamp(-_HALF, _HALF).long()
    counts = torch.bincount(k + 1 + _HALF, minlength=SKETCH_SIZE)
    counts[0] += int((~positive).sum())
    return counts


def sketch_quantiles(counts: torch.Tensor) -> dict[str, float]:
    """``is_weight_p1`` … ``is_weight_p99`` of a (summed) :func:`weight_sketch`, interpolated
    linearly between neighbouring ranks as ``torch.quantile`` does; each rank's value is its bin's
    centre (0 for the zero bin). Empty sketch: no keys."""
    n = int(counts.sum())
    if n == 0:
        return {}
    cumulative = counts.cumsum(0)
    centres = ((torch.arange(SKETCH_SIZE, dtype=torch.float64) - 1 - _HALF) * SKETCH_STEP).exp()
    centres[0] = 0.0

    def at(rank: int) -> float:  # the value of the rank-th smallest weight (0-based)
        return float(centres[int(torch.searchsorted(cumulative, rank, right=True))])

    out = {}
    for q in IS_QUANTILES:
        pos = q * (n - 1)
        lo = int(pos)
        v_lo, v_hi = at(lo), at(min(lo + 1, n - 1))
        out[f"is_weight_p{round(q * 100)}"] = v_lo + (v_hi - v_lo) * (pos - lo)
    return out


def mismatch_sums(
    old_logp: torch.Tensor,
    sampling_logp: torch.Tensor,
    mask: torch.Tensor,
    correction: A.ISWeights | None,
    lags: Sequence[int],
) -> tuple[dict[str, float], torch.Tensor]:
    """One micro-batch's engine/learner mismatch as sums that add up over micro-batches and ranks
    (:func:`mismatch_record` turns the totals into the step's figures), and the
    :func:`weight_sketch` of its valid tokens' IS weights (1 when the correction is off: the
    weight the objective applies).

    The KL is ``KL(π_engine ‖ π_learner)`` estimated per token from the engine's samples with
    k3: ``r − 1 − log r``, ``r = exp(old − sampling)`` (:func:`learner.algorithms.kl_penalty`).
    ``lags[i]`` is row ``i``'s weight-version lag (its sample's staleness).
    """
    valid = mask.bool()
    kl = torch.where(valid, A.kl_penalty(sampling_logp, old_logp, "k3"), 0.0)
    row_tokens = valid.sum(-1)
    row_kl = kl.sum(-1)
    has = row_tokens > 0
    diff = torch.where(valid, old_logp.float() - sampling_logp.float(), 0.0)
    if correction is None:
        weights, dropped = torch.ones_like(diff), torch.zeros_like(valid)
    else:
        weights, dropped = correction
    sums = {
        "tokens": float(row_tokens.sum()),
        "seqs": float(has.sum()),
        "mismatch_abs": float(diff.abs().sum()),
        "mismatch_kl": float(row_kl.sum()),
        "mismatch_kl_seq": float((row_kl / row_tokens.clamp(min=1))[has].sum()),
        "is_weight": float(torch.where(valid, weights, 0.0).sum()),
        "is_dropped": float(dropped.sum()),
    }
    for lag, n, k in zip(lags, row_tokens.tolist(), row_kl.tolist(), strict=True):
        sums[f"lag{lag}:kl"] = sums.get(f"lag{lag}:kl", 0.0) + k
        sums[f"lag{lag}:tokens"] = sums.get(f"lag{lag}:tokens", 0.0) + n
    return sums, weight_sketch(weights[valid])


def mismatch_record(totals: Mapping[str, float], sketch: torch.Tensor) -> dict[str, float]:
    """The step record's mismatch figures from the summed :func:`mismatch_sums` and the summed
    sketch of the tokens' IS weights: ``mismatch_kl_token_mean`` (k3 averaged over tokens),
    ``mismatch_kl_seq_mean`` (averaged within each sequence, then over sequences),
    ``mismatch_abs_mean``, ``is_weight_mean``, ``is_weight_p1`` … ``is_weight_p99`` (over tokens,
    within the sketch's 0.25%), ``is_masked_share`` (the share of tokens a masked mode dropped)
    and ``mismatch_kl_lag<k>`` (k3 over the tokens of samples ``k`` weight versions behind, one
    key per lag present)."""
    tokens = max(totals.get("tokens", 0.0), 1.0)
    out = {
        "mismatch_kl_token_mean": totals.get("mismatch_kl", 0.0) / tokens,
        "mismatch_kl_seq_mean": totals.get("mismatch_kl_seq", 0.0)
        / max(totals.get("seqs", 0.0), 1.0),
        "mismatch_abs_mean": totals.get("mismatch_abs", 0.0) / tokens,
        "is_weight_mean": totals.get("is_weight", 0.0) / tokens,
        "is_masked_share": totals.get("is_dropped", 0.0) / tokens,
        **sketch_quantiles(sketch),
    }
    for key, kl in totals.items():
        if key.startswith("lag") and key.endswith(":kl"):
            lag = key[3:-3]
            out[f"mismatch_kl_lag{lag}"] = kl / max(totals[f"lag{lag}:tokens"], 1.0)
    return out
