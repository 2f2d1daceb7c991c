"""Interruptible weight updates on the real vLLM CPU server (``rollout.update_mode=interrupt``):
the learner's push pauses it with abort, the rollout client continues the cut response under the
new weights, and the response carries both versions, each token's log-prob the learner's under
the weights of its own version."""

from __future__ import annotations

import threading

import pytest

from dynamo_rl.contracts.weight_control import VLLMWeights, read_version
from learner.model import load_policy
from learner.push import DistributedPush
from tests.services.engine.interrupt_util import generate_across_push
from tests.vllm.conftest import PUSH_TIMEOUT_S, VLLMServers, completions

pytestmark = pytest.mark.vllm
PROMPT = [ord(c) + 3 for c in "12+7="]  # the tokenizer's byte tokens start at id 3


def test_generation_spanning_a_push_carries_both_versions(
    vllm_servers: VLLMServers, tiny_models, one_rank: None
) -> None:
    server = vllm_servers.get()
    policies = [load_policy(str(m)).eval() for m in (tiny_models.served, tiny_models.other)]

    # One push object for the whole test, as a learner keeps one: its group with the server is
    # formed by the first push, so the later ones pause the server within milliseconds of the
    # request's start (a new group per push took longer than an idle server's 400 tokens).
    pusher = DistributedPush(master_address="127.0.0.1", bucket_mb=256.0,
                             timeout_s=PUSH_TIMEOUT_S, protocol=VLLMWeights(pause_mode="abort"))  # fmt: skip

    def push(policy, version: int) -> None:
        result = pusher.push(policy, version, [server.url])
        assert result.ok and not result.failed, result.error

    # The server is shared by the session: start from (and end on) the served checkpoint, at
    # versions above any it has had.
    base = read_version(VLLMWeights(), server.url) + 1
    push(policies[0], base)
    # vLLM updates its running-requests gauge only at its stats interval, after an idle server has
    # finished 400 tokens (0.8 s here): background requests keep its batch full, so the watched
    # generation runs long enough to be seen running and cut by the push.
    stop = threading.Event()

    def load() -> None:
        while not stop.is_set():
            completions(server.url, [PROMPT] * 8, max_tokens=400, temperature=1.0)

    loaders = [threading.Thread(target=load, daemon=True) for _ in range(2)]
    for t in loaders:
        t.start()
    try:
        sample, by_version = generate_across_push(
            server.url, PROMPT, policies, push, weight_api="vllm", first_version=base,
            running_metric="vllm:num_requests_running", max_tokens=400, tolerance=1e-3,
        )  # fmt: skip
    finally:
        stop.set()
        for t in loaders:
            t.join(timeout=120)
        try:
            push(policies[0], read_version(VLLMWeights(), server.url) + 1)
        finally:
            pusher.close()
    spans = sorted(set(sample.weight_versions or ()))
    assert len(spans) == 2, spans
    assert by_version[spans[0]] is not by_version[spans[1]]
    assert sample.weight_version == spans[0]
