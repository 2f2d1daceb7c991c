"""The one way to make a Redis client: one set of timeouts, and URLs redacted wherever they are logged.

Every process that talks to Redis (allocator, rollout workers, engines' registry, learner,
dashboard, ``up``'s health probe) calls :func:`sync_client` or :func:`async_client`:

- ``connect_timeout_s`` (2 s) bounds reaching the server, ``timeout_s`` (5 s) every command; a
  blocking read (``XREADGROUP BLOCK``) passes ``block_s`` so its socket waits that much longer
  instead of timing out under it;
- ``retries`` > 0 makes redis-py itself reconnect and repeat a failed command, with delays from the
  project's one :class:`~dynamo_rl.retry.Backoff` — for callers whose every command is safe to
  repeat (the learner); others retry at a higher level with :mod:`dynamo_rl.retry`;
- clients return raw bytes: stream payloads are protobuf, not text.

:func:`redact_url` drops the password from a URL; log lines name Redis only through it.
"""

from __future__ import annotations

from typing import Any, TypedDict, Unpack
from urllib.parse import urlsplit, urlunsplit

from dynamo_rl.retry import Backoff

CONNECT_TIMEOUT_S = 2.0
TIMEOUT_S = 5.0
HEALTH_CHECK_INTERVAL_S = 30


def redact_url(url: str) -> str:
    """``url`` with its password replaced by ``***`` (for logs and messages)."""
    try:
        parts = urlsplit(url)
        password = parts.password
    except ValueError:  # unparseable: say nothing of it rather than leak it
        return "<unparseable redis url>"
    if not password:
        return url
    host = parts.hostname or ""
    if ":" in host:  # IPv6 literal
        host = f"[{host}]"
    netloc = f"{parts.username or ''}:***@{host}"
    if parts.port:
        netloc += f":{parts.port}"
    return urlunsplit(parts._replace(netloc=netloc))


class _RedisBackoff:
    """redis-py's back-off interface over the project's :class:`Backoff`."""

    def __init__(self, backoff: Backoff) -> None:
        self.backoff = backoff

    def reset(self) -> None:
        pass

    def compute(self, failures: int) -> float:
        return self.backoff.delay(max(failures - 1, 0))


class ClientOptions(TypedDict, total=False):
    """The keyword options of :func:`sync_client` and :func:`async_client` (see the module
    docstring)."""

    timeout_s: float | None
    """Deadline of every command (None: ``TIMEOUT_S``)."""
    block_s: float
    """How much longer than ``timeout_s`` a blocking read may wait (default 0)."""
    retries: int
    """Times redis-py repeats a command that failed to connect or timed out (default 0)."""
    backoff: Backoff | None
    """Delays between those repeats (None: 0.25 s doubling up to 5 s)."""


def _options(
    retry_cls: Any,
    timeout_s: float | None = None,
    block_s: float = 0.0,
    retries: int = 0,
    backoff: Backoff | None = None,
) -> dict[str, Any]:
    import redis

    opts: dict[str, Any] = {
        "socket_connect_timeout": CONNECT_TIMEOUT_S,
        "socket_timeout": (timeout_s if timeout_s is not None else TIMEOUT_S) + block_s,
        "health_check_interval": HEALTH_CHECK_INTERVAL_S,
    }
    if retries > 0:
        policy = backoff or Backoff(base_s=0.25, cap_s=5.0)
        opts["retry"] = retry_cls(_RedisBackoff(policy), retries=retries)
        opts["retry_on_error"] = [redis.ConnectionError, redis.TimeoutError]
    return opts


def sync_client(url: str, **options: Unpack[ClientOptions]) -> Any:
    """A ``redis.Redis`` for ``url`` with the project's timeouts (see the module docstring)."""
    import redis
    from redis.retry import Retry

    return redis.Redis.from_url(url, **_options(Retry, **options))


def async_client(url: str, **options: Unpack[ClientOptions]) -> Any:
    """A ``redis.asyncio.Redis`` for ``url`` with the project's timeouts."""
    import redis.asyncio as aioredis
    from redis.asyncio.retry import Retry

    return aioredis.Redis.from_url(url, **_options(Retry, **options))
