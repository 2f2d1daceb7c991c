"""The engine contract's models (dynamo_rl.contracts.engine, .weight_control) read by both ends.

Every body a protocol object sends validates with the model the embedded engine's route takes,
field for field; every answer model reads what the embedded engine answers. The live round trips
(a real engine against the real clients and the learner's push) are in test_weight_control.py and
tests/services/rollout/test_clients.py.
"""

from __future__ import annotations

import pytest
from pydantic import ValidationError

from dynamo_rl.contracts.engine import (
    CompletionChoice,
    CompletionRequest,
    EngineRequest,
    GenerateRequest,
    score_request,
    scored_logprobs,
)
from dynamo_rl.contracts.weight_control import (
    InitWeightsUpdateGroupRequest,
    SGLangWeights,
    UpdateWeightsFromDiskRequest,
    UpdateWeightsFromDistributedRequest,
    VLLMFinishRequest,
    VLLMInitRequest,
    VLLMStartRequest,
    VLLMUpdateRequest,
    VLLMWeights,
    WeightControlError,
    WeightVersionAnswer,
)

GROUP = dict(master_address="10.0.0.1", master_port=29500, rank_offset=1, world_size=2)
TENSORS = dict(names=["w", "b"], dtypes=["bfloat16", "float32"], shapes=[(4, 2), (4,)])

# path -> the request model of the embedded engine's route
ROUTES: dict[str, type[EngineRequest]] = {
    "/init_weights_update_group": InitWeightsUpdateGroupRequest,
    "/update_weights_from_distributed": UpdateWeightsFromDistributedRequest,
    "/update_weights_from_disk": UpdateWeightsFromDiskRequest,
    "/init_weight_transfer_engine": VLLMInitRequest,
    "/start_weight_update": VLLMStartRequest,
    "/update_weights": VLLMUpdateRequest,
    "/finish_weight_update": VLLMFinishRequest,
}


def _calls() -> list:
    s, v = SGLangWeights(), VLLMWeights()
    return [
        s.init_group(**GROUP, group_name="g", backend="gloo"),
        s.update(**TENSORS, group_name="g", weight_version=3),
        s.update_from_disk("/m", 2),
        v.init_group(**GROUP, group_name="g", backend="gloo", bucket_bytes=4096, timeout_s=30.0),
        v.init_group(**GROUP, group_name="g", backend="nccl"),
        *v.before_update(),
        v.update(**TENSORS, group_name="g", weight_version=3),
        *v.after_update(3),
        *v.recover(),
    ]


@pytest.mark.parametrize("call", _calls(), ids=lambda c: c.path)
def test_every_body_a_protocol_sends_is_its_route_model(call) -> None:
    model = ROUTES.get(call.path)
    if model is None:  # pause, reset, resume: no body
        assert call.body is None
        return
    parsed = model.model_validate(call.body)
    assert parsed.body() == call.body  # nothing dropped, nothing added, no null sent


def test_answers_and_bodies_keep_their_shapes() -> None:
    assert WeightVersionAnswer(weight_version=3).body() == {"weight_version": 3}
    assert WeightVersionAnswer.model_validate({"weight_version": "7"}).weight_version == "7"
    for bad in ({}, [], "x"):
        with pytest.raises(WeightControlError, match="no 'weight_version'"):
            SGLangWeights().parse_version(bad, "http://e")
    # Requests are strict (a typo is a 422, not ignored); answers ignore extras.
    with pytest.raises(ValidationError, match="max_token"):
        CompletionRequest.model_validate({"prompt": [1], "max_token": 3})
    with pytest.raises(ValidationError, match="top_kk"):
        GenerateRequest.model_validate({"input_ids": [1], "sampling_params": {"top_kk": 1}})
    # top_k may be left out or null (vLLM's own default), never below -1.
    assert CompletionRequest.model_validate({"prompt": [1], "top_k": None}).top_k is None
    with pytest.raises(ValidationError):
        CompletionRequest.model_validate({"prompt": [1], "top_k": -2})


def test_a_scoring_request_and_a_vllm_shaped_answer() -> None:
    """The teacher's scoring request is vLLM's (prompt and response as one token-id prompt,
    ``prompt_logprobs: 0``, one token); an answer shaped as vLLM writes it (ids as string keys,
    ``rank`` and ``decoded_token`` beside the log-prob, alternatives among them) gives the
    response tokens' log-probs, and one that misses a token is refused."""
    req = score_request("m", [1, 2], [3, 4])
    assert req.body() == {
        "model": "m", "prompt": [1, 2, 3, 4], "max_tokens": 1, "temperature": 0.0,
        "prompt_logprobs": 0,
    }  # fmt: skip
    entries = [
        None,
        {"2": {"logprob": -0.5, "rank": 1, "decoded_token": "b"}},
        {"3": {"logprob": -2.5, "rank": 4, "decoded_token": "c"},
         "9": {"logprob": -0.1, "rank": 1, "decoded_token": "x"}},
        {"4": {"logprob": -1.25, "rank": 2, "decoded_token": "d"}},
    ]  # fmt: skip
    choice = CompletionChoice.model_validate({"index": 0, "text": "z", "prompt_logprobs": entries})
    assert scored_logprobs(choice, [1, 2, 3, 4], 2) == [-2.5, -1.25]
    entries[3] = {"7": {"logprob": -0.2, "rank": 1}}
    choice = CompletionChoice.model_validate({"index": 0, "prompt_logprobs": entries})
    with pytest.raises(ValueError, match="entry 3 has no log-prob of token 4"):
        scored_logprobs(choice, [1, 2, 3, 4], 2)
    with pytest.raises(ValueError, match="4 prompt_logprobs entries for a 3-token prompt"):
        scored_logprobs(choice, [1, 2, 3], 2)
    with pytest.raises(ValueError, match="no prompt_logprobs"):
        scored_logprobs(CompletionChoice(index=0), [1, 2], 1)
