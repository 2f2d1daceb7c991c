"""The run's allocation parameters travel from the config to the algorithm's bound: a YAML file
that sets them under ``rollout`` (the older spelling) loads them into the ``allocator`` section, the
rollout worker sends them with every ``Allocate`` over a real gRPC channel, and a real allocator
server configured otherwise applies them."""

from __future__ import annotations

import asyncio
from pathlib import Path

from dynamo_rl.clients.allocator import AllocatorClient
from dynamo_rl.config import load_config
from services.rollout.datasets import PromptRecord, PromptSampler
from services.rollout.worker import RolloutWorker
from tests.allocator.helpers import start_allocator

NS = "bounds"
IDS = [f"p{i}" for i in range(6)]


PROMPT_MEAN = "learner:\n  algorithm:\n    agg: prompt-mean\n"
"""Dynamic allocation's weighting (the config refuses it with token-mean)."""


def _worker(path: Path, client: AllocatorClient) -> RolloutWorker:
    cfg = load_config(path, env={})
    return RolloutWorker(
        cfg=cfg.rollout,
        namespace=NS,
        worker_id="w0",
        sampler=PromptSampler([PromptRecord(i, "1+1=", "2", "arith", "math") for i in IDS]),
        renderer=None,  # type: ignore[arg-type]  (allocate uses none of these)
        pool=None,  # type: ignore[arg-type]
        reward=None,  # type: ignore[arg-type]
        redis=None,
        allocator=client,
        allocation=cfg.allocator,
    )


def test_a_rollout_bound_in_the_yaml_reaches_the_allocators_cap(
    tmp_path: Path, redis_url: str
) -> None:
    server = start_allocator(redis_url)  # its own config: the schema's bounds (2..16)
    try:
        with AllocatorClient(f"127.0.0.1:{server.port}", retries=0) as client:
            # One half-solved prompt among mastered ones: it is what the priority favours.
            client.report_outcomes(NS, [(pid, 16, 8 if pid == "p0" else 16) for pid in IDS])
            unbounded = client.allocate(NS, IDS, n_per_prompt=4, n_min=1).counts
            assert unbounded[0] > 5  # so a cap of 5 below can only come from the worker's config

            path = tmp_path / "exp.yaml"
            path.write_text(
                "rollout:\n  allocation: dynamic\n  n: 4\n  n_min: 1\n  n_max: 5\n" + PROMPT_MEAN
            )
            counts, _priorities, fallback = asyncio.run(_worker(path, client).allocate(IDS))
            assert not fallback
            assert sum(counts) == 4 * len(IDS) and counts[0] == 5 and min(counts) >= 1

            path.write_text(
                "rollout:\n  allocation: dynamic\nallocator:\n  n_per_prompt: 4\n  n_min: 1\n"
                "  n_max: 7\n" + PROMPT_MEAN
            )
            counts, _priorities, _ = asyncio.run(_worker(path, client).allocate(IDS))
            assert sum(counts) == 4 * len(IDS) and counts[0] == 7
    finally:
        server.stop(grace=0.5)


def test_uniform_allocation_gives_n_per_prompt_to_every_prompt(tmp_path: Path) -> None:
    path = tmp_path / "exp.yaml"
    path.write_text("rollout:\n  allocation: uniform\n  n: 3\n")
    counts, priorities, fallback = asyncio.run(_worker(path, None).allocate(IDS))  # type: ignore[arg-type]
    assert counts == [3] * len(IDS) and priorities == [-1.0] * len(IDS) and not fallback
