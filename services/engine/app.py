"""The engine's FastAPI app: the routes of :mod:`.routes` over one :class:`~.engine.Engine`.

:func:`create_app` registers the engine in Redis while it serves (and unregisters it and closes
it on shutdown), answers the informational routes (``/health``, ``/v1/models``,
``/get_model_info``, ``/metrics``) and gives every error one shape.

Errors: a control call the engine could not carry out (:class:`~.routes.Refused`) answers
SGLang's ``{"success": false, "message"}`` with its status; a bad request is a 422 whose ``detail`` has FastAPI's shape (``loc`` names the field) —
whether pydantic or a model-dependent check (a token id outside the vocabulary, a prompt longer
than the context) found it — plus an OpenAI-style ``error`` object with the same message. Chat
messages the model cannot render (no chat template, a malformed message) answer the same body
with 400, as vLLM does.
"""

from __future__ import annotations

import asyncio
import re
from collections.abc import AsyncIterator, Sequence
from contextlib import asynccontextmanager
from typing import Any

from fastapi import APIRouter, FastAPI, Request
from fastapi.exception_handlers import http_exception_handler
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse, Response
from starlette.exceptions import HTTPException as StarletteHTTPException

from dynamo_rl.contracts.weight_control import UpdateAnswer
from dynamo_rl.metrics import CONTENT_TYPE_LATEST
from services.engine.engine import Engine, InvalidRequest
from services.engine.routes import EngineDep, Refused, control, generation

# pydantic puts union members and validator kinds into ``loc``; they are not field names.
_TYPE_TAG = re.compile(r"^(str|int|float|bool|none|list\[.*\]|dict\[.*\]|function-.*)$")


def error_body(loc: Sequence[Any], msg: str, kind: str = "value_error") -> dict[str, Any]:
    """A 422's body: FastAPI's ``detail`` and an OpenAI-style ``error`` naming the field."""
    parts = [str(p) for p in loc if p != "body" and not _TYPE_TAG.match(str(p))]
    field = ".".join(parts) or "body"
    return {
        "detail": [{"loc": list(loc), "msg": msg, "type": kind}],
        "error": {"message": f"{field}: {msg}", "type": "invalid_request_error", "param": field},
    }


async def _validation(_req: Request, exc: RequestValidationError) -> JSONResponse:
    errors = exc.errors()
    first = errors[0] if errors else {"loc": ["body"], "msg": "invalid request"}
    body = error_body(first["loc"], first["msg"], first.get("type", "value_error"))
    body["detail"] = [
        {"loc": list(e["loc"]), "msg": e["msg"], "type": e.get("type")} for e in errors
    ]
    return JSONResponse(body, status_code=422)


async def _http_error(req: Request, exc: StarletteHTTPException) -> Response:
    # FastAPI answers a body that is not UTF-8 or nests too deep for its JSON parser with a
    # bare 400; make it the 422 naming the body that every other malformed request gets.
    if exc.status_code == 400 and exc.detail == "There was an error parsing the body":
        return JSONResponse(
            error_body(["body"], "not valid JSON (encoding or nesting)", "json_invalid"), 422
        )
    return await http_exception_handler(req, exc)


async def _invalid(_req: Request, exc: InvalidRequest) -> JSONResponse:
    return JSONResponse(error_body(["body", *exc.field.split(".")], exc.message), exc.status)


async def _refused(_req: Request, exc: Refused) -> JSONResponse:
    return JSONResponse(UpdateAnswer(success=False, message=exc.message).body(), exc.status)


# ---- informational routes -------------------------------------------------------------------

info = APIRouter()


@info.get("/health")
async def health(engine: EngineDep) -> dict[str, Any]:
    return {"status": "ok", "weight_version": engine.weight_version}


@info.get("/v1/models")
async def models(engine: EngineDep) -> dict[str, Any]:
    return {
        "object": "list",
        "data": [
            {
                "id": engine.served_model_name,
                "object": "model",
                "created": 0,
                "owned_by": "dynamo-rl",
                "max_model_len": engine.max_context,
            },
            # Loaded LoRA adapters after the base, as vLLM lists them.
            *(
                {"id": name, "object": "model", "created": 0, "owned_by": "dynamo-rl",
                 "parent": engine.served_model_name, "max_model_len": engine.max_context}
                for name in engine.adapters.names()
            ),
        ],
    }  # fmt: skip


@info.get("/get_model_info")
async def model_info(engine: EngineDep) -> dict[str, Any]:
    return {
        "model_path": engine.cfg.model,
        "served_model_name": engine.served_model_name,
        "is_generation": True,
    }


@info.get("/metrics")
async def metrics(engine: EngineDep) -> Response:
    m = engine.metrics
    m.queued_sequences.set(engine.generator.pending())
    m.queued_tasks.set(engine.generator.pending_tasks())
    return Response(m.metrics.exposition(), media_type=CONTENT_TYPE_LATEST)


def create_app(engine: Engine) -> FastAPI:
    """The FastAPI app serving ``engine``; closing the app closes the engine."""

    @asynccontextmanager
    async def lifespan(_app: FastAPI) -> AsyncIterator[None]:
        if engine.registry is not None:
            await asyncio.to_thread(engine.registry.register, engine.weight_version)
        try:
            yield
        finally:
            if engine.registry is not None:
                await asyncio.to_thread(engine.registry.unregister)
            await asyncio.to_thread(engine.close)

    app = FastAPI(title="DynaMO-RL embedded engine", lifespan=lifespan)
    app.state.engine = engine
    app.add_exception_handler(RequestValidationError, _validation)  # type: ignore[arg-type]
    app.add_exception_handler(StarletteHTTPException, _http_error)  # type: ignore[arg-type]
    app.add_exception_handler(InvalidRequest, _invalid)  # type: ignore[arg-type]
    app.add_exception_handler(Refused, _refused)  # type: ignore[arg-type]
    app.include_router(generation)
    app.include_router(control)
    app.include_router(info)
    return app
