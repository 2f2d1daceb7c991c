"""Sampling in rounds (``rollout.round_size``, Reinforce-Ada) through the real worker: a real
embedded engine, allocator and Redis; the reward client is a stand-in that decides which
responses are correct, so the test knows which prompt has signal when."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Any

import pytest

from dynamo_rl.clients.allocator import AllocatorClient
from dynamo_rl.contracts.reward import ItemResult
from services.rollout.worker import build_worker
from tests.services.rollout.conftest import write_sums
from tests.services.rollout.helpers import run_worker, stream_groups, worker_config

NS = "rounds"


@pytest.fixture(scope="module")
def dataset(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return write_sums(tmp_path_factory.mktemp("data") / "train.parquet", 3)


class FirstOfPromptZero:
    """Correct: the first response of each round of the batch's first prompt (item ids
    ``batch:prompt:round:response``); every other response is wrong. Keeps each call's ids."""

    def __init__(self) -> None:
        self.calls: list[list[str]] = []

    async def verify(self, items: Sequence[Any]) -> list[ItemResult]:
        self.calls.append([str(it.id) for it in items])
        out = []
        for it in items:
            _batch, prompt, _round, response = str(it.id).split(":")
            right = prompt == "0" and response == "0"
            reason = "ok" if right else "wrong_answer"
            out.append(ItemResult(id=it.id, score=float(right), correct=right, format_ok=True,
                                  reason=reason))  # fmt: skip
        return out

    async def aclose(self) -> None:
        pass


def test_a_prompt_with_signal_stops_early_the_others_run_to_their_count(
    redis_url: str, engine: str, allocator: str, dataset: Path, model: Path
) -> None:
    cfg = worker_config(
        NS, redis_url, engine, "http://127.0.0.1:9", allocator, dataset,
        f"rollout.tokenizer={model}", "rollout.batch_size=3", "rollout.n=5",
        "rollout.round_size=2", "rollout.shuffle=false", "rollout.sampling.max_tokens=4",
        "rollout.sampling.seed=7",
    )  # fmt: skip
    worker = build_worker(cfg)
    reward = FirstOfPromptZero()
    worker.reward = reward  # type: ignore[assignment]
    assert run_worker(worker, 1) == 1
    groups = {g.prompt_id: g for g in stream_groups(redis_url, NS)}
    ids = sorted(groups)
    # The first prompt: one round of 2, one right and one wrong. The others: never right, so
    # rounds of 2, 2 and 1 up to their count of 5.
    sizes = {pid: len(g.responses) for pid, g in groups.items()}
    assert sorted(sizes.values()) == [2, 5, 5], sizes
    first = min(ids, key=lambda pid: sizes[pid])  # the batch's first prompt
    assert [r.correct for r in groups[first].responses] == [True, False]
    assert all(g.allocated_n == 5 for g in groups.values())  # the cap, uniform n
    for pid in ids:  # a later round samples with seeds of its own: it does not repeat round 0
        tokens = [list(r.token_ids) for r in groups[pid].responses]
        assert tokens[2:4] != tokens[:2] or pid == first
    assert len(reward.calls) == 1 + 3 + 3  # one verify call per prompt and round
    # The allocator is told the episodes played, not the cap.
    with AllocatorClient(allocator) as client:
        stats = {s.prompt_id: (s.samples, s.successes) for s in client.get_stats(NS, ids)}
    assert stats[first] == (2.0, 1.0)
    assert sorted(stats.values()) == [(2.0, 1.0), (5.0, 0.0), (5.0, 0.0)]
