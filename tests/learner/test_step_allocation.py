"""Allocation per learner step (``dynamo_rl/contracts/step_allocation.py``) on the learner's side:
the stream source (real Redis) counts each consumed group by the count its entry carries against
uniform n and sums the skipped prompts the entries carry; the step record (``RLStep`` on a tiny
model), the step line, the Prometheus gauges and the JSONL log then hold those figures."""

from __future__ import annotations

import logging
from pathlib import Path
from types import SimpleNamespace

import pytest
import redis

from dynamo_rl.codec import TrajectoryGroup, decode_entry
from dynamo_rl.config.learner import LearnerConfig
from dynamo_rl.contracts.step_allocation import RECORD_FIELDS
from dynamo_rl.contracts.stream import TrajectoryReader
from dynamo_rl.keys import trajectory_stream
from learner.metrics import LearnerMetrics
from learner.step import RLStep, adamw
from learner.steplog import StepLog, read_log
from learner.stream_source import StreamSource
from learner.trainer import Trainer
from tests.learner.helpers import make_groups, write_groups

NS = "allocstep"
UNIFORM = 3


def stream(redis_url: str) -> dict[str, TrajectoryGroup]:
    """The stream's entries as Redis holds them, decoded independently of the reader."""
    client = redis.Redis.from_url(redis_url)
    try:
        rows = client.xrange(trajectory_stream(NS))
    finally:
        client.close()
    return {eid.decode(): decode_entry(fields) for eid, fields in rows}


def expected(consumed: list[TrajectoryGroup]) -> dict[str, int]:
    """The step's figures counted here by hand from the entries it consumed."""
    return {
        "alloc_above": sum(g.allocated_n > UNIFORM for g in consumed),
        "alloc_at": sum(g.allocated_n == UNIFORM for g in consumed),
        "alloc_below": sum(g.allocated_n < UNIFORM for g in consumed),
        "alloc_skipped": sum(g.skipped_prompts for g in consumed),
    }


def test_a_steps_allocation_is_what_its_entries_carried(
    redis_url: str, policy, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    sizes = [3, 4, 2, 3, 5, 3]
    groups = make_groups(len(sizes), sizes=sizes, seed=11)
    for g, n in zip(groups, sizes, strict=True):
        g.allocated_n, g.weight_version = n, 5
    groups[0].skipped_prompts = 2  # the first group of a worker's push carries its skips
    groups[3].skipped_prompts = 1
    groups[1].weight_version = 1  # stale: skipped by the learner, still consumed and counted
    ids = write_groups(redis_url, NS, groups)
    by_id = stream(redis_url)
    assert list(by_id) == ids

    lc = LearnerConfig(train_batch_size=2, micro_batch_size=8,
                       stream={"max_staleness": 2, "block_ms": 50})  # fmt: skip
    reader = TrajectoryReader(redis.Redis.from_url(redis_url), NS)
    reader.setup()
    source = StreamSource(lc, reader, weight_version=lambda: 5, push=lambda: None,
                          engines_behind=lambda: [], uniform_n=UNIFORM)  # fmt: skip
    step = RLStep(lc, policy, adamw(policy, lc), pad_id=0)
    # The trainer's own step logging (rank 0): gauges, the JSONL log and the step line.
    trainer = SimpleNamespace(env=SimpleNamespace(is_main=True), metrics=LearnerMetrics(),
                              steplog=StepLog(tmp_path / "metrics.jsonl"))  # fmt: skip
    records = []
    with caplog.at_level(logging.INFO, logger="learner.trainer"):
        for k in (1, 2):
            batch = source.next_batch()
            assert batch is not None
            records.append({**step(batch).record, "step": k})  # the trainer numbers the steps
            Trainer.log_step(trainer, records[-1])  # type: ignore[arg-type]

    first, second = records
    assert first["entry_ids"] == ids[:3] and second["entry_ids"] == ids[3:5]
    for record in records:
        consumed = [by_id[i] for i in record["entry_ids"]]
        assert {k: record[k] for k in RECORD_FIELDS} == expected(consumed)
    # The figures themselves: 3 at, 4 above (stale), 2 below with 2 skips; 3 at, 5 above, 1 skip.
    assert {k: first[k] for k in RECORD_FIELDS} == {
        "alloc_above": 1, "alloc_at": 1, "alloc_below": 1, "alloc_skipped": 2,
    }  # fmt: skip
    assert {k: second[k] for k in RECORD_FIELDS} == {
        "alloc_above": 1, "alloc_at": 1, "alloc_below": 0, "alloc_skipped": 1,
    }  # fmt: skip

    lines = [r.getMessage() for r in caplog.records if r.getMessage().startswith("step ")]
    assert len(lines) == 2
    assert lines[0].endswith(" alloc +1 =1 -1 skip 2"), lines[0]
    assert lines[1].endswith(" alloc +1 =1 -0 skip 1"), lines[1]
    exposition = trainer.metrics.metrics.exposition().decode()
    for key in RECORD_FIELDS:  # the last step's gauges
        assert f"dynamo_learner_{key} {float(second[key])}" in exposition
    logged = read_log(tmp_path / "metrics.jsonl")
    assert [{k: r[k] for k in RECORD_FIELDS} for r in logged] == [
        {k: r[k] for k in RECORD_FIELDS} for r in records
    ]


def test_a_source_without_uniform_n_adds_no_allocation(redis_url: str) -> None:
    write_groups(redis_url, NS, make_groups(2, seed=1))
    lc = LearnerConfig(train_batch_size=2, stream={"block_ms": 50})
    reader = TrajectoryReader(redis.Redis.from_url(redis_url), NS)
    reader.setup()
    source = StreamSource(lc, reader, weight_version=lambda: 0, push=lambda: None,
                          engines_behind=lambda: [])  # fmt: skip
    batch = source.next_batch()
    assert batch is not None and batch.allocation is None
