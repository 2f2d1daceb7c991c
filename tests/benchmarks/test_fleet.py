"""The fleet simulator (benchmarks/fleet.py): its simulated engines speak the engine protocol the
rollout worker's client uses; its saturation and sizing rules; and its ``--quick`` form runs the
whole path (Redis, allocator, reward service, a rollout worker, the stream reader) end to end."""

from __future__ import annotations

import asyncio
import json
import sys
from pathlib import Path

import httpx
import pytest

from dynamo_rl.procs import ServiceProcess, http_ok
from tests.benchmarks.bench import BENCHMARKS, bench_module
from tests.conftest import REPO


@pytest.fixture(scope="module")
def fleet():
    return bench_module("fleet")


def test_fleets_parse_and_bad_ones_are_named(fleet) -> None:
    assert [(f.engines, f.workers) for f in fleet.parse_fleets("8x1, 32X4")] == [(8, 1), (32, 4)]
    for bad in ("8", "8x0", "x4", "8x1x2"):
        with pytest.raises(ValueError, match="--fleets"):
            fleet.parse_fleets(bad)


def _fleet(label: str, n_workers: int, ratio: float, alloc_ms: float = 2.0, **cores: float) -> dict:
    base = dict.fromkeys(fleet_services(), 0.1)
    base.update(cores)
    base["total"] = sum(v for k, v in base.items() if k != "total")
    return {
        "fleet": label,
        "workers": n_workers,
        "ratio_to_capacity": ratio,
        "cores": base,
        "queue_growing": {"reward": False, "stream_lag": False, "engine_in_flight": False},
        "allocate_rpc": {"mean_ms": alloc_ms},
        "verify_http": {"mean_ms": 100.0},
        "reader": {"read_ack_ms_per_call": 10.0},
        "loadavg": 0.0,
    }


def fleet_services() -> tuple[str, ...]:
    return ("redis", "allocator", "reward", "engines", "reader", "workers")


def test_saturation_is_the_first_fleet_over_a_threshold(fleet) -> None:
    runs = [
        # One worker's synchronous batches: below 80% of capacity, but the reference, not saturated.
        _fleet("8x1", 1, 0.7, reward=0.3, workers=0.5),
        _fleet("32x4", 4, 0.75, reward=0.85, workers=2.0),  # 0.5 core per worker: not saturated
        _fleet("128x16", 16, 0.5, alloc_ms=6.0, workers=14.0),
    ]
    runs[1]["queue_growing"]["stream_lag"] = True
    runs[2]["loadavg"] = 1e6
    sat = fleet.saturation(runs)
    assert sat["reward"] == "32x4"  # its CPU
    assert sat["reader"] == "32x4"  # its queue (the stream's lag) kept growing
    assert sat["workers"] == "128x16"  # 14 cores over 16 workers
    assert sat["allocator"] == "128x16"  # latency 3x the smallest fleet's
    assert sat["redis"] is None and sat["engines"] is None
    assert sat["end_to_end"] == "128x16"  # 0.5 < 0.8 x 0.75; 0.75 is not below 0.8 x 0.7
    assert sat["machine"] == "128x16"


def test_replicas_cover_the_load_at_the_target_utilisation(fleet) -> None:
    # 1 core-ms per response, 10 responses/s per GPU: 1000 GPUs need 10 cores of reward, which at
    # half of an 8-core limit is 3 replicas (4 cores each).
    assert fleet.replicas_for(1000, 0.001, 10.0, "reward") == 3
    assert fleet.replicas_for(0, 0.001, 10.0, "reward") == 1
    assert fleet.replicas_for(1, 1e-9, 10.0, "allocator") == 1


def test_simulated_engines_answer_the_sglang_client(fleet, tmp_path: Path) -> None:
    from dynamo_rl.contracts.sampling import SamplingParams as Sampling
    from services.rollout.engines import SGLangEngine

    ports_file = tmp_path / "ports.json"
    proc = ServiceProcess(
        "engines",
        [sys.executable, str(BENCHMARKS / "fleet.py"), "engines", "--count", "2",
         "--ports", str(ports_file), "--tokens-per-s", "100000", "--symbolic", "1"],
        tmp_path / "engines.log", cwd=REPO,
    ).start()  # fmt: skip
    try:
        proc.wait_ready(ports_file.exists, timeout=60)
        urls = [f"http://127.0.0.1:{p}" for p in json.loads(ports_file.read_text())]
        assert len(set(urls)) == 2
        proc.wait_ready(http_ok(urls[1] + "/health"), timeout=60)

        async def ask() -> tuple[list, int]:
            engine = SGLangEngine(urls[1])
            try:
                samples = await engine.generate([5, 6, 7], 3, Sampling(max_tokens=5))
                return samples, await engine.weight_version()
            finally:
                await engine.aclose()

        samples, version = asyncio.run(ask())
        assert version == 0 and len(samples) == 3
        for s in samples:
            assert len(s.token_ids) == len(s.logprobs) == 5
            assert "\\frac{" in s.text  # --symbolic 1: every answer needs math-verify
        # Requests are checked with the engine's own request model: unknown fields are refused.
        bad = httpx.post(urls[0] + "/generate", json={"input_ids": [1], "sampling": {}})
        assert bad.status_code == 422
        stats = httpx.get(urls[0] + "/stats").json()
        assert stats["samples"] == 3 and stats["in_flight"] == 0
    finally:
        proc.stop()


@pytest.mark.slow
def test_quick_run_measures_the_whole_path(fleet, tmp_path: Path) -> None:
    out = tmp_path / "fleet.json"
    assert fleet.main(["--quick", "--out", str(out)]) == 0
    report = json.loads(out.read_text())
    (f,) = report["fleets"]
    assert f["fleet"] == "2x1" and f["responses"] > 0
    for phase in ("allocate", "generate", "verify", "push", "total"):
        assert f["batch_phase_s"][phase] > 0
    assert f["allocate_rpc"]["calls_per_s"] > 0 and f["verify_http"]["calls_per_s"] > 0
    assert f["reader"]["entries_per_read"] > 0
    for svc in fleet_services():
        assert svc in f["cores"]
    rows = report["projection"]["rows"]
    assert [r["gpus"] for r in rows] == list(fleet.CLUSTER_GPUS)
    assert all(r["reward_replicas"] >= 1 and r["allocator_replicas"] >= 1 for r in rows)
