"""Helpers of the rollout worker's tests: a worker's config on real endpoints, running it to the
end, and reading its stream back."""

from __future__ import annotations

import asyncio
from pathlib import Path

import redis

from dynamo_rl.codec import TrajectoryGroup, decode_entry
from dynamo_rl.config import ExperimentConfig, load_config
from dynamo_rl.keys import trajectory_stream
from services.rollout.worker import RolloutWorker


def worker_config(
    namespace: str,
    redis_url: str,
    engine_urls: str,
    reward: str,
    allocator: str,
    dataset: Path,
    *extra: str,
) -> ExperimentConfig:
    """A worker ``w0`` in ``namespace`` on these endpoints (``engine_urls``: comma-separated) and
    dataset, with quick polls and back-off; ``extra``: further overrides."""
    return load_config(
        None,
        [
            f"endpoints.redis_url={redis_url}",
            f"endpoints.engine_urls=[{engine_urls}]",
            f"endpoints.reward_url={reward}",
            f"endpoints.allocator_addr={allocator}",
            f"rollout.dataset={dataset}",
            f"rollout.namespace={namespace}",
            "rollout.worker_id=w0",
            "rollout.poll_interval_s=0.1",
            "rollout.backoff_s=0.1",
            "rollout.backoff_max_s=0.5",
            *extra,
        ],
        env={},
    )


async def run_and_close(worker: RolloutWorker, batches: int) -> int:
    """Run ``batches`` batches, then close the worker whatever happened."""
    try:
        return await worker.run(batches)
    finally:
        await worker.aclose()


def run_worker(worker: RolloutWorker, batches: int) -> int:
    return asyncio.run(run_and_close(worker, batches))


def stream_entries(redis_url: str, namespace: str) -> list[tuple[str, TrajectoryGroup]]:
    """The stream's entries: (entry id, group)."""
    client = redis.Redis.from_url(redis_url)
    try:
        entries = client.xrange(trajectory_stream(namespace))
    finally:
        client.close()
    return [(eid.decode(), decode_entry(fields)) for eid, fields in entries]


def stream_groups(redis_url: str, namespace: str) -> list[TrajectoryGroup]:
    return [g for _eid, g in stream_entries(redis_url, namespace)]
