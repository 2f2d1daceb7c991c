"""The one retry policy: capped exponential back-off with jitter, in a sync and an async form.

Every component that waits out a peer (Redis, the allocator, the reward service, an engine, a
judge, a crashed child under ``up``) uses :class:`Backoff` for its delays, so a fleet that loses
the same peer at the same moment does not retry in lock-step, and no delay grows without bound.

- :meth:`Backoff.delay` is the delay before retry ``attempt`` (0-based): ``base · 2^attempt``,
  capped at ``cap``, then scaled by a random factor in ``[1 − jitter, 1]`` (so jitter only ever
  shortens a wait, never breaks the cap). A peer's own hint (HTTP ``Retry-After``) raises the delay
  to at least the hint, still bounded by ``hint_cap``.
- :class:`Retrying` is one operation's state: how often it has failed, since when, and whether it
  may try again (``max_attempts``, ``max_wait_s``); :meth:`Retrying.next_delay` returns the next
  delay or raises :class:`RetryExhausted` with the last reason.
- :class:`RetryPolicy` is a client's settings (back-off and limits), built once in its
  constructor from the keywords every client takes; its :meth:`~RetryPolicy.start` gives each
  operation a fresh :class:`Retrying`.
- :func:`retry_call` and :func:`aretry_call` wrap a call that raises a retryable exception.

Loops with more shape than "call, catch, sleep" (status codes, ``Retry-After``) use a
:class:`Retrying` directly and sleep on its delays.
"""

from __future__ import annotations

import asyncio
import logging
import random
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from typing import TypeVar

T = TypeVar("T")

log = logging.getLogger(__name__)


class RetryExhausted(Exception):
    """An operation ran out of attempts or of time; the message names it and the last reason."""


@dataclass(frozen=True)
class Backoff:
    """Delays of a capped, jittered exponential back-off."""

    base_s: float = 0.5
    """Delay before the first retry."""
    cap_s: float = 10.0
    """Longest delay the doubling reaches."""
    jitter: float = 0.2
    """Each delay is scaled by a random factor in ``[1 - jitter, 1]``."""
    hint_cap_s: float | None = None
    """Longest delay a peer's hint may ask for (default: 6 × ``cap_s``)."""

    def __post_init__(self) -> None:
        if self.base_s < 0 or self.cap_s < 0:
            raise ValueError(
                f"back-off delays must be >= 0, got base {self.base_s}, cap {self.cap_s}"
            )
        if self.base_s > self.cap_s:
            raise ValueError(f"back-off base ({self.base_s}) must be <= its cap ({self.cap_s})")
        if not 0 <= self.jitter < 1:
            raise ValueError(f"back-off jitter must be in [0, 1), got {self.jitter}")

    def delay(
        self, attempt: int, *, hint_s: float | None = None, rng: random.Random | None = None
    ) -> float:
        """The delay before retry ``attempt`` (0 for the first retry)."""
        raw = min(self.base_s * 2.0 ** min(attempt, 64), self.cap_s)
        factor = 1.0 - self.jitter * (rng or random).random()
        delay = raw * factor
        if hint_s is not None and hint_s > delay:
            hint_cap = self.hint_cap_s if self.hint_cap_s is not None else 6 * self.cap_s
            delay = min(hint_s, hint_cap)
        return delay


@dataclass
class Retrying:
    """One operation's retry state under a :class:`Backoff`."""

    what: str
    """Names the operation in messages ("reward service http://…", "redis")."""
    backoff: Backoff = field(default_factory=Backoff)
    max_attempts: int | None = None
    """Retries allowed (``None``: unbounded)."""
    max_wait_s: float | None = None
    """Seconds since the first failure after which no retry is made (``None``: unbounded)."""
    on_retry: Callable[[str, float], None] | None = None
    """Called with (reason, delay) before each wait — metrics and progress hooks."""
    rng: random.Random | None = None
    attempts: int = 0
    started: float | None = None

    def next_delay(self, reason: str, *, hint_s: float | None = None) -> float:
        """The delay before the next try, or :class:`RetryExhausted` if none is allowed."""
        now = time.monotonic()
        if self.started is None:
            self.started = now
        waited = now - self.started
        if self.max_attempts is not None and self.attempts >= self.max_attempts:
            raise RetryExhausted(f"{self.what}: gave up after {self.attempts} retries: {reason}")
        if self.max_wait_s is not None and waited > self.max_wait_s:
            raise RetryExhausted(f"{self.what}: unavailable for {waited:.0f}s: {reason}")
        delay = self.backoff.delay(self.attempts, hint_s=hint_s, rng=self.rng)
        self.attempts += 1
        log.warning("%s: %s; retry %d in %.2fs", self.what, reason, self.attempts, delay)
        if self.on_retry is not None:
            self.on_retry(reason, delay)
        return delay

    def reset(self) -> None:
        """Forget earlier failures (after a success, for a long-lived connection)."""
        self.attempts = 0
        self.started = None


@dataclass(frozen=True)
class RetryPolicy:
    """A client's retry settings, fixed when it is built; :meth:`start` gives each operation its
    own :class:`Retrying`. Every network client builds one in its constructor from the same
    keywords: ``Backoff(backoff_s, backoff_max_s)``, its limits and ``on_retry``."""

    backoff: Backoff = field(default_factory=Backoff)
    max_attempts: int | None = None
    """Retries allowed per operation (``None``: unbounded)."""
    max_wait_s: float | None = None
    """Seconds after an operation's first failure past which it is not retried (``None``: unbounded)."""
    on_retry: Callable[[str, float], None] | None = None
    """Called with (reason, delay) before each wait."""

    def start(self, what: str) -> Retrying:
        """A fresh retry state for one operation, named ``what`` in messages."""
        return Retrying(what, self.backoff, self.max_attempts, self.max_wait_s, self.on_retry)


def retry_call(
    call: Callable[[], T],
    *,
    retry_on: tuple[type[BaseException], ...] | Callable[[BaseException], bool],
    retrying: Retrying,
    sleep: Callable[[float], None] = time.sleep,
) -> T:
    """``call()`` until it returns, sleeping on ``retrying``'s delays after retryable errors.

    ``retry_on`` is a tuple of exception types or a predicate; anything else propagates, and so
    does the last error once the retries are exhausted (chained to :class:`RetryExhausted`).
    """
    while True:
        try:
            return call()
        except Exception as e:
            sleep(_delay_after(e, retry_on, retrying))


async def aretry_call(
    call: Callable[[], Awaitable[T]],
    *,
    retry_on: tuple[type[BaseException], ...] | Callable[[BaseException], bool],
    retrying: Retrying,
) -> T:
    """The async form of :func:`retry_call` (sleeps with ``asyncio.sleep``)."""
    while True:
        try:
            return await call()
        except Exception as e:  # CancelledError is a BaseException: never retried
            await asyncio.sleep(_delay_after(e, retry_on, retrying))


def _delay_after(
    e: Exception,
    retry_on: tuple[type[BaseException], ...] | Callable[[BaseException], bool],
    retrying: Retrying,
) -> float:
    """The wait before retrying after ``e``; ``e`` itself is raised if it is not retryable or
    the retries are spent (the caller's ``except`` block is still active, so its traceback holds)."""
    retryable = isinstance(e, retry_on) if isinstance(retry_on, tuple) else bool(retry_on(e))
    if not retryable:
        raise e
    try:
        return retrying.next_delay(_reason(e))
    except RetryExhausted:
        raise e from None


def _reason(e: BaseException) -> str:
    text = str(e).strip().splitlines()[0] if str(e).strip() else ""
    return f"{type(e).__name__}: {text[:200]}" if text else type(e).__name__
