"""Rollout leases against a real Redis (fast): who may take a lease, and when.

The end-to-end case — a worker killed mid-batch by ``kill -9`` and its prompts re-issued by its
restart — is in ``test_faults_up.py``; here the rules: another worker's lease is taken only once it
has lapsed, and only once; a worker takes its own id's lease at once (a dead earlier run); the push
deletes the lease in the same transaction as the groups.
"""

from __future__ import annotations

import asyncio
import json
import time

import redis
import redis.asyncio as aioredis

from dynamo_rl.codec import Response, SamplingRecord, TrajectoryGroup
from dynamo_rl.config import RolloutConfig
from dynamo_rl.keys import lease_key, trajectory_stream
from services.rollout.datasets import PromptRecord, PromptSampler
from services.rollout.worker import RolloutWorker

NS = "leases"
RECORDS = [PromptRecord(f"p{i}", f"{i}+1=", str(i + 1), "arith", "math") for i in range(6)]


def _worker(redis_url: str, worker_id: str) -> RolloutWorker:
    return RolloutWorker(
        cfg=RolloutConfig(lease_ttl_s=1.0),
        namespace=NS,
        worker_id=worker_id,
        sampler=PromptSampler(RECORDS, shuffle=False),
        renderer=None,  # type: ignore[arg-type]  (not used by leases)
        pool=None,  # type: ignore[arg-type]
        reward=None,  # type: ignore[arg-type]
        redis=aioredis.Redis.from_url(redis_url),
        allocator=None,
    )


def _group(prompt_id: str) -> TrajectoryGroup:
    return TrajectoryGroup(
        prompt_id=prompt_id,
        prompt_token_ids=[1, 2],
        responses=[Response(token_ids=[3], logprobs=[-0.5], reward=1.0, correct=True, reason="ok")],
        weight_version=0,
        sampling=SamplingRecord(temperature=1.0, top_p=1.0, top_k=-1, max_tokens=4, seed=0),
        namespace=NS,
        allocated_n=1,
    )


def test_a_lease_is_taken_only_once_it_lapsed_and_only_once(redis_url: str) -> None:
    async def scenario() -> None:
        a, b, c = (_worker(redis_url, w) for w in ("wa", "wb", "wc"))
        await a.hold_lease(["p1", "p2"], "wa:s:0")
        assert await b.claim_lapsed() == []  # still held
        await asyncio.sleep(1.2)  # lease_ttl_s = 1
        taken_b, taken_c = await asyncio.gather(b.claim_lapsed(), c.claim_lapsed())
        assert sorted(r.prompt_id for r in [*taken_b, *taken_c]) == ["p1", "p2"]
        assert not (taken_b and taken_c)  # one claimant only
        for w in (a, b, c):
            await w.redis.aclose()

    asyncio.run(scenario())


def test_a_worker_takes_its_own_ids_lease_at_once(redis_url: str) -> None:
    async def scenario() -> None:
        dead = _worker(redis_url, "w0")
        await dead.hold_lease(["p3", "p4", "p5"], "w0:old:7")
        restarted = _worker(redis_url, "w0")
        taken = await restarted.claim_lapsed()
        assert [r.prompt_id for r in taken] == ["p3", "p4", "p5"]
        assert restarted.reissued == 3
        assert await restarted.claim_lapsed() == []
        # The re-issues are a Prometheus series (and so in the run-folder history).
        reissued = restarted.metrics.metrics.registry.get_sample_value(
            "dynamo_rollout_leases_reissued_total"
        )
        assert reissued == 3
        for w in (dead, restarted):
            await w.redis.aclose()

    asyncio.run(scenario())


def test_the_push_releases_the_lease_with_the_groups(redis_url: str) -> None:
    async def scenario() -> None:
        w = _worker(redis_url, "w1")
        await w.hold_lease(["p0", "p1"], "w1:s:0")
        ids = await w.push([_group("p0"), _group("p1")], "w1:s:0")
        assert len(ids) == 2
        await w.redis.aclose()

    asyncio.run(scenario())
    client = redis.Redis.from_url(redis_url)
    assert client.get(lease_key(NS, "w1")) is None
    assert client.xlen(trajectory_stream(NS)) == 2
    client.close()


def test_a_lease_names_its_batch_and_expiry(redis_url: str) -> None:
    async def scenario() -> None:
        w = _worker(redis_url, "w2")
        await w.hold_lease(["p2"], "w2:s:3")
        await w.redis.aclose()

    before = time.time()
    asyncio.run(scenario())
    client = redis.Redis.from_url(redis_url)
    lease = json.loads(client.get(lease_key(NS, "w2")))
    client.close()
    assert lease["prompt_ids"] == ["p2"] and lease["batch_id"] == "w2:s:3"
    assert before < lease["expires_unix"] <= time.time() + 1.0
