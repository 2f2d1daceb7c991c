"""Both weight-update protocols as the engine implements them, and its LoRA adapter loads.

Every change of the served weights goes through :class:`WeightUpdates`, which applies it in the
scheduler thread as an exclusive task of the batch loop (:meth:`~.batch_loop.BatchGenerator.
run_exclusive`), so no token is sampled from a half-updated model. The tensors arrive through
:mod:`.weights` (the learner's broadcast, or a checkpoint on disk); the request bodies are the
models of :mod:`dynamo_rl.contracts.weight_control`, checked by the engine before they get here.

- **SGLang-shaped**: ``/init_weights_update_group`` joins the learner's group
  (:meth:`WeightUpdates.init_group`), ``/update_weights_from_distributed`` and
  ``/update_weights_from_disk`` receive (or read) the tensors and apply them between batches, or —
  with ``interruptible`` (``rollout.update_mode: interrupt``) — at the running batch's next token
  boundary; the version is the request's, else one more.
- **vLLM-shaped**: :meth:`WeightUpdates.pause` holds the scheduler until :meth:`WeightUpdates.
  resume` (``keep`` at the running batch's next token boundary, ``wait`` once the batch finished,
  ``abort`` after cutting the running batch, whose sequences finish with ``finish_reason``
  ``"abort"``); ``/init_weight_transfer_engine`` joins the group under
  :data:`~dynamo_rl.contracts.weight_control.VLLM_GROUP_NAME`, ``/update_weights`` receives and
  applies the tensors while paused and ``/finish_weight_update`` sets the version.
- **LoRA adapters** (:mod:`.adapters`) are loaded and unloaded between batches, the same way.

Either way a batch that spans an update goes on under the new weights (its cache rebuilt, see
:mod:`.batch_loop`), each token carrying its version.
"""

from __future__ import annotations

import threading
import time
from dataclasses import dataclass, field
from typing import Any

import torch

from dynamo_rl.config.engine import EngineConfig
from dynamo_rl.contracts.engine import EngineRegistry
from dynamo_rl.contracts.weight_control import (
    VLLM_GROUP_NAME,
    InitWeightsUpdateGroupRequest,
    LoadLoraAdapterRequest,
    UnloadLoraAdapterRequest,
    UpdateWeightsFromDiskRequest,
    UpdateWeightsFromDistributedRequest,
    VLLMInitRequest,
    VLLMUpdateRequest,
)
from services.engine.adapters import Adapters
from services.engine.batch_loop import BatchGenerator
from services.engine.metrics import EngineMetrics
from services.engine.weights import (
    WeightUpdateGroup,
    check_fits,
    copy_into,
    load_checkpoint,
    parse_dtype,
)


@dataclass(eq=False)
class WeightUpdates:
    """The weight-update side of one engine: its groups, pause state and update lock."""

    generator: BatchGenerator
    params: dict[str, torch.Tensor]
    adapters: Adapters
    cfg: EngineConfig
    metrics: EngineMetrics
    registry: EngineRegistry | None = None
    interruptible: bool = False
    """Apply SGLang-shaped updates at the running batch's next token boundary
    (``rollout.update_mode: interrupt``), not after the batch."""
    groups: dict[str, WeightUpdateGroup] = field(default_factory=dict, init=False)
    updated: bool = field(default=False, init=False)
    """vLLM's /weight_info says "default" until the first update."""
    updating: bool = field(default=False, init=False)
    """Between /start_weight_update and /finish_weight_update."""
    _update_lock: threading.Lock = field(default_factory=threading.Lock, init=False)
    """One weight update at a time."""
    # vLLM-shaped control: the scheduler is held (paused) inside an exclusive task.
    _pause_lock: threading.Lock = field(default_factory=threading.Lock, init=False)
    _held: threading.Event = field(default_factory=threading.Event, init=False)
    _release: threading.Event | None = field(default=None, init=False)
    _hold_future: Any = field(default=None, init=False)

    def __post_init__(self) -> None:
        self.metrics.weight_version.set(0)

    @property
    def weight_version(self) -> int:
        return self.generator.weight_version

    def close(self) -> None:
        for group in self.groups.values():
            group.close()
        self.groups.clear()

    # ---- applying, in the scheduler thread ----

    def _apply(self, tensors: dict[str, torch.Tensor], version: int | None) -> int:
        """Runs in the scheduler thread, between batches (or while it is held by a pause)."""
        copy_into(self.params, tensors)
        self.generator.weights_epoch += 1
        new = self.generator.weight_version + 1 if version is None else int(version)
        self.generator.weight_version = new
        self.updated = True
        return new

    def _exclusive(self, fn: Any) -> Any:
        # While paused the scheduler thread is blocked in the hold task, so the model is not in
        # use and fn runs here; queueing it behind the hold would deadlock.
        if self.paused:
            return fn()
        return self.generator.run_exclusive(fn, between_tokens=self.interruptible).result()

    def _after_update(self, source: str, t0: float, version: int) -> None:
        self.metrics.weight_updates.labels(source, "ok").inc()
        self.metrics.weight_update_seconds.labels(source).observe(time.perf_counter() - t0)
        self.metrics.weight_version.set(version)
        if self.registry is not None:
            self.registry.register(version)

    # ---- SGLang-shaped ----

    def init_group(
        self,
        req: InitWeightsUpdateGroupRequest,
        bucket_bytes: int = 0,
        timeout_s: float | None = None,
    ) -> None:
        old = self.groups.pop(req.group_name, None)
        if old is not None:
            old.close()
        self.groups[req.group_name] = WeightUpdateGroup(
            req.master_address,
            req.master_port,
            req.rank_offset,
            req.world_size,
            req.group_name,
            req.backend,
            timeout_s or self.cfg.weight_update_timeout_s,
            bucket_bytes,
        )

    def update_from_distributed(self, req: UpdateWeightsFromDistributedRequest) -> int:
        group = self.groups[req.group_name]
        dtypes = [parse_dtype(d) for d in req.dtypes]
        t0 = time.perf_counter()
        with self._update_lock:
            received = group.receive(dtypes, req.shapes)
            mismatch = check_fits(self.params, req.names, req.shapes)
            if mismatch:
                self.metrics.weight_updates.labels("distributed", "error").inc()
                raise ValueError(f"weights not applied: {mismatch.message()}")
            tensors = dict(zip(req.names, received, strict=True))
            version = self._exclusive(lambda: self._apply(tensors, req.weight_version))
        self._after_update("distributed", t0, version)
        return version

    def update_from_disk(self, req: UpdateWeightsFromDiskRequest) -> int:
        t0 = time.perf_counter()
        with self._update_lock:
            tensors = load_checkpoint(req.model_path)
            names = list(tensors)
            mismatch = check_fits(self.params, names, [tuple(t.shape) for t in tensors.values()])
            if mismatch:
                self.metrics.weight_updates.labels("disk", "error").inc()
                raise ValueError(f"weights not applied: {mismatch.message()}")
            version = self._exclusive(lambda: self._apply(tensors, req.weight_version))
        self._after_update("disk", t0, version)
        return version

    # ---- LoRA adapters (services/engine/adapters.py) ----

    def load_adapter(self, req: LoadLoraAdapterRequest) -> int:
        """Read and check the folder, then load it between batches; the engine's version becomes
        the adapter's when it is newer. AdapterRefused when it does not fit."""
        t0 = time.perf_counter()
        with self._update_lock:
            config, tensors = self.adapters.read(req.lora_name, req.lora_path)
            version = self._exclusive(lambda: self.adapters.load(req.lora_name, config, tensors))
            if version > self.generator.weight_version:
                self.generator.weight_version = version
            self.updated = True
        self._after_update("adapter", t0, self.weight_version)
        return version

    def unload_adapter(self, req: UnloadLoraAdapterRequest) -> None:
        """Unload between batches (queued requests naming it were taken before); KeyError when
        it is not loaded."""
        with self._update_lock:
            if req.lora_name not in self.adapters.loaded:
                raise KeyError(req.lora_name)
            self._exclusive(lambda: self.adapters.unload(req.lora_name))

    # ---- vLLM-shaped: pause / resume and the weight transfer ----

    @property
    def paused(self) -> bool:
        return self._held.is_set()

    def pause(self, mode: str) -> None:
        """Hold the scheduler: ``keep`` at the running batch's next token boundary (it goes on
        after :meth:`resume`, its cache rebuilt if the weights changed); ``wait`` at the next
        batch boundary; ``abort`` cuts the running batch first."""
        with self._pause_lock:
            if self._release is not None:
                return
            release = threading.Event()
            self._release = release
            if mode == "abort":
                self.generator.abort.set()

            def hold() -> None:
                self.generator.abort.clear()
                self._held.set()
                release.wait()
                self._held.clear()

            self._hold_future = self.generator.run_exclusive(hold, between_tokens=mode == "keep")
        if not self._held.wait(self.cfg.weight_update_timeout_s):
            self.resume()
            raise RuntimeError("the running batch did not finish within the update timeout")

    def resume(self) -> None:
        with self._pause_lock:
            release, self._release = self._release, None
            future, self._hold_future = self._hold_future, None
        if release is not None:
            held = self._held.is_set()
            release.set()
            # Held: wait for the hold to end, so /is_paused is false once /resume answers. Not
            # yet held (a pause that timed out): the hold ends at once whenever it runs.
            if held and future is not None:
                future.result(timeout=30)

    def vllm_init(self, req: VLLMInitRequest) -> None:
        """Join the learner's group (the engine refused a packed layout before)."""
        info = req.init_info
        self.init_group(
            InitWeightsUpdateGroupRequest(
                master_address=info.master_address,
                master_port=info.master_port,
                rank_offset=info.rank_offset,
                world_size=info.world_size,
                group_name=VLLM_GROUP_NAME,
                backend="nccl" if self.cfg.device == "cuda" else "gloo",
            ),
            bucket_bytes=info.bucket_bytes or 0,
            timeout_s=info.timeout_s,
        )

    def vllm_update(self, req: VLLMUpdateRequest) -> int:
        info = req.update_info
        # Versions come with /finish_weight_update; keep the current one until then.
        return self.update_from_distributed(
            UpdateWeightsFromDistributedRequest(
                names=info.names,
                dtypes=info.dtype_names,
                shapes=info.shapes,
                group_name=VLLM_GROUP_NAME,
                weight_version=self.weight_version,
            )
        )

    def vllm_finish(self, version: int) -> None:
        self.generator.weight_version = version
        self.updated = True
        self.updating = False
        self.metrics.weight_version.set(version)
        if self.registry is not None:
            self.registry.register(version)
