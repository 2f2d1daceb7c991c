"""The RL objective of one micro-batch as one pure function: tensors and config in, loss out.

:func:`rl_objective` is everything the learner does between a micro-batch's forward pass and its
``backward()``; the RL step (:class:`learner.step.RLStep`) calls it once per micro-batch, and the
learner and every benchmark that trains run that step. Terms, in order:

1. **IS weights** (optional): the advantages are multiplied by the importance weight that
   corrects the engine/learner mismatch and staleness, ``IS_CORRECTIONS[algorithm.is_mode]``
   (:func:`importance_weights`; by default the token-level truncated
   ``w = min(exp(old − sampling), cap)``);
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


def importance_weights(
    algo: AlgorithmConfig, old_logp: torch.Tensor, sampling_logp: torch.Tensor, mask: torch.Tensor
) -> A.ISWeights | None:
    """The configured mismatch correction (``algo.is_mode`` with ``is_cap``/``is_low``) of a
    micro-batch's tokens; None when it is off (``is_cap: null``)."""
    if algo.is_cap is None:
        return None
    correct = A.IS_CORRECTIONS[algo.is_mode]
    return correct(old_logp, sampling_logp, mask, cap=algo.is_cap, low=algo.is_low)


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
    agg = algo.agg  # GSPO: seq-mean-token-mean, which the config requires of it
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
