"""A small, thread-safe Python client for the allocator's gRPC service (``dynamo.v1.Allocator``).

It lives in the shared package beside its contract (:mod:`dynamo_rl.contracts.allocator`), so the
rollout worker — or any other framework — reaches the allocator without importing the allocator's
package. It adds what every caller needs around the generated stub: a deadline on every call,
``retries`` retries on ``UNAVAILABLE`` (the server or its Redis is briefly gone) with the project's
capped, jittered back-off (the client base :class:`dynamo_rl.clients.base.Client`: ``backoff_s``
doubling up to ``backoff_max_s``), and a bound on the calls in flight so a burst of rollout workers
cannot pile unbounded work onto one server. Any other error (``INVALID_ARGUMENT`` above all) is
raised at once: retrying a bad request cannot help.

The calls of a rollout worker have async forms (``aallocate``, ``areport_outcomes``): each attempt
runs in a worker thread, but the back-off between attempts is an ``asyncio.sleep``, so no thread is
held while the client waits.

After the retries are spent the ``grpc.RpcError`` propagates; callers fall back to uniform counts.
Note that a retried ``report_outcomes`` may count a batch twice in the rare case where Redis applied
it and the reply was lost; statistics are estimates, so that is preferred to losing outcomes.

Requests are built by :func:`allocate_request` from the parameters of the shared
:class:`dynamo_rl.contracts.allocator.AllocationParams` (the fields a request may set), replies
read by :func:`allocation_result`; ``allocate`` and ``aallocate`` only differ in how they wait.

It imports nothing of the server (no numpy, no Redis), so any framework can use it.
"""

from __future__ import annotations

import asyncio
import json
import threading
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import Any

import grpc

from dynamo_rl.clients.base import Client, ClientSettings
from dynamo_rl.contracts.allocator import CONFIG_ONLY, REQUEST_FIELDS
from dynamo_rl.proto.dynamo.v1 import allocator_pb2 as pb
from dynamo_rl.proto.dynamo.v1 import allocator_pb2_grpc as pb_grpc

__all__ = [
    "AllocationResult",
    "AllocatorClient",
    "PromptStats",
    "allocate_request",
    "allocation_result",
]

Param = float | str | None
"""A request parameter's value: ``budget``, ``n_min``, ... (int or float), ``priority``, ``scheme``."""


@dataclass(frozen=True)
class AllocationResult:
    """Counts per prompt (request order) and the priority behind each."""

    counts: list[int]
    """Responses to sample per prompt, one per prompt id, same order; sums to ``budget``."""
    priorities: list[float]
    """Priority per prompt; -1.0 while a prompt is still explored."""
    budget: int
    """The budget actually shared out (the requested one clipped to [N·n_min, N·n_max])."""


@dataclass(frozen=True)
class PromptStats:
    """One prompt's statistics (floats: with decay < 1 old counts are scaled down)."""

    prompt_id: str
    samples: float
    successes: float
    updated_unix: float
    """When outcomes were last reported (0 for a prompt never reported)."""


class AllocatorClient(Client):
    """Client of one allocator server; share one instance between threads.

    The keywords are :class:`~dynamo_rl.clients.base.Client`'s (``timeout_s``, ``retries``,
    ``backoff_s``, ``backoff_max_s``, ``on_retry``; ``max_wait_s`` too), plus ``max_in_flight``
    (calls in flight at once) and ``control_token`` (sent as a bearer token)."""

    peer = "allocator"
    defaults = ClientSettings(timeout_s=5.0, backoff_s=0.1, backoff_max_s=2.0, retries=3)

    def __init__(
        self,
        addr: str,
        *,
        max_in_flight: int = 256,
        control_token: str | None = None,
        **settings: Any,
    ) -> None:
        if max_in_flight < 1:
            raise ValueError(f"max_in_flight must be >= 1, got {max_in_flight}")
        self._slots = threading.BoundedSemaphore(max_in_flight)
        self._control_token = control_token
        super().__init__(addr, **settings)
        self.addr = self.address
        self.retries = self.settings.retries

    def open(self) -> None:
        # Large batches (tens of thousands of prompt ids) exceed gRPC's 4 MB default.
        options = [
            ("grpc.max_send_message_length", 64 * 1024 * 1024),
            ("grpc.max_receive_message_length", 64 * 1024 * 1024),
        ]
        self._channel = grpc.insecure_channel(self.address, options=options)
        self._stub = pb_grpc.AllocatorStub(self._channel)

    # -- calls -------------------------------------------------------------------------------

    def allocate(
        self,
        namespace: str,
        prompt_ids: Sequence[str],
        n_per_prompt: int | None = None,
        **params: Param,
    ) -> AllocationResult:
        """Counts per prompt for a batch; give ``n_per_prompt`` or ``budget=`` (not both).

        ``params``: ``budget`` and any of the request's parameters (``n_min``, ``n_max``,
        ``initial_budget``, ``mastery_threshold``, ``min_priority``, ``priority``, ``scheme``:
        :data:`~dynamo_rl.contracts.allocator.REQUEST_FIELDS`); unset or ``None`` ones take the
        server's configured defaults. See :func:`allocate_request`.
        """
        request = allocate_request(namespace, prompt_ids, n_per_prompt, **params)
        return allocation_result(self._call("Allocate", request))

    async def aallocate(self, *args: Any, **params: Param) -> AllocationResult:
        """:meth:`allocate` for an event loop, with the same arguments (back-off sleeps hold no
        thread)."""
        request = allocate_request(*args, **params)
        return allocation_result(await self._acall("Allocate", request))

    def report_outcomes(self, namespace: str, outcomes: Iterable[tuple[str, int, int]]) -> int:
        """Add ``(prompt_id, attempts, successes)`` per prompt; returns how many prompts changed."""
        request = _report_request(namespace, outcomes)
        return int(self._call("ReportOutcomes", request).prompts_updated)

    async def areport_outcomes(
        self, namespace: str, outcomes: Iterable[tuple[str, int, int]]
    ) -> int:
        """:meth:`report_outcomes` for an event loop (back-off sleeps hold no thread)."""
        request = _report_request(namespace, outcomes)
        return int((await self._acall("ReportOutcomes", request)).prompts_updated)

    def get_stats(self, namespace: str, prompt_ids: Sequence[str]) -> list[PromptStats]:
        """Statistics per prompt, in request order (zeros for a prompt never reported)."""
        reply = self._call(
            "GetStats", pb.GetStatsRequest(namespace=namespace, prompt_ids=prompt_ids)
        )
        return [
            PromptStats(s.prompt_id, s.samples, s.successes, s.updated_unix) for s in reply.stats
        ]

    def reset_namespace(self, namespace: str) -> int:
        """Delete a namespace's statistics; returns how many prompts had some."""
        reply = self._call("ResetNamespace", pb.ResetNamespaceRequest(namespace=namespace))
        return int(reply.prompts_removed)

    def export_namespace(self, namespace: str) -> dict[str, Any]:
        """Every statistic of a namespace, as the parsed JSON document."""
        reply = self._call("ExportNamespace", pb.ExportNamespaceRequest(namespace=namespace))
        return dict(json.loads(reply.json))

    # -- plumbing ----------------------------------------------------------------------------

    def _attempt(self, method: str, request: Any) -> Any:
        metadata = []
        if self._control_token:
            metadata.append(("authorization", f"Bearer {self._control_token}"))
        # A slot per attempt: a call waiting out its back-off holds none.
        with self._slots:
            call = getattr(self._stub, method)
            return call(request, timeout=self.timeout_s, metadata=metadata or None)

    def _call(self, method: str, request: Any) -> Any:
        return self.call(
            lambda: self._attempt(method, request), retry_on=_unavailable, operation=method
        )

    async def _acall(self, method: str, request: Any) -> Any:
        return await self.acall(
            lambda: asyncio.to_thread(self._attempt, method, request),
            retry_on=_unavailable,
            operation=method,
        )

    def close(self) -> None:
        self._channel.close()

    def __enter__(self) -> AllocatorClient:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def _unavailable(e: BaseException) -> bool:
    """Retry only ``UNAVAILABLE``: the server or its Redis is briefly gone."""
    return isinstance(e, grpc.RpcError) and (
        getattr(e, "code", None) is not None and e.code() == grpc.StatusCode.UNAVAILABLE
    )


def allocate_request(
    namespace: str,
    prompt_ids: Sequence[str],
    n_per_prompt: int | None = None,
    *,
    budget: int | None = None,
    **params: Param,
) -> pb.AllocateRequest:
    """The ``AllocateRequest`` of a batch: its total (``n_per_prompt`` or ``budget``, not both) and
    any parameter of :data:`~dynamo_rl.contracts.allocator.REQUEST_FIELDS`; ``None`` leaves a field
    unset, so the server takes its configured default. Values are not checked here: the server
    validates them against its config (``INVALID_ARGUMENT`` naming the field)."""
    if n_per_prompt is not None and budget is not None:
        raise ValueError("give n_per_prompt or budget, not both")
    unknown = sorted(set(params) - set(REQUEST_FIELDS))
    if unknown:
        raise TypeError(
            f"allocate: no request parameter {', '.join(unknown)} "
            f"(allowed: budget, {', '.join(REQUEST_FIELDS)}; {', '.join(CONFIG_ONLY)} are the "
            "server's config)"
        )
    fields = {name: value for name, value in params.items() if value is not None}
    if n_per_prompt is not None:
        fields["n_per_prompt"] = n_per_prompt
    if budget is not None:
        fields["budget"] = budget
    return pb.AllocateRequest(namespace=namespace, prompt_ids=list(prompt_ids), **fields)


def allocation_result(reply: pb.AllocateResponse) -> AllocationResult:
    """The reply of ``Allocate`` as an :class:`AllocationResult`."""
    return AllocationResult(
        counts=list(reply.counts), priorities=list(reply.priorities), budget=reply.budget
    )


def _report_request(
    namespace: str, outcomes: Iterable[tuple[str, int, int]]
) -> pb.ReportOutcomesRequest:
    return pb.ReportOutcomesRequest(
        namespace=namespace,
        # Dicts, not Outcome objects: protobuf builds them about twice as fast.
        outcomes=[
            {"prompt_id": pid, "attempts": int(a), "successes": int(s)} for pid, a, s in outcomes
        ],
    )
