"""The rollout worker's Redis retry (fast, real processes): a Redis that is not there yet is waited
out with capped back-off, counted in ``waits_total{reason="redis"}``, and the call then succeeds —
here a lease and a push, so the stream protocol rides on the retry."""

from __future__ import annotations

import asyncio
import time
from pathlib import Path

from dynamo_rl.codec import Response, TrajectoryGroup
from dynamo_rl.config import RolloutConfig
from dynamo_rl.keys import lease_key, trajectory_stream
from dynamo_rl.procs import free_port, start_redis
from dynamo_rl.redis_client import async_client, sync_client
from services.rollout.datasets import PromptRecord, PromptSampler
from services.rollout.worker import RolloutWorker

NS = "redis-retry"


def _worker(url: str) -> RolloutWorker:
    return RolloutWorker(
        cfg=RolloutConfig(backoff_s=0.02, backoff_max_s=0.1),
        namespace=NS,
        worker_id="w0",
        sampler=PromptSampler([PromptRecord("p0", "1+1=", "2", "arith", "math")], shuffle=False),
        renderer=None,  # type: ignore[arg-type]  (not used here)
        pool=None,  # type: ignore[arg-type]
        reward=None,  # type: ignore[arg-type]
        redis=async_client(url, timeout_s=1.0),
        allocator=None,
    )


def _waits(worker: RolloutWorker) -> tuple[float, float]:
    get = worker.metrics.metrics.registry.get_sample_value
    labels = {"reason": "redis"}
    return (
        get("dynamo_rollout_waits_total", labels) or 0.0,
        get("dynamo_rollout_wait_seconds_total", labels) or 0.0,
    )


def test_worker_waits_out_a_missing_redis_then_pushes(tmp_path: Path) -> None:
    port = free_port()
    url = f"redis://127.0.0.1:{port}/0"
    worker = _worker(url)
    group = TrajectoryGroup(
        prompt_id="p0",
        prompt_token_ids=[1],
        responses=[Response(token_ids=[2], logprobs=[-1.0], reward=1.0)],
    )
    procs = []

    async def scenario() -> list[str]:
        lease = asyncio.create_task(worker.hold_lease(["p0"], "w0:s:0"))
        deadline = time.monotonic() + 20
        while _waits(worker)[0] < 5:  # five retries against nothing
            assert time.monotonic() < deadline and not lease.done()
            await asyncio.sleep(0.01)
        count, seconds = _waits(worker)
        assert seconds <= 0.1 * count  # every delay within backoff_max_s
        procs.append(start_redis(tmp_path / "redis", port=port)[0])
        await asyncio.wait_for(lease, 20)
        ids = await worker.push([group], "w0:s:0")
        await worker.redis.aclose()
        return ids

    try:
        ids = asyncio.run(scenario())
        client = sync_client(url)
        assert client.get(lease_key(NS, "w0")) is None  # the push released the lease
        assert [i.decode() for i, _ in client.xrange(trajectory_stream(NS))] == ids
        client.close()
    finally:
        for p in procs:
            p.stop()
