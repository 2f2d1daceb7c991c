"""Client of a SandboxFusion-compatible ``POST /run_code`` (the reward service's, by default).

Requests and replies are the contract's models (:mod:`dynamo_rl.contracts.reward`). An
unreachable or failing sandbox (connection errors, 429, 5xx, ``SandboxError``) is retried with the
project's back-off (:mod:`dynamo_rl.retry`) for ``max_wait_s``, then :class:`EnvUnavailable` is
raised: the rollout loop drops the episode and counts it. Calls of many episodes share one
connection pool and run concurrently.
"""

from __future__ import annotations

from collections.abc import Callable

import httpx

from dynamo_rl.contracts.reward import RunCodeRequest, RunCodeResponse
from dynamo_rl.envs.base import EnvUnavailable
from dynamo_rl.retry import Backoff, RetryPolicy, aretry_call

__all__ = ["SandboxClient", "SandboxDown"]


class SandboxDown(RuntimeError):
    """One failed attempt (retried)."""


class SandboxClient:
    def __init__(
        self,
        url: str,
        *,
        timeout_s: float = 30.0,
        backoff_s: float = 0.5,
        backoff_max_s: float = 10.0,
        max_wait_s: float = 30.0,
        on_retry: Callable[[str, float], None] | None = None,
    ) -> None:
        self.url = url.rstrip("/")
        self.retry = RetryPolicy(
            Backoff(backoff_s, backoff_max_s), max_wait_s=max_wait_s, on_retry=on_retry
        )
        self._client = httpx.AsyncClient(timeout=httpx.Timeout(timeout_s, connect=5.0))

    async def run(
        self, code: str, *, language: str = "python", run_timeout: float = 10.0
    ) -> RunCodeResponse:
        """Run ``code`` once; raises :class:`EnvUnavailable` once the retries are spent."""
        body = RunCodeRequest(code=code, language=language, run_timeout=run_timeout)  # type: ignore[arg-type]
        payload = body.model_dump(mode="json")

        async def once() -> RunCodeResponse:
            try:
                r = await self._client.post(f"{self.url}/run_code", json=payload)
            except httpx.TransportError as e:
                raise SandboxDown(f"{type(e).__name__}: {e}") from None
            if r.status_code == 429 or r.status_code >= 500:
                raise SandboxDown(f"HTTP {r.status_code}")
            r.raise_for_status()
            reply = RunCodeResponse.model_validate(r.json())
            if reply.status == "SandboxError":
                raise SandboxDown(f"SandboxError: {reply.message}")
            return reply

        retrying = self.retry.start(f"sandbox {self.url}")
        try:
            return await aretry_call(once, retry_on=(SandboxDown,), retrying=retrying)
        except SandboxDown as e:
            raise EnvUnavailable(f"sandbox {self.url}: {e}") from None

    async def aclose(self) -> None:
        await self._client.aclose()
