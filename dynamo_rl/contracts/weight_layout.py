"""The flat-bucket layout of a weight push: which tensors share one broadcast, and where each
sits in its buffer.

Both ends import this very file: the learner's push (``learner/push.py``), the embedded engine
(``services/engine``) and the vLLM plugin's gloo backend, where ``vllm_plugin/
dynamo_rl_vllm_plugin/weight_layout.py`` is a symbolic link to it (the plugin runs in vLLM's own
environment, without DynaMO-RL installed). It therefore imports nothing but the standard library.

Layout, for tensors ``0..n-1`` in the push's ``names`` order and a bucket size ``bucket_bytes``:
consecutive tensors go into one flat byte buffer while it stays within ``bucket_bytes`` (a larger
tensor travels alone); each tensor starts at an offset rounded up to :data:`ALIGN` bytes, so every
dtype can view its slice; the buffer is as long as its last tensor's end. One broadcast per
buffer, from rank 0. ``bucket_bytes == 0`` means no packing: one broadcast per tensor.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

ALIGN = 16
"""Byte alignment of each tensor inside a bucket."""

GLOO_STORE_PREFIX = "dynamo_rl_gloo"
"""Key prefix of a vLLM-shaped push group on the trainer's TCPStore (vLLM's init_info names no
group): the learner, the embedded engine and the plugin's gloo backend all use it."""

DTYPE_BYTES: dict[str, int] = {
    "float64": 8, "float32": 4, "float": 4, "float16": 2, "half": 2, "bfloat16": 2,
    "int64": 8, "int32": 4, "int16": 2, "int8": 1, "uint8": 1, "bool": 1,
}  # fmt: skip
"""Element size of each dtype name a push may carry (``torch.`` prefix allowed)."""


def dtype_bytes(name: str) -> int:
    key = name.removeprefix("torch.")
    if key not in DTYPE_BYTES:
        raise ValueError(f"unknown dtype {name!r}; allowed: {', '.join(DTYPE_BYTES)}")
    return DTYPE_BYTES[key]


def tensor_bytes(dtype: str, shape: Sequence[int]) -> int:
    n = dtype_bytes(dtype)
    for d in shape:
        n *= int(d)
    return n


@dataclass(frozen=True)
class Bucket:
    """Tensors ``first .. end-1`` in one flat buffer of ``size`` bytes, tensor ``first + k`` at
    byte ``offsets[k]``."""

    first: int
    end: int
    offsets: tuple[int, ...]
    size: int


def flat_buckets(sizes: Sequence[int], bucket_bytes: int) -> list[Bucket]:
    """The buckets of tensors of ``sizes`` bytes (in push order); see the module docstring."""
    if bucket_bytes <= 0:
        raise ValueError(f"bucket_bytes must be > 0 for a flat layout, got {bucket_bytes}")
    out: list[Bucket] = []
    first, offsets, size = 0, [], 0
    for i, n in enumerate(sizes):
        start = -(-size // ALIGN) * ALIGN
        if offsets and start + n > bucket_bytes:
            out.append(Bucket(first, i, tuple(offsets), size))
            first, offsets, start = i, [], 0
        offsets.append(start)
        size = start + n
    if offsets:
        out.append(Bucket(first, len(sizes), tuple(offsets), size))
    return out
