"""The reward service's HTTP contract: request and response models of every route.

One set of pydantic models, imported by both ends: the server (``services/reward/app.py``)
validates requests and serialises responses with them, the client
(``services/rollout/reward_client.py``) builds requests and parses responses with them, so a
field renamed on one side fails the other side's tests instead of a run.

- ``POST /v1/verify``: :class:`VerifyRequest` (a list of :data:`VerifyItem`, one model per
  ``kind``: :class:`MathItem`, :class:`CodeItem`, :class:`ModelItem`, :class:`JudgeItem`,
  :class:`ReasoningGymItem`) ->
  :class:`VerifyResponse` (one :class:`ItemResult` per item, in item order).
- ``POST /run_code``: :class:`RunCodeRequest` -> :class:`RunCodeResponse`, the subset of
  SandboxFusion's ``/run_code`` this service implements; it accepts what SandboxFusion's own
  client sends (``stdin: null``, ``files: {}``, its default timeouts).
- ``GET /healthz``: :class:`Health`.

Server-side checks that depend on the configuration (disabled kinds, case and item caps) are not
part of the models; they answer 422 with the same error shape as the models' own.
"""

from __future__ import annotations

from typing import Annotated, Any, Literal

from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator

from dynamo_rl.contracts import rg_entry

__all__ = [
    "KINDS",
    "AssertTests",
    "CallCase",
    "CallTests",
    "CodeItem",
    "CodeTests",
    "CommandRunResult",
    "Extraction",
    "Health",
    "ItemBase",
    "ItemId",
    "ItemResult",
    "JudgeItem",
    "Language",
    "MathItem",
    "ModelItem",
    "Reason",
    "ReasoningGymItem",
    "RunCodeRequest",
    "RunCodeResponse",
    "StdioCase",
    "StdioTests",
    "VerifyItem",
    "VerifyRequest",
    "VerifyResponse",
]

Language = Literal["python", "c", "cpp"]
"""Languages the sandbox compiles and runs."""

Extraction = Literal[
    "last_boxed",
    "math_verify",
    "answer_line",
    "whole_response",
    "gsm8k",
    "gsm8k_flexible",
    "qa_exact_match",
]
"""How a math item's answer is found in the response (docs/reward.md)."""

Reason = Literal[
    "ok",
    "wrong_answer",
    "no_answer",
    "timeout",
    "memory_limit",
    "runtime_error",
    "compile_error",
    "output_limit",
    "sandbox_error",
    "bad_ground_truth",
    "internal_error",
    "unparseable",
    "upstream_error",
    "model_error",
    "scorer_error",
]
"""Why an item scored what it did (see docs/reward.md for each)."""

ItemId = Annotated[
    str | int, Field(description="caller's id, echoed back", union_mode="left_to_right")
]

# ---------------------------------------------------------------------------------------------
# POST /v1/verify


class ItemBase(BaseModel):
    """Fields every item has; each kind's model adds ``kind`` and its own fields."""

    model_config = ConfigDict(extra="forbid")

    id: ItemId
    data_source: str | None = Field(
        None,
        description="routes the item to reward.composite.<data_source> (or '*') when the "
        "server has such a spec; otherwise the item is scored by its kind alone",
    )
    prompt: str | None = Field(
        None, description="the prompt's text (what reward-model and judge components read)"
    )
    response_length: int | None = Field(
        None, ge=0, description="the response's length in tokens (length components)"
    )


class MathItem(ItemBase):
    """A free-text response whose final answer is compared with ``ground_truth``."""

    kind: Literal["math"]
    response: str = Field(description="the model's full response")
    ground_truth: str = Field(min_length=1, description="reference answer (LaTeX or plain)")
    extraction: Extraction | None = Field(
        None,
        description="last_boxed: last \\boxed{} then an 'Answer:' line; math_verify: "
        "math-verify's LaTeX extraction, boxed first, several boxes combined; answer_line: the "
        "last 'Answer:' line only (the line must end with the answer); whole_response: "
        "math_verify when delimited, else the 'Answer:' line, else the whole response as one "
        "expression; gsm8k: the last '#### N'; gsm8k_flexible: the last number; qa_exact_match: "
        "the last <answer>...</answer> against the ground truth (or a JSON list of accepted "
        "answers), normalised. "
        "Absent: the route of the item's data_source (reward.routes), else last_boxed",
    )


class StdioCase(BaseModel):
    model_config = ConfigDict(extra="forbid")
    stdin: str = ""
    stdout: str = Field(description="expected output")


class StdioTests(BaseModel):
    model_config = ConfigDict(extra="forbid")
    type: Literal["stdio"]
    cases: list[StdioCase] = Field(min_length=1)


class AssertTests(BaseModel):
    model_config = ConfigDict(extra="forbid")
    type: Literal["assert"]
    code: str = Field(min_length=1, description="Python run after the program; must exit 0")


class CallCase(BaseModel):
    model_config = ConfigDict(extra="forbid")
    args: list[Any] = Field(description="positional arguments (JSON values)")
    expected: Any = Field(
        description="the return value (compared as JSON); a one-element list also matches its "
        "element, as in APPS"
    )
    expected_text: str | None = Field(
        None,
        description="the expected output as a LeetCode-style row writes it (text); a string "
        "return value equal to it also passes, as the text a printed result would be",
    )


class CallTests(BaseModel):
    """Call-based cases (APPS/TACO/LeetCode ``fn_name``): the program's function is called once per
    case, with the usual imports (``typing``, ``collections``, ``math``, ...) added before it."""

    model_config = ConfigDict(extra="forbid")
    type: Literal["call"]
    fn_name: str = Field(
        pattern=r"^[A-Za-z_][A-Za-z0-9_]*$",
        description="a top-level function, else a method of a class named Solution",
    )
    cases: list[CallCase] = Field(min_length=1)


CodeTests = Annotated[StdioTests | AssertTests | CallTests, Field(discriminator="type")]
"""A code item's tests; ``type`` picks the layout."""


class CodeItem(ItemBase):
    """A program (possibly inside a fenced block) and the tests it must pass."""

    kind: Literal["code"]
    response: str = Field(description="the model's response; the last fenced block is the program")
    language: Language = "python"
    tests: CodeTests
    scoring: Literal["fraction", "all_or_nothing"] = "fraction"
    first_cases: int | None = Field(
        None,
        ge=1,
        description="score on the first N cases only (verl's continuous scoring uses 10); "
        "absent: every case",
    )
    timeout_s: float | None = Field(
        None, gt=0, description="wall-clock limit per run (capped by the server)"
    )
    memory_mb: int | None = Field(
        None, ge=16, description="address space per process (capped by the server)"
    )

    @model_validator(mode="after")
    def _assert_needs_python(self) -> CodeItem:
        if self.tests.type in ("assert", "call") and self.language != "python":
            raise ValueError(
                f"tests.type {self.tests.type!r} is only supported with language 'python'"
            )
        return self


class ModelItem(ItemBase):
    """A (prompt, response) pair scored by a reward model."""

    kind: Literal["model"]
    prompt: str = Field(description="the prompt's text")
    response: str = Field(description="the model's full response")
    model: str | None = Field(
        None, description="name in reward.models; may be left out when the server has one"
    )


class JudgeItem(ItemBase):
    """A response to be rated by an LLM judge."""

    kind: Literal["judge"]
    prompt: str = Field(description="the prompt's text")
    response: str = Field(description="the model's full response")
    reference: str = Field("", description="a reference answer the template may show the judge")
    judge: str | None = Field(
        None, description="name in reward.judges; may be left out when the server has one"
    )


class ReasoningGymItem(ItemBase):
    """A response to a reasoning-gym entry, scored by the library's own ``score_answer`` for the
    entry's task (``dynamo-rl data reasoning-gym`` writes such rows; docs/data.md)."""

    kind: Literal["reasoning_gym"]
    data_source: str = Field(
        description="reasoning_gym/<task>: the task whose score_answer scores the response "
        f"(reasoning-gym {rg_entry.VERSION}'s tasks)"
    )
    response: str = Field(
        description="the model's full response; the answer scored is the last "
        "<answer>...</answer> in it, else the whole response"
    )
    entry: dict[str, Any] = Field(
        description="the reasoning-gym entry answered: question, answer (null when the task has "
        "no single answer), metadata, in the typed JSON form of dynamo_rl.contracts.rg_entry "
        "(tuples, sets and non-string keys tagged) as dynamo-rl data reasoning-gym writes it"
    )
    config: dict[str, Any] = Field(
        default_factory=dict,
        description="the task's generator options the entry was made with (its score_answer "
        "may read them); empty: the library's defaults",
    )

    @field_validator("data_source")
    @classmethod
    def _known_task(cls, v: str) -> str:
        if rg_entry.task_of(v) is None:
            raise ValueError(f"{v!r} is not {rg_entry.source_form()}")
        return v

    @field_validator("entry")
    @classmethod
    def _entry(cls, v: dict[str, Any]) -> dict[str, Any]:
        decoded = rg_entry.decode_entry(v)
        if not isinstance(decoded, dict):
            raise ValueError("expected the entry's question, answer and metadata")
        missing = [k for k in ("question", "answer", "metadata") if k not in decoded]
        if missing:
            raise ValueError(f"missing {', '.join(missing)} (an entry has question, answer, "
                             "metadata)")  # fmt: skip
        if decoded["answer"] is not None and not isinstance(decoded["answer"], str):
            raise ValueError("answer must be text or null")
        if not isinstance(decoded["metadata"], dict):
            raise ValueError("metadata must be an object")
        return v


VerifyItem = Annotated[
    MathItem | CodeItem | ModelItem | JudgeItem | ReasoningGymItem, Field(discriminator="kind")
]
"""One item of any kind; ``kind`` picks the model."""

KINDS: tuple[str, ...] = ("math", "code", "model", "judge", "reasoning_gym")
"""The ``kind`` values of :data:`VerifyItem`, in its order."""


class VerifyRequest(BaseModel):
    """``POST /v1/verify``: a batch of items (at most ``reward.max_items``)."""

    model_config = ConfigDict(extra="forbid")

    items: list[VerifyItem] = Field(description="at most reward.max_items items")


class ItemResult(BaseModel):
    """One item's verdict, in the order the items came."""

    id: ItemId
    score: float = Field(
        description="1/0 for math; fraction of passed cases for code; reasoning_gym: the "
        "library's score_answer (partial credit as it gives it)"
    )
    correct: bool = Field(description="full marks")
    format_ok: bool = Field(description="an answer (math) or a program (code) was found")
    reason: Reason
    detail: str = ""
    answer: str | None = Field(
        None,
        description="math and reasoning_gym: the final answer extracted from the response "
        "(maj@k votes on it)",
    )
    raw_score: float | None = Field(
        None, description="model kind: the reward model's raw output (score is normalised)"
    )
    components: dict[str, float] | None = Field(
        None,
        description="composite items: each component's unweighted score (0 when gated off; "
        "reward models also '<name>_raw'); score is the weighted total",
    )


class VerifyResponse(BaseModel):
    """``POST /v1/verify`` answer: one result per item, in item order."""

    results: list[ItemResult]


# ---------------------------------------------------------------------------------------------
# POST /run_code (SandboxFusion subset)


class RunCodeRequest(BaseModel):
    """Run one program once. Field names, types and defaults follow SandboxFusion's request, so
    its client's default request (``stdin: null``, ``files: {}``, ``fetch_files: []``, 10 s
    timeouts) is accepted; languages and extra files are this server's subset."""

    model_config = ConfigDict(extra="forbid")

    code: str = Field(description="the program")
    language: Language
    stdin: str | None = Field(None, description="standard input; null: none")
    run_timeout: float | None = Field(None, gt=0, description="seconds (capped by the server)")
    compile_timeout: float | None = Field(None, gt=0, description="seconds (capped by the server)")
    memory_limit_MB: int | None = Field(
        None, description="address space per process; -1 or absent: server default (capped)"
    )
    files: dict[str, str | None] = Field(
        default_factory=dict, description="unsupported: must be empty"
    )
    fetch_files: list[str] = Field(default_factory=list, description="unsupported: must be empty")

    @field_validator("memory_limit_MB")
    @classmethod
    def _memory(cls, v: int | None) -> int | None:
        if v is None or v == -1:
            return None
        if v < 16:
            raise ValueError("must be -1 (server default) or at least 16")
        return v

    @field_validator("files", "fetch_files")
    @classmethod
    def _empty(cls, v: dict[str, str | None] | list[str]) -> dict[str, str | None] | list[str]:
        if v:
            raise ValueError("extra files are not supported by this server; send it empty")
        return v


class CommandRunResult(BaseModel):
    status: Literal["Finished", "Error", "TimeLimitExceeded"]
    execution_time: float | None = None
    return_code: int | None = None
    stdout: str = ""
    stderr: str = ""
    truncated: bool = Field(False, description="output exceeded the server cap and was cut")


class RunCodeResponse(BaseModel):
    """SandboxFusion's response: ``status`` Success (exit 0) | Failed | SandboxError."""

    status: Literal["Success", "Failed", "SandboxError"]
    message: str = ""
    compile_result: CommandRunResult | None = None
    run_result: CommandRunResult | None = None
    executor_pod_name: str | None = None
    files: dict[str, str] = Field(default_factory=dict)


# ---------------------------------------------------------------------------------------------
# GET /healthz


class Health(BaseModel):
    """Liveness and what the server scores."""

    status: Literal["ok"]
    kinds: list[str] = Field(description="enabled item kinds")
    sandbox: Literal["bwrap", "unsafe-no-sandbox", "disabled"]
    pending: dict[str, int] = Field(description="items admitted (running + waiting) per kind")
    composite: list[str] = Field(description="data sources with a composite reward spec")
