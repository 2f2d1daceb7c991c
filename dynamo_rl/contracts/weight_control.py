"""The engine's weight-control contract: the two weight-update protocols and their bodies.

Both ends import this module: the embedded engine validates each control route's body with the
request models here and answers with the answer models; the learner's push (``learner/push.py``,
which keeps the torch side: gathering tensors and the broadcast) sends the calls built here, whose
bodies are those models; the rollout clients read versions through the same protocol objects.
The generation API and the engine registry are :mod:`dynamo_rl.contracts.engine`. No torch.

One protocol object per engine kind (:func:`weight_protocol`, ``rollout.weight_api``). It builds
:class:`Call` s (method, path, body) and checks their answers; :func:`send` carries them over HTTP
(the rollout clients send the version read through their own async client). A push is::

    init_group (one two-rank group per engine, kept while the engine keeps its version)
    before_update()  ->  update(...) while the trainer broadcasts  ->  after_update(version)
    (on failure: recover(), so no engine stays paused)

Tensors travel one broadcast each (SGLang's contract), or — the vLLM-shaped protocol over gloo,
whose receivers are ours: the embedded engine and the vLLM plugin's gloo backend — in flat buckets
(:mod:`dynamo_rl.contracts.weight_layout`, ``init_info.bucket_bytes``); :meth:`WeightProtocol.packs`
says which.

- :class:`SGLangWeights` — ``/init_weights_update_group`` (:class:`InitWeightsUpdateGroupRequest`),
  ``/update_weights_from_distributed`` (:class:`UpdateWeightsFromDistributedRequest`),
  ``/update_weights_from_disk`` (:class:`UpdateWeightsFromDiskRequest`), answered with an
  :class:`UpdateAnswer`; ``GET /get_weight_version`` (:class:`WeightVersionAnswer`, an integer).
  An engine swaps weights between batches itself, so before/after are empty.
- LoRA adapters (``learner.lora``), both kinds: ``load_adapter`` / ``unload_adapter``
  (:class:`LoadLoraAdapterRequest`, :class:`UnloadLoraAdapterRequest`; SGLang's
  ``/load_lora_adapter``, vLLM's ``/v1/load_lora_adapter``) serve a peft adapter folder under a
  versioned name (:func:`adapter_name`: ``<name>-v<version>``); ``GET /v1/models``
  (:data:`ADAPTERS_CALL`, :func:`served_adapters`) lists what an engine serves, the newest
  version (:func:`newest_adapter`) is the adapter version it is at.
- :class:`VLLMWeights` — vLLM's weight-transfer API (``VLLM_SERVER_DEV_MODE=1`` and
  ``--weight-transfer-config '{"backend": "gloo"}'`` — the project's plugin, CPU — or ``"nccl"``):
  ``/init_weight_transfer_engine`` (:class:`VLLMInitRequest`; gloo: ``bucket_bytes``,
  ``timeout_s``; nccl: ``packed``), then per push ``/pause?mode=...``,
  ``/start_weight_update``, ``/update_weights`` (:class:`VLLMUpdateRequest`),
  ``/finish_weight_update`` (:class:`VLLMFinishRequest`), ``/reset_prefix_cache``,
  ``/resume``; ``GET /weight_info`` reads the version (:class:`WeightVersionAnswer`, a string:
  ``"default"`` before the first update, version 0). Without a pause an update during generation
  kills vLLM; ``mode=abort`` cuts requests, which still answer 200 with ``finish_reason``
  ``"abort"``. vLLM's weight-transfer API has no load-from-disk route.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Annotated, Any, Literal, Protocol

import httpx
from pydantic import Field, ValidationError

from dynamo_rl.contracts.engine import EngineAnswer, EngineRequest
from dynamo_rl.contracts.weight_layout import GLOO_STORE_PREFIX

log = logging.getLogger(__name__)

WeightAPI = Literal["sglang", "vllm"]
PauseMode = Literal["keep", "wait", "abort"]
WEIGHT_APIS: tuple[str, ...] = ("sglang", "vllm")
PAUSE_MODES: tuple[str, ...] = ("keep", "wait", "abort")
# vLLM's init_info names no group: both ends of a vLLM-shaped group (the learner, the embedded
# engine, the vLLM plugin's gloo backend) prefix its store with this.
VLLM_GROUP_NAME = GLOO_STORE_PREFIX
# What vLLM's /weight_info reports before the first update.
VLLM_INITIAL_VERSION = "default"

Port = Annotated[int, Field(ge=1, le=65535)]
Shape = list[Annotated[int, Field(ge=0)]]


# ---- SGLang-shaped bodies -------------------------------------------------------------------


class InitWeightsUpdateGroupRequest(EngineRequest):
    master_address: str
    master_port: Port
    rank_offset: Annotated[int, Field(ge=1)]
    world_size: Annotated[int, Field(ge=2)]
    group_name: str = "weight_update_group"
    backend: Literal["gloo", "nccl"] = "gloo"


class UpdateWeightsFromDistributedRequest(EngineRequest):
    names: list[str]
    dtypes: list[str]
    shapes: list[Shape]
    group_name: str = "weight_update_group"
    weight_version: int | None = None
    """New version; when left out the engine's version goes up by one."""
    flush_cache: bool = True
    """Accepted for SGLang compatibility; the embedded engine keeps no cache between batches."""


class UpdateWeightsFromDiskRequest(EngineRequest):
    model_path: str
    weight_version: int | None = None
    load_format: str | None = None
    flush_cache: bool = True


class UpdateAnswer(EngineAnswer):
    """SGLang's answer to a control call: a failed update is ``success: false`` (HTTP 200 or 4xx)."""

    success: bool
    message: str = ""
    weight_version: int | None = None


class WeightVersionAnswer(EngineAnswer):
    """``GET /get_weight_version`` (SGLang: an integer, some versions send it as a string) and
    ``GET /weight_info`` (vLLM: a string, ``"default"`` before the first update)."""

    weight_version: int | str | float | None


# ---- vLLM-shaped bodies ---------------------------------------------------------------------


class VLLMInitInfo(EngineRequest):
    master_address: str
    master_port: Port
    rank_offset: Annotated[int, Field(ge=1)]
    world_size: Annotated[int, Field(ge=2)]
    bucket_bytes: Annotated[int, Field(ge=0)] | None = None
    """gloo: flat buckets of at most this many bytes (dynamo_rl.contracts.weight_layout, as the
    vLLM plugin's gloo backend); 0 or absent: one broadcast per tensor."""
    timeout_s: Annotated[float, Field(gt=0)] | None = None
    """gloo: the group's timeout (absent: the engine's own, engine.weight_update_timeout_s)."""
    packed: bool | None = None
    """nccl: vLLM's own packed layout (the embedded engine refuses it; its buckets are
    bucket_bytes)."""


class VLLMInitRequest(EngineRequest):
    """``POST /init_weight_transfer_engine`` (vLLM's weight-transfer API)."""

    init_info: VLLMInitInfo


class VLLMStartRequest(EngineRequest):
    """``POST /start_weight_update``: no field this trainer sends (the body is ``{}``)."""


class VLLMUpdateInfo(EngineRequest):
    names: list[str]
    dtype_names: list[str]
    shapes: list[Shape]


class VLLMUpdateRequest(EngineRequest):
    """``POST /update_weights``: the tensors the trainer broadcasts next, in order."""

    update_info: VLLMUpdateInfo


class VLLMFinishRequest(EngineRequest):
    """``POST /finish_weight_update``: vLLM's versions are strings."""

    weight_version: str


class WeightControlError(RuntimeError):
    """An engine refused or failed a weight-control call, or answered outside the protocol."""


# ---- LoRA adapters (both engine kinds) ------------------------------------------------------


class LoadLoraAdapterRequest(EngineRequest):
    """``POST /load_lora_adapter`` (SGLang) and ``/v1/load_lora_adapter`` (vLLM, with
    ``VLLM_ALLOW_RUNTIME_LORA_UPDATING=True`` and ``--enable-lora``): serve the peft adapter
    folder at ``lora_path`` (``adapter_config.json``, ``adapter_model.safetensors``), read as it
    is, on top of the shared base weights under ``lora_name``, which requests then name (the
    OpenAI ``model`` field; SGLang's ``lora_path`` of ``/generate``)."""

    lora_name: Annotated[str, Field(min_length=1)]
    lora_path: Annotated[str, Field(min_length=1)]


class UnloadLoraAdapterRequest(EngineRequest):
    """``POST /unload_lora_adapter`` (SGLang) and ``/v1/unload_lora_adapter`` (vLLM)."""

    lora_name: Annotated[str, Field(min_length=1)]


def adapter_name(prefix: str, version: int) -> str:
    """The versioned name an adapter push serves: ``<learner.lora.name>-v<version>``."""
    return f"{prefix}-v{int(version)}"


def adapter_version(name: str, prefix: str | None = None) -> int | None:
    """The version in a versioned adapter name (of ``prefix`` when given); None otherwise."""
    head, sep, tail = name.rpartition("-v")
    if not sep or not head or not tail.isdigit() or (prefix is not None and head != prefix):
        return None
    return int(tail)


def served_adapters(body: Any, url: str = "") -> list[str]:
    """The adapter names a ``GET /v1/models`` answer lists: every entry but the first (the base
    model, listed first by vLLM and the embedded engine)."""
    data = body.get("data") if isinstance(body, dict) else None
    if not isinstance(data, list) or not data:
        raise WeightControlError(f"{url}/v1/models: no model list in {str(body)[:200]}")
    return [str(m.get("id")) for m in data[1:] if isinstance(m, dict) and m.get("id")]


def newest_adapter(names: Sequence[str], prefix: str) -> int:
    """The newest version of ``prefix``'s adapters among ``names``; 0 when none is loaded."""
    versions = [v for v in (adapter_version(n, prefix) for n in names) if v is not None]
    return max(versions, default=0)


# ---- weight control -------------------------------------------------------------------------


@dataclass(frozen=True)
class Call:
    """One HTTP request of a weight-control protocol."""

    method: str
    path: str
    body: dict[str, Any] | None = None
    """The JSON body, an :class:`EngineRequest`'s :meth:`~EngineRequest.body`."""
    params: dict[str, str] = field(default_factory=dict)

    @classmethod
    def post(cls, path: str, request: EngineRequest | None = None, **params: str) -> Call:
        return cls("POST", path, None if request is None else request.body(), params)


ADAPTERS_CALL = Call("GET", "/v1/models")
"""Lists the served base model and adapters (:func:`served_adapters`): vLLM and the embedded
engine list every loaded adapter after the base."""


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

    def packs(self, backend: str) -> bool:
        """Whether pushes over ``backend`` travel in flat buckets
        (:mod:`dynamo_rl.contracts.weight_layout`) rather than one broadcast per tensor."""
        ...

    def init_group(
        self, *, master_address: str, master_port: int, rank_offset: int, world_size: int,
        group_name: str, backend: str, bucket_bytes: int = 0, timeout_s: float = 300.0,
    ) -> Call: ...  # fmt: skip

    def before_update(self) -> list[Call]: ...

    def update(
        self, *, names: Sequence[str], dtypes: Sequence[str], shapes: Sequence[Sequence[int]],
        group_name: str, weight_version: int,
    ) -> Call: ...  # fmt: skip

    def after_update(self, weight_version: int) -> list[Call]: ...

    def recover(self) -> list[Call]: ...

    def update_from_disk(self, model_path: str, weight_version: int) -> Call: ...

    def load_adapter(self, name: str, path: str) -> Call: ...

    def unload_adapter(self, name: str) -> Call: ...

    def check(self, call: Call, status: int, body: Any, url: str) -> None: ...


def _status_error(call: Call, status: int, body: Any, url: str) -> None:
    if status != 200:
        raise WeightControlError(f"{url}{call.path}: HTTP {status} {str(body)[:300]}")


def _answered_version(body: Any, url: str) -> int | str | float | None:
    try:
        return WeightVersionAnswer.model_validate(body).weight_version
    except ValidationError:
        raise WeightControlError(f"{url}: no 'weight_version' in {str(body)[:200]}") from None


class SGLangWeights:
    """SGLang's weight-update routes (SGLang servers and the embedded engine)."""

    kind = "sglang"
    group_name: str | None = None  # the learner names each group
    version_call = Call("GET", "/get_weight_version")

    def parse_version(self, body: Any, url: str = "") -> int:
        """``{"weight_version": 3}`` (SGLang may send the number as a string; null is 0)."""
        value = _answered_version(body, url)
        if value is None:
            return 0
        try:
            return int(value)
        except (TypeError, ValueError):
            raise WeightControlError(
                f"{url}: weight_version {value!r} is not an integer (this trainer numbers versions)"
            ) from None

    def packs(self, backend: str) -> bool:
        return False  # SGLang's contract: one broadcast per tensor, in names order

    def init_group(
        self, *, master_address: str, master_port: int, rank_offset: int, world_size: int,
        group_name: str, backend: str, bucket_bytes: int = 0, timeout_s: float = 300.0,
    ) -> Call:  # fmt: skip
        if bucket_bytes:
            raise ValueError(
                "bucket_bytes: SGLang's weight-update group takes one tensor per broadcast"
            )
        del timeout_s  # SGLang's group uses its own
        return Call.post(
            "/init_weights_update_group",
            InitWeightsUpdateGroupRequest(
                master_address=master_address, master_port=master_port, rank_offset=rank_offset,
                world_size=world_size, group_name=group_name, backend=backend,  # type: ignore[arg-type]
            ),
        )  # fmt: skip

    def before_update(self) -> list[Call]:
        return []  # the engine applies an update between batches

    def update(
        self, *, names: Sequence[str], dtypes: Sequence[str], shapes: Sequence[Sequence[int]],
        group_name: str, weight_version: int,
    ) -> Call:  # fmt: skip
        _check_tensors(names, dtypes, shapes)
        return Call.post(
            "/update_weights_from_distributed",
            UpdateWeightsFromDistributedRequest(
                names=list(names), dtypes=list(dtypes), shapes=[list(s) for s in shapes],
                group_name=group_name, weight_version=weight_version,
            ),
        )  # fmt: skip

    def after_update(self, weight_version: int) -> list[Call]:
        return []

    def recover(self) -> list[Call]:
        return []

    def update_from_disk(self, model_path: str, weight_version: int) -> Call:
        return Call.post(
            "/update_weights_from_disk",
            UpdateWeightsFromDiskRequest(model_path=model_path, weight_version=weight_version),
        )

    def load_adapter(self, name: str, path: str) -> Call:
        return Call.post(
            "/load_lora_adapter", LoadLoraAdapterRequest(lora_name=name, lora_path=path)
        )

    def unload_adapter(self, name: str) -> Call:
        return Call.post("/unload_lora_adapter", UnloadLoraAdapterRequest(lora_name=name))

    def check(self, call: Call, status: int, body: Any, url: str) -> None:
        _status_error(call, status, body, url)
        # SGLang answers 200 with {"success": false, "message": ...} when an update fails.
        try:
            answer = UpdateAnswer.model_validate(body)
        except ValidationError:
            return  # not that shape: the status said it all
        if not answer.success:
            raise WeightControlError(f"{url}{call.path} failed: {answer.message or body}")


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
        value = _answered_version(body, url)
        if value is None or value == VLLM_INITIAL_VERSION:
            return 0
        try:
            return int(value)
        except (TypeError, ValueError):
            raise WeightControlError(
                f"{url}: weight_version {value!r} is neither {VLLM_INITIAL_VERSION!r} nor an "
                "integer (this trainer numbers versions)"
            ) from None

    def packs(self, backend: str) -> bool:
        # Over gloo the receiver is ours (the vLLM plugin's gloo backend or the embedded engine),
        # which unpacks flat buckets; vLLM's own nccl backend has a layout of its own (packed).
        return backend == "gloo"

    def init_group(
        self, *, master_address: str, master_port: int, rank_offset: int, world_size: int,
        group_name: str, backend: str, bucket_bytes: int = 0, timeout_s: float = 300.0,
    ) -> Call:  # fmt: skip
        # vLLM takes the transport from --weight-transfer-config; group_name is not sent.
        del group_name
        # gloo: the plugin's GlooInitInfo (and the embedded engine's); else vLLM's nccl backend.
        gloo = backend == "gloo"
        if bucket_bytes and not gloo:
            raise ValueError("vLLM's nccl backend takes no bucket_bytes (its layout: packed)")
        info = VLLMInitInfo(
            master_address=master_address, master_port=master_port, rank_offset=rank_offset,
            world_size=world_size, bucket_bytes=bucket_bytes if gloo else None,
            timeout_s=timeout_s if gloo else None, packed=None if gloo else self.packed,
        )  # fmt: skip
        return Call.post("/init_weight_transfer_engine", VLLMInitRequest(init_info=info))

    def before_update(self) -> list[Call]:
        return [
            Call.post("/pause", mode=self.pause_mode),
            Call.post("/start_weight_update", VLLMStartRequest()),
        ]

    def update(
        self, *, names: Sequence[str], dtypes: Sequence[str], shapes: Sequence[Sequence[int]],
        group_name: str, weight_version: int,
    ) -> Call:  # fmt: skip
        del group_name, weight_version  # the version is sent by finish_weight_update
        _check_tensors(names, dtypes, shapes)
        info = VLLMUpdateInfo(
            names=list(names), dtype_names=list(dtypes), shapes=[list(s) for s in shapes]
        )
        return Call.post("/update_weights", VLLMUpdateRequest(update_info=info))

    def after_update(self, weight_version: int) -> list[Call]:
        return [
            Call.post(
                "/finish_weight_update", VLLMFinishRequest(weight_version=str(weight_version))
            ),
            Call.post("/reset_prefix_cache"),
            Call.post("/resume"),
        ]

    def recover(self) -> list[Call]:
        return [Call.post("/resume")]

    def update_from_disk(self, model_path: str, weight_version: int) -> Call:
        raise WeightControlError(
            "vLLM's weight-transfer API has no load-from-disk route: push with "
            "learner.push.transport=distributed"
        )

    def load_adapter(self, name: str, path: str) -> Call:
        return Call.post(
            "/v1/load_lora_adapter", LoadLoraAdapterRequest(lora_name=name, lora_path=path)
        )

    def unload_adapter(self, name: str) -> Call:
        return Call.post("/v1/unload_lora_adapter", UnloadLoraAdapterRequest(lora_name=name))

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
    client: httpx.Client | None = None,
) -> Any:
    """Send ``call`` to the engine at ``url`` (blocking); the answer's body, checked. ``client``:
    a kept-open client (a new one per call costs tens of milliseconds)."""
    target = url.rstrip("/") + call.path
    try:
        response = (client or httpx).request(
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
