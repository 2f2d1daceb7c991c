"""Single-turn trajectories are identical to the recorded ones for the same seed and config:
byte for byte in everything but the log-probs, which agree within ``LOGPROB_ATOL``.

Two batches of four prompts run through the real worker (``build_worker``) against a real
embedded engine, reward service and Redis, with ``rollout.sampling.seed`` and the worker id fixed.
The allocator is a stub giving fixed counts, so the batches cover a prompt whose count spans three
requests (5 with ``max_n_per_request=2``: chunked seeding), a prompt allocated 0 (no group), text
and chat prompts, a system message, and a prompt cut by ``prompt_len_policy=truncate_left``.

Each group read back from the stream is compared with ``data/single_turn_batches.json`` in two
parts: its log-probs, as numbers, and the rest (token ids, texts, rewards, reasons, versions,
sampling parameters and seed, ids), as its deterministic protobuf bytes with the log-probs
cleared. Normalised first, and only these, since they differ between two runs of the same code:

- ``timing`` (wall-clock stamps and phase durations) is cleared;
- ``batch_id``'s middle part, the worker's random session (``worker:session:index``), becomes
  ``SESSION``.

The log-probs are float32 sums of a forward pass: their last bits depend on the CPU's kernels
(the order of a matmul's accumulation differs between AVX2, AVX-512 and the scalar path), so they
are the one part a recording made on another machine cannot match bit for bit; the token ids are
sampled from them but did not change. The engine runs one sequence at a time
(``engine.max_batch_size=1``): batched, a sequence's log-probs also change in their last bits with
the sequences that share its forward pass, which depends on timing. The fixture also keeps each
group's prompt id, allocated count and response token ids, and the outcomes reported to the
allocator, to tell what differs when the bytes do. The worker runs twice in the test: both runs,
on one machine and one engine process, must agree with each other exactly (log-probs included)
and with the fixture as above. To record the fixture again (only when a change of the
trajectories is intended): ``DYNAMO_RL_RECORD_IDENTITY=1``.
"""

from __future__ import annotations

import asyncio
import hashlib
import json
import os
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
import redis

from dynamo_rl.codec import TrajectoryGroup, decode_entry
from dynamo_rl.config import load_config
from dynamo_rl.keys import trajectory_stream
from services.rollout.worker import build_worker
from tests.services.engine.engine_util import start_engine

NS = "identity"
FIXTURE = Path(__file__).parent / "data" / "single_turn_batches.json"
COUNTS = [[5, 0, 2, 3], [1, 4, 0, 2]]  # per batch, per prompt (max_n_per_request=2)
# Absolute tolerance on a recorded log-prob. Measured spread: the fixture's log-probs (all in
# [-5.9, -5.1], where a float32 ulp is 4.8e-7) re-recorded on an AVX2 machine and with
# ATEN_CPU_CAPABILITY=default, MKL_ENABLE_INSTRUCTIONS=SSE4_2 and DNNL_MAX_CPU_ISA=SSE41 differ by
# at most 9.5e-7 (2 ulps). 1e-4 leaves two orders of magnitude for other CPUs' kernels and stays
# 14 times below the smallest difference between two neighbouring tokens' log-probs in the
# fixture (1.4e-3): a log-prob taken from the wrong position, or a changed model or temperature,
# fails.
LOGPROB_ATOL = 1e-4


@pytest.fixture(scope="module")
def engine(model: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    """An embedded engine that runs one sequence at a time: a sequence's log-probs then do not
    depend on which others happened to share its forward pass (float sums in another order)."""
    proc, url = start_engine(model, tmp_path_factory.mktemp("engine"), "engine.max_batch_size=1")
    try:
        yield url
    finally:
        proc.stop()


def rows() -> list[dict[str, Any]]:
    """Eight prompts: chat, text, chat with a system message, and a long text prompt to cut."""
    out: list[dict[str, Any]] = []
    for i in range(8):
        q = f"{i}+{i}="
        prompt: Any = [{"role": "user", "content": q}]
        if i % 4 == 1:
            prompt = q
        elif i % 4 == 2:
            prompt = [{"role": "system", "content": "Add."}, {"role": "user", "content": q}]
        elif i % 4 == 3:
            prompt = "Add the numbers, then answer. " * 6 + q
        out.append({"id": f"p{i}", "prompt": prompt, "ground_truth": str(2 * i),
                    "data_source": "arith"})  # fmt: skip
    return out


@dataclass
class Allocation:
    counts: list[int]
    priorities: list[float]


class FixedAllocator:
    """Gives each batch its counts from :data:`COUNTS` and keeps the reported outcomes."""

    def __init__(self) -> None:
        self.batch = 0
        self.reported: list[list[list[Any]]] = []

    async def aallocate(self, namespace: str, ids: list[str], **_kw: int) -> Allocation:
        counts = COUNTS[self.batch]
        self.batch += 1
        assert len(ids) == len(counts)
        return Allocation(counts, [float(c) for c in counts])

    async def areport_outcomes(self, namespace: str, batch: list[tuple[str, int, int]]) -> None:
        self.reported.append([list(o) for o in batch])

    def close(self) -> None:
        pass


def normalised(group: TrajectoryGroup) -> TrajectoryGroup:
    g = TrajectoryGroup()
    g.CopyFrom(group)
    g.ClearField("timing")
    worker, _session, index = g.batch_id.split(":")
    g.batch_id = f"{worker}:SESSION:{index}"
    return g


def split_logprobs(group: TrajectoryGroup) -> tuple[TrajectoryGroup, list[list[float]]]:
    """The group without its responses' log-probs, and the log-probs, one list per response."""
    rest = TrajectoryGroup()
    rest.CopyFrom(group)
    logprobs = [list(r.logprobs) for r in rest.responses]
    for r in rest.responses:
        r.ClearField("logprobs")
    return rest, logprobs


def run_batches(redis_url: str, engine: str, reward: str, dataset: Path, model: Path) -> dict:
    cfg = load_config(
        None,
        [
            f"endpoints.redis_url={redis_url}",
            f"endpoints.engine_urls=[{engine}]",
            f"endpoints.reward_url={reward}",
            f"rollout.dataset={dataset}",
            f"rollout.tokenizer={model}",
            f"rollout.namespace={NS}",
            "rollout.worker_id=w0",
            "rollout.shuffle=false",
            "rollout.batch_size=4",
            "rollout.n=2",
            "rollout.n_min=0",
            "rollout.n_max=8",
            "rollout.max_n_per_request=2",
            "rollout.max_prompt_len=40",
            "rollout.prompt_len_policy=truncate_left",
            "rollout.sampling.max_tokens=6",
            "rollout.sampling.seed=1234",
            "rollout.poll_interval_s=0.1",
            "rollout.allocation=dynamic",  # the stub allocator's counts (a prompt allocated 0)
            "learner.algorithm.agg=prompt-mean",
        ],
        env={},
    )
    worker = build_worker(cfg)
    real = worker.allocator
    stub = FixedAllocator()
    worker.allocator, worker.allocator_factory = stub, None

    async def go() -> None:
        try:
            await worker.run(2)
        finally:
            await worker.aclose()
            await asyncio.to_thread(real.close)

    asyncio.run(go())
    client = redis.Redis.from_url(redis_url)
    try:
        entries = client.xrange(trajectory_stream(NS))
        client.flushdb()
    finally:
        client.close()
    groups = []
    for _eid, fields in entries:
        g, logprobs = split_logprobs(normalised(decode_entry(fields)))
        data = g.SerializeToString(deterministic=True)
        groups.append({
            "prompt_id": g.prompt_id,
            "allocated_n": g.allocated_n,
            "prompt_token_ids": list(g.prompt_token_ids),
            "response_token_ids": [list(r.token_ids) for r in g.responses],
            "logprobs": logprobs,
            "sha256": hashlib.sha256(data).hexdigest(),
            "bytes": data.hex(),
        })  # fmt: skip
    return {"groups": groups, "outcomes": stub.reported}


@pytest.mark.slow
def assert_matches_recorded(got: dict, want: dict) -> None:
    """``got`` (one run's groups and outcomes) is ``want`` (the fixture): every field exact but
    the log-probs, which agree within :data:`LOGPROB_ATOL`."""
    assert [g["prompt_id"] for g in got["groups"]] == [g["prompt_id"] for g in want["groups"]]
    for g, w in zip(got["groups"], want["groups"], strict=True):
        pid = g["prompt_id"]
        assert g["response_token_ids"] == w["response_token_ids"], pid
        assert [len(lp) for lp in g["logprobs"]] == [len(lp) for lp in w["logprobs"]], pid
        for i, (lp, wlp) in enumerate(zip(g["logprobs"], w["logprobs"], strict=True)):
            assert lp == pytest.approx(wlp, rel=0, abs=LOGPROB_ATOL), (pid, i)
        assert {k: v for k, v in g.items() if k != "logprobs"} == {
            k: v for k, v in w.items() if k != "logprobs"
        }, pid
    assert got["outcomes"] == want["outcomes"]


def test_single_turn_batches_match_the_recorded_ones(
    redis_url, engine, reward, model, tmp_path
) -> None:
    dataset = tmp_path / "train.jsonl"
    dataset.write_text("".join(json.dumps(r) + "\n" for r in rows()))
    first = run_batches(redis_url, engine, reward, dataset, model)
    second = run_batches(redis_url, engine, reward, dataset, model)
    # What the batches must cover: chunked seeding, a prompt left out, a truncated prompt.
    assert [g["prompt_id"] for g in first["groups"]] == ["p0", "p2", "p3", "p4", "p5", "p7"]
    assert [len(g["response_token_ids"]) for g in first["groups"]] == [5, 2, 3, 1, 4, 2]
    assert all(len(g["prompt_token_ids"]) <= 40 for g in first["groups"])
    assert second == first  # deterministic
    if os.environ.get("DYNAMO_RL_RECORD_IDENTITY") == "1":
        FIXTURE.parent.mkdir(exist_ok=True)
        FIXTURE.write_text(json.dumps(first, indent=1) + "\n")
    assert_matches_recorded(first, json.loads(FIXTURE.read_text()))
