"""Weight-update adapters: SGLang's endpoints (also served by the embedded engine) and vLLM's
native weight-transfer API.

SGLang shape (``docs/contracts.md``, tested here against the embedded engine):
``POST /init_weights_update_group``, ``POST /update_weights_from_distributed``,
``POST /update_weights_from_disk``, ``GET /get_weight_version``.

vLLM shape — written from vLLM's documentation ("Weight Transfer", ``vllm serve MODEL
--weight-transfer-config '{"backend": "nccl"}'`` with ``VLLM_SERVER_DEV_MODE=1`` so the RLHF routes
are mounted) and **not tested here** (no vLLM on this machine): ``POST /init_weight_transfer_engine``
``{"init_info": {master_address, master_port, rank_offset, world_size}}`` once; per push
``POST /start_weight_update``, ``POST /update_weights`` ``{"update_info": {names, dtype_names,
shapes, packed}}`` while the trainer broadcasts each tensor from rank 0, then
``POST /finish_weight_update`` ``{"weight_version": "<v>"}``; ``GET /weight_info`` for the version.
vLLM picks its transport from its own config, so ``group_name`` and ``backend`` are not sent.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from services.rollout.engines._http import HTTPReplica
from services.rollout.engines.base import EngineError, EngineProtocolError

__all__ = ["SGLangWeightUpdater", "VLLMWeightUpdater", "parse_weight_version"]


def parse_weight_version(body: Any, url: str) -> int:
    """The integer weight version from ``{"weight_version": ...}`` (SGLang and vLLM send strings)."""
    if not isinstance(body, dict) or "weight_version" not in body:
        raise EngineProtocolError(f"{url}: no 'weight_version' in {str(body)[:200]}")
    value = body["weight_version"]
    if value is None:
        return 0
    try:
        return int(value)
    except (TypeError, ValueError):
        raise EngineProtocolError(
            f"{url}: weight_version {value!r} is not an integer (this trainer numbers versions)"
        ) from None


def _check_success(body: Any, url: str, what: str) -> None:
    # SGLang answers 200 with {"success": false, "message": ...} when an update fails.
    if isinstance(body, dict) and body.get("success") is False:
        raise EngineError(f"{url}: {what} failed: {body.get('message', body)}")


class SGLangWeightUpdater:
    """SGLang's weight-update endpoints (SGLang servers and the embedded engine)."""

    def __init__(self, http: HTTPReplica, *, update_timeout_s: float = 600.0) -> None:
        self.http = http
        self.update_timeout_s = update_timeout_s

    async def init_group(
        self,
        *,
        master_address: str,
        master_port: int,
        rank_offset: int,
        world_size: int,
        group_name: str,
        backend: str,
    ) -> None:
        body = await self.http.request(
            "POST",
            "/init_weights_update_group",
            {
                "master_address": master_address,
                "master_port": master_port,
                "rank_offset": rank_offset,
                "world_size": world_size,
                "group_name": group_name,
                "backend": backend,
            },
            control=True,
            timeout_s=self.update_timeout_s,
        )
        _check_success(body, self.http.url, "init_weights_update_group")

    async def update_from_distributed(
        self,
        *,
        names: Sequence[str],
        dtypes: Sequence[str],
        shapes: Sequence[Sequence[int]],
        group_name: str,
        weight_version: int,
    ) -> None:
        body = await self.http.request(
            "POST",
            "/update_weights_from_distributed",
            {
                "names": list(names),
                "dtypes": list(dtypes),
                "shapes": [list(s) for s in shapes],
                "group_name": group_name,
                "weight_version": weight_version,
            },
            control=True,
            timeout_s=self.update_timeout_s,
        )
        _check_success(body, self.http.url, "update_weights_from_distributed")

    async def update_from_disk(self, model_path: str, weight_version: int) -> None:
        body = await self.http.request(
            "POST",
            "/update_weights_from_disk",
            {"model_path": model_path, "weight_version": weight_version},
            control=True,
            timeout_s=self.update_timeout_s,
        )
        _check_success(body, self.http.url, "update_weights_from_disk")

    async def weight_version(self) -> int:
        body = await self.http.request("GET", "/get_weight_version", timeout_s=10.0)
        return parse_weight_version(body, self.http.url)


class VLLMWeightUpdater:
    """vLLM's native weight-transfer routes (untested here: see the module docstring)."""

    def __init__(
        self, http: HTTPReplica, *, update_timeout_s: float = 600.0, packed: bool = False
    ) -> None:
        self.http = http
        self.update_timeout_s = update_timeout_s
        self.packed = packed

    @staticmethod
    def init_payload(
        master_address: str, master_port: int, rank_offset: int, world_size: int
    ) -> dict[str, Any]:
        return {
            "init_info": {
                "master_address": master_address,
                "master_port": master_port,
                "rank_offset": rank_offset,
                "world_size": world_size,
            }
        }

    def update_payload(
        self, names: Sequence[str], dtypes: Sequence[str], shapes: Sequence[Sequence[int]]
    ) -> dict[str, Any]:
        if not len(names) == len(dtypes) == len(shapes):
            raise ValueError(
                f"names, dtypes and shapes must have one entry per tensor, got "
                f"{len(names)}, {len(dtypes)}, {len(shapes)}"
            )
        return {
            "update_info": {
                "names": list(names),
                "dtype_names": list(dtypes),
                "shapes": [list(s) for s in shapes],
                "packed": self.packed,
            }
        }

    async def init_group(
        self,
        *,
        master_address: str,
        master_port: int,
        rank_offset: int,
        world_size: int,
        group_name: str,
        backend: str,
    ) -> None:
        del group_name, backend  # vLLM takes its transport from --weight-transfer-config
        await self.http.request(
            "POST",
            "/init_weight_transfer_engine",
            self.init_payload(master_address, master_port, rank_offset, world_size),
            control=True,
            timeout_s=self.update_timeout_s,
        )

    async def update_from_distributed(
        self,
        *,
        names: Sequence[str],
        dtypes: Sequence[str],
        shapes: Sequence[Sequence[int]],
        group_name: str,
        weight_version: int,
    ) -> None:
        del group_name
        payload = self.update_payload(names, dtypes, shapes)
        t = self.update_timeout_s
        await self.http.request("POST", "/start_weight_update", {}, control=True, timeout_s=t)
        await self.http.request("POST", "/update_weights", payload, control=True, timeout_s=t)
        await self.http.request(
            "POST",
            "/finish_weight_update",
            {"weight_version": str(weight_version)},
            control=True,
            timeout_s=t,
        )

    async def update_from_disk(self, model_path: str, weight_version: int) -> None:
        raise EngineError(
            f"{self.http.url}: the vLLM weight-transfer adapter has no update-from-disk route; "
            "push over the weight-transfer engine (update_from_distributed) instead"
        )

    async def weight_version(self) -> int:
        body = await self.http.request("GET", "/weight_info", timeout_s=10.0)
        return parse_weight_version(body, self.http.url)
