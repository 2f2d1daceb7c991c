"""The gRPC service ``dynamo.v1.Allocator``: Dynamic Rollout Allocation over Redis statistics.

Each request is validated first; a bad one gets ``INVALID_ARGUMENT`` with a message that names the
field (``n_min``, ``outcomes[3].successes``, ...). Redis errors become ``UNAVAILABLE``: the server
keeps running, and redis-py reconnects on the next call, so it recovers as soon as Redis is back
(the Lua script is reloaded if the new Redis lost it).

Health: the standard ``grpc.health.v1.Health`` service reports the overall server (``""``) as
SERVING while the process runs, and ``dynamo.v1.Allocator`` as SERVING only while Redis answers (a
background ping every second, and every request's outcome). Server reflection is on, so
``grpcurl`` works without the .proto files.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable
from concurrent import futures
from typing import Any, TypeVar

import grpc
import redis
from google.protobuf.message import DecodeError
from grpc_health.v1 import health, health_pb2, health_pb2_grpc
from grpc_reflection.v1alpha import reflection

from allocator.algorithm import PRIORITIES, SCHEMES, allocate_rollouts
from allocator.metrics import AllocatorMetrics
from allocator.stats import StatsStore
from dynamo_rl.config import AllocatorConfig
from dynamo_rl.keys import stats_key
from dynamo_rl.proto.dynamo.v1 import allocator_pb2 as pb
from dynamo_rl.proto.dynamo.v1 import allocator_pb2_grpc as pb_grpc

__all__ = ["SERVICE_NAME", "AllocatorService", "BadRequest", "RunningServer", "start_server"]

log = logging.getLogger("dynamo_rl.allocator")

SERVICE_NAME = pb.DESCRIPTOR.services_by_name["Allocator"].full_name
MAX_MESSAGE_BYTES = 64 * 1024 * 1024
REDIS_ERRORS = (redis.exceptions.ConnectionError, redis.exceptions.TimeoutError)

Req = TypeVar("Req")


class BadRequest(ValueError):
    """A request that can never succeed; the message names the field."""


def _namespace(value: str) -> str:
    if not value:
        raise BadRequest("namespace: empty; give a dataset or experiment name")
    try:
        stats_key(value)
    except ValueError as e:
        raise BadRequest(f"namespace: {e}") from None
    return value


def _prompt_ids(ids: list[str], limit: int, field: str = "prompt_ids") -> list[str]:
    if len(ids) > limit:
        raise BadRequest(
            f"{field}: {len(ids)} entries, more than allocator.max_prompts_per_request={limit}"
        )
    if len(set(ids)) != len(ids):
        seen: dict[str, int] = {}
        for i, pid in enumerate(ids):
            if pid in seen:
                raise BadRequest(
                    f"{field}[{i}]: duplicate prompt id {pid!r} (also at index {seen[pid]})"
                )
            seen[pid] = i
    for i, pid in enumerate(ids):
        if not pid:
            raise BadRequest(f"{field}[{i}]: empty prompt id")
        if "\0" in pid:
            raise BadRequest(f"{field}[{i}]: prompt id {pid!r} contains a NUL character")
    return ids


class AllocatorService(pb_grpc.AllocatorServicer):
    """Handlers of ``dynamo.v1.Allocator``; thread-safe (shared by the server's pool)."""

    def __init__(
        self,
        cfg: AllocatorConfig,
        store: StatsStore,
        metrics: AllocatorMetrics,
        health_servicer: health.HealthServicer | None = None,
        control_token: str | None = None,
    ) -> None:
        self.cfg = cfg
        self.store = store
        self.m = metrics
        self.health = health_servicer
        self.control_token = control_token
        self._redis_ok: bool | None = None
        self._lock = threading.Lock()

    # -- RPCs --------------------------------------------------------------------------------

    def Allocate(self, request: pb.AllocateRequest, context: grpc.ServicerContext) -> Any:
        return self._handle("Allocate", self._allocate, request, context)

    def ReportOutcomes(
        self, request: pb.ReportOutcomesRequest, context: grpc.ServicerContext
    ) -> Any:
        return self._handle("ReportOutcomes", self._report, request, context)

    def GetStats(self, request: pb.GetStatsRequest, context: grpc.ServicerContext) -> Any:
        return self._handle("GetStats", self._get_stats, request, context)

    def ResetNamespace(
        self, request: pb.ResetNamespaceRequest, context: grpc.ServicerContext
    ) -> Any:
        return self._handle("ResetNamespace", self._reset, request, context)

    def ExportNamespace(
        self, request: pb.ExportNamespaceRequest, context: grpc.ServicerContext
    ) -> Any:
        return self._handle("ExportNamespace", self._export, request, context)

    # -- implementations ---------------------------------------------------------------------

    def _allocate(
        self, req: pb.AllocateRequest, context: grpc.ServicerContext
    ) -> pb.AllocateResponse:
        cfg = self.cfg
        namespace = _namespace(req.namespace)
        ids = _prompt_ids(list(req.prompt_ids), cfg.max_prompts_per_request)
        n = len(ids)
        n_min = req.n_min if req.HasField("n_min") else cfg.n_min
        n_max = req.n_max if req.HasField("n_max") else cfg.n_max
        if n_min < 0:
            raise BadRequest(f"n_min: must be >= 0, got {n_min}")
        if n_max < 1:
            raise BadRequest(f"n_max: must be >= 1, got {n_max}")
        if n_min > n_max:
            raise BadRequest(f"n_min: {n_min} is greater than n_max {n_max}")
        which = req.WhichOneof("total")
        if which == "budget":
            if req.budget < 0:
                raise BadRequest(f"budget: must be >= 0, got {req.budget}")
            budget = req.budget
        elif which == "n_per_prompt":
            if req.n_per_prompt < 1:
                raise BadRequest(f"n_per_prompt: must be >= 1, got {req.n_per_prompt}")
            budget = req.n_per_prompt * n
        else:
            budget = cfg.n_per_prompt * n
        initial_budget = (
            req.initial_budget if req.HasField("initial_budget") else cfg.initial_budget
        )
        if initial_budget < 0:
            raise BadRequest(f"initial_budget: must be >= 0, got {initial_budget}")
        mastery = (
            req.mastery_threshold if req.HasField("mastery_threshold") else cfg.mastery_threshold
        )
        if not 0 < mastery <= 1:
            raise BadRequest(f"mastery_threshold: must be in (0, 1], got {mastery}")
        min_priority = req.min_priority if req.HasField("min_priority") else cfg.min_priority
        if not 0 <= min_priority <= 1:
            raise BadRequest(f"min_priority: must be in [0, 1], got {min_priority}")
        priority = req.priority or cfg.priority
        if priority not in PRIORITIES:
            raise BadRequest(f"priority: {priority!r} is not one of {', '.join(PRIORITIES)}")
        scheme = req.scheme or cfg.scheme
        if scheme not in SCHEMES:
            raise BadRequest(f"scheme: {scheme!r} is not one of {', '.join(SCHEMES)}")

        stats = self.store.get(namespace, ids)
        counts, priorities = allocate_rollouts(
            stats.samples,
            stats.successes,
            budget,
            n_min=n_min,
            n_max=n_max,
            initial_budget=initial_budget,
            mastery_threshold=mastery,
            min_priority=min_priority,
            priority=priority,  # type: ignore[arg-type]
            scheme=scheme,  # type: ignore[arg-type]
            return_priorities=True,
        )
        total = int(counts.sum())
        self.m.observe_allocation(total, counts, priorities)
        return pb.AllocateResponse(
            counts=counts.tolist(), priorities=priorities.tolist(), budget=total
        )

    def _report(
        self, req: pb.ReportOutcomesRequest, context: grpc.ServicerContext
    ) -> pb.ReportOutcomesResponse:
        namespace = _namespace(req.namespace)
        outcomes = req.outcomes
        _prompt_ids([o.prompt_id for o in outcomes], self.cfg.max_prompts_per_request, "outcomes")
        rows: list[tuple[str, int, int]] = []
        samples = 0
        for i, o in enumerate(outcomes):
            if o.attempts < 0:
                raise BadRequest(f"outcomes[{i}].attempts: must be >= 0, got {o.attempts}")
            if o.successes < 0:
                raise BadRequest(f"outcomes[{i}].successes: must be >= 0, got {o.successes}")
            if o.successes > o.attempts:
                raise BadRequest(
                    f"outcomes[{i}].successes: {o.successes} is more than attempts {o.attempts} "
                    f"(prompt {o.prompt_id!r})"
                )
            rows.append((o.prompt_id, o.attempts, o.successes))
            samples += o.attempts
        updated = self.store.report(namespace, rows)
        self.m.outcomes.inc(len(rows))
        self.m.samples_reported.inc(samples)
        return pb.ReportOutcomesResponse(ok=True, prompts_updated=updated)

    def _get_stats(
        self, req: pb.GetStatsRequest, context: grpc.ServicerContext
    ) -> pb.GetStatsResponse:
        namespace = _namespace(req.namespace)
        ids = _prompt_ids(list(req.prompt_ids), self.cfg.max_prompts_per_request)
        stats = self.store.get(namespace, ids)
        return pb.GetStatsResponse(
            stats=[
                pb.PromptStats(prompt_id=pid, samples=g, successes=k, updated_unix=t)
                for pid, g, k, t in zip(
                    ids,
                    stats.samples.tolist(),
                    stats.successes.tolist(),
                    stats.updated_unix.tolist(),
                    strict=True,
                )
            ]
        )

    def _reset(
        self, req: pb.ResetNamespaceRequest, context: grpc.ServicerContext
    ) -> pb.ResetNamespaceResponse:
        self._authorize(context)
        namespace = _namespace(req.namespace)
        removed = self.store.reset(namespace)
        log.info("reset namespace %s (%d prompts)", namespace, removed)
        return pb.ResetNamespaceResponse(prompts_removed=removed)

    def _export(
        self, req: pb.ExportNamespaceRequest, context: grpc.ServicerContext
    ) -> pb.ExportNamespaceResponse:
        namespace = _namespace(req.namespace)
        return pb.ExportNamespaceResponse(json=self.store.export_json(namespace))

    # -- plumbing ----------------------------------------------------------------------------

    def _authorize(self, context: grpc.ServicerContext) -> None:
        if not self.control_token:
            return
        given = dict(context.invocation_metadata()).get("authorization", "")
        if given != f"Bearer {self.control_token}":
            raise PermissionError("authorization: this call needs 'Bearer <control token>'")

    def _handle(
        self,
        method: str,
        fn: Callable[[Req, grpc.ServicerContext], Any],
        request: Req,
        context: grpc.ServicerContext,
    ) -> Any:
        start = time.perf_counter()
        code = grpc.StatusCode.OK
        message = ""
        try:
            reply = fn(request, context)
            self.set_redis_ok(True)
            return reply
        except BadRequest as e:
            code, message = grpc.StatusCode.INVALID_ARGUMENT, str(e)
        except PermissionError as e:
            code, message = grpc.StatusCode.UNAUTHENTICATED, str(e)
        except REDIS_ERRORS as e:
            self.m.redis_errors.inc()
            self.set_redis_ok(False)
            code, message = grpc.StatusCode.UNAVAILABLE, f"redis unreachable: {e}"
        except redis.exceptions.RedisError as e:
            log.exception("%s: redis error", method)
            code, message = grpc.StatusCode.INTERNAL, f"redis error: {e}"
        except Exception as e:  # a bug: answer INTERNAL with the reason, keep serving
            log.exception("%s failed", method)
            code, message = grpc.StatusCode.INTERNAL, f"{type(e).__name__}: {e}"
        finally:
            self.m.latency.labels(method).observe(time.perf_counter() - start)
            self.m.requests.labels(method, code.name).inc()
        context.abort(code, message)

    def set_redis_ok(self, ok: bool) -> None:
        """Record Redis reachability; flips the health status only when it changes."""
        if ok == self._redis_ok:
            return
        with self._lock:
            if ok == self._redis_ok:
                return
            self._redis_ok = ok
            self.m.redis_up.set(1 if ok else 0)
            if self.health is not None:
                status = (
                    health_pb2.HealthCheckResponse.SERVING
                    if ok
                    else health_pb2.HealthCheckResponse.NOT_SERVING
                )
                self.health.set(SERVICE_NAME, status)
            if ok:
                log.info("redis reachable")
            else:
                log.warning("redis unreachable; answering UNAVAILABLE until it is back")


class RunningServer:
    """A started server: its port, its service, and ``stop()``."""

    def __init__(
        self,
        server: grpc.Server,
        port: int,
        service: AllocatorService,
        stop_event: threading.Event,
        pinger: threading.Thread,
    ) -> None:
        self.server = server
        self.port = port
        self.service = service
        self._stop_event = stop_event
        self._pinger = pinger

    def stop(self, grace: float = 2.0) -> None:
        self._stop_event.set()
        self.server.stop(grace).wait()
        self._pinger.join(timeout=5)  # it uses the store: close that only once it is done
        self.service.store.close()

    def wait(self) -> None:
        self.server.wait_for_termination()


_REQUEST_TYPES: dict[str, Any] = {
    "Allocate": (pb.AllocateRequest, pb.AllocateResponse),
    "ReportOutcomes": (pb.ReportOutcomesRequest, pb.ReportOutcomesResponse),
    "GetStats": (pb.GetStatsRequest, pb.GetStatsResponse),
    "ResetNamespace": (pb.ResetNamespaceRequest, pb.ResetNamespaceResponse),
    "ExportNamespace": (pb.ExportNamespaceRequest, pb.ExportNamespaceResponse),
}


def _add_allocator_servicer(service: AllocatorService, server: grpc.Server) -> None:
    """``pb_grpc.add_AllocatorServicer_to_server``, but bytes that are not the request message are
    INVALID_ARGUMENT naming the message (grpc's own deserializer answers INTERNAL)."""
    handlers = {}
    for method, (request_cls, response_cls) in _REQUEST_TYPES.items():

        def handle(raw: bytes, context: grpc.ServicerContext, _m=method, _cls=request_cls) -> Any:
            request = _cls()
            try:
                request.ParseFromString(raw)
            except DecodeError as e:
                context.abort(
                    grpc.StatusCode.INVALID_ARGUMENT,
                    f"request: not a valid {_cls.DESCRIPTOR.full_name} message ({e})",
                )
            return getattr(service, _m)(request, context)

        handlers[method] = grpc.unary_unary_rpc_method_handler(
            handle, request_deserializer=None, response_serializer=response_cls.SerializeToString
        )
    server.add_generic_rpc_handlers((grpc.method_handlers_generic_handler(SERVICE_NAME, handlers),))
    server.add_registered_method_handlers(SERVICE_NAME, handlers)


def start_server(
    cfg: AllocatorConfig,
    store: StatsStore,
    metrics: AllocatorMetrics | None = None,
    control_token: str | None = None,
    ping_interval_s: float = 1.0,
) -> RunningServer:
    """Start the gRPC server on ``cfg.host:cfg.port`` (0: a free port) and return it running."""
    metrics = metrics or AllocatorMetrics()
    options = [
        ("grpc.max_send_message_length", MAX_MESSAGE_BYTES),
        ("grpc.max_receive_message_length", MAX_MESSAGE_BYTES),
    ]
    server = grpc.server(futures.ThreadPoolExecutor(max_workers=cfg.max_workers), options=options)
    health_servicer = health.HealthServicer()
    service = AllocatorService(cfg, store, metrics, health_servicer, control_token)
    _add_allocator_servicer(service, server)
    health_pb2_grpc.add_HealthServicer_to_server(health_servicer, server)
    reflection.enable_server_reflection(
        (SERVICE_NAME, health.SERVICE_NAME, reflection.SERVICE_NAME), server
    )
    port = server.add_insecure_port(f"{cfg.host}:{cfg.port}")
    if port == 0:
        raise OSError(f"allocator: cannot bind {cfg.host}:{cfg.port}")
    health_servicer.set("", health_pb2.HealthCheckResponse.SERVING)
    health_servicer.set(SERVICE_NAME, health_pb2.HealthCheckResponse.NOT_SERVING)
    server.start()
    stop_event = threading.Event()

    def ping_loop() -> None:
        # Keeps health and the redis_up gauge true while no request arrives.
        while not stop_event.is_set():
            try:
                service.set_redis_ok(store.ping())
            except REDIS_ERRORS:
                service.set_redis_ok(False)
            except redis.exceptions.RedisError:
                service.set_redis_ok(False)
            stop_event.wait(ping_interval_s)

    pinger = threading.Thread(target=ping_loop, name="allocator-redis-ping", daemon=True)
    pinger.start()
    return RunningServer(server, port, service, stop_event, pinger)
