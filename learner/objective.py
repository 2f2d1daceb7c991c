"""The RL objective of one micro-batch as one pure function: tensors and config in, loss out.

:func:`rl_objective` is everything the learner does between a micro-batch's forward pass and its
``backward()``; :class:`learner.rl.RLTrainer` and ``benchmarks/sample_efficiency.py`` both call it,
so what the benchmark measures is what the learner trains with. Terms, in order:

1. **IS weights** (optional): the advantages are multiplied by the importance weight that
   corrects the engine/learner mismatch and staleness, ``IS_CORRECTIONS[algorithm.is_mode]``
   (:func:`importance_weights`; by default the token-level truncated
   ``w = min(exp(old − sampling), cap)``, :func:`truncated_is_weights`);
2. **DynaMO modulation** (``modulation.enabled``): ``A' = A · β_comp · β_stab`` over *this*
   micro-batch (its entropy range and largest estimated entropy change, as in the paper), from
   the detached current log-probs and entropies;
3. **policy loss** ``POLICY_LOSSES[policy_loss.type]`` (PPO-clip or GSPO) with the mini-batch's
   ``normalizer`` so that gradient accumulation over micro-batches sums to the mini-batch loss;
4. **+ kl.coef · KL(π ‖ π_ref)** aggregated like the policy loss (KL *in the loss*); KL *in the
   reward* is not a loss term: it shapes the token rewards before advantages are estimated over
   the whole batch (:func:`kl_shaped_token_rewards`);
5. **− entropy_coef · H** aggregated like the policy loss (the entropy must carry its gradient);
6. **+ value_coef · value loss** when the critic is on (clipped around the old values).

Nothing here touches a model, a process group or a config file: the inputs are ``[B, T]`` tensors
of one micro-batch, and the tests check each term alone against a hand computation.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import torch

from dynamo_rl.config.learner import AlgorithmConfig, CriticConfig
from learner import algorithms as A


@dataclass
class ObjectiveInputs:
    """One micro-batch's tensors, all ``[B, T]`` over response tokens."""

    logp: torch.Tensor
    """Current log-probs of the sampled tokens (carries the gradient)."""
    old_logp: torch.Tensor
    """Log-probs under the weights at batch start (the PPO ratio's denominator)."""
    advantages: torch.Tensor
    """Token advantages from the batch-level estimator (before IS weights and modulation)."""
    mask: torch.Tensor
    """1 at response tokens, 0 at padding."""
    entropy: torch.Tensor | None = None
    """Current per-token entropy; needed by modulation (detached there) and by the entropy bonus
    (which needs its gradient)."""
    ref_logp: torch.Tensor | None = None
    """Reference-model log-probs; needed when ``kl.coef > 0``."""
    is_weights: torch.Tensor | None = None
    """Importance weights (:func:`importance_weights`); None: no correction."""
    values: torch.Tensor | None = None
    """Current critic values (carry the gradient); None: no value loss."""
    old_values: torch.Tensor | None = None
    """Critic values at batch start (the value clip's centre)."""
    returns: torch.Tensor | None = None
    """Value targets from the advantage estimator."""
    group_tokens: torch.Tensor | None = None
    """``[B]``: the valid-token count of each row's prompt group over the whole mini-batch;
    needed by ``agg: prompt-mean`` (:func:`learner.algorithms.group_token_counts` gives it for
    rows that hold their groups whole)."""


@dataclass
class ObjectiveResult:
    """The loss to backpropagate and what it was made of (all but ``loss`` detached)."""

    loss: torch.Tensor
    policy_loss: torch.Tensor
    kl_sum: torch.Tensor | None = None
    """Σ over valid tokens of the per-token KL estimate (None when the KL loss term is off)."""
    entropy_loss: torch.Tensor | None = None
    """The aggregated entropy (before ``entropy_coef``), None when the bonus is off."""
    value_loss: torch.Tensor | None = None
    advantages: torch.Tensor | None = None
    """The advantages the policy loss saw (after IS weights and modulation)."""
    metrics: dict[str, torch.Tensor] = field(default_factory=dict)
    """0-d means over the micro-batch's valid tokens: clip fractions, modulation factors,
    ``vf_*`` critic figures (the learner weights them by token count across micro-batches)."""


def loss_aggregation(algo: AlgorithmConfig) -> str:
    """The aggregation every term uses: GSPO is always ``seq-mean-token-mean``."""
    return "seq-mean-token-mean" if algo.policy_loss.type == "gspo" else algo.agg


def truncated_is_weights(
    old_logp: torch.Tensor, sampling_logp: torch.Tensor, mask: torch.Tensor, cap: float
) -> torch.Tensor:
    """``min(exp(old − sampling), cap)`` at valid tokens, 0 at padding (``[B, T]``)."""
    return A.IS_CORRECTIONS["token-truncate"](old_logp, sampling_logp, mask, cap=cap).weights


def importance_weights(
    algo: AlgorithmConfig, old_logp: torch.Tensor, sampling_logp: torch.Tensor, mask: torch.Tensor
) -> A.ISWeights | None:
    """The configured mismatch correction (``algo.is_mode`` with ``is_cap``/``is_low``) of a
    micro-batch's tokens; None when it is off (``is_cap: null``)."""
    if algo.is_cap is None:
        return None
    correct = A.IS_CORRECTIONS[algo.is_mode]
    return correct(old_logp, sampling_logp, mask, cap=algo.is_cap, low=algo.is_low)


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


def kl_shaped_token_rewards(
    rewards: torch.Tensor, mask: torch.Tensor, kl: torch.Tensor, beta: float
) -> torch.Tensor:
    """KL in the reward: outcome reward on the last token, ``− β · (old − ref)`` on every token.

    ``rewards [N]``, ``mask``/``kl [N, T]``; the result feeds a token-reward estimator (GAE).
    """
    return A.outcome_token_rewards(rewards, mask) - beta * kl


def rl_objective(
    inputs: ObjectiveInputs,
    algo: AlgorithmConfig,
    critic: CriticConfig | None = None,
    *,
    normalizer: float | None = None,
) -> ObjectiveResult:
    """Loss of one micro-batch (see the module docstring for the terms and their order).

    ``normalizer`` is the whole mini-batch's denominator (its valid-token count for token-mean,
    its number of groups for prompt-mean, its row count otherwise), so that the micro-batch losses of a mini-batch add up to its loss;
    None normalises by this micro-batch alone. ``critic`` supplies ``value_coef`` and
    ``value_clip`` when ``inputs.values`` is given (default: ``CriticConfig()``'s).
    """
    x = inputs
    tok = x.mask
    agg = loss_aggregation(algo)
    if agg == "prompt-mean" and x.group_tokens is None:
        raise ValueError(
            "learner.algorithm.agg 'prompt-mean' needs ObjectiveInputs.group_tokens (each row's "
            "group token count over the mini-batch)"
        )
    group = {"group_tokens": x.group_tokens}
    pl_cfg = algo.policy_loss
    adv = x.advantages
    if x.is_weights is not None:
        adv = adv * x.is_weights
    metrics: dict[str, torch.Tensor] = {}
    mod = algo.modulation
    if mod.enabled:
        if x.entropy is None:
            raise ValueError("DynaMO modulation needs the micro-batch's entropies")
        adv, mstats = A.dynamo_modulate(
            adv,
            x.logp.detach(),
            x.old_logp,
            x.entropy.detach(),
            tok,
            clip_low=pl_cfg.clip_low,
            clip_high=pl_cfg.clip_high,
            preset=mod.preset,
            **mod.overrides(),
        )
        metrics.update(mstats)
    loss_kwargs: dict[str, Any] = {"clip_low": pl_cfg.clip_low, "clip_high": pl_cfg.clip_high}
    if pl_cfg.dual_clip is not None:
        loss_kwargs["dual_clip"] = pl_cfg.dual_clip
    pl, pm = A.POLICY_LOSSES[pl_cfg.type](
        x.logp, x.old_logp, adv, tok, agg=agg, normalizer=normalizer, **group, **loss_kwargs
    )
    metrics.update(pm)
    loss = pl
    result = ObjectiveResult(loss=pl, policy_loss=pl.detach(), advantages=adv.detach())
    if algo.kl.coef > 0:
        if x.ref_logp is None:
            raise ValueError("kl.coef > 0 needs the reference log-probs")
        kl = A.kl_penalty(x.logp, x.ref_logp, algo.kl.kind)
        loss = loss + algo.kl.coef * A.aggregate_loss(kl, tok, agg, normalizer=normalizer, **group)
        result.kl_sum = (kl.detach() * tok).sum()
    if algo.entropy_coef > 0:
        if x.entropy is None:
            raise ValueError("entropy_coef > 0 needs the micro-batch's entropies")
        ent = A.aggregate_loss(x.entropy, tok, agg, normalizer=normalizer, **group)
        loss = loss - algo.entropy_coef * ent
        result.entropy_loss = ent.detach()
    if x.values is not None:
        if x.old_values is None or x.returns is None:
            raise ValueError("a value loss needs old_values and returns")
        cc = critic or CriticConfig()
        vl, vm = A.value_loss(
            x.values,
            x.old_values,
            x.returns,
            tok,
            clip=cc.value_clip,
            agg=agg,
            normalizer=normalizer,
            **group,
        )
        loss = loss + cc.value_coef * vl
        result.value_loss = vl.detach()
        metrics.update({f"vf_{k.removeprefix('vf_')}": v for k, v in vm.items()})
    result.loss = loss
    result.metrics = metrics
    return result
