"""LoRA adapters on a real engine process, pushed by the learner's real adapter push
(``learner.adapter_push.AdapterPush`` over the engine-control contract) from a sharded LoRA policy
in this process (a one-rank gloo world): served without merging under versioned names, requests
naming them, samples stamped with the adapter version, log-probs equal to the learner's, old
versions unloaded, misfits refused naming both sides, a restarted engine caught up."""

from __future__ import annotations

from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import httpx
import pytest
import torch

from dynamo_rl.config.learner import LoraConfig
from dynamo_rl.contracts.weight_control import SGLangWeights, VLLMWeights
from learner.adapter_push import AdapterPush
from learner.lora import adapter_tensors, write_adapter
from learner.model import PolicyModel, full_policy_state
from learner.tiny_model import build_tiny_model
from tests.learner.test_lora import lora_policy
from tests.services.engine.engine_util import (
    complete,
    load_reference,
    reference_greedy,
    start_engine,
)

LORA = LoraConfig(enabled=True, rank=4, alpha=8.0, name="policy")
LEARNER_TOLERANCE = 1e-3  # engine vs learner log-probs on the tiny model, as for full weights
PROMPT = [5, 40, 41, 42, 77]


@pytest.fixture(scope="module")
def engine(model_dir: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[dict]:
    log_dir = tmp_path_factory.mktemp("engine-lora")
    proc, url = start_engine(model_dir, log_dir, "engine.max_lora_rank=8")
    state = {"proc": proc, "url": url, "log_dir": log_dir}
    try:
        yield state
    finally:
        state["proc"].stop()


def adapter_push(policy: PolicyModel, base: Path, out: Path, lc: LoraConfig = LORA, **kw):
    """The learner's adapter push of ``policy`` (its export written as the trainer writes it)."""

    def export(version: int) -> str:
        tensors = adapter_tensors(full_policy_state(policy, trainable_only=True))
        return str(write_adapter(tensors, lc, str(base), out / f"adapter_v{version:06d}"))

    return AdapterPush(export, prefix=lc.name, protocol=kw.get("protocol", SGLangWeights()),
                       timeout_s=60.0)  # fmt: skip


def served(url: str) -> list[str]:
    return [m["id"] for m in httpx.get(f"{url}/v1/models").json()["data"][1:]]


def learner_logprobs(policy: PolicyModel, prompt: list[int], tokens: list[int]) -> torch.Tensor:
    ids = torch.tensor([prompt + tokens])
    with torch.no_grad():
        logits, _ = policy(ids, torch.ones_like(ids), len(tokens))
    return logits.log_softmax(-1)[0].gather(-1, torch.tensor(tokens)[:, None])[:, 0]


def greedy(url: str, model: str | None, n_tokens: int = 8) -> dict:
    body = {"prompt": PROMPT, "max_tokens": n_tokens, "temperature": 0.0, "logprobs": 0,
            "return_token_ids": True}  # fmt: skip
    if model is not None:
        body["model"] = model
    r = complete(url, **body)
    assert r.status_code == 200, r.text
    return r.json()


def test_pushed_adapters_are_served_by_name_beside_the_base(
    engine: dict, model_dir: Path, one_rank: None, tmp_path: Path
) -> None:
    from peft import PeftModel

    url = engine["url"]
    policy = lora_policy(model_dir, seed=1)
    push = adapter_push(policy, model_dir, tmp_path)
    result = push.push(policy, 1, [url])
    assert result.ok and not result.failed, result.error
    # Only the adapter tensors moved: 16 small matrices, not the model.
    assert 0 < result.bytes < 0.2 * (model_dir / "model.safetensors").stat().st_size
    assert served(url) == ["policy-v1"] and push.served_version(url) == 1
    assert httpx.get(f"{url}/get_weight_version").json()["weight_version"] == 1

    out = greedy(url, "policy-v1")
    choice = out["choices"][0]
    assert out["model"] == "policy-v1" and out["weight_version"] == 1
    adapted = PeftModel.from_pretrained(
        load_reference(model_dir), str(tmp_path / "adapter_v000001")
    )
    assert choice["token_ids"] == reference_greedy(adapted.eval(), PROMPT, 8)
    learner = learner_logprobs(policy, PROMPT, choice["token_ids"])
    engine_lp = torch.tensor(choice["logprobs"]["token_logprobs"])
    assert float((engine_lp - learner).abs().max()) < LEARNER_TOLERANCE
    # The base stays as it was (nothing merged), also when both are asked for at once.
    base = reference_greedy(load_reference(model_dir), PROMPT, 8)
    assert base != choice["token_ids"]
    with ThreadPoolExecutor(4) as pool:
        outs = list(pool.map(lambda m: greedy(url, m), [None, "policy-v1", None, "policy-v1"]))
    assert [o["choices"][0]["token_ids"] for o in outs] == [base, choice["token_ids"]] * 2
    # SGLang's /generate names the adapter in lora_path.
    r = httpx.post(f"{url}/generate", json={"input_ids": PROMPT, "lora_path": "policy-v1",
                   "sampling_params": {"max_new_tokens": 8, "temperature": 0.0}})  # fmt: skip
    assert r.status_code == 200 and r.json()["output_ids"] == choice["token_ids"]
    assert r.json()["meta_info"]["weight_version"] == 1


def test_old_versions_are_unloaded_and_refused_by_name(
    engine: dict, model_dir: Path, one_rank: None, tmp_path: Path
) -> None:
    url = engine["url"]
    policy = lora_policy(model_dir, seed=2)
    push = adapter_push(policy, model_dir, tmp_path, protocol=VLLMWeights())  # vLLM's paths
    for version in (11, 12, 13):
        assert push.push(policy, version, [url]).ok
    assert [n for n in served(url) if n.startswith("policy-v1")] == ["policy-v12", "policy-v13"]
    assert sorted(p.name for p in tmp_path.iterdir()) == ["adapter_v000012", "adapter_v000013"]
    r = complete(url, prompt=PROMPT, max_tokens=2, model="policy-v11")
    assert r.status_code == 422 and "policy-v11" in r.text and "policy-v13" in r.text
    r = httpx.post(f"{url}/v1/unload_lora_adapter", json={"lora_name": "policy-v11"})
    assert r.status_code == 404 and "not loaded" in r.text
    # Version 14 goes into the layers version 11 left (a free slot): it serves its own weights.
    with torch.no_grad():
        for name, p in policy.named_parameters():
            if "lora_B" in name:
                p.mul_(-2.0)
    assert push.push(policy, 14, [url]).ok
    choice = greedy(url, "policy-v14")["choices"][0]
    learner = learner_logprobs(policy, PROMPT, choice["token_ids"])
    engine_lp = torch.tensor(choice["logprobs"]["token_logprobs"])
    assert float((engine_lp - learner).abs().max()) < LEARNER_TOLERANCE
    assert choice["token_ids"] != greedy(url, "policy-v13")["choices"][0]["token_ids"]


def test_an_adapter_of_another_rank_or_base_is_refused_naming_both(
    engine: dict, model_dir: Path, one_rank: None, tmp_path: Path
) -> None:
    url = engine["url"]
    before = served(url)
    big = LoraConfig(enabled=True, rank=16, alpha=16.0, name="big")
    policy = lora_policy(model_dir, big)
    result = adapter_push(policy, model_dir, tmp_path / "a", big).push(policy, 1, [url])
    assert not result.ok
    assert "rank 16" in result.error and "engine.max_lora_rank=8" in result.error
    other = build_tiny_model(tmp_path / "other", hidden_size=64, num_layers=2)
    policy = lora_policy(other)
    result = adapter_push(policy, other, tmp_path / "b").push(policy, 31, [url])
    assert not result.ok
    assert f"built for base {str(other)!r}" in result.error
    assert f"this engine's model {model_dir.name!r}" in result.error
    assert served(url) == before  # nothing of either was loaded


def test_a_restarted_engine_serves_the_base_until_the_adapter_is_pushed_again(
    engine: dict, model_dir: Path, one_rank: None, tmp_path: Path
) -> None:
    policy = lora_policy(model_dir, seed=4)
    push = adapter_push(policy, model_dir, tmp_path)
    assert push.push(policy, 21, [engine["url"]]).ok
    engine["proc"].stop()
    engine["proc"], engine["url"] = start_engine(
        model_dir, engine["log_dir"], "engine.max_lora_rank=8"
    )
    url = engine["url"]
    assert push.served_version(url) == 0 and served(url) == []  # what the catch-up looks at
    assert push.push(policy, 21, [url]).ok
    choice = greedy(url, "policy-v21")["choices"][0]
    learner = learner_logprobs(policy, PROMPT, choice["token_ids"])
    engine_lp = torch.tensor(choice["logprobs"]["token_logprobs"])
    assert float((engine_lp - learner).abs().max()) < LEARNER_TOLERANCE


@pytest.mark.parametrize("engine_api", ["openai", "sglang"])
def test_rollout_clients_name_the_newest_adapter_and_stamp_its_version(
    engine: dict, model_dir: Path, one_rank: None, tmp_path: Path, engine_api: str
) -> None:
    import asyncio

    from dynamo_rl.contracts.sampling import SamplingParams as Sampling
    from services.rollout.engines import make_engine

    url = engine["url"]
    lc = LoraConfig(enabled=True, rank=4, alpha=8.0, name=f"c{engine_api}")
    policy = lora_policy(model_dir, lc, 5)
    push = adapter_push(policy, model_dir, tmp_path, lc)
    base = reference_greedy(load_reference(model_dir), PROMPT, 6)

    async def sample() -> tuple[int, list]:
        client = make_engine(url, engine_api=engine_api, adapter=lc.name)
        try:
            return await client.weight_version(), await client.generate(
                PROMPT, 1, Sampling(max_tokens=6, temperature=0.0)
            )
        finally:
            await client.aclose()

    version, samples = asyncio.run(sample())  # no adapter of this name yet: the base
    assert version == 0 and samples[0].token_ids == base
    assert push.push(policy, 41, [url]).ok
    version, samples = asyncio.run(sample())
    assert version == 41 and samples[0].weight_version == 41
    want = greedy(url, f"c{engine_api}-v41", 6)["choices"][0]["token_ids"]
    assert samples[0].token_ids == want != base
