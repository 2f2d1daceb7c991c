"""Weight push from the learner to the inference engines: the torch side of the engine-control
contract (:mod:`dynamo_rl.contracts.engine`, whose protocol object — SGLang- or vLLM-shaped,
``rollout.weight_api`` — builds every HTTP call sent here).

Two transports behind one small interface (:class:`WeightTransport`):

- :class:`DistributedPush` — once per set of engines, rank 0 hosts a ``TCPStore`` on a free port
  and forms a standalone gloo (NCCL on CUDA) group with every engine (the protocol's
  ``init_group`` call; engine i is rank 1 + i). Per push, rank 0 sends each engine the protocol's
  ``before_update`` calls (vLLM: pause, start), then its ``update`` call (names, dtypes, shapes)
  to every engine concurrently, and meanwhile all learner ranks gather full parameters bucket by
  bucket (``DTensor.full_tensor``, a collective) while rank 0 broadcasts each tensor, in the
  order of ``names``, to the engines; then the ``after_update`` calls (vLLM: finish with the
  version, reset the prefix cache, resume). A failed push sends ``recover`` (vLLM: resume, so no
  engine stays paused) and drops the group (re-formed at the next push).
- :class:`DiskPush` — the fallback: a Hugging Face export that engines load from disk.

Engines come from the Redis registry ``engines_key(ns)`` (each engine registers itself) or from
``endpoints.engine_urls``. After a successful push rank 0 sets ``weight_version_key(ns)``.
"""

from __future__ import annotations

import contextlib
import datetime
import logging
import threading
import time
import uuid
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from typing import Any, Protocol

import torch
import torch.distributed as dist
from torch import nn

from dynamo_rl.contracts.engine import (
    Call,
    SGLangWeights,
    WeightControlError,
    WeightProtocol,
    list_engines,
    send,
)
from dynamo_rl.procs import free_port
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
    send_seconds: float = 0.0  # rank 0's broadcasts to the engines
    answer_seconds: float = 0.0  # after the last broadcast, until every engine answered

    @property
    def gb_per_s(self) -> float:
        return self.bytes / self.seconds / 1e9 if self.seconds > 0 else 0.0


class WeightTransport(Protocol):
    """Collective on every learner rank; engine URLs are only looked at on rank 0."""

    name: str

    def push(self, model: nn.Module, version: int, engines: Sequence[str]) -> PushResult: ...

    def close(self) -> None: ...


def _dtype_name(dtype: torch.dtype) -> str:
    return str(dtype).removeprefix("torch.")


def _full(param: torch.Tensor) -> torch.Tensor:
    """A parameter's full value (all-gathers an FSDP2 DTensor shard; a collective)."""
    full = param.full_tensor() if hasattr(param, "full_tensor") else param
    return full.detach()


def _buckets(
    params: list[tuple[str, nn.Parameter]], bucket_bytes: int
) -> Iterator[list[tuple[str, nn.Parameter]]]:
    bucket: list[tuple[str, nn.Parameter]] = []
    size = 0
    for name, p in params:
        nbytes = p.numel() * p.element_size()
        if bucket and size + nbytes > bucket_bytes:
            yield bucket
            bucket, size = [], 0
        bucket.append((name, p))
        size += nbytes
    if bucket:
        yield bucket


class _Posts:
    """Each engine's calls in order, engines concurrently (one thread per engine: each call may
    block while the other side works)."""

    def __init__(self, protocol: WeightProtocol, headers: dict[str, str], timeout_s: float) -> None:
        self.protocol = protocol
        self.headers = headers
        self.timeout_s = timeout_s

    def start(self, urls: Sequence[str], calls: Callable[[int], list[Call]]) -> Callable:
        results: list[Any] = [None] * len(urls)

        def post(i: int, url: str) -> None:
            try:
                for call in calls(i):
                    send(self.protocol, url, call, headers=self.headers, timeout_s=self.timeout_s)
            except WeightControlError as e:  # reported to the caller, which decides what fails
                results[i] = str(e)
            except Exception as e:
                results[i] = f"{url}: {type(e).__name__}: {e}"

        threads = [
            threading.Thread(target=post, args=(i, u), daemon=True) for i, u in enumerate(urls)
        ]
        for t in threads:
            t.start()

        def join() -> list[str]:
            for t in threads:
                t.join(self.timeout_s + 5)
            return [r for r in results if r is not None] + [
                f"{urls[i]}: no answer" for i, t in enumerate(threads) if t.is_alive()
            ]

        return join

    def run(self, urls: Sequence[str], calls: Callable[[int], list[Call]]) -> list[str]:
        """Send and wait; the errors."""
        return self.start(urls, calls)()


class DistributedPush:
    """Broadcast over a torch.distributed group formed with the engines (rank 0 is the root)."""

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
        self.posts = _Posts(self.protocol, headers or {}, timeout_s)
        self.device = device or torch.device("cpu")
        self.group_prefix = group_prefix
        self.group: Any = None
        self.group_name = ""
        self.engines: tuple[str, ...] = ()
        self._store: Any = None

    def _form_group(self, engines: Sequence[str]) -> None:
        """Rank 0 only: a new standalone group with exactly these engines."""
        self.close()
        port = free_port()
        world = 1 + len(engines)
        name = self.protocol.group_name or f"{self.group_prefix}-{uuid.uuid4().hex[:12]}"
        backend = "nccl" if self.device.type == "cuda" else "gloo"
        join = self.posts.start(
            engines,
            lambda i: [
                self.protocol.init_group(
                    master_address=self.master_address,
                    master_port=port,
                    rank_offset=1 + i,
                    world_size=world,
                    group_name=name,
                    backend=backend,
                )
            ],
        )
        timeout = datetime.timedelta(seconds=self.timeout_s)
        try:
            store = dist.TCPStore(
                "0.0.0.0", port, world, is_master=True, timeout=timeout, wait_for_workers=False
            )
            prefixed = dist.PrefixStore(name, store)
            if backend == "nccl":
                group = dist.ProcessGroupNCCL(prefixed, 0, world)
            else:
                group = dist.ProcessGroupGloo(prefixed, 0, world, timeout)
        except Exception as e:
            errors = join()
            raise RuntimeError(f"forming the push group failed: {e}; engines: {errors}") from e
        errors = join()
        if errors:
            raise RuntimeError("engines refused the push group: " + "; ".join(errors))
        self._store, self.group, self.group_name = store, group, name
        self.engines = tuple(engines)
        log.info("push group %s formed with %d engine(s) on port %d", name, len(engines), port)

    def push(self, model: nn.Module, version: int, engines: Sequence[str]) -> PushResult:
        is_main = dist.get_rank() == 0
        t0 = time.perf_counter()
        params = list(policy_parameters(model))
        error = ""
        join = None
        if is_main:
            try:
                if not engines:
                    raise RuntimeError("no engines to push to")
                if self.group is None or tuple(engines) != self.engines:
                    self._form_group(engines)
                update = self.protocol.update(
                    names=[n for n, _ in params],
                    dtypes=[_dtype_name(p.dtype) for _, p in params],
                    shapes=[list(p.shape) for _, p in params],
                    group_name=self.group_name,
                    weight_version=version,
                )
                errors = self.posts.run(self.engines, lambda i: self.protocol.before_update())
                if errors:
                    raise RuntimeError("; ".join(errors))
                join = self.posts.start(self.engines, lambda i: [update])
            except Exception as e:
                error = str(e)
                self._recover(engines)
        # Every rank must join every gather, whatever rank 0's engines do.
        failed = torch.tensor([1 if error else 0])
        if dist.get_world_size() > 1:
            dist.broadcast(failed, 0)
        if failed.item():
            return PushResult(False, len(engines), 0, time.perf_counter() - t0, error)
        nbytes = 0
        t_gather = t_send = 0.0
        for bucket in _buckets(params, self.bucket_bytes):
            t1 = time.perf_counter()
            fulls = [_full(p) for _, p in bucket]
            t2 = time.perf_counter()
            t_gather += t2 - t1
            if is_main and not error:
                try:
                    for t in fulls:
                        self.group.broadcast(t.to(self.device).contiguous(), 0).wait()
                        nbytes += t.numel() * t.element_size()
                except Exception as e:
                    error = f"broadcast failed: {e}"
            t_send += time.perf_counter() - t2
            del fulls
        t_answer = time.perf_counter()
        if is_main and error:
            # Tear the group down first: an engine blocked in its receive then fails at once
            # instead of holding its HTTP answer until the timeout. A broken group is never reused.
            self.close()
        if is_main and join is not None:
            errors = join()
            if errors and not error:
                error = "; ".join(errors)
                self.close()
            if not error:
                errors = self.posts.run(self.engines, lambda i: self.protocol.after_update(version))
                error = "; ".join(errors)
            if error:
                self._recover(engines)
        t_answer = time.perf_counter() - t_answer
        ok = torch.tensor([0 if error else 1])
        if dist.get_world_size() > 1:
            dist.broadcast(ok, 0)
        return PushResult(
            bool(ok.item()), len(engines), nbytes, time.perf_counter() - t0, error,
            gather_seconds=t_gather, send_seconds=t_send, answer_seconds=t_answer,
        )  # fmt: skip

    def _recover(self, engines: Sequence[str]) -> None:
        """Best effort after a failed push: no engine may stay paused."""
        if engines and self.protocol.recover():
            errors = self.posts.run(engines, lambda i: self.protocol.recover())
            if errors:
                log.warning("recovering engines after a failed push: %s", "; ".join(errors))

    def close(self) -> None:
        if self.group is not None:
            with contextlib.suppress(Exception):
                self.group.shutdown()
        self.group, self._store, self.engines = None, None, ()


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
        self.posts = _Posts(self.protocol, headers or {}, timeout_s)

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
                    error = "; ".join(self.posts.run(engines, lambda i: [call]))
        ok = torch.tensor([0 if error else 1])
        if dist.get_world_size() > 1:
            dist.broadcast(ok, 0)
        return PushResult(bool(ok.item()), len(engines), 0, time.perf_counter() - t0, error)

    def close(self) -> None:
        pass


def discover_engines(redis_client: Any, namespace: str) -> list[str]:
    """Engine base URLs registered in Redis (sorted, so ranks in the group are stable)."""
    return [e.url for e in list_engines(redis_client, namespace)]
