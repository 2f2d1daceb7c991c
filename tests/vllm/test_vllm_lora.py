"""LoRA adapters on the real vLLM server (CPU build, tiny model, started with runtime adapter
loading as ``dynamo-rl vllm-server`` starts it for ``learner.lora``), pushed by the learner's real
adapter push (``learner.adapter_push.AdapterPush`` with the contract's ``VLLMWeights``: vLLM's
``/v1/load_lora_adapter``) from a sharded LoRA policy in this process: greedy outputs are the
pushed adapter's model's, vLLM's log-probs the learner's, old versions are unloaded, and a
restarted server gets the current adapter back."""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest
import torch

from dynamo_rl.config.learner import LoraConfig
from dynamo_rl.contracts.sampling import SamplingParams as Sampling
from dynamo_rl.contracts.weight_control import VLLMWeights
from services.rollout.engines import make_engine
from tests.services.engine.test_engine_lora import (
    LEARNER_TOLERANCE,
    adapter_push,
    learner_logprobs,
    served,
)
from tests.vllm.conftest import VLLMServers, completions
from tests.vllm.test_vllm_server import PROMPTS

pytestmark = pytest.mark.vllm

LORA = LoraConfig(enabled=True, rank=8, alpha=16.0, name="policy")
MAX_TOKENS = 8


def peft_greedy(base: Path, adapter: Path, prompt: list[int]) -> list[int]:
    """Greedy decoding with ``peft``'s own model of the pushed adapter (full forward passes)."""
    from peft import PeftModel
    from transformers import AutoModelForCausalLM

    model = PeftModel.from_pretrained(AutoModelForCausalLM.from_pretrained(base), str(adapter))
    ids = list(prompt)
    with torch.no_grad():
        for _ in range(MAX_TOKENS):
            ids.append(int(model.eval()(torch.tensor([ids])).logits[0, -1].argmax()))
    return ids[len(prompt) :]


def sample(url: str) -> tuple[int, list]:
    """The rollout client of a LoRA policy: the newest adapter's version and greedy samples."""

    async def go() -> tuple[int, list]:
        client = make_engine(url, weight_api="vllm", adapter=LORA.name)
        try:
            version = await client.weight_version()
            samples = await client.generate(PROMPTS[0], 1, Sampling(MAX_TOKENS, temperature=0.0))
            return version, samples
        finally:
            await client.aclose()

    return asyncio.run(go())


def test_vllm_serves_pushed_adapters_by_versioned_name(
    vllm_servers: VLLMServers, tiny_models, one_rank: None, tmp_path: Path
) -> None:
    from tests.learner.test_lora import lora_policy

    server = vllm_servers.get("raw_logprobs", lora=True)
    url = server.url
    policy = lora_policy(tiny_models.served, LORA, seed=7)
    push = adapter_push(policy, tiny_models.served, tmp_path, LORA, protocol=VLLMWeights())
    result = push.push(policy, 1, [url])
    assert result.ok, result.error
    assert served(url) == ["policy-v1"] and push.served_version(url) == 1

    version, samples = sample(url)  # the rollout client names policy-v1
    tokens = samples[0].token_ids
    assert version == 1 and samples[0].weight_version == 1
    assert tokens == peft_greedy(tiny_models.served, tmp_path / "adapter_v000001", PROMPTS[0])
    base = completions(url, [PROMPTS[0]], max_tokens=MAX_TOKENS, temperature=0.0)[0]
    assert base["token_ids"] != tokens  # the base is served unchanged beside the adapter
    learner = learner_logprobs(policy, PROMPTS[0], tokens)
    diff = (torch.tensor(samples[0].logprobs) - learner).abs().max()
    print(f"\nvLLM LoRA log-probs vs learner: max |diff| {float(diff):.2e}")
    assert float(diff) < LEARNER_TOLERANCE

    # Two more pushes: version 1 is unloaded, the previous and the newest stay.
    with torch.no_grad():
        for name, p in policy.named_parameters():
            if "lora_B" in name:
                p.mul_(-1.0)
    for v in (2, 3):
        assert push.push(policy, v, [url]).ok
    assert served(url) == ["policy-v2", "policy-v3"]
    version, samples = sample(url)
    assert version == 3 and samples[0].token_ids != tokens

    # A restarted server serves the base alone until the adapter is pushed to it again (what
    # the learner's catch-up does when it reads version 0 there).
    vllm_servers.close()
    url = vllm_servers.get("raw_logprobs", lora=True).url
    assert push.served_version(url) == 0 and served(url) == []
    assert push.push(policy, 3, [url]).ok
    version, again = sample(url)
    assert version == 3 and again[0].token_ids == samples[0].token_ids
