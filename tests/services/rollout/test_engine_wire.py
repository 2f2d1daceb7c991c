"""The engine clients' requests and answer parsing, without a server.

The expected request bodies were recorded from the clients' hand-written dicts before the requests
became contract models (``dynamo_rl.contracts.engine``): a real vLLM or SGLang server must see the
same keys and values as before. The answers are shaped like real vLLM and SGLang answers (more
fields than the embedded engine sends, SGLang's string versions).
"""

from __future__ import annotations

import pytest

from dynamo_rl.contracts.sampling import SamplingParams as Sampling
from services.rollout.engines import (
    EngineProtocolError,
    EngineRequestError,
    EngineUnavailable,
)
from services.rollout.engines.openai import (
    chat_request,
    completion_request,
    parse_chat,
    parse_choices,
)
from services.rollout.engines.sglang import generate_request, parse_generate

URL = "http://e:1"
PLAIN = Sampling(max_tokens=12)
FULL = Sampling(max_tokens=8, temperature=0.7, top_p=0.9, top_k=5, stop=("</a>", "x"),
                stop_token_ids=(2, 3), seed=11)  # fmt: skip
GREEDY = Sampling(max_tokens=4, temperature=0, top_k=0)

COMPLETIONS = {
    PLAIN: {"model": "m", "prompt": [1, 2, 3], "n": 4, "max_tokens": 12, "temperature": 1.0,
            "top_p": 1.0, "logprobs": 0, "return_token_ids": True},
    FULL: {"model": "m", "prompt": [1, 2, 3], "n": 4, "max_tokens": 8, "temperature": 0.7,
           "top_p": 0.9, "logprobs": 0, "return_token_ids": True, "top_k": 5,
           "stop": ["</a>", "x"], "stop_token_ids": [2, 3], "seed": 11},
    GREEDY: {"model": "m", "prompt": [1, 2, 3], "n": 4, "max_tokens": 4, "temperature": 0,
             "top_p": 1.0, "logprobs": 0, "return_token_ids": True},
}  # fmt: skip
GENERATE = {
    PLAIN: {"input_ids": [1, 2, 3], "return_logprob": True, "sampling_params": {
        "n": 4, "max_new_tokens": 12, "temperature": 1.0, "top_p": 1.0}},
    FULL: {"input_ids": [1, 2, 3], "return_logprob": True, "sampling_params": {
        "n": 4, "max_new_tokens": 8, "temperature": 0.7, "top_p": 0.9, "top_k": 5,
        "stop": ["</a>", "x"], "stop_token_ids": [2, 3], "sampling_seed": 11}},
    GREEDY: {"input_ids": [1, 2, 3], "return_logprob": True, "sampling_params": {
        "n": 4, "max_new_tokens": 4, "temperature": 0, "top_p": 1.0}},
}  # fmt: skip


@pytest.mark.parametrize("sampling", [PLAIN, FULL, GREEDY])
def test_requests_carry_the_same_keys_and_values_as_before(sampling: Sampling) -> None:
    completion = completion_request("m", [1, 2, 3], 4, sampling).body()
    generate = generate_request([1, 2, 3], 4, sampling).body()
    assert completion == COMPLETIONS[sampling]
    assert generate == GENERATE[sampling]
    # (Equal as values: temperature=0 goes as 0.0 now, the same JSON number to any parser.)


@pytest.mark.parametrize("build", [
    lambda: completion_request("m", [1], 0, PLAIN, URL),
    lambda: generate_request([1], 1, Sampling(max_tokens=-1), URL),
    lambda: generate_request([], 1, PLAIN, URL),
])  # fmt: skip
def test_a_request_the_contract_refuses_is_a_request_error(build) -> None:
    with pytest.raises(EngineRequestError) as info:
        build()
    assert info.value.status == 422 and info.value.url.startswith(URL)


def _choice(index: int, **kw: object) -> dict:
    choice = {"index": index, "text": "hi", "finish_reason": "length", "stop_reason": None,
              "prompt_logprobs": None, "token_ids": [5, 6], "prompt_token_ids": [1, 2, 3],
              "logprobs": {"text_offset": [0, 1], "token_logprobs": [-0.5, -1.0],
                           "tokens": ["h", "i"], "top_logprobs": [{}, {}]}}  # fmt: skip
    choice.update(kw)
    return choice


def _vllm(*choices: dict, **kw: object) -> dict:
    body = {"id": "cmpl-1", "object": "text_completion", "created": 1, "model": "m",
            "choices": list(choices), "service_tier": None, "system_fingerprint": None,
            "usage": {"prompt_tokens": 3, "total_tokens": 7, "completion_tokens": 4,
                      "prompt_tokens_details": None},
            "kv_transfer_params": None}  # fmt: skip
    body.update(kw)
    return body


def test_completions_answers_of_vllm_shape_are_read_in_index_order() -> None:
    body = _vllm(_choice(1, token_ids=[7, 8], weight_version="3"), _choice(0))
    first, second = parse_choices(body, URL, 2)
    assert (first.token_ids, first.logprobs, first.text) == ([5, 6], [-0.5, -1.0], "hi")
    assert second.token_ids == [7, 8] and first.finish_reason == "length"
    assert first.weight_version is None and second.weight_version == 3  # its own beats none
    (one,) = parse_choices(_vllm(_choice(0), weight_version=4), URL, 1)
    assert one.weight_version == 4 and one.engine_url == URL
    (odd,) = parse_choices(_vllm(_choice(0, text=None, finish_reason=None)), URL, 1)
    assert (odd.text, odd.finish_reason) == ("", "stop")


@pytest.mark.parametrize(("body", "match"), [
    ({"object": "error"}, "contract"),
    ([], "contract"),
    (_vllm(_choice(0, logprobs={"token_logprobs": [None, -1.0]})), "contract"),
    (_vllm(_choice(0, token_ids=None)), "token_ids"),
    (_vllm(_choice(0, logprobs=None)), "token_logprobs"),
    (_vllm(_choice(0, token_ids=[1])), "1 token ids but 2 log-probs"),
    (_vllm(_choice(0), _choice(1)), "asked for 1 choices, got 2"),
])  # fmt: skip
def test_malformed_completions_answers_are_protocol_errors(body: object, match: str) -> None:
    with pytest.raises(EngineProtocolError, match=match):
        parse_choices(body, URL, 1)


def test_an_aborted_choice_is_retried_elsewhere() -> None:
    with pytest.raises(EngineUnavailable, match="aborted"):
        parse_choices(_vllm(_choice(0, finish_reason="abort")), URL, 1)


def test_chat_request_asks_for_token_ids_the_vllm_way() -> None:
    body = chat_request("m", [{"role": "user", "content": "hi"}], 2, FULL).body()
    assert body == {"model": "m", "messages": [{"role": "user", "content": "hi"}], "n": 2,
                    "max_completion_tokens": 8, "seed": 11, "logprobs": True,
                    "return_tokens_as_token_ids": True, "return_token_ids": True,
                    "temperature": 0.7, "top_p": 0.9, "top_k": 5, "stop": ["</a>", "x"],
                    "stop_token_ids": [2, 3]}  # fmt: skip


def _entry(token: str, logprob: float) -> dict:
    return {"token": token, "logprob": logprob, "bytes": [104], "top_logprobs": []}


def _chat_choice(index: int, **kw: object) -> dict:
    choice = {"index": index, "message": {"role": "assistant", "content": "hi",
              "refusal": None, "reasoning": None}, "finish_reason": "length",
              "stop_reason": None, "token_ids": [5, 6], "routed_experts": None,
              "logprobs": {"content": [_entry("token_id:5", -0.5),
                                       _entry("token_id:6", -1.0)]}}  # fmt: skip
    choice.update(kw)
    return choice


def _vllm_chat(*choices: dict, **kw: object) -> dict:
    body = {"id": "chatcmpl-1", "object": "chat.completion", "created": 1, "model": "m",
            "choices": list(choices), "usage": {"prompt_tokens": 3, "total_tokens": 7,
            "completion_tokens": 4}, "prompt_logprobs": None, "prompt_token_ids": [1, 2, 3],
            "kv_transfer_params": None}  # fmt: skip
    body.update(kw)
    return body


def test_chat_answers_of_vllm_shape_read_ids_from_the_log_prob_entries() -> None:
    second = _chat_choice(1, token_ids=None, logprobs={"content": [_entry("token_id:7", -0.1)]})
    out = parse_chat(_vllm_chat(second, _chat_choice(0)), URL, 2)
    assert out.prompt_token_ids == [1, 2, 3]
    first, other = out.samples
    assert (first.token_ids, first.logprobs, first.text) == ([5, 6], [-0.5, -1.0], "hi")
    assert (other.token_ids, other.logprobs) == ([7], [-0.1])  # no token_ids: entries alone
    assert first.weight_version is None and first.finish_reason == "length"
    (versioned,) = parse_chat(_vllm_chat(_chat_choice(0), weight_version=2), URL, 1).samples
    assert versioned.weight_version == 2  # the embedded engine's extension


@pytest.mark.parametrize(("body", "match"), [
    ({"object": "error"}, "contract"),
    (_vllm_chat(_chat_choice(0, logprobs=None)), "no logprobs.content"),
    (_vllm_chat(_chat_choice(0, logprobs={"content": [_entry("h", -0.5)]})), "token_id:<id>"),
    (_vllm_chat(_chat_choice(0, token_ids=[5, 7])), "token_ids"),
    (_vllm_chat(_chat_choice(0, token_ids=[5])), "token_ids"),
    (_vllm_chat(_chat_choice(0), _chat_choice(1)), "asked for 1 choices, got 2"),
])  # fmt: skip
def test_malformed_chat_answers_are_protocol_errors(body: object, match: str) -> None:
    with pytest.raises(EngineProtocolError, match=match):
        parse_chat(body, URL, 1)
    with pytest.raises(EngineUnavailable, match="aborted"):
        parse_chat(_vllm_chat(_chat_choice(0, finish_reason="abort")), URL, 1)


def _item(**meta: object) -> dict:
    info = {"id": "x", "finish_reason": {"type": "length", "length": 2}, "prompt_tokens": 3,
            "completion_tokens": 2, "cached_tokens": 0, "weight_version": "default",
            "e2e_latency": 0.1, "output_token_logprobs": [[-0.5, 5, None], [-1.0, 6, None]],
            "output_top_logprobs": [None, None], "input_token_logprobs": None}  # fmt: skip
    info.update(meta)
    return {"text": "hi", "output_ids": [5, 6], "meta_info": info}


def test_generate_answers_of_sglang_shape() -> None:
    (one,) = parse_generate(_item(), URL, 1)
    assert (one.token_ids, one.logprobs, one.text) == ([5, 6], [-0.5, -1.0], "hi")
    assert one.weight_version is None and one.finish_reason == "length"  # "default": unknown
    a, b = parse_generate(
        [_item(weight_version="7", finish_reason={"type": "abort", "message": "cut"}),
         _item(finish_reason="stop")], URL, 2,
    )  # fmt: skip
    assert (a.weight_version, a.finish_reason, b.finish_reason) == (7, "abort", "stop")
    no_ids = _item()
    del no_ids["output_ids"]
    assert parse_generate(no_ids, URL, 1)[0].token_ids == [5, 6]  # from the triples


@pytest.mark.parametrize(("body", "match"), [
    ({"text": "hi"}, "contract"),
    ("oops", "contract"),
    (_item(output_token_logprobs=None), "no output_token_logprobs"),
    (_item(output_token_logprobs=[[None, 5, None], [-1.0, 6, None]]), "contract"),
    ({**_item(), "output_ids": [5]}, "1 output ids but 2 log-probs"),
    ([_item(), _item()], "asked /generate for 1 samples, got 2"),
])  # fmt: skip
def test_malformed_generate_answers_are_protocol_errors(body: object, match: str) -> None:
    with pytest.raises(EngineProtocolError, match=match):
        parse_generate(body, URL, 1)
