"""The reward service's FastAPI app: routes, admission control, limits and error shapes.

- ``POST /v1/verify`` fills in the options of each item's data-source route
  (:class:`services.reward.routes.Routes`: ``reward.routes``, verl's names by default), then
  dispatches it to the scorer registered for its ``kind``
  (:data:`services.reward.registry.SCORERS`), or, when its ``data_source`` has a composite spec,
  to :class:`services.reward.composite.CompositeRouter`, and answers in item order.
- ``POST /run_code`` is the SandboxFusion subset (:mod:`services.reward.run_code`).
- ``GET /healthz``, ``GET /metrics``; OpenAPI at ``/docs``.

Load: each kind has an admission budget (items running + waiting). A request whose items do not
fit is refused whole with 429 and ``Retry-After`` instead of queueing without bound; admitted
items wait only for a worker or sandbox slot. Bad input: bodies over the limit get 413 before
they are parsed; anything malformed gets 422 whose ``detail`` entries name the ``field``. A 500
means a bug in the service, never a client mistake; an item whose scoring fails unexpectedly
scores 0 with reason ``internal_error`` rather than failing its neighbours.
"""

import asyncio
import contextlib
import logging
import time
from collections.abc import AsyncIterator
from typing import Any

from fastapi import FastAPI, Request
from fastapi.exception_handlers import http_exception_handler
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse, Response
from starlette.exceptions import HTTPException as StarletteHTTPException

from dynamo_rl.config import RewardConfig
from dynamo_rl.contracts.reward import (
    Health,
    ItemResult,
    RunCodeRequest,
    RunCodeResponse,
    VerifyRequest,
    VerifyResponse,
)
from dynamo_rl.metrics import CONTENT_TYPE_LATEST
from dynamo_rl.notices import Notices
from services.reward.base import Scorer
from services.reward.code_scorer import CodeScorer
from services.reward.composite import KIND as COMPOSITE
from services.reward.composite import CompositeRouter
from services.reward.metrics import RewardMetrics
from services.reward.registry import SCORERS
from services.reward.routes import Routes
from services.reward.run_code import run_code_blocking

log = logging.getLogger("services.reward")

ROUTES = ("/v1/verify", "/run_code", "/healthz", "/metrics")
# Discriminator values pydantic puts in error locations of tests unions; they are not fields.
_TEST_TAGS = ("stdio", "assert", "call")


class QueueFull(Exception):
    def __init__(self, kind: str, pending: int, capacity: int) -> None:
        super().__init__(kind)
        self.kind, self.pending, self.capacity = kind, pending, capacity


class Admission:
    """Items of one kind admitted at once (running + waiting), up to ``capacity``."""

    def __init__(self, capacity: int) -> None:
        self.capacity = capacity
        self.pending = 0

    def fits(self, n: int) -> bool:
        return self.pending + n <= self.capacity


def _field(loc: tuple[Any, ...]) -> str:
    """Dotted field path without ``body`` and without the union tags pydantic inserts."""
    parts: list[str] = []
    for i, p in enumerate(loc):
        prev = loc[i - 1] if i else None
        if i == 0 and p == "body":
            continue
        if p in SCORERS and isinstance(prev, int) and i >= 2 and loc[i - 2] == "items":
            continue  # items.0.math.ground_truth -> items.0.ground_truth
        if p in _TEST_TAGS and prev == "tests":
            continue
        parts.append(str(p))
    return ".".join(parts) or "body"


def _error_field(e: dict[str, Any]) -> str:
    """The dotted field an error is about, as a client would name it (``items.0.ground_truth``)."""
    kind = e.get("type", "")
    if kind == "json_invalid":
        return "body"
    loc = tuple(e.get("loc", ()))
    if kind in ("union_tag_invalid", "union_tag_not_found"):
        # pydantic locates a bad discriminator at the object; name the discriminator itself.
        tag = str((e.get("ctx") or {}).get("discriminator", "")).strip("'\"")
        loc = (*loc, tag) if tag else loc
    return _field(loc)


def _capacity_key(kind: str) -> str:
    """The config key that sets a kind's admission budget (named in 422s)."""
    if kind == COMPOSITE:
        return "reward.composite_max_pending"
    if kind in ("model", "judge"):
        return f"reward.{kind}s.<name>.max_pending"
    return f"reward.{kind}.max_pending"


def _item_error(i: int, loc: tuple[str | int, ...], msg: str) -> dict[str, Any]:
    """A check failure of item ``i`` at ``loc`` within the item."""
    return {
        "loc": ("body", "items", i, *loc),
        "field": ".".join(str(p) for p in ("items", i, *loc)),
        "type": "value_error",
        "msg": msg,
    }


def _invalid(errors: list[dict[str, Any]]) -> JSONResponse:
    detail = [
        {
            # Errors raised by the service itself carry their field (a field can be named like a
            # kind, e.g. a judge item's ``judge``, which _error_field would take for a union tag).
            "field": e.get("field") or _error_field(e),
            "loc": [str(p) if not isinstance(p, int) else p for p in e.get("loc", ())],
            "msg": e.get("msg", "invalid"),
            "type": e.get("type", "value_error"),
        }
        for e in errors
    ]
    return JSONResponse({"detail": detail}, status_code=422)


class _Guard:
    """ASGI middleware: request size limit (413) and per-route request metrics."""

    def __init__(self, app: Any, max_body_bytes: int, metrics: RewardMetrics) -> None:
        self.app = app
        self.max_body_bytes = max_body_bytes
        self.metrics = metrics

    async def __call__(self, scope: dict[str, Any], receive: Any, send: Any) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        start = time.monotonic()
        path = scope.get("path", "")
        route = path if path in ROUTES else "other"
        status = {"code": 500}

        async def send_wrapper(message: dict[str, Any]) -> None:
            if message["type"] == "http.response.start":
                status["code"] = message["status"]
            await send(message)

        try:
            body, too_large = await self._read_body(scope, receive)
            if too_large:
                self.metrics.rejections.labels("body_too_large").inc()
                response = JSONResponse(
                    {
                        "detail": f"request body exceeds {self.max_body_bytes} bytes "
                        "(reward.max_body_bytes)"
                    },
                    status_code=413,
                )
                await response(scope, receive, send_wrapper)
                return
            replayed = False

            async def replay() -> dict[str, Any]:
                nonlocal replayed
                if not replayed:
                    replayed = True
                    return {"type": "http.request", "body": body, "more_body": False}
                return await receive()

            await self.app(scope, replay, send_wrapper)
        finally:
            self.metrics.requests.labels(route, str(status["code"])).inc()
            self.metrics.request_seconds.labels(route).observe(time.monotonic() - start)

    async def _read_body(self, scope: dict[str, Any], receive: Any) -> tuple[bytes, bool]:
        for name, value in scope.get("headers", []):
            if name == b"content-length":
                with contextlib.suppress(ValueError):
                    if int(value) > self.max_body_bytes:
                        return b"", True
        chunks: list[bytes] = []
        size = 0
        while True:
            message = await receive()
            if message["type"] != "http.request":
                break
            chunk = message.get("body", b"")
            size += len(chunk)
            if size > self.max_body_bytes:
                return b"", True
            chunks.append(chunk)
            if not message.get("more_body", False):
                break
        return b"".join(chunks), False


def create_app(
    cfg: RewardConfig, metrics: RewardMetrics | None = None, notices: Notices | None = None
) -> FastAPI:
    """Build the app for ``cfg``; scorers start in the app's lifespan. ``notices``: where a data
    source scored without a route is reported to the user (default: the log only)."""
    metrics = metrics or RewardMetrics()
    notices = notices or Notices(None, "reward")
    scorers: dict[str, Scorer] = {}
    for kind, cls in SCORERS.items():
        if cls.enabled(cfg):
            scorers[kind] = cls(cfg, metrics)
    composite = CompositeRouter(cfg, scorers, metrics)
    data_routes = Routes(cfg.routes)
    admission = {kind: Admission(s.capacity) for kind, s in scorers.items()}
    if cfg.composite:
        admission[COMPOSITE] = Admission(composite.capacity)
    for kind in admission:
        metrics.queue_depth.labels(kind).set(0)

    @contextlib.asynccontextmanager
    async def lifespan(app: FastAPI) -> AsyncIterator[None]:
        started: list[Scorer] = []
        try:
            for scorer in scorers.values():
                await scorer.start()
                started.append(scorer)
            yield
        finally:
            for scorer in reversed(started):
                await scorer.close()

    app = FastAPI(
        title="DynaMO-RL reward service",
        description="Math verification, sandboxed code execution, reward models, LLM judges and "
        "composite rewards per data source. See docs/reward.md.",
        version="1",
        lifespan=lifespan,
    )
    app.state.scorers = scorers
    app.state.metrics = metrics

    @app.exception_handler(RequestValidationError)
    async def on_invalid(request: Request, exc: RequestValidationError) -> JSONResponse:
        metrics.rejections.labels("invalid").inc()
        return _invalid(list(exc.errors()))

    @app.exception_handler(StarletteHTTPException)
    async def on_http_error(request: Request, exc: StarletteHTTPException) -> Response:
        # FastAPI answers a body that is not UTF-8 or nests too deep for its JSON parser with a
        # bare 400; every other malformed body is a 422 naming its field, so this one is too.
        if exc.status_code == 400 and exc.detail == "There was an error parsing the body":
            metrics.rejections.labels("invalid").inc()
            msg = "not valid JSON (encoding or nesting)"
            return _invalid([{"type": "json_invalid", "loc": ("body",), "msg": msg}])
        return await http_exception_handler(request, exc)

    @contextlib.contextmanager
    def admitted(counts: dict[str, int]) -> Any:
        for kind, n in counts.items():
            a = admission[kind]
            if not a.fits(n):
                raise QueueFull(kind, a.pending, a.capacity)
        for kind, n in counts.items():
            admission[kind].pending += n
            metrics.queue_depth.labels(kind).inc(n)
        try:
            yield
        finally:
            for kind, n in counts.items():
                admission[kind].pending -= n
                metrics.queue_depth.labels(kind).dec(n)

    def too_busy(e: QueueFull) -> JSONResponse:
        metrics.rejections.labels("queue_full").inc()
        return JSONResponse(
            {
                "detail": f"{e.kind} queue full ({e.pending} items pending, limit {e.capacity}); "
                f"retry after {cfg.retry_after_s}s"
            },
            status_code=429,
            headers={"Retry-After": str(cfg.retry_after_s)},
        )

    async def score_one(scorer: Scorer, item: Any) -> ItemResult:
        try:
            result = await scorer.score(item)
        except Exception as e:
            log.exception("scoring item %r (kind %s) failed", item.id, scorer.kind)
            result = ItemResult(
                id=item.id,
                score=0.0,
                correct=False,
                format_ok=False,
                reason="internal_error",
                detail=f"{type(e).__name__}",
            )
        metrics.items.labels(scorer.kind, result.reason).inc()
        return result

    async def score_composite(item: Any, key: str, spec: Any) -> ItemResult:
        try:
            result = await composite.score(item, key, spec)
        except Exception as e:
            log.exception("scoring item %r (composite %s) failed", item.id, key)
            result = ItemResult(
                id=item.id, score=0.0, correct=False, format_ok=False,
                reason="internal_error", detail=f"{type(e).__name__}",
            )  # fmt: skip
        metrics.items.labels(COMPOSITE, result.reason).inc()
        return result

    @app.post(
        "/v1/verify",
        response_model=VerifyResponse,
        response_model_exclude_none=True,
        responses={413: {"description": "body too large"}, 429: {"description": "queue full"}},
    )
    async def verify(request: VerifyRequest) -> Any:
        """Score a batch of items; results keep the items' order."""
        # Routes first: a composite spec's math/code components score with the route's options.
        items = [data_routes.apply(item) for item in request.items]
        errors: list[dict[str, Any]] = []
        if len(items) > cfg.max_items:
            errors.append(
                {
                    "loc": ("body", "items"),
                    "type": "too_long",
                    "msg": f"at most {cfg.max_items} items per request "
                    f"(reward.max_items), got {len(items)}",
                }
            )
        counts: dict[str, int] = {}
        routes: list[Any] = [composite.route(item) for item in items]
        for i, item in enumerate(items[: cfg.max_items]):
            if routes[i] is not None:
                for loc, msg in composite.check(item, *routes[i]):
                    errors.append(_item_error(i, loc, msg))
                counts[COMPOSITE] = counts.get(COMPOSITE, 0) + 1
                continue
            scorer = scorers.get(item.kind)
            if scorer is None:
                errors.append(
                    {
                        "loc": ("body", "items", i, "kind"),
                        "type": "disabled",
                        "msg": f"kind {item.kind!r} is disabled on this server; enabled: "
                        f"{', '.join(scorers)}",
                    }
                )
                continue
            for loc, msg in scorer.check(item):
                errors.append(_item_error(i, loc, msg))
            counts[item.kind] = counts.get(item.kind, 0) + 1
        for kind, n in counts.items():
            if n > admission[kind].capacity:  # would never fit: not a "retry later" case
                errors.append(
                    {
                        "loc": ("body", "items"),
                        "type": "too_long",
                        "msg": f"{n} {kind} items in one request; this server admits at "
                        f"most {admission[kind].capacity} at once "
                        f"({_capacity_key(kind)})",
                    }
                )
        if errors:
            metrics.rejections.labels("invalid").inc()
            return _invalid(errors)
        for item, route in zip(items, routes, strict=True):
            source = data_routes.first_unrouted(item) if route is None else None
            if source is not None:
                notices.warn(log, "unrouted_data", f"math items of data_source {source!r} have no "
                             "reward route (reward.routes) and name no extraction: scored by the "
                             "default, last_boxed, which may read none of their answers",
                             source)  # fmt: skip
        try:
            with admitted(counts):
                results = await asyncio.gather(
                    *(
                        score_one(scorers[item.kind], item)
                        if route is None
                        else score_composite(item, *route)
                        for item, route in zip(items, routes, strict=True)
                    )
                )
        except QueueFull as e:
            return too_busy(e)
        return VerifyResponse(results=list(results))

    @app.post(
        "/run_code",
        response_model=RunCodeResponse,
        responses={413: {"description": "body too large"}, 429: {"description": "queue full"}},
    )
    async def run_code(request: RunCodeRequest) -> Any:
        """Run one program once (SandboxFusion-compatible subset)."""
        scorer = scorers.get("code")
        if not isinstance(scorer, CodeScorer):
            return _invalid(
                [
                    {
                        "loc": ("body", "language"),
                        "type": "disabled",
                        "msg": "code execution is disabled on this server",
                    }
                ]
            )
        try:
            with admitted({"code": 1}):
                return await scorer.in_sandbox(run_code_blocking, scorer.runner, request)
        except QueueFull as e:
            return too_busy(e)

    @app.get("/healthz", response_model=Health)
    async def healthz() -> Health:
        """Liveness and what this server scores."""
        code = scorers.get("code")
        sandbox: Any = "disabled"
        if isinstance(code, CodeScorer):
            sandbox = "unsafe-no-sandbox" if cfg.code.unsafe_no_sandbox else "bwrap"
        return Health(
            status="ok",
            kinds=list(scorers),
            sandbox=sandbox,
            pending={kind: a.pending for kind, a in admission.items()},
            composite=sorted(cfg.composite),
        )

    @app.get("/metrics")
    async def metrics_route() -> Response:
        """Prometheus metrics (``dynamo_reward_*``)."""
        return Response(metrics.metrics.exposition(), media_type=CONTENT_TYPE_LATEST)

    app.add_middleware(_Guard, max_body_bytes=cfg.max_body_bytes, metrics=metrics)
    return app
