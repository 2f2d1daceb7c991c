"""LoRA policies (``learner.lora``): adapters built with ``peft`` on the Hugging Face model.

:func:`add_adapters` injects peft's LoRA layers into the policy's LM in place (before FSDP2
shards it, so the adapters are sharded with their layers) and freezes everything else: only the
adapter parameters (and a critic's value head) have gradients and AdamW state. The base weights
never change, so the KL reference is the same model with its adapters switched off
(:func:`adapters_disabled`): no second copy in memory.

Names. Inside the learner an adapter parameter is ``<module>.lora_A.default.weight`` (peft's
adapter name ``default``). Outside — the exported ``adapter_model.safetensors`` and the tensors an
adapter push names — they are peft's saved names, ``base_model.model.<module>.lora_A.weight``
(:func:`peft_name`), so the folder the learner writes is the one ``PeftModel.from_pretrained``
and vLLM's ``/v1/load_lora_adapter`` read as it is. :func:`merge_adapters` folds
``(alpha / r)·B·A`` into the base weights for a merged export.
"""

from __future__ import annotations

import contextlib
import json
import shutil
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import torch
from torch import nn

from dynamo_rl.config.learner import LoraConfig

ADAPTER = "default"  # peft's adapter name inside the learner
SAVED_PREFIX = "base_model.model."  # peft's prefix of saved adapter tensors
LORA_MARK = ".lora_"
ALL_LINEAR = "all-linear"


def peft_config(lc: LoraConfig, base_model: str) -> Any:
    from peft import LoraConfig as PeftLoraConfig

    modules = ALL_LINEAR if lc.target_modules == [ALL_LINEAR] else list(lc.target_modules)
    return PeftLoraConfig(
        r=lc.rank,
        lora_alpha=lc.alpha,
        lora_dropout=lc.dropout,
        target_modules=modules,
        init_lora_weights=True if lc.init == "default" else "gaussian",
        bias="none",
        base_model_name_or_path=base_model,
        task_type="CAUSAL_LM",
    )


def linear_module_names(model: nn.Module) -> list[str]:
    """The distinct last path components of the model's linear layers (what target_modules may
    name)."""
    return sorted(
        {n.rsplit(".", 1)[-1] for n, m in model.named_modules() if isinstance(m, nn.Linear)}
    )


def add_adapters(lm: nn.Module, lc: LoraConfig, base_model: str) -> None:
    """Inject LoRA adapters into ``lm`` in place; freeze every non-adapter parameter of it."""
    from peft import inject_adapter_in_model

    allowed = linear_module_names(lm)
    missing = [m for m in lc.target_modules if m != ALL_LINEAR and m not in allowed]
    if missing:
        raise ValueError(
            f"learner.lora.target_modules: {', '.join(missing)} not in the model {base_model!r}; "
            f"its linear modules: {', '.join(allowed)} (or all-linear)"
        )
    inject_adapter_in_model(peft_config(lc, base_model), lm, adapter_name=ADAPTER)
    for name, param in lm.named_parameters():
        param.requires_grad_(LORA_MARK in name)


def is_adapter(name: str) -> bool:
    return LORA_MARK in name


@contextlib.contextmanager
def adapters_disabled(model: nn.Module) -> Iterator[None]:
    """Run ``model`` as its base: every LoRA layer passes its input to the base layer alone.

    peft's ``enable_adapters`` also flips the adapters' ``requires_grad``, which FSDP2 must not
    see change under it; the flag its forward reads is set directly instead."""
    from peft.tuners.tuners_utils import BaseTunerLayer

    layers = [m for m in model.modules() if isinstance(m, BaseTunerLayer)]
    for layer in layers:
        layer._disable_adapters = True
    try:
        yield
    finally:
        for layer in layers:
            layer._disable_adapters = False


def peft_name(hf_name: str) -> str:
    """``model.layers.0.self_attn.q_proj.lora_A.default.weight`` →
    ``base_model.model.model.layers.0.self_attn.q_proj.lora_A.weight`` (peft's saved name)."""
    return SAVED_PREFIX + hf_name.replace(f".{ADAPTER}.", ".")


def adapter_tensors(state: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """The adapter tensors of a (Hugging Face-named) policy state, under peft's saved names."""
    return {peft_name(n): t for n, t in state.items() if is_adapter(n)}


def write_adapter(
    tensors: dict[str, torch.Tensor], lc: LoraConfig, base_model: str, out_dir: str | Path
) -> Path:
    """A standard peft adapter folder (``adapter_config.json``, ``adapter_model.safetensors``),
    written to a temporary sibling and renamed so a reader never sees half of it."""
    from safetensors.torch import save_file

    out = Path(out_dir)
    tmp = out.with_name(out.name + ".tmp")
    if tmp.exists():
        shutil.rmtree(tmp)
    tmp.mkdir(parents=True)
    peft_config(lc, base_model).save_pretrained(str(tmp))
    flat = {k: v.detach().to(torch.float32).contiguous() for k, v in tensors.items()}
    save_file(flat, str(tmp / "adapter_model.safetensors"), metadata={"format": "pt"})
    if out.exists():
        shutil.rmtree(out)
    tmp.rename(out)
    return out


def read_adapter_config(folder: str | Path) -> dict[str, Any]:
    return json.loads((Path(folder) / "adapter_config.json").read_text())


def merge_adapters(state: dict[str, torch.Tensor], lc: LoraConfig) -> dict[str, torch.Tensor]:
    """Full Hugging Face weights of the adapted policy: each adapted layer's base weight plus
    ``(alpha / r)·B·A``; the adapter tensors are left out."""
    scale = lc.alpha / lc.rank
    out: dict[str, torch.Tensor] = {}
    for name, tensor in state.items():
        if is_adapter(name):
            continue
        if ".base_layer." not in name:
            out[name] = tensor
            continue
        module, leaf = name.split(".base_layer.")
        if leaf == "weight":
            a = state[f"{module}.lora_A.{ADAPTER}.weight"].float()
            b = state[f"{module}.lora_B.{ADAPTER}.weight"].float()
            tensor = (tensor.float() + scale * (b @ a)).to(tensor.dtype)
        out[f"{module}.{leaf}"] = tensor
    return out
