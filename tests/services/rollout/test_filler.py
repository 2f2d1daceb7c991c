"""The informative-batch filler (``rollout.drop_uniform_groups``, ``services/rollout/filler.py``)
against real processes: an embedded engine on the tiny model, a reward service, an allocator,
Redis; the worker runs in process, and the learner's stream source reads what it pushed.

Two kinds of prompts: ``arith`` ones are scored by a length term (a third of the vocabulary
stops a response, so lengths and rewards vary: most groups have a signal), ``flat`` ones by a
math answer the tiny model never gives (every group scores all 0). Laid out in batches so that
some push nothing and the next ones carry their cost. Checked against figures the filler does
not compute itself — the allocator's statistics, the worker's count of generated tokens, the
stream's entries: no group without a signal is pushed, none with one is lost, the dropped
groups' cost reaches the stream once (on the first group of the next push, over batches that
pushed nothing, and through pushes whose reply was lost and that were retried), and the
learner's step figures sum to what the stream carried.
"""

from __future__ import annotations

import asyncio
from collections.abc import Iterator
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
import redis
from redis.exceptions import ConnectionError as RedisConnectionError

from dynamo_rl.clients.allocator import AllocatorClient
from dynamo_rl.codec import TrajectoryGroup
from dynamo_rl.config.learner import LearnerConfig
from dynamo_rl.contracts import gradstats
from dynamo_rl.contracts.generation import uniform_group
from dynamo_rl.contracts.stream import PUSH_SCRIPT, TrajectoryReader
from dynamo_rl.service_table import SERVICES
from learner.stream_source import StreamSource
from services.rollout.worker import BatchResult, RolloutWorker, build_worker
from tests.conftest import REPO
from tests.services.rollout.helpers import stream_entries, worker_config

PER_PROMPT = 3
BATCH = 2
LAYOUT = "FF AA FA FF FF AA AF AA"  # each batch's prompts: F flat, A arith
BATCHES = len(LAYOUT.split())
PROMPTS = [f"{'flat' if k == 'F' else 'arith'}-{i}" for i, k in enumerate(LAYOUT.replace(" ", ""))]
# Stop tokens: a third of the byte vocabulary, so responses end after 1 to 6 tokens.
STOPS = list(range(3, 259, 3))
# arith: DAPO's length term (0 up to 2 tokens, -0.5 at 3, -1 from 4; the math term is 0 for the
# tiny model's answers); flat: a math answer never given. Both the service and the worker (whose
# route check must know the data sources) get them.
REWARDS = (
    "reward.composite.arith.components=[{kind: math},"
    " {kind: length, max_length: 4, buffer: 2, weight: 1.0}]",
    "reward.composite.flat.components=[{kind: math}]",
)


@pytest.fixture(scope="module")
def dataset(tmp_path_factory: pytest.TempPathFactory) -> Path:
    rows = [
        {
            "data_source": pid.split("-")[0],
            "prompt": [{"role": "user", "content": f"{i}+{i}="}],
            "reward_model": {"style": "rule", "ground_truth": "-987654321.25"},
            "extra_info": {"index": i},
        }
        for i, pid in enumerate(PROMPTS)
    ]
    path = tmp_path_factory.mktemp("data") / "train.parquet"
    pq.write_table(pa.Table.from_pylist(rows), path)
    return path


@pytest.fixture(scope="module")
def length_reward(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    """A reward service with :data:`REWARDS`."""
    log = tmp_path_factory.mktemp("reward") / "reward.log"
    proc, url = SERVICES["reward"].start(
        log, "--math-workers", "1", "reward.code.enabled=false", *REWARDS, cwd=REPO, timeout=120
    )
    try:
        yield url
    finally:
        proc.stop()


def make_worker(ns: str, redis_url: str, engine: str, reward: str, allocator: str,
                dataset: Path, model: Path, *extra: str) -> RolloutWorker:  # fmt: skip
    cfg = worker_config(
        ns, redis_url, engine, reward, allocator, dataset, f"rollout.tokenizer={model}",
        "rollout.drop_uniform_groups=true", "rollout.allocation=uniform",
        f"rollout.batch_size={BATCH}", f"rollout.n={PER_PROMPT}", "rollout.shuffle=false",
        "rollout.sampling.max_tokens=6", "rollout.sampling.seed=0",
        f"rollout.sampling.stop_token_ids={STOPS}", *REWARDS, *extra,
    )  # fmt: skip
    return build_worker(cfg)


def run_batches(worker: RolloutWorker) -> list[BatchResult]:
    async def go() -> list[BatchResult]:
        try:
            return [await worker.run_batch(i) for i in range(BATCHES)]
        finally:
            await worker.aclose()

    return asyncio.run(go())


def metric(worker: RolloutWorker, name: str, labels: dict[str, str] | None = None) -> float:
    return float(worker.metrics.metrics.registry.get_sample_value(name, labels or {}) or 0.0)


def cost(groups: list[TrajectoryGroup]) -> tuple[int, int, int]:
    """Groups, rollouts, tokens of single-turn groups, counted here by hand."""
    return (
        len(groups),
        sum(len(g.responses) for g in groups),
        sum(len(r.token_ids) for g in groups for r in g.responses),
    )


def carried(g: TrajectoryGroup) -> tuple[int, int, int]:
    return g.dropped_groups, g.dropped_rollouts, g.dropped_tokens


def add(*parts: tuple[int, int, int]) -> tuple[int, int, int]:
    return (sum(p[0] for p in parts), sum(p[1] for p in parts), sum(p[2] for p in parts))


def check_stream(ns: str, redis_url: str, worker: RolloutWorker, results: list[BatchResult],
                 allocator: str) -> list[tuple[str, TrajectoryGroup]]:  # fmt: skip
    """What every test of the filler holds; the stream's entries."""
    entries = stream_entries(redis_url, ns)
    pushed = [g for r in results for g in r.groups]
    dropped = [g for r in results for g in r.dropped]
    # The scenario: flat groups are dropped, batches that push nothing hand their cost on, and
    # pushes of several groups carry it on their first.
    assert {g.prompt_id for g in dropped} >= {p for p in PROMPTS if p.startswith("flat")}
    assert [bool(r.groups) for r in results[:5]] == [False, True, True, False, False]
    assert sum(len(r.groups) > 1 for r in results) >= 2
    # No group without a signal reaches the stream, and every group with one does, once.
    assert not any(uniform_group(g) for _eid, g in entries)
    assert all(uniform_group(g) for g in dropped)
    assert [(g.batch_id, g.prompt_id) for _eid, g in entries] == [
        (g.batch_id, g.prompt_id) for g in pushed
    ]
    # Every prompt of every batch made a group, pushed or dropped, and its outcomes reached the
    # allocator either way (the allocator's own count).
    assert sorted(g.prompt_id for g in pushed + dropped) == sorted(PROMPTS)
    with AllocatorClient(allocator) as client:
        stats = client.get_stats(ns, PROMPTS)
    assert [s.samples for s in stats] == [PER_PROMPT] * len(PROMPTS)
    # Each pushed batch's first entry carries the cost of the groups dropped since the previous
    # push, its own batch's included; no other entry carries anything.
    pending: tuple[int, int, int] = (0, 0, 0)
    at = 0
    for r in results:
        pending = add(pending, cost(r.dropped))
        if r.groups:
            assert carried(entries[at][1]) == pending, r.index
            assert all(carried(g) == (0, 0, 0) for _eid, g in entries[at + 1 : at + len(r.groups)])
            at += len(r.groups)
            pending = (0, 0, 0)
    # What the last batches dropped waits in the worker for its next push.
    assert (worker.filler.carry.groups, worker.filler.carry.rollouts,
            worker.filler.carry.tokens) == pending  # fmt: skip
    # The worker's counters, and its own count of generated tokens (from the episodes played).
    groups, rollouts, tokens = cost(dropped)
    assert metric(worker, "dynamo_rollout_dropped_groups_total") == groups
    assert metric(worker, "dynamo_rollout_dropped_rollouts_total") == rollouts
    assert metric(worker, "dynamo_rollout_dropped_tokens_total") == tokens
    assert metric(worker, "dynamo_rollout_groups_total") == len(pushed)
    assert metric(worker, "dynamo_rollout_tokens_generated_total") == cost(pushed)[2] + tokens
    return entries


def test_the_filler_pushes_every_group_with_a_signal_and_carries_the_rest_once(
    redis_url: str, engine: str, length_reward: str, allocator: str, dataset: Path, model: Path
) -> None:
    ns = "filler"
    worker = make_worker(ns, redis_url, engine, length_reward, allocator, dataset, model)
    results = run_batches(worker)
    entries = check_stream(ns, redis_url, worker, results, allocator)

    # The learner's source reads it all: its steps' figures add up to what the stream holds.
    lc = LearnerConfig(train_batch_size=2, stream={"block_ms": 50, "wait_timeout_s": 0.5})
    client = redis.Redis.from_url(redis_url)
    reader = TrajectoryReader(client, ns)
    reader.setup()
    source = StreamSource(lc, reader, weight_version=lambda: 0, push=lambda: None,
                          engines_behind=lambda: [])  # fmt: skip
    by_id = dict(entries)
    steps = 0
    while (batch := source.next_batch()) is not None:
        assert batch.generation is not None
        consumed = [by_id[i] for i in batch.entry_ids]
        assert batch.generation.record() == {
            "gen_groups_kept": len(consumed),
            "gen_rollouts_kept": cost(consumed)[1],
            "gen_tokens_kept": cost(consumed)[2],
            "gen_groups_dropped": sum(g.dropped_groups for g in consumed),
            "gen_rollouts_dropped": sum(g.dropped_rollouts for g in consumed),
            "gen_tokens_dropped": sum(g.dropped_tokens for g in consumed),
        }
        steps += 1
    client.close()
    assert steps == (len(entries) + 1) // 2


def test_a_push_whose_reply_was_lost_is_retried_and_counted_once(
    redis_url: str, engine: str, length_reward: str, allocator: str, dataset: Path, model: Path
) -> None:
    """Every push script runs, then its reply is lost (the connection drops): the worker's Redis
    retry runs it again, which finds the batch's marker and adds nothing."""
    ns = "filler-lost"
    worker = make_worker(ns, redis_url, engine, length_reward, allocator, dataset, model)
    client = worker.writer.client
    real_eval = client.eval
    lost: list[str] = []

    async def lossy_eval(script: str, numkeys: int, *args: object) -> object:
        reply = await real_eval(script, numkeys, *args)
        marker = str(args[1])
        if script == PUSH_SCRIPT and marker not in lost:
            lost.append(marker)
            raise RedisConnectionError("connection lost before the reply")
        return reply

    client.eval = lossy_eval
    results = run_batches(worker)
    # Every push that held a group (an empty batch's push only releases the lease).
    pushes = sum(1 for r in results if r.groups)
    assert len(lost) == pushes
    assert metric(worker, "dynamo_rollout_waits_total", {"reason": "redis"}) >= pushes
    check_stream(ns, redis_url, worker, results, allocator)


@pytest.mark.parametrize("skip_after", [0, 1])
def test_dropped_groups_count_in_the_zero_advantage_streak(
    redis_url: str, engine: str, length_reward: str, allocator: str, dataset: Path, model: Path,
    skip_after: int,
) -> None:  # fmt: skip
    """The learner never sees a dropped group, so the worker writes its zero-advantage visit to
    the gradient statistics (the skip rule's streak), at the version it was sampled at; with the
    skip rule and method grad off it writes nothing, as the learner does not either."""
    ns = f"filler-streak-{skip_after}"
    worker = make_worker(ns, redis_url, engine, length_reward, allocator, dataset, model,
                         f"allocator.skip_after={skip_after}")  # fmt: skip
    results = run_batches(worker)
    dropped = {g.prompt_id for r in results for g in r.dropped}
    pushed = {g.prompt_id for r in results for g in r.groups}
    assert dropped and pushed
    client = redis.Redis.from_url(redis_url)
    try:
        got = gradstats.read(client, ns, sorted(dropped | pushed))
    finally:
        client.close()
    streak = dict(zip(sorted(dropped | pushed), got.streak.tolist(), strict=True))
    spread = dict(zip(sorted(dropped | pushed), got.spread.tolist(), strict=True))
    if skip_after == 0:
        assert all(v == 0.0 for v in streak.values())
        return
    # Each prompt is in one batch: one zero-advantage visit per dropped group, a zero gradient.
    assert {p: streak[p] for p in dropped} == {p: 1.0 for p in dropped}
    assert {p: spread[p] for p in dropped} == {p: 0.0 for p in dropped}
    # The pushed groups are the learner's to measure: the worker wrote nothing for them.
    assert all(v == 0.0 for p, v in streak.items() if p in pushed)
    assert all(v != v for p, v in spread.items() if p in pushed)  # NaN: never measured
