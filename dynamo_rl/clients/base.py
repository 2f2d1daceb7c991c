"""One base for the project's network clients: address, deadline, back-off and retry limits.

A client class names its peer (``peer``, for messages) and its defaults (``defaults``, a
:class:`ClientSettings`); the constructor of :class:`Client` takes the address and any of the
same keywords — ``timeout_s``, ``backoff_s``, ``backoff_max_s``, ``retries``, ``max_wait_s`` (each
``None``: the class's default) and ``on_retry`` — checks them, and builds the one retry policy
(:class:`dynamo_rl.retry.RetryPolicy`: ``Backoff(backoff_s, backoff_max_s)`` doubling with jitter,
at most ``retries`` retries and ``max_wait_s`` seconds of retrying per call). Every call of the
client retries through :meth:`Client.call` / :meth:`Client.acall`, or through a
:meth:`Client.retrying` state when its loop has more shape (HTTP status codes, ``Retry-After``).

:class:`HttpClient` adds what an HTTP client needs: the base URL without its trailing slash and one
pooled ``httpx.AsyncClient`` whose read timeout is ``timeout_s`` (connect: 5 s), closed by
:meth:`HttpClient.aclose`. The allocator's gRPC client (:mod:`dynamo_rl.clients.allocator`) builds
its channel on :class:`Client` itself.
"""

from __future__ import annotations

import math
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, replace
from typing import ClassVar, TypeVar

import httpx

from dynamo_rl.retry import Backoff, Retrying, RetryPolicy, aretry_call, retry_call

__all__ = ["CONNECT_TIMEOUT_S", "Client", "ClientSettings", "HttpClient"]

T = TypeVar("T")
RetryOn = tuple[type[BaseException], ...] | Callable[[BaseException], bool]

CONNECT_TIMEOUT_S = 5.0
"""An HTTP client's connect timeout (its read timeout is ``timeout_s``)."""


@dataclass(frozen=True)
class ClientSettings:
    """A client's deadline and retry limits (its class's defaults, or a constructor's)."""

    timeout_s: float
    """Deadline of one attempt."""
    backoff_s: float
    """Delay before the first retry; doubles per retry."""
    backoff_max_s: float
    """Longest delay."""
    retries: int | None = None
    """Retries per call after the first attempt (``None``: no limit by count)."""
    max_wait_s: float = math.inf
    """Seconds of retrying per call, from its first failure (``inf``: no limit by time)."""

    def __post_init__(self) -> None:
        if not self.timeout_s > 0:
            raise ValueError(f"timeout_s must be > 0, got {self.timeout_s}")
        if self.retries is not None and self.retries < 0:
            raise ValueError(f"retries must be >= 0, got {self.retries}")
        if not self.max_wait_s >= 0:
            raise ValueError(f"max_wait_s must be >= 0, got {self.max_wait_s}")
        Backoff(self.backoff_s, self.backoff_max_s)  # its own checks, naming the delays

    def policy(self, on_retry: Callable[[str, float], None] | None = None) -> RetryPolicy:
        """The retry policy these settings describe."""
        return RetryPolicy(
            Backoff(self.backoff_s, self.backoff_max_s),
            max_attempts=self.retries,
            max_wait_s=None if math.isinf(self.max_wait_s) else self.max_wait_s,
            on_retry=on_retry,
        )


class Client:
    """A client of one peer at one address; subclasses set ``peer`` and ``defaults``."""

    peer: ClassVar[str] = "peer"
    """Names the peer in retry messages ("allocator", "reward service", "sandbox")."""
    defaults: ClassVar[ClientSettings]

    def __init__(
        self,
        address: str,
        *,
        timeout_s: float | None = None,
        backoff_s: float | None = None,
        backoff_max_s: float | None = None,
        retries: int | None = None,
        max_wait_s: float | None = None,
        on_retry: Callable[[str, float], None] | None = None,
    ) -> None:
        given = {
            "timeout_s": timeout_s,
            "backoff_s": backoff_s,
            "backoff_max_s": backoff_max_s,
            "retries": retries,
            "max_wait_s": max_wait_s,
        }
        self.address = self.normalise(address)
        self.settings = replace(self.defaults, **{k: v for k, v in given.items() if v is not None})
        self.timeout_s = self.settings.timeout_s
        self.retry = self.settings.policy(on_retry)
        self.open()

    @staticmethod
    def normalise(address: str) -> str:
        """The address as the client keeps it."""
        return address

    def open(self) -> None:
        """Make the connection state (a pool, a channel) once the settings are known."""

    def retrying(self, operation: str = "") -> Retrying:
        """A fresh retry state for one call, named ``<peer> <address> [operation]``."""
        return self.retry.start(" ".join(x for x in (self.peer, self.address, operation) if x))

    def call(self, attempt: Callable[[], T], *, retry_on: RetryOn, operation: str = "") -> T:
        """``attempt()`` until it returns, retrying the errors ``retry_on`` admits."""
        return retry_call(attempt, retry_on=retry_on, retrying=self.retrying(operation))

    async def acall(
        self, attempt: Callable[[], Awaitable[T]], *, retry_on: RetryOn, operation: str = ""
    ) -> T:
        """:meth:`call` for a coroutine; the back-off is an ``asyncio.sleep`` (no thread held)."""
        return await aretry_call(attempt, retry_on=retry_on, retrying=self.retrying(operation))


class HttpClient(Client):
    """A :class:`Client` of an HTTP peer: ``url`` (no trailing slash) and one connection pool."""

    @staticmethod
    def normalise(address: str) -> str:
        return address.rstrip("/")

    def open(self) -> None:
        self.http = httpx.AsyncClient(
            timeout=httpx.Timeout(self.timeout_s, connect=CONNECT_TIMEOUT_S)
        )

    @property
    def url(self) -> str:
        """The base URL (the address)."""
        return self.address

    async def aclose(self) -> None:
        await self.http.aclose()
