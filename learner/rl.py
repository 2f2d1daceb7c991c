"""The RL mode: train on trajectory groups from the Redis Stream.

Stream reading: **rank 0 reads and broadcasts** the whole batch (token ids, sampling log-probs,
rewards) to every rank; each rank then trains on a contiguous share of every mini-batch. Broadcasting
the whole batch (rather than scattering shares) costs little — it is token ids — and lets every
rank compute group advantages and the loss denominators of the whole mini-batch itself, so the
loss of 2 ranks equals the loss of 1 rank on the same batch. Only rank 0 talks to Redis.

One train step:

1. batch start, no grad: old log-probs of every response under the current weights (the rollout's
   sampling log-probs are kept for the importance weight of ``algorithm.is_mode`` — by default the
   truncated min(exp(old − sampling), cap) — and the step's mismatch figures), reference
   log-probs when a KL term is on, values when there is a critic;
2. rewards (+ DAPO overlong shaping) → advantages through ``ADVANTAGE_ESTIMATORS`` over the whole
   batch (values and KL-in-reward gathered from the ranks first; group statistics over episodes,
   a forked episode's segments counted once);
3. ``ppo_epochs`` × mini-batches × micro-batches: forward, log-probs and entropy, DynaMO
   modulation (per micro-batch, as in the paper), ``POLICY_LOSSES[type]`` with the mini-batch's
   token (group, or sequence) count as the normaliser, + KL, − entropy bonus, + value loss;
   backward with gradient accumulation; then clip, AdamW step. With ``allocator.method: grad`` or
   the skip rule on, that pass also yields each prompt's gradient statistics, written to Redis
   after the step (``learner/grad_report.py``).
"""

from __future__ import annotations

import logging
import time
from collections import Counter, defaultdict
from contextlib import nullcontext
from typing import Any

import torch
import torch.distributed as dist

from dynamo_rl.codec import oldest_version
from dynamo_rl.config import ExperimentConfig
from dynamo_rl.contracts import gradstats
from dynamo_rl.contracts.stream import TrajectoryReader
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
    samples_from_groups,
    scale_by_temperature,
    to_rows,
    uniform_group,
)
from learner.dist import all_gather_object, all_reduce_sum, all_reduce_tensor, broadcast_object
from learner.grad_report import GradStatsCollector, step_fields
from learner.model import PolicyModel
from learner.objective import (
    ObjectiveInputs,
    importance_weights,
    kl_shaped_token_rewards,
    loss_aggregation,
    mismatch_record,
    mismatch_sums,
    rl_objective,
    weight_sketch,
)
from learner.trainer import Trainer

log = logging.getLogger(__name__)

HEARTBEAT_S = 30.0  # rank 0 tells waiting ranks "still waiting" this often (gloo timeouts)
CATCH_UP_S = 5.0
"""While it waits for groups, rank 0 looks this often for engines behind the last push (restarted
ones): the workers wait for them (``rollout.max_staleness``), so the learner pushes to them again
rather than wait for a step that needs their groups."""


def policy_forward(
    model: PolicyModel, mb: MicroBatch, entropy_grad: bool = False
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


class RLTrainer(Trainer):
    def __init__(self, cfg: ExperimentConfig) -> None:
        super().__init__(cfg)
        algo = self.lc.algorithm
        adv = algo.advantage
        self.adv_name = getattr(adv, "registry_name", adv.type)
        self.estimator = A.ADVANTAGE_ESTIMATORS[self.adv_name]
        self.agg = loss_aggregation(algo)
        if self.lc.needs_reference:
            self.load_reference()
        self.kl_ctl = AdaptiveKL(algo.kl.in_reward_coef, algo.kl.target, algo.kl.horizon)
        self.reader: TrajectoryReader | None = None
        self.uncommitted: list[str] = []  # stream ids consumed since the last checkpoint
        self.committed_ids: list[str] = []  # ids of the checkpoint we resumed from
        self.stop_after_batch = False
        self.equal_reward_streak = 0  # steps in a row whose rewards were all equal
        # The allocator's grad method and skip rule read the learner's gradient statistics.
        wants = cfg.allocator.method == "grad" or cfg.allocator.skip_after > 0
        self.grad_stats = GradStatsCollector(self.model) if wants else None

    # --- checkpoint hooks --------------------------------------------------------------------

    def extra_state(self) -> dict[str, Any]:
        return {"consumed": list(self.uncommitted), "kl_beta": self.kl_ctl.beta}

    def load_extra_state(self, state: dict[str, Any]) -> None:
        self.committed_ids = list(state.get("consumed", []))
        if "kl_beta" in state:
            self.kl_ctl.beta = float(state["kl_beta"])
        if self.env.is_main:
            self.reader = TrajectoryReader(
                self.redis,
                self.namespace,
                vocab_size=self.vocab_size,
                max_seq_len=self.lc.max_seq_len,
                on_dead_letter=lambda _id, _reason: (
                    self.metrics.dead_letters.inc() if self.metrics else None
                ),
            )
            self.reader.setup(committed=self.committed_ids)

    def on_commit(self) -> None:
        # The checkpoint holding these steps is on disk: now they may leave the pending list.
        if self.env.is_main and self.reader is not None and self.uncommitted:
            self.reader.ack(self.uncommitted)
        self.uncommitted = []

    # --- reading -----------------------------------------------------------------------------

    def next_batch(self) -> dict[str, Any] | None:
        if self.stop_after_batch:
            return None
        if self.env.is_main:
            msg = self._read_batch()
            broadcast_object(msg)
        else:
            while True:
                msg = broadcast_object(None)
                if msg["kind"] == "push":
                    self.push()
                elif msg["kind"] != "wait":
                    break
        if msg["kind"] == "stop":
            return None
        self.stop_after_batch = bool(msg.get("last"))
        return msg

    def _read_batch(self) -> dict[str, Any]:
        """Rank 0: fill a batch of ``train_batch_size`` groups (DAPO filter, staleness filter)."""
        assert self.reader is not None and self.metrics is not None
        lc, algo = self.lc, self.lc.algorithm
        need = lc.train_batch_size
        kept: list[Any] = []
        consumed: list[str] = []
        skipped: dict[str, int] = defaultdict(int)
        reads = 0
        last_arrival = last_beat = last_look = time.monotonic()
        timed_out = False
        while len(kept) < need:
            entries = self.reader.read(need - len(kept), lc.stream.block_ms)
            now = time.monotonic()
            if not entries:
                wait = lc.stream.wait_timeout_s
                if wait is not None and now - last_arrival > wait:
                    timed_out = True
                    break
                if self.lc.push.every and now - last_look > CATCH_UP_S:
                    last_look = now
                    behind = self.engines_behind()
                    if behind:
                        log.warning("engines behind weight version %d (restarted?): %s; pushing "
                                    "it again", self.weight_version, ", ".join(behind))  # fmt: skip
                        if dist.get_world_size() > 1:
                            broadcast_object({"kind": "push"})
                        self.push()
                        last_beat = time.monotonic()
                if now - last_beat > HEARTBEAT_S and dist.get_world_size() > 1:
                    broadcast_object({"kind": "wait"})
                    last_beat = now
                continue
            last_arrival = now
            for e in entries:
                consumed.append(e.entry_id)
                g = e.group
                # The bound holds for every token: a response that spans updates counts from
                # its oldest token.
                stale = self.weight_version - oldest_version(g)
                if lc.stream.max_staleness is not None and stale > lc.stream.max_staleness:
                    skipped["stale"] += 1
                    continue
                if algo.dapo.dynamic_sampling and uniform_group(g):
                    skipped["uniform_reward"] += 1
                    continue
                kept.append(g)
            reads += 1
            if algo.dapo.dynamic_sampling and reads >= algo.dapo.max_reads and kept:
                log.warning(
                    "dynamic sampling kept %d of %d groups after %d reads; training on them",
                    len(kept),
                    need,
                    reads,
                )
                break
        for reason, n in skipped.items():
            self.metrics.skipped.labels(reason).inc(n)
        # Skipped groups count as consumed: they are acknowledged with this step's checkpoint.
        self.uncommitted.extend(consumed)
        if not kept:
            return {"kind": "stop"}
        samples = samples_from_groups(
            kept, self.weight_version, self.lc.algorithm.train_observations
        )
        return {
            "kind": "batch",
            "samples": samples,
            "groups": len(kept),
            "skipped": sum(skipped.values()),
            "entry_ids": consumed,
            "prompt_ids": [g.prompt_id for g in kept],
            "last": timed_out,
        }

    # --- training ----------------------------------------------------------------------------

    def _forward(
        self, model: PolicyModel, mb: MicroBatch, entropy_grad: bool = False
    ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor | None]:
        return policy_forward(model, mb, entropy_grad)

    def train_step(self, batch: dict[str, Any]) -> dict[str, Any]:
        """plan → old/ref forward → advantages → per micro-batch: forward → objective → backward
        → per mini-batch: optimizer step."""
        lc, algo = self.lc, self.lc.algorithm
        samples: list[Sample] = batch["samples"]
        t_start = time.perf_counter()
        minis, plan = self._plan(samples)
        self._old_pass(plan)
        t_forward = time.perf_counter() - t_start
        rewards, lengths, kl_in_reward = self._advantages(samples, plan)
        sums: dict[str, float] = defaultdict(float)  # token-weighted metric sums, this rank
        is_sketch = self._is_weights(samples, plan, sums)
        if self.grad_stats is not None:
            self.grad_stats.reset()
        t_fwd, t_bwd, t_opt, update_losses, grad_norm = self._updates(samples, minis, plan, sums)
        grad_record = self._report_grad_stats(samples, batch.get("prompt_ids") or [])

        # Metrics: sums over ranks (the key set differs per rank: gather the dicts).
        totals: dict[str, float] = defaultdict(float)
        for part in all_gather_object(dict(sums)):
            for k, v in part.items():
                totals[k] += v
        is_sketch = all_reduce_tensor(is_sketch)
        n = len(samples)
        updates = lc.ppo_epochs * len(minis)
        tokens = max(totals["tokens"], 1.0)
        record: dict[str, Any] = {
            "loss": sum(update_losses) / len(update_losses),
            "update_losses": update_losses,
            "policy_loss": totals["policy_loss_x"] / updates,
            "grad_norm": grad_norm,
            "lr": self.scheduler.get_last_lr()[0],
            "entropy": totals["old_entropy"] / tokens,
            **mismatch_record(totals, is_sketch),
            "groups": batch["groups"],
            "groups_skipped": batch["skipped"],
            # Stream ids this step consumed (trained or skipped): exactly-once is checkable.
            "entry_ids": batch.get("entry_ids", []),
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
        record |= episode_stats(samples) | grad_record
        if algo.kl.coef > 0:
            record["kl"] = totals["kl"] / tokens / lc.ppo_epochs
        if self.kl_ctl.beta > 0:
            record["kl_in_reward"] = kl_in_reward
            record["kl_beta"] = self.kl_ctl.beta
            self.kl_ctl.update(kl_in_reward, n)
        if lc.critic.enabled:
            record["value_loss"] = totals["value_loss"] / max(1, updates)
        for k in totals:
            if k.startswith("m:"):
                name = k[2:]
                record[_METRIC_NAMES.get(name, name)] = totals[k] / max(totals[f"w:{name}"], 1.0)
        elapsed = time.perf_counter() - t_start
        record["tokens_per_second"] = totals["tokens"] * lc.ppo_epochs / max(elapsed, 1e-9)
        record.update(self._equal_rewards(samples))
        return record

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
        if warn and self.env.is_main:
            self.notices.warn(
                log, "no_signal",
                f"{self.equal_reward_streak} train steps in a row with every reward "
                f"{rewards[0]:g}: no learning signal. Check that the reward service scores this "
                "data (reward.routes for its data_source, the answer format the prompts ask for)",
            )  # fmt: skip
        return {
            "rewards_all_equal": equal,
            "equal_reward_streak": self.equal_reward_streak,
            "equal_reward_warning": warn,
        }

    def _plan(self, samples: list[Sample]) -> tuple[list[list[int]], list[list[MicroBatch]]]:
        """Mini-batches (row indices of whole groups) and this rank's micro-batches of each."""
        lc, env = self.lc, self.env
        minis = mini_batches(samples, lc.mini_batch_size or lc.train_batch_size)
        # prompt-mean weighs each row by 1 / its group's token count; a mini-batch holds its
        # groups whole, so the whole batch's count is the mini-batch's (and every rank's).
        group_tokens: dict[int, int] = defaultdict(int)
        for s in samples:
            group_tokens[s.group] += s.model_tokens
        plan: list[list[MicroBatch]] = []
        for rows in minis:
            mine = rank_share(rows, env.rank, env.world_size)
            splits = micro_splits(
                mine, lc.micro_batch_size, num_micro(rows, env.world_size, lc.micro_batch_size)
            )
            mbs = [collate(samples, s, self.pad_id) for s in splits]
            for mb in mbs:
                if mb.rows:
                    mb.extra["group_tokens"] = torch.tensor(
                        [float(group_tokens[samples[i].group]) for i in mb.rows]
                    )
            plan.append([mb.to(env.device) for mb in mbs])
        return minis, plan

    def _old_pass(self, plan: list[list[MicroBatch]]) -> None:
        """Old (and reference) log-probs and values under the weights at batch start."""
        with torch.no_grad():
            for mbs in plan:
                for mb in mbs:
                    logp, entropy, values = self._forward(self.model, mb)
                    mb.extra["old_logp"] = logp
                    if "unsampled" in mb.extra:  # the mask ablation: on-policy by fiat
                        unsampled = mb.extra["unsampled"].bool()
                        mb.sampling_logprobs = torch.where(unsampled, logp, mb.sampling_logprobs)
                    mb.extra["old_entropy"] = entropy
                    if values is not None:
                        mb.extra["old_values"] = values
                    if self.lc.needs_reference:
                        with self.as_reference() as ref:
                            mb.extra["ref_logp"] = self._forward(ref, mb)[0]

    def _advantages(
        self, samples: list[Sample], plan: list[list[MicroBatch]]
    ) -> tuple[torch.Tensor, torch.Tensor, float]:
        """Advantages and returns over the whole batch (identical on every rank), stored per
        micro-batch; returns the (shaped) rewards, response lengths and the KL in the reward."""
        lc, algo, env = self.lc, self.lc.algorithm, self.env
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
        if lc.critic.enabled or self.kl_ctl.beta > 0:  # the same decision on every rank
            gathered = self._gather_rows(plan)
            if lc.critic.enabled:
                values_full = to_rows([gathered[i]["values"] for i in range(n)], t_len)
            if self.kl_ctl.beta > 0:
                kl_tok = to_rows([gathered[i]["kl"] for i in range(n)], t_len)
                kl_in_reward = float((kl_tok * mask).sum() / mask.sum().clamp(min=1))
                if token_rewards is None:
                    token_rewards = kl_shaped_token_rewards(rewards, mask, kl_tok, self.kl_ctl.beta)
                else:
                    token_rewards = token_rewards - self.kl_ctl.beta * kl_tok
        adv_kwargs: dict[str, Any] = {}
        if hasattr(algo.advantage, "gamma"):
            adv_kwargs["gamma"] = algo.advantage.gamma
        if hasattr(algo.advantage, "lam"):
            adv_kwargs["lam"] = algo.advantage.lam
        advantages, returns = self.estimator(
            rewards=rewards,
            mask=mask,
            group_ids=group_ids,
            episode_ids=episodes,
            token_rewards=token_rewards,
            values=values_full,
            **adv_kwargs,
        )
        advantages, returns = advantages.to(env.device), returns.to(env.device)
        for mbs in plan:
            for mb in mbs:
                if mb.rows:
                    rows = torch.tensor(mb.rows, device=env.device)
                    mb.extra["advantages"] = advantages[rows, : mb.response_len]
                    mb.extra["returns"] = returns[rows, : mb.response_len]
        return rewards, lengths, kl_in_reward

    def _is_weights(
        self, samples: list[Sample], plan: list[list[MicroBatch]], sums: dict[str, float]
    ) -> torch.Tensor:
        """IS weights per micro-batch (``learner.algorithm.is_mode``, fixed for the step), the
        mismatch sums of this rank's tokens, and the sketch of their IS weights (for the step's
        quantiles; :func:`learner.objective.weight_sketch`)."""
        sketch = weight_sketch(torch.zeros(0))
        for mbs in plan:
            for mb in mbs:
                if not mb.rows:
                    continue
                tok = mb.mask
                old = mb.extra["old_logp"]
                correction = importance_weights(self.lc.algorithm, old, mb.sampling_logprobs, tok)
                if correction is not None:
                    mb.extra["is_weights"] = correction.weights
                lags = [samples[r].staleness for r in mb.rows]
                mb_sums, mb_sketch = mismatch_sums(old, mb.sampling_logprobs, tok, correction, lags)
                for k, v in mb_sums.items():
                    sums[k] += v
                sketch += mb_sketch
                sums["old_entropy"] += float((mb.extra["old_entropy"] * tok).sum())
        return sketch

    def _updates(
        self,
        samples: list[Sample],
        minis: list[list[int]],
        plan: list[list[MicroBatch]],
        sums: dict[str, float],
    ) -> tuple[float, float, float, list[float], float]:
        """``ppo_epochs`` × mini-batches × micro-batches of forward → objective → backward, an
        optimizer step per mini-batch. Returns forward/backward/optimizer seconds, the loss of
        every update and the last gradient norm."""
        lc, algo, env = self.lc, self.lc.algorithm, self.env
        t_fwd = t_bwd = t_opt = 0.0
        update_losses: list[float] = []
        grad_norm = 0.0
        for _epoch in range(lc.ppo_epochs):
            for rows, mbs in zip(minis, plan, strict=True):
                norm = self._normalizer(samples, rows)
                loss_sum = 0.0
                for mb in mbs:
                    t0 = time.perf_counter()
                    collect = self.grad_stats if _epoch == 0 and mb.rows else None
                    with collect.watch(mb) if collect is not None else nullcontext():
                        logp, entropy, values = self._forward(
                            self.model, mb, entropy_grad=algo.entropy_coef > 0
                        )
                    if not mb.rows:  # a dummy keeps this rank in step with the others
                        loss = logp.sum() * 0.0 + (
                            values.sum() * 0.0 if values is not None else 0.0
                        )
                        t1 = time.perf_counter()
                        (loss * env.world_size).backward()
                        t_fwd += t1 - t0
                        t_bwd += time.perf_counter() - t1
                        continue
                    out = rl_objective(
                        ObjectiveInputs(
                            logp=logp,
                            old_logp=mb.extra["old_logp"],
                            advantages=mb.extra["advantages"],
                            mask=mb.mask,
                            entropy=entropy,
                            ref_logp=mb.extra.get("ref_logp"),
                            is_weights=mb.extra.get("is_weights"),
                            values=values,
                            old_values=mb.extra.get("old_values"),
                            returns=mb.extra["returns"],
                            group_tokens=mb.extra.get("group_tokens"),
                        ),
                        algo,
                        lc.critic,
                        normalizer=norm,
                    )
                    if collect is not None:
                        collect.track(logp, mb, norm, env.world_size)
                    t1 = time.perf_counter()
                    # FSDP averages gradients over ranks; the loss is already normalised by the
                    # whole mini-batch, so scale back up to get the sum.
                    (out.loss * env.world_size).backward()
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
                t0 = time.perf_counter()
                grad_norm = self.optimizer_step()
                t_opt += time.perf_counter() - t0
                update_losses.append(all_reduce_sum([loss_sum])[0])
        return t_fwd, t_bwd, t_opt, update_losses, grad_norm

    def _report_grad_stats(self, samples: list[Sample], prompt_ids: list[str]) -> dict[str, Any]:
        """Collective: each prompt's gradient statistics of this step, written by rank 0 to Redis
        (``dynamo_rl.contracts.gradstats``) at the current weight version; step-record fields."""
        if self.grad_stats is None or not prompt_ids:
            return {}
        records = self.grad_stats.records(samples, prompt_ids)
        t0 = time.perf_counter()
        if self.env.is_main and self.redis is not None and records:
            gradstats.write(self.redis, self.namespace, self.weight_version, records)
        size = Counter(prompt_ids[s.group] for s in samples)
        fields = step_fields(records, [size[r.prompt_id] for r in records])
        return fields | {"time_grad_stats": self.grad_stats.seconds + time.perf_counter() - t0}

    def _normalizer(self, samples: list[Sample], rows: list[int]) -> float:
        """The mini-batch's denominator: valid tokens (token-mean), groups with a token
        (prompt-mean) or rows with a token."""
        if self.agg == "token-mean":
            return float(max(1, sum(samples[i].model_tokens for i in rows)))
        if self.agg == "prompt-mean":
            return float(max(1, len({samples[i].group for i in rows if samples[i].response})))
        return float(max(1, sum(1 for i in rows if samples[i].response)))

    def _gather_rows(self, plan: list[list[MicroBatch]]) -> dict[int, dict[str, list[float]]]:
        """Per-row values and old−ref log-ratio from every rank (batch-level estimators)."""
        mine: dict[int, dict[str, list[float]]] = {}
        for mbs in plan:
            for mb in mbs:
                for j, row in enumerate(mb.rows):
                    valid = mb.mask[j].nonzero()  # interior zeros: observation tokens
                    length = int(valid[-1]) + 1 if len(valid) else 0
                    item: dict[str, list[float]] = {}
                    if "old_values" in mb.extra:
                        item["values"] = mb.extra["old_values"][j, :length].tolist()
                    if "ref_logp" in mb.extra:
                        d = mb.extra["old_logp"][j, :length] - mb.extra["ref_logp"][j, :length]
                        item["kl"] = d.tolist()
                    mine[row] = item
        out: dict[int, dict[str, list[float]]] = {}
        for part in all_gather_object(mine):
            out.update(part)
        return out


# Algorithm metric names → step-record names (the Prometheus gauges use the record names).
_METRIC_NAMES = {
    "clipfrac_upper": "clip_frac_upper",
    "clipfrac_lower": "clip_frac_lower",
    "clipfrac_dual": "clip_frac_dual",
}
