"""DynaMO gradient-aware advantage modulation (arXiv 2602.19208), applied per micro-batch.

Before the clipped policy loss, each valid token's advantage is multiplied by a detached factor
``β_comp · β_stab``:

- ``β_comp`` (compensation) boosts confident correct tokens: where ``A > 0``,
  ``β_comp = 1 + (μ_max − 1)(H_max − H) / (H_max − H_min + 1e-8)`` (low entropy → up to ``μ_max``),
  else 1; ``H_min``/``H_max`` over the micro-batch's valid tokens.
- ``β_stab`` (stabilisation) damps tokens whose update would change the entropy most. With
  ``r = exp(logp − old_logp)``, ``I = 1[A>0]1[r ≤ 1+ε_high] + 1[A<0]1[r ≥ 1−ε_low]`` (the token
  is not clipped), ``ξ = I r A``, ``T = π (log π + H)`` (π the sampled token's probability),
  ``E`` the per-sequence masked mean of ``T``, the estimated entropy change is
  ``Ξ = |−ξ (T − E)|``; with ``x = Ξ / (max Ξ + 1e-8)`` (max over valid tokens of the
  micro-batch), ``β_stab = λ_min + (1 − λ_min) / (1 + exp(γ (x − τ)))`` — close to 1 for most
  tokens, falling to ``λ_min`` for those near the largest change.

``A' = A · β_comp · β_stab`` at valid positions; masked positions are returned unchanged and
nothing they hold (even NaN or inf) reaches a valid token. With ``μ_max = 1`` and
``λ_min = 1`` the modulation is exactly the identity.

Compared with the authors' released code (verl fork), this follows the formulas in
``docs/architecture.md``: max/min are over valid tokens only (the released code includes padding), and ``Ξ`` is per
token with the per-sequence centring ``T − E``.
"""

from __future__ import annotations

from dataclasses import dataclass, fields, replace

import torch

LOG_RATIO_CLAMP = 20.0


@dataclass(frozen=True)
class DynamoParams:
    """The four constants of the modulation."""

    lambda_min: float
    """Floor of β_stab (the strongest damping), in [0, 1]."""
    gamma: float
    """Steepness of the β_stab sigmoid, >= 0."""
    tau: float
    """Where on the normalised entropy-change axis x ∈ [0, 1] the damping sets in."""
    mu_max: float
    """Ceiling of β_comp (the strongest boost of a confident correct token), >= 1."""

    def validate(self) -> DynamoParams:
        if not 0.0 <= self.lambda_min <= 1.0:
            raise ValueError(f"dynamo lambda_min must be in [0, 1], got {self.lambda_min}")
        if self.gamma < 0:
            raise ValueError(f"dynamo gamma must be >= 0, got {self.gamma}")
        if self.mu_max < 1.0:
            raise ValueError(f"dynamo mu_max must be >= 1, got {self.mu_max}")
        return self


DYNAMO_PRESETS: dict[str, DynamoParams] = {
    "decay6": DynamoParams(lambda_min=0.6, gamma=50.0, tau=0.99, mu_max=1.2),
    "decay5": DynamoParams(lambda_min=0.6, gamma=50.0, tau=0.9, mu_max=1.4),
}
_PARAM_NAMES = tuple(f.name for f in fields(DynamoParams))


def dynamo_params(preset: str = "decay6", **overrides: float) -> DynamoParams:
    """The preset's constants with ``overrides`` (any of lambda_min, gamma, tau, mu_max) applied."""
    if preset not in DYNAMO_PRESETS:
        raise ValueError(f"unknown dynamo preset {preset!r}; known: {', '.join(DYNAMO_PRESETS)}")
    unknown = sorted(set(overrides) - set(_PARAM_NAMES))
    if unknown:
        raise ValueError(
            f"unknown dynamo override(s) {', '.join(unknown)}; allowed: {', '.join(_PARAM_NAMES)}"
        )
    return replace(DYNAMO_PRESETS[preset], **{k: float(v) for k, v in overrides.items()}).validate()


def dynamo_modulate(
    advantages: torch.Tensor,
    logp: torch.Tensor,
    old_logp: torch.Tensor,
    entropy: torch.Tensor,
    mask: torch.Tensor,
    *,
    clip_low: float,
    clip_high: float,
    preset: str = "decay6",
    **overrides: float,
) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
    """Modulated advantages ``A' = A · β_comp · β_stab`` (multiplier detached) and stats.

    All inputs ``[B, T]`` for one micro-batch; ``clip_low``/``clip_high`` are the policy loss's
    ε_low/ε_high; ``preset`` is ``decay6`` or ``decay5`` and ``overrides`` replace any of
    ``lambda_min``, ``gamma``, ``tau``, ``mu_max``. Returns ``A'`` in the dtype of
    ``advantages`` and detached 0-d stats: ``beta_comp_mean``, ``beta_stab_mean``,
    ``multiplier_mean`` (over valid tokens) and ``beta_comp_mean_pos`` (over valid A > 0 tokens).
    """
    params = dynamo_params(preset, **overrides)
    if clip_low < 0 or clip_high < 0:
        raise ValueError(f"clip_low and clip_high must be >= 0, got {clip_low}, {clip_high}")
    for name, t in (("logp", logp), ("old_logp", old_logp), ("entropy", entropy), ("mask", mask)):
        if t.shape != advantages.shape:
            raise ValueError(
                f"{name} must have the shape of advantages {tuple(advantages.shape)}, "
                f"got {tuple(t.shape)}"
            )
    with torch.no_grad():
        valid = mask.bool()
        zero = torch.zeros((), dtype=torch.float32, device=advantages.device)

        def clean(x: torch.Tensor) -> torch.Tensor:
            # Padding may hold anything; a where() (not a multiply) keeps NaN/inf out.
            return torch.where(valid, x.detach().float(), zero)

        adv, lp, h = clean(advantages), clean(logp), clean(entropy)
        log_ratio = (lp - clean(old_logp)).clamp(-LOG_RATIO_CLAMP, LOG_RATIO_CLAMP)
        ratio = log_ratio.exp()
        unclipped = ((adv > 0) & (ratio <= 1.0 + clip_high)) | (
            (adv < 0) & (ratio >= 1.0 - clip_low)
        )
        xi = unclipped.float() * ratio * adv
        t_term = torch.where(valid, lp.exp() * (lp + h), zero)
        e_seq = t_term.sum(-1, keepdim=True) / valid.sum(-1, keepdim=True).clamp(min=1)
        big_xi = torch.where(valid, (-xi * (t_term - e_seq)).abs(), zero)
        x = big_xi / (big_xi.amax() + 1e-8) if big_xi.numel() else big_xi
        lam = params.lambda_min
        # λ + (1−λ)/(1+exp(γ(x−τ))) written with sigmoid, which cannot overflow.
        beta_stab = lam + (1.0 - lam) * torch.sigmoid(-params.gamma * (x - params.tau))
        if valid.any():
            h_max = torch.where(valid, h, -torch.inf).amax()
            h_min = torch.where(valid, h, torch.inf).amin()
        else:
            h_max = h_min = zero
        boost = 1.0 + (params.mu_max - 1.0) * (h_max - h) / (h_max - h_min + 1e-8)
        beta_comp = torch.where(adv > 0, boost, 1.0)
        multiplier = torch.where(valid, beta_comp * beta_stab, 1.0)
        n_valid = valid.sum().clamp(min=1)
        positive = valid & (adv > 0)
        stats = {
            "beta_comp_mean": torch.where(valid, beta_comp, zero).sum() / n_valid,
            "beta_stab_mean": torch.where(valid, beta_stab, zero).sum() / n_valid,
            "multiplier_mean": torch.where(valid, multiplier, zero).sum() / n_valid,
            "beta_comp_mean_pos": torch.where(positive, beta_comp, zero).sum()
            / positive.sum().clamp(min=1),
        }
    modulated = torch.where(valid, advantages * multiplier.to(advantages.dtype), advantages)
    return modulated, stats
