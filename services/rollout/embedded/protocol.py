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

    @field_validator("prompt")
    @classmethod
    def _non_empty(cls, v: Any) -> Any:
        if isinstance(v, list) and not v:
            raise ValueError("prompt must not be an empty list")
        if isinstance(v, list) and any(isinstance(p, list) and not p for p in v):
            raise ValueError("a token-id prompt must hold at least one token")
        return v


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


class GenerateRequest(_Strict):
    """SGLang native ``POST /generate``: ``text`` or ``input_ids``, single or batch."""

    text: str | list[str] | None = None
    input_ids: list[TokenId] | list[list[TokenId]] | None = None
    sampling_params: SGLangSamplingParams = SGLangSamplingParams()
    return_logprob: bool = False
    top_logprobs_num: Annotated[int, Field(ge=0)] = 0
    logprob_start_len: int | None = None
    stream: Literal[False] = False
    rid: str | list[str] | None = None


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
