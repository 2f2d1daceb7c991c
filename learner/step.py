"""The RL step: a batch of trajectory groups in, the policy updated, the step record out.

:class:`RLStep` is the one place the RL update is written. The learner (``learner/rl.py``) feeds
it batches from the Redis Stream (``learner/stream_source.py``); the benchmarks that train
(``benchmarks/sample_efficiency.py``, ``stability.py``) feed it batches they sample in process,
and ``benchmarks/grad_variance.py`` runs its loss and backward (``update=False``) on sampled
pools. The step does not know where a batch came from. One step:

1. **plan** (:func:`plan_batch`): mini-batches of whole groups, this rank's contiguous share of
   each, split into micro-batches of typed, padded tensors (:class:`learner.batch.MicroBatch`);
2. **old pass**, no grad: log-probs and entropies of every response under the weights at batch
   start (the PPO ratio's denominator), reference log-probs when a KL term is on, values when
   there is a critic. The rollout's sampling log-probs stay for the importance weights of
   ``algorithm.is_mode`` and the mismatch figures (``learner/mismatch.py``);
3. **advantages** over the whole batch (:func:`batch_advantages`: rewards, DAPO's overlong
   shaping, ``ADVANTAGE_ESTIMATORS``; group statistics over episodes, a forked episode counted
   once; values and KL-in-reward gathered from the ranks first; on-policy distillation's
   per-token advantage mixed in, ``learner/opd.py``);
4. **updates**: ``ppo_epochs`` × mini-batches × micro-batches of forward → ``rl_objective``
   (IS weights, DynaMO modulation, policy loss with the mini-batch's normaliser, KL, entropy,
   value loss) → backward, gradients accumulated; per mini-batch one clipped AdamW step. With
   gradient statistics on, the first epoch's backward also yields each prompt's statistic for
   the allocator (``learner/grad_report.py``), at no extra pass.

Every rank holds the whole batch, so everything computed over it (advantages, normalisers) is
identical on every rank without communication; without a process group the step is a world of
one (in-process benchmarks and tests).
"""

from __future__ import annotations

import logging
import time
from collections import Counter, defaultdict
from collections.abc import Callable
from contextlib import AbstractContextManager, nullcontext
from dataclasses import dataclass, field
from typing import Any

import torch
import torch.distributed as dist
from torch import nn

from dynamo_rl.config.learner import LearnerConfig
from dynamo_rl.contracts.generation import StepGeneration
from dynamo_rl.contracts.gradstats import GradRecord
from dynamo_rl.contracts.step_allocation import StepAllocation
from learner import algorithms as A
from learner.batch import (
    MicroBatch,
    Sample,
    batch_mask,
    collate,
    episode_ids,
    episode_stats,
    micro_splits,
    mini_batches,
    num_micro,
    placed_turn_rewards,
    rank_share,
    scale_by_temperature,
    to_rows,
)
from learner.dist import all_gather_object, all_reduce_sum, all_reduce_tensor, world_size
from learner.grad_report import GradStatsCollector, step_fields
from learner.mismatch import mismatch_record, mismatch_sums, weight_sketch
from learner.objective import (
    ObjectiveInputs,
    importance_weights,
    kl_shaped_token_rewards,
    rl_objective,
)
from learner.opd import mix_opd, opd_record

log = logging.getLogger(__name__)

Forward = Callable[
    [nn.Module, MicroBatch, bool], tuple[torch.Tensor, torch.Tensor, torch.Tensor | None]
]
"""``(model, micro-batch, entropy_grad) → (log-probs, entropies, values or None)``, ``[b, T]``."""


@dataclass
class RLBatch:
    """One step's input: the samples of whole groups and each group's prompt id."""

    samples: list[Sample]
    prompt_ids: list[str]
    """Group ``g``'s prompt (``samples[i].group`` indexes it); "" where there is none."""
    skipped: int = 0
    """Groups the source read and left out (stale, all-equal rewards under dynamic sampling)."""
    entry_ids: list[str] = field(default_factory=list)
    """Stream ids the step consumed, trained or skipped (empty for in-process batches)."""
    generation: StepGeneration | None = None
    """What the batch's groups cost to generate, kept and dropped (the stream source fills it;
    an in-process benchmark that drops groups fills it itself); None: no ``gen_*`` fields."""
    allocation: StepAllocation | None = None
    """Its consumed groups above, at and below uniform n, and the skipped prompts they carried
    (the stream source fills it); None: no ``alloc_*`` fields."""

    @property
    def groups(self) -> int:
        return len(self.prompt_ids)


@dataclass
class StepResult:
    record: dict[str, Any]
    """The step record (``metrics.jsonl``, the Prometheus gauges, the dashboard)."""
    grad_records: list[GradRecord]
    """Each prompt's gradient statistic of this step (empty unless the step collects them)."""


def policy_forward(
    model: nn.Module, mb: MicroBatch, entropy_grad: bool = False
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor | None]:
    """Log-probs, entropies (``[b, T]``) and values of a micro-batch's response tokens.

    The logits are divided by each row's sampling temperature first, so the log-probs are those
    of the distribution the engine sampled from (and match its ``processed`` log-probs when
    top-k/top-p are off). Every pass of the RL step (old, reference, update) goes through here.
    """
    logits, values = model(mb.input_ids, mb.attention_mask, mb.response_len)
    logits = scale_by_temperature(logits, mb.temperature)
    logp, entropy = A.token_logprobs_and_entropy(logits, mb.response_ids)
    if not entropy_grad:
        entropy = entropy.detach()
    return logp, entropy, values


class AdaptiveKL:
    """PPO's adaptive KL-in-reward coefficient (Ziegler et al.)."""

    def __init__(self, beta: float, target: float | None, horizon: int) -> None:
        self.beta, self.target, self.horizon = beta, target, horizon

    def update(self, kl: float, n: int) -> None:
        if self.target is None:
            return
        error = max(-0.2, min(0.2, kl / self.target - 1.0))
        self.beta *= 1.0 + error * n / self.horizon


def adamw(model: nn.Module, lc: LearnerConfig) -> torch.optim.AdamW:
    """The learner's optimizer: AdamW over the trainable parameters, ``learner.lr`` and
    ``learner.optim``'s betas, eps and weight decay."""
    o = lc.optim
    return torch.optim.AdamW(
        [p for p in model.parameters() if p.requires_grad],
        lr=lc.lr,
        betas=o.betas,
        eps=o.eps,
        weight_decay=o.weight_decay,
    )


def clip_and_step(
    model: nn.Module, optimizer: torch.optim.Optimizer, max_norm: float | None
) -> float:
    """Clip the trainable gradients to ``max_norm`` (None or 0: no clip), step, zero; returns
    the global gradient norm before clipping (a sharded norm is gathered first)."""
    params = [p for p in model.parameters() if p.requires_grad]
    norm = torch.nn.utils.clip_grad_norm_(params, max_norm or float("inf"))
    if hasattr(norm, "full_tensor"):
        norm = norm.full_tensor()
    optimizer.step()
    optimizer.zero_grad(set_to_none=True)
    return float(norm)


def plan_batch(
    samples: list[Sample],
    lc: LearnerConfig,
    pad_id: int,
    *,
    rank: int = 0,
    world: int = 1,
    device: torch.device | None = None,
) -> tuple[list[list[int]], list[list[MicroBatch]]]:
    """Mini-batches (row indices of whole groups) and this rank's micro-batches of each.

    Every rank runs the same number of micro-batches per mini-batch (a rank with fewer rows
    gets empty ones: one-row dummies that keep FSDP's collectives in step)."""
    minis = mini_batches(samples, lc.mini_batch_size or lc.train_batch_size)
    # prompt-mean weighs each row by 1 / its group's token count; a mini-batch holds its groups
    # whole, so the whole batch's count is the mini-batch's (and every rank's).
    group_tokens: dict[int, int] = defaultdict(int)
    for s in samples:
        group_tokens[s.group] += s.model_tokens
    plan: list[list[MicroBatch]] = []
    for rows in minis:
        mine = rank_share(rows, rank, world)
        splits = micro_splits(
            mine, lc.micro_batch_size, num_micro(rows, world, lc.micro_batch_size)
        )
        mbs = [collate(samples, s, pad_id) for s in splits]
        for mb in mbs:
            if mb.rows:
                mb.group_tokens = torch.tensor(
                    [float(group_tokens[samples[i].group]) for i in mb.rows]
                )
        plan.append([mb.to(device) if device is not None else mb for mb in mbs])
    return minis, plan


def normalizer(samples: list[Sample], rows: list[int], agg: str) -> float:
    """A mini-batch's denominator: its trained tokens (token-mean), its groups with a token
    (prompt-mean) or its rows with a token (the seq-mean aggregations)."""
    if agg == "token-mean":
        return float(max(1, sum(samples[i].model_tokens for i in rows)))
    if agg == "prompt-mean":
        return float(max(1, len({samples[i].group for i in rows if samples[i].response})))
    return float(max(1, sum(1 for i in rows if samples[i].response)))


def gather_rows(plan: list[list[MicroBatch]]) -> dict[int, dict[str, list[float]]]:
    """Collective: per batch row, its old values and old − reference log-ratio, from every rank
    (what the batch-level estimators need of the other ranks' rows)."""
    mine: dict[int, dict[str, list[float]]] = {}
    for mbs in plan:
        for mb in mbs:
            for j, row in enumerate(mb.rows):
                valid = mb.mask[j].nonzero()  # interior zeros: observation tokens
                length = int(valid[-1]) + 1 if len(valid) else 0
                item: dict[str, list[float]] = {}
                if mb.old_values is not None:
                    item["values"] = mb.old_values[j, :length].tolist()
                if mb.ref_logp is not None and mb.old_logp is not None:
                    item["kl"] = (mb.old_logp[j, :length] - mb.ref_logp[j, :length]).tolist()
                mine[row] = item
    out: dict[int, dict[str, list[float]]] = {}
    for part in all_gather_object(mine):
        out.update(part)
    return out


def batch_advantages(
    samples: list[Sample],
    plan: list[list[MicroBatch]],
    lc: LearnerConfig,
    kl_beta: float = 0.0,
    device: torch.device | None = None,
) -> tuple[torch.Tensor, torch.Tensor, float]:
    """Advantages and returns over the whole batch (identical on every rank), stored in each
    micro-batch; returns the (shaped) rewards, the responses' trained lengths and the mean KL in
    the reward (0 without it). Collective when there is a critic or a KL-in-reward term."""
    algo = lc.algorithm
    n = len(samples)
    mask = batch_mask(samples)
    t_len = mask.shape[1]
    rewards = torch.tensor([s.reward for s in samples], dtype=torch.float32)
    # Model tokens only: observation tokens count for neither length nor overlong penalty.
    lengths = torch.tensor([s.model_tokens for s in samples])
    dapo = algo.dapo
    if dapo.overlong_buffer > 0:
        assert dapo.max_response_len is not None
        rewards = rewards + A.overlong_penalty(
            lengths, dapo.max_response_len, dapo.overlong_buffer, dapo.overlong_factor
        )
    group_ids = torch.tensor([s.group for s in samples], dtype=torch.long)
    # A forked episode's segments count once in their group's statistics.
    episodes = episode_ids([s.group for s in samples], [s.episode for s in samples])
    values_full = None
    # Per-turn environment rewards on their turns' last model tokens (None: outcome only).
    token_rewards = placed_turn_rewards(samples, mask)
    kl_in_reward = 0.0
    if lc.critic.enabled or kl_beta > 0:  # the same decision on every rank
        gathered = gather_rows(plan)
        if lc.critic.enabled:
            values_full = to_rows([gathered[i]["values"] for i in range(n)], t_len)
        if kl_beta > 0:
            kl_tok = to_rows([gathered[i]["kl"] for i in range(n)], t_len)
            kl_in_reward = float((kl_tok * mask).sum() / mask.sum().clamp(min=1))
            if token_rewards is None:
                token_rewards = kl_shaped_token_rewards(rewards, mask, kl_tok, kl_beta)
            else:
                token_rewards = token_rewards - kl_beta * kl_tok
    adv = algo.advantage
    estimator = A.ADVANTAGE_ESTIMATORS[getattr(adv, "registry_name", adv.type)]
    kwargs = {k: getattr(adv, k) for k in ("gamma", "lam") if hasattr(adv, k)}
    advantages, returns = estimator(
        rewards=rewards,
        mask=mask,
        group_ids=group_ids,
        episode_ids=episodes,
        token_rewards=token_rewards,
        values=values_full,
        **kwargs,
    )
    if algo.opd.weight > 0:  # on-policy distillation's per-token advantage, mixed in
        advantages = mix_opd(samples, mask, advantages, algo.opd)
    if device is not None:
        advantages, returns = advantages.to(device), returns.to(device)
    for mbs in plan:
        for mb in mbs:
            if mb.rows:
                rows = torch.tensor(mb.rows, device=advantages.device)
                mb.advantages = advantages[rows, : mb.response_len]
                mb.returns = returns[rows, : mb.response_len]
    return rewards, lengths, kl_in_reward


# Algorithm metric names → step-record names (the Prometheus gauges use the record names).
_METRIC_NAMES = {
    "clipfrac_upper": "clip_frac_upper",
    "clipfrac_lower": "clip_frac_lower",
    "clipfrac_dual": "clip_frac_dual",
}


@dataclass(eq=False)
class RLStep:
    """The RL update of ``lc`` (``learner.*`` of the config) on ``model``.

    ``optimizer`` is stepped once per mini-batch (None: only ``update=False`` calls);
    ``reference`` enters a context that yields the reference policy (needed when a KL term is
    on); ``grad_stats`` collects each prompt's gradient statistic in the update's backward;
    ``forward`` replaces :func:`policy_forward` (a benchmark that reads log-probs from a
    precomputed pool); ``notices`` receives the no-signal warning (default: the log)."""

    lc: LearnerConfig
    model: nn.Module
    optimizer: torch.optim.Optimizer | None
    pad_id: int = field(kw_only=True)
    device: torch.device = field(default_factory=lambda: torch.device("cpu"), kw_only=True)
    reference: Callable[[], AbstractContextManager[nn.Module]] | None = field(
        default=None, kw_only=True
    )
    grad_stats: bool = field(default=False, kw_only=True)
    forward: Forward = field(default=policy_forward, kw_only=True)
    notices: Any = field(default=None, kw_only=True)

    def __post_init__(self) -> None:
        if self.lc.needs_reference and self.reference is None:
            raise ValueError("this learner config needs a reference policy (a KL term is on)")
        kl = self.lc.algorithm.kl
        self.kl_ctl = AdaptiveKL(kl.in_reward_coef, kl.target, kl.horizon)
        self.collector = GradStatsCollector(self.model) if self.grad_stats else None
        self.equal_reward_streak = 0  # steps in a row whose rewards were all equal

    def __call__(self, batch: RLBatch, *, update: bool = True) -> StepResult:
        """plan → old/ref pass → advantages → per micro-batch: forward → objective → backward
        → per mini-batch: optimizer step. ``update=False``: one pass over the mini-batches,
        backward only, the whole batch's gradients left accumulated in the model (no step)."""
        lc, algo = self.lc, self.lc.algorithm
        samples = batch.samples
        rank = dist.get_rank() if dist.is_initialized() else 0
        world = world_size()
        t_start = time.perf_counter()
        minis, plan = plan_batch(
            samples, lc, self.pad_id, rank=rank, world=world, device=self.device
        )
        self._old_pass(plan)
        t_forward = time.perf_counter() - t_start
        rewards, lengths, kl_in_reward = batch_advantages(
            samples, plan, lc, self.kl_ctl.beta, self.device
        )
        sums: dict[str, float] = defaultdict(float)  # token-weighted metric sums, this rank
        is_sketch = self._is_weights(samples, plan, sums)
        if self.collector is not None:
            self.collector.reset()
        epochs = lc.ppo_epochs if update else 1
        t_fwd, t_bwd, t_opt, update_losses, grad_norms = self._updates(
            samples, minis, plan, sums, epochs=epochs, step=update
        )
        grad_records: list[GradRecord] = []
        grad_fields: dict[str, Any] = {}
        if self.collector is not None and batch.prompt_ids:
            grad_records = self.collector.records(samples, batch.prompt_ids)
            size = Counter(batch.prompt_ids[s.group] for s in samples)
            grad_fields = step_fields(grad_records, [size[r.prompt_id] for r in grad_records])
            grad_fields["time_grad_stats"] = self.collector.seconds

        # Metrics: sums over ranks (the key set differs per rank: gather the dicts).
        totals: dict[str, float] = defaultdict(float)
        for part in all_gather_object(dict(sums)):
            for k, v in part.items():
                totals[k] += v
        is_sketch = all_reduce_tensor(is_sketch)
        n = len(samples)
        updates = max(1, len(update_losses))
        tokens = max(totals["tokens"], 1.0)
        record: dict[str, Any] = {
            "loss": sum(update_losses) / updates,
            "update_losses": update_losses,
            "policy_loss": totals["policy_loss_x"] / updates,
            "grad_norm": grad_norms[-1] if grad_norms else 0.0,
            "grad_norms": grad_norms,
            "lr": self.optimizer.param_groups[0]["lr"] if self.optimizer is not None else 0.0,
            "entropy": totals["old_entropy"] / tokens,
            "entropy_update": totals["entropy"] / tokens / epochs,
            **mismatch_record(totals, is_sketch),
            "groups": batch.groups,
            "groups_skipped": batch.skipped,
            # Stream ids this step consumed (trained or skipped): exactly-once is checkable.
            "entry_ids": list(batch.entry_ids),
            "responses": n,
            "tokens": int(totals["tokens"]),
            "reward_mean": float(rewards.mean()),
            "accuracy_mean": sum(s.correct for s in samples) / n,
            "response_len_mean": float(lengths.float().mean()),
            "staleness_mean": sum(s.staleness for s in samples) / n,
            "staleness_max": max(s.staleness for s in samples),
            "version_spread_mean": sum(s.version_spread for s in samples) / n,
            "version_spread_max": max(s.version_spread for s in samples),
            "time_forward": t_forward + t_fwd,
            "time_backward": t_bwd,
            "time_optimizer": t_opt,
        }
        record |= episode_stats(samples) | grad_fields | opd_record(samples)
        if batch.generation is not None:
            record |= batch.generation.record()
        if batch.allocation is not None:
            record |= batch.allocation.record()
        if algo.kl.coef > 0:
            record["kl"] = totals["kl"] / tokens / epochs
        if self.kl_ctl.beta > 0:
            record["kl_in_reward"] = kl_in_reward
            record["kl_beta"] = self.kl_ctl.beta
            if update:
                self.kl_ctl.update(kl_in_reward, n)
        if lc.critic.enabled:
            record["value_loss"] = totals["value_loss"] / updates
        for k in totals:
            if k.startswith("m:"):
                name = k[2:]
                record[_METRIC_NAMES.get(name, name)] = totals[k] / max(totals[f"w:{name}"], 1.0)
        elapsed = time.perf_counter() - t_start
        record["tokens_per_second"] = totals["tokens"] * epochs / max(elapsed, 1e-9)
        if update:
            record.update(self._equal_rewards(samples))
        return StepResult(record, grad_records)

    # --- the parts, in the order they run ----------------------------------------------------

    def _old_pass(self, plan: list[list[MicroBatch]]) -> None:
        """Old (and reference) log-probs and values under the weights at batch start."""
        with torch.no_grad():
            for mbs in plan:
                for mb in mbs:
                    logp, entropy, values = self.forward(self.model, mb, False)
                    mb.old_logp = logp
                    if mb.unsampled is not None:  # the mask ablation: on-policy by fiat
                        unsampled = mb.unsampled.bool()
                        mb.sampling_logprobs = torch.where(unsampled, logp, mb.sampling_logprobs)
                    mb.old_entropy = entropy
                    mb.old_values = values
                    if self.lc.needs_reference:
                        assert self.reference is not None
                        with self.reference() as ref:
                            mb.ref_logp = self.forward(ref, mb, False)[0]

    def _is_weights(
        self, samples: list[Sample], plan: list[list[MicroBatch]], sums: dict[str, float]
    ) -> torch.Tensor:
        """IS weights per micro-batch (``algorithm.is_mode``, fixed for the step), the mismatch
        sums of this rank's tokens, and the sketch of their IS weights (for the step's
        quantiles; :func:`learner.mismatch.weight_sketch`)."""
        sketch = weight_sketch(torch.zeros(0))
        for mbs in plan:
            for mb in mbs:
                if not mb.rows:
                    continue
                assert mb.old_logp is not None and mb.old_entropy is not None
                tok = mb.mask
                correction = importance_weights(
                    self.lc.algorithm, mb.old_logp, mb.sampling_logprobs, tok
                )
                mb.is_weights = correction.weights if correction is not None else None
                lags = [samples[r].staleness for r in mb.rows]
                mb_sums, mb_sketch = mismatch_sums(
                    mb.old_logp, mb.sampling_logprobs, tok, correction, lags
                )
                for k, v in mb_sums.items():
                    sums[k] += v
                sketch += mb_sketch
                sums["old_entropy"] += float((mb.old_entropy * tok).sum())
        return sketch

    def _updates(
        self,
        samples: list[Sample],
        minis: list[list[int]],
        plan: list[list[MicroBatch]],
        sums: dict[str, float],
        *,
        epochs: int,
        step: bool,
    ) -> tuple[float, float, float, list[float], list[float]]:
        """``epochs`` × mini-batches × micro-batches of forward → objective → backward, an
        optimizer step per mini-batch when ``step``. Returns forward/backward/optimizer seconds,
        the loss of every update and every optimizer step's gradient norm (before clipping)."""
        lc, algo = self.lc, self.lc.algorithm
        world = world_size()
        t_fwd = t_bwd = t_opt = 0.0
        update_losses: list[float] = []
        grad_norms: list[float] = []
        for epoch in range(epochs):
            for rows, mbs in zip(minis, plan, strict=True):
                norm = normalizer(samples, rows, algo.agg)
                loss_sum = 0.0
                for mb in mbs:
                    t0 = time.perf_counter()
                    collect = self.collector if epoch == 0 and mb.rows else None
                    with collect.watch(mb) if collect is not None else nullcontext():
                        logp, entropy, values = self.forward(self.model, mb, algo.entropy_coef > 0)
                    if not mb.rows:  # a dummy keeps this rank in step with the others
                        loss = logp.sum() * 0.0 + (
                            values.sum() * 0.0 if values is not None else 0.0
                        )
                        t1 = time.perf_counter()
                        (loss * world).backward()
                        t_fwd += t1 - t0
                        t_bwd += time.perf_counter() - t1
                        continue
                    assert mb.old_logp is not None and mb.advantages is not None
                    out = rl_objective(
                        ObjectiveInputs(
                            logp=logp,
                            old_logp=mb.old_logp,
                            advantages=mb.advantages,
                            mask=mb.mask,
                            entropy=entropy,
                            ref_logp=mb.ref_logp,
                            is_weights=mb.is_weights,
                            values=values,
                            old_values=mb.old_values,
                            returns=mb.returns,
                            group_tokens=mb.group_tokens,
                        ),
                        algo,
                        lc.critic,
                        normalizer=norm,
                    )
                    if collect is not None:
                        collect.track(logp, mb, norm, world)
                    t1 = time.perf_counter()
                    # FSDP averages gradients over ranks; the loss is already normalised by the
                    # whole mini-batch, so scale back up to get the sum.
                    (out.loss * world).backward()
                    t2 = time.perf_counter()
                    t_fwd += t1 - t0
                    t_bwd += t2 - t1
                    ntok = float(mb.mask.sum())
                    loss_sum += float(out.loss.detach())
                    sums["policy_loss_x"] += float(out.policy_loss)
                    sums["entropy"] += float((entropy.detach() * mb.mask).sum())
                    if out.kl_sum is not None:
                        sums["kl"] += float(out.kl_sum)
                    if out.value_loss is not None:
                        sums["value_loss"] += float(out.value_loss)
                    for k, v in out.metrics.items():
                        if torch.is_tensor(v) and v.numel() == 1:
                            sums[f"m:{k}"] += float(v) * ntok
                            sums[f"w:{k}"] += ntok
                if step:
                    assert self.optimizer is not None, "RLStep needs an optimizer to update"
                    t0 = time.perf_counter()
                    grad_norms.append(clip_and_step(self.model, self.optimizer, lc.optim.grad_clip))
                    t_opt += time.perf_counter() - t0
                update_losses.append(all_reduce_sum([loss_sum])[0])
        return t_fwd, t_bwd, t_opt, update_losses, grad_norms

    def _equal_rewards(self, samples: list[Sample]) -> dict[str, Any]:
        """Track steps whose rewards (as scored, before any shaping) were all equal — all 0 or
        all 1: no group has a signal, often an answer format the reward service cannot read.
        Every ``learner.equal_reward_warn_steps`` such steps in a row: a warning, counted
        (``equal_reward_warning`` in the step record feeds the metric and the dashboard)."""
        rewards = [s.reward for s in samples]
        equal = bool(rewards) and max(rewards) == min(rewards)
        self.equal_reward_streak = self.equal_reward_streak + 1 if equal else 0
        k = self.lc.equal_reward_warn_steps
        warn = bool(k) and equal and self.equal_reward_streak % k == 0
        if warn and (not dist.is_initialized() or dist.get_rank() == 0):
            message = (
                f"{self.equal_reward_streak} train steps in a row with every reward "
                f"{rewards[0]:g}: no learning signal. Check that the reward service scores this "
                "data (reward.routes for its data_source, the answer format the prompts ask for)"
            )
            if self.notices is not None:
                self.notices.warn(log, "no_signal", message)
            else:
                log.warning("%s", message)
        return {
            "rewards_all_equal": equal,
            "equal_reward_streak": self.equal_reward_streak,
            "equal_reward_warning": warn,
        }
