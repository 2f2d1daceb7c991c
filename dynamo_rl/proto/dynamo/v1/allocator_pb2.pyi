from google.protobuf.internal import containers as _containers
from google.protobuf import descriptor as _descriptor
from google.protobuf import message as _message
from collections.abc import Iterable as _Iterable, Mapping as _Mapping
from typing import ClassVar as _ClassVar, Optional as _Optional, Union as _Union

DESCRIPTOR: _descriptor.FileDescriptor

class AllocateRequest(_message.Message):
    __slots__ = ("namespace", "prompt_ids", "budget", "n_per_prompt", "n_min", "n_max", "initial_budget", "mastery_threshold", "min_priority", "priority", "scheme")
    NAMESPACE_FIELD_NUMBER: _ClassVar[int]
    PROMPT_IDS_FIELD_NUMBER: _ClassVar[int]
    BUDGET_FIELD_NUMBER: _ClassVar[int]
    N_PER_PROMPT_FIELD_NUMBER: _ClassVar[int]
    N_MIN_FIELD_NUMBER: _ClassVar[int]
    N_MAX_FIELD_NUMBER: _ClassVar[int]
    INITIAL_BUDGET_FIELD_NUMBER: _ClassVar[int]
    MASTERY_THRESHOLD_FIELD_NUMBER: _ClassVar[int]
    MIN_PRIORITY_FIELD_NUMBER: _ClassVar[int]
    PRIORITY_FIELD_NUMBER: _ClassVar[int]
    SCHEME_FIELD_NUMBER: _ClassVar[int]
    namespace: str
    prompt_ids: _containers.RepeatedScalarFieldContainer[str]
    budget: int
    n_per_prompt: int
    n_min: int
    n_max: int
    initial_budget: int
    mastery_threshold: float
    min_priority: float
    priority: str
    scheme: str
    def __init__(self, namespace: _Optional[str] = ..., prompt_ids: _Optional[_Iterable[str]] = ..., budget: _Optional[int] = ..., n_per_prompt: _Optional[int] = ..., n_min: _Optional[int] = ..., n_max: _Optional[int] = ..., initial_budget: _Optional[int] = ..., mastery_threshold: _Optional[float] = ..., min_priority: _Optional[float] = ..., priority: _Optional[str] = ..., scheme: _Optional[str] = ...) -> None: ...

class AllocateResponse(_message.Message):
    __slots__ = ("counts", "priorities", "budget")
    COUNTS_FIELD_NUMBER: _ClassVar[int]
    PRIORITIES_FIELD_NUMBER: _ClassVar[int]
    BUDGET_FIELD_NUMBER: _ClassVar[int]
    counts: _containers.RepeatedScalarFieldContainer[int]
    priorities: _containers.RepeatedScalarFieldContainer[float]
    budget: int
    def __init__(self, counts: _Optional[_Iterable[int]] = ..., priorities: _Optional[_Iterable[float]] = ..., budget: _Optional[int] = ...) -> None: ...

class Outcome(_message.Message):
    __slots__ = ("prompt_id", "attempts", "successes")
    PROMPT_ID_FIELD_NUMBER: _ClassVar[int]
    ATTEMPTS_FIELD_NUMBER: _ClassVar[int]
    SUCCESSES_FIELD_NUMBER: _ClassVar[int]
    prompt_id: str
    attempts: int
    successes: int
    def __init__(self, prompt_id: _Optional[str] = ..., attempts: _Optional[int] = ..., successes: _Optional[int] = ...) -> None: ...

class ReportOutcomesRequest(_message.Message):
    __slots__ = ("namespace", "outcomes")
    NAMESPACE_FIELD_NUMBER: _ClassVar[int]
    OUTCOMES_FIELD_NUMBER: _ClassVar[int]
    namespace: str
    outcomes: _containers.RepeatedCompositeFieldContainer[Outcome]
    def __init__(self, namespace: _Optional[str] = ..., outcomes: _Optional[_Iterable[_Union[Outcome, _Mapping]]] = ...) -> None: ...

class ReportOutcomesResponse(_message.Message):
    __slots__ = ("ok", "prompts_updated")
    OK_FIELD_NUMBER: _ClassVar[int]
    PROMPTS_UPDATED_FIELD_NUMBER: _ClassVar[int]
    ok: bool
    prompts_updated: int
    def __init__(self, ok: _Optional[bool] = ..., prompts_updated: _Optional[int] = ...) -> None: ...

class GetStatsRequest(_message.Message):
    __slots__ = ("namespace", "prompt_ids")
    NAMESPACE_FIELD_NUMBER: _ClassVar[int]
    PROMPT_IDS_FIELD_NUMBER: _ClassVar[int]
    namespace: str
    prompt_ids: _containers.RepeatedScalarFieldContainer[str]
    def __init__(self, namespace: _Optional[str] = ..., prompt_ids: _Optional[_Iterable[str]] = ...) -> None: ...

class PromptStats(_message.Message):
    __slots__ = ("prompt_id", "samples", "successes", "updated_unix")
    PROMPT_ID_FIELD_NUMBER: _ClassVar[int]
    SAMPLES_FIELD_NUMBER: _ClassVar[int]
    SUCCESSES_FIELD_NUMBER: _ClassVar[int]
    UPDATED_UNIX_FIELD_NUMBER: _ClassVar[int]
    prompt_id: str
    samples: float
    successes: float
    updated_unix: float
    def __init__(self, prompt_id: _Optional[str] = ..., samples: _Optional[float] = ..., successes: _Optional[float] = ..., updated_unix: _Optional[float] = ...) -> None: ...

class GetStatsResponse(_message.Message):
    __slots__ = ("stats",)
    STATS_FIELD_NUMBER: _ClassVar[int]
    stats: _containers.RepeatedCompositeFieldContainer[PromptStats]
    def __init__(self, stats: _Optional[_Iterable[_Union[PromptStats, _Mapping]]] = ...) -> None: ...

class ResetNamespaceRequest(_message.Message):
    __slots__ = ("namespace",)
    NAMESPACE_FIELD_NUMBER: _ClassVar[int]
    namespace: str
    def __init__(self, namespace: _Optional[str] = ...) -> None: ...

class ResetNamespaceResponse(_message.Message):
    __slots__ = ("prompts_removed",)
    PROMPTS_REMOVED_FIELD_NUMBER: _ClassVar[int]
    prompts_removed: int
    def __init__(self, prompts_removed: _Optional[int] = ...) -> None: ...

class ExportNamespaceRequest(_message.Message):
    __slots__ = ("namespace",)
    NAMESPACE_FIELD_NUMBER: _ClassVar[int]
    namespace: str
    def __init__(self, namespace: _Optional[str] = ...) -> None: ...

class ExportNamespaceResponse(_message.Message):
    __slots__ = ("json",)
    JSON_FIELD_NUMBER: _ClassVar[int]
    json: str
    def __init__(self, json: _Optional[str] = ...) -> None: ...
