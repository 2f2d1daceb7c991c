"""What every learner mode shares: the process group, the FSDP2 policy, AdamW and its schedule,
checkpoints with auto-resume, the Hugging Face export, the weight push and the step log.

A mode (``learner.rl.RLTrainer``; ``learner.offline``'s ``SFTTrainer`` and ``DPOTrainer``)
subclasses :class:`Trainer` and supplies ``next_batch`` and ``train_step``; :meth:`Trainer.run` owns the loop::

    resume → [push if resumed] → loop { next_batch → train_step → step += 1
             → checkpoint every k (then on_commit) → push every k → log } → final checkpoint+export

``on_commit`` is where a mode makes its input consumption durable (the RL mode acknowledges the
stream entries of the committed steps there).
"""

from __future__ import annotations

import contextlib
import functools
import logging
import math
import random
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import numpy as np
import torch
import torch.distributed as dist

from dynamo_rl import keys
from dynamo_rl.config import ExperimentConfig
from dynamo_rl.contracts.step_allocation import StepAllocation
from dynamo_rl.contracts.weight_control import WeightControlError, weight_protocol
from dynamo_rl.notices import Notices
from learner.adapter_push import AdapterPush
from learner.checkpoint import CheckpointManager
from learner.dist import DistEnv, broadcast_object, init_distributed
from learner.lora import (
    adapter_tensors,
    adapters_disabled,
    add_adapters,
    merge_adapters,
    write_adapter,
)
from learner.metrics import LearnerMetrics
from learner.model import (
    PolicyModel,
    compute_dtype,
    export_hf,
    full_policy_state,
    load_policy,
    shard,
)
from learner.push import (
    DiskPush,
    DistributedPush,
    PushResult,
    WeightTransport,
    discover_engines,
)
from learner.step import adamw, clip_and_step
from learner.steplog import StepLog

log = logging.getLogger(__name__)


def lr_factor(step: int, warmup: int, schedule: str, total: int | None, floor: float) -> float:
    """Multiplier of the base lr at ``step`` (0-based train steps)."""
    if warmup and step < warmup:
        return (step + 1) / warmup
    if schedule == "constant" or total is None:
        return 1.0
    progress = min(1.0, (step - warmup) / max(1, total - warmup))
    return floor + (1.0 - floor) * 0.5 * (1.0 + math.cos(math.pi * progress))


def warn_left_out(notices: Notices, result: PushResult, version: int) -> None:
    """A warning for the user per engine a successful push left out (pushed to the others; those
    catch up at the next push)."""
    for url in result.failed:
        notices.warn(log, "engine_left_out", f"engine {url} left out of the weight push of "
                     f"version {version}: {result.error}", url)  # fmt: skip


class Trainer:
    """The shared machinery; subclasses implement ``next_batch`` and ``train_step``."""

    def __init__(self, cfg: ExperimentConfig) -> None:
        self.cfg = cfg
        self.lc = cfg.learner
        self.env: DistEnv = init_distributed(timeout_s=max(1800.0, self.lc.push.timeout_s))
        self.namespace = cfg.run.name
        self.run_dir = Path(cfg.run.run_dir)
        self._seed(cfg.run.seed)
        assert self.lc.model is not None  # checked by the command line before torch
        self.dtype = compute_dtype(self.lc.dtype, self.env.device)
        policy = load_policy(self.lc.model, value_head=self.lc.critic.enabled)
        # LoRA: adapters injected before sharding; only they (and a value head) will train.
        self.lora = self.lc.lora if self.lc.lora.enabled else None
        if self.lora is not None:
            add_adapters(policy.lm, self.lora, self.lc.model)
        self.hf_config = policy.lm.config
        self.vocab_size = int(policy.lm.get_input_embeddings().weight.shape[0])
        self.pad_id = _pad_id(self.hf_config)
        self.model: PolicyModel = shard(policy, self.env.device, self.dtype)
        self.ref: PolicyModel | None = None
        self.model.train()
        o = self.lc.optim
        self.optimizer = adamw(self.model, self.lc)
        total = o.total_steps or self.lc.max_steps
        self.scheduler = torch.optim.lr_scheduler.LambdaLR(
            self.optimizer,
            lambda s: lr_factor(s, o.warmup_steps, o.schedule, total, o.min_lr_ratio),
        )
        ck = self.lc.checkpoint
        self.ckpt = CheckpointManager(
            ck.dir or self.run_dir / "checkpoints", keep=ck.keep, trainable_only=bool(self.lora)
        )
        self.step = 0
        self.weight_version = 0
        self.checkpoints_written = 0
        self.redis: Any = None
        self.metrics: LearnerMetrics | None = None
        self.steplog: StepLog | None = None
        # Warnings the user must act on, also in the run folder (written by rank 0).
        self.notices = Notices(self.run_dir, "learner")
        if self.env.is_main:
            from dynamo_rl.redis_client import sync_client

            # A Redis restart (minutes at most) is waited out, reconnecting, rather than fatal:
            # every call the learner makes is safe to repeat (XACK, SET; an XREADGROUP whose reply
            # was lost left its entries pending, which the reader takes back). The socket
            # waits out a blocking XREADGROUP (stream.block_ms) on top of the command timeout.
            self.redis = sync_client(
                cfg.endpoints.redis_url, block_s=self.lc.stream.block_ms / 1000, retries=40
            )
            self.metrics = LearnerMetrics()
            if self.lc.metrics_port is not None:
                port = self.metrics.metrics.serve(self.lc.metrics_port, self.lc.metrics_host)
                log.info("metrics on :%d/metrics", port)
            trackers = None
            if self.lc.trackers:
                from dynamo_rl.trackers import Trackers

                config = cfg.model_dump(mode="json", exclude={"endpoints": {"control_token"}})
                config["endpoints"].pop("redis_url", None)  # may hold a password
                trackers = Trackers(
                    self.lc.trackers, self.run_dir, cfg.run.name, config, self.lc.wandb
                )
            self.steplog = StepLog(self.run_dir / "metrics.jsonl", trackers)
            self.metrics.metrics.record_run(cfg.run, "0")
        self.transport = self._make_transport()

    # --- the reference policy (KL terms, DPO) ------------------------------------------------

    def load_reference(self) -> None:
        """A frozen copy of the start model, sharded like the policy; with LoRA none: the policy
        with its adapters disabled is the start model (:meth:`as_reference`)."""
        if self.lora is not None:
            return
        ref = load_policy(self.lc.model or "")
        for p in ref.parameters():
            p.requires_grad_(False)
        self.ref = shard(ref, self.env.device, self.dtype)
        self.ref.eval()

    @contextlib.contextmanager
    def as_reference(self) -> Iterator[PolicyModel]:
        """The model to run as the reference policy (call under ``torch.no_grad``)."""
        if self.ref is not None:
            yield self.ref
            return
        with adapters_disabled(self.model):
            yield self.model

    # --- hooks -------------------------------------------------------------------------------

    def next_batch(self) -> Any | None:
        """Collective: the next batch on every rank, or None to stop."""
        raise NotImplementedError

    def train_step(self, batch: Any) -> dict[str, Any]:
        """Collective: one train step on ``batch``; returns the step record (metrics)."""
        raise NotImplementedError

    def extra_state(self) -> dict[str, Any]:
        """Mode state saved with a checkpoint (rank 0's view)."""
        return {}

    def load_extra_state(self, state: dict[str, Any]) -> None:
        """Restore what ``extra_state`` saved (every rank)."""

    def on_commit(self) -> None:
        """Called on every rank after a checkpoint is committed."""

    # --- the loop ----------------------------------------------------------------------------

    def run(self) -> int:
        resumed = self.resume()
        if resumed and self.lc.push.every:
            self.push()
        since_ckpt = 0
        while self.lc.max_steps is None or self.step < self.lc.max_steps:
            t0 = time.perf_counter()
            batch = self.next_batch()
            t_read = time.perf_counter() - t0
            if batch is None:
                break
            record = self.train_step(batch)
            self.step += 1
            since_ckpt += 1
            self.scheduler.step()
            record["time_read"] = t_read
            if self.step % self.lc.checkpoint.every == 0:
                t = time.perf_counter()
                self.save_checkpoint()
                record["time_checkpoint"] = time.perf_counter() - t
                since_ckpt = 0
            if self.lc.push.every and self.step % self.lc.push.every == 0:
                t = time.perf_counter()
                result = self.push()
                record["time_push"] = time.perf_counter() - t
                if result is not None:
                    record["push_ok"] = result.ok
                    record["push_seconds"] = result.seconds
                    record["push_bytes"] = result.bytes
                    record["push_gb_per_s"] = result.gb_per_s
                    record["push_gather_seconds"] = result.gather_seconds
                    record["push_send_seconds"] = result.send_seconds
                    record["push_answer_seconds"] = result.answer_seconds
            record["step"] = self.step
            record["weight_version"] = self.weight_version
            record["time_step"] = time.perf_counter() - t0
            self.log_step(record)
        if since_ckpt:
            self.save_checkpoint()
        self.export(self.run_dir / "export" / "final")
        self.transport.close()
        if self.steplog is not None:
            self.steplog.close()
        if self.env.is_main:
            log.info("stopped after step %d", self.step)
        return 0

    # --- pieces ------------------------------------------------------------------------------

    def resume(self) -> bool:
        loaded = (
            self.ckpt.load_latest(self.model, self.optimizer) if self.lc.checkpoint.resume else None
        )
        if loaded is None:
            self.load_extra_state({})
            return False
        step, path, state = loaded
        self.step = int(state["step"])
        self.weight_version = int(state.get("weight_version", 0))
        self.scheduler.load_state_dict(state["scheduler"])
        self.load_extra_state(state.get("extra", {}))
        if self.env.is_main:
            log.info("resumed from %s (step %d)", path, step)
        return True

    def save_checkpoint(self) -> Path:
        state = {
            "step": self.step,
            "weight_version": self.weight_version,
            "scheduler": self.scheduler.state_dict(),
            "extra": self.extra_state(),
        }
        path = self.ckpt.save(self.step, self.model, self.optimizer, state)
        self.checkpoints_written += 1
        every = self.lc.checkpoint.export_every
        if every and self.checkpoints_written % every == 0:
            self.export(self.run_dir / "export" / f"step_{self.step:06d}")
        self.on_commit()
        return path

    def export(self, out: Path) -> Path | None:
        """Collective: gather the full policy and write it as an HF folder on rank 0. With LoRA:
        the adapters alone, as a peft adapter folder (and, with ``lora.merged_export``, the
        merged weights in its ``merged/``)."""
        if self.lora is not None:
            return self.export_adapter(out, merged=self.lora.merged_export)
        state = full_policy_state(self.model)
        path = None
        if self.env.is_main:
            path = export_hf(state, self.hf_config, self.lc.model or "", out)
            log.info("exported %s", path)
        dist.barrier()
        return path

    def export_adapter(self, out: Path, merged: bool = False) -> Path | None:
        """Collective: the adapters as a peft folder on rank 0 (only they are gathered)."""
        assert self.lora is not None
        base = self.lc.model or ""
        tensors = adapter_tensors(full_policy_state(self.model, trainable_only=True))
        full = full_policy_state(self.model) if merged else {}
        path = None
        if self.env.is_main:
            path = write_adapter(tensors, self.lora, base, out)
            if merged:
                export_hf(merge_adapters(full, self.lora), self.hf_config, base, out / "merged")
            log.info("exported adapter %s", path)
        dist.barrier()
        return path

    def _make_transport(self) -> WeightTransport:
        token = self.cfg.endpoints.control_token
        headers = {"Authorization": f"Bearer {token.get_secret_value()}"} if token else {}
        p = self.lc.push
        rc = self.cfg.rollout
        protocol = weight_protocol(rc.weight_api, pause_mode=rc.push_pause_mode)
        if self.lora is not None:  # only the adapters move, whatever push.transport says
            return AdapterPush(self._adapter_for_push, prefix=self.lora.name, protocol=protocol,
                               timeout_s=p.timeout_s, headers=headers)  # fmt: skip
        disk = DiskPush(
            self._export_for_push, timeout_s=p.timeout_s, headers=headers, protocol=protocol
        )
        if p.transport == "disk":
            return disk
        # vLLM's weight-transfer API cannot load from disk: no fallback there.
        fallback = p.fallback_to_disk and rc.weight_api != "vllm"
        self._disk_fallback = disk if fallback else None
        return DistributedPush(
            protocol=protocol,
            master_address=p.master_address,
            bucket_mb=p.bucket_mb,
            timeout_s=p.timeout_s,
            silent_s=p.silent_s,
            stopped_s=p.stopped_s,
            pulse=self._pulse_reader(),
            headers=headers,
            device=self.env.device,
            group_prefix=f"dynamo-push-{self.namespace}",
        )

    def _pulse_reader(self) -> Callable[[str], int | None] | None:
        """Rank 0: an engine's pulse counter in Redis (a client of its own, no retries: a Redis
        outage makes the pulse unknown, never slows the heartbeat)."""
        if not self.env.is_main:
            return None
        from dynamo_rl.contracts.engine import read_pulse
        from dynamo_rl.redis_client import sync_client

        client = sync_client(self.cfg.endpoints.redis_url, timeout_s=2.0)
        return functools.partial(read_pulse, client, self.namespace)

    def _export_for_push(self, version: int) -> str | None:
        out = self.run_dir / "push" / f"version_{version:06d}"
        path = self.export(out)
        if self.env.is_main:  # keep the two newest: an engine may still be reading the older
            folders = sorted((self.run_dir / "push").glob("version_*"))
            for old in folders[:-2]:
                import shutil

                shutil.rmtree(old, ignore_errors=True)
        return str(path) if path else None

    def _adapter_for_push(self, version: int) -> str | None:
        path = self.export_adapter(self.run_dir / "push" / f"adapter_v{version:06d}")
        return str(path) if path else None

    def engines(self) -> list[str]:
        if not self.env.is_main:
            return []
        if self.lc.push.engines_from == "config":
            return list(self.cfg.endpoints.engine_urls)
        return discover_engines(self.redis, self.namespace)

    def engines_behind(self) -> list[str]:
        """Rank 0: the engines that answer with a weight version older than the last one pushed
        (restarted since, on the weights they were started with). Unreachable ones are not
        listed: a push could not reach them either."""
        if not self.weight_version:
            return []
        behind = []
        for url in self.engines():
            try:
                version = self.transport.served_version(url)
            except WeightControlError:
                continue
            if version < self.weight_version:
                behind.append(url)
        return behind

    def push(self) -> PushResult | None:
        """Collective: push the weights as version ``step``; bumps the version in Redis."""
        version = self.step
        engines = self.engines()
        # Every rank must agree to skip (the push is collective): no engine, no export either.
        if not broadcast_object(len(engines)):
            if self.env.is_main:
                log.warning("no engines registered (%s); push of version %d skipped",
                            self.lc.push.engines_from, version)  # fmt: skip
            self._count_push(self.transport.name, "no_engines")
            return None
        result = self.transport.push(self.model, version, engines)
        fallback = getattr(self, "_disk_fallback", None)
        if not result.ok and fallback is not None and self.transport is not fallback:
            if self.env.is_main:
                log.warning("distributed push failed (%s); falling back to disk", result.error)
            self._count_push(self.transport.name, "error")
            result = fallback.push(self.model, version, engines)
            self._count_push(fallback.name, "ok" if result.ok else "error")
        else:
            self._count_push(self.transport.name, "ok" if result.ok else "error")
        if result.ok:
            self.weight_version = version
            if self.env.is_main:
                self.redis.set(keys.weight_version_key(self.namespace), str(version))
                warn_left_out(self.notices, result, version)
        elif self.env.is_main:
            log.warning("weight push of version %d failed: %s", version, result.error)
        return result

    def _count_push(self, transport: str, outcome: str) -> None:
        if self.metrics is not None:
            self.metrics.pushes.labels(transport, outcome).inc()

    def log_step(self, record: dict[str, Any]) -> None:
        if not self.env.is_main:
            return
        assert self.metrics is not None and self.steplog is not None
        self.metrics.record_step(record)
        self.steplog.write(record)
        allocation = StepAllocation.from_record(record)  # RL steps from the stream only
        log.info(
            "step %d loss %.5f reward %.3f grad_norm %.4f time %.2fs%s",
            record["step"],
            record.get("loss", float("nan")),
            record.get("reward_mean", float("nan")),
            record.get("grad_norm", float("nan")),
            record.get("time_step", float("nan")),
            f" {allocation.line()}" if allocation is not None else "",
        )

    def optimizer_step(self) -> float:
        """Clip, step, zero; returns the global gradient norm before clipping."""
        return clip_and_step(self.model, self.optimizer, self.lc.optim.grad_clip)

    @staticmethod
    def _seed(seed: int) -> None:
        random.seed(seed)
        np.random.seed(seed)
        torch.manual_seed(seed)


def _pad_id(config: Any) -> int:
    for name in ("pad_token_id", "eos_token_id"):
        value = getattr(config, name, None)
        if isinstance(value, list):
            value = value[0] if value else None
        if value is not None:
            return int(value)
    return 0
