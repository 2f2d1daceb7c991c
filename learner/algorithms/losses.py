"""Policy, value, KL and preference losses, importance weights for the engine/learner mismatch,
and how a token-level loss becomes one number.

Shapes: ``logp``, ``old_logp``, ``advantages``, ``mask`` are ``[B, T]``; ``mask`` is {0, 1}
float or bool. Every loss is computed in float32 (bf16 log-probabilities are upcast), masked
positions never influence the result, and the metrics are detached 0-d tensors (no host sync
here; the caller decides when to ``.item()``).
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

from learner.algorithms.registry import IS_CORRECTIONS, POLICY_LOSSES, ISCorrection, ISWeights

LOG_RATIO_CLAMP = 20.0
"""Log-ratios are clamped to ±20 before ``exp`` so one wild token cannot overflow the loss."""

KL_KINDS = ("k1", "abs", "k2", "k3", "low_var_kl")
AGG_MODES = (
    "token-mean",
    "seq-mean-token-sum",
    "seq-mean-token-mean",
    "seq-mean-token-sum-norm",
    "prompt-mean",
)
DPO_KINDS = ("sigmoid", "ipo")


def _f32(x: torch.Tensor) -> torch.Tensor:
    return x if x.dtype in (torch.float32, torch.float64) else x.float()


def _check_same(mask: torch.Tensor, **tensors: torch.Tensor) -> None:
    if mask.dim() != 2:
        raise ValueError(f"mask must be [B, T], got shape {tuple(mask.shape)}")
    for name, t in tensors.items():
        if t.shape != mask.shape:
            raise ValueError(
                f"{name} must have the shape of mask {tuple(mask.shape)}, got {tuple(t.shape)}"
            )


def _masked_mean(x: torch.Tensor, valid: torch.Tensor) -> torch.Tensor:
    return torch.where(valid, x, 0.0).sum() / valid.sum().clamp(min=1)


def kl_penalty(logp: torch.Tensor, ref_logp: torch.Tensor, kind: str) -> torch.Tensor:
    """Per-token KL estimate of π from π_ref, from samples of π; ``[B, T]``.

    With ``d = logp − ref_logp``:
    - ``k1``: ``d``;  ``abs``: ``|d|``;  ``k2``: ``½ d²``;
    - ``k3`` / ``low_var_kl``: ``exp(−d) + d − 1`` (Schulman's unbiased, non-negative estimator),
      with ``−d`` clamped to ``[−20, 20]`` before ``exp`` and the result clamped to ``[0, 10]``.
    """
    if kind not in KL_KINDS:
        raise ValueError(f"unknown KL kind {kind!r}; known: {', '.join(KL_KINDS)}")
    if logp.shape != ref_logp.shape:  # a silent broadcast would compare the wrong tokens
        raise ValueError(
            f"ref_logp must have the shape of logp {tuple(logp.shape)}, got {tuple(ref_logp.shape)}"
        )
    d = _f32(logp) - _f32(ref_logp)
    if kind == "k1":
        return d
    if kind == "abs":
        return d.abs()
    if kind == "k2":
        return 0.5 * d.square()
    log_ratio = (-d).clamp(-LOG_RATIO_CLAMP, LOG_RATIO_CLAMP)  # ref − logp
    # expm1 keeps the small-d case accurate; the clamp at 0 removes float rounding below the
    # estimator's true minimum (it is non-negative by construction).
    return (torch.expm1(log_ratio) - log_ratio).clamp(0.0, 10.0)


def group_token_counts(group_ids: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """``[B]``: the valid-token count of each row's group, counted over these rows.

    ``group_ids [B]`` (any integers) name each row's prompt group; ``mask [B, T]``. This is the
    ``group_tokens`` of ``prompt-mean`` for rows that hold whole groups (the learner counts over
    the whole mini-batch instead, since a group may span micro-batches).
    """
    if group_ids.dim() != 1 or group_ids.shape[0] != mask.shape[0]:
        raise ValueError(
            f"group_ids must be [B] with B = {mask.shape[0]} rows, got {tuple(group_ids.shape)}"
        )
    _, inverse = torch.unique(group_ids, return_inverse=True)
    groups = int(inverse.max()) + 1 if inverse.numel() else 0  # read where the ids are
    inverse = inverse.to(mask.device)
    row_tokens = mask.bool().sum(-1).to(torch.float32)
    per_group = torch.zeros(groups, dtype=torch.float32, device=mask.device)
    return per_group.index_add_(0, inverse, row_tokens)[inverse]


def aggregate_loss(
    loss: torch.Tensor,
    mask: torch.Tensor,
    mode: str,
    *,
    normalizer: float | torch.Tensor | None = None,
    norm_len: int | None = None,
    group_tokens: torch.Tensor | None = None,
) -> torch.Tensor:
    """Reduce a token loss ``[B, T]`` to a scalar.

    - ``token-mean``: ``Σ_{b,t} m ℓ / Σ_{b,t} m`` (every valid token weighs the same, so a
      prompt's weight grows with its number of responses);
    - ``seq-mean-token-sum``: ``mean_b Σ_t m ℓ``;
    - ``seq-mean-token-mean``: ``mean_b (Σ_t m ℓ / Σ_t m)``;
    - ``seq-mean-token-sum-norm``: ``mean_b (Σ_t m ℓ / L)``, ``L = norm_len`` or ``T`` (Dr.GRPO's
      constant length normaliser);
    - ``prompt-mean``: token-mean within each prompt's group, mean over groups —
      ``Σ_b Σ_t m ℓ / group_tokens_b / #groups``, so every prompt weighs the same whatever its
      number of responses (the weighting under which allocating samples ∝ σ lowers the
      gradient's variance). ``group_tokens [B]`` is the valid-token count of each row's group
      (:func:`group_token_counts`); the default denominator is the number of groups,
      ``Σ_b (Σ_t m) / group_tokens_b``, exact when the rows hold their groups whole.
    Sequence means are over rows with at least one valid token. ``normalizer`` replaces the
    denominator (the token count for ``token-mean``, the group count for ``prompt-mean``, the row
    count otherwise) — for gradient accumulation, pass the count over the whole mini-batch so
    micro-batches add up correctly. With nothing valid the result is 0 (still connected to the
    graph).
    """
    if mode not in AGG_MODES:
        raise ValueError(f"unknown aggregation mode {mode!r}; known: {', '.join(AGG_MODES)}")
    _check_same(mask, loss=loss)
    valid = mask.bool()
    masked = torch.where(valid, loss, torch.zeros((), dtype=loss.dtype, device=loss.device))
    if mode == "token-mean":
        denom = valid.sum().clamp(min=1) if normalizer is None else normalizer
        return masked.sum() / denom
    counts = valid.sum(-1)
    row_sum = masked.sum(-1)
    has_tokens = counts > 0
    if mode == "prompt-mean":
        if group_tokens is None:
            raise ValueError(
                "aggregation 'prompt-mean' needs group_tokens (each row's group token count; "
                "see group_token_counts)"
            )
        if group_tokens.shape != counts.shape:
            raise ValueError(
                f"group_tokens must be [B] = {tuple(counts.shape)}, got {tuple(group_tokens.shape)}"
            )
        gt = group_tokens.to(row_sum.dtype).clamp(min=1)
        share = torch.where(has_tokens, row_sum / gt, 0.0)
        if normalizer is None:
            normalizer = (counts.to(row_sum.dtype) / gt).sum().clamp(min=1)
        return share.sum() / normalizer
    if mode == "seq-mean-token-sum":
        per_row = row_sum
    elif mode == "seq-mean-token-mean":
        per_row = row_sum / counts.clamp(min=1)
    else:
        per_row = row_sum / (norm_len if norm_len is not None else loss.shape[-1])
    denom = has_tokens.sum().clamp(min=1) if normalizer is None else normalizer
    return torch.where(has_tokens, per_row, 0.0).sum() / denom


IS_LEVELS = {
    "token": "r_t, each token's own ratio",
    "sequence": "s_i = Π_t r_t, the row's likelihood ratio (on every token of the row)",
    "geometric": "g_i = (Π_t r_t)^(1/L_i), the row's geometric-mean ratio (on every token of the "
    "row): unlike s_i, its band does not narrow with the row's length",
}
"""The level of an IS correction: which ratio each token's weight is made from."""


def _is_correction(level: str, masked: bool) -> ISCorrection:
    """The ``IS_CORRECTIONS`` entry ``<level>-truncate`` or ``<level>-mask``."""

    def correction(
        old_logp: torch.Tensor,
        sampling_logp: torch.Tensor,
        mask: torch.Tensor,
        *,
        cap: float,
        low: float | None = None,
    ) -> ISWeights:
        _check_same(mask, old_logp=old_logp, sampling_logp=sampling_logp)
        valid = mask.bool()
        log_r = torch.where(valid, _f32(old_logp) - _f32(sampling_logp), 0.0)
        if level == "token":
            ratio = log_r.exp()
        else:  # [B, 1]; the log clamped to ±20 so that a long row cannot overflow
            total = log_r.sum(-1, keepdim=True)
            if level == "geometric":
                total = total / valid.sum(-1, keepdim=True).clamp(min=1)
            ratio = total.clamp(-LOG_RATIO_CLAMP, LOG_RATIO_CLAMP).exp()
        ratio = ratio.expand_as(log_r)
        if not masked:
            return ISWeights(torch.where(valid, ratio.clamp(max=cap), 0.0), torch.zeros_like(valid))
        low = 1.0 / cap if low is None else low
        if not 0.0 < low < cap:
            raise ValueError(f"the IS band needs 0 < low < cap, got low {low}, cap {cap}")
        keep = valid & (ratio >= low) & (ratio <= cap)
        return ISWeights(torch.where(keep, ratio, 0.0), valid & ~keep)

    name = f"{level}-{'mask' if masked else 'truncate'}"
    how = (
        "the ratio where it lies in [low, cap] (low defaults to 1 / cap), else 0: the token "
        "is dropped"
        if masked
        else "min(ratio, cap)"
    )
    correction.__name__ = correction.__qualname__ = (
        f"{level}_{'masked' if masked else 'truncated'}_is"
    )
    correction.__doc__ = (
        f"IS correction ``{name}``: the ratio is {IS_LEVELS[level]}, with r_t = exp(old_t − "
        f"sampling_t); each valid token's weight is {how}. Padding weighs 0."
    )
    return correction


for _level in IS_LEVELS:
    for _masked in (False, True):
        IS_CORRECTIONS.add(
            f"{_level}-{'mask' if _masked else 'truncate'}", _is_correction(_level, _masked)
        )
token_truncated_is = IS_CORRECTIONS["token-truncate"]
sequence_truncated_is = IS_CORRECTIONS["sequence-truncate"]
geometric_truncated_is = IS_CORRECTIONS["geometric-truncate"]
token_masked_is = IS_CORRECTIONS["token-mask"]
sequence_masked_is = IS_CORRECTIONS["sequence-mask"]
geometric_masked_is = IS_CORRECTIONS["geometric-mask"]


def _clipped_surrogate(
    ratio: torch.Tensor,
    adv: torch.Tensor,
    valid: torch.Tensor,
    clip_low: float,
    clip_high: float,
    dual_clip: float | None,
) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
    """Token loss ``max(−A r, −A clip(r, 1−ε_low, 1+ε_high))`` (+ dual clip) and clip fractions."""
    if clip_low < 0 or clip_high < 0:
        raise ValueError(f"clip_low and clip_high must be >= 0, got {clip_low}, {clip_high}")
    if dual_clip is not None and dual_clip <= 1.0:
        raise ValueError(f"dual_clip must be a constant > 1 (e.g. 3 or 10), got {dual_clip}")
    loss1 = -adv * ratio
    loss2 = -adv * ratio.clamp(1.0 - clip_low, 1.0 + clip_high)
    loss = torch.maximum(loss1, loss2)
    with torch.no_grad():
        r = ratio.detach()
        upper = (adv > 0) & (r > 1.0 + clip_high)
        lower = (adv < 0) & (r < 1.0 - clip_low)
        dual = torch.zeros_like(upper)
    if dual_clip is not None:
        # For A < 0 the surrogate −A r grows without bound in r; cap it at −A c.
        loss = torch.where(adv < 0, torch.minimum(loss, -adv * dual_clip), loss)
        with torch.no_grad():
            dual = (adv < 0) & (r > dual_clip)
    with torch.no_grad():
        metrics = {
            "clipfrac_upper": _masked_mean(upper.float(), valid),
            "clipfrac_lower": _masked_mean(lower.float(), valid),
            "clipfrac_dual": _masked_mean(dual.float(), valid),
        }
    return loss, metrics


@POLICY_LOSSES.register("ppo")
def policy_loss(
    logp: torch.Tensor,
    old_logp: torch.Tensor,
    advantages: torch.Tensor,
    mask: torch.Tensor,
    *,
    clip_low: float = 0.2,
    clip_high: float = 0.2,
    dual_clip: float | None = None,
    agg: str = "token-mean",
    normalizer: float | torch.Tensor | None = None,
    group_tokens: torch.Tensor | None = None,
) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
    """PPO clipped surrogate with asymmetric bounds (clip-higher) and optional dual clip.

    ``r = exp(clamp(logp − old_logp, ±20))``;
    ``ℓ = max(−A r, −A clip(r, 1 − ε_low, 1 + ε_high))``; with dual clip ``c > 1``,
    ``ℓ = min(ℓ, −A c)`` where ``A < 0``. Aggregated with ``aggregate_loss(ℓ, mask, agg)``.

    Metrics (fractions of valid tokens): ``clipfrac_upper`` (A > 0, r > 1 + ε_high),
    ``clipfrac_lower`` (A < 0, r < 1 − ε_low), ``clipfrac_dual`` (A < 0, r > c); ``approx_kl`` =
    mean of ``(r − 1) − log r`` (k3 estimate of KL(π_old ‖ π)); ``ratio_mean``.
    """
    _check_same(mask, logp=logp, old_logp=old_logp, advantages=advantages)
    valid = mask.bool()
    log_ratio = (_f32(logp) - _f32(old_logp)).clamp(-LOG_RATIO_CLAMP, LOG_RATIO_CLAMP)
    # Masked positions may hold anything (inf, NaN); zero them so no NaN leaks into the gradient.
    log_ratio = torch.where(valid, log_ratio, 0.0)
    adv = torch.where(valid, _f32(advantages).detach(), 0.0)
    ratio = log_ratio.exp()
    token_loss, metrics = _clipped_surrogate(ratio, adv, valid, clip_low, clip_high, dual_clip)
    loss = aggregate_loss(token_loss, mask, agg, normalizer=normalizer, group_tokens=group_tokens)
    with torch.no_grad():
        lr = log_ratio.detach()
        metrics["approx_kl"] = _masked_mean(lr.exp() - 1 - lr, valid)
        metrics["ratio_mean"] = _masked_mean(lr.exp(), valid)
    return loss, metrics


@POLICY_LOSSES.register("gspo")
def gspo_loss(
    logp: torch.Tensor,
    old_logp: torch.Tensor,
    advantages: torch.Tensor,
    mask: torch.Tensor,
    *,
    clip_low: float = 3e-4,
    clip_high: float = 4e-4,
    dual_clip: float | None = None,
    agg: str = "seq-mean-token-mean",
    normalizer: float | torch.Tensor | None = None,
    group_tokens: torch.Tensor | None = None,
) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
    """GSPO: PPO clipping on the sequence-level importance ratio.

    ``log s_i = Σ_t m (logp − old_logp) / Σ_t m`` (the length-normalised sequence log-ratio);
    the token form ``r_{i,t} = exp(sg[log s_i] + logp_{i,t} − sg[logp_{i,t}])`` equals ``s_i`` in
    value while ``∂r_{i,t}/∂logp_{i,t} = s_i`` — every token of a sequence is weighted by the
    sequence's ratio. The clipped surrogate of ``policy_loss`` (same clip fractions, optional dual
    clip) is applied to ``r``, then aggregated ``seq-mean-token-mean`` by default. The defaults
    3e-4 / 4e-4 are the GSPO paper's clip ranges (sequence ratios sit much closer to 1).
    """
    _check_same(mask, logp=logp, old_logp=old_logp, advantages=advantages)
    valid = mask.bool()
    lp = torch.where(valid, _f32(logp), 0.0)
    diff = torch.where(valid, lp.detach() - _f32(old_logp), 0.0)
    seq_log_ratio = diff.sum(-1) / valid.sum(-1).clamp(min=1)
    token_log_ratio = seq_log_ratio[:, None] + lp - lp.detach()
    token_log_ratio = token_log_ratio.clamp(-LOG_RATIO_CLAMP, LOG_RATIO_CLAMP)
    adv = torch.where(valid, _f32(advantages).detach(), 0.0)
    ratio = token_log_ratio.exp()
    token_loss, metrics = _clipped_surrogate(ratio, adv, valid, clip_low, clip_high, dual_clip)
    loss = aggregate_loss(token_loss, mask, agg, normalizer=normalizer, group_tokens=group_tokens)
    with torch.no_grad():
        lr = torch.where(valid, _f32(logp).detach() - _f32(old_logp), 0.0)
        lr = lr.clamp(-LOG_RATIO_CLAMP, LOG_RATIO_CLAMP)
        metrics["approx_kl"] = _masked_mean(lr.exp() - 1 - lr, valid)
        has = valid.any(-1)
        s = seq_log_ratio.clamp(-LOG_RATIO_CLAMP, LOG_RATIO_CLAMP).exp()
        metrics["ratio_mean"] = torch.where(has, s, 0.0).sum() / has.sum().clamp(min=1)
    return loss, metrics


def value_loss(
    values: torch.Tensor,
    old_values: torch.Tensor,
    returns: torch.Tensor,
    mask: torch.Tensor,
    *,
    clip: float | None = 0.2,
    agg: str = "token-mean",
    normalizer: float | torch.Tensor | None = None,
    group_tokens: torch.Tensor | None = None,
) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
    """Clipped value loss: ``½ max((V − R)², (V_old + clip(V − V_old, ±c) − R)²)``, aggregated.

    ``clip=None`` gives the plain ``½ (V − R)²``. Metrics: ``vf_clipfrac`` (fraction of valid
    tokens where the clipped term is the larger one), ``vf_mean``.
    """
    _check_same(mask, values=values, old_values=old_values, returns=returns)
    valid = mask.bool()
    v = torch.where(valid, _f32(values), 0.0)
    v_old = torch.where(valid, _f32(old_values), 0.0).detach()
    ret = torch.where(valid, _f32(returns), 0.0).detach()
    unclipped = (v - ret).square()
    if clip is None:
        token_loss = 0.5 * unclipped
        clipped_frac = torch.zeros((), device=v.device)
    else:
        if clip < 0:
            raise ValueError(f"value clip must be >= 0 or None, got {clip}")
        v_clip = v_old + (v - v_old).clamp(-clip, clip)
        clipped = (v_clip - ret).square()
        token_loss = 0.5 * torch.maximum(unclipped, clipped)
        with torch.no_grad():
            clipped_frac = _masked_mean((clipped > unclipped).float(), valid)
    loss = aggregate_loss(token_loss, mask, agg, normalizer=normalizer, group_tokens=group_tokens)
    return loss, {"vf_clipfrac": clipped_frac, "vf_mean": _masked_mean(v.detach(), valid)}


def dpo_loss(
    pol_chosen: torch.Tensor,
    pol_rejected: torch.Tensor,
    ref_chosen: torch.Tensor,
    ref_rejected: torch.Tensor,
    *,
    beta: float = 0.1,
    kind: str = "sigmoid",
    label_smoothing: float = 0.0,
) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
    """Direct preference optimisation on sequence log-probabilities ``[B]``.

    ``h = (π_c − ref_c) − (π_r − ref_r)`` (log-prob sums). ``sigmoid``:
    ``−(1−ε) log σ(β h) − ε log σ(−β h)`` (ε = ``label_smoothing``, 0 is plain DPO); ``ipo``:
    ``(h − 1/(2β))²``. Mean over the batch. Metrics: ``reward_chosen`` / ``reward_rejected``
    (means of ``β(π − ref)``), ``reward_accuracy`` (fraction where chosen > rejected),
    ``reward_margin`` (mean of chosen − rejected).
    """
    if kind not in DPO_KINDS:
        raise ValueError(f"unknown DPO kind {kind!r}; known: {', '.join(DPO_KINDS)}")
    if beta <= 0:
        raise ValueError(f"beta must be > 0, got {beta}")
    if not 0.0 <= label_smoothing < 0.5:
        raise ValueError(f"label_smoothing must be in [0, 0.5), got {label_smoothing}")
    shapes = {t.shape for t in (pol_chosen, pol_rejected, ref_chosen, ref_rejected)}
    if len(shapes) != 1 or len(next(iter(shapes))) != 1:
        raise ValueError(f"DPO inputs must all be [B] with the same B, got shapes {sorted(shapes)}")
    chosen = _f32(pol_chosen) - _f32(ref_chosen).detach()
    rejected = _f32(pol_rejected) - _f32(ref_rejected).detach()
    h = chosen - rejected
    if kind == "sigmoid":
        losses = -(1 - label_smoothing) * F.logsigmoid(beta * h) - label_smoothing * F.logsigmoid(
            -beta * h
        )
    else:
        losses = (h - 1 / (2 * beta)).square()
    with torch.no_grad():
        rc, rr = beta * chosen.detach(), beta * rejected.detach()
        metrics = {
            "reward_chosen": rc.mean(),
            "reward_rejected": rr.mean(),
            "reward_accuracy": (rc > rr).float().mean(),
            "reward_margin": (rc - rr).mean(),
        }
    return losses.mean(), metrics
