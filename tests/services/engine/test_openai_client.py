"""The official ``openai`` Python client against a real embedded engine's OpenAI-compatible API.

The engine's ``/v1/completions`` and ``/v1/models`` claim OpenAI compatibility; this checks the
claim with OpenAI's own client (its request shapes, its response models), not with ours.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import openai
import pytest

from learner.tiny_model import build_tiny_model
from tests.services.engine.engine_util import running_engine


@pytest.fixture(scope="module")
def client(tmp_path_factory: pytest.TempPathFactory) -> Iterator[openai.OpenAI]:
    model_dir: Path = build_tiny_model(tmp_path_factory.mktemp("model") / "m", seed=0)
    with (
        running_engine(model_dir, tmp_path_factory.mktemp("engine")) as url,
        openai.OpenAI(base_url=f"{url}/v1", api_key="unused", max_retries=0) as c,
    ):
        yield c


def model_name(client: openai.OpenAI) -> str:
    models = client.models.list().data
    assert len(models) == 1 and models[0].object == "model"
    return models[0].id


def test_text_prompt_completion(client: openai.OpenAI) -> None:
    out = client.completions.create(
        model=model_name(client), prompt="Hi! ", max_tokens=5, temperature=0.0, n=2
    )
    assert out.object == "text_completion" and len(out.choices) == 2
    assert [c.index for c in out.choices] == [0, 1]
    assert out.choices[0].text == out.choices[1].text  # greedy: both samples agree
    assert out.choices[0].finish_reason in ("length", "stop")
    assert out.usage is not None and out.usage.prompt_tokens == 4
    assert out.usage.completion_tokens <= 10


def test_token_id_prompt_with_logprobs_and_extensions(client: openai.OpenAI) -> None:
    """The rollout worker's request: token ids in, token ids and log-probs out, a seed."""
    kw = dict(model=model_name(client), prompt=[72, 105, 33, 32], max_tokens=6, temperature=1.0,
              seed=3, logprobs=0, extra_body={"return_token_ids": True, "ignore_eos": True})  # fmt: skip
    a = client.completions.create(**kw)  # type: ignore[call-overload]
    b = client.completions.create(**kw)  # type: ignore[call-overload]
    (choice,) = a.choices
    assert choice.finish_reason == "length"
    extra = choice.model_extra or {}
    assert len(extra["token_ids"]) == 6 and extra["prompt_token_ids"] == [72, 105, 33, 32]
    assert choice.logprobs is not None and choice.logprobs.token_logprobs is not None
    assert len(choice.logprobs.token_logprobs) == 6
    assert all(lp <= 0.0 for lp in choice.logprobs.token_logprobs)
    assert (b.choices[0].model_extra or {})["token_ids"] == extra["token_ids"]  # same seed


def test_bad_requests_raise_the_clients_typed_error(client: openai.OpenAI) -> None:
    with pytest.raises(openai.UnprocessableEntityError):
        client.completions.create(model=model_name(client), prompt=[10**9], max_tokens=1)


def test_chat_without_a_chat_template_is_400_naming_messages(client: openai.OpenAI) -> None:
    """The tiny model's tokenizer has no chat template: chat is refused, as vLLM refuses it."""
    with pytest.raises(openai.BadRequestError) as e:
        client.chat.completions.create(
            model=model_name(client), messages=[{"role": "user", "content": "hi"}]
        )
    assert e.value.param == "messages" and "no chat template" in e.value.message
