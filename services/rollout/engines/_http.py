"""HTTP plumbing shared by the engine clients: one ``httpx.AsyncClient`` per replica, one mapping
from transport failures and status codes to the engine errors of :mod:`.base`, and the two ways a
contract model can refuse: a request it refuses is the caller's (:class:`EngineRequestError`, as
the engine's own 422), an answer it refuses is the engine's (:class:`EngineProtocolError`)."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, TypeVar

import httpx
from pydantic import TypeAdapter, ValidationError

from dynamo_rl.contracts.weight_control import (
    ADAPTERS_CALL,
    WeightControlError,
    WeightProtocol,
    adapter_name,
    newest_adapter,
    served_adapters,
)
from services.rollout.engines.base import (
    EngineProtocolError,
    EngineRequestError,
    EngineUnavailable,
)

# Statuses that mean "this replica cannot serve now" rather than "your request is wrong".
RETRYABLE_STATUS = frozenset({408, 429, 500, 502, 503, 504})

T = TypeVar("T")


def build_request(url: str, build: Callable[[], T]) -> T:
    """``build()``, a contract request model; one it refuses is a request error, as the
    engine's own 422 would be (no replica accepts it)."""
    try:
        return build()
    except ValidationError as e:
        raise EngineRequestError(url, 422, e.errors(include_url=False)) from None


def parse_answer(adapter: TypeAdapter[T], body: Any, where: str) -> T:
    """``body`` read through a contract answer model; one that does not fit is the engine's
    fault (:class:`EngineProtocolError`)."""
    try:
        return adapter.validate_python(body)
    except ValidationError as e:
        raise EngineProtocolError(f"{where}: the answer does not fit the contract: {e}") from None


class HTTPReplica:
    """Base URL, client and bearer token of one engine replica."""

    def __init__(
        self,
        url: str,
        *,
        timeout_s: float = 600.0,
        control_token: str | None = None,
        client: httpx.AsyncClient | None = None,
    ) -> None:
        self.url = url.rstrip("/")
        self.timeout_s = timeout_s
        self._control_token = control_token
        # Generation requests are long; connection set-up should fail fast so the pool moves on.
        # An idle connection is dropped after 2 s, before the engines' servers (uvicorn: 5 s)
        # close it: a request sent on a connection the server is closing gets no answer.
        self._client = client or httpx.AsyncClient(
            timeout=httpx.Timeout(timeout_s, connect=min(5.0, timeout_s)),
            limits=httpx.Limits(
                max_connections=256, max_keepalive_connections=64, keepalive_expiry=2.0
            ),
        )

    def _headers(self, control: bool) -> dict[str, str]:
        if control and self._control_token:
            return {"Authorization": f"Bearer {self._control_token}"}
        return {}

    async def request(
        self,
        method: str,
        path: str,
        json: Any = None,
        *,
        control: bool = False,
        timeout_s: float | None = None,
    ) -> Any:
        """Send one request; return the parsed JSON body or raise an engine error."""
        url = f"{self.url}{path}"
        kwargs: dict[str, Any] = {"headers": self._headers(control)}
        if json is not None:
            kwargs["json"] = json
        if timeout_s is not None:
            kwargs["timeout"] = timeout_s
        try:
            response = await self._client.request(method, url, **kwargs)
        except httpx.TimeoutException as e:
            raise EngineUnavailable(f"{url}: timed out ({type(e).__name__})") from e
        except httpx.TransportError as e:
            raise EngineUnavailable(f"{url}: {type(e).__name__}: {e}") from e
        if response.status_code in RETRYABLE_STATUS:
            raise EngineUnavailable(f"{url}: HTTP {response.status_code}: {response.text[:300]}")
        if response.status_code >= 400:
            try:
                detail: object = response.json()
            except ValueError:
                detail = response.text[:500]
            raise EngineRequestError(url, response.status_code, detail)
        try:
            return response.json()
        except ValueError:
            return response.text

    async def ok(self, path: str, timeout_s: float = 2.0) -> bool:
        try:
            response = await self._client.get(f"{self.url}{path}", timeout=timeout_s)
        except httpx.HTTPError:
            return False
        return response.status_code == 200

    async def aclose(self) -> None:
        await self._client.aclose()


def token_versions(versions: list[int] | None, tokens: int, url: str) -> list[int] | None:
    """An answer's per-token weight versions (the embedded engine's extension), checked to be
    one per token; None when the engine sent none."""
    if versions is None:
        return None
    if len(versions) != tokens:
        raise EngineProtocolError(f"{url}: {len(versions)} weight versions for {tokens} tokens")
    return list(versions)


async def read_weight_version(http: HTTPReplica, protocol: WeightProtocol) -> int:
    """The replica's weight version, read and parsed by its engine-control protocol."""
    call = protocol.version_call
    body = await http.request(call.method, call.path, call.body, timeout_s=10.0)
    try:
        return protocol.parse_version(body, http.url)
    except WeightControlError as e:
        raise EngineProtocolError(str(e)) from None


class ReplicaClient:
    """What every engine client shares: its replica's HTTP, the weight-control protocol it reads
    versions with, and the health check. With ``adapter`` (``learner.lora.name``: a LoRA policy)
    the version is the newest of those adapters the replica serves, and requests name it."""

    def __init__(
        self,
        url: str,
        weights: WeightProtocol,
        *,
        timeout_s: float = 600.0,
        control_token: str | None = None,
        adapter: str | None = None,
    ) -> None:
        self.http = HTTPReplica(url, timeout_s=timeout_s, control_token=control_token)
        self.url = self.http.url
        self.weights = weights
        self.adapter = adapter

    async def weight_version(self) -> int:
        if self.adapter is None:
            return await read_weight_version(self.http, self.weights)
        call = ADAPTERS_CALL
        body = await self.http.request(call.method, call.path, timeout_s=10.0)
        try:
            return newest_adapter(served_adapters(body, self.url), self.adapter)
        except WeightControlError as e:
            raise EngineProtocolError(str(e)) from None

    async def adapter_to_use(self) -> tuple[str | None, int]:
        """The LoRA adapter a request names now and its version: the newest this replica serves
        (None, 0: no adapter policy, or none loaded yet — the base model)."""
        if self.adapter is None:
            return None, 0
        version = await self.weight_version()
        return (adapter_name(self.adapter, version) if version else None), version

    async def health(self) -> bool:
        return await self.http.ok("/health")

    async def aclose(self) -> None:
        await self.http.aclose()
