"""LoRA policies in the learner, in the test process (a one-rank gloo world, FSDP2 on CPU):
adapter-only training, the reference as the policy with its adapters disabled, the peft export
(loaded by ``peft`` itself) and the merged export, checked against real computations.

End-to-end runs of the rl, sft and dpo modes with LoRA (checkpoints, exact resume) are
``test_lora_train.py``."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from dynamo_rl.config.learner import LearnerConfig, LoraConfig
from learner.lora import (
    adapter_tensors,
    adapters_disabled,
    add_adapters,
    merge_adapters,
    write_adapter,
)
from learner.model import PolicyModel, full_policy_state, load_policy, shard
from learner.tiny_model import build_tiny_model

LORA = LoraConfig(enabled=True, rank=4, alpha=8.0)


@pytest.fixture(scope="module")
def tiny_model(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return build_tiny_model(tmp_path_factory.mktemp("model") / "m", hidden_size=32, num_layers=2)


def lora_policy(path: Path, lc: LoraConfig = LORA, seed: int = 3) -> PolicyModel:
    """A sharded LoRA policy whose B matrices are random (a trained-looking adapter)."""
    policy = load_policy(str(path))
    add_adapters(policy.lm, lc, str(path))
    gen = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, p in policy.named_parameters():
            if "lora_B" in name:
                p.copy_(torch.randn(p.shape, generator=gen) * 0.3)
    return shard(policy, torch.device("cpu"), torch.float32)


def logprobs(model: torch.nn.Module, ids: torch.Tensor) -> torch.Tensor:
    """Log-probs of ``ids[:, 1:]`` under a Hugging Face model (or a PolicyModel's LM)."""
    with torch.no_grad():
        logits = model(input_ids=ids).logits
    return logits[:, :-1].log_softmax(-1).gather(-1, ids[:, 1:, None]).squeeze(-1)


def policy_logprobs(policy: PolicyModel, ids: torch.Tensor) -> torch.Tensor:
    with torch.no_grad():
        logits, _ = policy(ids, torch.ones_like(ids), ids.shape[1] - 1)
    return logits.log_softmax(-1).gather(-1, ids[:, 1:, None]).squeeze(-1)


IDS = torch.tensor([[5, 40, 41, 42, 77, 78, 100, 101, 3], [9, 9, 60, 61, 62, 63, 64, 65, 66]])


# --- config -------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("field", "value", "needle"),
    [
        ("rank", 0, "greater than or equal to 1"),
        ("init", "pissa", "'default' or 'gaussian'"),
        ("target_modules", [], "name at least one module"),
        ("target_modules", ["all-linear", "q_proj"], "all-linear stands alone"),
        ("dropout", 1.0, "less than 1"),
        ("name", "my policy", "should match pattern"),  # an adapter name engines serve
    ],
)
def test_bad_lora_settings_name_the_field_and_what_is_allowed(
    field: str, value: object, needle: str
) -> None:
    with pytest.raises(ValueError) as e:
        LoraConfig(**{field: value})
    assert field in str(e.value) and needle in str(e.value)


def test_lora_dropout_is_refused_in_rl_mode_and_accepted_in_sft() -> None:
    lora = {"enabled": True, "dropout": 0.1}
    with pytest.raises(ValueError, match=r"learner\.lora\.dropout must be 0 in learner\.mode 'rl'"):
        LearnerConfig(lora=lora)
    assert LearnerConfig(mode="sft", data={"path": "x.jsonl"}, lora=lora).lora.dropout == 0.1


def test_target_modules_from_text() -> None:
    assert LoraConfig(target_modules="q_proj, v_proj").target_modules == ["q_proj", "v_proj"]


def test_an_unknown_target_module_names_the_models_linear_modules(tiny_model: Path) -> None:
    policy = load_policy(str(tiny_model))
    with pytest.raises(ValueError) as e:
        add_adapters(policy.lm, LoraConfig(target_modules=["qkv_proj"]), str(tiny_model))
    message = str(e.value)
    assert "learner.lora.target_modules: qkv_proj" in message
    assert "q_proj" in message and "down_proj" in message


# --- the policy ---------------------------------------------------------------------------------


def test_only_adapters_train_and_get_gradients(tiny_model: Path, one_rank: None) -> None:
    policy = lora_policy(tiny_model)
    trainable = [n for n, p in policy.named_parameters() if p.requires_grad]
    assert trainable and all(".lora_A." in n or ".lora_B." in n for n in trainable)
    # 2 layers x 4 attention projections x (A, B)
    assert len(trainable) == 2 * 4 * 2
    logits, _ = policy(IDS, torch.ones_like(IDS), 4)
    logits.logsumexp(-1).sum().backward()
    for name, p in policy.named_parameters():
        assert (p.grad is not None) == p.requires_grad, name
    assert all(float(p.grad.abs().sum()) > 0 for p in policy.parameters() if p.requires_grad)


def test_all_linear_adapts_the_mlp_too_but_not_the_lm_head(tiny_model: Path) -> None:
    policy = load_policy(str(tiny_model))
    add_adapters(policy.lm, LoraConfig(target_modules=["all-linear"]), str(tiny_model))
    adapted = {n.split(".lora_")[0].rsplit(".", 1)[-1] for n, _ in policy.named_parameters()
               if ".lora_" in n}  # fmt: skip
    assert {"q_proj", "o_proj", "gate_proj", "down_proj"} <= adapted
    assert "lm_head" not in adapted


def test_the_reference_is_the_base_model_with_adapters_disabled(
    tiny_model: Path, one_rank: None
) -> None:
    from transformers import AutoModelForCausalLM

    policy = lora_policy(tiny_model)
    base = AutoModelForCausalLM.from_pretrained(tiny_model).eval()
    adapted = policy_logprobs(policy, IDS)
    with adapters_disabled(policy):
        reference = policy_logprobs(policy, IDS)
    torch.testing.assert_close(reference, logprobs(base, IDS), atol=1e-5, rtol=0)
    assert float((adapted - reference).abs().max()) > 1e-2  # the adapters do change the policy
    # Switched back on afterwards, gradients flags untouched.
    torch.testing.assert_close(policy_logprobs(policy, IDS), adapted)
    assert all(p.requires_grad for n, p in policy.named_parameters() if ".lora_" in n)


def test_the_export_loads_with_peft_and_gives_the_learners_logprobs(
    tiny_model: Path, one_rank: None, tmp_path: Path
) -> None:
    import json

    from peft import PeftModel
    from transformers import AutoModelForCausalLM

    policy = lora_policy(tiny_model)
    tensors = adapter_tensors(full_policy_state(policy, trainable_only=True))
    assert len(tensors) == 16 and all(k.startswith("base_model.model.model.") for k in tensors)
    out = write_adapter(tensors, LORA, str(tiny_model), tmp_path / "adapter")
    assert sorted(p.name for p in out.iterdir()) == [
        "adapter_config.json", "adapter_model.safetensors"
    ]  # fmt: skip
    config = json.loads((out / "adapter_config.json").read_text())
    assert config["r"] == 4 and config["lora_alpha"] == 8.0
    assert config["base_model_name_or_path"] == str(tiny_model)
    base = AutoModelForCausalLM.from_pretrained(tiny_model)
    loaded = PeftModel.from_pretrained(base, str(out)).eval()
    torch.testing.assert_close(logprobs(loaded, IDS), policy_logprobs(policy, IDS), atol=1e-5,
                               rtol=0)  # fmt: skip


def test_merged_weights_give_the_adapted_policys_logprobs(tiny_model: Path, one_rank: None) -> None:
    from transformers import AutoModelForCausalLM

    policy = lora_policy(tiny_model)
    merged = merge_adapters(full_policy_state(policy), LORA)
    assert not [k for k in merged if "lora_" in k or "base_layer" in k]
    plain = AutoModelForCausalLM.from_pretrained(tiny_model)
    assert set(merged) == set(plain.state_dict())
    plain.load_state_dict(merged)
    torch.testing.assert_close(logprobs(plain.eval(), IDS), policy_logprobs(policy, IDS),
                               atol=1e-5, rtol=0)  # fmt: skip
