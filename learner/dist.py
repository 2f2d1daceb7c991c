"""The learner's process group: torchrun's environment, or a world of one without it.

``torchrun`` sets ``RANK``/``WORLD_SIZE``/``LOCAL_RANK``/``MASTER_ADDR``/``MASTER_PORT``; a plain
``dynamo-rl learner`` (no torchrun) becomes rank 0 of a world of one on a free loopback port, so the
same code path (FSDP2 over a process group) runs either way.

Backend: gloo on CPU; on CUDA ``cpu:gloo,cuda:nccl`` — NCCL for the tensors FSDP moves, gloo for the
Python objects rank 0 broadcasts (batches) and for checkpoint coordination.
"""

from __future__ import annotations

import datetime
import os
import pickle
from dataclasses import dataclass
from typing import Any

import torch
import torch.distributed as dist

from dynamo_rl.procs import free_port


@dataclass(frozen=True)
class DistEnv:
    rank: int
    world_size: int
    local_rank: int
    device: torch.device

    @property
    def is_main(self) -> bool:
        return self.rank == 0


def init_distributed(timeout_s: float = 1800.0) -> DistEnv:
    if "RANK" not in os.environ:
        os.environ.update(
            RANK="0",
            WORLD_SIZE="1",
            LOCAL_RANK="0",
            MASTER_ADDR="127.0.0.1",
            MASTER_PORT=str(free_port()),
        )
    rank = int(os.environ["RANK"])
    world = int(os.environ["WORLD_SIZE"])
    local = int(os.environ.get("LOCAL_RANK", "0"))
    if torch.cuda.is_available():
        device = torch.device("cuda", local)
        torch.cuda.set_device(device)
        backend = "cpu:gloo,cuda:nccl"
    else:
        device = torch.device("cpu")
        backend = "gloo"
    if not dist.is_initialized():
        dist.init_process_group(
            backend, rank=rank, world_size=world, timeout=datetime.timedelta(seconds=timeout_s)
        )
    return DistEnv(rank=rank, world_size=world, local_rank=local, device=device)


def world_size() -> int:
    """Ranks in the process group; 1 without one (the RL step run in process, by a benchmark or
    a test, is a world of one and needs no group)."""
    return dist.get_world_size() if dist.is_initialized() else 1


def broadcast_object(obj: Any, src: int = 0) -> Any:
    """``obj`` from ``src`` on every rank (pickled through a byte tensor on the CPU group)."""
    if world_size() == 1:
        return obj
    if dist.get_rank() == src:
        data = torch.frombuffer(bytearray(pickle.dumps(obj)), dtype=torch.uint8)
        size = torch.tensor([data.numel()], dtype=torch.int64)
    else:
        data, size = None, torch.zeros(1, dtype=torch.int64)
    dist.broadcast(size, src)
    if data is None:
        data = torch.empty(int(size.item()), dtype=torch.uint8)
    dist.broadcast(data, src)
    return obj if dist.get_rank() == src else pickle.loads(data.numpy().tobytes())


def all_reduce_sum(values: list[float]) -> list[float]:
    """Element-wise sum of a float list over ranks (float64 on the CPU group)."""
    if world_size() == 1:
        return list(values)
    t = torch.tensor(values, dtype=torch.float64)
    dist.all_reduce(t)
    return t.tolist()


def all_reduce_tensor(t: torch.Tensor) -> torch.Tensor:
    """Element-wise sum of a CPU tensor over ranks (in place; returned for chaining)."""
    if world_size() > 1:
        dist.all_reduce(t)
    return t


def all_gather_object(obj: Any) -> list[Any]:
    if world_size() == 1:
        return [obj]
    out: list[Any] = [None] * dist.get_world_size()
    dist.all_gather_object(out, obj)
    return out
