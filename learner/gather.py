"""Full parameter values from FSDP2 shards, one flat bucket at a time: the collective half of the
weight push (:mod:`learner.push`), which every learner rank joins.

A bucket's layout (which parameters, where each one's bytes start) is
:class:`dynamo_rl.contracts.weight_layout.Bucket`, the same layout the engines unpack.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import torch
import torch.distributed as dist

from dynamo_rl.contracts.weight_layout import Bucket


def _dim0_shard(param: torch.Tensor) -> Any:
    """The process group a parameter is sharded over on dim 0 across the whole world (FSDP2's
    layout), or None (not a DTensor, or another layout)."""
    placements = getattr(param, "placements", None)
    mesh = getattr(param, "device_mesh", None)
    if placements is None or mesh is None or mesh.ndim != 1 or param.dim() == 0:
        return None
    if len(placements) != 1 or not placements[0].is_shard(0):
        return None
    if mesh.size() != dist.get_world_size():
        return None
    return mesh.get_group()


def _raw(t: torch.Tensor) -> torch.Tensor:
    return t.detach().contiguous().view(-1).view(torch.uint8)

    return t.detach().contiguous().view(-1).view(torch.uint8)


def gather_bucket(
    params: Sequence[torch.Tensor], bucket: Bucket, device: torch.device
) -> torch.Tensor | None:
    """Collective: the full values of ``params[bucket.first:bucket.end]`` laid out in one flat
    byte buffer as ``bucket`` says — on rank 0; None elsewhere.

    FSDP2 shards every parameter on dim 0 in ``torch.chunk`` pieces, so a full tensor's bytes are
    its ranks' pieces one after the other. Each rank packs its pieces (padded to the largest
    piece, so every rank sends as many bytes) into one buffer and a single ``gather`` brings them
    to rank 0, which copies each piece to its place: one collective per bucket instead of an
    all-gather per parameter. Parameters in any other layout are gathered one by one
    (``full_tensor``)."""
    rank, world = dist.get_rank(), dist.get_world_size()
    idx = range(bucket.first, bucket.end)
    flat = torch.empty(bucket.size, dtype=torch.uint8, device=device) if rank == 0 else None
    groups = {_dim0_shard(params[i]) for i in idx} if world > 1 else {None}
    if len(groups) != 1 or None in groups:
        for k, i in enumerate(idx):
            p = params[i]
            full = p.full_tensor() if hasattr(p, "full_tensor") else p
            if flat is not None:
                raw = _raw(full.to(device))
                flat[bucket.offsets[k] : bucket.offsets[k] + raw.numel()].copy_(raw)
        return flat
    group = groups.pop()
    layout = []  # per parameter: bytes of one row, rows of each rank's piece
    chunks = []
    for i in idx:
        p = params[i]
        n = p.shape[0]
        row = (p.numel() // n if n else 0) * p.element_size()
        c = -(-n // world)
        rows = [max(0, min(c, n - r * c)) for r in range(world)]
        local = _raw(p.to_local().to(device))
        if local.numel() != rows[rank] * row:
            raise RuntimeError(f"parameter {i}: unexpected shard size {local.numel()} bytes")
        chunks.append(local)
        if local.numel() < c * row:
            chunks.append(torch.zeros(c * row - local.numel(), dtype=torch.uint8, device=device))
        layout.append((row, rows, c))
    send = torch.cat(chunks) if chunks else torch.empty(0, dtype=torch.uint8, device=device)
    received = [torch.empty_like(send) for _ in range(world)] if rank == 0 else None
    dist.gather(send, received, dst=0, group=group)
    if flat is not None and received is not None:
        at = 0  # where this parameter's padded piece starts in every rank's buffer
        for k, (row, rows, c) in enumerate(layout):
            out = bucket.offsets[k]
            for r in range(world):
                n = rows[r] * row
                flat[out : out + n].copy_(received[r][at : at + n])
                out += n
            at += c * row
    return flat
