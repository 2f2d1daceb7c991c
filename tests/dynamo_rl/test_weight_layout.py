"""The flat-bucket layout both ends of a push import (``dynamo_rl.contracts.weight_layout``)."""

from __future__ import annotations

from pathlib import Path

import pytest

from dynamo_rl.contracts.weight_layout import ALIGN, Bucket, flat_buckets, tensor_bytes
from tests.conftest import REPO


def test_consecutive_tensors_share_aligned_buckets() -> None:
    # 10 B at 0, 20 B at 16 (aligned), then 100 B does not fit in 40 B: alone; then 5 B.
    assert flat_buckets([10, 20, 100, 5], 40) == [
        Bucket(0, 2, (0, 16), 36),
        Bucket(2, 3, (0,), 100),
        Bucket(3, 4, (0,), 5),
    ]


@pytest.mark.parametrize("bucket_bytes", [1, 64, 1000, 1 << 20])
def test_every_tensor_once_in_order_aligned_and_bounded(bucket_bytes: int) -> None:
    sizes = [3, 64, 1, 1000, 17, 0, 256, 5, 4096, 7]
    buckets = flat_buckets(sizes, bucket_bytes)
    assert [i for b in buckets for i in range(b.first, b.end)] == list(range(len(sizes)))
    for b in buckets:
        ends = [at + sizes[b.first + k] for k, at in enumerate(b.offsets)]
        assert all(at % ALIGN == 0 for at in b.offsets)
        assert all(e <= nxt for e, nxt in zip(ends, b.offsets[1:], strict=False))  # no overlap
        assert b.size == ends[-1]
        assert b.size <= bucket_bytes or b.end - b.first == 1  # only a lone tensor exceeds it


def test_sizes_and_errors() -> None:
    assert tensor_bytes("bfloat16", [3, 4]) == 24
    assert tensor_bytes("torch.float32", [2]) == 8
    with pytest.raises(ValueError, match="allowed: float64"):
        tensor_bytes("float8", [1])
    with pytest.raises(ValueError, match="bucket_bytes must be > 0"):
        flat_buckets([1], 0)


def test_the_vllm_plugin_imports_this_very_file() -> None:
    link = REPO / "vllm_plugin" / "dynamo_rl_vllm_plugin" / "weight_layout.py"
    assert link.is_symlink()
    assert link.resolve() == (REPO / "dynamo_rl" / "contracts" / "weight_layout.py").resolve()
    assert Path(link.resolve()).read_text().startswith('"""The flat-bucket layout')
