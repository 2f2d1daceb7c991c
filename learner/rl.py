"""The RL mode: train on trajectory groups from the Redis Stream.

:class:`RLTrainer` joins the two halves that live elsewhere: :class:`learner.stream_source.
StreamSource` reads batches of groups (rank 0 reads, filters and broadcasts; entries are
acknowledged only once a checkpoint holds the steps that consumed them), and
:class:`learner.step.RLStep` trains on them (plan → old pass → advantages → updates), the same
step every benchmark that trains runs. What is left here is the learner's own: the reference
policy, the checkpointed state (consumed stream ids, the adaptive KL coefficient) and writing each
prompt's gradient statistics to Redis for the allocator after the step.
"""

from __future__ import annotations

import logging
import time
from typing import Any

from dynamo_rl.config import ExperimentConfig
from dynamo_rl.contracts import gradstats
from dynamo_rl.contracts.stream import TrajectoryReader
from learner.step import RLBatch, RLStep
from learner.stream_source import StreamSource
from learner.trainer import Trainer

log = logging.getLogger(__name__)


class RLTrainer(Trainer):
    def __init__(self, cfg: ExperimentConfig) -> None:
        super().__init__(cfg)
        if self.lc.needs_reference:
            self.load_reference()
        # The allocator's grad method and skip rule read the learner's gradient statistics.
        wants = cfg.allocator.method == "grad" or cfg.allocator.skip_after > 0
        self.rl_step = RLStep(
            self.lc,
            self.model,
            self.optimizer,
            pad_id=self.pad_id,
            device=self.env.device,
            reference=self.as_reference if self.lc.needs_reference else None,
            grad_stats=wants,
            notices=self.notices,
        )
        self.source: StreamSource | None = None
        self.committed_ids: list[str] = []  # ids of the checkpoint we resumed from

    # --- checkpoint hooks --------------------------------------------------------------------

    def extra_state(self) -> dict[str, Any]:
        consumed = self.source.uncommitted if self.source is not None else []
        return {"consumed": list(consumed), "kl_beta": self.rl_step.kl_ctl.beta}

    def load_extra_state(self, state: dict[str, Any]) -> None:
        self.committed_ids = list(state.get("consumed", []))
        if "kl_beta" in state:
            self.rl_step.kl_ctl.beta = float(state["kl_beta"])
        reader = None
        if self.env.is_main:
            reader = TrajectoryReader(
                self.redis,
                self.namespace,
                vocab_size=self.vocab_size,
                max_seq_len=self.lc.max_seq_len,
                on_dead_letter=lambda _id, _reason: (
                    self.metrics.dead_letters.inc() if self.metrics else None
                ),
            )
            reader.setup(committed=self.committed_ids)
        self.source = StreamSource(
            self.lc,
            reader,
            weight_version=lambda: self.weight_version,
            push=self.push,
            engines_behind=self.engines_behind,
            metrics=self.metrics,
            uniform_n=self.cfg.allocator.n_per_prompt,
        )

    def on_commit(self) -> None:
        # The checkpoint holding these steps is on disk: now they may leave the pending list.
        if self.source is not None:
            self.source.commit()

    # --- the loop's hooks --------------------------------------------------------------------

    def next_batch(self) -> RLBatch | None:
        assert self.source is not None, "load_extra_state (resume) sets up the stream source"
        return self.source.next_batch()

    def train_step(self, batch: RLBatch) -> dict[str, Any]:
        result = self.rl_step(batch)
        record = result.record
        if result.grad_records and self.env.is_main and self.redis is not None:
            # At the current weight version: the allocator ages a statistic from it.
            t0 = time.perf_counter()
            gradstats.write(
                self.redis,
                self.namespace,
                self.weight_version,
                result.grad_records,
                half_life=self.cfg.allocator.stats_half_life,
            )
            record["time_grad_stats"] += time.perf_counter() - t0
        return record
