"""The rollout worker end to end: a real engine, allocator, reward service and Redis.

One engine, one allocator and one reward server per module (the reward server is started lazily so
one test can first run the worker against its port while nothing listens there).
"""

from __future__ import annotations

import asyncio
import json
import os
import re
import signal
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path
from types import SimpleNamespace

import httpx
import pytest
import redis
import torch

from allocator.server import SERVICE_NAME
from dynamo_rl.clients.allocator import AllocatorClient
from dynamo_rl.codec import Response, SamplingRecord, TrajectoryGroup
from dynamo_rl.config import ExperimentConfig
from dynamo_rl.config.learner import LearnerConfig
from dynamo_rl.contracts.reward import ItemResult, MathItem, ModelItem
from dynamo_rl.contracts.step_allocation import StepAllocation
from dynamo_rl.contracts.stream import TrajectoryReader
from dynamo_rl.contracts.weight_control import send
from dynamo_rl.keys import engines_key, learner_group, trajectory_stream, weight_version_key
from dynamo_rl.procs import ServiceProcess, free_port, grpc_healthy
from dynamo_rl.service_table import SERVICES
from learner.stream_source import StreamSource
from services.rollout.engines import SGLangEngine
from services.rollout.reward_client import RewardClient, RewardRequestError
from services.rollout.worker import RolloutWorker, build_worker
from tests.conftest import REPO, dynamo_rl_argv
from tests.services.engine.engine_util import load_reference, reference_logprobs
from tests.services.rollout.conftest import write_sums
from tests.services.rollout.helpers import run_and_close, stream_entries, worker_config

NS = "wtest"
N_PROMPTS = 6


@pytest.fixture(scope="module")
def dataset(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return write_sums(tmp_path_factory.mktemp("data") / "train.parquet", N_PROMPTS)


@pytest.fixture(scope="module")
def allocator(redis_server: str, tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    log = tmp_path_factory.mktemp("allocator") / "allocator.log"
    proc, addr = SERVICES["allocator"].start(
        log, "--redis-url", redis_server, "allocator.initial_budget=2", cwd=REPO
    )
    try:
        yield addr
    finally:
        proc.stop()


class LazyReward:
    """The module's reward server, started on first use on a port known in advance."""

    def __init__(self, log_dir: Path) -> None:
        self.port = free_port()
        self.url = SERVICES["reward"].address(self.port)
        self.log_dir = log_dir
        self.proc: ServiceProcess | None = None

    def start(self) -> str:
        if self.proc is None:
            self.proc, _ = SERVICES["reward"].start(
                self.log_dir / "reward.log", "--math-workers", "1", "reward.code.enabled=false",
                # A composite spec for the dataset's data source, so the component breakdown
                # must reach the trajectories (the length term has weight 0: rewards stay 1/0).
                "reward.composite.arith.components=[{kind: math},"
                " {kind: length, max_length: 6, buffer: 4, weight: 0.0}]",
                port=self.port, cwd=REPO, timeout=120,
            )  # fmt: skip
        return self.url

    def stop(self) -> None:
        if self.proc is not None:
            self.proc.stop()


@pytest.fixture(scope="module")
def reward_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LazyReward]:
    server = LazyReward(tmp_path_factory.mktemp("reward"))
    try:
        yield server
    finally:
        server.stop()


def config(
    redis_url: str, engine: str, reward: str, allocator: str, dataset: Path, *extra: str
) -> ExperimentConfig:
    return worker_config(
        NS, redis_url, engine, reward, allocator, dataset,
        "rollout.batch_size=3", "rollout.n=4", "rollout.n_min=1", "rollout.n_max=8",
        "rollout.max_n_per_request=3", "rollout.sampling.max_tokens=8",
        "rollout.allocation=dynamic", "learner.algorithm.agg=prompt-mean", *extra,
    )  # fmt: skip


@pytest.fixture
def make_worker(redis_url, engine, allocator, dataset, model, reward_server):
    """Build a worker from overrides (the reward server is started unless told not to)."""
    made: list[RolloutWorker] = []

    def make(
        *extra: str, start_reward: bool = True, reward: LazyReward | None = None, **kw: str
    ) -> RolloutWorker:
        server = reward or reward_server
        url = server.start() if start_reward else server.url
        cfg = config(
            redis_url, kw.get("engine", engine), url, kw.get("allocator", allocator), dataset,
            f"rollout.tokenizer={model}", *extra,
        )  # fmt: skip
        worker = build_worker(cfg)
        made.append(worker)
        return worker

    yield make


def stream_groups(redis_url: str) -> list[tuple[str, TrajectoryGroup]]:
    return stream_entries(redis_url, NS)


def metric(worker: RolloutWorker, name: str, labels: dict[str, str] | None = None) -> float:
    value = worker.metrics.metrics.registry.get_sample_value(name, labels or {})
    return float(value or 0.0)


def test_reward_service_down_pushes_nothing_until_it_is_back(make_worker, redis_url, tmp_path):
    # A reward server of its own, started only once the worker has retried against its port.
    reward_server = LazyReward(tmp_path)
    worker = make_worker(start_reward=False, reward=reward_server)

    async def go() -> None:
        task = asyncio.create_task(run_and_close(worker, 1))
        deadline = time.monotonic() + 120
        while metric(worker, "dynamo_rollout_reward_retries_total") < 2:
            assert time.monotonic() < deadline and not task.done()
            await asyncio.sleep(0.1)
        assert stream_groups(redis_url) == []  # scored or nothing
        await asyncio.to_thread(reward_server.start)
        await asyncio.wait_for(task, 120)

    try:
        asyncio.run(go())
    finally:
        reward_server.stop()
    groups = [g for _eid, g in stream_groups(redis_url)]
    assert len(groups) == 3 and all(r.reason for g in groups for r in g.responses)
    assert metric(worker, "dynamo_rollout_waits_total", {"reason": "reward"}) >= 2


def test_groups_decode_and_counts_equal_the_allocation(make_worker, redis_url, allocator, model):
    ids = [f"arith-{i}" for i in range(N_PROMPTS)]
    # Statistics that make prompts differ: the allocation must then be non-uniform.
    with AllocatorClient(allocator) as client:
        client.report_outcomes(NS, [(pid, 8, i % 4 * 2) for i, pid in enumerate(ids)])
        expected = client.allocate(NS, ids, n_per_prompt=4, n_min=1, n_max=8).counts
    assert len(set(expected)) > 1 and sum(expected) == 4 * N_PROMPTS

    worker = make_worker(f"rollout.batch_size={N_PROMPTS}", "rollout.shuffle=false")
    assert asyncio.run(run_and_close(worker, 1)) == 1

    groups = [g for _eid, g in stream_groups(redis_url)]
    assert [g.prompt_id for g in groups] == ids
    assert [len(g.responses) for g in groups] == expected
    assert [g.allocated_n for g in groups] == expected
    reference = load_reference(model)
    for g in groups:
        assert g.namespace == NS and g.worker_id == "w0"
        assert re.fullmatch(r"w0:[0-9a-f]{8}:0", g.batch_id)
        assert g.data_source == "arith" and g.prompt_text.endswith("Assistant:")
        assert g.weight_version >= 0 and g.sampling.max_tokens == 8
        for r in g.responses:
            assert r.reason  # scored: the reward service always gives a reason
            assert len(r.token_ids) == len(r.logprobs) > 0
            # The per-sample breakdown of the composite reward is kept with the trajectory;
            # the length term measured the response's tokens (the worker sends their count).
            n = len(r.token_ids)
            overlong = 0.0 if n <= 2 else (-1.0 if n > 6 else (2 - n) / 4)
            assert dict(r.reward_components) == {"math": r.reward, "length": overlong}
        # Each response's log-probs are the model's for its own prompt: no misalignment.
        r = g.responses[-1]
        ref = reference_logprobs(reference, list(g.prompt_token_ids), list(r.token_ids))
        assert (torch.tensor(list(r.logprobs)) - ref).abs().max().item() < 1e-4
    with AllocatorClient(allocator) as client:
        stats = client.get_stats(NS, ids)
    assert [s.samples for s in stats] == [8 + n for n in expected]
    assert metric(worker, "dynamo_rollout_groups_total") == N_PROMPTS
    assert metric(worker, "dynamo_rollout_responses_total") == sum(expected)
    assert metric(worker, "dynamo_rollout_allocator_fallbacks_total") == 0
    # The zero-advantage count is that of the pushed groups whose rewards were all equal.
    flat = sum(len(g.responses) for g in groups if len({r.reward for r in g.responses}) == 1)
    assert metric(worker, "dynamo_rollout_zero_advantage_responses_total") == flat


def test_allocator_down_falls_back_to_uniform_n(make_worker, redis_url):
    dead = f"127.0.0.1:{free_port()}"
    worker = make_worker("rollout.allocator_timeout_s=1", allocator=dead)
    asyncio.run(run_and_close(worker, 2))
    groups = [g for _eid, g in stream_groups(redis_url)]
    assert len(groups) == 6
    assert all(len(g.responses) == 4 and g.priority == -1.0 for g in groups)
    assert metric(worker, "dynamo_rollout_allocator_fallbacks_total") == 2
    assert metric(worker, "dynamo_rollout_report_failures_total") == 2
    # The outcomes are kept to be reported when the allocator is back.
    assert sum(a for a, _s in worker._unreported.values()) == 24


def test_staleness_bound_waits_for_the_weight_push(make_worker, redis_url, engine, model):
    client = redis.Redis.from_url(redis_url)
    version = 1 + asyncio.run(_engine_version(engine))
    client.set(weight_version_key(NS), version)  # the learner is one version ahead
    worker = make_worker("rollout.max_staleness=0")

    async def go() -> None:
        task = asyncio.create_task(run_and_close(worker, 1))
        await asyncio.sleep(1.5)
        assert not task.done() and stream_groups(redis_url) == []
        assert metric(worker, "dynamo_rollout_staleness_versions") == 1
        sg = SGLangEngine(engine)
        try:  # the push: same weights, new version
            call = sg.weights.update_from_disk(str(model), version)
            await asyncio.to_thread(send, sg.weights, sg.url, call, timeout_s=120)
        finally:
            await sg.aclose()
        await asyncio.wait_for(task, 60)

    asyncio.run(go())
    client.close()
    groups = [g for _eid, g in stream_groups(redis_url)]
    assert len(groups) == 3 and all(g.weight_version == version for g in groups)
    # Responses of one version leave it to the group's: none spans an update here.
    assert not any(r.weight_versions for g in groups for r in g.responses)
    assert metric(worker, "dynamo_rollout_waits_total", {"reason": "staleness"}) == 1


async def _engine_version(url: str) -> int:
    sg = SGLangEngine(url)
    try:
        return await sg.weight_version()
    finally:
        await sg.aclose()


def test_backpressure_pauses_until_the_learner_reads(make_worker, redis_url):
    client = redis.Redis.from_url(redis_url)
    stream, group = trajectory_stream(NS), learner_group(NS)
    client.xgroup_create(stream, group, id="0", mkstream=True)
    worker = make_worker("rollout.max_pending_groups=3")

    async def go() -> None:
        task = asyncio.create_task(run_and_close(worker, 2))
        deadline = time.monotonic() + 60
        while client.xlen(stream) < 3:
            assert time.monotonic() < deadline
            await asyncio.sleep(0.1)
        await asyncio.sleep(1.0)
        assert client.xlen(stream) == 3 and not task.done()  # paused: 3 unconsumed groups
        assert metric(worker, "dynamo_rollout_pending_groups") == 3
        # The learner reads two without acknowledging them yet (it acknowledges at its next
        # checkpoint): one left unread, the worker resumes.
        client.xreadgroup(group, "learner-0", {stream: ">"}, count=2)
        await asyncio.wait_for(task, 60)

    asyncio.run(go())
    client.close()
    assert len(stream_groups(redis_url)) == 6
    assert metric(worker, "dynamo_rollout_waits_total", {"reason": "backpressure"}) == 1


@pytest.mark.slow
def test_dynamo_rl_rollout_command_runs_n_batches_and_exits(
    redis_url, engine, allocator, dataset, model, reward_server, tmp_path
):
    metrics_port = free_port()
    argv = dynamo_rl_argv(
        "rollout", "--dataset", str(dataset), "--tokenizer", str(model), "--num-batches", "2",
        "--metrics-port", str(metrics_port), f"rollout.namespace={NS}", "rollout.batch_size=2",
        "rollout.n=3", "rollout.n_min=1", "rollout.n_max=6", "rollout.sampling.max_tokens=6",
    )  # fmt: skip
    env = {
        **os.environ,
        "REDIS_URL": redis_url,
        "ENGINE_URLS": engine,
        "REWARD_URL": reward_server.start(),
        "ALLOCATOR_ADDR": allocator,
    }
    result = subprocess.run(argv, env=env, capture_output=True, text=True, timeout=300, cwd=REPO)
    assert result.returncode == 0, result.stderr[-3000:]
    groups = [g for _eid, g in stream_groups(redis_url)]
    assert len(groups) == 4
    assert [sum(len(g.responses) for g in groups[i : i + 2]) for i in (0, 2)] == [6, 6]
    assert "done: 2 batches" in result.stderr


def test_rollout_command_config_errors_exit_2(tmp_path):
    result = subprocess.run(
        dynamo_rl_argv("rollout", "rollout.n=50"), capture_output=True, text=True, cwd=REPO
    )
    assert result.returncode == 2 and "allocator.n_min <= allocator.n_per_prompt" in result.stderr
    result = subprocess.run(
        dynamo_rl_argv("rollout", "rollout.tokenizer=/nonexistent"),
        capture_output=True, text=True, cwd=REPO, env={**os.environ, "ENGINE_URLS": ""},
    )  # fmt: skip
    assert result.returncode == 2 and "rollout.dataset is not set" in result.stderr
    missing = tmp_path / "none.jsonl"
    result = subprocess.run(
        dynamo_rl_argv("rollout", "--dataset", str(missing), "--tokenizer", "x"),
        capture_output=True, text=True, cwd=REPO,
    )  # fmt: skip
    assert result.returncode == 2 and "dataset file not found" in result.stderr


def test_engines_registered_in_redis_join_the_pool(make_worker, redis_url, engine):
    client = redis.Redis.from_url(redis_url)
    entry = {"url": engine, "weight_version": 0, "registered_unix": time.time()}
    client.hset(engines_key("dynamo"), engine, json.dumps(entry))  # run.name is the default
    client.close()
    dead = f"http://127.0.0.1:{free_port()}"
    worker = make_worker("rollout.discover_engines=true", engine=dead)
    asyncio.run(run_and_close(worker, 1))
    assert worker.pool.urls == [dead, engine]
    assert len(stream_groups(redis_url)) == 3


def test_rollout_command_stops_cleanly_on_sigterm_while_waiting(redis_url, dataset, tmp_path):
    from learner.tiny_model import build_char_tokenizer

    build_char_tokenizer().save_pretrained(tmp_path / "tok")
    metrics_port = free_port()
    argv = dynamo_rl_argv(
        "rollout", "--dataset", str(dataset), "--tokenizer", str(tmp_path / "tok"),
        "--metrics-port", str(metrics_port), "rollout.backoff_s=0.1", "rollout.backoff_max_s=0.2",
    )  # fmt: skip
    env = {
        **os.environ,
        "REDIS_URL": redis_url,
        "ENGINE_URLS": f"http://127.0.0.1:{free_port()}",  # no engine: the worker waits
        "ALLOCATOR_ADDR": f"127.0.0.1:{free_port()}",
        "REWARD_URL": f"http://127.0.0.1:{free_port()}",
    }
    proc = ServiceProcess("rollout", argv, tmp_path / "rollout.log", env=env, cwd=REPO).start()
    try:
        url = f"http://127.0.0.1:{metrics_port}/metrics"
        proc.wait_ready(
            lambda: 'dynamo_rollout_waits_total{reason="engine"}' in httpx.get(url).text,
            timeout=60,
        )
        proc.signal(signal.SIGTERM)
        assert proc.proc is not None
        try:
            code = proc.proc.wait(timeout=30)
        except subprocess.TimeoutExpired:
            raise AssertionError(f"still running 30 s after SIGTERM:\n{proc.log_tail()}") from None
        assert code == 0, proc.log_tail()
        assert "SIGTERM: stopping" in proc.log_tail()
        assert "stopped after 0 batches" in proc.log_tail()
    finally:
        proc.stop()


def test_a_lost_cancellation_is_repeated_until_the_worker_ends():
    """Python 3.11's ``asyncio.wait_for`` (inside every Redis command) can swallow a cancellation
    that arrives as the awaited call completes; the rollout command's stop signal then cancels
    again until the worker has ended. Here the work swallows the first two cancellations."""
    from services.rollout.cli import cancel_until_done

    swallowed = []

    async def stubborn() -> None:
        while True:
            try:
                await asyncio.sleep(60)
            except asyncio.CancelledError:
                if len(swallowed) >= 2:
                    raise
                swallowed.append(1)

    async def go() -> None:
        work = asyncio.ensure_future(stubborn())
        await asyncio.sleep(0)
        cancel_until_done(work, 0.01)
        done, _ = await asyncio.wait({work}, timeout=10)
        if not done:  # end it anyway, so that asyncio.run can return and the test fail
            swallowed.extend([1, 1])
            work.cancel()
        assert done and work.cancelled() and len(swallowed) == 2

    asyncio.run(go())


def test_reward_client_matches_results_by_id_and_refuses_bad_items(reward_server):
    url = reward_server.start()
    items = [
        MathItem(id="a", kind="math", response="so \\boxed{4}", ground_truth="4"),
        MathItem(id="b", kind="math", response="\\boxed{5}", ground_truth="4"),
        MathItem(id="c", kind="math", response="no answer", ground_truth="4"),
    ]

    async def go() -> list[ItemResult]:
        client = RewardClient(url, batch_items=2)  # two requests
        try:
            return await client.verify(items)
        finally:
            await client.aclose()

    results = asyncio.run(go())
    assert [r.id for r in results] == ["a", "b", "c"]
    assert [r.correct for r in results] == [True, False, False]
    assert results[0].score == 1.0 and results[2].format_ok is False

    async def bad() -> None:
        client = RewardClient(url)
        try:
            # A kind the contract knows but this server does not serve (no reward model).
            await client.verify([ModelItem(id="x", kind="model", prompt="q", response="")])
        finally:
            await client.aclose()

    with pytest.raises(RewardRequestError, match="422") as info:
        asyncio.run(bad())
    assert "kind" in str(info.value)


def test_push_is_atomic_and_at_most_once_per_batch(make_worker, redis_url):
    worker = make_worker(start_reward=False)
    groups = [
        TrajectoryGroup(
            prompt_id=f"p{i}",
            prompt_token_ids=[1],
            responses=[Response(token_ids=[2, 3], logprobs=[-0.1, -0.2], reward=1.0)],
        )
        for i in range(3)
    ]

    async def go() -> tuple[list[str], list[str], list[str]]:
        try:
            first = await worker.push(groups, "w0:s:0")
            again = await worker.push(groups, "w0:s:0")  # a retry after a lost reply
            other = await worker.push(groups[:1], "w0:s:1")
            return first, again, other
        finally:
            await worker.aclose()

    first, again, other = asyncio.run(go())
    assert len(first) == 3 and again == first and len(other) == 1
    entries = stream_groups(redis_url)
    assert [eid for eid, _g in entries] == first + other
    assert [g.prompt_id for _eid, g in entries] == ["p0", "p1", "p2", "p0"]
    assert entries[1][1].responses[0].logprobs == pytest.approx([-0.1, -0.2])


def test_allocator_back_means_dynamic_counts_again(make_worker, redis_server, redis_url, tmp_path):
    port = free_port()
    worker = make_worker("rollout.allocator_timeout_s=1", allocator=f"127.0.0.1:{port}")
    argv = SERVICES["allocator"].argv(
        "--redis-url", redis_server, *SERVICES["allocator"].port_overrides(port)
    )
    proc = ServiceProcess("allocator2", argv, tmp_path / "allocator.log", cwd=REPO)

    async def go() -> None:
        try:
            await worker.run_batch(0)  # allocator down: uniform
            await asyncio.to_thread(
                lambda: proc.start().wait_ready(grpc_healthy(f"127.0.0.1:{port}", SERVICE_NAME))
            )
            await worker.run_batch(1)
        finally:
            await worker.aclose()

    try:
        asyncio.run(go())
        assert metric(worker, "dynamo_rollout_allocator_fallbacks_total") == 1
        # The kept outcomes of the first batch reached the allocator with the second batch's.
        assert worker._unreported == {}
        first, second = {}, {}
        for _eid, g in stream_groups(redis_url):
            (first if g.batch_id.endswith(":0") else second)[g.prompt_id] = g
        with AllocatorClient(f"127.0.0.1:{port}") as client:
            stats = client.get_stats(NS, sorted(set(first) | set(second)))
    finally:
        proc.stop()
    for s in stats:
        attempts = sum(len(b[s.prompt_id].responses) for b in (first, second) if s.prompt_id in b)
        assert s.samples == attempts


def test_zero_advantage_responses_count_the_groups_with_equal_rewards():
    from services.rollout.metrics import zero_advantage_responses

    def group(*rewards: float) -> TrajectoryGroup:
        return TrajectoryGroup(
            prompt_id="p",
            prompt_token_ids=[1],
            responses=[Response(token_ids=[2], logprobs=[-0.1], reward=r) for r in rewards],
            weight_version=0,
            sampling=SamplingRecord(temperature=1.0, top_p=1.0, top_k=-1, max_tokens=4),
        )

    # All equal (3 + 2 responses) counts; mixed rewards and an empty group do not.
    groups = [group(1.0, 1.0, 1.0), group(0.0, 1.0), group(0.0, 0.0), group()]
    assert zero_advantage_responses(groups) == 5


class SkippingAllocator:
    """An allocator that answers fixed counts, zeros among them (the skip rule's verdict)."""

    def __init__(self, batches: list[list[int]]) -> None:
        self.batches = list(batches)

    async def aallocate(self, _ns: str, prompt_ids: list[str], **_params: int) -> object:
        counts = self.batches.pop(0)
        assert len(counts) == len(prompt_ids)
        return SimpleNamespace(counts=counts, priorities=[0.1] * len(counts))

    async def areport_outcomes(self, _ns: str, _outcomes: object) -> None:
        return None

    def close(self) -> None:
        return None


def test_skipped_prompts_ride_on_the_next_push_and_reach_the_learners_step(make_worker, redis_url):
    """Prompts allocated 0 make no group; the worker carries their count on the first group of
    its next push (over a batch that pushed nothing), and the learner's step sums it with its
    groups told against uniform n (rollout.n=4)."""
    worker = make_worker("rollout.shuffle=false")
    worker.allocator.close()
    worker.allocator = SkippingAllocator([[0, 0, 0], [0, 4, 0], [5, 0, 3]])
    assert asyncio.run(run_and_close(worker, 3)) == 3

    entries = stream_groups(redis_url)
    groups = [g for _eid, g in entries]
    assert [(g.allocated_n, g.skipped_prompts) for g in groups] == [(4, 3 + 2), (5, 1), (3, 0)]
    lc = LearnerConfig(train_batch_size=3, stream={"block_ms": 50})
    reader = TrajectoryReader(redis.Redis.from_url(redis_url), NS)
    reader.setup()
    source = StreamSource(lc, reader, weight_version=lambda: 0, push=lambda: None,
                          engines_behind=lambda: [], uniform_n=4)  # fmt: skip
    batch = source.next_batch()
    assert batch is not None and batch.entry_ids == [eid for eid, _g in entries]
    assert batch.allocation == StepAllocation(above=1, at=1, below=1, skipped=6)


def test_a_teacher_scores_every_pushed_token(make_worker, redis_url, engine, model):
    """``rollout.teacher`` on the student's own engine (on-policy distillation's plumbing): every
    pushed token carries the teacher's log-prob, which is then the sampling one (temperature 1)."""
    worker = make_worker(
        f"rollout.teacher.engine_urls=[{engine}]", f"rollout.teacher.tokenizer={model}"
    )
    assert asyncio.run(run_and_close(worker, 1)) == 1
    groups = [g for _eid, g in stream_groups(redis_url)]
    assert groups
    for g in groups:
        for r in g.responses:
            assert len(r.teacher_logprobs) == len(r.token_ids) > 0
            diff = torch.tensor(list(r.teacher_logprobs)) - torch.tensor(list(r.logprobs))
            assert diff.abs().max().item() < 1e-3
