"""The small interfaces every inference engine client implements, and the errors they raise.

- :class:`Engine` generates ``n`` samples for one tokenised prompt, each with its token ids and the
  log-probability the engine sampled it with, and tells its weight version. How to sample is a
  :class:`~dynamo_rl.contracts.sampling.SamplingParams`, the one declaration of the sampling
  settings (``rollout.sampling`` is one); each client turns it into its API's request body.

Requests and answers are the models of :mod:`dynamo_rl.contracts.engine`; weight control
(versions, pushes) is :mod:`dynamo_rl.contracts.weight_control`.

Errors say what the caller should do: :class:`EngineUnavailable` means "try another replica or wait"
(connection refused, timeout, 5xx, 429); :class:`EngineRequestError` means the request itself is
wrong (4xx) and no replica will accept it; :class:`EngineProtocolError` means the engine answered
something this client cannot use (a missing field, mismatched lengths).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Protocol, runtime_checkable

from dynamo_rl.contracts.sampling import SamplingParams

__all__ = [
    "Engine",
    "EngineError",
    "EngineProtocolError",
    "EngineRequestError",
    "EngineUnavailable",
    "Sample",
]


class EngineError(Exception):
    """Base of every engine client error."""


class EngineUnavailable(EngineError):
    """The replica cannot serve now (down, overloaded, timed out): retry elsewhere or later."""


class EngineRequestError(EngineError):
    """The engine refused the request as invalid (HTTP 4xx); retrying cannot help."""

    def __init__(self, url: str, status: int, detail: object) -> None:
        super().__init__(f"{url}: HTTP {status}: {detail}")
        self.url = url
        self.status = status
        self.detail = detail


class EngineProtocolError(EngineError):
    """The engine's answer lacks what this client needs (wrong API or version)."""


@dataclass
class Sample:
    """One generated response."""

    token_ids: list[int]
    logprobs: list[float]
    """Log-probability of each sampled token under the weights that sampled it."""
    text: str
    finish_reason: str
    """"stop" | "length" | "abort"."""
    weight_version: int | None = None
    """The weight version that sampled it (its oldest token's), when the engine tells."""
    engine_url: str = field(default="", compare=False)
    weight_versions: list[int] | None = None
    """The weight version of each token, when the engine reports them (the embedded engine) or
    the client knows them (a response continued across an update); None: ``weight_version``."""

    def token_versions(self) -> list[int | None]:
        """One version per token: ``weight_versions``, else ``weight_version`` for each."""
        if self.weight_versions is not None:
            return list(self.weight_versions)
        return [self.weight_version] * len(self.token_ids)


@runtime_checkable
class Engine(Protocol):
    """A client of one inference engine replica."""

    url: str

    async def generate(
        self, prompt_token_ids: Sequence[int], n: int, sampling: SamplingParams
    ) -> list[Sample]:
        """``n`` samples for one prompt given as token ids."""
        ...

    async def weight_version(self) -> int:
        """The weight version the engine serves now."""
        ...

    async def health(self) -> bool:
        """True when the engine answers its health check."""
        ...

    async def aclose(self) -> None: ...
