"""Client of a SandboxFusion-compatible ``POST /run_code`` (the reward service's, by default).

Requests and replies are the contract's models (:mod:`dynamo_rl.contracts.reward`). An
unreachable or failing sandbox (connection errors, 429, 5xx, ``SandboxError``) is retried with the
project's back-off (:mod:`dynamo_rl.retry`, through the client base
:class:`dynamo_rl.clients.base.HttpClient`) for ``max_wait_s``, then :class:`EnvUnavailable` is
raised: the rollout loop drops the episode and counts it. Calls of many episodes share one
connection pool and run concurrently.
"""

from __future__ import annotations

import httpx

from dynamo_rl.clients.base import ClientSettings, HttpClient
from dynamo_rl.contracts.reward import RunCodeRequest, RunCodeResponse
from dynamo_rl.envs.base import EnvUnavailable

__all__ = ["SandboxClient", "SandboxDown"]


class SandboxDown(RuntimeError):
    """One failed attempt (retried)."""


class SandboxClient(HttpClient):
    """``POST /run_code`` of one sandbox URL; the keywords are :class:`~dynamo_rl.clients.base.
    Client`'s (``timeout_s``, ``backoff_s``, ``backoff_max_s``, ``max_wait_s``, ``on_retry``)."""

    peer = "sandbox"
    defaults = ClientSettings(timeout_s=30.0, backoff_s=0.5, backoff_max_s=10.0, max_wait_s=30.0)

    async def run(
        self, code: str, *, language: str = "python", run_timeout: float = 10.0
    ) -> RunCodeResponse:
        """Run ``code`` once; raises :class:`EnvUnavailable` once the retries are spent."""
        body = RunCodeRequest(code=code, language=language, run_timeout=run_timeout)  # type: ignore[arg-type]
        payload = body.model_dump(mode="json")

        async def once() -> RunCodeResponse:
            try:
                r = await self.http.post(f"{self.url}/run_code", json=payload)
            except httpx.TransportError as e:
                raise SandboxDown(f"{type(e).__name__}: {e}") from None
            if r.status_code == 429 or r.status_code >= 500:
                raise SandboxDown(f"HTTP {r.status_code}")
            r.raise_for_status()
            reply = RunCodeResponse.model_validate(r.json())
            if reply.status == "SandboxError":
                raise SandboxDown(f"SandboxError: {reply.message}")
            return reply

        try:
            return await self.acall(once, retry_on=(SandboxDown,))
        except SandboxDown as e:
            raise EnvUnavailable(f"sandbox {self.url}: {e}") from None
