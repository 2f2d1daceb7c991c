"""The engine's HTTP face: OpenAI ``/v1/completions``, SGLang ``/generate``, weight updates.

Weight control speaks both protocols of :mod:`dynamo_rl.contracts.engine`: SGLang's (an update
is applied between batches) and vLLM's weight-transfer routes (``/pause`` holds the scheduler at a
batch boundary — ``abort`` first cuts the running batch, whose sequences finish with
``finish_reason`` ``"abort"``; ``keep`` and ``wait`` let it finish, as this engine cannot freeze a
batch mid-decode — then ``/start_weight_update``, ``/update_weights``, ``/finish_weight_update``
and ``/resume``).

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
import logging
import re
import threading
import time
import uuid
from collections.abc import Awaitable, Sequence
from pathlib import Path
from typing import Annotated, Any

import torch
from fastapi import Depends, FastAPI, Header, HTTPException, Query, Request
from fastapi.exception_handlers import http_exception_handler
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse, Response
from starlette.exceptions import HTTPException as StarletteHTTPException

from dynamo_rl.config.engine import EngineConfig
from dynamo_rl.contracts.engine import (
    PAUSE_MODES,
    VLLM_GROUP_NAME,
    VLLM_INITIAL_VERSION,
    EngineRegistry,
)
from dynamo_rl.metrics import CONTENT_TYPE_LATEST
from services.engine.generation import BatchGenerator, BatchStats, SamplingParams, sample_seed
from services.engine.metrics import EngineMetrics
from services.engine.protocol import (
    CompletionRequest,
    GenerateRequest,
    InitWeightsUpdateGroupRequest,
    PromptInput,
    UpdateWeightsFromDiskRequest,
    UpdateWeightsFromDistributedRequest,
    VLLMFinishRequest,
    VLLMInitRequest,
    VLLMUpdateRequest,
)
from services.engine.weights import (
    WeightUpdateGroup,
    check_fits,
    copy_into,
    load_checkpoint,
    parse_dtype,
)

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
            logprobs_mode=cfg.logprobs_mode,
        )
        self.groups: dict[str, WeightUpdateGroup] = {}
        self._update_lock = threading.Lock()  # one weight update at a time
        self.metrics.weight_version.set(0)
        self.updated = False  # vLLM's /weight_info says "default" until the first update
        # vLLM-shaped control: the scheduler is held (paused) inside an exclusive task.
        self._pause_lock = threading.Lock()
        self._held = threading.Event()
        self._release: threading.Event | None = None
        self._hold_future: Any = None
        self.updating = False  # between /start_weight_update and /finish_weight_update

    @property
    def weight_version(self) -> int:
        return self.generator.weight_version

    def close(self) -> None:
        self.resume()
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
        """Runs in the scheduler thread, between batches (or while it is held by a pause)."""
        copy_into(self.params, tensors)
        new = self.generator.weight_version + 1 if version is None else int(version)
        self.generator.weight_version = new
        self.updated = True
        return new

    def _exclusive(self, fn: Any) -> Any:
        # While paused the scheduler thread is blocked in the hold task, so the model is not in
        # use and fn runs here; queueing it behind the hold would deadlock.
        if self.paused:
            return fn()
        return self.generator.run_exclusive(fn).result()

    # ---- pause / resume (vLLM-shaped control) ----

    @property
    def paused(self) -> bool:
        return self._held.is_set()

    def pause(self, mode: str) -> None:
        """Hold the scheduler at the next batch boundary; ``abort`` cuts the running batch."""
        with self._pause_lock:
            if self._release is not None:
                return
            release = threading.Event()
            self._release = release
            if mode == "abort":
                self.generator.abort.set()

            def hold() -> None:
                self.generator.abort.clear()
                self._held.set()
                release.wait()
                self._held.clear()

            self._hold_future = self.generator.run_exclusive(hold)
        if not self._held.wait(self.cfg.weight_update_timeout_s):
            self.resume()
            raise RuntimeError("the running batch did not finish within the update timeout")

    def resume(self) -> None:
        with self._pause_lock:
            release, self._release = self._release, None
            future, self._hold_future = self._hold_future, None
        if release is not None:
            held = self._held.is_set()
            release.set()
            # Held: wait for the hold to end, so /is_paused is false once /resume answers. Not
            # yet held (a pause that timed out): the hold ends at once whenever it runs.
            if held and future is not None:
                future.result(timeout=30)

    def _after_update(self, source: str, t0: float, version: int) -> None:
        self.metrics.weight_updates.labels(source, "ok").inc()
        self.metrics.weight_update_seconds.labels(source).observe(time.perf_counter() - t0)
        self.metrics.weight_version.set(version)
        if self.registry is not None:
            self.registry.register(version)

    def init_group(
        self,
        req: InitWeightsUpdateGroupRequest,
        bucket_bytes: int = 0,
        timeout_s: float | None = None,
    ) -> None:
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
            timeout_s or self.cfg.weight_update_timeout_s,
            bucket_bytes,
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
            version = self._exclusive(lambda: self._apply(tensors, req.weight_version))
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
            version = self._exclusive(lambda: self._apply(tensors, req.weight_version))
        self._after_update("disk", t0, version)
        return version

    # ---- vLLM-shaped weight transfer ----

    def vllm_init(self, req: VLLMInitRequest) -> None:
        info = req.init_info
        self.init_group(
            InitWeightsUpdateGroupRequest(
                master_address=info.master_address,
                master_port=info.master_port,
                rank_offset=info.rank_offset,
                world_size=info.world_size,
                group_name=VLLM_GROUP_NAME,
                backend="nccl" if self.cfg.device == "cuda" else "gloo",
            ),
            bucket_bytes=info.bucket_bytes,
            timeout_s=info.timeout_s,
        )

    def vllm_update(self, req: VLLMUpdateRequest) -> int:
        info = req.update_info
        # Versions come with /finish_weight_update; keep the current one until then.
        return self.update_from_distributed(
            UpdateWeightsFromDistributedRequest(
                names=info.names,
                dtypes=info.dtype_names,
                shapes=info.shapes,
                group_name=VLLM_GROUP_NAME,
                weight_version=self.weight_version,
            )
        )

    def vllm_finish(self, version: int) -> None:
        self.generator.weight_version = version
        self.updated = True
        self.updating = False
        self.metrics.weight_version.set(version)
        if self.registry is not None:
            self.registry.register(version)


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

    async def observed(route: str, call: Awaitable[Any]) -> Any:
        """``call``'s answer, counted per route and status, timed, and in flight meanwhile."""
        t0 = time.perf_counter()
        m.requests_in_flight.inc()
        try:
            body = await call
        except InvalidRequest:
            m.requests.labels(route, "422").inc()
            raise
        finally:
            m.requests_in_flight.dec()
        m.requests.labels(route, "200").inc()
        m.request_seconds.labels(route).observe(time.perf_counter() - t0)
        return body

    @app.post("/v1/completions")
    async def completions(req: CompletionRequest) -> dict[str, Any]:
        return await observed("/v1/completions", _completions(req))

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
        return await observed("/generate", _generate(req))

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

    # ---- vLLM's weight-transfer routes ----

    def _conflict(message: str) -> JSONResponse:
        return JSONResponse({"error": {"message": message, "type": "conflict"}}, status_code=409)

    @app.post("/pause", dependencies=control)
    def pause(mode: Annotated[str, Query()] = "abort") -> Any:
        if mode not in PAUSE_MODES:
            raise InvalidRequest("mode", f"must be one of {', '.join(PAUSE_MODES)}, got {mode!r}")
        try:
            engine.pause(mode)
        except RuntimeError as e:
            return _fail(503, str(e))
        return {"status": "paused", "mode": mode}

    @app.post("/resume", dependencies=control)
    def resume() -> Any:
        engine.resume()
        return {"status": "resumed"}

    @app.get("/is_paused")
    async def is_paused() -> dict[str, bool]:
        return {"is_paused": engine.paused}

    @app.post("/init_weight_transfer_engine", dependencies=control)
    def init_weight_transfer_engine(req: VLLMInitRequest) -> Any:
        try:
            engine.vllm_init(req)
        except (ValueError, RuntimeError) as e:
            log.warning("init_weight_transfer_engine failed: %s", e)
            return _fail(400, f"init_weight_transfer_engine failed: {e}")
        return {"status": "ok"}

    @app.post("/start_weight_update", dependencies=control)
    def start_weight_update() -> Any:
        # An update while requests decode kills vLLM; this engine insists on the pause too.
        if not engine.paused:
            return _conflict("pause the engine (POST /pause) before /start_weight_update")
        if VLLM_GROUP_NAME not in engine.groups:
            return _conflict("call /init_weight_transfer_engine first")
        engine.updating = True
        return {"status": "ok"}

    @app.post("/update_weights", dependencies=control)
    def update_weights(req: VLLMUpdateRequest) -> Any:
        info = req.update_info
        n = len(info.names)
        if len(info.dtype_names) != n or len(info.shapes) != n:
            raise InvalidRequest(
                "update_info.names", f"names, dtype_names and shapes differ in length ({n}, "
                f"{len(info.dtype_names)}, {len(info.shapes)})"
            )  # fmt: skip
        for i, d in enumerate(info.dtype_names):
            try:
                parse_dtype(d)
            except ValueError as e:
                raise InvalidRequest(f"update_info.dtype_names.{i}", str(e)) from None
        if not engine.updating:
            return _conflict("call /start_weight_update first")
        try:
            engine.vllm_update(req)
        except (ValueError, RuntimeError) as e:
            log.warning("update_weights failed: %s", e)
            return _fail(400, str(e))
        return {"status": "ok"}

    @app.post("/finish_weight_update", dependencies=control)
    def finish_weight_update(req: VLLMFinishRequest) -> Any:
        if not engine.updating:
            return _conflict("call /start_weight_update first")
        try:
            version = int(req.weight_version)
        except ValueError:
            raise InvalidRequest(
                "weight_version", f"{req.weight_version!r} is not an integer version"
            ) from None
        engine.vllm_finish(version)
        return {"status": "ok", "weight_version": req.weight_version}

    @app.post("/reset_prefix_cache", dependencies=control)
    def reset_prefix_cache() -> dict[str, str]:
        return {"status": "ok"}  # a KV cache lives for one batch here; there is no prefix cache

    @app.get("/weight_info")
    async def weight_info() -> dict[str, str]:
        shown = str(engine.weight_version) if engine.updated else VLLM_INITIAL_VERSION
        return {"weight_version": shown}

    return app
