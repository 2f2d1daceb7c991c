"""Advantage estimators and the DAPO sampling helpers, as pure functions of tensors.

Shapes: ``B`` responses, ``T`` response tokens, ``mask`` a {0, 1} float or bool tensor ``[B, T]``
(right padding is the common case, but nothing assumes it). ``group_ids[B]`` says which prompt each
response answers; groups may have different sizes (DynaMO gives prompts different rollout counts)
and may be given as an integer tensor or as any sequence of hashable ids (prompt-id strings).

Episodes: ``episode_ids[B]`` (optional, ids unique across the batch) says which episode each row
is a segment of — a multi-turn episode forks into several rows when its chat template rewrites
the past. Group statistics (means, stds, leave-one-out baselines, DAPO's uniform-group test) are
taken over **episodes**: a forked episode counts once, with its **return**, the value of its first
row (its first segment, which is credited with every turn; an episode's rows come in segment
order). Each row is then measured against its group's statistics with its own value (a later
segment is credited only with its own and later turns), so an episode without turn rewards gets
one advantage on every segment. ``None``: each row is an episode of its own (single-turn).

Outcome estimators (GRPO, Dr.GRPO, RLOO) return one number per response; the registry adapters at
the bottom broadcast it over the response's valid tokens so every estimator in
``ADVANTAGE_ESTIMATORS`` has the same signature and output shape. All outputs are zero at masked
positions and never depend on what the masked positions of the inputs hold.
"""

from __future__ import annotations

from collections.abc import Callable, Hashable

import torch

from learner.algorithms.registry import (
    ADVANTAGE_ESTIMATORS,
    AdvantageEstimator,
    AdvantageInputs,
    GroupIds,
)


def group_index(
    group_ids: GroupIds, device: torch.device | None = None
) -> tuple[torch.Tensor, int]:
    """Map arbitrary group ids to dense indices: ``(index[B] in 0..G-1, G)``.

    Integer tensors go through ``torch.unique``; other sequences (strings) through a dict in
    first-seen order. The numbering is only used for segment sums, so its order does not matter.
    """
    if isinstance(group_ids, torch.Tensor):
        if group_ids.dim() != 1:
            raise ValueError(f"group_ids must be 1-D [B], got shape {tuple(group_ids.shape)}")
        if group_ids.is_floating_point():
            raise ValueError("group_ids must be an integer (or bool) tensor, not floating point")
        uniq, index = torch.unique(group_ids, return_inverse=True)
        return index.to(device or group_ids.device), int(uniq.numel())
    seen: dict[Hashable, int] = {}
    index_list = [seen.setdefault(g, len(seen)) for g in group_ids]
    return torch.tensor(index_list, dtype=torch.long, device=device), len(seen)


def _check_batch(name: str, x: torch.Tensor, b: int) -> None:
    if x.dim() != 1 or x.shape[0] != b:
        raise ValueError(f"{name} must have shape [B]=[{b}], got {tuple(x.shape)}")


def _check_1d(name: str, x: torch.Tensor) -> None:
    if x.dim() != 1:
        raise ValueError(f"{name} must be 1-D [B], got shape {tuple(x.shape)}")


def _segment_sum(x: torch.Tensor, index: torch.Tensor, g: int) -> torch.Tensor:
    return torch.zeros(g, dtype=x.dtype, device=x.device).index_add_(0, index, x)


def _episodes(
    values: torch.Tensor, index: torch.Tensor, episode_ids: GroupIds | None
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """A batch seen by episodes: ``(returns[E], group[E], episode[B])`` — each episode's value
    (its first row's), its group index, and each row's episode. ``None``: every row its own."""
    b = values.shape[0]
    if episode_ids is None:
        return values, index, torch.arange(b, device=values.device)
    episode, e = group_index(episode_ids, values.device)
    _check_batch("episode_ids", episode, b)
    rows = torch.arange(b, device=values.device)
    first = torch.full((e,), b, dtype=torch.long, device=values.device)
    first = first.scatter_reduce(0, episode, rows, reduce="amin")
    group = index[first]
    split = (group[episode] != index).nonzero()
    if split.numel():
        row = int(split[0, 0])
        raise ValueError(
            f"episode_ids: episode {int(episode[row])} (row {row}) spans groups; the segments "
            f"of an episode must share its group id"
        )
    return values[first], group, episode


def _group_min(x: torch.Tensor, index: torch.Tensor, g: int) -> torch.Tensor:
    """Per-group minimum. Subtracting it first (both estimators are shift-invariant) makes a
    constant group exactly 0 instead of a rounding error, and keeps large offsets from eating
    precision."""
    init = torch.full((g,), torch.inf, dtype=x.dtype, device=x.device)
    return init.scatter_reduce(0, index, x, reduce="amin")


def _float(x: torch.Tensor) -> torch.Tensor:
    """Work in at least float32 (bf16 rewards/values would lose the small differences)."""
    return x.to(torch.float64) if x.dtype == torch.float64 else x.to(torch.float32)


def grpo_advantages(
    rewards: torch.Tensor,
    group_ids: GroupIds,
    *,
    episode_ids: GroupIds | None = None,
    norm_by_std: bool = True,
    eps: float = 1e-6,
) -> torch.Tensor:
    """GRPO advantages: ``A_i = (r_i − mean_g) / (std_g + eps)``, ``std_g`` the unbiased std.

    ``mean_g`` and ``std_g = sqrt(Σ_{e∈g}(R_e − mean_g)² / (n_g − 1))`` are over the n_g episodes
    of the response's group g (``R_e``: an episode's return; see the module docstring — without
    ``episode_ids``, the responses themselves). A group of one gets mean 0 and std 1 (so
    ``A_i = r_i / (1 + eps)``, as in verl). ``norm_by_std=False`` is Dr.GRPO:
    ``A_i = r_i − mean_g``. Returns ``[B]``.
    """
    _check_1d("rewards", rewards)
    r = _float(rewards)
    index, g = group_index(group_ids, r.device)
    _check_batch("group_ids", index, r.shape[0])
    returns, of, _ = _episodes(r, index, episode_ids)
    count = _segment_sum(torch.ones_like(returns), of, g)
    single = count < 2
    low = _group_min(returns, of, g)
    mean = _segment_sum(returns - low[of], of, g) / count
    centred = torch.where(single[index], r, r - low[index] - mean[index])
    if not norm_by_std:
        return centred
    spread = torch.where(single[of], returns, returns - low[of] - mean[of])
    var = _segment_sum(spread.square(), of, g) / (count - 1).clamp(min=1)
    std = torch.where(single, torch.ones_like(var), var.sqrt())
    return centred / (std[index] + eps)


def drgrpo_advantages(
    rewards: torch.Tensor, group_ids: GroupIds, *, episode_ids: GroupIds | None = None
) -> torch.Tensor:
    """Dr.GRPO advantages: ``A_i = r_i − mean_g`` (no std normalisation). Returns ``[B]``."""
    return grpo_advantages(rewards, group_ids, episode_ids=episode_ids, norm_by_std=False)


def rloo_advantages(
    rewards: torch.Tensor, group_ids: GroupIds, *, episode_ids: GroupIds | None = None
) -> torch.Tensor:
    """RLOO advantages: ``A_i = r_i − (Σ_{e∈g, e≠e(i)} R_e) / (n_g − 1)`` over the n_g episodes of
    the group but the response's own (see the module docstring); a group of one episode gets 0.

    Without forks, ``n_g / (n_g − 1) · (r_i − mean_g)``. Returns ``[B]``.
    """
    _check_1d("rewards", rewards)
    r = _float(rewards)
    index, g = group_index(group_ids, r.device)
    _check_batch("group_ids", index, r.shape[0])
    returns, of, episode = _episodes(r, index, episode_ids)
    low = _group_min(returns, of, g)
    shifted = returns - low[of]
    count = _segment_sum(torch.ones_like(returns), of, g)[index]
    total = _segment_sum(shifted, of, g)[index]
    baseline = (total - shifted[episode]) / (count - 1).clamp(min=1)
    return torch.where(count > 1, r - low[index] - baseline, torch.zeros_like(r))


def _check_bt(name: str, x: torch.Tensor, mask: torch.Tensor) -> None:
    if x.shape != mask.shape or x.dim() != 2:
        raise ValueError(
            f"{name} must have the shape of mask [B, T]={tuple(mask.shape)}, got {tuple(x.shape)}"
        )


def masked_mean(x: torch.Tensor, mask: torch.Tensor, dim: int | None = None) -> torch.Tensor:
    """Mean of ``x`` over positions where ``mask`` is 1 (0 where there are none)."""
    m = mask.to(x.dtype)
    x = torch.where(mask.bool(), x, torch.zeros((), dtype=x.dtype, device=x.device))
    if dim is None:
        return (x * m).sum() / m.sum().clamp(min=1)
    return (x * m).sum(dim) / m.sum(dim).clamp(min=1)


def masked_whiten(x: torch.Tensor, mask: torch.Tensor, eps: float = 1e-8) -> torch.Tensor:
    """``(x − μ) / sqrt(σ² + eps)`` over valid positions, μ and the unbiased σ² over valid ones.

    Masked positions come out 0. With fewer than two valid positions σ² is taken as 0.
    """
    valid = mask.bool()
    x = torch.where(valid, x, torch.zeros((), dtype=x.dtype, device=x.device))
    n = valid.sum()
    mean = x.sum() / n.clamp(min=1)
    centred = torch.where(valid, x - mean, torch.zeros((), dtype=x.dtype, device=x.device))
    var = centred.square().sum() / (n - 1).clamp(min=1)
    return centred * torch.rsqrt(var + eps)


def discounted_returns(
    token_rewards: torch.Tensor, mask: torch.Tensor, gamma: float = 1.0
) -> torch.Tensor:
    """``G_t = Σ_{k ≥ t, k valid} γ^{(number of valid steps from t to k)} r_k`` per row, 0 where masked.

    Masked positions are skipped (they neither add reward nor count as a discount step).
    """
    _check_bt("token_rewards", token_rewards, mask)
    valid = mask.bool()
    r = torch.where(valid, _float(token_rewards), 0.0)
    if gamma == 1.0:
        return torch.where(valid, r.flip(-1).cumsum(-1).flip(-1), 0.0)
    out = torch.zeros_like(r)
    running = torch.zeros_like(r[:, 0])
    for t in range(r.shape[1] - 1, -1, -1):
        running = torch.where(valid[:, t], r[:, t] + gamma * running, running)
        out[:, t] = running
    return torch.where(valid, out, 0.0)


def reinforce_pp_advantages(
    token_rewards: torch.Tensor,
    mask: torch.Tensor,
    *,
    gamma: float = 1.0,
    group_ids: GroupIds | None = None,
    episode_ids: GroupIds | None = None,
) -> torch.Tensor:
    """REINFORCE++ advantages: discounted returns ``G_t`` whitened over all valid tokens.

    ``G_t = r_t + γ G_{t+1}`` over valid tokens (see ``discounted_returns``). Without
    ``group_ids``: ``A = whiten(G)``. With ``group_ids`` (REINFORCE++-baseline): each response's
    group-mean sequence return is subtracted first, ``A = whiten(G_t − mean_{e∈g} G_{e,0})``, where
    ``G_{e,0}`` is episode e's return from its first valid token (its first row's, see the module
    docstring; a group of one episode has baseline 0). Returns ``[B, T]``, 0 at masked positions.
    """
    returns = discounted_returns(token_rewards, mask, gamma)
    if group_ids is not None:
        valid = mask.bool()
        first = valid.to(torch.int8).argmax(-1)  # first valid position (0 for empty rows)
        seq_return = returns.gather(1, first[:, None]).squeeze(1)
        index, g = group_index(group_ids, returns.device)
        _check_batch("group_ids", index, returns.shape[0])
        seq_return, of, _ = _episodes(seq_return, index, episode_ids)
        count = _segment_sum(torch.ones_like(seq_return), of, g)
        mean = _segment_sum(seq_return, of, g) / count
        mean = torch.where(count < 2, torch.zeros_like(mean), mean)
        returns = returns - mean[index, None]  # masked positions: whitened to 0 below
    return masked_whiten(returns, mask)


def gae_advantages(
    token_rewards: torch.Tensor,
    values: torch.Tensor,
    mask: torch.Tensor,
    *,
    gamma: float,
    lam: float,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Generalised advantage estimation; returns ``(advantages, returns)``, both ``[B, T]``.

    Over the valid tokens of a row (masked ones are skipped, the value after the last valid token
    is 0): ``δ_t = r_t + γ V_{t+1} − V_t``, ``Â_t = δ_t + γλ Â_{t+1}``, ``returns = Â + V``
    (the value targets, not whitened), ``advantages = whiten(Â)`` over valid tokens.
    """
    _check_bt("token_rewards", token_rewards, mask)
    _check_bt("values", values, mask)
    valid = mask.bool()
    r = torch.where(valid, _float(token_rewards), 0.0)
    v = torch.where(valid, _float(values), 0.0)
    adv = torch.zeros_like(r)
    next_value = torch.zeros_like(r[:, 0])
    last_gae = torch.zeros_like(r[:, 0])
    for t in range(r.shape[1] - 1, -1, -1):
        delta = r[:, t] + gamma * next_value - v[:, t]
        gae = delta + gamma * lam * last_gae
        m = valid[:, t]
        last_gae = torch.where(m, gae, last_gae)
        next_value = torch.where(m, v[:, t], next_value)
        adv[:, t] = last_gae
    returns = torch.where(valid, adv + v, 0.0)
    return masked_whiten(adv, mask), returns


def outcome_token_rewards(rewards: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """Place each response's outcome reward on its last valid token: ``[B] -> [B, T]``.

    Rows without a valid token get no reward.
    """
    _check_batch("rewards", rewards, mask.shape[0])
    valid = mask.bool()
    positions = torch.arange(mask.shape[1], device=mask.device)
    last = torch.where(valid, positions, -1).amax(-1)
    r = _float(rewards)
    out = torch.zeros(mask.shape, dtype=r.dtype, device=rewards.device)
    return out.scatter(1, last.clamp(min=0)[:, None], torch.where(last >= 0, r, 0.0)[:, None])


def opd_advantages(
    sampling_logprobs: torch.Tensor, teacher_logprobs: torch.Tensor, mask: torch.Tensor
) -> torch.Tensor:
    """On-policy distillation's per-token advantage ``−(log π_student − log π_teacher)`` on the
    student's own samples, the sampling log-prob standing for the student's: minimising the
    policy loss with it lowers the per-token reverse KL(π_student ‖ π_teacher). ``[B, T]``,
    zero at masked positions."""
    _check_bt("sampling_logprobs", sampling_logprobs, mask)
    _check_bt("teacher_logprobs", teacher_logprobs, mask)
    diff = _float(teacher_logprobs) - _float(sampling_logprobs)
    return torch.where(mask.bool(), diff, torch.zeros((), dtype=diff.dtype, device=diff.device))


def dapo_keep_groups(
    rewards: torch.Tensor, group_ids: GroupIds, *, episode_ids: GroupIds | None = None
) -> torch.Tensor:
    """DAPO dynamic sampling: ``True`` for responses whose group's episode returns are not all
    equal (see the module docstring; without ``episode_ids``, the responses' rewards).

    A group whose episodes all scored the same gives zero GRPO advantage (no learning signal), so
    DAPO drops it and samples more. A group of one episode is dropped too. Returns a bool ``[B]``.
    """
    _check_1d("rewards", rewards)
    r = _float(rewards)
    index, g = group_index(group_ids, r.device)
    _check_batch("group_ids", index, r.shape[0])
    returns, of, _ = _episodes(r, index, episode_ids)
    hi = torch.full((g,), -torch.inf, dtype=r.dtype, device=r.device)
    lo = torch.full((g,), torch.inf, dtype=r.dtype, device=r.device)
    hi = hi.scatter_reduce(0, of, returns, reduce="amax")
    lo = lo.scatter_reduce(0, of, returns, reduce="amin")
    return (hi > lo)[index]


def overlong_penalty(
    lengths: torch.Tensor, max_len: int, buffer_len: int, factor: float = 1.0
) -> torch.Tensor:
    """DAPO soft overlong punishment, added to the reward: ``[B]``, in ``[−factor, 0]``.

    With ``L_exp = max_len − buffer_len``: 0 when ``L ≤ L_exp``; ``factor · (L_exp − L) /
    buffer_len`` when ``L_exp < L ≤ max_len`` (a linear ramp); ``−factor`` beyond ``max_len``.
    """
    if not 0 < buffer_len <= max_len:
        raise ValueError(
            f"buffer_len must satisfy 0 < buffer_len <= max_len ({max_len}), got {buffer_len}"
        )
    if factor < 0:
        raise ValueError(f"factor must be >= 0, got {factor}")
    expected = max_len - buffer_len
    ramp = (expected - _float(lengths)) / buffer_len
    return ramp.clamp(min=-1.0, max=0.0) * factor


# --- registry adapters: one signature for every estimator -----------------------------------


def _broadcast(per_response: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    return torch.where(mask.bool(), per_response[:, None], 0.0)


def _register(
    name: str, compute: Callable[[AdvantageInputs], tuple[torch.Tensor, torch.Tensor]], doc: str
) -> None:
    ADVANTAGE_ESTIMATORS.add(name, AdvantageEstimator(name, compute, doc))


def _register_outcome_estimator(
    name: str, per_response: Callable[..., torch.Tensor], doc: str
) -> None:
    """Register an outcome-reward estimator, ``per_response(rewards, group_ids, *, episode_ids)``:
    one advantage per response, on every valid token; the advantages are also the returns."""

    def compute(x: AdvantageInputs) -> tuple[torch.Tensor, torch.Tensor]:
        adv = _broadcast(per_response(x.rewards, x.group_ids, episode_ids=x.episode_ids), x.mask)
        return adv, adv

    _register(name, compute, doc)


def _token_rewards(x: AdvantageInputs) -> torch.Tensor:
    """The call's token rewards, or its outcome rewards on each response's last valid token."""
    return outcome_token_rewards(x.rewards, x.mask) if x.token_rewards is None else x.token_rewards


def _reinforce_pp(x: AdvantageInputs) -> tuple[torch.Tensor, torch.Tensor]:
    tr = _token_rewards(x)
    return reinforce_pp_advantages(tr, x.mask, gamma=x.gamma), discounted_returns(
        tr, x.mask, x.gamma
    )


def _reinforce_pp_baseline(x: AdvantageInputs) -> tuple[torch.Tensor, torch.Tensor]:
    tr = _token_rewards(x)
    adv = reinforce_pp_advantages(
        tr, x.mask, gamma=x.gamma, group_ids=x.group_ids, episode_ids=x.episode_ids
    )
    return adv, discounted_returns(tr, x.mask, x.gamma)


def _gae(x: AdvantageInputs) -> tuple[torch.Tensor, torch.Tensor]:
    if x.values is None:
        raise ValueError("advantage estimator 'gae' needs values[B, T] from a critic (got None)")
    return gae_advantages(_token_rewards(x), x.values, x.mask, gamma=x.gamma, lam=x.lam)


_register_outcome_estimator("grpo", grpo_advantages, "GRPO (outcome rewards, group mean/std).")
_register_outcome_estimator(
    "drgrpo", drgrpo_advantages, "Dr.GRPO (outcome rewards, group mean only)."
)
_register_outcome_estimator(
    "rloo", rloo_advantages, "RLOO (outcome rewards, leave-one-out baseline)."
)
_register(
    "reinforce_pp",
    _reinforce_pp,
    "REINFORCE++ (token rewards, batch whitening); returns are the discounted returns.",
)
_register(
    "reinforce_pp_baseline",
    _reinforce_pp_baseline,
    "REINFORCE++-baseline (group-mean baseline, then batch whitening).",
)
_register("gae", _gae, "PPO's GAE with a critic; ``values`` is required.")
