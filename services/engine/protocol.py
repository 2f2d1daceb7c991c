"""Request bodies of the engine's HTTP routes (pydantic, no torch).

Unknown fields are errors (422 naming the field), so a typo such as ``max_token`` is not silently
ignored. A few OpenAI fields that clients commonly send are accepted when they ask for nothing this
engine does not do (``stream: false``, ``echo: false``, ``user``). Checks that need the model
(token ids inside the vocabulary, the context length, the ``max_tokens`` cap) happen in the server
and answer 422 in the same shape.
"""

from __future__ import annotations

from typing import Annotated, Any, Literal

from pydantic import BaseModel, ConfigDict, Field, field_validator

TokenId = Annotated[int, Field(ge=0)]
PromptInput = str | list[str] | list[TokenId] | list[list[TokenId]]


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


def check_stop(v: str | list[str] | None) -> str | list[str] | None:
    """An empty stop string would match before the first token: refuse it."""
    if v == "" or (isinstance(v, list) and any(s == "" for s in v)):
        raise ValueError("stop strings must not be empty")
    return v


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid")


class CompletionRequest(_Strict):
    """OpenAI ``POST /v1/completions`` (the subset an RL rollout uses, plus vLLM extensions)."""

    model: str | None = None
    prompt: PromptInput
    n: Annotated[int, Field(ge=1, le=4096)] = 1
    max_tokens: Annotated[int, Field(ge=0)] | None = None
    temperature: Annotated[float, Field(ge=0, le=100)] = 1.0
    top_p: Annotated[float, Field(gt=0, le=1)] = 1.0
    top_k: Annotated[int, Field(ge=-1)] = -1
    stop: str | list[str] | None = None
    stop_token_ids: list[TokenId] | None = None
    seed: int | None = None
    logprobs: Annotated[int, Field(ge=0)] | None = None
    return_token_ids: bool | None = None
    ignore_eos: bool = False
    skip_special_tokens: bool = True
    stream: Literal[False] = False
    echo: Literal[False] = False
    user: str | None = None

    @field_validator("stop")
    @classmethod
    def _stop(cls, v: Any) -> Any:
        return check_stop(v)

    @field_validator("prompt", mode="plain")
    @classmethod
    def _prompt(cls, v: Any) -> Any:
        return check_prompt(v)


class SGLangSamplingParams(_Strict):
    """SGLang's ``sampling_params`` (the subset an RL rollout uses)."""

    max_new_tokens: Annotated[int, Field(ge=0)] | None = None
    temperature: Annotated[float, Field(ge=0, le=100)] = 1.0
    top_p: Annotated[float, Field(gt=0, le=1)] = 1.0
    top_k: Annotated[int, Field(ge=-1)] = -1
    n: Annotated[int, Field(ge=1, le=4096)] = 1
    stop: str | list[str] | None = None
    stop_token_ids: list[TokenId] | None = None
    ignore_eos: bool = False
    skip_special_tokens: bool = True
    sampling_seed: int | None = None

    @field_validator("stop")
    @classmethod
    def _stop(cls, v: Any) -> Any:
        return check_stop(v)


class GenerateRequest(_Strict):
    """SGLang native ``POST /generate``: ``text`` or ``input_ids``, single or batch."""

    text: str | list[str] | None = None
    input_ids: list[int] | list[list[int]] | None = None
    sampling_params: SGLangSamplingParams = SGLangSamplingParams()
    return_logprob: bool = False
    top_logprobs_num: Annotated[int, Field(ge=0)] = 0
    logprob_start_len: int | None = None
    stream: Literal[False] = False
    rid: str | list[str] | None = None

    @field_validator("text", mode="plain")
    @classmethod
    def _text(cls, v: Any) -> Any:
        return None if v is None else check_prompt(v, ids_allowed=False)

    @field_validator("input_ids", mode="plain")
    @classmethod
    def _input_ids(cls, v: Any) -> Any:
        return None if v is None else check_prompt(v, text_allowed=False)


class InitWeightsUpdateGroupRequest(_Strict):
    master_address: str
    master_port: Annotated[int, Field(ge=1, le=65535)]
    rank_offset: Annotated[int, Field(ge=1)]
    world_size: Annotated[int, Field(ge=2)]
    group_name: str = "weight_update_group"
    backend: Literal["gloo", "nccl"] = "gloo"


class UpdateWeightsFromDistributedRequest(_Strict):
    names: list[str]
    dtypes: list[str]
    shapes: list[list[Annotated[int, Field(ge=0)]]]
    group_name: str = "weight_update_group"
    weight_version: int | None = None
    """New version; when left out the engine's version goes up by one."""
    flush_cache: bool = True
    """Accepted for SGLang compatibility; this engine keeps no cache between batches."""


class UpdateWeightsFromDiskRequest(_Strict):
    model_path: str
    weight_version: int | None = None
    load_format: str | None = None
    flush_cache: bool = True


class VLLMInitInfo(_Strict):
    master_address: str
    master_port: Annotated[int, Field(ge=1, le=65535)]
    rank_offset: Annotated[int, Field(ge=1)]
    world_size: Annotated[int, Field(ge=2)]
    bucket_bytes: Annotated[int, Field(ge=0)] = 0
    """Flat buckets of at most this many bytes (dynamo_rl.contracts.weight_layout, as the vLLM
    plugin's gloo backend); 0: one broadcast per tensor."""
    timeout_s: Annotated[float, Field(gt=0)] | None = None
    """The group's timeout (None: engine.weight_update_timeout_s)."""
    packed: bool = False  # vLLM nccl's own packing (not supported; bucket_bytes is ours)

    @field_validator("packed")
    @classmethod
    def _unpacked(cls, v: bool) -> bool:
        if v:
            raise ValueError(
                "this engine does not take vLLM nccl's packed layout (packed=false; flat "
                "buckets are bucket_bytes)"
            )
        return v


class VLLMInitRequest(_Strict):
    """``POST /init_weight_transfer_engine`` (vLLM's weight-transfer API)."""

    init_info: VLLMInitInfo


class VLLMUpdateInfo(_Strict):
    names: list[str]
    dtype_names: list[str]
    shapes: list[list[Annotated[int, Field(ge=0)]]]


class VLLMUpdateRequest(_Strict):
    """``POST /update_weights``: the tensors the trainer broadcasts next, in order."""

    update_info: VLLMUpdateInfo


class VLLMFinishRequest(_Strict):
    """``POST /finish_weight_update``: vLLM's versions are strings."""

    weight_version: str
