"""The weight push of a LoRA policy (``learner.lora``): only the adapters move.

Per push (a collective on every learner rank, like the other transports of :mod:`learner.push`):
the ranks gather the adapter tensors alone (the base is frozen and every engine already serves
it) and rank 0 writes them as a peft adapter folder (``<run dir>/push/adapter_v<version>``);
then, on every engine at once, the engine-control contract's ``load_adapter`` call
(:mod:`dynamo_rl.contracts.weight_control`: SGLang's ``/load_lora_adapter``, vLLM's
``/v1/load_lora_adapter``) serves it under the versioned name ``<learner.lora.name>-v<version>``,
which the rollout requests name from then on. Adapters are applied without merging: the base
weights stay shared, and an engine may serve several versions side by side.

The previous version stays loaded for one more push (a request that read it just before this
push still finds it); older versions of this learner's adapters are unloaded, and their folders
deleted. An engine that restarted serves the base alone (adapter version 0): the learner's catch-up
(:meth:`learner.trainer.Trainer.engines_behind`, through :meth:`AdapterPush.served_version`)
pushes the current adapter to it again.
"""

from __future__ import annotations

import functools
import logging
import shutil
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import httpx
import torch
import torch.distributed as dist
from torch import nn

from dynamo_rl.contracts.weight_control import (
    ADAPTERS_CALL,
    Call,
    WeightProtocol,
    adapter_name,
    adapter_version,
    newest_adapter,
    send,
    served_adapters,
)
from learner.engine_links import PROBE_TIMEOUT_S
from learner.push import DiskPush, PushResult

log = logging.getLogger(__name__)

KEEP_VERSIONS = 2  # the new adapter and the one before it stay loaded (and on disk)


class AdapterPush(DiskPush):
    """Write the adapters as a peft folder; have every engine load it under a versioned name (a
    disk push whose folder is the adapters and whose load is the adapter route)."""

    name = "adapter"

    def __init__(
        self,
        export: Callable[[int], str | None],
        *,
        prefix: str,
        protocol: WeightProtocol,
        timeout_s: float,
        headers: dict[str, str] | None = None,
    ) -> None:
        super().__init__(export, timeout_s=timeout_s, headers=headers, protocol=protocol)
        self.prefix = prefix
        self.clients: dict[str, httpx.Client] = {}  # kept open: a new one per call costs ~0.1 s

    def _send(self, url: str, call: Call, timeout_s: float | None = None) -> Any:
        if url not in self.clients:
            self.clients[url] = httpx.Client()
        timeout = self.timeout_s if timeout_s is None else timeout_s
        return send(self.protocol, url, call, headers=self.headers, timeout_s=timeout,
                    client=self.clients[url])  # fmt: skip

    def served_version(self, url: str) -> int:
        """The newest of this learner's adapter versions ``url`` serves (0: the base alone)."""
        body = self._send(url, ADAPTERS_CALL, min(PROBE_TIMEOUT_S, self.timeout_s))
        return newest_adapter(served_adapters(body, url), self.prefix)

    def push(self, model: nn.Module, version: int, engines: Sequence[str]) -> PushResult:
        t0 = time.perf_counter()
        path = self.export(version)
        t_export = time.perf_counter() - t0
        failed: dict[str, str] = {}
        nbytes = 0
        if dist.get_rank() == 0:
            assert path is not None
            nbytes = (Path(path) / "adapter_model.safetensors").stat().st_size
            name = adapter_name(self.prefix, version)
            failed = self._load_everywhere(engines, functools.partial(self._load, name=name,
                                                                       path=path))  # fmt: skip
            self._prune_folders(Path(path).parent)
        t_load = time.perf_counter() - t0 - t_export
        ok = torch.tensor([0 if len(failed) == len(engines) or not engines else 1])
        if dist.get_world_size() > 1:
            dist.broadcast(ok, 0)
        error = "; ".join(failed.values()) if engines else "no engines to push to"
        return PushResult(
            bool(ok.item()), len(engines), nbytes, time.perf_counter() - t0, error,
            gather_seconds=t_export, send_seconds=t_load, failed=tuple(failed),
        )  # fmt: skip

    def _load(self, url: str, name: str, path: str) -> None:
        """Load ``name`` on ``url``, then unload this learner's versions older than the
        ``KEEP_VERSIONS`` newest it serves."""
        self._send(url, self.protocol.load_adapter(name, path))
        served = served_adapters(self._send(url, ADAPTERS_CALL), url)
        versions = {n: adapter_version(n, self.prefix) for n in served}
        newest = sorted({v for v in versions.values() if v is not None}, reverse=True)
        for other, v in versions.items():
            if v is not None and v not in newest[:KEEP_VERSIONS]:
                self._send(url, self.protocol.unload_adapter(other))

    def _prune_folders(self, root: Path) -> None:
        folders = sorted(root.glob("adapter_v*"))
        for old in folders[:-KEEP_VERSIONS]:
            shutil.rmtree(old, ignore_errors=True)

    def close(self) -> None:
        for client in self.clients.values():
            client.close()
        self.clients.clear()
