"""The engine's generation API and its registry: request and response models both ends import.

The embedded engine (``services/engine/``) validates requests and builds its answers with these
models; the rollout clients (``services/rollout/engines/``) build requests and parse answers with
them, so a field renamed on one side fails the other side's tests instead of a run. The weight
updates are the other half of the engine's contract, :mod:`dynamo_rl.contracts.weight_control`.
No torch.

- ``POST /v1/completions`` (OpenAI, the subset an RL rollout uses plus vLLM's extensions):
  :class:`CompletionRequest` -> :class:`CompletionResponse` (:class:`CompletionChoice`,
  :class:`CompletionLogprobs`, :class:`CompletionUsage`).
- Scoring (on-policy distillation's teacher): the same ``POST /v1/completions`` with vLLM's
  ``prompt_logprobs: 0`` and the prompt and response as one token-id prompt
  (:func:`score_request`): each choice's ``prompt_logprobs`` holds, at every prompt position
  after the first, the log-probability of that position's token under the served model, unscaled
  by any temperature (:class:`PromptLogprob`; :func:`scored_logprobs` reads the response's).
  vLLM serves it; the embedded engine serves ``prompt_logprobs`` 0 only (no alternatives).
- ``POST /v1/chat/completions``: :mod:`dynamo_rl.contracts.chat` (the same request base and
  sampling fields).
- ``POST /generate`` (SGLang's native API): :class:`GenerateRequest` (its ``sampling_params``,
  :class:`SGLangSampling`) -> one :class:`GenerateItem`, or a list of them.
- Sampling: both APIs share their sampling fields, :class:`SamplingKnobs`. They are the HTTP edge
  of :class:`dynamo_rl.contracts.sampling.SamplingParams`, the one declaration of the settings:
  :func:`sampling_knobs` turns the settings into these fields (the rollout clients), and
  :meth:`SamplingKnobs.sampling` turns a request's fields back into the settings (the embedded
  engine). ``top_k`` -1, 0 or null is off on the wire (vLLM's and SGLang's spellings), None in
  the settings.
- Registry — ``engines_key(ns)`` is a Redis hash: field = the engine's base URL, value = JSON
  ``{"url", "weight_version", "registered_unix"}``. :class:`EngineRegistry` writes an entry,
  :func:`parse_registry` reads the hash (one parser for every reader).
- Pulse — ``engine_pulse_key(ns, url)`` is a counter the engine raises every :data:`PULSE_S`
  while its serving process runs, expiring :data:`PULSE_TTL_S` after the last raise
  (:class:`EnginePulse`; :func:`read_pulse` reads it). It tells a busy engine, slow to answer
  HTTP but running, from a stopped one (SIGSTOP, a hung host), whose pulse stands still: the
  learner's push waits ``learner.push.silent_s`` for the first and ``learner.push.stopped_s`` for
  the second. A counter, not a time stamp: no clock is compared across hosts.

Requests are strict: an unknown field is an error (422 naming it), so a typo such as
``max_token`` is not silently ignored; a few OpenAI fields that clients commonly send are accepted
when they ask for nothing this engine does not do (``stream: false``, ``echo: false``, ``user``).
A request goes on the wire as :meth:`EngineRequest.body`: only the fields the sender set and not
null, so vLLM and SGLang apply their own defaults to the rest. Answers ignore fields they do not
name (vLLM and SGLang send more than the embedded engine) and read a weight version that is not an
integer (SGLang's ``"default"``) as unknown. Checks that need the model (token ids inside the
vocabulary, the context length, the ``max_tokens`` cap) happen in the engine and answer 422 in the
same shape as the models' own.
"""

from __future__ import annotations

import json
import logging
import threading
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Annotated, Any, Literal

from pydantic import BaseModel, BeforeValidator, ConfigDict, Field, field_validator

from dynamo_rl.contracts.sampling import SamplingParams
from dynamo_rl.keys import engine_pulse_key, engines_key
from dynamo_rl.redis_client import redact_url, sync_client

log = logging.getLogger(__name__)

__all__ = [
    "ABORTED",
    "CompletionChoice",
    "CompletionLogprobs",
    "CompletionRequest",
    "CompletionResponse",
    "CompletionUsage",
    "EngineEntry",
    "EnginePulse",
    "EngineRegistry",
    "EngineRequest",
    "GenerateFinishReason",
    "GenerateItem",
    "GenerateMetaInfo",
    "GenerateRequest",
    "LogprobEntry",
    "PromptInput",
    "PromptLogprob",
    "SGLangSampling",
    "SamplingKnobs",
    "alist_engines",
    "list_engines",
    "parse_registry",
    "registry_value",
    "sampling_knobs",
    "score_request",
    "scored_logprobs",
]

ABORTED = "abort"
"""finish_reason of a request that a pause with mode=abort cut short (HTTP 200, truncated output)."""

TokenId = Annotated[int, Field(ge=0)]
PromptInput = str | list[str] | list[TokenId] | list[list[TokenId]]


def _int_or_none(value: Any) -> int | None:
    try:
        return None if value is None else int(value)
    except (TypeError, ValueError):
        return None


AnsweredVersion = Annotated[int | None, BeforeValidator(_int_or_none)]
"""The weight version an answer reports; one that is not an integer reads as unknown (None)."""


def check_prompt(v: Any, text_allowed: bool = True, ids_allowed: bool = True) -> Any:
    """A prompt: text, a list of texts, token ids, or a list of token-id lists.

    Written out by hand (not a pydantic union) so an error says what is wrong in plain words
    instead of listing every union member.
    """

    def is_id(x: Any) -> bool:
        return isinstance(x, int) and not isinstance(x, bool)

    def check_ids(ids: list[Any], where: str) -> None:
        if not ids:
            raise ValueError(f"{where} has no tokens")
        for t in ids:
            if not is_id(t):
                raise ValueError(f"{where}: token ids must be integers, got {t!r}")
            if t < 0:
                raise ValueError(f"{where}: token id {t} is negative")

    if isinstance(v, str):
        if not text_allowed:
            raise ValueError("expected token ids, got text")
        return v
    if not isinstance(v, list) or not v:
        raise ValueError("expected a non-empty string or list")
    if all(isinstance(p, str) for p in v):
        if not text_allowed:
            raise ValueError("expected token ids, got text")
        return v
    if not ids_allowed:
        raise ValueError("expected text")
    if all(isinstance(p, list) for p in v):
        for i, ids in enumerate(v):
            check_ids(ids, f"prompt {i}")
        return v
    check_ids(v, "prompt")
    return v


class EngineRequest(BaseModel):
    """A request body of an engine route: unknown fields are errors."""

    model_config = ConfigDict(extra="forbid")

    def body(self) -> dict[str, Any]:
        """The JSON body: the fields that were set and are not null, nothing else."""
        return self.model_dump(mode="json", exclude_unset=True, exclude_none=True)


class EngineAnswer(BaseModel):
    """An engine's answer: fields it does not name are ignored (real engines send more)."""

    def body(self) -> dict[str, Any]:
        """The JSON body: the fields that were set (an explicit null is sent as null)."""
        return self.model_dump(mode="json", exclude_unset=True)


# ---- sampling -------------------------------------------------------------------------------


class SamplingKnobs(EngineRequest):
    """The sampling fields both generation APIs share, under the same names."""

    n: Annotated[int, Field(ge=1, le=4096)] = 1
    temperature: Annotated[float, Field(ge=0, le=100)] = 1.0
    top_p: Annotated[float, Field(gt=0, le=1)] = 1.0
    top_k: Annotated[int, Field(ge=-1)] | None = None
    """None, -1 or 0: no top-k."""
    stop: str | list[str] | None = None
    stop_token_ids: list[TokenId] | None = None
    ignore_eos: bool = False
    skip_special_tokens: bool = True

    @field_validator("stop")
    @classmethod
    def _stop(cls, v: str | list[str] | None) -> str | list[str] | None:
        # An empty stop string would match before the first token.
        if v == "" or (isinstance(v, list) and any(s == "" for s in v)):
            raise ValueError("stop strings must not be empty")
        return v

    def sampling(self, max_tokens: int, seed: int | None = None) -> SamplingParams:
        """The settings these fields ask for, with the request's ``max_tokens`` and ``seed``
        (each API names them its own way); ``top_k`` -1, 0 or null: off (None)."""
        return SamplingParams(
            max_tokens=max_tokens,
            temperature=self.temperature,
            top_p=self.top_p,
            top_k=self.top_k,  # -1, 0 or null: off, which SamplingParams reads as None
            stop=(self.stop,) if isinstance(self.stop, str) else tuple(self.stop or ()),
            stop_token_ids=tuple(self.stop_token_ids or ()),
            seed=seed,
            ignore_eos=self.ignore_eos,
        )


def sampling_knobs(sampling: SamplingParams) -> dict[str, Any]:
    """The :class:`SamplingKnobs` fields ``sampling`` asks for, as the rollout clients have always
    sent them: None (not sent, the engine's own default applies) for top-k off and empty stop
    lists, ``ignore_eos`` only when set. ``max_tokens`` and ``seed`` go under each API's own
    names."""
    knobs: dict[str, Any] = dict(
        temperature=sampling.temperature,
        top_p=sampling.top_p,
        top_k=sampling.top_k,
        stop=list(sampling.stop) or None,
        stop_token_ids=list(sampling.stop_token_ids) or None,
    )
    if sampling.ignore_eos:
        knobs["ignore_eos"] = True
    return knobs


# ---- POST /v1/completions -------------------------------------------------------------------


class CompletionRequest(SamplingKnobs):
    """OpenAI ``POST /v1/completions`` (the subset an RL rollout uses, plus vLLM extensions)."""

    model: str | None = None
    prompt: PromptInput
    max_tokens: Annotated[int, Field(ge=0)] | None = None
    seed: int | None = None
    logprobs: Annotated[int, Field(ge=0)] | None = None
    """Top log-probs per token; 0 returns only the sampled token's (``token_logprobs``)."""
    return_token_ids: bool | None = None
    """vLLM's extension: each choice carries ``token_ids`` and ``prompt_token_ids``."""
    prompt_logprobs: Annotated[int, Field(ge=0)] | None = None
    """vLLM's extension: each choice carries ``prompt_logprobs``, the prompt tokens' own
    log-probabilities (plus this many alternatives; the embedded engine serves 0 only)."""
    stream: Literal[False] = False
    echo: Literal[False] = False
    user: str | None = None

    @field_validator("prompt", mode="plain")
    @classmethod
    def _prompt(cls, v: Any) -> Any:
        return check_prompt(v)


class CompletionLogprobs(EngineAnswer):
    tokens: list[str] = Field(default_factory=list)
    token_logprobs: list[float] | None = None
    """The sampled tokens' log-probabilities, one per token."""
    top_logprobs: list[dict[str, float] | None] | None = None
    text_offset: list[int] = Field(default_factory=list)


class PromptLogprob(EngineAnswer):
    """vLLM's ``Logprob``: a token's log-probability at one prompt position."""

    logprob: float
    rank: int | None = None
    """1 + how many tokens the model found more likely there."""
    decoded_token: str | None = None


class CompletionChoice(EngineAnswer):
    index: int = 0
    text: str | None = None
    logprobs: CompletionLogprobs | None = None
    finish_reason: str | None = None
    """"stop" | "length" | :data:`ABORTED`."""
    stop_reason: int | str | None = None
    """The stop string or token id that ended it."""
    token_ids: list[int] | None = None
    prompt_token_ids: list[int] | None = None
    weight_version: AnsweredVersion = None
    """A choice's own version, where an engine sends one (else the response's)."""
    weight_versions: list[int] | None = None
    """The embedded engine's extension: the weight version that sampled each token (one per
    token id; two or more values when the choice spans an interruptible update)."""
    prompt_logprobs: list[dict[str, PromptLogprob] | None] | None = None
    """vLLM's extension, asked for with ``prompt_logprobs``: one entry per prompt token, None
    for the first (nothing precedes it), else the token's log-probability keyed by its id (and
    the alternatives asked for)."""


class CompletionUsage(EngineAnswer):
    prompt_tokens: int = 0
    completion_tokens: int | None = 0
    total_tokens: int = 0


class CompletionResponse(EngineAnswer):
    id: str = ""
    object: str = "text_completion"
    created: int = 0
    model: str = ""
    choices: list[CompletionChoice]
    usage: CompletionUsage | None = None
    weight_version: AnsweredVersion = None
    """The embedded engine's extension: the oldest version that sampled any choice."""


def score_request(
    model: str | None, prompt_token_ids: list[int], response_token_ids: list[int]
) -> CompletionRequest:
    """The request that scores ``response_token_ids`` after ``prompt_token_ids``: both as one
    token-id prompt with ``prompt_logprobs: 0``, one greedy token sampled (vLLM samples at least
    one; its prompt log-probs ignore the temperature)."""
    return CompletionRequest(
        model=model, prompt=prompt_token_ids + response_token_ids, max_tokens=1,
        temperature=0.0, prompt_logprobs=0,
    )  # fmt: skip


def scored_logprobs(choice: CompletionChoice, ids: list[int], start: int) -> list[float]:
    """The log-probabilities of ``ids[start:]`` (``start`` >= 1) in a choice that scored the
    prompt ``ids`` (:func:`score_request`); ValueError when the choice does not hold one for
    each of them."""
    entries = choice.prompt_logprobs
    if entries is None:
        raise ValueError("the choice has no prompt_logprobs (the engine must support them)")
    if len(entries) != len(ids):
        raise ValueError(f"{len(entries)} prompt_logprobs entries for a {len(ids)}-token prompt")
    out = []
    for i in range(start, len(ids)):
        entry = entries[i]
        found = None if entry is None else entry.get(str(ids[i]))
        if found is None:
            raise ValueError(f"prompt_logprobs entry {i} has no log-prob of token {ids[i]}")
        out.append(found.logprob)
    return out


# ---- POST /generate -------------------------------------------------------------------------


class SGLangSampling(SamplingKnobs):
    """SGLang's ``sampling_params`` (the subset an RL rollout uses)."""

    max_new_tokens: Annotated[int, Field(ge=0)] | None = None
    sampling_seed: int | None = None


class GenerateRequest(EngineRequest):
    """SGLang native ``POST /generate``: ``text`` or ``input_ids``, single or batch."""

    text: str | list[str] | None = None
    input_ids: list[int] | list[list[int]] | None = None
    sampling_params: SGLangSampling = SGLangSampling()
    return_logprob: bool = False
    top_logprobs_num: Annotated[int, Field(ge=0)] = 0
    logprob_start_len: int | None = None
    stream: Literal[False] = False
    rid: str | list[str] | None = None
    lora_path: str | None = None
    """The LoRA adapter to sample with, by the name it was loaded under (SGLang's field); null:
    the base model."""

    @field_validator("text", mode="plain")
    @classmethod
    def _text(cls, v: Any) -> Any:
        return None if v is None else check_prompt(v, ids_allowed=False)

    @field_validator("input_ids", mode="plain")
    @classmethod
    def _input_ids(cls, v: Any) -> Any:
        return None if v is None else check_prompt(v, text_allowed=False)


LogprobEntry = tuple[float, int, str | None]
"""SGLang's ``[logprob, token_id, token_text]`` (the text is null unless asked for)."""


class GenerateFinishReason(EngineAnswer):
    type: str | None = None
    """"stop" | "length" | :data:`ABORTED`."""
    matched: int | str | None = None
    length: int | None = None
    message: str | None = None


class GenerateMetaInfo(EngineAnswer):
    id: str = ""
    finish_reason: GenerateFinishReason | str | None = None
    prompt_tokens: int = 0
    completion_tokens: int = 0
    cached_tokens: int = 0
    weight_version: AnsweredVersion = None
    weight_versions: list[int] | None = None
    """The embedded engine's extension: the weight version of each output token."""
    e2e_latency: float = 0.0
    output_token_logprobs: list[LogprobEntry] | None = None
    output_top_logprobs: list[list[LogprobEntry] | None] | None = None

    def finish(self) -> str:
        """The finish reason's type ("stop" when the engine gives none)."""
        reason = self.finish_reason
        if isinstance(reason, GenerateFinishReason):
            return reason.type or "stop"
        return reason or "stop"


class GenerateItem(EngineAnswer):
    """One sample of a ``/generate`` answer (a list of them when ``n`` > 1 or a batch)."""

    text: str | None = None
    output_ids: list[int] | None = None
    meta_info: GenerateMetaInfo


# ---- registry -------------------------------------------------------------------------------


@dataclass(frozen=True)
class EngineEntry:
    """One registered engine."""

    url: str
    weight_version: int | None = None
    registered_unix: float = 0.0


def registry_value(url: str, weight_version: int) -> str:
    """The JSON stored under ``url`` in ``engines_key(ns)``."""
    return json.dumps(
        {"url": url, "weight_version": weight_version, "registered_unix": time.time()}
    )


def parse_registry(entries: Mapping[Any, Any]) -> list[EngineEntry]:
    """Engines from ``HGETALL engines_key(ns)``: sorted by URL (stable group ranks), one per URL.

    A value that is not our JSON still names an engine: the hash field is its URL."""
    out: dict[str, EngineEntry] = {}
    for key, raw in entries.items():
        url = key.decode() if isinstance(key, bytes) else str(key)
        version: int | None = None
        stamp = 0.0
        try:
            info = json.loads(raw)
            if isinstance(info, dict):
                url = str(info.get("url") or url)
                v = info.get("weight_version")
                version = None if v is None else int(v)
                stamp = float(info.get("registered_unix") or 0.0)
        except (ValueError, TypeError):
            pass
        url = url.rstrip("/")
        out[url] = EngineEntry(url, version, stamp)
    return [out[u] for u in sorted(out)]


def list_engines(client: Any, namespace: str) -> list[EngineEntry]:
    """Registered engines, read with a sync Redis client."""
    return parse_registry(client.hgetall(engines_key(namespace)))


async def alist_engines(client: Any, namespace: str) -> list[EngineEntry]:
    """Registered engines, read with an async Redis client."""
    return parse_registry(await client.hgetall(engines_key(namespace)))


class EngineRegistry:
    """An engine's own entry in ``engines_key(ns)``; Redis trouble is logged, never fatal."""

    def __init__(self, redis_url: str, namespace: str, url: str) -> None:
        self.redis_url = redis_url
        self.key = engines_key(namespace)
        self.url = url.rstrip("/")

    def register(self, weight_version: int) -> bool:
        try:
            client = sync_client(self.redis_url)
            try:
                client.hset(self.key, self.url, registry_value(self.url, weight_version))
            finally:
                client.close()
        except Exception as e:  # Redis is optional for an engine
            log.warning("could not register in Redis at %s: %s", redact_url(self.redis_url), e)
            return False
        return True

    def unregister(self) -> None:
        try:
            client = sync_client(self.redis_url)
            try:
                client.hdel(self.key, self.url)
            finally:
                client.close()
        except Exception as e:
            log.warning("could not unregister from Redis: %s", e)


PULSE_S = 1.0
"""How often a serving engine raises its pulse (:class:`EnginePulse`)."""
PULSE_TTL_S = 300
"""A pulse no longer raised (an engine killed with ``kill -9``, or stopped that long) expires:
a server without a pulse taking the URL over later is not judged by a stale one."""


class EnginePulse:
    """An engine's pulse, ``engine_pulse_key(ns, url)``: a counter raised every :data:`PULSE_S`
    on a thread of its own while ``running()`` says the serving process runs (the embedded
    engine: always, from inside that process; the vLLM launcher: while no process under it is
    stopped). A stopped or hung engine's pulse stands still. Redis trouble is logged once, never
    fatal; the pulse goes on when Redis is back. :meth:`stop` removes it."""

    def __init__(
        self, redis_url: str, namespace: str, url: str, running: Callable[[], bool] | None = None
    ) -> None:
        self.redis_url = redis_url
        self.key = engine_pulse_key(namespace, url)
        self.running = running or (lambda: True)
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True, name="engine-pulse")

    def start(self) -> EnginePulse:
        self._thread.start()
        return self

    def _run(self) -> None:
        client = sync_client(self.redis_url)
        failing = False
        try:
            while not self._stop.is_set():
                try:
                    running = self.running()
                except Exception as e:
                    log.warning("engine pulse: cannot tell whether the engine runs: %s", e)
                    running = True
                try:
                    if running:
                        pipe = client.pipeline(transaction=False)
                        pipe.incr(self.key)
                        pipe.expire(self.key, PULSE_TTL_S)
                        pipe.execute()
                    failing = False
                except Exception as e:
                    if not failing:
                        log.warning("engine pulse: could not write to Redis at %s: %s",
                                    redact_url(self.redis_url), e)  # fmt: skip
                    failing = True
                self._stop.wait(PULSE_S)
            client.delete(self.key)  # after the last raise: none can land behind it
        except Exception as e:
            log.warning("could not remove the engine pulse from Redis: %s", e)
        finally:
            client.close()

    def stop(self) -> None:
        """Stop the pulse and remove it (the engine is shutting down)."""
        self._stop.set()
        self._thread.join()


def read_pulse(client: Any, namespace: str, url: str) -> int | None:
    """An engine's pulse counter (None: it has none, e.g. not registered in Redis, an SGLang
    server, or one whose pulse expired), read with a sync Redis client."""
    raw = client.get(engine_pulse_key(namespace, url))
    return None if raw is None else int(raw)
