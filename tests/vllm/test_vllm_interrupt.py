"""Interruptible weight updates on the real vLLM CPU server (``rollout.update_mode=interrupt``):
the learner's push pauses it with abort, the rollout client continues the cut response under the
new weights, and the response carries both versions, each token's log-prob the learner's under
the weights of its own version."""

from __future__ import annotations

from pathlib import Path

import pytest

from dynamo_rl.contracts.weight_control import VLLMWeights, read_version
from learner.model import load_policy
from learner.push import DistributedPush
from tests.services.engine.interrupt_util import generate_across_push
from tests.vllm.conftest import PUSH_TIMEOUT_S, VLLMServers

pytestmark = pytest.mark.vllm
PROMPT = [ord(c) + 3 for c in "12+7="]  # the tokenizer's byte tokens start at id 3
SLOW_SHAPE = {"hidden_size": 512, "num_layers": 8, "num_heads": 8, "num_kv_heads": 2}
"""Not the quickstart's tiny model: with it vLLM's CPU engine finishes a decode step faster than
the API server handles the step's output, whose handler then never yields to the event loop, so
the server answers no HTTP request (the push's ``/pause`` included) until the generation has
ended (a ``GET /v1/models`` sent 0.1 s into a 480-token generation was answered when it ended,
0.67 s later). A decode step of this model (~25M parameters) takes longer than that handling:
the same request was answered within 0.13 s while a generation ran (measured 5 Dec 2026)."""


@pytest.fixture(scope="module")
def slow_models(tmp_path_factory: pytest.TempPathFactory) -> list[Path]:
    from learner.tiny_model import build_tiny_model

    root = tmp_path_factory.mktemp("vllm-slow-models")
    return [build_tiny_model(root / f"seed{s}", seed=s, **SLOW_SHAPE) for s in (0, 1)]


def test_generation_spanning_a_push_carries_both_versions(
    vllm_servers: VLLMServers, slow_models: list[Path], one_rank: None
) -> None:
    server = vllm_servers.get(model=slow_models[0])
    policies = [load_policy(str(m)).eval() for m in slow_models]

    # One push object for the whole test, as a learner keeps one: its group with the server is
    # formed by the first push, so the later ones pause the server within milliseconds of the
    # request's start (a new group per push took longer than an idle server's 400 tokens). The
    # push starts once the server has generated tokens (its generation-token counter moved):
    # started as soon as the request was sent, it paused the server before the request began
    # on an idle machine here, 6 attempts in 6, and the whole response came from the new weights.
    pusher = DistributedPush(master_address="127.0.0.1", bucket_mb=256.0,
                             timeout_s=PUSH_TIMEOUT_S, protocol=VLLMWeights(pause_mode="abort"))  # fmt: skip

    def push(policy, version: int) -> None:
        result = pusher.push(policy, version, [server.url])
        assert result.ok and not result.failed, result.error

    # The server is shared by the session: start from (and end on) the served checkpoint, at
    # versions above any it has had.
    base = read_version(VLLMWeights(), server.url) + 1
    push(policies[0], base)
    try:
        sample, by_version = generate_across_push(
            server.url, PROMPT, policies, push, weight_api="vllm", first_version=base,
            running_metric="vllm:generation_tokens_total", max_tokens=400, tolerance=1e-3,
        )  # fmt: skip
    finally:
        try:
            push(policies[0], read_version(VLLMWeights(), server.url) + 1)
        finally:
            pusher.close()
    spans = sorted(set(sample.weight_versions or ()))
    assert len(spans) == 2, spans
    assert by_version[spans[0]] is not by_version[spans[1]]
    assert sample.weight_version == spans[0]
