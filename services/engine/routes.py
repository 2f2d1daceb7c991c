"""The engine's HTTP routes, as two routers over the app's :class:`~.engine.Engine`.

- :data:`generation` — OpenAI ``POST /v1/completions`` and ``POST /v1/chat/completions`` (its
  messages rendered by the model's chat template, then the completion path: one generation
  path) and SGLang ``POST /generate``; ``/v1/completions`` also answers vLLM's
  ``prompt_logprobs: 0`` (the prompt tokens' log-probs, :meth:`~.engine.Engine.score_prompts`:
  on-policy distillation's teacher scoring). They are ``async`` and only wait on the scheduler's
  future. Requests are validated with, and answers built from, the models of
  :mod:`dynamo_rl.contracts.engine` and :mod:`dynamo_rl.contracts.chat`.
- :data:`control` — both weight-control protocols of :mod:`dynamo_rl.contracts.weight_control`
  (SGLang's update routes; vLLM's pause, start, update, finish, resume), the version reads and
  the LoRA adapter loads and unloads (both kinds' paths), carried out by the engine's
  :class:`~.weight_updates.WeightUpdates`; requests name an adapter in ``model``
  (OpenAI) or ``lora_path`` (SGLang).
  Routes that block on a process group or on disk are plain functions (run in the thread pool);
  every route that changes the engine needs the control token when one is set.

A check that needs the model raises :class:`~.engine.InvalidRequest` (a 422 naming the field,
see :mod:`.app`; a 400 for chat messages the model cannot render); an update the engine could
not apply answers 400 with SGLang's ``{"success": false, "message"}``; a vLLM-shaped call out of
order answers 409.
"""

from __future__ import annotations

import asyncio
import hmac
import logging
import time
import uuid
from collections.abc import Awaitable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Annotated, Any

from fastapi import APIRouter, Depends, Header, HTTPException, Query, Request
from fastapi.responses import JSONResponse

from dynamo_rl.contracts.chat import (
    ChatChoice,
    ChatCompletionRequest,
    ChatCompletionResponse,
    ChatLogprob,
    ChatLogprobContent,
    ChatLogprobs,
    ChatMessage,
    token_id_text,
)
from dynamo_rl.contracts.engine import (
    CompletionChoice,
    CompletionLogprobs,
    CompletionRequest,
    CompletionResponse,
    CompletionUsage,
    GenerateFinishReason,
    GenerateItem,
    GenerateMetaInfo,
    GenerateRequest,
    PromptLogprob,
)
from dynamo_rl.contracts.weight_control import (
    PAUSE_MODES,
    VLLM_GROUP_NAME,
    VLLM_INITIAL_VERSION,
    InitWeightsUpdateGroupRequest,
    LoadLoraAdapterRequest,
    UnloadLoraAdapterRequest,
    UpdateAnswer,
    UpdateWeightsFromDiskRequest,
    UpdateWeightsFromDistributedRequest,
    VLLMFinishRequest,
    VLLMInitRequest,
    VLLMUpdateRequest,
    WeightVersionAnswer,
)
from services.engine.batch_loop import SequenceResult
from services.engine.engine import Engine, InvalidRequest

log = logging.getLogger(__name__)


async def _engine(request: Request) -> Engine:
    return request.app.state.engine


EngineDep = Annotated[Engine, Depends(_engine)]


async def require_token(
    engine: EngineDep, authorization: Annotated[str | None, Header()] = None
) -> None:
    """Control routes need ``Authorization: Bearer <token>`` when the engine has a token."""
    if engine.control_token is None:
        return
    scheme, _, given = (authorization or "").partition(" ")
    if scheme.lower() != "bearer" or not hmac.compare_digest(
        given.encode(), engine.control_token.encode()
    ):
        raise HTTPException(
            401, "control endpoints need 'Authorization: Bearer <engine token>'",
            headers={"WWW-Authenticate": "Bearer"},
        )  # fmt: skip


generation = APIRouter()
control = APIRouter()
guarded = [Depends(require_token)]


# ---- generation -----------------------------------------------------------------------------


async def _observed(engine: Engine, route: str, call: Awaitable[Any]) -> Any:
    """``call``'s answer, counted per route and status, timed, and in flight meanwhile."""
    m = engine.metrics
    t0 = time.perf_counter()
    m.requests_in_flight.inc()
    try:
        body = await call
    except InvalidRequest as e:
        m.requests.labels(route, str(e.status)).inc()
        raise
    finally:
        m.requests_in_flight.dec()
    m.requests.labels(route, "200").inc()
    m.request_seconds.labels(route).observe(time.perf_counter() - t0)
    return body


@generation.post("/v1/completions")
async def completions(req: CompletionRequest, engine: EngineDep) -> dict[str, Any]:
    return await _observed(engine, "/v1/completions", _completions(engine, req))


def _logprobs(engine: Engine, res: SequenceResult) -> CompletionLogprobs:
    decode = engine.tokenizer.decode
    pieces = [decode([t]) for t in res.token_ids]
    offsets, pos = [], 0
    for p in pieces:
        offsets.append(pos)
        pos += len(p)
    top = None
    if res.top_logprobs is not None:
        top = [{decode([t]): lp for t, lp in step} for step in res.top_logprobs]
    return CompletionLogprobs(
        tokens=pieces, token_logprobs=res.logprobs, top_logprobs=top, text_offset=offsets
    )


@dataclass
class _Sampled:
    """A completion request's sequences and what the batch loop made of them."""

    adapter: str | None
    prompts: list[list[int]]
    seqs: list[list[int]]
    """The prompt of each sequence (``n`` per prompt, prompt-major)."""
    results: list[SequenceResult]

    def usage(self) -> CompletionUsage:
        prompt_tokens = sum(len(p) for p in self.prompts)
        completion_tokens = sum(len(r.token_ids) for r in self.results)
        return CompletionUsage(
            prompt_tokens=prompt_tokens,
            completion_tokens=completion_tokens,
            total_tokens=prompt_tokens + completion_tokens,
        )

    def weight_version(self) -> int:
        return min((r.weight_version for r in self.results), default=0)


async def _sample(
    engine: Engine,
    req: CompletionRequest,
    prompt_field: str = "prompt",
    max_tokens_field: str = "max_tokens",
    logprobs_field: str = "logprobs",
) -> _Sampled:
    """The one generation path of ``/v1/completions`` and ``/v1/chat/completions`` (which
    renders its messages into such a request); errors name the asking route's fields."""
    adapter = engine.resolve_adapter(req.model, "model")
    prompts = engine.encode_prompts(req.prompt, prompt_field)
    max_tokens = engine.resolve_max_tokens(req.max_tokens, prompts, max_tokens_field)
    top = engine.check_top_logprobs(req.logprobs, logprobs_field)
    seqs, params = engine.sequences(prompts, req, max_tokens=max_tokens, seed=req.seed)
    results = await asyncio.wrap_future(engine.generator.submit(seqs, params, adapter, top))
    return _Sampled(adapter, prompts, seqs, results)


def _prompt_logprobs(
    engine: Engine, ids: list[int], scored: list[tuple[float, int]]
) -> list[dict[str, PromptLogprob] | None]:
    """vLLM's ``prompt_logprobs`` of one prompt: None for its first token, then each token's."""
    decode = engine.tokenizer.decode
    entries: list[dict[str, PromptLogprob] | None] = [None]
    for t, (lp, rank) in zip(ids[1:], scored, strict=True):
        entries.append({str(t): PromptLogprob(logprob=lp, rank=rank, decoded_token=decode([t]))})
    return entries


async def _completions(engine: Engine, req: CompletionRequest) -> dict[str, Any]:
    if req.prompt_logprobs:
        raise InvalidRequest(
            "prompt_logprobs", "this engine returns the prompt tokens' own log-probs only (0), "
            f"no alternatives; got {req.prompt_logprobs}"
        )  # fmt: skip
    out = await _sample(engine, req)
    scores = None
    if req.prompt_logprobs is not None:
        scores = await asyncio.wrap_future(engine.score_prompts(out.prompts, out.adapter))
    choices = []
    for k, (ids, res) in enumerate(zip(out.seqs, out.results, strict=True)):
        choice = CompletionChoice(
            index=k,
            text=engine.decode_text(res.token_ids, res.matched_stop, req.skip_special_tokens),
            logprobs=None if req.logprobs is None else _logprobs(engine, res),
            finish_reason=res.finish_reason,
            stop_reason=res.matched_stop,
            weight_versions=res.token_versions,
        )
        if req.return_token_ids:
            choice.token_ids = res.token_ids
            choice.prompt_token_ids = ids
        if scores is not None:
            choice.prompt_logprobs = _prompt_logprobs(engine, ids, scores[k // req.n])
        choices.append(choice)
    return CompletionResponse(
        id=f"cmpl-{uuid.uuid4().hex}",
        object="text_completion",
        created=int(time.time()),
        model=out.adapter or engine.served_model_name,
        choices=choices,
        usage=out.usage(),
        weight_version=out.weight_version(),
    ).body()


@generation.post("/v1/chat/completions")
async def chat_completions(req: ChatCompletionRequest, engine: EngineDep) -> dict[str, Any]:
    return await _observed(engine, "/v1/chat/completions", _chat(engine, req))


def _chat_logprobs(engine: Engine, res: SequenceResult, as_ids: bool) -> ChatLogprobs:
    """``logprobs.content``: one entry per generated token (a stop token included), its token
    named by its text or, ``as_ids``, as ``"token_id:<id>"``; ``bytes`` are the text's."""

    def entry(token_id: int, logprob: float) -> ChatLogprob:
        text = engine.tokenizer.decode([token_id])
        return ChatLogprob(
            token=token_id_text(token_id) if as_ids else text,
            logprob=logprob,
            bytes=list(text.encode("utf-8", errors="replace")),
        )

    content = []
    for i, (t, lp) in enumerate(zip(res.token_ids, res.logprobs, strict=True)):
        top = [] if res.top_logprobs is None else [entry(a, x) for a, x in res.top_logprobs[i]]
        content.append(ChatLogprobContent(**entry(t, lp).body(), top_logprobs=top))
    return ChatLogprobs(content=content)


async def _chat(engine: Engine, req: ChatCompletionRequest) -> dict[str, Any]:
    """The messages rendered by the model's chat template, sampled as the completion request
    of those token ids (:meth:`ChatCompletionRequest.completion`), answered in chat's shape."""
    prompt = engine.render_chat(req.messages)
    out = await _sample(
        engine, req.completion(prompt), "messages", req.max_tokens_field(), "top_logprobs"
    )
    choices = []
    for k, res in enumerate(out.results):
        text = engine.decode_text(res.token_ids, res.matched_stop, req.skip_special_tokens)
        choice = ChatChoice(
            index=k,
            message=ChatMessage(role="assistant", content=text),
            logprobs=(
                _chat_logprobs(engine, res, bool(req.return_tokens_as_token_ids))
                if req.logprobs
                else None
            ),
            finish_reason=res.finish_reason,
            stop_reason=res.matched_stop,
            weight_versions=res.token_versions,
        )
        if req.return_token_ids:
            choice.token_ids = res.token_ids
        choices.append(choice)
    answer = ChatCompletionResponse(
        id=f"chatcmpl-{uuid.uuid4().hex}",
        object="chat.completion",
        created=int(time.time()),
        model=out.adapter or engine.served_model_name,
        choices=choices,
        usage=out.usage(),
        weight_version=out.weight_version(),
    )
    if req.return_token_ids:
        answer.prompt_token_ids = prompt
    return answer.body()


@generation.post("/generate")
async def generate(req: GenerateRequest, engine: EngineDep) -> Any:
    return await _observed(engine, "/generate", _generate(engine, req))


def _item(
    engine: Engine, req: GenerateRequest, ids: list[int], res: SequenceResult
) -> GenerateItem:
    if res.finish_reason == "length":
        finish = GenerateFinishReason(type="length", length=len(res.token_ids))
    else:
        finish = GenerateFinishReason(type="stop", matched=res.matched_stop)
    meta = GenerateMetaInfo(
        id=uuid.uuid4().hex,
        finish_reason=finish,
        prompt_tokens=len(ids),
        completion_tokens=len(res.token_ids),
        cached_tokens=0,
        weight_version=res.weight_version,
        weight_versions=res.token_versions,
        e2e_latency=0.0,
    )
    if req.return_logprob:
        meta.output_token_logprobs = [
            (lp, t, None) for lp, t in zip(res.logprobs, res.token_ids, strict=True)
        ]
        if req.top_logprobs_num:
            meta.output_top_logprobs = [
                [(lp, t, None) for t, lp in step] for step in res.top_logprobs or []
            ]
    sp = req.sampling_params
    return GenerateItem(
        text=engine.decode_text(res.token_ids, res.matched_stop, sp.skip_special_tokens),
        output_ids=res.token_ids,
        meta_info=meta,
    )


async def _generate(engine: Engine, req: GenerateRequest) -> Any:
    if (req.text is None) == (req.input_ids is None):
        raise InvalidRequest("text", "give exactly one of text and input_ids")
    sp = req.sampling_params
    adapter = engine.resolve_adapter(req.lora_path, "lora_path")
    if req.text is not None:
        single = isinstance(req.text, str)
        prompts = engine.encode_prompts(req.text, "text")
    else:
        assert req.input_ids is not None
        single = bool(req.input_ids) and isinstance(req.input_ids[0], int)
        if not req.input_ids:
            raise InvalidRequest("input_ids", "must not be empty")
        prompts = engine.encode_prompts(req.input_ids, "input_ids")
    max_tokens = engine.resolve_max_tokens(
        sp.max_new_tokens, prompts, "sampling_params.max_new_tokens"
    )
    top = engine.check_top_logprobs(req.top_logprobs_num, "top_logprobs_num")
    seqs, params = engine.sequences(
        prompts, sp, max_tokens=max_tokens, seed=sp.sampling_seed, seed_per_prompt=True,
        prefix="sampling_params.",
    )  # fmt: skip
    top = top if req.return_logprob else 0
    results = await asyncio.wrap_future(engine.generator.submit(seqs, params, adapter, top))
    out = [_item(engine, req, ids, res).body() for ids, res in zip(seqs, results, strict=True)]
    return out[0] if single and sp.n == 1 else out


# ---- SGLang-shaped weight control -----------------------------------------------------------


class Refused(Exception):
    """A control call the engine could not carry out: SGLang's ``{"success": false, "message"}``
    with ``status`` (see :mod:`.app`)."""

    def __init__(self, status: int, message: str) -> None:
        super().__init__(message)
        self.status = status
        self.message = message


@contextmanager
def _refusals(route: str, *errors: type[Exception], named: bool = False) -> Iterator[None]:
    """A ValueError or RuntimeError (or one of ``errors``) inside becomes a logged 400;
    ``named``: its message starts with the route."""
    try:
        yield
    except (ValueError, RuntimeError, *errors) as e:
        log.warning("%s failed: %s", route, e)
        raise Refused(400, f"{route} failed: {e}" if named else str(e)) from None


@control.get("/get_weight_version")
async def get_weight_version(engine: EngineDep) -> dict[str, Any]:
    return WeightVersionAnswer(weight_version=engine.weight_version).body()


@control.post("/init_weights_update_group", dependencies=guarded)
def init_weights_update_group(req: InitWeightsUpdateGroupRequest, engine: EngineDep) -> Any:
    with _refusals("init_weights_update_group", named=True):
        engine.updates.init_group(req)
    log.info(
        "joined weight-update group %r as rank %d of %d (%s)",
        req.group_name, req.rank_offset, req.world_size, req.backend,
    )  # fmt: skip
    return UpdateAnswer(success=True, message=f"joined group {req.group_name!r}").body()


@control.post("/update_weights_from_distributed", dependencies=guarded)
def update_weights_from_distributed(
    req: UpdateWeightsFromDistributedRequest, engine: EngineDep
) -> Any:
    engine.check_tensors(req.names, req.dtypes, req.shapes, "", "dtypes")
    if req.group_name not in engine.updates.groups:
        raise Refused(
            400,
            f"group_name {req.group_name!r} is not initialised here; call "
            "/init_weights_update_group first",
        )
    with _refusals("update_weights_from_distributed"):
        version = engine.updates.update_from_distributed(req)
    message = f"{len(req.names)} tensors loaded"
    return UpdateAnswer(success=True, message=message, weight_version=version).body()


@control.post("/update_weights_from_disk", dependencies=guarded)
def update_weights_from_disk(req: UpdateWeightsFromDiskRequest, engine: EngineDep) -> Any:
    with _refusals("update_weights_from_disk", OSError):
        try:
            version = engine.updates.update_from_disk(req)
        except FileNotFoundError as e:
            raise Refused(400, f"model_path: {e}") from None
    return UpdateAnswer(success=True, message="loaded", weight_version=version).body()


# ---- LoRA adapters (SGLang's and vLLM's routes) --------------------------------------------


@control.post("/load_lora_adapter", dependencies=guarded)
@control.post("/v1/load_lora_adapter", dependencies=guarded)
def load_lora_adapter(req: LoadLoraAdapterRequest, engine: EngineDep) -> Any:
    with _refusals("load_lora_adapter", OSError):
        version = engine.updates.load_adapter(req)
    log.info("adapter %r loaded from %s (version %d)", req.lora_name, req.lora_path, version)
    message = f"adapter {req.lora_name!r} loaded"
    return UpdateAnswer(success=True, message=message, weight_version=version).body()


@control.post("/unload_lora_adapter", dependencies=guarded)
@control.post("/v1/unload_lora_adapter", dependencies=guarded)
def unload_lora_adapter(req: UnloadLoraAdapterRequest, engine: EngineDep) -> Any:
    try:
        engine.updates.unload_adapter(req)
    except KeyError:
        loaded = ", ".join(engine.adapters.names()) or "none"
        raise Refused(
            404, f"lora_name {req.lora_name!r} is not loaded (loaded: {loaded})"
        ) from None
    return UpdateAnswer(success=True, message=f"adapter {req.lora_name!r} unloaded").body()


# ---- vLLM's weight-transfer routes ----------------------------------------------------------


def _conflict(message: str) -> JSONResponse:
    return JSONResponse({"error": {"message": message, "type": "conflict"}}, status_code=409)


@control.get("/weight_info")
async def weight_info(engine: EngineDep) -> dict[str, Any]:
    shown = str(engine.weight_version) if engine.updates.updated else VLLM_INITIAL_VERSION
    return WeightVersionAnswer(weight_version=shown).body()


@control.post("/pause", dependencies=guarded)
def pause(engine: EngineDep, mode: Annotated[str, Query()] = "abort") -> Any:
    if mode not in PAUSE_MODES:
        raise InvalidRequest("mode", f"must be one of {', '.join(PAUSE_MODES)}, got {mode!r}")
    try:
        engine.updates.pause(mode)
    except RuntimeError as e:
        raise Refused(503, str(e)) from None
    return {"status": "paused", "mode": mode}


@control.post("/resume", dependencies=guarded)
def resume(engine: EngineDep) -> Any:
    engine.updates.resume()
    return {"status": "resumed"}


@control.get("/is_paused")
async def is_paused(engine: EngineDep) -> dict[str, bool]:
    return {"is_paused": engine.updates.paused}


@control.post("/init_weight_transfer_engine", dependencies=guarded)
def init_weight_transfer_engine(req: VLLMInitRequest, engine: EngineDep) -> Any:
    engine.check_transfer_init(req)
    with _refusals("init_weight_transfer_engine", named=True):
        engine.updates.vllm_init(req)
    return {"status": "ok"}


@control.post("/start_weight_update", dependencies=guarded)
def start_weight_update(engine: EngineDep) -> Any:
    # An update while requests decode kills vLLM; this engine insists on the pause too.
    if not engine.updates.paused:
        return _conflict("pause the engine (POST /pause) before /start_weight_update")
    if VLLM_GROUP_NAME not in engine.updates.groups:
        return _conflict("call /init_weight_transfer_engine first")
    engine.updates.updating = True
    return {"status": "ok"}


@control.post("/update_weights", dependencies=guarded)
def update_weights(req: VLLMUpdateRequest, engine: EngineDep) -> Any:
    info = req.update_info
    engine.check_tensors(info.names, info.dtype_names, info.shapes, "update_info.", "dtype_names")
    if not engine.updates.updating:
        return _conflict("call /start_weight_update first")
    with _refusals("update_weights"):
        engine.updates.vllm_update(req)
    return {"status": "ok"}


@control.post("/finish_weight_update", dependencies=guarded)
def finish_weight_update(req: VLLMFinishRequest, engine: EngineDep) -> Any:
    if not engine.updates.updating:
        return _conflict("call /start_weight_update first")
    try:
        version = int(req.weight_version)
    except ValueError:
        raise InvalidRequest(
            "weight_version", f"{req.weight_version!r} is not an integer version"
        ) from None
    engine.updates.vllm_finish(version)
    return {"status": "ok", "weight_version": req.weight_version}


@control.post("/reset_prefix_cache", dependencies=guarded)
def reset_prefix_cache() -> dict[str, str]:
    return {"status": "ok"}  # a KV cache lives for one batch here; there is no prefix cache
