"""The engine/learner mismatch figures of a step record (``learner.mismatch.mismatch_sums`` over
micro-batches, then ``mismatch_record``) against a loop twin over the whole batch, and their way
into the learner's Prometheus metrics."""

from __future__ import annotations

import math

import torch

from dynamo_rl.config.learner import AlgorithmConfig
from learner.metrics import LearnerMetrics
from learner.mismatch import (
    IS_QUANTILES,
    SKETCH_SIZE,
    mismatch_record,
    mismatch_sums,
    sketch_quantiles,
    weight_sketch,
)
from learner.objective import importance_weights

SKETCH_REL = math.exp(0.0025) - 1  # a sketch quantile's largest relative error


def rows(seed: int) -> list[tuple[list[float], list[float], int]]:
    """(old log-probs, sampling log-probs, weight-version lag) per sample, lengths 1..7."""
    gen = torch.Generator().manual_seed(seed)
    out = []
    for i, n in enumerate([7, 3, 1, 5, 6, 2]):
        old = (-torch.rand(n, generator=gen) * 2).tolist()
        shift = 0.7 if i == 3 else 0.0  # one row far off: the masked mode drops it
        noise = (torch.randn(n, generator=gen) * 0.3).tolist()
        samp = [o + e + shift for o, e in zip(old, noise, strict=True)]
        out.append((old, samp, i % 3))
    return out


def micro_batch(part: list[tuple[list[float], list[float], int]]):
    t = max(len(o) for o, _, _ in part)
    old, samp, mask = (
        torch.zeros(len(part), t),
        torch.full((len(part), t), 7.0),
        torch.zeros(len(part), t),
    )
    for i, (o, s, _) in enumerate(part):
        old[i, : len(o)], samp[i, : len(s)], mask[i, : len(o)] = torch.tensor(o), torch.tensor(s), 1
    return old, samp, mask, [lag for _, _, lag in part]


def loop_record(data, algo: AlgorithmConfig) -> dict[str, float]:
    """The figures over all tokens, one at a time."""
    kls, seq_kls, weights, dropped, by_lag = [], [], [], 0, {}
    for old, samp, lag in data:
        row = [math.exp(o - s) - 1 - (o - s) for o, s in zip(old, samp, strict=True)]
        kls += row
        seq_kls.append(sum(row) / len(row))
        by_lag.setdefault(lag, []).extend(row)
        seq_ratio = math.exp(sum(o - s for o, s in zip(old, samp, strict=True)))
        inside = 1 / algo.is_cap <= seq_ratio <= algo.is_cap
        weights += [seq_ratio if inside else 0.0] * len(row)
        dropped += 0 if inside else len(row)
    ordered = sorted(weights)

    def quantile(q: float) -> float:  # linear interpolation, as torch.quantile
        pos = q * (len(ordered) - 1)
        lo = math.floor(pos)
        hi = min(lo + 1, len(ordered) - 1)
        return ordered[lo] + (ordered[hi] - ordered[lo]) * (pos - lo)

    diffs = [abs(o - s) for old, samp, _ in data for o, s in zip(old, samp, strict=True)]
    return {
        "mismatch_kl_token_mean": sum(kls) / len(kls),
        "mismatch_kl_seq_mean": sum(seq_kls) / len(seq_kls),
        "mismatch_abs_mean": sum(diffs) / len(diffs),
        "is_weight_mean": sum(weights) / len(weights),
        "is_masked_share": dropped / len(weights),
        **{f"is_weight_p{round(q * 100)}": quantile(q) for q in (0.01, 0.1, 0.5, 0.9, 0.99)},
        **{f"mismatch_kl_lag{k}": sum(v) / len(v) for k, v in by_lag.items()},
    }


def test_the_step_figures_equal_their_loop_twin_over_micro_batches() -> None:
    data = rows(0)
    algo = AlgorithmConfig(is_cap=2.0, is_mode="sequence-mask")
    totals: dict[str, float] = {}
    sketch = weight_sketch(torch.zeros(0))
    for part in (data[:2], data[2:5], data[5:]):  # three micro-batches of different widths
        old, samp, mask, lags = micro_batch(part)
        sums, w = mismatch_sums(old, samp, mask, importance_weights(algo, old, samp, mask), lags)
        for k, v in sums.items():
            totals[k] = totals.get(k, 0.0) + v
        sketch += w
    got = mismatch_record(totals, sketch)
    want = loop_record(data, algo)
    assert want["is_masked_share"] > 0 and set(got) == set(want)
    for key, value in want.items():
        rel = SKETCH_REL if key.startswith("is_weight_p") else 1e-5
        assert math.isclose(got[key], value, rel_tol=rel, abs_tol=1e-6), (key, got[key], value)


def test_the_weight_sketch_is_fixed_size_adds_up_and_keeps_quantiles_within_its_bound() -> None:
    """What ranks all-reduce: 64 KB whatever the token count; the sum of the parts' sketches is
    the whole's; its quantiles are torch.quantile's within 0.25%, zeros (dropped tokens) and
    weights far outside the bins' range included."""
    gen = torch.Generator().manual_seed(0)
    w = (torch.randn(20_000, generator=gen, dtype=torch.float64) * 0.8).exp()
    w[::7] = 0.0  # a masked mode's dropped tokens
    w[:3] = torch.tensor([1e-12, 1e12, 1.0])
    whole = weight_sketch(w)
    assert whole.shape == weight_sketch(w[:5]).shape == (SKETCH_SIZE,)
    assert SKETCH_SIZE * 8 <= 65 * 1024
    assert torch.equal(weight_sketch(w[:1234]) + weight_sketch(w[1234:]), whole)
    assert int(whole.sum()) == w.numel() and int(whole[0]) == int((w == 0).sum())
    got = sketch_quantiles(whole)
    for q in IS_QUANTILES:
        want = float(torch.quantile(w, q))
        assert math.isclose(got[f"is_weight_p{round(q * 100)}"], want, rel_tol=SKETCH_REL), q
    few = torch.tensor([0.5, 2.0, 8.0])  # sparse: the interpolation between ranks matters
    for q in IS_QUANTILES:
        want = float(torch.quantile(few, q))
        assert math.isclose(sketch_quantiles(weight_sketch(few))[f"is_weight_p{round(q * 100)}"],
                            want, rel_tol=SKETCH_REL), q  # fmt: skip
    assert sketch_quantiles(weight_sketch(torch.zeros(0))) == {}


def test_without_a_correction_every_weight_is_one() -> None:
    old, samp, mask, lags = micro_batch(rows(1))
    off = AlgorithmConfig(is_cap=None)
    sums, w = mismatch_sums(old, samp, mask, importance_weights(off, old, samp, mask), lags)
    record = mismatch_record(sums, w)
    assert record["is_weight_mean"] == 1.0 and record["is_weight_p1"] == 1.0
    assert record["is_masked_share"] == 0.0 and record["mismatch_kl_token_mean"] > 0


def test_the_figures_reach_the_metrics_with_one_line_per_lag() -> None:
    m = LearnerMetrics()
    m.record_step({"step": 1, "mismatch_kl_token_mean": 0.02, "is_weight_p99": 1.7,
                   "is_masked_share": 0.125, "mismatch_kl_lag0": 0.01,
                   "mismatch_kl_lag2": 0.05})  # fmt: skip
    text = m.metrics.exposition().decode()
    assert "dynamo_learner_mismatch_kl_token_mean 0.02" in text
    assert "dynamo_learner_is_weight_p99 1.7" in text
    assert "dynamo_learner_is_masked_share 0.125" in text
    assert 'dynamo_learner_mismatch_kl_by_lag{lag="0"} 0.01' in text
    assert 'dynamo_learner_mismatch_kl_by_lag{lag="2"} 0.05' in text
