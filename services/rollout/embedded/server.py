"""The engine's HTTP face: OpenAI ``/v1/completions``, SGLang ``/generate``, weight updates.

:class:`Engine` loads the model and owns the :class:`~.generation.BatchGenerator`;
:func:`create_app` wraps it in FastAPI. Generation routes are ``async`` and only wait on the
scheduler's future; control routes are plain functions (run in the thread pool) because they block
on a process group or on disk.

Errors: a bad request is a 422 whose ``detail`` has FastAPI's shape (``loc`` names the field) —
whether pydantic or a model-dependent check (a token id outside the vocabulary, a prompt longer
than the context) found it — plus an OpenAI-style ``error`` object with the same message.
"""

from __future__ import annotations

import asyncio
import hmac
import json
import logging
import re
import threading
import time
import uuid
from collections.abc import Sequence
from pathlib import Path
from typing import Annotated, Any

import torch
from fastapi import Depends, FastAPI, Header, HTTPException, Request
from fastapi.exception_handlers import http_exception_handler
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse, Response
from starlette.exceptions import HTTPException as StarletteHTTPException

from dynamo_rl.config.engine import EngineConfig
from dynamo_rl.metrics import CONTENT_TYPE_LATEST
from services.rollout.embedded.generation import (
    BatchGenerator,
    BatchStats,
    SamplingParams,
    sample_seed,
)
from services.rollout.embedded.protocol import (
    CompletionRequest,
    GenerateRequest,
    InitWeightsUpdateGroupRequest,
    PromptInput,
    UpdateWeightsFromDiskRequest,
    UpdateWeightsFromDistributedRequest,
)
from services.rollout.embedded.weights import (
    WeightUpdateGroup,
    check_fits,
    copy_into,
    load_checkpoint,
    parse_dtype,
)
from services.rollout.metrics import EngineMetrics

log = logging.getLogger(__name__)

TORCH_DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}


class InvalidRequest(Exception):
    """A request that is well-formed JSON but asks for something this model cannot do."""

    def __init__(self, field: str, message: str) -> None:
        super().__init__(f"{field}: {message}")
        self.field = field
        self.message = message


# pydantic puts union members and validator kinds into ``loc``; they are not field names.
_TYPE_TAG = re.compile(r"^(str|int|float|bool|none|list\[.*\]|dict\[.*\]|function-.*)$")


def _error_body(loc: Sequence[Any], msg: str, kind: str = "value_error") -> dict[str, Any]:
    parts = [str(p) for p in loc if p != "body" and not _TYPE_TAG.match(str(p))]
    field = ".".join(parts) or "body"
    return {
        "detail": [{"loc": list(loc), "msg": msg, "type": kind}],
        "error": {"message": f"{field}: {msg}", "type": "invalid_request_error", "param": field},
    }


def load_model(path: str | Path, dtype: str = "float32", device: str = "cpu") -> tuple[Any, Any]:
    """Load a Hugging Face causal LM and its tokenizer from a local directory (no hub access)."""
    import transformers
    from transformers import AutoModelForCausalLM, AutoTokenizer

    path = Path(path)
    if not (path / "config.json").is_file():
        raise FileNotFoundError(
            f"engine.model: {str(path)!r} is not a Hugging Face model directory"
        )
    torch_dtype: Any = "auto" if dtype == "auto" else TORCH_DTYPES[dtype]
    major_minor = tuple(int(p) for p in transformers.__version__.split(".")[:2])
    key = "dtype" if major_minor >= (4, 56) else "torch_dtype"
    model = AutoModelForCausalLM.from_pretrained(path, local_files_only=True, **{key: torch_dtype})
    model.to(device).eval()
    tokenizer = AutoTokenizer.from_pretrained(path, local_files_only=True)
    return model, tokenizer


class Engine:
    """A loaded model, its batch generator, weight-update groups and Redis registration."""

    def __init__(
        self,
        model: Any,
        tokenizer: Any,
        cfg: EngineConfig,
        served_model_name: str,
        control_token: str | None = None,
        registry: EngineRegistry | None = None,
        seed: int = 0,
    ) -> None:
        self.model = model
        self.tokenizer = tokenizer
        self.cfg = cfg
        self.served_model_name = served_model_name
        self.control_token = control_token
        self.registry = registry
        self.metrics = EngineMetrics()
        mc = model.config
        self.vocab_size = int(model.get_input_embeddings().weight.shape[0])
        self.max_context = int(getattr(mc, "max_position_embeddings", 0) or 1 << 30)
        eos: set[int] = set()
        for source in (getattr(model, "generation_config", None), mc):
            value = getattr(source, "eos_token_id", None) if source is not None else None
            if isinstance(value, int):
                eos.add(value)
            elif isinstance(value, list):
                eos.update(int(v) for v in value)
        if tokenizer.eos_token_id is not None:
            eos.add(int(tokenizer.eos_token_id))
        pad = tokenizer.pad_token_id
        if pad is None:
            pad = getattr(mc, "pad_token_id", None)
        if pad is None:
            pad = min(eos) if eos else 0
        self.params = dict(model.state_dict())
        self.generator = BatchGenerator(
            model,
            eos_token_ids=sorted(eos),
            pad_token_id=int(pad),
            decode=lambda ids: tokenizer.decode(ids, skip_special_tokens=True),
            max_batch_size=cfg.max_batch_size,
            batch_wait_s=cfg.batch_wait_ms / 1000.0,
            seed=seed,
            on_batch=self._on_batch,
        )
        self.groups: dict[str, WeightUpdateGroup] = {}
        self._update_lock = threading.Lock()  # one weight update at a time
        self.metrics.weight_version.set(0)

    @property
    def weight_version(self) -> int:
        return self.generator.weight_version

    def close(self) -> None:
        self.generator.close()
        for group in self.groups.values():
            group.close()
        self.groups.clear()

    def _on_batch(self, stats: BatchStats) -> None:
        m = self.metrics
        m.batch_size.observe(stats.sequences)
        m.batch_seconds.observe(stats.seconds)
        m.sequences.inc(stats.sequences)
        m.prompt_tokens.inc(stats.prompt_tokens)
        m.generated_tokens.inc(stats.generated_tokens)
        if stats.seconds > 0:
            m.tokens_per_second.set(stats.generated_tokens / stats.seconds)

    # ---- requests -> sequences ----

    def encode_prompts(self, prompt: PromptInput, field: str) -> list[list[int]]:
        """Token ids of each prompt; raises InvalidRequest naming ``field`` for bad ones."""
        if isinstance(prompt, str):
            texts: list[str] | None = [prompt]
        elif prompt and all(isinstance(p, str) for p in prompt):
            texts = list(prompt)  # type: ignore[arg-type]
        else:
            texts = None
        if texts is not None:
            prompts = [self.tokenizer.encode(t) for t in texts]
        elif prompt and all(isinstance(p, int) for p in prompt):
            prompts = [list(prompt)]  # type: ignore[arg-type]
        else:
            prompts = [list(p) for p in prompt]  # type: ignore[union-attr]
        for i, ids in enumerate(prompts):
            if not ids:
                raise InvalidRequest(field, f"prompt {i} has no tokens")
            bad = [t for t in ids if not 0 <= t < self.vocab_size]
            if bad:
                raise InvalidRequest(
                    field, f"token id {bad[0]} out of range [0, {self.vocab_size}) (prompt {i})"
                )
            if len(ids) >= self.max_context:
                raise InvalidRequest(
                    field,
                    f"prompt {i} has {len(ids)} tokens; the model's context is {self.max_context}",
                )
        return prompts

    def resolve_max_tokens(
        self, requested: int | None, prompts: list[list[int]], field: str
    ) -> int:
        longest = max(len(p) for p in prompts)
        room = self.max_context - longest
        if requested is None:
            return min(self.cfg.default_max_tokens, self.cfg.max_new_tokens, room)
        if requested > self.cfg.max_new_tokens:
            raise InvalidRequest(
                field,
                f"{requested} exceeds this engine's limit {self.cfg.max_new_tokens} "
                "(engine.max_new_tokens)",
            )
        if requested > room:
            raise InvalidRequest(
                field,
                f"{requested} new tokens after a {longest}-token prompt exceed the model's "
                f"context of {self.max_context}",
            )
        return requested

    def check_token_ids(self, ids: Sequence[int] | None, field: str) -> tuple[int, ...]:
        ids = tuple(ids or ())
        bad = [t for t in ids if not 0 <= t < self.vocab_size]
        if bad:
            raise InvalidRequest(field, f"token id {bad[0]} out of range [0, {self.vocab_size})")
        return ids

    def check_top_logprobs(self, k: int | None, field: str) -> int:
        if k is not None and k > self.cfg.max_logprobs:
            raise InvalidRequest(
                field,
                f"{k} exceeds this engine's limit {self.cfg.max_logprobs} (engine.max_logprobs)",
            )
        return k or 0

    def decode_text(self, ids: list[int], matched: int | str | None, skip_special: bool) -> str:
        text = self.tokenizer.decode(ids, skip_special_tokens=skip_special)
        if isinstance(matched, str):
            cut = text.find(matched)
            if cut >= 0:
                text = text[:cut]
        return text

    # ---- weight updates ----

    def _apply(self, tensors: dict[str, torch.Tensor], version: int | None) -> int:
        """Runs in the scheduler thread, between batches."""
        copy_into(self.params, tensors)
        new = self.generator.weight_version + 1 if version is None else int(version)
        self.generator.weight_version = new
        return new

    def _after_update(self, source: str, t0: float, version: int) -> None:
        self.metrics.weight_updates.labels(source, "ok").inc()
        self.metrics.weight_update_seconds.labels(source).observe(time.perf_counter() - t0)
        self.metrics.weight_version.set(version)
        if self.registry is not None:
            self.registry.register(version)

    def init_group(self, req: InitWeightsUpdateGroupRequest) -> None:
        old = self.groups.pop(req.group_name, None)
        if old is not None:
            old.close()
        self.groups[req.group_name] = WeightUpdateGroup(
            req.master_address,
            req.master_port,
            req.rank_offset,
            req.world_size,
            req.group_name,
            req.backend,
            self.cfg.weight_update_timeout_s,
        )

    def update_from_distributed(self, req: UpdateWeightsFromDistributedRequest) -> int:
        group = self.groups[req.group_name]
        dtypes = [parse_dtype(d) for d in req.dtypes]
        t0 = time.perf_counter()
        with self._update_lock:
            received = group.receive(dtypes, req.shapes)
            mismatch = check_fits(self.params, req.names, req.shapes)
            if mismatch:
                self.metrics.weight_updates.labels("distributed", "error").inc()
                raise ValueError(f"weights not applied: {mismatch.message()}")
            tensors = dict(zip(req.names, received, strict=True))
            version = self.generator.run_exclusive(
                lambda: self._apply(tensors, req.weight_version)
            ).result()
        self._after_update("distributed", t0, version)
        return version

    def update_from_disk(self, req: UpdateWeightsFromDiskRequest) -> int:
        t0 = time.perf_counter()
        with self._update_lock:
            tensors = load_checkpoint(req.model_path)
            names = list(tensors)
            mismatch = check_fits(self.params, names, [tuple(t.shape) for t in tensors.values()])
            if mismatch:
                self.metrics.weight_updates.labels("disk", "error").inc()
                raise ValueError(f"weights not applied: {mismatch.message()}")
            version = self.generator.run_exclusive(
                lambda: self._apply(tensors, req.weight_version)
            ).result()
        self._after_update("disk", t0, version)
        return version


class EngineRegistry:
    """This engine's entry in ``engines_key(ns)``; Redis trouble is logged, never fatal."""

    def __init__(self, redis_url: str, namespace: str, url: str) -> None:
        from dynamo_rl.keys import engines_key

        self.redis_url = redis_url
        self.key = engines_key(namespace)
        self.url = url

    def _client(self) -> Any:
        import redis

        return redis.Redis.from_url(self.redis_url, socket_timeout=2.0, socket_connect_timeout=2.0)

    def register(self, version: int) -> bool:
        entry = {"url": self.url, "weight_version": version, "registered_unix": time.time()}
        try:
            client = self._client()
            try:
                client.hset(self.key, self.url, json.dumps(entry))
            finally:
                client.close()
        except Exception as e:  # Redis is optional for the engine
            log.warning("could not register in Redis at %s: %s", self.redis_url, e)
            return False
        return True

    def unregister(self) -> None:
        try:
            client = self._client()
            try:
                client.hdel(self.key, self.url)
            finally:
                client.close()
        except Exception as e:
            log.warning("could not unregister from Redis: %s", e)


def create_app(engine: Engine) -> FastAPI:
    """The FastAPI app serving ``engine``; closing the app closes the engine."""
    from contextlib import asynccontextmanager

    @asynccontextmanager
    async def lifespan(_app: FastAPI) -> Any:
        if engine.registry is not None:
            await asyncio.to_thread(engine.registry.register, engine.weight_version)
        try:
            yield
        finally:
            if engine.registry is not None:
                await asyncio.to_thread(engine.registry.unregister)
            await asyncio.to_thread(engine.close)

    app = FastAPI(title="DynaMO-RL embedded engine", lifespan=lifespan)
    m = engine.metrics

    @app.exception_handler(RequestValidationError)
    async def _validation(_req: Request, exc: RequestValidationError) -> JSONResponse:
        errors = exc.errors()
        first = errors[0] if errors else {"loc": ["body"], "msg": "invalid request"}
        body = _error_body(first["loc"], first["msg"], first.get("type", "value_error"))
        body["detail"] = [
            {"loc": list(e["loc"]), "msg": e["msg"], "type": e.get("type")} for e in errors
        ]
        return JSONResponse(body, status_code=422)

    @app.exception_handler(StarletteHTTPException)
    async def _http_error(req: Request, exc: StarletteHTTPException) -> Response:
        # FastAPI answers a body that is not UTF-8 or nests too deep for its JSON parser with a
        # bare 400; make it the 422 naming the body that every other malformed request gets.
        if exc.status_code == 400 and exc.detail == "There was an error parsing the body":
            return JSONResponse(
                _error_body(["body"], "not valid JSON (encoding or nesting)", "json_invalid"), 422
            )
        return await http_exception_handler(req, exc)

    @app.exception_handler(InvalidRequest)
    async def _invalid(_req: Request, exc: InvalidRequest) -> JSONResponse:
        return JSONResponse(_error_body(["body", *exc.field.split(".")], exc.message), 422)

    def require_token(authorization: Annotated[str | None, Header()] = None) -> None:
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

    control = [Depends(require_token)]

    @app.get("/health")
    async def health() -> dict[str, Any]:
        return {"status": "ok", "weight_version": engine.weight_version}

    @app.get("/get_weight_version")
    async def get_weight_version() -> dict[str, int]:
        return {"weight_version": engine.weight_version}

    @app.get("/v1/models")
    async def models() -> dict[str, Any]:
        return {
            "object": "list",
            "data": [
                {
                    "id": engine.served_model_name,
                    "object": "model",
                    "created": 0,
                    "owned_by": "dynamo-rl",
                    "max_model_len": engine.max_context,
                }
            ],
        }

    @app.get("/get_model_info")
    async def model_info() -> dict[str, Any]:
        return {
            "model_path": engine.cfg.model,
            "served_model_name": engine.served_model_name,
            "is_generation": True,
        }

    @app.get("/metrics")
    async def metrics() -> Response:
        m.queued_sequences.set(engine.generator.pending())
        return Response(m.metrics.exposition(), media_type=CONTENT_TYPE_LATEST)

    @app.post("/v1/completions")
    async def completions(req: CompletionRequest) -> dict[str, Any]:
        t0 = time.perf_counter()
        try:
            body = await _completions(req)
        except InvalidRequest:
            m.requests.labels("/v1/completions", "422").inc()
            raise
        m.requests.labels("/v1/completions", "200").inc()
        m.request_seconds.labels("/v1/completions").observe(time.perf_counter() - t0)
        return body

    async def _completions(req: CompletionRequest) -> dict[str, Any]:
        prompts = engine.encode_prompts(req.prompt, "prompt")
        max_tokens = engine.resolve_max_tokens(req.max_tokens, prompts, "max_tokens")
        top = engine.check_top_logprobs(req.logprobs, "logprobs")
        stop_ids = engine.check_token_ids(req.stop_token_ids, "stop_token_ids")
        stop = (req.stop,) if isinstance(req.stop, str) else tuple(req.stop or ())
        seqs, params = [], []
        for i, ids in enumerate(prompts):
            for j in range(req.n):
                k = i * req.n + j
                seqs.append(ids)
                params.append(
                    SamplingParams(
                        max_tokens=max_tokens,
                        temperature=req.temperature,
                        top_p=req.top_p,
                        top_k=max(req.top_k, 0),
                        stop=stop,
                        stop_token_ids=stop_ids,
                        ignore_eos=req.ignore_eos,
                        seed=None if req.seed is None else sample_seed(req.seed, k),
                        top_logprobs=top,
                    )
                )
        results = await asyncio.wrap_future(engine.generator.submit(seqs, params))
        choices = []
        for k, (ids, res) in enumerate(zip(seqs, results, strict=True)):
            text = engine.decode_text(res.token_ids, res.matched_stop, req.skip_special_tokens)
            choice: dict[str, Any] = {
                "index": k,
                "text": text,
                "logprobs": None,
                "finish_reason": res.finish_reason,
                "stop_reason": res.matched_stop,
            }
            if req.return_token_ids:
                choice["token_ids"] = res.token_ids
                choice["prompt_token_ids"] = ids
            if req.logprobs is not None:
                pieces = [engine.tokenizer.decode([t]) for t in res.token_ids]
                offsets, pos = [], 0
                for p in pieces:
                    offsets.append(pos)
                    pos += len(p)
                choice["logprobs"] = {
                    "tokens": pieces,
                    "token_logprobs": res.logprobs,
                    "top_logprobs": None
                    if res.top_logprobs is None
                    else [
                        {engine.tokenizer.decode([t]): lp for t, lp in step}
                        for step in res.top_logprobs
                    ],
                    "text_offset": offsets,
                }
            choices.append(choice)
        prompt_tokens = sum(len(p) for p in prompts)
        completion_tokens = sum(len(r.token_ids) for r in results)
        return {
            "id": f"cmpl-{uuid.uuid4().hex}",
            "object": "text_completion",
            "created": int(time.time()),
            "model": engine.served_model_name,
            "choices": choices,
            "usage": {
                "prompt_tokens": prompt_tokens,
                "completion_tokens": completion_tokens,
                "total_tokens": prompt_tokens + completion_tokens,
            },
            "weight_version": min((r.weight_version for r in results), default=0),
        }

    @app.post("/generate")
    async def generate(req: GenerateRequest) -> Any:
        t0 = time.perf_counter()
        try:
            body = await _generate(req)
        except InvalidRequest:
            m.requests.labels("/generate", "422").inc()
            raise
        m.requests.labels("/generate", "200").inc()
        m.request_seconds.labels("/generate").observe(time.perf_counter() - t0)
        return body

    async def _generate(req: GenerateRequest) -> Any:
        if (req.text is None) == (req.input_ids is None):
            raise InvalidRequest("text", "give exactly one of text and input_ids")
        sp = req.sampling_params
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
        stop_ids = engine.check_token_ids(sp.stop_token_ids, "sampling_params.stop_token_ids")
        stop = (sp.stop,) if isinstance(sp.stop, str) else tuple(sp.stop or ())
        seqs, params = [], []
        for ids in prompts:
            for j in range(sp.n):
                seqs.append(ids)
                params.append(
                    SamplingParams(
                        max_tokens=max_tokens,
                        temperature=sp.temperature,
                        top_p=sp.top_p,
                        top_k=max(sp.top_k, 0),
                        stop=stop,
                        stop_token_ids=stop_ids,
                        ignore_eos=sp.ignore_eos,
                        seed=None if sp.sampling_seed is None else sample_seed(sp.sampling_seed, j),
                        top_logprobs=top if req.return_logprob else 0,
                    )
                )
        results = await asyncio.wrap_future(engine.generator.submit(seqs, params))
        out = []
        for ids, res in zip(seqs, results, strict=True):
            if res.finish_reason == "length":
                finish: dict[str, Any] = {"type": "length", "length": len(res.token_ids)}
            else:
                finish = {"type": "stop", "matched": res.matched_stop}
            meta: dict[str, Any] = {
                "id": uuid.uuid4().hex,
                "finish_reason": finish,
                "prompt_tokens": len(ids),
                "completion_tokens": len(res.token_ids),
                "cached_tokens": 0,
                "weight_version": res.weight_version,
                "e2e_latency": 0.0,
            }
            if req.return_logprob:
                meta["output_token_logprobs"] = [
                    [lp, t, None] for lp, t in zip(res.logprobs, res.token_ids, strict=True)
                ]
                if top:
                    meta["output_top_logprobs"] = [
                        [[lp, t, None] for t, lp in step] for step in res.top_logprobs or []
                    ]
            out.append(
                {
                    "text": engine.decode_text(
                        res.token_ids, res.matched_stop, sp.skip_special_tokens
                    ),
                    "output_ids": res.token_ids,
                    "meta_info": meta,
                }
            )
        return out[0] if single and sp.n == 1 else out

    def _fail(status: int, message: str) -> JSONResponse:
        return JSONResponse({"success": False, "message": message}, status_code=status)

    @app.post("/init_weights_update_group", dependencies=control)
    def init_weights_update_group(req: InitWeightsUpdateGroupRequest) -> Any:
        try:
            engine.init_group(req)
        except (ValueError, RuntimeError) as e:
            log.warning("init_weights_update_group failed: %s", e)
            return _fail(400, f"init_weights_update_group failed: {e}")
        log.info(
            "joined weight-update group %r as rank %d of %d (%s)",
            req.group_name, req.rank_offset, req.world_size, req.backend,
        )  # fmt: skip
        return {"success": True, "message": f"joined group {req.group_name!r}"}

    @app.post("/update_weights_from_distributed", dependencies=control)
    def update_weights_from_distributed(req: UpdateWeightsFromDistributedRequest) -> Any:
        n = len(req.names)
        if len(req.dtypes) != n or len(req.shapes) != n:
            raise InvalidRequest(
                "names", f"names, dtypes and shapes differ in length ({n}, "
                f"{len(req.dtypes)}, {len(req.shapes)})"
            )  # fmt: skip
        for i, d in enumerate(req.dtypes):
            try:
                parse_dtype(d)
            except ValueError as e:
                raise InvalidRequest(f"dtypes.{i}", str(e)) from None
        if req.group_name not in engine.groups:
            return _fail(
                400,
                f"group_name {req.group_name!r} is not initialised here; call "
                "/init_weights_update_group first",
            )
        try:
            version = engine.update_from_distributed(req)
        except (ValueError, RuntimeError) as e:
            log.warning("update_weights_from_distributed failed: %s", e)
            return _fail(400, str(e))
        return {"success": True, "message": f"{n} tensors loaded", "weight_version": version}

    @app.post("/update_weights_from_disk", dependencies=control)
    def update_weights_from_disk(req: UpdateWeightsFromDiskRequest) -> Any:
        try:
            version = engine.update_from_disk(req)
        except FileNotFoundError as e:
            return _fail(400, f"model_path: {e}")
        except (ValueError, RuntimeError, OSError) as e:
            log.warning("update_weights_from_disk failed: %s", e)
            return _fail(400, str(e))
        return {"success": True, "message": "loaded", "weight_version": version}

    return app
