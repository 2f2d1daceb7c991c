"""Invariants of the rollout worker and the engine's seeding, each against real processes.

- a group whose samples come from engines at different weight versions reports the oldest;
- outcomes kept while the allocator is down are added up, not overwritten, until it is back;
- seed 0 is a seed (reproducible, and recorded as 0), "no seed" is recorded as absent;
- the engine derives per-sample seeds so that distinct request seeds share no sample's stream.

Two real embedded engines (one pushed to a newer weight version), a reward service and Redis;
the allocator is started by the test that needs it down first.
"""

from __future__ import annotations

import asyncio
import re
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
import redis

from allocator.server import SERVICE_NAME
from dynamo_rl.clients.allocator import AllocatorClient
from dynamo_rl.codec import TrajectoryGroup
from dynamo_rl.contracts.weight_control import send
from dynamo_rl.procs import ServiceProcess, free_port, grpc_healthy
from services.rollout.engines import SGLangEngine
from services.rollout.worker import RolloutWorker, build_worker
from tests.conftest import REPO, dynamo_rl_argv
from tests.services.engine.engine_util import start_engine
from tests.services.rollout import helpers
from tests.services.rollout.conftest import write_sums
from tests.services.rollout.helpers import run_and_close, worker_config

NS = "winv"
NEWER = 3  # the weight version pushed to the second engine


@pytest.fixture(scope="module")
def dataset(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return write_sums(tmp_path_factory.mktemp("data") / "train.parquet", 4)


@pytest.fixture(scope="module")
def engines(model: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[str, str]]:
    """Two engines on the same weights: the first at version 0, the second pushed to NEWER."""
    old_proc, old = start_engine(model, tmp_path_factory.mktemp("engine-old"))
    try:
        new_proc, new = start_engine(model, tmp_path_factory.mktemp("engine-new"))
        try:

            async def push() -> None:
                sg = SGLangEngine(new)
                try:
                    call = sg.weights.update_from_disk(str(model), NEWER)
                    await asyncio.to_thread(send, sg.weights, sg.url, call, timeout_s=120)
                finally:
                    await sg.aclose()

            asyncio.run(push())
            yield old, new
        finally:
            new_proc.stop()
    finally:
        old_proc.stop()


def make_worker(
    redis_url: str,
    engine_urls: list[str],
    reward: str,
    dataset: Path,
    model: Path,
    *extra: str,
    allocator: str | None = None,
) -> RolloutWorker:
    """A worker on one prompt per batch; ``allocator``: its address (default: nothing listens)."""
    cfg = worker_config(
        NS, redis_url, ", ".join(engine_urls), reward, allocator or f"127.0.0.1:{free_port()}",
        dataset, f"rollout.tokenizer={model}", "rollout.allocation=uniform",
        "rollout.shuffle=false", "rollout.batch_size=1", "rollout.sampling.max_tokens=8",
        "rollout.allocator_timeout_s=1", *extra,
    )  # fmt: skip
    return build_worker(cfg)


def stream_groups(redis_url: str) -> list[TrajectoryGroup]:
    return helpers.stream_groups(redis_url, NS)


def sequences_served(url: str) -> float:
    text = httpx.get(f"{url}/metrics", timeout=10).text
    m = re.search(r"^dynamo_engine_sequences_total (\S+)$", text, re.MULTILINE)
    assert m, text[:2000]
    return float(m.group(1))


def test_a_group_reports_the_oldest_weight_version_of_its_samples(
    redis_url: str, engines: tuple[str, str], reward: str, dataset: Path, model: Path
) -> None:
    old, new = engines
    before = [sequences_served(old), sequences_served(new)]
    # Six samples of one prompt in two requests of three: the pool sends the second request to
    # the idle replica, so the group holds samples of version 0 and of version NEWER.
    worker = make_worker(
        redis_url, [old, new], reward, dataset, model,
        "rollout.n=6", "rollout.max_n_per_request=3", f"rollout.max_staleness={NEWER}",
    )  # fmt: skip
    assert asyncio.run(run_and_close(worker, 1)) == 1
    served = [sequences_served(old) - before[0], sequences_served(new) - before[1]]
    assert served == [3.0, 3.0], "each engine must have sampled half of the group"
    (group,) = stream_groups(redis_url)
    assert len(group.responses) == 6
    assert group.weight_version == 0  # the oldest: the newest would understate staleness


def test_outcomes_kept_through_an_allocator_outage_are_added_up(
    redis_url: str, redis_server: str, engines: tuple[str, str], reward: str, dataset: Path,
    model: Path, tmp_path: Path,
) -> None:  # fmt: skip
    port = free_port()
    worker = make_worker(
        redis_url, [engines[0]], reward, dataset, model, allocator=f"127.0.0.1:{port}"
    )
    argv = dynamo_rl_argv(
        "allocator", "--redis-url", redis_server, "--port", str(port), "--metrics-port", "0"
    )
    proc = ServiceProcess("allocator", argv, tmp_path / "allocator.log", cwd=REPO)

    async def go() -> None:
        try:
            await worker.report([("pa", 4, 1), ("pb", 2, 0)])  # allocator down: kept
            await worker.report([("pa", 4, 3)])  # the same prompt again, still down
            assert worker._unreported == {"pa": [8, 4], "pb": [2, 0]}
            await asyncio.to_thread(
                lambda: proc.start().wait_ready(grpc_healthy(f"127.0.0.1:{port}", SERVICE_NAME))
            )
            await worker.report([("pa", 2, 2)])  # back: everything kept goes with this one
            assert worker._unreported == {}
        finally:
            await worker.aclose()

    try:
        asyncio.run(go())
        with AllocatorClient(f"127.0.0.1:{port}") as client:
            stats = {
                s.prompt_id: (s.samples, s.successes) for s in client.get_stats(NS, ["pa", "pb"])
            }
    finally:
        proc.stop()
    assert stats == {"pa": (10, 6), "pb": (2, 0)}
    failures = worker.metrics.metrics.registry.get_sample_value(
        "dynamo_rollout_report_failures_total"
    )
    assert failures == 2


def _tokens(groups: list[TrajectoryGroup]) -> list[list[list[int]]]:
    return [[list(r.token_ids) for r in g.responses] for g in groups]


def test_seed_zero_is_reproducible_and_recorded_no_seed_is_absent(
    redis_url: str, engines: tuple[str, str], reward: str, dataset: Path, model: Path
) -> None:
    client = redis.Redis.from_url(redis_url)
    runs: dict[str, list[TrajectoryGroup]] = {}
    # One request per batch (n = max_n_per_request), so every run batches the engine alike.
    common = ("rollout.n=3", "rollout.max_n_per_request=3")
    for name, seed in (("zero-a", ["rollout.sampling.seed=0"]), ("zero-b", ["rollout.sampling.seed=0"]), ("none-a", []), ("none-b", [])):  # fmt: skip
        worker = make_worker(redis_url, [engines[0]], reward, dataset, model, *common, *seed)
        assert asyncio.run(run_and_close(worker, 2)) == 2
        runs[name] = stream_groups(redis_url)
        client.flushdb()
    client.close()
    assert len(runs["zero-a"]) == 2
    assert _tokens(runs["zero-a"]) == _tokens(runs["zero-b"])  # seed 0 reproduces
    assert _tokens(runs["none-a"]) != _tokens(runs["none-b"])  # unseeded does not
    for g in runs["zero-a"]:
        assert g.sampling.HasField("seed") and g.sampling.seed == 0
    for g in runs["none-a"]:
        assert not g.sampling.HasField("seed")  # "no seed" is not recorded as seed 0


def _complete(url: str, **body: Any) -> list[list[int]]:
    payload = {"prompt": [40, 41, 42, 43], "max_tokens": 12, "temperature": 1.0,
               "return_token_ids": True, **body}  # fmt: skip
    r = httpx.post(f"{url}/v1/completions", json=payload, timeout=60)
    assert r.status_code == 200, r.text
    return [c["token_ids"] for c in r.json()["choices"]]


def _generate(url: str, **params: Any) -> list[list[int]]:
    """The SGLang-native route: the worker's default engine API."""
    sp = {"max_new_tokens": 12, "temperature": 1.0, **params}
    r = httpx.post(f"{url}/generate", json={"input_ids": [40, 41, 42, 43], "sampling_params": sp},
                   timeout=60)  # fmt: skip
    assert r.status_code == 200, r.text
    return [o["output_ids"] for o in r.json()]


def _sample(url: str, route: str, seed: int | None) -> list[list[int]]:
    """Three samples of one prompt through ``route``, seeded with ``seed`` (None: unseeded)."""
    if route == "completions":
        return _complete(url, n=3, **({} if seed is None else {"seed": seed}))
    return _generate(url, n=3, **({} if seed is None else {"sampling_seed": seed}))


@pytest.mark.parametrize("route", ["completions", "generate"])
def test_engine_seed_zero_reproduces_and_distinct_seeds_share_no_sample(
    engines: tuple[str, str], route: str
) -> None:
    url = engines[0]
    zero = _sample(url, route, 0)
    assert zero == _sample(url, route, 0)
    assert zero != _sample(url, route, None)  # unseeded differs from seed 0
    five, six = _sample(url, route, 5), _sample(url, route, 6)
    # With per-sample seeds seed + k, sample 1 of seed 5 was sample 0 of seed 6.
    samples = [tuple(s) for s in (*zero, *five, *six)]
    assert len(set(samples)) == len(samples), "two requests share a sample's stream"
