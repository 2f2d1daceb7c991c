"""``gloo`` weight-transfer backend: vLLM's weight-update routes on a CPU server.

Start the server with ``VLLM_SERVER_DEV_MODE=1`` and ``--weight-transfer-config
'{"backend": "gloo"}'``. The wire protocol, as the trainer drives it over HTTP:

1. The trainer (rank 0) opens a ``torch.distributed.TCPStore`` as master on ``master_port`` and
   calls ``POST /init_weight_transfer_engine {"init_info": {"master_address", "master_port",
   "world_size", "rank_offset": 1}}`` while it builds its ``ProcessGroupGloo`` (rank 0,
   ``world_size``) on that store under the prefix ``GLOO_STORE_PREFIX``
   (:mod:`.weight_layout`). Each inference worker joins as rank ``rank_offset + its global worker rank``. Optional ``bucket_bytes`` (default 0)
   and ``timeout_s`` (default 300) ride the same ``init_info``: they must agree on both sides,
   so the trainer chooses them once, here.
2. Per update: ``POST /start_weight_update``; then ``POST /update_weights {"update_info":
   {"names", "dtype_names", "shapes"}}`` *while* the trainer broadcasts from rank 0 (the HTTP call
   returns when every tensor has arrived); then ``POST /finish_weight_update``.
3. Tensors travel in ``names`` order: one broadcast per tensor when ``bucket_bytes`` is 0;
   otherwise consecutive tensors are packed into flat byte buffers of at most ``bucket_bytes``,
   one broadcast per buffer: fewer, larger collectives. The layout is
   :func:`.weight_layout.flat_buckets` — a link to DynaMO-RL's ``dynamo_rl/contracts/
   weight_layout.py``, the very file the trainer packs with.

vLLM's shared ``update_weights`` ends with ``torch.accelerator.synchronize()``, which raises on a
CPU build; gloo's ``wait()`` returns only once the data is in place, so this backend overrides
``update_weights`` without that call. Weights load through vLLM's layerwise reload (as its
``nccl`` backend does), followed by the embedding re-pack that reload misses on CPU for tied
embeddings (:mod:`._tied`).
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from datetime import timedelta
from typing import Any

import torch
import torch.distributed as dist
from vllm.distributed.weight_transfer.base import (
    WeightTransferEngine,
    WeightTransferInitInfo,
    WeightTransferUpdateInfo,
)

from dynamo_rl_vllm_plugin._tied import refresh_embedding_kernels
from dynamo_rl_vllm_plugin.weight_layout import GLOO_STORE_PREFIX, flat_buckets

__all__ = ["GlooInitInfo", "GlooUpdateInfo", "GlooWeightTransferEngine"]


@dataclass(kw_only=True)
class GlooInitInfo(WeightTransferInitInfo):
    """``init_info`` of ``POST /init_weight_transfer_engine`` for this backend."""

    master_address: str
    master_port: int
    world_size: int
    rank_offset: int = 1
    bucket_bytes: int = 0
    timeout_s: float = 300.0

    def __post_init__(self) -> None:
        if self.world_size < 2 or self.rank_offset < 1:
            raise ValueError("gloo weight transfer needs world_size >= 2 and rank_offset >= 1")
        if self.bucket_bytes < 0 or self.timeout_s <= 0:
            raise ValueError("bucket_bytes must be >= 0 and timeout_s > 0")


@dataclass
class GlooUpdateInfo(WeightTransferUpdateInfo):
    """``update_info`` of ``POST /update_weights``: the tensors, in broadcast order."""

    names: list[str]
    dtype_names: list[str]
    shapes: list[list[int]]

    def __post_init__(self) -> None:
        if not len(self.names) == len(self.dtype_names) == len(self.shapes):
            raise ValueError(
                f"names, dtype_names and shapes must have one entry per tensor: got "
                f"{len(self.names)}, {len(self.dtype_names)}, {len(self.shapes)}"
            )


def _nbytes(dtype: torch.dtype, shape: list[int]) -> int:
    n = torch.empty((), dtype=dtype).element_size()
    for d in shape:
        n *= int(d)
    return n


class GlooWeightTransferEngine(WeightTransferEngine[GlooInitInfo, GlooUpdateInfo]):
    """Receives broadcast weights from the trainer over gloo and loads them layerwise."""

    init_info_cls = GlooInitInfo
    update_info_cls = GlooUpdateInfo

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.group: dist.ProcessGroupGloo | None = None
        self.store: dist.TCPStore | None = None
        self.bucket_bytes = 0

    def init_transfer_engine(self, init_info: GlooInitInfo) -> None:
        pc = self.parallel_config
        rank = init_info.rank_offset + pc.data_parallel_index * pc.world_size + pc.rank
        timeout = timedelta(seconds=init_info.timeout_s)
        self.store = dist.TCPStore(
            init_info.master_address,
            init_info.master_port,
            init_info.world_size,
            is_master=False,
            timeout=timeout,
        )
        store = dist.PrefixStore(GLOO_STORE_PREFIX, self.store)
        options = dist.ProcessGroupGloo._Options()
        options._timeout = timeout
        # GLOO_SOCKET_IFNAME picks the interface the trainer can reach, as in torch.distributed.
        iface = os.environ.get("GLOO_SOCKET_IFNAME")
        device = (
            dist.ProcessGroupGloo.create_device(interface=iface)
            if iface
            else dist.ProcessGroupGloo.create_default_device()
        )
        options._devices = [device]
        self.group = dist.ProcessGroupGloo(store, rank, init_info.world_size, options)
        self.bucket_bytes = init_info.bucket_bytes

    def start_weight_update(self) -> None:
        from vllm.model_executor.model_loader.reload import initialize_layerwise_reload

        initialize_layerwise_reload(self.model)

    def finish_weight_update(self) -> None:
        from vllm.model_executor.model_loader.reload import finalize_layerwise_reload

        finalize_layerwise_reload(self.model, self.model_config)
        refresh_embedding_kernels(self.model)

    def update_weights(self, update_info: dict[str, Any]) -> None:
        # The base class would end with torch.accelerator.synchronize(), which raises on CPU;
        # gloo's wait() already returned with the data in place.
        self.receive_weights(self.parse_update_info(update_info))

    def _broadcast(self, tensor: torch.Tensor) -> None:
        assert self.group is not None
        opts = dist.BroadcastOptions()
        opts.rootRank = 0
        self.group.broadcast([tensor], opts).wait()

    def receive_weights(self, update_info: GlooUpdateInfo) -> None:
        if self.group is None:
            raise RuntimeError("gloo weight transfer not initialised: call init first")
        from vllm.model_executor.model_loader.mtp_validation import (
            disable_mtp_completeness_check,
        )

        dtypes = [getattr(torch, name) for name in update_info.dtype_names]
        shapes = [list(map(int, s)) for s in update_info.shapes]
        with disable_mtp_completeness_check():
            if self.bucket_bytes == 0:
                for name, dtype, shape in zip(update_info.names, dtypes, shapes, strict=True):
                    weight = torch.empty(shape, dtype=dtype)
                    self._broadcast(weight)
                    self.model.load_weights([(name, weight)])
                return
            sizes = [_nbytes(d, s) for d, s in zip(dtypes, shapes, strict=True)]
            for bucket in flat_buckets(sizes, self.bucket_bytes):
                flat = torch.empty(bucket.size, dtype=torch.uint8)
                self._broadcast(flat)
                pairs = []
                for k, i in enumerate(range(bucket.first, bucket.end)):
                    at = bucket.offsets[k]
                    view = flat[at : at + sizes[i]].view(dtypes[i]).view(shapes[i])
                    pairs.append((update_info.names[i], view))
                self.model.load_weights(pairs)

    def shutdown(self) -> None:
        # Dropping the references closes gloo's sockets; there is no destroy() to call on a
        # group made outside torch.distributed's global state.
        self.group = None
        self.store = None
