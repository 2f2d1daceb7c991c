"""``POST /v1/chat/completions`` on a real embedded engine process, through the official ``openai``
client and the rollout worker's client: the messages rendered by the checkpoint's chat template,
the sampled token ids in vLLM's ``"token_id:<id>"`` convention, their log-probs (the completion
path's, and a fresh forward pass's), seeds, ``n``, and the 400s naming the field.
(Without a chat template: ``test_openai_client.py``; on real vLLM:
``tests/vllm/test_vllm_chat.py``.)
"""

from __future__ import annotations

import asyncio
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import openai
import pytest
import torch

from dynamo_rl.contracts.sampling import SamplingParams as Sampling
from learner.tiny_model import build_tiny_model
from services.rollout.engines.openai import OpenAICompletionsEngine
from tests.services.engine.chat_util import MESSAGES, RENDERED, chat_kwargs, read_chat
from tests.services.engine.engine_util import (
    CHAT_TEMPLATE,
    complete,
    load_reference,
    reference_logprobs,
    running_engine,
)


@pytest.fixture(scope="module")
def chat_model(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return build_tiny_model(
        tmp_path_factory.mktemp("chat") / "m", hidden_size=32, num_layers=2, num_heads=2,
        num_kv_heads=1, max_positions=256, chat_template=CHAT_TEMPLATE,
    )  # fmt: skip


@pytest.fixture(scope="module")
def url(chat_model: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    with running_engine(chat_model, tmp_path_factory.mktemp("engine")) as u:
        yield u


@pytest.fixture(scope="module")
def client(url: str) -> Iterator[openai.OpenAI]:
    with openai.OpenAI(base_url=f"{url}/v1", api_key="unused", max_retries=0) as c:
        yield c


def ask(client: openai.OpenAI, **kw: int) -> Any:
    return client.chat.completions.create(**chat_kwargs("m", **kw))


def test_chat_gives_token_ids_and_logprobs_through_the_official_client(
    client: openai.OpenAI, url: str, chat_model: Path
) -> None:
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(chat_model)
    prompt, choices = read_chat(ask(client), n=2)
    # The checkpoint's template, with the generation prompt, is what was sampled after.
    assert tok.decode(prompt) == RENDERED
    assert prompt == tok.encode(
        tok.apply_chat_template(MESSAGES, tokenize=False, add_generation_prompt=True),
        add_special_tokens=False,
    )
    for c in choices:
        assert c.token_ids and tok.decode(c.token_ids, skip_special_tokens=True) == c.content
        assert c.finish_reason in ("stop", "length")
    assert choices[0].token_ids != choices[1].token_ids  # n samples, each its own stream

    # The same seed gives the same samples; another seed other ones.
    assert read_chat(ask(client), n=2)[1] == choices
    other = read_chat(ask(client, seed=8), n=2)[1]
    assert [c.token_ids for c in other] != [c.token_ids for c in choices]

    # One generation path: /v1/completions of the rendered prompt with that seed samples the
    # same tokens with the same log-probs; a fresh unpadded forward pass agrees (T=1, no
    # top-p/top-k: the processed log-probs are the model's).
    body = complete(url, prompt=prompt, n=2, seed=7, temperature=1.0, max_tokens=12,
                    logprobs=0, return_token_ids=True).json()  # fmt: skip
    model = load_reference(chat_model)
    for c, ref in zip(choices, body["choices"], strict=True):
        assert ref["token_ids"] == c.token_ids
        assert ref["logprobs"]["token_logprobs"] == pytest.approx(c.logprobs, abs=1e-5)
        fresh = reference_logprobs(model, prompt, c.token_ids)
        torch.testing.assert_close(torch.tensor(c.logprobs), fresh, atol=1e-3, rtol=0)


def test_top_logprobs_and_text_tokens(client: openai.OpenAI) -> None:
    out = client.chat.completions.create(
        model="m", messages=MESSAGES, n=1, seed=3, max_completion_tokens=6, logprobs=True,
        top_logprobs=3, extra_body={"ignore_eos": True},
    )  # fmt: skip
    (choice,) = out.choices
    entries = choice.logprobs.content
    assert len(entries) == 6 == out.usage.completion_tokens
    assert choice.finish_reason == "length"
    for e in entries:
        assert e.bytes == list(e.token.encode("utf-8", errors="replace"))
        alts = [a.logprob for a in e.top_logprobs]
        assert len(alts) == 3 and alts == sorted(alts, reverse=True)
        assert e.logprob <= alts[0] + 1e-6
    # Without return_token_ids there are no ids beside the entries.
    assert "token_ids" not in (choice.model_extra or {})
    assert "prompt_token_ids" not in (out.model_extra or {})


def test_rollout_client_chat_reads_the_same_samples(client: openai.OpenAI, url: str) -> None:
    """The worker's client (``OpenAICompletionsEngine.chat``) parses the token-id entries into
    the samples the official client shows, with the engine's weight version."""
    prompt, choices = read_chat(ask(client), n=2)

    async def run():
        engine = OpenAICompletionsEngine(url)
        try:
            return await engine.chat(MESSAGES, 2, Sampling(max_tokens=12, temperature=1.0, seed=7))
        finally:
            await engine.aclose()

    got = asyncio.run(run())
    assert got.prompt_token_ids == prompt
    assert [s.token_ids for s in got.samples] == [c.token_ids for c in choices]
    for s, c in zip(got.samples, choices, strict=True):
        assert s.logprobs == pytest.approx(c.logprobs, abs=1e-5)
        assert s.text == c.content and s.finish_reason == c.finish_reason
        assert s.weight_version == 0 and s.weight_versions == [0] * len(s.token_ids)


@pytest.mark.parametrize(
    ("messages", "param"),
    [
        ([{"role": "bot", "content": "hi"}], "messages.0.role"),
        ([{"content": "hi"}], "messages.0.role"),
        ([{"role": "user", "content": "a"}, {"role": "user"}], "messages.1.content"),
        ([{"role": "user", "content": [{"type": "image_url", "image_url": {"url": "x"}}]}],
         "messages.0.content.0"),
        ([{"role": "user", "content": 5}], "messages.0.content"),
        (["hi"], "messages.0"),
        ([], "messages"),
    ],
)  # fmt: skip
def test_malformed_messages_are_400_naming_the_field(
    client: openai.OpenAI, messages: list, param: str
) -> None:
    with pytest.raises(openai.BadRequestError) as e:
        client.chat.completions.create(model="m", messages=messages, max_completion_tokens=2)
    assert e.value.status_code == 400 and e.value.param == param, e.value.body


def test_text_parts_and_other_fields(client: openai.OpenAI, url: str) -> None:
    """Content as text parts renders as the joined text; a bad sampling field is the engine's
    usual 422 naming it; max_completion_tokens wins over max_tokens."""
    parts = [{"role": "user", "content": [{"type": "text", "text": "What is"},
                                          {"type": "text", "text": "12+7?"}]}]  # fmt: skip
    body = httpx.post(f"{url}/v1/chat/completions", json={
        "messages": parts, "max_tokens": 9, "max_completion_tokens": 3, "temperature": 0,
        "return_token_ids": True, "ignore_eos": True}, timeout=60).json()  # fmt: skip
    assert bytes(t - 3 for t in body["prompt_token_ids"]).decode() == (
        "<|user|>What is\n12+7?\n<|assistant|>"
    )
    assert len(body["choices"][0]["token_ids"]) == 3 and body["choices"][0]["logprobs"] is None
    with pytest.raises(openai.UnprocessableEntityError) as e:
        client.chat.completions.create(model="m", messages=MESSAGES, n=0)
    assert e.value.param == "n"
    with pytest.raises(openai.UnprocessableEntityError):
        client.chat.completions.create(model="m", messages=MESSAGES, top_logprobs=2)
    with pytest.raises(openai.UnprocessableEntityError) as e:
        client.chat.completions.create(model="m", messages=MESSAGES, max_completion_tokens=10**6)
    assert e.value.param == "max_completion_tokens"
