"""Interruptible weight updates on a real engine process (``rollout.update_mode=interrupt``): a
generation that spans the learner's push carries two versions, and each token's log-prob is the
learner's under the weights of its own version — through the SGLang-shaped update (applied at a
token boundary inside the running batch, the cache rebuilt), through the vLLM-shaped one paused
with abort (continued by the rollout client) and paused with keep (held at a token boundary)."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from dynamo_rl.contracts.weight_control import SGLangWeights, VLLMWeights
from learner.tiny_model import build_tiny_model
from tests.services.engine.engine_util import running_engine
from tests.services.engine.interrupt_util import generate_across_push, metric
from tests.vllm.conftest import PUSH_TIMEOUT_S

pytestmark = pytest.mark.slow
ARCH = {"hidden_size": 32, "num_layers": 2, "num_heads": 2, "num_kv_heads": 1}
PROMPT = [50, 60, 70, 80]


@pytest.fixture(scope="module")
def checkpoints(tmp_path_factory: pytest.TempPathFactory) -> list[Path]:
    root = tmp_path_factory.mktemp("interrupt-models")
    return [build_tiny_model(root / f"seed{s}", seed=s, **ARCH) for s in (0, 1)]


@pytest.fixture(scope="module")
def engine(checkpoints: list[Path], tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    with running_engine(
        checkpoints[0],
        tmp_path_factory.mktemp("engine-interrupt"),
        "rollout.update_mode=interrupt",
        "engine.register_in_redis=false",
    ) as url:
        yield url


@pytest.mark.parametrize(
    ("weight_api", "protocol"),
    [
        ("sglang", SGLangWeights()),
        # The client continues what the abort cut, stamping each piece with /weight_info.
        ("vllm", VLLMWeights(pause_mode="abort")),
        # keep: the engine holds the batch at a token boundary and reports each token's version.
        ("sglang", VLLMWeights(pause_mode="keep")),
    ],
    ids=["sglang-update", "vllm-abort", "vllm-keep"],
)
def test_generation_spanning_a_push_carries_both_versions(
    engine: str, checkpoints: list[Path], weight_api: str, protocol, one_rank: None
) -> None:
    from learner.model import load_policy
    from learner.push import DistributedPush

    policies = [load_policy(str(c)).eval() for c in checkpoints]
    # One push object for the case, as a learner keeps one: the group is formed by the first
    # push, so the later ones reach the engine within milliseconds of the request's start (a new
    # group per push could take longer than the generation on a loaded machine).
    pusher = DistributedPush(
        master_address="127.0.0.1", bucket_mb=256.0, timeout_s=PUSH_TIMEOUT_S, protocol=protocol
    )

    def push(policy, version: int) -> None:
        result = pusher.push(policy, version, [engine])
        assert result.ok and not result.failed, result.error

    # The engine is shared by the cases: start each from the served checkpoint, at a version
    # above any the engine has had.
    base = httpx.get(f"{engine}/get_weight_version").json()["weight_version"] + 1
    try:
        push(policies[0], base)
        sample, _ = generate_across_push(
            engine, PROMPT, policies, push, weight_api=weight_api, first_version=base,
            running_metric="dynamo_engine_requests_in_flight", max_tokens=240, tolerance=1e-4,
        )  # fmt: skip
    finally:
        pusher.close()
    spans = sorted(set(sample.weight_versions or ()))
    assert len(spans) == 2, spans
    assert sample.weight_version == spans[0]  # the oldest token's
    assert metric(engine, "dynamo_engine_requests_in_flight") == 0
