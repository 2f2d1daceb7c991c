"""Engine control: the engine registry in Redis and the two weight-update protocols.

Both ends import this module: the embedded engine registers itself and serves both protocols'
routes; the rollout worker and the learner list engines and read versions; the learner's push
(``learner/push.py``, which keeps the torch side: gathering tensors and the broadcast) sends the
calls built here. It imports no torch.

Registry — ``engines_key(ns)`` is a Redis hash: field = the engine's base URL, value = JSON
``{"url", "weight_version", "registered_unix"}``. :class:`EngineRegistry` writes an entry,
:func:`parse_registry` reads the hash (one parser for every reader).

Weight control — one protocol object per engine kind (:func:`weight_protocol`,
``rollout.weight_api``). It builds :class:`Call` s (method, path, body) and checks their answers;
:func:`send` carries them over HTTP (the rollout clients send the version
read through their own async client). A push is::

    init_group (once per set of engines)
    before_update()  ->  update(...) while the trainer broadcasts  ->  after_update(version)
    (on failure: recover(), so no engine stays paused)

- :class:`SGLangWeights` — ``/init_weights_update_group``, ``/update_weights_from_distributed``,
  ``/update_weights_from_disk``, ``GET /get_weight_version``; an engine swaps weights between
  batches itself, so before/after are empty.
- :class:`VLLMWeights` — vLLM's weight-transfer API (``VLLM_SERVER_DEV_MODE=1`` and
  ``--weight-transfer-config '{"backend": "nccl"}'``): ``/init_weight_transfer_engine``
  ``{"init_info": {...}}`` (``packed`` belongs here), then per push ``/pause?mode=...``,
  ``/start_weight_update``, ``/update_weights {"update_info": {"names", "dtype_names",
  "shapes"}}``, ``/finish_weight_update {"weight_version"}``, ``/reset_prefix_cache``,
  ``/resume``; ``GET /weight_info`` reads the version, the string ``"default"`` before the first
  update (version 0). Without a pause an update during generation kills vLLM; ``mode=abort`` cuts
  requests, which still answer 200 with ``finish_reason`` ``"abort"``. vLLM's weight-transfer API
  has no load-from-disk route.
"""

from __future__ import annotations

import json
import logging
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Literal, Protocol

import httpx

from dynamo_rl.keys import engines_key
from dynamo_rl.redis_client import redact_url, sync_client

log = logging.getLogger(__name__)

WeightAPI = Literal["sglang", "vllm"]
PauseMode = Literal["keep", "wait", "abort"]
WEIGHT_APIS: tuple[str, ...] = ("sglang", "vllm")
PAUSE_MODES: tuple[str, ...] = ("keep", "wait", "abort")
# vLLM's init_info names no group: both ends of a vLLM-shaped group prefix its store with this —
# the trainer, the embedded engine, and the plugin's gloo backend (its STORE_PREFIX, which must
# stay equal to this).
VLLM_GROUP_NAME = "dynamo_rl_gloo"
# What vLLM's /weight_info reports before the first update.
VLLM_INITIAL_VERSION = "default"
# finish_reason of a request that a pause with mode=abort cut short (HTTP 200, truncated output).
ABORTED = "abort"


# ---- registry -------------------------------------------------------------------------------


@dataclass(frozen=True)
class EngineEntry:
    """One registered engine."""

    url: str
    weight_version: int | None = None
    registered_unix: float = 0.0


def registry_value(url: str, weight_version: int) -> str:
    """The JSON stored under ``url`` in ``engines_key(ns)``."""
    return json.dumps(
        {"url": url, "weight_version": weight_version, "registered_unix": time.time()}
    )


def parse_registry(entries: Mapping[Any, Any]) -> list[EngineEntry]:
    """Engines from ``HGETALL engines_key(ns)``: sorted by URL (stable group ranks), one per URL.

    A value that is not our JSON still names an engine: the hash field is its URL."""
    out: dict[str, EngineEntry] = {}
    for key, raw in entries.items():
        url = key.decode() if isinstance(key, bytes) else str(key)
        version: int | None = None
        stamp = 0.0
        try:
            info = json.loads(raw)
            if isinstance(info, dict):
                url = str(info.get("url") or url)
                v = info.get("weight_version")
                version = None if v is None else int(v)
                stamp = float(info.get("registered_unix") or 0.0)
        except (ValueError, TypeError):
            pass
        url = url.rstrip("/")
        out[url] = EngineEntry(url, version, stamp)
    return [out[u] for u in sorted(out)]


def list_engines(client: Any, namespace: str) -> list[EngineEntry]:
    """Registered engines, read with a sync Redis client."""
    return parse_registry(client.hgetall(engines_key(namespace)))


async def alist_engines(client: Any, namespace: str) -> list[EngineEntry]:
    """Registered engines, read with an async Redis client."""
    return parse_registry(await client.hgetall(engines_key(namespace)))


class EngineRegistry:
    """An engine's own entry in ``engines_key(ns)``; Redis trouble is logged, never fatal."""

    def __init__(self, redis_url: str, namespace: str, url: str) -> None:
        self.redis_url = redis_url
        self.key = engines_key(namespace)
        self.url = url.rstrip("/")

    def register(self, weight_version: int) -> bool:
        try:
            client = sync_client(self.redis_url)
            try:
                client.hset(self.key, self.url, registry_value(self.url, weight_version))
            finally:
                client.close()
        except Exception as e:  # Redis is optional for an engine
            log.warning("could not register in Redis at %s: %s", redact_url(self.redis_url), e)
            return False
        return True

    def unregister(self) -> None:
        try:
            client = sync_client(self.redis_url)
            try:
                client.hdel(self.key, self.url)
            finally:
                client.close()
        except Exception as e:
            log.warning("could not unregister from Redis: %s", e)


# ---- weight control -------------------------------------------------------------------------


class WeightControlError(RuntimeError):
    """An engine refused or failed a weight-control call, or answered outside the protocol."""


@dataclass(frozen=True)
class Call:
    """One HTTP request of a weight-control protocol."""

    method: str
    path: str
    body: dict[str, Any] | None = None
    params: dict[str, str] = field(default_factory=dict)


def _check_tensors(names: Sequence[str], dtypes: Sequence[str], shapes: Sequence[Any]) -> None:
    if not len(names) == len(dtypes) == len(shapes):
        raise ValueError(
            "names, dtypes and shapes must have one entry per tensor, got "
            f"{len(names)}, {len(dtypes)}, {len(shapes)}"
        )


class WeightProtocol(Protocol):
    """What the learner's push and the rollout side's version reads need of an engine kind."""

    kind: str
    group_name: str | None  # a fixed store prefix for the push group, or None: the pusher's own
    version_call: Call

    def parse_version(self, body: Any, url: str = "") -> int: ...

    def init_group(
        self, *, master_address: str, master_port: int, rank_offset: int, world_size: int,
        group_name: str, backend: str,
    ) -> Call: ...  # fmt: skip

    def before_update(self) -> list[Call]: ...

    def update(
        self, *, names: Sequence[str], dtypes: Sequence[str], shapes: Sequence[Sequence[int]],
        group_name: str, weight_version: int,
    ) -> Call: ...  # fmt: skip

    def after_update(self, weight_version: int) -> list[Call]: ...

    def recover(self) -> list[Call]: ...

    def update_from_disk(self, model_path: str, weight_version: int) -> Call: ...

    def check(self, call: Call, status: int, body: Any, url: str) -> None: ...


def _status_error(call: Call, status: int, body: Any, url: str) -> None:
    if status != 200:
        raise WeightControlError(f"{url}{call.path}: HTTP {status} {str(body)[:300]}")


class SGLangWeights:
    """SGLang's weight-update routes (SGLang servers and the embedded engine)."""

    kind = "sglang"
    group_name: str | None = None  # the learner names each group
    version_call = Call("GET", "/get_weight_version")

    def parse_version(self, body: Any, url: str = "") -> int:
        """``{"weight_version": 3}`` (SGLang may send the number as a string; null is 0)."""
        if not isinstance(body, dict) or "weight_version" not in body:
            raise WeightControlError(f"{url}: no 'weight_version' in {str(body)[:200]}")
        value = body["weight_version"]
        if value is None:
            return 0
        try:
            return int(value)
        except (TypeError, ValueError):
            raise WeightControlError(
                f"{url}: weight_version {value!r} is not an integer (this trainer numbers versions)"
            ) from None

    def init_group(
        self, *, master_address: str, master_port: int, rank_offset: int, world_size: int,
        group_name: str, backend: str,
    ) -> Call:  # fmt: skip
        return Call(
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
        )

    def before_update(self) -> list[Call]:
        return []  # the engine applies an update between batches

    def update(
        self, *, names: Sequence[str], dtypes: Sequence[str], shapes: Sequence[Sequence[int]],
        group_name: str, weight_version: int,
    ) -> Call:  # fmt: skip
        _check_tensors(names, dtypes, shapes)
        return Call(
            "POST",
            "/update_weights_from_distributed",
            {
                "names": list(names),
                "dtypes": list(dtypes),
                "shapes": [list(s) for s in shapes],
                "group_name": group_name,
                "weight_version": weight_version,
            },
        )

    def after_update(self, weight_version: int) -> list[Call]:
        return []

    def recover(self) -> list[Call]:
        return []

    def update_from_disk(self, model_path: str, weight_version: int) -> Call:
        return Call(
            "POST",
            "/update_weights_from_disk",
            {"model_path": model_path, "weight_version": weight_version},
        )

    def check(self, call: Call, status: int, body: Any, url: str) -> None:
        _status_error(call, status, body, url)
        # SGLang answers 200 with {"success": false, "message": ...} when an update fails.
        if isinstance(body, dict) and body.get("success") is False:
            raise WeightControlError(f"{url}{call.path} failed: {body.get('message', body)}")


class VLLMWeights:
    """vLLM's weight-transfer API (see the module docstring for the server flags it needs)."""

    kind = "vllm"
    group_name: str | None = VLLM_GROUP_NAME
    version_call = Call("GET", "/weight_info")

    def __init__(self, *, pause_mode: PauseMode = "wait", packed: bool = False) -> None:
        if pause_mode not in PAUSE_MODES:
            raise ValueError(f"pause_mode must be one of {PAUSE_MODES}, got {pause_mode!r}")
        self.pause_mode = pause_mode
        self.packed = packed

    def parse_version(self, body: Any, url: str = "") -> int:
        """``{"weight_version": "3"}``; ``"default"`` (never updated) and null are 0."""
        if not isinstance(body, dict) or "weight_version" not in body:
            raise WeightControlError(f"{url}: no 'weight_version' in {str(body)[:200]}")
        value = body["weight_version"]
        if value is None or value == VLLM_INITIAL_VERSION:
            return 0
        try:
            return int(value)
        except (TypeError, ValueError):
            raise WeightControlError(
                f"{url}: weight_version {value!r} is neither {VLLM_INITIAL_VERSION!r} nor an "
                "integer (this trainer numbers versions)"
            ) from None

    def init_group(
        self, *, master_address: str, master_port: int, rank_offset: int, world_size: int,
        group_name: str, backend: str,
    ) -> Call:  # fmt: skip
        # vLLM takes the transport from --weight-transfer-config, so backend and group_name are
        # not sent.
        del group_name, backend
        return Call(
            "POST",
            "/init_weight_transfer_engine",
            {
                "init_info": {
                    "master_address": master_address,
                    "master_port": master_port,
                    "rank_offset": rank_offset,
                    "world_size": world_size,
                    # Sent only when asked for: the plugin's gloo backend knows no such key.
                    **({"packed": True} if self.packed else {}),
                }
            },
        )

    def before_update(self) -> list[Call]:
        return [
            Call("POST", "/pause", params={"mode": self.pause_mode}),
            Call("POST", "/start_weight_update", {}),
        ]

    def update(
        self, *, names: Sequence[str], dtypes: Sequence[str], shapes: Sequence[Sequence[int]],
        group_name: str, weight_version: int,
    ) -> Call:  # fmt: skip
        del group_name, weight_version  # the version is sent by finish_weight_update
        _check_tensors(names, dtypes, shapes)
        return Call(
            "POST",
            "/update_weights",
            {
                "update_info": {
                    "names": list(names),
                    "dtype_names": list(dtypes),
                    "shapes": [list(s) for s in shapes],
                }
            },
        )

    def after_update(self, weight_version: int) -> list[Call]:
        return [
            Call("POST", "/finish_weight_update", {"weight_version": str(weight_version)}),
            Call("POST", "/reset_prefix_cache"),
            Call("POST", "/resume"),
        ]

    def recover(self) -> list[Call]:
        return [Call("POST", "/resume")]

    def update_from_disk(self, model_path: str, weight_version: int) -> Call:
        raise WeightControlError(
            "vLLM's weight-transfer API has no load-from-disk route: push with "
            "learner.push.transport=distributed"
        )

    def check(self, call: Call, status: int, body: Any, url: str) -> None:
        _status_error(call, status, body, url)


def weight_protocol(
    kind: str, *, pause_mode: PauseMode = "wait", packed: bool = False
) -> WeightProtocol:
    """The protocol object of an engine kind (``rollout.weight_api``)."""
    if kind == "sglang":
        return SGLangWeights()
    if kind == "vllm":
        return VLLMWeights(pause_mode=pause_mode, packed=packed)
    raise ValueError(f"weight_api must be one of {WEIGHT_APIS}, got {kind!r}")


def _body(response: httpx.Response) -> Any:
    try:
        return response.json()
    except ValueError:
        return response.text


def send(
    protocol: WeightProtocol,
    url: str,
    call: Call,
    *,
    headers: Mapping[str, str] | None = None,
    timeout_s: float = 600.0,
) -> Any:
    """Send ``call`` to the engine at ``url`` (blocking); the answer's body, checked."""
    target = url.rstrip("/") + call.path
    try:
        response = httpx.request(
            call.method, target, json=call.body, params=call.params or None,
            headers=dict(headers or {}), timeout=timeout_s,
        )  # fmt: skip
    except httpx.HTTPError as e:
        raise WeightControlError(f"{target}: {type(e).__name__}: {e}") from e
    body = _body(response)
    protocol.check(call, response.status_code, body, url.rstrip("/"))
    return body


def read_version(
    protocol: WeightProtocol,
    url: str,
    *,
    headers: Mapping[str, str] | None = None,
    timeout_s: float = 10.0,
) -> int:
    """The engine's weight version (blocking)."""
    body = send(protocol, url, protocol.version_call, headers=headers, timeout_s=timeout_s)
    return protocol.parse_version(body, url)
