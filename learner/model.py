"""The policy (and reference) model: loading, FSDP2 sharding, full-weight gathering, HF export.

:class:`PolicyModel` wraps a Hugging Face causal LM (attribute ``lm``) and, for PPO, a value head
on the last hidden state. Its forward computes the LM head only at the response positions
(``[B, T, V]`` logits instead of ``[B, L, V]``), which is where the memory of an RL step goes.
Prompts are left-padded and responses right-padded, so every response starts at the same column.

FSDP2 (``fully_shard``) wraps each decoder layer, then the wrapper as the root (which holds the
embeddings, final norm, LM head and value head — tied embeddings stay in one group). On CUDA the
parameters compute in bf16 with fp32 gradients reduction (``MixedPrecisionPolicy``); on CPU
everything is float32.

Hugging Face names are the wrapped LM's own (``lm.`` stripped); the value head is not part of the
exported or pushed policy.
"""

from __future__ import annotations

import logging
import shutil
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import torch
from torch import nn
from torch.distributed.checkpoint.state_dict import StateDictOptions, get_model_state_dict
from torch.distributed.fsdp import MixedPrecisionPolicy, fully_shard

log = logging.getLogger(__name__)

LM_PREFIX = "lm."
VALUE_HEAD = "value_head"
# Files of a model folder that an export rewrites (weights and config); the rest (tokenizer,
# generation config, chat template) is copied as it is.
_WEIGHT_SUFFIXES = (".safetensors", ".bin", ".pt", ".pth")
_REWRITTEN = {"config.json", "model.safetensors.index.json", "pytorch_model.bin.index.json"}


class PolicyModel(nn.Module):
    """A causal LM that returns response-position logits (and values when it has a critic)."""

    def __init__(self, lm: nn.Module, value_head: bool = False) -> None:
        super().__init__()
        self.lm = lm
        self.value_head = nn.Linear(lm.config.hidden_size, 1) if value_head else None
        if self.value_head is not None:
            nn.init.zeros_(self.value_head.weight)
            nn.init.zeros_(self.value_head.bias)

    def forward(
        self,
        input_ids: torch.Tensor,
        attention_mask: torch.Tensor,
        response_len: int,
    ) -> tuple[torch.Tensor, torch.Tensor | None]:
        """Logits ``[B, T, V]`` predicting the last ``T = response_len`` columns, and values
        ``[B, T]`` (the critic's estimate at the state before each response token) or None."""
        position_ids = (attention_mask.long().cumsum(-1) - 1).clamp(min=0)
        hidden = self.lm.model(
            input_ids=input_ids,
            attention_mask=attention_mask,
            position_ids=position_ids,
            use_cache=False,
        ).last_hidden_state
        width = input_ids.shape[1]
        # Column c's logits predict token c + 1: the response occupies [width − T, width).
        h = hidden[:, width - response_len - 1 : width - 1]
        logits = self.lm.lm_head(h)
        values = self.value_head(h).squeeze(-1).float() if self.value_head is not None else None
        return logits, values


def compute_dtype(setting: str, device: torch.device) -> torch.dtype:
    if setting == "float32":
        return torch.float32
    if setting == "bfloat16":
        return torch.bfloat16
    if device.type == "cuda" and torch.cuda.is_bf16_supported():
        return torch.bfloat16
    return torch.float32


def load_policy(path: str, *, value_head: bool = False) -> PolicyModel:
    """Load the HF model in float32 on the CPU (FSDP moves the shards to the device)."""
    from transformers import AutoModelForCausalLM

    lm = AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32)
    lm.config.use_cache = False
    return PolicyModel(lm, value_head=value_head)


def shard(model: PolicyModel, device: torch.device, dtype: torch.dtype) -> PolicyModel:
    """FSDP2: each decoder layer, then the root; parameters move to ``device``."""
    mp = None
    if dtype != torch.float32:
        mp = MixedPrecisionPolicy(param_dtype=dtype, reduce_dtype=torch.float32)
    kwargs = {"mp_policy": mp} if mp is not None else {}
    model.to(device)
    for layer in model.lm.model.layers:
        fully_shard(layer, **kwargs)
    fully_shard(model, **kwargs)
    return model


def hf_name(name: str) -> str | None:
    """The Hugging Face parameter name of a wrapper parameter; None for the value head."""
    if name.startswith(VALUE_HEAD):
        return None
    return name.removeprefix(LM_PREFIX)


def policy_parameters(model: nn.Module) -> Iterator[tuple[str, nn.Parameter]]:
    """(HF name, parameter) of the policy, tied weights once, the value head left out."""
    for name, param in model.named_parameters():
        hf = hf_name(name)
        if hf is not None:
            yield hf, param


def trainable_entries(model: nn.Module, state: dict[str, Any]) -> dict[str, Any]:
    """The entries of a model state dict that are parameters that train. ``ignore_frozen_params``
    alone keeps a tied weight's second name (``lm_head.weight`` tied to a frozen embedding)."""
    names = {n for n, p in model.named_parameters() if p.requires_grad}
    return {k: v for k, v in state.items() if k in names}


def trainable_policy_state(model: nn.Module) -> dict[str, torch.Tensor]:
    """Full CPU values of the policy parameters that train, on rank 0 (empty elsewhere); a
    collective that gathers those parameters alone (a state-dict gather would gather the frozen
    ones too before leaving them out)."""
    import torch.distributed as dist

    main = not dist.is_initialized() or dist.get_rank() == 0
    out: dict[str, torch.Tensor] = {}
    for name, param in model.named_parameters():
        hf = hf_name(name)
        if not param.requires_grad or hf is None:
            continue
        full = param.full_tensor() if hasattr(param, "full_tensor") else param
        if main:
            out[hf] = full.detach().to("cpu", torch.float32)
    return out


def full_policy_state(model: nn.Module, trainable_only: bool = False) -> dict[str, torch.Tensor]:
    """Full float32 CPU state dict of the policy on rank 0 (empty elsewhere); a collective.
    ``trainable_only``: the parameters that train (a LoRA policy's adapters), nothing frozen."""
    if trainable_only:
        return trainable_policy_state(model)
    options = StateDictOptions(full_state_dict=True, cpu_offload=True)
    sd = get_model_state_dict(model, options=options)
    out: dict[str, torch.Tensor] = {}
    for name, tensor in sd.items():
        hf = hf_name(name)
        if hf is not None:
            out[hf] = tensor
    return out


def export_hf(
    state: dict[str, torch.Tensor], config: object, source_dir: str | Path, out_dir: str | Path
) -> Path:
    """Write ``state`` as a Hugging Face model folder (safetensors + config + tokenizer files).

    Written to a temporary sibling and renamed, so a reader never sees half an export. Tied
    weights are written once (as ``save_pretrained`` does)."""
    from safetensors.torch import save_file

    out = Path(out_dir)
    tmp = out.with_name(out.name + ".tmp")
    if tmp.exists():
        shutil.rmtree(tmp)
    tmp.mkdir(parents=True)
    tensors = dict(state)
    if getattr(config, "tie_word_embeddings", False):
        tensors.pop("lm_head.weight", None)
    tensors = {k: v.detach().contiguous() for k, v in tensors.items()}
    save_file(tensors, str(tmp / "model.safetensors"), metadata={"format": "pt"})
    config.save_pretrained(tmp)  # type: ignore[attr-defined]
    for item in Path(source_dir).iterdir():
        if item.is_file() and item.name not in _REWRITTEN and item.suffix not in _WEIGHT_SUFFIXES:
            shutil.copy2(item, tmp / item.name)
    if out.exists():
        shutil.rmtree(out)
    tmp.rename(out)
    return out
