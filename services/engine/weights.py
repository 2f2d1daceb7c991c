"""Receiving new weights: the learner's torch.distributed broadcast, or a checkpoint on disk.

The group follows docs/contracts.md: rank 0 (the learner) hosts a ``TCPStore`` at
``master_address:master_port``; every rank wraps it in a ``PrefixStore(group_name)`` and builds a
standalone ``ProcessGroupGloo`` (or NCCL) on it — never the default group, so it cannot clash
with the learner's FSDP group. Each push broadcasts every tensor from rank 0 in ``names`` order:
one broadcast per tensor, or (a vLLM-shaped group with ``bucket_bytes`` > 0) one per flat bucket
of several tensors, laid out by :func:`dynamo_rl.contracts.weight_layout.flat_buckets`.

Tensors are received into fresh buffers first and only then copied into the model by the
scheduler thread between batches (see :mod:`.weight_updates`), so a batch never sees a mix of
versions. A push whose names or shapes do not fit the model is still received in full (the learner is
already broadcasting; refusing half-way would hang it) and then rejected as a whole.
"""

from __future__ import annotations

import datetime
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

import torch
import torch.distributed as dist

from dynamo_rl.contracts.weight_layout import flat_buckets

DTYPES: dict[str, torch.dtype] = {
    "float32": torch.float32,
    "float": torch.float32,
    "float16": torch.float16,
    "half": torch.float16,
    "bfloat16": torch.bfloat16,
    "float64": torch.float64,
    "int64": torch.int64,
    "int32": torch.int32,
    "uint8": torch.uint8,
    "bool": torch.bool,
}


def parse_dtype(name: str) -> torch.dtype:
    """``"bfloat16"`` or ``"torch.bfloat16"`` -> torch.bfloat16; ValueError names the allowed."""
    key = name.removeprefix("torch.")
    if key not in DTYPES:
        raise ValueError(f"unknown dtype {name!r}; allowed: {', '.join(DTYPES)}")
    return DTYPES[key]


class WeightUpdateGroup:
    """This engine's membership in a learner's weight-update group."""

    def __init__(
        self,
        master_address: str,
        master_port: int,
        rank: int,
        world_size: int,
        group_name: str,
        backend: str,
        timeout_s: float,
        bucket_bytes: int = 0,
    ) -> None:
        if backend not in ("gloo", "nccl"):
            raise ValueError(f"backend must be 'gloo' or 'nccl', got {backend!r}")
        if not 0 < rank < world_size:
            raise ValueError(f"rank_offset must be in [1, world_size), got {rank} of {world_size}")
        timeout = datetime.timedelta(seconds=timeout_s)
        self.group_name = group_name
        self.rank = rank
        self.world_size = world_size
        self.backend = backend
        self.bucket_bytes = bucket_bytes
        self.store = dist.TCPStore(
            master_address, master_port, world_size, is_master=False, timeout=timeout
        )
        prefixed = dist.PrefixStore(group_name, self.store)
        if backend == "gloo":
            self.group: dist.ProcessGroup = dist.ProcessGroupGloo(
                prefixed, rank, world_size, timeout
            )
            self.device = torch.device("cpu")
        else:
            if not torch.cuda.is_available():
                raise ValueError("backend 'nccl' needs CUDA; this engine runs on CPU (use 'gloo')")
            self.group = dist.ProcessGroupNCCL(prefixed, rank, world_size)
            self.device = torch.device("cuda")

    def receive(
        self, dtypes: Sequence[torch.dtype], shapes: Sequence[Sequence[int]]
    ) -> list[torch.Tensor]:
        """Receive tensors of these dtypes and shapes from rank 0, in order: one broadcast each,
        or one per flat bucket when the group has ``bucket_bytes``."""
        if not self.bucket_bytes:
            out = []
            for dtype, shape in zip(dtypes, shapes, strict=True):
                t = torch.empty(tuple(shape), dtype=dtype, device=self.device)
                self.group.broadcast(t, 0).wait()
                out.append(t)
            return out
        sizes = [
            torch.Size(shape).numel() * torch.empty((), dtype=dtype).element_size()
            for dtype, shape in zip(dtypes, shapes, strict=True)
        ]
        tensors: list[torch.Tensor] = []
        for bucket in flat_buckets(sizes, self.bucket_bytes):
            flat = torch.empty(bucket.size, dtype=torch.uint8, device=self.device)
            self.group.broadcast(flat, 0).wait()
            for k, i in enumerate(range(bucket.first, bucket.end)):
                at = bucket.offsets[k]
                raw = flat[at : at + sizes[i]]
                tensors.append(raw.view(dtypes[i]).view(tuple(shapes[i])))
        return tensors

    def close(self) -> None:
        # Dropping the references tears the group down; nothing global to undo.
        self.group = None  # type: ignore[assignment]
        self.store = None  # type: ignore[assignment]


@dataclass
class Mismatch:
    """Why a set of tensors does not fit the model (empty lists mean it fits)."""

    unknown: list[str]
    wrong_shape: list[str]

    def __bool__(self) -> bool:
        return bool(self.unknown or self.wrong_shape)

    def message(self) -> str:
        parts = []
        if self.unknown:
            parts.append(f"unknown parameter names: {', '.join(self.unknown[:5])}")
        if self.wrong_shape:
            parts.append(f"shape differs from the model's: {', '.join(self.wrong_shape[:5])}")
        return "; ".join(parts)


def check_fits(
    params: dict[str, torch.Tensor], names: Sequence[str], shapes: Sequence[Sequence[int]]
) -> Mismatch:
    unknown = [n for n in names if n not in params]
    wrong = [
        n
        for n, s in zip(names, shapes, strict=True)
        if n in params and tuple(params[n].shape) != tuple(s)
    ]
    return Mismatch(unknown, wrong)


def load_checkpoint(model_path: str | Path) -> dict[str, torch.Tensor]:
    """Every tensor of a Hugging Face checkpoint directory (safetensors, else PyTorch bins)."""
    path = Path(model_path)
    if not path.is_dir():
        raise FileNotFoundError(f"model_path {str(path)!r} is not a directory")
    files = sorted(path.glob("*.safetensors"))
    tensors: dict[str, torch.Tensor] = {}
    if files:
        from safetensors.torch import load_file

        for f in files:
            tensors.update(load_file(str(f)))
        return tensors
    bins = sorted(path.glob("pytorch_model*.bin"))
    if not bins:
        raise FileNotFoundError(f"no *.safetensors or pytorch_model*.bin in {str(path)!r}")
    for f in bins:
        tensors.update(torch.load(f, map_location="cpu", weights_only=True))
    return tensors


def copy_into(params: dict[str, torch.Tensor], tensors: dict[str, torch.Tensor]) -> None:
    """Copy tensors into the model's parameters in place (casting dtype and device)."""
    with torch.no_grad():
        for name, t in tensors.items():
            params[name].copy_(t)
