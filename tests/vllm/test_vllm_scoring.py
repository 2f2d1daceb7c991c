"""On-policy distillation's teacher scoring against the real vLLM server (CPU, tiny model): the
project's request (``score_request``: prompt and response as one token-id prompt,
``prompt_logprobs: 0``) read through the rollout client (``OpenAICompletionsEngine.score``)
gives the log-probs of the learner's forward pass of the served model, as the embedded engine
does (``tests/services/engine/test_engine_scoring.py``)."""

from __future__ import annotations

import asyncio

import pytest
import torch

from services.rollout.engines.openai import OpenAICompletionsEngine
from tests.vllm.conftest import TinyModels, VLLMServers
from tests.vllm.test_vllm_server import learner_logprobs, load_lm

pytestmark = pytest.mark.vllm

CASES = [([10, 20, 30], [5, 6, 7, 8, 9]), ([40, 41], [100, 3, 250, 17]), ([7], [7])]


def test_teacher_scores_are_the_forward_pass(
    vllm_servers: VLLMServers, tiny_models: TinyModels
) -> None:
    server = vllm_servers.get()  # raw_logprobs

    async def run() -> list[list[float]]:
        engine = OpenAICompletionsEngine(server.url, weight_api="vllm", timeout_s=180.0)
        try:
            return [await engine.score(p, r) for p, r in CASES]
        finally:
            await engine.aclose()

    got = asyncio.run(run())
    policy = load_lm(tiny_models.served)
    for (prompt, response), lps in zip(CASES, got, strict=True):
        want = learner_logprobs(policy, prompt, response, 1.0)
        assert len(lps) == len(response)
        torch.testing.assert_close(torch.tensor(lps), want, atol=1e-3, rtol=0)
