"""LoRA adapters served on top of the engine's base weights, without merging.

The learner of a LoRA policy (``learner.lora``) pushes each new adapter as a peft folder and has
the engine load it under a versioned name (``<name>-v<version>``; the load and unload calls of
:mod:`dynamo_rl.contracts.weight_control`). :class:`Adapters` injects peft's LoRA layers into the
served model in place, one named adapter per load: the base weights are never changed and stay
shared by every adapter and by requests for the base model. A request names its adapter (the
OpenAI ``model`` field, SGLang's ``lora_path``); the batch generator decodes one adapter per
batch and switches the layers to it (:meth:`Adapters.select`) between batches, in the scheduler
thread, like a weight update; its samples carry the adapter's version.

Unloading keeps the adapter's layers as a free slot (two at most): the next load of the same
shape (rank, alpha, tensors) renames the slot and copies into it, milliseconds, where building
peft's layers anew costs about 0.2 s on a 100M model — a learner's pushes load one version and
unload an older one each time.

A folder that does not fit is refused as a whole before anything is loaded, with an error naming
both sides: a rank above ``engine.max_lora_rank``, or tensors of another base (a module this
model lacks, or whose input/output sizes differ) — the adapter's ``base_model_name_or_path``
against the model this engine serves.
"""

from __future__ import annotations

import json
import warnings
from pathlib import Path
from typing import Any

import torch
from torch import nn

from dynamo_rl.contracts.weight_control import adapter_version

SAVED_PREFIX = "base_model.model."
FREE_SLOTS = 2  # unloaded adapters' layers kept for reuse


class AdapterRefused(ValueError):
    """An adapter folder this engine cannot serve (the message names the adapter and the engine)."""


class Adapters:
    """The adapters loaded into one model, by name."""

    def __init__(self, model: nn.Module, served_model: str, max_rank: int) -> None:
        self.model = model
        self.served_model = served_model
        self.max_rank = max_rank
        self.loaded: dict[str, int] = {}  # name -> version (0 for an unversioned name)
        self.active: str | None = None
        # Unloaded adapters' layers, kept for the next load of the same shape (building peft's
        # layers anew costs ~0.2 s on a 100M model; renaming a slot and copying, milliseconds).
        self.shapes: dict[str, tuple] = {}
        self.free: list[tuple[str, tuple]] = []  # (slot name, shape)
        self._slots = 0

    def names(self) -> list[str]:
        return list(self.loaded)

    def read(self, name: str, path: str | Path) -> tuple[Any, dict[str, torch.Tensor]]:
        """The peft config and the tensors of an adapter folder, checked against this model
        (any thread: nothing is changed)."""
        from peft import LoraConfig
        from safetensors.torch import load_file

        folder = Path(path)
        config_file = folder / "adapter_config.json"
        weights = folder / "adapter_model.safetensors"
        if not config_file.is_file() or not weights.is_file():
            raise AdapterRefused(
                f"lora_path: {str(folder)!r} is not a peft adapter folder "
                "(adapter_config.json and adapter_model.safetensors)"
            )
        raw = json.loads(config_file.read_text())
        if raw.get("peft_type", "LORA") != "LORA":
            raise AdapterRefused(f"adapter {name!r}: peft_type {raw['peft_type']!r}; only LORA")
        config = LoraConfig.from_pretrained(str(folder))
        base = raw.get("base_model_name_or_path")
        if config.r > self.max_rank:
            raise AdapterRefused(
                f"adapter {name!r} has rank {config.r} (base {base!r}); this engine "
                f"({self.served_model!r}) takes at most engine.max_lora_rank={self.max_rank}"
            )
        tensors = load_file(str(weights))
        modules = dict(self.model.named_modules())
        for key, t in tensors.items():
            path_, _, leaf = key.removeprefix(SAVED_PREFIX).rpartition(".lora_")
            module = modules.get(path_)
            linear = getattr(module, "base_layer", module)
            if not isinstance(linear, nn.Linear):
                raise AdapterRefused(
                    f"adapter {name!r} was built for base {base!r}: it adapts {path_}, which this "
                    f"engine's model {self.served_model!r} has no linear layer at"
                )
            want = (
                (config.r, linear.in_features) if leaf.startswith("A") else
                (linear.out_features, config.r)
            )  # fmt: skip
            if tuple(t.shape) != want:
                raise AdapterRefused(
                    f"adapter {name!r} was built for base {base!r}: its {key} is "
                    f"{tuple(t.shape)}, this engine's model {self.served_model!r} needs {want}"
                )
        return config, tensors

    def load(self, name: str, config: Any, tensors: dict[str, torch.Tensor]) -> int:
        """Scheduler thread: add (or replace) adapter ``name``; returns its version. The layers
        of an unloaded adapter of the same shape are reused when there is one. The layers keep
        running the adapter they ran (a batch held at a token boundary goes on with its own)."""
        from peft import inject_adapter_in_model

        running = self.active
        if name in self.loaded:
            self.unload(name)
        shape = (config.r, config.lora_alpha, bool(config.use_rslora),
                 tuple(sorted((k, tuple(t.shape)) for k, t in tensors.items())))  # fmt: skip
        slot = next((s for s, sh in self.free if sh == shape), None)
        if slot is not None:
            self.free.remove((slot, shape))
            self._rename(slot, name)
        else:
            with warnings.catch_warnings():  # "multiple adapters in the model": what we serve
                warnings.filterwarnings("ignore", "Already found a `peft_config`")
                inject_adapter_in_model(config, self.model, adapter_name=name)
        self.shapes[name] = shape
        modules = dict(self.model.named_modules())
        with torch.no_grad():
            for key, t in tensors.items():
                path_, _, leaf = key.removeprefix(SAVED_PREFIX).rpartition(".")
                owner, _, part = path_.rpartition(".")  # part: lora_A or lora_B
                layer = getattr(modules[owner], part)[name]
                getattr(layer, leaf).copy_(t)
        self.model.eval()
        self.loaded[name] = adapter_version(name) or 0
        self.active = None  # the injection may have switched the layers: select them again
        self.select(running if running in self.loaded else None)
        return self.loaded[name]

    def unload(self, name: str) -> None:
        """Scheduler thread: stop serving adapter ``name``; its layers become a free slot."""
        from peft.tuners.tuners_utils import BaseTunerLayer

        if name not in self.loaded:
            raise KeyError(name)
        del self.loaded[name]
        self.active = None
        self._slots += 1
        slot = f"__free{self._slots}"
        self._rename(name, slot)
        self.free.append((slot, self.shapes.pop(name)))
        while len(self.free) > FREE_SLOTS:
            old, _ = self.free.pop(0)
            for module in self.model.modules():
                if isinstance(module, BaseTunerLayer) and old in module.lora_A:
                    module.delete_adapter(old)

    def _rename(self, old: str, new: str) -> None:
        """Move adapter ``old``'s entries to ``new`` in every LoRA layer (every per-adapter
        table peft declares for a layer)."""
        from peft.tuners.tuners_utils import BaseTunerLayer

        for module in self.model.modules():
            if not isinstance(module, BaseTunerLayer) or old not in module.lora_A:
                continue
            for table in (*module.adapter_layer_names, *module.other_param_names, "lora_variant"):
                entries = getattr(module, table, None)
                if entries is not None and old in entries:
                    entries[new] = entries.pop(old)

    def select(self, name: str | None) -> None:
        """Scheduler thread: the layers run adapter ``name`` (None: the base alone)."""
        from peft.tuners.tuners_utils import BaseTunerLayer

        if name == self.active and name is not None:
            return
        for module in self.model.modules():
            if isinstance(module, BaseTunerLayer):
                if name is not None and name in module.lora_A:
                    module.set_adapter(name)
                    module.enable_adapters(True)
                else:
                    module.enable_adapters(False)
        self.active = name
