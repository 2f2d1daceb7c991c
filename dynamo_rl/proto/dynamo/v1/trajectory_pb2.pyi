from google.protobuf.internal import containers as _containers
from google.protobuf import descriptor as _descriptor
from google.protobuf import message as _message
from collections.abc import Iterable as _Iterable, Mapping as _Mapping
from typing import ClassVar as _ClassVar, Optional as _Optional, Union as _Union

DESCRIPTOR: _descriptor.FileDescriptor

class SamplingRecord(_message.Message):
    __slots__ = ("temperature", "top_p", "top_k", "max_tokens", "seed")
    TEMPERATURE_FIELD_NUMBER: _ClassVar[int]
    TOP_P_FIELD_NUMBER: _ClassVar[int]
    TOP_K_FIELD_NUMBER: _ClassVar[int]
    MAX_TOKENS_FIELD_NUMBER: _ClassVar[int]
    SEED_FIELD_NUMBER: _ClassVar[int]
    temperature: float
    top_p: float
    top_k: int
    max_tokens: int
    seed: int
    def __init__(self, temperature: _Optional[float] = ..., top_p: _Optional[float] = ..., top_k: _Optional[int] = ..., max_tokens: _Optional[int] = ..., seed: _Optional[int] = ...) -> None: ...

class Response(_message.Message):
    __slots__ = ("token_ids", "logprobs", "reward", "correct", "format_ok", "reason", "finish_reason", "reward_components", "text", "loss_mask", "turns", "prompt_token_ids", "episode", "segment", "end_reason", "weight_versions", "teacher_logprobs")
    class RewardComponentsEntry(_message.Message):
        __slots__ = ("key", "value")
        KEY_FIELD_NUMBER: _ClassVar[int]
        VALUE_FIELD_NUMBER: _ClassVar[int]
        key: str
        value: float
        def __init__(self, key: _Optional[str] = ..., value: _Optional[float] = ...) -> None: ...
    TOKEN_IDS_FIELD_NUMBER: _ClassVar[int]
    LOGPROBS_FIELD_NUMBER: _ClassVar[int]
    REWARD_FIELD_NUMBER: _ClassVar[int]
    CORRECT_FIELD_NUMBER: _ClassVar[int]
    FORMAT_OK_FIELD_NUMBER: _ClassVar[int]
    REASON_FIELD_NUMBER: _ClassVar[int]
    FINISH_REASON_FIELD_NUMBER: _ClassVar[int]
    REWARD_COMPONENTS_FIELD_NUMBER: _ClassVar[int]
    TEXT_FIELD_NUMBER: _ClassVar[int]
    LOSS_MASK_FIELD_NUMBER: _ClassVar[int]
    TURNS_FIELD_NUMBER: _ClassVar[int]
    PROMPT_TOKEN_IDS_FIELD_NUMBER: _ClassVar[int]
    EPISODE_FIELD_NUMBER: _ClassVar[int]
    SEGMENT_FIELD_NUMBER: _ClassVar[int]
    END_REASON_FIELD_NUMBER: _ClassVar[int]
    WEIGHT_VERSIONS_FIELD_NUMBER: _ClassVar[int]
    TEACHER_LOGPROBS_FIELD_NUMBER: _ClassVar[int]
    token_ids: _containers.RepeatedScalarFieldContainer[int]
    logprobs: _containers.RepeatedScalarFieldContainer[float]
    reward: float
    correct: bool
    format_ok: bool
    reason: str
    finish_reason: str
    reward_components: _containers.ScalarMap[str, float]
    text: str
    loss_mask: _containers.RepeatedScalarFieldContainer[int]
    turns: _containers.RepeatedCompositeFieldContainer[Turn]
    prompt_token_ids: _containers.RepeatedScalarFieldContainer[int]
    episode: int
    segment: int
    end_reason: str
    weight_versions: _containers.RepeatedScalarFieldContainer[int]
    teacher_logprobs: _containers.RepeatedScalarFieldContainer[float]
    def __init__(self, token_ids: _Optional[_Iterable[int]] = ..., logprobs: _Optional[_Iterable[float]] = ..., reward: _Optional[float] = ..., correct: _Optional[bool] = ..., format_ok: _Optional[bool] = ..., reason: _Optional[str] = ..., finish_reason: _Optional[str] = ..., reward_components: _Optional[_Mapping[str, float]] = ..., text: _Optional[str] = ..., loss_mask: _Optional[_Iterable[int]] = ..., turns: _Optional[_Iterable[_Union[Turn, _Mapping]]] = ..., prompt_token_ids: _Optional[_Iterable[int]] = ..., episode: _Optional[int] = ..., segment: _Optional[int] = ..., end_reason: _Optional[str] = ..., weight_versions: _Optional[_Iterable[int]] = ..., teacher_logprobs: _Optional[_Iterable[float]] = ...) -> None: ...

class ToolCall(_message.Message):
    __slots__ = ("name", "arguments", "error", "latency_s", "malformed")
    NAME_FIELD_NUMBER: _ClassVar[int]
    ARGUMENTS_FIELD_NUMBER: _ClassVar[int]
    ERROR_FIELD_NUMBER: _ClassVar[int]
    LATENCY_S_FIELD_NUMBER: _ClassVar[int]
    MALFORMED_FIELD_NUMBER: _ClassVar[int]
    name: str
    arguments: str
    error: str
    latency_s: float
    malformed: bool
    def __init__(self, name: _Optional[str] = ..., arguments: _Optional[str] = ..., error: _Optional[str] = ..., latency_s: _Optional[float] = ..., malformed: _Optional[bool] = ...) -> None: ...

class Turn(_message.Message):
    __slots__ = ("start", "end", "observation_end", "reward", "has_reward", "tool_calls", "weight_version", "text", "observation")
    START_FIELD_NUMBER: _ClassVar[int]
    END_FIELD_NUMBER: _ClassVar[int]
    OBSERVATION_END_FIELD_NUMBER: _ClassVar[int]
    REWARD_FIELD_NUMBER: _ClassVar[int]
    HAS_REWARD_FIELD_NUMBER: _ClassVar[int]
    TOOL_CALLS_FIELD_NUMBER: _ClassVar[int]
    WEIGHT_VERSION_FIELD_NUMBER: _ClassVar[int]
    TEXT_FIELD_NUMBER: _ClassVar[int]
    OBSERVATION_FIELD_NUMBER: _ClassVar[int]
    start: int
    end: int
    observation_end: int
    reward: float
    has_reward: bool
    tool_calls: _containers.RepeatedCompositeFieldContainer[ToolCall]
    weight_version: int
    text: str
    observation: str
    def __init__(self, start: _Optional[int] = ..., end: _Optional[int] = ..., observation_end: _Optional[int] = ..., reward: _Optional[float] = ..., has_reward: _Optional[bool] = ..., tool_calls: _Optional[_Iterable[_Union[ToolCall, _Mapping]]] = ..., weight_version: _Optional[int] = ..., text: _Optional[str] = ..., observation: _Optional[str] = ...) -> None: ...

class Timing(_message.Message):
    __slots__ = ("created_unix", "generate_s", "verify_s")
    CREATED_UNIX_FIELD_NUMBER: _ClassVar[int]
    GENERATE_S_FIELD_NUMBER: _ClassVar[int]
    VERIFY_S_FIELD_NUMBER: _ClassVar[int]
    created_unix: float
    generate_s: float
    verify_s: float
    def __init__(self, created_unix: _Optional[float] = ..., generate_s: _Optional[float] = ..., verify_s: _Optional[float] = ...) -> None: ...

class TrajectoryGroup(_message.Message):
    __slots__ = ("prompt_id", "prompt_token_ids", "responses", "weight_version", "sampling", "data_source", "namespace", "prompt_text", "timing", "worker_id", "allocated_n", "priority", "batch_id", "dropped_groups", "dropped_rollouts", "dropped_tokens", "skipped_prompts")
    PROMPT_ID_FIELD_NUMBER: _ClassVar[int]
    PROMPT_TOKEN_IDS_FIELD_NUMBER: _ClassVar[int]
    RESPONSES_FIELD_NUMBER: _ClassVar[int]
    WEIGHT_VERSION_FIELD_NUMBER: _ClassVar[int]
    SAMPLING_FIELD_NUMBER: _ClassVar[int]
    DATA_SOURCE_FIELD_NUMBER: _ClassVar[int]
    NAMESPACE_FIELD_NUMBER: _ClassVar[int]
    PROMPT_TEXT_FIELD_NUMBER: _ClassVar[int]
    TIMING_FIELD_NUMBER: _ClassVar[int]
    WORKER_ID_FIELD_NUMBER: _ClassVar[int]
    ALLOCATED_N_FIELD_NUMBER: _ClassVar[int]
    PRIORITY_FIELD_NUMBER: _ClassVar[int]
    BATCH_ID_FIELD_NUMBER: _ClassVar[int]
    DROPPED_GROUPS_FIELD_NUMBER: _ClassVar[int]
    DROPPED_ROLLOUTS_FIELD_NUMBER: _ClassVar[int]
    DROPPED_TOKENS_FIELD_NUMBER: _ClassVar[int]
    SKIPPED_PROMPTS_FIELD_NUMBER: _ClassVar[int]
    prompt_id: str
    prompt_token_ids: _containers.RepeatedScalarFieldContainer[int]
    responses: _containers.RepeatedCompositeFieldContainer[Response]
    weight_version: int
    sampling: SamplingRecord
    data_source: str
    namespace: str
    prompt_text: str
    timing: Timing
    worker_id: str
    allocated_n: int
    priority: float
    batch_id: str
    dropped_groups: int
    dropped_rollouts: int
    dropped_tokens: int
    skipped_prompts: int
    def __init__(self, prompt_id: _Optional[str] = ..., prompt_token_ids: _Optional[_Iterable[int]] = ..., responses: _Optional[_Iterable[_Union[Response, _Mapping]]] = ..., weight_version: _Optional[int] = ..., sampling: _Optional[_Union[SamplingRecord, _Mapping]] = ..., data_source: _Optional[str] = ..., namespace: _Optional[str] = ..., prompt_text: _Optional[str] = ..., timing: _Optional[_Union[Timing, _Mapping]] = ..., worker_id: _Optional[str] = ..., allocated_n: _Optional[int] = ..., priority: _Optional[float] = ..., batch_id: _Optional[str] = ..., dropped_groups: _Optional[int] = ..., dropped_rollouts: _Optional[int] = ..., dropped_tokens: _Optional[int] = ..., skipped_prompts: _Optional[int] = ...) -> None: ...
