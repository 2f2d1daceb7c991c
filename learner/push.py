"""Weight push from the learner to the inference engines: the torch side of the engine-control
contract (:mod:`dynamo_rl.contracts.weight_control`, whose protocol object — SGLang- or vLLM-shaped,
``rollout.weight_api`` — builds every HTTP call sent here).

Two transports behind one small interface (:class:`WeightTransport`):

- :class:`DistributedPush` — rank 0 keeps **one two-rank group per engine** (a ``TCPStore`` on a
  free port, a standalone gloo — NCCL on CUDA — group; the protocol's ``init_group`` call, the
  engine is rank 1), so an engine that dies or hangs fails alone. Per push, rank 0:

  1. probes every engine (the protocol's version read, :data:`PROBE_TIMEOUT_S`): an engine that
     does not answer is left out of this push at once; one whose version is not the one this
     link last gave it was restarted (or updated by someone else) and gets a new group;
  2. forms the missing groups (concurrently; an engine whose ``init_group`` call fails is left
     out without waiting for the group's timeout), then sends each engine the ``before_update``
     calls (vLLM: pause, start) and starts its ``update`` call (names, dtypes, shapes);
  3. meanwhile all learner ranks gather full parameters part by part (``DTensor.full_tensor``,
     a collective) and rank 0 broadcasts each part to every engine's group without waiting
     (the next part is gathered while this one travels). A part is one tensor per broadcast
     (SGLang's contract), or — with the vLLM-shaped protocol over gloo, whose receivers are ours
     (the embedded engine, the vLLM plugin) — a flat bucket of several tensors
     (:mod:`dynamo_rl.contracts.weight_layout`, ``push.bucket_mb``);
  4. waits on each engine's broadcasts under a watchdog: a broadcast error (a dead peer closes
     its socket), the engine's ``update`` call failing (connection refused or reset), or the
     push's deadline (``push.timeout_s``) drops that engine from the push, its transfer
     abandoned, while the others go on;
  5. finishes each engine on its own thread (its ``update`` answer, then ``after_update``: vLLM's
     finish with the version, reset the prefix cache, resume). A failed engine gets ``recover``
     (vLLM: resume, so no engine stays paused) and loses its group.

  The push succeeds when at least one engine took the new version; the engines left out catch up
  at the next push (a new group, the full weights) — :attr:`PushResult.failed` names them.
- :class:`DiskPush` — the fallback: a Hugging Face export that engines load from disk.

Engines come from the Redis registry ``engines_key(ns)`` (each engine registers itself) or from
``endpoints.engine_urls``. After a successful push rank 0 sets ``weight_version_key(ns)``.
"""

from __future__ import annotations

import contextlib
import datetime
import functools
import logging
import threading
import time
import uuid
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any, Protocol

import torch
import torch.distributed as dist
from torch import nn

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
from dynamo_rl.procs import free_port
from learner.model import policy_parameters

log = logging.getLogger(__name__)

PROBE_TIMEOUT_S = 10.0
"""Deadline of the version read that opens a push (a dead engine refuses it at once)."""
WATCH_S = 0.25
"""How often a wait on an engine's broadcasts looks at that engine's HTTP call."""


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

    def close(self) -> None: ...


def _dtype_name(dtype: torch.dtype) -> str:
    return str(dtype).removeprefix("torch.")


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


class _Async:
    """One function on a thread of its own: its result or its error, waited on with a timeout."""

    def __init__(self, fn: Callable[[], Any]) -> None:
        self.result: Any = None
        self.error = ""
        self._done = threading.Event()
        threading.Thread(target=self._run, args=(fn,), daemon=True).start()

    def _run(self, fn: Callable[[], Any]) -> None:
        try:
            self.result = fn()
        except WeightControlError as e:  # names the engine and the route already
            self.error = str(e)
        except Exception as e:
            self.error = f"{type(e).__name__}: {e}"
        finally:
            self._done.set()

    def wait(self, timeout: float) -> bool:
        return self._done.wait(max(0.0, timeout))

    @property
    def done(self) -> bool:
        return self._done.is_set()


@dataclass
class _Link:
    """Rank 0's push group with one engine (the learner is rank 0, the engine rank 1)."""

    url: str
    name: str
    group: Any
    store: Any
    version: int | None = None  # what the engine reported after this link's last push


class _EngineFailed(Exception):
    pass


def _wait_works(works: list[Any], watch: _Async | None, deadline: float) -> None:
    """Wait on one engine's broadcasts; :class:`_EngineFailed` as soon as one fails, the engine's
    ``update`` call has failed, or the deadline passed."""
    for work in works:
        while True:
            try:
                work.wait(datetime.timedelta(seconds=WATCH_S))
                break
            except RuntimeError as e:
                if "timed out" not in str(e).lower():
                    raise _EngineFailed(f"broadcast failed: {e}") from None
            if watch is not None and watch.done and watch.error:
                raise _EngineFailed(watch.error)
            if time.monotonic() > deadline:
                raise _EngineFailed("broadcast not received within learner.push.timeout_s")


def _release_when_done(link: _Link, works: list[Any]) -> None:
    """Keep an abandoned group alive until its broadcasts end (a dead peer fails them at once, a
    hung one at the group's timeout): destroying a gloo group joins its worker threads, which
    would block the caller."""

    def wait() -> None:
        for work in works:
            with contextlib.suppress(Exception):
                work.wait()
        with contextlib.suppress(Exception):
            link.group.shutdown()

    threading.Thread(target=wait, daemon=True, name=f"release-{link.name}").start()


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
    ) -> None:
        self.master_address = master_address
        self.bucket_bytes = int(bucket_mb * 2**20)
        self.timeout_s = timeout_s
        self.protocol = protocol or SGLangWeights()
        self.headers = headers or {}
        self.device = device or torch.device("cpu")
        self.backend = "nccl" if self.device.type == "cuda" else "gloo"
        self.group_prefix = group_prefix
        self.links: dict[str, _Link] = {}
        self._paused: set[str] = set()  # engines sent before_update in the current push
        # Flat buckets where the receiving side is ours (vLLM-shaped over gloo); else per tensor.
        self.flat_bytes = self.bucket_bytes if self.protocol.packs(self.backend) else 0

    # ---- rank 0: engines in and out ----

    def _send(self, url: str, calls: Sequence[Call], timeout_s: float | None = None) -> None:
        for call in calls:
            send(self.protocol, url, call, headers=self.headers,
                 timeout_s=self.timeout_s if timeout_s is None else timeout_s)  # fmt: skip

    def _drop(self, url: str) -> None:
        """Forget an idle link (no broadcast in flight: those go through _release_when_done)."""
        link = self.links.pop(url, None)
        if link is not None and link.group is not None:
            with contextlib.suppress(Exception):
                link.group.shutdown()

    def _form(self, url: str) -> tuple[_Link | None, _Async, _Async]:
        """Start forming a group with ``url``: (its link once formed, the init call, the
        group's construction)."""
        port = free_port()
        name = self.protocol.group_name or f"{self.group_prefix}-{uuid.uuid4().hex[:12]}"
        timeout = datetime.timedelta(seconds=self.timeout_s)
        store = dist.TCPStore(
            "0.0.0.0", port, 2, is_master=True, timeout=timeout, wait_for_workers=False
        )
        call = self.protocol.init_group(
            master_address=self.master_address, master_port=port, rank_offset=1, world_size=2,
            group_name=name, backend=self.backend, bucket_bytes=self.flat_bytes,
            timeout_s=self.timeout_s,
        )  # fmt: skip
        init = _Async(functools.partial(self._send, url, [call]))

        def build() -> Any:
            prefixed = dist.PrefixStore(name, store)
            if self.backend == "nccl":
                return dist.ProcessGroupNCCL(prefixed, 0, 2)
            return dist.ProcessGroupGloo(prefixed, 0, 2, timeout)

        group = _Async(build)
        return _Link(url, name, None, store), init, group

    def _prepare(self, engines: Sequence[str], failed: dict[str, str]) -> list[_Link]:
        """Probe, (re)form groups, pause: the links that take part in this push."""
        for url in [u for u in self.links if u not in engines]:
            self._drop(url)
        probe_s = min(PROBE_TIMEOUT_S, self.timeout_s)
        probes = {
            u: _Async(functools.partial(read_version, self.protocol, u, headers=self.headers,
                                        timeout_s=probe_s))
            for u in engines
        }  # fmt: skip
        for url, probe in probes.items():
            probe.wait(probe_s + 5)
            link = self.links.get(url)
            if not probe.done or probe.error:
                failed[url] = f"unreachable: {probe.error or 'no answer'}"
                self._drop(url)
            elif link is not None and probe.result != link.version:
                log.warning("engine %s reports version %s, not %s: it restarted; new push group",
                            url, probe.result, link.version)  # fmt: skip
                self._drop(url)
        forming = {u: self._form(u) for u in engines if u not in failed and u not in self.links}
        deadline = time.monotonic() + self.timeout_s
        while forming:
            for url, (link, init, group) in list(forming.items()):
                if group.done and not group.error:
                    if init.wait(deadline - time.monotonic()) and not init.error:
                        link.group = group.result
                        self.links[url] = link
                        log.info("push group %s formed with %s", link.name, url)
                    else:
                        failed[url] = f"init_group: {init.error or 'no answer'}"
                        _release_when_done(_Link(url, link.name, group.result, link.store), [])
                elif group.error or (init.done and init.error) or time.monotonic() > deadline:
                    # The group's construction, if still waiting for the engine, ends at its
                    # own timeout on its thread; this push does not wait for it.
                    failed[url] = f"init_group: {init.error or group.error or 'timed out'}"
                else:
                    continue
                del forming[url]
            if forming:
                time.sleep(0.05)
        live = [self.links[u] for u in engines if u in self.links and u not in failed]
        self._paused = {link.url for link in live}
        pausing = {
            link.url: _Async(functools.partial(self._send, link.url, self.protocol.before_update()))
            for link in live
        }
        for url, job in pausing.items():
            if not job.wait(self.timeout_s + 5) or job.error:
                failed[url] = job.error or "before_update: no answer"
                self._drop(url)
        return [link for link in live if link.url not in failed]

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
        live: list[_Link] = []
        updates: dict[str, _Async] = {}
        self._paused = set()
        error = ""
        t_pause = time.perf_counter()
        if is_main:
            try:
                if not engines:
                    raise RuntimeError("no engines to push to")
                live = self._prepare(list(engines), failed)
                t_pause = time.perf_counter()  # engines are paused from here on (vLLM-shaped)
                for link in live:
                    call = self.protocol.update(
                        names=[n for n, _ in params],
                        dtypes=[_dtype_name(p.dtype) for _, p in params],
                        shapes=[list(p.shape) for _, p in params],
                        group_name=link.name,
                        weight_version=version,
                    )
                    updates[link.url] = _Async(functools.partial(self._send, link.url, [call]))
                if not live:
                    raise RuntimeError("no engine took part: " + _describe(failed))
            except Exception as e:
                error = str(e)
                self._recover(sorted(self._paused))
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
                    _wait_works(works, updates[link.url], deadline)
                except _EngineFailed as e:
                    failed[link.url] = str(e)
                    log.warning("engine %s left out of push %d: %s", link.url, version, e)
                    self.links.pop(link.url, None)
                    _release_when_done(link, works)

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
                        self.links.pop(link.url, None)
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

            def finish(link: _Link) -> int:
                update = updates[link.url]
                if not update.wait(deadline - time.monotonic()):
                    raise WeightControlError(f"{link.url}: no answer to the update call")
                if update.error:
                    raise WeightControlError(update.error)
                self._send(link.url, self.protocol.after_update(version))
                return version

            finishing = {link.url: _Async(functools.partial(finish, link)) for link in done}
            for link in done:
                job = finishing[link.url]
                if job.wait(deadline - time.monotonic() + 5) and not job.error:
                    link.version = version
                else:
                    failed[link.url] = job.error or "no answer before learner.push.timeout_s"
                    self._drop(link.url)
            self._recover([u for u in failed if u in self._paused])
            if len(failed) == len(engines):
                error = "no engine took the new weights: " + _describe(failed)
            elif failed:
                error = "left out (they catch up at the next push): " + _describe(failed)
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

    def _recover(self, engines: Sequence[str]) -> None:
        """Best effort after a failed push: no engine may stay paused (a dead one refuses at
        once; a short deadline for the rest)."""
        calls = self.protocol.recover()
        if not engines or not calls:
            return
        jobs = [
            _Async(functools.partial(self._send, u, calls, min(PROBE_TIMEOUT_S, self.timeout_s)))
            for u in engines
        ]
        errors = [
            j.error or "no answer" for j in jobs if not j.wait(PROBE_TIMEOUT_S + 5) or j.error
        ]
        if errors:
            log.warning("recovering engines after a failed push: %s", "; ".join(errors))

    def close(self) -> None:
        for url in list(self.links):
            self._drop(url)


def _describe(failed: dict[str, str]) -> str:
    return "; ".join(f"{u}: {e}" for u, e in failed.items()) or "no engines"


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
                    error = "; ".join(self._load_everywhere(engines, call))
        ok = torch.tensor([0 if error else 1])
        if dist.get_world_size() > 1:
            dist.broadcast(ok, 0)
        return PushResult(bool(ok.item()), len(engines), 0, time.perf_counter() - t0, error)

    def _load_everywhere(self, engines: Sequence[str], call: Call) -> list[str]:
        """The load call to every engine at once; the errors, each naming its engine."""
        loads = {
            u: _Async(functools.partial(send, self.protocol, u, call, headers=self.headers,
                                        timeout_s=self.timeout_s))
            for u in engines
        }  # fmt: skip
        errors = []
        for u, load in loads.items():
            if not load.wait(self.timeout_s + 5):
                errors.append(f"{u}: no answer")
            elif load.error:
                errors.append(load.error if u in load.error else f"{u}: {load.error}")
        return errors

    def close(self) -> None:
        pass


def discover_engines(redis_client: Any, namespace: str) -> list[str]:
    """Engine base URLs registered in Redis (sorted, so ranks in the group are stable)."""
    return [e.url for e in list_engines(redis_client, namespace)]
