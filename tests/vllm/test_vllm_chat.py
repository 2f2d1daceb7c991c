"""``POST /v1/chat/completions`` on a real vLLM server (CPU, the tiny model with
``engine_util.CHAT_TEMPLATE``), through the official ``openai`` client and the rollout worker's
client: the same request and the same checks as on the embedded engine
(``tests/services/engine/test_chat_completions.py``), the log-probs against the learner's
forward pass."""

from __future__ import annotations

import asyncio
import time

import openai
import pytest
import torch

from dynamo_rl.contracts.sampling import SamplingParams as Sampling
from services.rollout.build import load_tokenizer
from services.rollout.engines.openai import OpenAICompletionsEngine
from tests.services.engine.chat_util import MESSAGES, RENDERED, chat_kwargs, read_chat
from tests.vllm.conftest import VLLMServers
from tests.vllm.test_vllm_server import learner_logprobs, load_lm

pytestmark = pytest.mark.vllm


def test_chat_on_vllm_through_the_official_and_the_rollout_client(
    vllm_servers: VLLMServers,
) -> None:
    server = vllm_servers.get()  # raw_logprobs: at T=1 the sampling distribution's log-probs
    tok = load_tokenizer(str(server.model))
    policy = load_lm(server.model)
    t0 = time.monotonic()
    with openai.OpenAI(
        base_url=f"{server.url}/v1", api_key="unused", max_retries=0, timeout=180.0
    ) as client:
        model = client.models.list().data[0].id
        prompt, choices = read_chat(client.chat.completions.create(**chat_kwargs(model)), n=2)
        again = read_chat(client.chat.completions.create(**chat_kwargs(model)), n=2)[1]
    official_s = time.monotonic() - t0

    # vLLM renders the checkpoint's template exactly as the embedded engine does.
    assert tok.decode(prompt) == RENDERED
    assert again == choices  # the same seed, the same samples
    assert choices[0].token_ids != choices[1].token_ids  # n samples, each its own stream
    for c in choices:
        assert c.token_ids and c.finish_reason in ("stop", "length")
        want = learner_logprobs(policy, prompt, c.token_ids, 1.0)
        torch.testing.assert_close(torch.tensor(c.logprobs), want, atol=1e-3, rtol=0)
        # The content is the ids' text, except that vLLM's detokenizer leaves out a trailing
        # incomplete UTF-8 sequence (the random model's bytes) which the tokenizer writes as
        # U+FFFD.
        decoded = tok.decode(c.token_ids, skip_special_tokens=True)
        assert c.content and decoded.startswith(c.content), (c.content, decoded)
        assert set(decoded[len(c.content) :]) <= {"\ufffd"}, (c.content, decoded)

    async def run():
        engine = OpenAICompletionsEngine(server.url, weight_api="vllm", timeout_s=180.0)
        try:
            out = await engine.chat(MESSAGES, 2, Sampling(max_tokens=12, temperature=1.0, seed=7))
            return out, await engine.weight_version()
        finally:
            await engine.aclose()

    t1 = time.monotonic()
    got, version = asyncio.run(run())
    print(f"official client: 2 requests in {official_s:.1f}s; rollout client: "
          f"{time.monotonic() - t1:.1f}s")  # fmt: skip
    assert got.prompt_token_ids == prompt
    assert [s.token_ids for s in got.samples] == [c.token_ids for c in choices]
    for s, c in zip(got.samples, choices, strict=True):
        assert s.logprobs == pytest.approx(c.logprobs, abs=1e-5)
        assert s.text == c.content and s.engine_url == server.url
        assert s.weight_version == version and s.weight_versions == [version] * len(s.token_ids)
