"""Weight push from the learner to the inference engines: the torch side of the engine-control
contract (:mod:`dynamo_rl.contracts.weight_control`, whose protocol object — SGLang- or vLLM-shaped,
``rollout.weight_api`` — builds every HTTP call sent here).

Two transports behind one small interface (:class:`WeightTransport`):

- :class:`DistributedPush` — rank 0 keeps **one two-rank group per engine** (a ``TCPStore`` on a
  free port, a standalone gloo — NCCL on CUDA — group; the protocol's ``init_group`` call, the
  engine is rank 1), so an engine that dies or hangs fails alone. Per push, rank 0:

  1. probes every engine (the protocol's version read, waiting up to ``learner.push.silent_s``,
     or ``learner.push.stopped_s`` when the engine's pulse in Redis stands still): an engine that
     does not answer is left out of this push; one whose version is not the one this link last
     gave it was restarted (or updated by someone else) and gets a new group;
  2. forms the missing groups (concurrently; an engine whose ``init_group`` call fails is left
     out without waiting for the group's timeout), then sends each engine the ``before_update``
     calls (vLLM: pause, start) and starts its ``update`` call (names, dtypes, shapes);
  3. meanwhile all learner ranks gather full parameters part by part
     (:func:`learner.gather.gather_bucket`, a collective) and rank 0 broadcasts each part to every engine's group without waiting
     (the next part is gathered while this one travels). A part is one tensor per broadcast
     (SGLang's contract), or — with the vLLM-shaped protocol over gloo, whose receivers are ours
     (the embedded engine, the vLLM plugin) — a flat bucket of several tensors
     (:mod:`dynamo_rl.contracts.weight_layout`, ``push.bucket_mb``);
  4. waits on each engine's broadcasts under a watchdog: a broadcast error (a dead peer closes
     its socket), the engine's ``update`` call failing (connection refused or reset), the engine
     no longer answering ``GET /health`` (:class:`~learner.engine_links.Heartbeat`, from step 1
     to the end: for ``learner.push.stopped_s`` with its pulse in Redis standing still — a
     stopped process, a hung host — or for ``learner.push.silent_s`` whatever its pulse), or the
     push's deadline (``push.timeout_s``) drops that engine from the push, its transfer
     abandoned, while the others go on;
  5. finishes each engine on its own thread (its ``update`` answer, then ``after_update``: vLLM's
     finish with the version, reset the prefix cache, resume). A failed engine gets ``recover``
     (vLLM: resume, so no engine stays paused) and loses its group.

  The push succeeds when at least one engine took the new version; the engines left out catch up
  at the next push (a new group, the full weights) — :attr:`PushResult.failed` names them.
- :class:`DiskPush` — the fallback: a Hugging Face export that engines load from disk.
- :class:`learner.adapter_push.AdapterPush` — a LoRA policy's: the adapters alone, as a peft
  folder each engine loads under a versioned name.

This module holds the push's timeline; rank 0's groups and HTTP calls per engine (steps 1, 2, 4
and 5) are :class:`learner.engine_links.EngineLinks`, the gather is :mod:`learner.gather`.

Engines come from the Redis registry ``engines_key(ns)`` (each engine registers itself) or from
``endpoints.engine_urls``. After a successful push rank 0 sets ``weight_version_key(ns)``.
"""

from __future__ import annotations

import functools
import logging
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any, Protocol

import torch
import torch.distributed as dist
from torch import nn

from dynamo_rl.config.learner import PushConfig
from dynamo_rl.contracts.engine import list_engines
from dynamo_rl.contracts.weight_control import (
    Call,
    SGLangWeights,
    WeightControlError,
    WeightProtocol,
    read_version,
    send,
)
from dynamo_rl.contracts.weight_layout import Bucket, flat_buckets
from learner.engine_links import (
    PROBE_TIMEOUT_S,
    EngineFailed,
    EngineLinks,
    Job,
    Link,
    describe,
    release_when_done,
    wait_works,
)
from learner.gather import gather_bucket
from learner.model import policy_parameters

log = logging.getLogger(__name__)


@dataclass
class PushResult:
    ok: bool
    engines: int
    bytes: int
    seconds: float
    error: str = ""
    gather_seconds: float = 0.0  # all-gathering FSDP shards into full tensors (every rank)
    send_seconds: float = 0.0  # rank 0: packing and waiting on the broadcasts to the engines
    answer_seconds: float = 0.0  # after the last broadcast, until every engine answered
    paused_seconds: float = 0.0  # rank 0: first before_update call .. last after_update answer
    failed: tuple[str, ...] = ()  # engines left out of this push (they catch up at the next)

    @property
    def gb_per_s(self) -> float:
        return self.bytes / self.seconds / 1e9 if self.seconds > 0 else 0.0


class WeightTransport(Protocol):
    """Collective on every learner rank; engine URLs are only looked at on rank 0."""

    name: str
    protocol: WeightProtocol
    headers: dict[str, str]

    def push(self, model: nn.Module, version: int, engines: Sequence[str]) -> PushResult: ...

    def served_version(self, url: str) -> int:
        """The version the engine at ``url`` serves now (WeightControlError when it does not
        answer)."""
        ...

    def close(self) -> None: ...


def served_weight_version(transport: WeightTransport, url: str) -> int:
    """An engine's weight version read through the transport's protocol (the full-weight
    transports' :meth:`WeightTransport.served_version`)."""
    return read_version(transport.protocol, url, headers=transport.headers,
                        timeout_s=PROBE_TIMEOUT_S)  # fmt: skip


SILENT_S_DEFAULT: float = PushConfig.model_fields["silent_s"].default
"""``learner.push.silent_s``'s default, for a push built outside a config (tests, benchmarks)."""


def _dtype_name(dtype: torch.dtype) -> str:
    return str(dtype).removeprefix("torch.")


class DistributedPush:
    """Broadcast over one torch.distributed group per engine (rank 0 is the root)."""

    name = "distributed"

    def __init__(
        self,
        *,
        master_address: str,
        bucket_mb: float,
        timeout_s: float,
        headers: dict[str, str] | None = None,
        device: torch.device | None = None,
        group_prefix: str = "dynamo-push",
        protocol: WeightProtocol | None = None,
        silent_s: float = SILENT_S_DEFAULT,
        stopped_s: float | None = None,
        pulse: Callable[[str], int | None] | None = None,
    ) -> None:
        self.master_address = master_address
        self.bucket_bytes = int(bucket_mb * 2**20)
        self.timeout_s = timeout_s
        self.protocol = protocol or SGLangWeights()
        self.headers = headers or {}
        self.device = device or torch.device("cpu")
        self.backend = "nccl" if self.device.type == "cuda" else "gloo"
        self.group_prefix = group_prefix
        # Flat buckets where the receiving side is ours (vLLM-shaped over gloo); else per tensor.
        self.flat_bytes = self.bucket_bytes if self.protocol.packs(self.backend) else 0
        self.engines = EngineLinks(
            protocol=self.protocol, headers=self.headers, master_address=master_address,
            timeout_s=timeout_s, backend=self.backend, flat_bytes=self.flat_bytes,
            group_prefix=group_prefix, silent_s=silent_s, stopped_s=stopped_s, pulse=pulse,
        )  # fmt: skip

    def _parts(self, params: list[tuple[str, nn.Parameter]]) -> list[Bucket]:
        """The gather buckets: flat buckets of ``push.bucket_mb``. With a per-tensor receiver
        each tensor of a bucket is then broadcast on its own (a view into the bucket)."""
        sizes = [p.numel() * p.element_size() for _, p in params]
        return flat_buckets(sizes, self.bucket_bytes)

    def _payload(
        self, flat: torch.Tensor, bucket: Bucket, params: list[tuple[str, nn.Parameter]]
    ) -> list[torch.Tensor]:
        if self.flat_bytes:
            return [flat]
        out = []
        for k, at in enumerate(bucket.offsets):
            p = params[bucket.first + k][1]
            n = p.numel() * p.element_size()
            out.append(flat[at : at + n].view(p.dtype).view(p.shape))
        return out

    # ---- the push (collective on every learner rank) ----

    def push(self, model: nn.Module, version: int, engines: Sequence[str]) -> PushResult:
        is_main = dist.get_rank() == 0
        t0 = time.perf_counter()
        deadline = time.monotonic() + self.timeout_s
        params = list(policy_parameters(model))
        failed: dict[str, str] = {}
        live: list[Link] = []
        updates: dict[str, Job] = {}
        self.engines.paused = set()
        error = ""
        t_pause = time.perf_counter()
        if is_main:
            try:
                if not engines:
                    raise RuntimeError("no engines to push to")
                live = self.engines.prepare(list(engines), failed)
                t_pause = time.perf_counter()  # engines are paused from here on (vLLM-shaped)
                for link in live:
                    call = self.protocol.update(
                        names=[n for n, _ in params],
                        dtypes=[_dtype_name(p.dtype) for _, p in params],
                        shapes=[list(p.shape) for _, p in params],
                        group_name=link.name,
                        weight_version=version,
                    )
                    updates[link.url] = self.engines.start(link.url, [call])
                if not live:
                    raise RuntimeError("no engine took part: " + describe(failed))
            except Exception as e:
                error = str(e)
                silent = self.engines.end_push()
                self.engines.recover(sorted(self.engines.paused), silent)
        # Every rank must join every gather, whatever rank 0's engines do.
        go = torch.tensor([0 if error else 1])
        if dist.get_world_size() > 1:
            dist.broadcast(go, 0)
        if not go.item():
            return PushResult(False, len(engines), 0, time.perf_counter() - t0, error,
                              failed=tuple(failed))  # fmt: skip
        nbytes = 0
        t_gather = t_send = 0.0
        pending: dict[str, list[Any]] = {}

        def settle() -> None:
            for link in live:
                works = pending.pop(link.url, None)
                if works is None or link.url in failed:
                    continue
                try:
                    wait_works(works, updates[link.url], deadline, self.engines.beats.get(link.url))
                except EngineFailed as e:
                    failed[link.url] = str(e)
                    log.warning("engine %s left out of push %d: %s", link.url, version, e)
                    self.engines.forget(link.url)
                    release_when_done(link, works)

        tensors = [p for _, p in params]
        for bucket in self._parts(params):
            t1 = time.perf_counter()
            flat = gather_bucket(tensors, bucket, self.device)
            t2 = time.perf_counter()
            t_gather += t2 - t1
            if is_main:
                assert flat is not None
                payload = self._payload(flat, bucket, params)
                nbytes += sum(t.numel() * t.element_size() for t in payload)
                issued: dict[str, list[Any]] = {}
                for link in live:
                    if link.url in failed:
                        continue
                    try:
                        issued[link.url] = [link.group.broadcast(t, 0) for t in payload]
                    except RuntimeError as e:
                        failed[link.url] = f"broadcast failed: {e}"
                        self.engines.forget(link.url)
                settle()  # the previous part, sent while this one was gathered
                pending = issued
            t_send += time.perf_counter() - t2
            del flat
        t3 = time.perf_counter()
        if is_main:
            settle()
            t_send += time.perf_counter() - t3
        t_answer = time.perf_counter()
        if is_main:
            done = [link for link in live if link.url not in failed]
            self.engines.finish(done, updates, version, deadline, failed)
            silent = self.engines.end_push()
            self.engines.recover([u for u in failed if u in self.engines.paused], silent)
            if len(failed) == len(engines):
                error = "no engine took the new weights: " + describe(failed)
            elif failed:
                error = "left out (they catch up at the next push): " + describe(failed)
        t_paused = time.perf_counter() - t_pause
        t_answer = time.perf_counter() - t_answer
        ok = torch.tensor([0 if len(failed) == len(engines) else 1])
        if dist.get_world_size() > 1:
            dist.broadcast(ok, 0)
        return PushResult(
            bool(ok.item()), len(engines), nbytes, time.perf_counter() - t0, error,
            gather_seconds=t_gather, send_seconds=t_send, answer_seconds=t_answer,
            paused_seconds=t_paused if is_main else 0.0, failed=tuple(failed),
        )  # fmt: skip

    def served_version(self, url: str) -> int:
        return served_weight_version(self, url)

    def close(self) -> None:
        self.engines.close()


class DiskPush:
    """Export the policy in HF format and ask each engine to load it (the fallback)."""

    name = "disk"

    def __init__(
        self,
        export: Callable[[int], str | None],
        *,
        timeout_s: float,
        headers: dict[str, str] | None = None,
        protocol: WeightProtocol | None = None,
    ) -> None:
        self.export = export  # collective: writes the export on rank 0, returns its path there
        self.protocol = protocol or SGLangWeights()
        self.headers = headers or {}
        self.timeout_s = timeout_s

    def push(self, model: nn.Module, version: int, engines: Sequence[str]) -> PushResult:
        t0 = time.perf_counter()
        path = self.export(version)
        error = ""
        if dist.get_rank() == 0:
            if not engines:
                error = "no engines to push to"
            else:
                try:
                    call = self.protocol.update_from_disk(str(path), version)
                except WeightControlError as e:
                    error = str(e)
                else:
                    load = functools.partial(self._send, call=call)
                    error = "; ".join(self._load_everywhere(engines, load).values())
        ok = torch.tensor([0 if error else 1])
        if dist.get_world_size() > 1:
            dist.broadcast(ok, 0)
        return PushResult(bool(ok.item()), len(engines), 0, time.perf_counter() - t0, error)

    def _send(self, url: str, call: Call) -> Any:
        return send(self.protocol, url, call, headers=self.headers, timeout_s=self.timeout_s)

    def _load_everywhere(
        self, engines: Sequence[str], load: Callable[[str], Any]
    ) -> dict[str, str]:
        """``load(url)`` for every engine at once, each on its thread; the engines that failed,
        with errors naming them."""
        loads = {u: Job(functools.partial(load, u)) for u in engines}
        errors = {}
        for u, job in loads.items():
            if not job.wait(self.timeout_s + 5):
                errors[u] = f"{u}: no answer"
            elif job.error:
                errors[u] = job.error if u in job.error else f"{u}: {job.error}"
        return errors

    def served_version(self, url: str) -> int:
        return served_weight_version(self, url)

    def close(self) -> None:
        pass


def discover_engines(redis_client: Any, namespace: str) -> list[str]:
    """Engine base URLs registered in Redis (sorted, so ranks in the group are stable)."""
    return [e.url for e in list_engines(redis_client, namespace)]
