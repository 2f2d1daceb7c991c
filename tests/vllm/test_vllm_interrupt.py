"""Interruptible weight updates on the real vLLM CPU server (``rollout.update_mode=interrupt``):
the learner's push pauses it with abort, the rollout client continues the cut response under the
new weights, and the response carries both versions, each token's log-prob the learner's under
the weights of its own version."""

from __future__ import annotations

import pytest

from dynamo_rl.contracts.weight_control import VLLMWeights, read_version
from learner.model import load_policy
from tests.services.engine.interrupt_util import generate_across_push
from tests.vllm.conftest import VLLMServers, learner_push

pytestmark = pytest.mark.vllm
PROMPT = [ord(c) + 3 for c in "12+7="]  # the tokenizer's byte tokens start at id 3


def test_generation_spanning_a_push_carries_both_versions(
    vllm_servers: VLLMServers, tiny_models, one_rank: None
) -> None:
    server = vllm_servers.get()
    policies = [load_policy(str(m)).eval() for m in (tiny_models.served, tiny_models.other)]

    def push(policy, version: int) -> None:
        learner_push(server.url, policy, version, pause_mode="abort")

    # The server is shared by the session: start from (and end on) the served checkpoint, at
    # versions above any it has had.
    base = read_version(VLLMWeights(), server.url) + 1
    push(policies[0], base)
    try:
        sample, by_version = generate_across_push(
            server.url, PROMPT, policies, push, weight_api="vllm", first_version=base,
            running_metric="vllm:num_requests_running", max_tokens=400, tolerance=1e-3,
        )  # fmt: skip
    finally:
        push(policies[0], read_version(VLLMWeights(), server.url) + 1)
    spans = sorted(set(sample.weight_versions or ()))
    assert len(spans) == 2, spans
    assert by_version[spans[0]] is not by_version[spans[1]]
    assert sample.weight_version == spans[0]
