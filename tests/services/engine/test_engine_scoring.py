"""Teacher scoring (on-policy distillation) on a real embedded engine: ``prompt_logprobs`` of a
``/v1/completions`` request equal a fresh forward pass of the model, read through the rollout's
client (:meth:`OpenAICompletionsEngine.score`), and alternatives are refused."""

from __future__ import annotations

import asyncio
from collections.abc import Iterator
from pathlib import Path

import pytest
import torch

from services.rollout.engines.openai import OpenAICompletionsEngine
from tests.services.engine.engine_util import (
    complete,
    load_reference,
    reference_logprobs,
    running_engine,
)

CASES = [([10, 20, 30], [5, 6, 7, 8, 9]), ([40, 41], [100, 3, 250, 17]), ([7], [7])]


@pytest.fixture(scope="module")
def engine(model_dir: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    with running_engine(
        model_dir, tmp_path_factory.mktemp("engine-scoring"), "engine.register_in_redis=false",
        "engine.batch_wait_ms=5",
    ) as url:  # fmt: skip
        yield url


def test_scores_equal_a_fresh_forward_pass(engine: str, model_dir: Path) -> None:
    reference = load_reference(model_dir)

    async def scores() -> list[list[float]]:
        client = OpenAICompletionsEngine(engine)
        try:
            return await asyncio.gather(*(client.score(p, r) for p, r in CASES))
        finally:
            await client.aclose()

    got = asyncio.run(scores())
    for (prompt, response), lps in zip(CASES, got, strict=True):
        want = reference_logprobs(reference, prompt, response)
        assert len(lps) == len(response)
        torch.testing.assert_close(torch.tensor(lps), want, atol=1e-3, rtol=0)


def test_prompt_logprobs_shape_and_ranks(engine: str, model_dir: Path) -> None:
    ids = [10, 20, 30, 40]
    r = complete(engine, prompt=ids, max_tokens=1, prompt_logprobs=0, n=2, temperature=0.0)
    assert r.status_code == 200, r.text
    reference = load_reference(model_dir)
    with torch.inference_mode():
        logp = torch.log_softmax(reference(input_ids=torch.tensor([ids])).logits[0].float(), -1)
    for choice in r.json()["choices"]:
        entries = choice["prompt_logprobs"]
        assert entries[0] is None and len(entries) == len(ids)
        for i in range(1, len(ids)):
            ((key, entry),) = entries[i].items()
            assert key == str(ids[i])
            row = logp[i - 1]
            assert entry["rank"] == int((row > row[ids[i]]).sum()) + 1


def test_alternatives_are_refused(engine: str) -> None:
    r = complete(engine, prompt=[1, 2, 3], max_tokens=1, prompt_logprobs=2)
    assert r.status_code == 422
    assert "prompt_logprobs" in r.text and "only (0)" in r.text
