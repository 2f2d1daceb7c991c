"""The RL step's batches from the Redis Stream: reading, filters, the heartbeat, acknowledgement.

**Rank 0 reads and broadcasts** the whole batch (token ids, sampling log-probs, rewards) to every
rank; only rank 0 talks to Redis. Broadcasting the whole batch rather than scattering shares
costs little (it is token ids) and lets every rank compute the batch's advantages and loss
denominators itself (``learner/step.py``).

Rank 0 fills a batch of ``learner.train_batch_size`` groups:

- a group staler than ``learner.stream.max_staleness`` (counted from its oldest token) is
  skipped; under DAPO's dynamic sampling so is a group whose episodes all scored the same, and
  reading goes on until the batch is full or ``dapo.max_reads`` reads have passed;
- while no group arrives it tells the waiting ranks it is alive every ``HEARTBEAT_S`` (gloo
  timeouts), and every ``CATCH_UP_S`` it looks for engines behind the last push (restarted
  ones) and pushes to them again: the workers wait for those engines, so waiting for a step
  that needs their groups would wait for ever;
- ``learner.stream.wait_timeout_s`` without a group ends training after the batch in hand.

Skipped groups count as consumed. Nothing is acknowledged until the checkpoint holding the
steps that consumed it is on disk (:meth:`StreamSource.commit`): a crash replays, never loses.

The batch carries what its groups cost to generate (``RLBatch.generation``,
:class:`dynamo_rl.contracts.generation.StepGeneration`): the kept groups' own cost, and as
dropped the groups the filters skipped plus what the workers dropped before the stream, carried
on the entries this step consumed — exact figures, each dropped group counted once. It carries
too how its consumed groups were allocated against uniform n (``allocator.n_per_prompt``) and
how many prompts the allocator skipped, carried on the same entries (``RLBatch.allocation``,
:class:`dynamo_rl.contracts.step_allocation.StepAllocation`).
"""

from __future__ import annotations

import logging
import time
from collections import defaultdict
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from dynamo_rl.codec import oldest_version
from dynamo_rl.config.learner import LearnerConfig
from dynamo_rl.contracts.generation import StepGeneration, uniform_group
from dynamo_rl.contracts.step_allocation import StepAllocation
from dynamo_rl.contracts.stream import TrajectoryReader
from learner.batch import samples_from_groups
from learner.dist import broadcast_object, world_size
from learner.step import RLBatch

log = logging.getLogger(__name__)

HEARTBEAT_S = 30.0  # rank 0 tells waiting ranks "still waiting" this often (gloo timeouts)
CATCH_UP_S = 5.0
"""While it waits for groups, rank 0 looks this often for engines behind the last push (restarted
ones): the workers wait for them (``rollout.max_staleness``), so the learner pushes to them again
rather than wait for a step that needs their groups."""


@dataclass
class StreamSource:
    """Collective :meth:`next_batch` over the trajectory stream (``reader`` on rank 0, None on
    the others). ``weight_version`` is the learner's current version (staleness is counted from
    it); ``push`` is the collective weight push, ``engines_behind`` rank 0's list of engines
    behind the last one; ``metrics`` (rank 0) counts the skipped groups; ``uniform_n`` is
    ``allocator.n_per_prompt``, what each batch's allocation is told against (None: the
    batches carry no allocation)."""

    lc: LearnerConfig
    reader: TrajectoryReader | None
    weight_version: Callable[[], int]
    push: Callable[[], object]
    engines_behind: Callable[[], list[str]]
    metrics: Any = None
    uniform_n: int | None = None
    uncommitted: list[str] = field(default_factory=list)
    """Stream ids consumed since the last checkpoint."""
    stopped: bool = False

    def next_batch(self) -> RLBatch | None:
        """Collective: the next batch on every rank, or None to stop."""
        if self.stopped:
            return None
        if self.reader is not None:
            msg = self._read()
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
        self.stopped = bool(msg["last"])
        return msg["batch"]

    def commit(self) -> None:
        """The checkpoint holding the consumed entries is on disk: acknowledge them (rank 0)."""
        if self.reader is not None and self.uncommitted:
            self.reader.ack(self.uncommitted)
        self.uncommitted = []

    def _read(self) -> dict[str, Any]:
        """Rank 0: fill a batch (staleness filter, DAPO's filter), waiting with a heartbeat."""
        assert self.reader is not None
        lc, algo = self.lc, self.lc.algorithm
        need = lc.train_batch_size
        kept: list[Any] = []
        consumed: list[str] = []
        groups_read: list[Any] = []  # every group consumed: the dropped cost it carries counts
        left_out: list[Any] = []  # the groups the filters skipped: their own cost is dropped
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
                if lc.push.every and now - last_look > CATCH_UP_S:
                    last_look = now
                    behind = self.engines_behind()
                    if behind:
                        log.warning("engines behind weight version %d (restarted?): %s; pushing "
                                    "it again", self.weight_version(), ", ".join(behind))  # fmt: skip
                        if world_size() > 1:
                            broadcast_object({"kind": "push"})
                        self.push()
                        last_beat = time.monotonic()
                if now - last_beat > HEARTBEAT_S and world_size() > 1:
                    broadcast_object({"kind": "wait"})
                    last_beat = now
                continue
            last_arrival = now
            version = self.weight_version()
            for e in entries:
                consumed.append(e.entry_id)
                g = e.group
                groups_read.append(g)
                # The bound holds for every token: a response that spans updates counts from
                # its oldest token.
                stale = version - oldest_version(g)
                if lc.stream.max_staleness is not None and stale > lc.stream.max_staleness:
                    skipped["stale"] += 1
                    left_out.append(g)
                    continue
                if algo.dapo.dynamic_sampling and uniform_group(g):
                    skipped["uniform_reward"] += 1
                    left_out.append(g)
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
        if self.metrics is not None:
            for reason, n in skipped.items():
                self.metrics.skipped.labels(reason).inc(n)
        # Skipped groups count as consumed: they are acknowledged with this step's checkpoint.
        self.uncommitted.extend(consumed)
        if not kept:
            return {"kind": "stop"}
        batch = RLBatch(
            samples=samples_from_groups(kept, self.weight_version(), algo.train_observations),
            prompt_ids=[g.prompt_id for g in kept],
            skipped=sum(skipped.values()),
            entry_ids=consumed,
            generation=StepGeneration.of(kept, left_out, groups_read),
            allocation=None
            if self.uniform_n is None
            else StepAllocation.of(groups_read, self.uniform_n),
        )
        return {"kind": "batch", "batch": batch, "last": timed_out}
