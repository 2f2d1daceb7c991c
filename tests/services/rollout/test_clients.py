"""Engine clients and the replica pool against a real embedded engine process (one per module)."""

from __future__ import annotations

import asyncio
import signal
import time
from collections.abc import Iterator, Sequence
from pathlib import Path

import httpx
import pytest
import torch

from dynamo_rl.contracts.sampling import SamplingParams as Sampling
from dynamo_rl.contracts.weight_control import send
from learner.tiny_model import build_tiny_model
from services.rollout.engines import (
    Engine,
    EnginePool,
    EngineRequestError,
    EngineUnavailable,
    OpenAICompletionsEngine,
    Sample,
    SGLangEngine,
    make_engine,
)
from tests.services.engine.engine_util import load_reference, reference_logprobs, start_engine

PROMPT = [72, 105, 33, 32]  # arbitrary in-vocabulary ids of the byte-level tokenizer


@pytest.fixture(scope="module")
def models(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path]:
    root = tmp_path_factory.mktemp("models")
    return build_tiny_model(root / "a", seed=0), build_tiny_model(root / "b", seed=1)


@pytest.fixture(scope="module")
def engine(models: tuple[Path, Path], tmp_path_factory: pytest.TempPathFactory) -> Iterator:
    proc, url = start_engine(models[0], tmp_path_factory.mktemp("engine"))
    try:
        yield proc, url
    finally:
        proc.stop()


@pytest.fixture(scope="module")
def reference(models: tuple[Path, Path]) -> torch.nn.Module:
    return load_reference(models[0])


def run(coro):
    return asyncio.run(coro)


def generate_once(
    pool: EnginePool, prompt: Sequence[int] = PROMPT, n: int = 1, sampling: Sampling | None = None
) -> list[Sample]:
    """One ``pool.generate``, then the pool closed."""

    async def go() -> list[Sample]:
        try:
            return await pool.generate(prompt, n, sampling or Sampling(max_tokens=2))
        finally:
            await pool.aclose()

    return run(go())


def dead_url() -> str:
    from dynamo_rl.procs import free_port

    return f"http://127.0.0.1:{free_port()}"  # nothing listens there


def assert_matches_model(model: torch.nn.Module, prompt: Sequence[int], s: Sample) -> None:
    assert len(s.token_ids) == len(s.logprobs) > 0
    ref = reference_logprobs(model, prompt, s.token_ids)
    diff = (torch.tensor(s.logprobs) - ref).abs().max().item()
    assert diff < 1e-4, diff


@pytest.mark.parametrize("api", ["openai", "sglang"])
def test_generate_returns_n_samples_whose_logprobs_match_the_model(
    engine, reference, api: str
) -> None:
    _proc, url = engine
    client = make_engine(url, engine_api=api)
    assert isinstance(client, OpenAICompletionsEngine if api == "openai" else SGLangEngine)
    assert isinstance(client, Engine)

    async def go() -> tuple[list[Sample], int, bool]:
        try:
            samples = await client.generate(PROMPT, 5, Sampling(max_tokens=12, seed=3))
            return samples, await client.weight_version(), await client.health()
        finally:
            await client.aclose()

    samples, version, healthy = run(go())
    assert len(samples) == 5 and healthy and version == 0
    for s in samples:
        assert s.finish_reason in ("stop", "length")
        assert s.weight_version == 0 and s.engine_url == url
        assert_matches_model(reference, PROMPT, s)
    # Five samples of 12 random byte tokens: distinct unless sampling ignored n.
    assert len({tuple(s.token_ids) for s in samples}) > 1


def test_openai_and_sglang_clients_sample_the_same_with_the_same_seed(engine) -> None:
    _proc, url = engine

    async def go() -> tuple[list[Sample], list[Sample]]:
        a, b = make_engine(url, engine_api="openai"), make_engine(url, engine_api="sglang")
        try:
            sampling = Sampling(max_tokens=10, temperature=0.0)
            return await a.generate(PROMPT, 1, sampling), await b.generate(PROMPT, 1, sampling)
        finally:
            await a.aclose()
            await b.aclose()

    a, b = run(go())
    assert a[0].token_ids == b[0].token_ids


@pytest.mark.parametrize("api", ["openai", "sglang"])
@pytest.mark.parametrize(
    ("prompt", "n", "sampling", "field"),
    [
        ([5, 99999], 1, Sampling(max_tokens=4), None),  # token outside the vocabulary
        (PROMPT, 0, Sampling(max_tokens=4), "n"),
        (PROMPT, 1, Sampling(max_tokens=-1), "max"),  # max_tokens / max_new_tokens
    ],
)
def test_bad_requests_raise_request_errors_naming_the_field(
    engine, api: str, prompt: list[int], n: int, sampling: Sampling, field: str | None
) -> None:
    _proc, url = engine
    client = make_engine(url, engine_api=api)

    async def go() -> None:
        try:
            await client.generate(prompt, n, sampling)
        finally:
            await client.aclose()

    with pytest.raises(EngineRequestError) as info:
        run(go())
    assert info.value.status == 422
    text = str(info.value.detail)
    assert (field or "99999") in text
    # A request error is the caller's bug: the pool must not retry it on another replica.
    failures: list[str] = []
    pool = EnginePool(
        [make_engine(url, engine_api=api)], on_failure=lambda u, _e: failures.append(u)
    )
    with pytest.raises(EngineRequestError):
        generate_once(pool, prompt, n, sampling)
    assert failures == []


def test_unknown_field_is_refused_with_its_name(engine) -> None:
    _proc, url = engine
    r = httpx.post(
        f"{url}/v1/completions",
        json={"prompt": PROMPT, "max_tokens": 2, "max_token": 3},
        timeout=30,
    )
    assert r.status_code == 422 and "max_token" in r.text


async def _load_from_disk(client: SGLangEngine, path: str, version: int) -> None:
    """The learner's disk push, through the engine-control contract."""
    call = client.weights.update_from_disk(path, version)
    await asyncio.to_thread(send, client.weights, client.url, call, timeout_s=120)


def test_weight_update_from_disk_changes_outputs_and_version(engine, models) -> None:
    _proc, url = engine
    client = SGLangEngine(url)
    greedy = Sampling(max_tokens=16, temperature=0.0)
    other = load_reference(models[1])

    async def go() -> tuple[list[Sample], list[Sample], int, int]:
        try:
            before = await client.generate(PROMPT, 1, greedy)
            await _load_from_disk(client, str(models[1]), 7)
            after = await client.generate(PROMPT, 1, greedy)
            version = await client.weight_version()
            await _load_from_disk(client, str(models[0]), 8)
            return before, after, version, await client.weight_version()
        finally:
            await client.aclose()

    before, after, version, restored = run(go())
    assert version == 7 and restored == 8
    assert after[0].weight_version == 7
    # Random tiny models may agree on the greedy tokens; their probabilities cannot.
    assert before[0].logprobs != pytest.approx(after[0].logprobs, abs=1e-3)
    assert_matches_model(other, PROMPT, after[0])


class CountingEngine:
    """A real engine client that counts the requests it was given (to see the spread)."""

    def __init__(self, inner: Engine) -> None:
        self.inner = inner
        self.url = inner.url
        self.calls = 0

    async def generate(self, prompt: Sequence[int], n: int, sampling: Sampling) -> list[Sample]:
        self.calls += 1
        return await self.inner.generate(prompt, n, sampling)

    async def weight_version(self) -> int:
        return await self.inner.weight_version()

    async def health(self) -> bool:
        return await self.inner.health()

    async def aclose(self) -> None:
        await self.inner.aclose()


def test_pool_spreads_requests_and_moves_past_a_dead_replica(engine) -> None:
    _proc, url = engine
    replicas = [CountingEngine(make_engine(u)) for u in (url, dead_url(), url)]
    failures: list[str] = []
    pool = EnginePool(
        replicas, backoff_s=30.0, backoff_max_s=30.0, on_failure=lambda u, _e: failures.append(u)
    )

    async def go() -> tuple[list[list[Sample]], dict[str, int]]:
        try:
            out = await asyncio.gather(
                *(pool.generate(PROMPT, 2, Sampling(max_tokens=4)) for _ in range(9))
            )
            return out, await pool.weight_versions()
        finally:
            await pool.aclose()

    results, versions = run(go())
    assert all(len(r) == 2 for r in results)
    # Only the first concurrent wave can reach the dead replica; once benched it gets nothing.
    assert set(failures) == {replicas[1].url} and len(failures) <= 3
    assert replicas[0].calls >= 3 and replicas[2].calls >= 3  # both live replicas took a share
    assert replicas[0].calls + replicas[2].calls == 9
    assert list(versions) == [url]  # the benched replica is not asked


def test_pool_with_no_replica_left_waits_then_gives_up_after_max_wait() -> None:
    waits: list[float] = []
    pool = EnginePool(
        [make_engine(dead_url()), make_engine(dead_url())],
        backoff_s=0.1,
        backoff_max_s=0.2,
        max_wait_s=1.0,
        on_wait=waits.append,
    )
    start = time.monotonic()
    with pytest.raises(EngineUnavailable, match="engine_max_wait_s"):
        generate_once(pool)
    assert time.monotonic() - start >= 1.0
    assert len(waits) >= 2


def test_pool_bench_delays_are_capped() -> None:
    """Consecutive failures double a replica's bench up to backoff_max_s, never beyond."""
    waits: list[float] = []
    pool = EnginePool(
        [make_engine(dead_url())],
        backoff_s=0.01,
        backoff_max_s=0.04,
        max_wait_s=0.6,
        on_wait=waits.append,
    )
    with pytest.raises(EngineUnavailable):
        generate_once(pool)
    assert pool.replicas[0].failures >= 5  # 0.01 · 2^4 would exceed the cap uncapped
    assert waits and max(waits) <= 0.04


def test_pool_waits_while_the_only_replica_is_frozen_and_resumes(engine) -> None:
    proc, url = engine
    failures: list[str] = []
    # A short request deadline turns the frozen engine into timeouts the pool must ride out.
    pool = EnginePool(
        [OpenAICompletionsEngine(url, model="m", timeout_s=1.0)],
        backoff_s=0.2,
        backoff_max_s=0.5,
        on_failure=lambda u, _e: failures.append(u),
    )

    async def go() -> list[Sample]:
        proc.signal(signal.SIGSTOP)
        try:
            task = asyncio.create_task(pool.generate(PROMPT, 2, Sampling(max_tokens=4)))
            await asyncio.sleep(2.5)
            assert not task.done()
        finally:
            proc.signal(signal.SIGCONT)
        try:
            return await asyncio.wait_for(task, 60)
        finally:
            await pool.aclose()

    samples = run(go())
    assert len(samples) == 2
    assert len(failures) >= 1


def test_pool_holds_a_replica_back_from_a_failure_until_its_weights_are_fresh(engine) -> None:
    """A replica that failed (here frozen, its requests timing out) and answers again may have
    restarted on old weights: the pool sends it requests again only once ``admit`` accepts the
    version it reports (the worker's: within ``rollout.max_staleness`` of the learner)."""
    proc, url = engine
    client = OpenAICompletionsEngine(url, model="m", timeout_s=1.0)
    learner = {"version": 0}
    asked: list[int] = []

    async def admit(version: int) -> bool:
        asked.append(version)
        return learner["version"] - version <= 1

    pool = EnginePool([client], backoff_s=0.2, backoff_max_s=0.5, admit=admit)

    async def until(cond, what: str) -> None:
        deadline = time.monotonic() + 60
        while not cond():
            assert time.monotonic() < deadline, f"timed out waiting for {what}"
            await asyncio.sleep(0.05)

    async def go() -> tuple[list[Sample], int]:
        try:
            version = await client.weight_version()
            learner["version"] = version + 5  # the learner has moved on: too old to serve
            await pool.generate(PROMPT, 1, Sampling(max_tokens=2))
            assert asked == []  # a replica that has not failed is not asked
            proc.signal(signal.SIGSTOP)
            try:
                task = asyncio.create_task(pool.generate(PROMPT, 2, Sampling(max_tokens=4)))
                await until(lambda: pool.replicas[0].failures >= 1, "the frozen replica to fail")
            finally:
                proc.signal(signal.SIGCONT)
            await until(lambda: len(asked) >= 3, "the pool to ask the replica's version again")
            assert not task.done() and pool.replicas[0].held
            learner["version"] = version + 1  # pushed to: within max_staleness 1
            return await asyncio.wait_for(task, 60), version
        finally:
            await pool.aclose()

    samples, version = run(go())
    assert len(samples) == 2
    assert set(asked) == {version} and not pool.replicas[0].held
