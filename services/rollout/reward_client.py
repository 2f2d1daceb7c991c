"""Client of the reward service's ``POST /v1/verify`` (``docs/contracts.md``).

Nothing may reach the stream unscored, so an unreachable or busy service (connection refused,
timeout, 429, 5xx) is retried with the project's back-off (the client base
:class:`dynamo_rl.clients.base.HttpClient`: ``backoff_s`` doubling up to ``backoff_max_s``,
jittered) — a ``Retry-After`` raises a delay to
the hint, up to 6 × ``backoff_max_s`` — until it answers, or until ``max_wait_s`` when set. Any other 4xx is a bug in the request and raised at once.
Results are matched to items by id, not position, and a reply missing an item is an error.
Requests are built and replies parsed with the models of :mod:`dynamo_rl.contracts.reward`, the
ones the service itself validates with; a reply that does not fit them is an error too.
"""

from __future__ import annotations

import asyncio
import math
from collections.abc import Sequence
from typing import Any

import httpx
from pydantic import ValidationError

from dynamo_rl.clients.base import ClientSettings, HttpClient
from dynamo_rl.contracts.reward import Health, ItemResult, VerifyItem, VerifyRequest, VerifyResponse
from dynamo_rl.retry import RetryExhausted

__all__ = ["RewardClient", "RewardRequestError", "RewardUnavailable"]

RETRYABLE_STATUS = frozenset({408, 429, 500, 502, 503, 504})


class RewardUnavailable(RuntimeError):
    """The reward service did not answer within ``max_wait_s``."""


class RewardRequestError(RuntimeError):
    """The reward service refused the request (4xx other than 408/429)."""


class RewardClient(HttpClient):
    """``POST /v1/verify`` of one reward service; the keywords are :class:`~dynamo_rl.clients.
    base.Client`'s, where ``max_wait_s`` 0 means no limit (``rollout.reward_max_wait_s``), plus
    ``batch_items``, the most items per request."""

    peer = "reward service"
    defaults = ClientSettings(timeout_s=120.0, backoff_s=0.5, backoff_max_s=10.0)

    def __init__(
        self, url: str, *, batch_items: int = 256, max_wait_s: float | None = None, **settings: Any
    ) -> None:
        super().__init__(url, max_wait_s=max_wait_s or math.inf, **settings)
        self.batch_items = batch_items
        self.max_wait_s = max_wait_s or 0.0

    async def _post(self, items: list[VerifyItem]) -> list[ItemResult]:
        body = VerifyRequest(items=items).model_dump(mode="json", exclude_unset=True)
        retrying = self.retrying()
        while True:
            reason: str
            retry_after: float | None = None
            try:
                response = await self.http.post(f"{self.url}/v1/verify", json=body)
            except httpx.HTTPError as e:
                reason = f"{type(e).__name__}: {e}"
            else:
                if response.status_code == 200:
                    return self._results(response.json(), items)
                if response.status_code not in RETRYABLE_STATUS:
                    raise RewardRequestError(
                        f"{self.url}/v1/verify answered {response.status_code}: "
                        f"{response.text[:500]}"
                    )
                reason = f"HTTP {response.status_code}"
                retry_after = _seconds(response.headers.get("retry-after"))
            try:
                delay = retrying.next_delay(reason, hint_s=retry_after)
            except RetryExhausted as e:
                raise RewardUnavailable(
                    f"{e} (rollout.reward_max_wait_s={self.max_wait_s})"
                ) from None
            await asyncio.sleep(delay)

    def _results(self, body: Any, items: Sequence[VerifyItem]) -> list[ItemResult]:
        try:
            results = VerifyResponse.model_validate(body).results
        except ValidationError as e:
            raise RewardRequestError(
                f"{self.url}/v1/verify reply does not fit the contract: {e}"
            ) from None
        by_id = {str(r.id): r for r in results}
        missing = [it.id for it in items if str(it.id) not in by_id]
        if missing:
            raise RewardRequestError(
                f"reward service reply lacks {len(missing)} of {len(items)} items, e.g. {missing[0]}"
            )
        return [by_id[str(it.id)] for it in items]

    async def verify(self, items: Sequence[VerifyItem]) -> list[ItemResult]:
        """One result per item, in item order (items need unique ids)."""
        chunks = [
            list(items[i : i + self.batch_items]) for i in range(0, len(items), self.batch_items)
        ]
        parts = await asyncio.gather(*(self._post(c) for c in chunks))
        return [r for part in parts for r in part]

    async def health(self) -> Health:
        """``GET /healthz`` once (no retries): what the service scores."""
        response = await self.http.get(f"{self.url}/healthz")
        response.raise_for_status()
        return Health.model_validate(response.json())


def _seconds(header: str | None) -> float | None:
    """A ``Retry-After`` in seconds (the HTTP-date form is not used by our services)."""
    if not header:
        return None
    try:
        return max(0.0, float(header))
    except ValueError:
        return None
