"""The reward service's section: where it listens, request limits, the math pool, the sandbox,
reward models, LLM judges and composite rewards per data source.

Every limit has a default that is safe on a shared machine; per-item limits sent by clients
(``timeout_s``, ``memory_mb``) are capped by the ``max_*`` values here, never raised above them.

Routes (``routes.<data_source>``) say how items of a data source are scored when the items do not
say so themselves; verl's data-source names have routes by default (:data:`DEFAULT_ROUTES`), so a
verl parquet is scored as verl scores it without any configuration.

Composite specs (``composite.<data_source>``) are checked here, when the config is loaded, so a
mistake stops the service at start-up with the key named: an unknown component kind, a weight
that is not a number, a gate or ``correct_from`` naming no component, a ``model``/``judge``
component naming no entry of ``models``/``judges``, a regex that does not compile. Whether a
model directory exists is checked by ``dynamo-rl reward`` itself (the config may be validated on
another machine).
"""

from __future__ import annotations

import fnmatch
import os
import re
from collections.abc import Mapping
from pathlib import PurePosixPath
from typing import Annotated, Literal

from pydantic import Field, field_validator, model_validator

from dynamo_rl.config.base import Section
from dynamo_rl.config.common import Host, Port
from dynamo_rl.contracts.reward import Extraction


class RewardMathConfig(Section):
    """Math verification: a pool of worker processes running math-verify."""

    workers: Annotated[int, Field(ge=1, le=256)] | None = None
    """Worker processes; each scores the items of a batch one by one on its own main thread.
    Unset: one per CPU this process may run on (``os.sched_getaffinity``)."""
    batch_size: Annotated[int, Field(ge=1, le=4096)] = 64
    """Most items sent to a worker in one message (one IPC round trip); a burst is split evenly
    over the workers up to this."""
    fast_path: bool = True
    """Decide plain-number answers (``\\boxed{42}`` against ``42``) and identical simple forms in
    the service process, without math-verify: the verdicts are math-verify's (see
    ``services/reward/math_fast.py``). False sends every item to the workers."""
    dedup: bool = True
    """Items in flight with the same ground truth, extraction mode and extracted answer share one
    math-verify call (16 samples of a prompt often give the same answer)."""
    timeout_s: Annotated[float, Field(gt=0, le=600)] = 10.0
    """Hard per-item limit: a worker still busy after this is killed, replaced, and the item
    scores 0 with reason ``timeout``."""
    max_pending: Annotated[int, Field(ge=1)] = 4096
    """Math items admitted at once (running + waiting); beyond this a request gets 429."""
    memory_mb: Annotated[int, Field(ge=256)] = 4096
    """Address-space limit of each worker (MiB): an answer that makes sympy allocate more
    scores 0 instead of exhausting the host."""


class RewardReasoningGymConfig(Section):
    """reasoning-gym entries (``reasoning_gym`` items, data sources ``reasoning_gym/<task>``):
    scored by the library's own ``score_answer`` in a pool of worker processes like the math
    pool's, started at the first such item (a service that never sees one never imports the
    library)."""

    enabled: bool = True
    """Serve ``reasoning_gym`` items when the reasoning-gym library is installed in the service's
    environment (``pip install 'dynamo-rl[reasoning-gym]'``); otherwise they are refused with
    422."""
    workers: Annotated[int, Field(ge=1, le=256)] | None = None
    """Worker processes. Unset: one per CPU this process may run on."""
    batch_size: Annotated[int, Field(ge=1, le=4096)] = 64
    """Most items sent to a worker in one message."""
    timeout_s: Annotated[float, Field(gt=0, le=600)] = 10.0
    """Hard per-item limit: a worker still busy after this is killed, replaced, and the item
    scores 0 with reason ``timeout``."""
    max_pending: Annotated[int, Field(ge=1)] = 4096
    """Items admitted at once (running + waiting); beyond this a request gets 429."""
    memory_mb: Annotated[int, Field(ge=256)] = 4096
    """Address-space limit of each worker (MiB)."""


class RewardCodeConfig(Section):
    """Code execution: every run is a fresh bubblewrap sandbox (see services/reward/sandbox.py)."""

    enabled: bool = True
    """Serve ``code`` items and ``/run_code``; when false they are refused with 422."""
    unsafe_no_sandbox: bool = False
    """Run code WITHOUT bubblewrap (rlimits and a temporary directory only). For machines where
    namespaces are unavailable and the code is trusted; logged loudly at start-up."""
    bwrap: str = "bwrap"
    """The bubblewrap binary (a name looked up on PATH, or a path)."""
    python: str = "/usr/bin/python3"
    """Interpreter that runs Python programs inside the sandbox; must live under a directory the
    sandbox mounts read-only (``/usr`` by default; ``ro_paths`` adds more)."""
    ro_paths: list[str] = []
    """Extra host directories mounted read-only inside the sandbox (for example a separate
    Python installation), at the same path. Nothing else of the host is visible. A directory
    under ``/tmp`` is mounted over the sandbox's work directory; ``/tmp`` itself or ``/`` is
    refused (it would make the work directory read-only)."""

    @field_validator("ro_paths")
    @classmethod
    def _not_over_the_work_directory(cls, v: list[str]) -> list[str]:
        for path in v:
            if PurePosixPath("/tmp").is_relative_to(os.path.normpath(os.path.abspath(path))):
                raise ValueError(
                    f"{path!r} would cover the sandbox's work directory /tmp (read-only); "
                    "allowed: directories outside /tmp, or below it"
                )
        return v

    concurrency: Annotated[int, Field(ge=1, le=1024)] = 2
    """Sandboxes running at once."""
    max_pending: Annotated[int, Field(ge=1)] = 256
    """Code items and /run_code requests admitted at once (running + waiting); beyond this 429."""
    default_timeout_s: Annotated[float, Field(gt=0)] = 5.0
    """Wall-clock limit of one run when the item gives none."""
    max_timeout_s: Annotated[float, Field(gt=0)] = 30.0
    """Upper bound on any run's wall-clock limit (item values above it are capped)."""
    compile_timeout_s: Annotated[float, Field(gt=0)] = 30.0
    """Wall-clock limit of compiling a C/C++ program."""
    default_memory_mb: Annotated[int, Field(ge=16)] = 512
    """Address-space limit per process when the item gives none (MiB)."""
    max_memory_mb: Annotated[int, Field(ge=16)] = 2048
    """Upper bound on any run's address-space limit (MiB)."""
    max_processes: Annotated[int, Field(ge=1)] = 32
    """Processes (and threads) the sandboxed program may have at once (RLIMIT_NPROC)."""
    max_open_files: Annotated[int, Field(ge=8)] = 64
    """Open file descriptors per process (RLIMIT_NOFILE)."""
    max_file_mb: Annotated[int, Field(ge=1)] = 16
    """Largest file a program may write (RLIMIT_FSIZE, MiB)."""
    workdir_mb: Annotated[int, Field(ge=1)] = 64
    """Size of the sandbox's writable tmpfs work directory (MiB), its only writable place."""
    max_output_bytes: Annotated[int, Field(ge=1024)] = 1 << 20
    """stdout and stderr are each kept up to this many bytes; a run that writes more is stopped
    and its output marked truncated."""
    max_cases: Annotated[int, Field(ge=1)] = 256
    """Test cases per code item."""
    uid: Annotated[int, Field(ge=1)] = 65534
    """Unprivileged uid/gid the sandbox runs as (outside and inside); used when the service runs
    as root, otherwise the service's own uid is used outside."""


class RewardModelSpec(Section):
    """A Hugging Face sequence-classification reward model (``num_labels=1``) in a directory.

    It runs in its own worker process (``services.reward_model.worker``) so the service itself
    never imports torch; requests from concurrent items are batched."""

    path: str
    """Directory with the model and its tokenizer (``save_pretrained`` layout)."""
    device: str = "cpu"
    """``cpu``, ``cuda`` or ``cuda:N``."""
    dtype: Literal["float32", "bfloat16", "float16"] = "float32"
    batch_size: Annotated[int, Field(ge=1, le=4096)] = 16
    """Pairs scored in one forward pass."""
    batch_wait_ms: Annotated[float, Field(ge=0, le=10_000)] = 5.0
    """How long the first pair of a batch waits for more before the batch runs."""
    max_length: Annotated[int, Field(ge=8)] = 2048
    """Tokens per (prompt, response) text; longer texts are cut at the end."""
    template: Literal["plain", "chat"] = "plain"
    """``plain``: prompt + response as one text; ``chat``: the tokenizer's chat template over a
    user and an assistant message."""
    normalize: Literal["sigmoid", "none"] = "sigmoid"
    """Normalised score: ``sigmoid((raw - shift) / scale)`` or the raw score unchanged."""
    shift: float = 0.0
    scale: Annotated[float, Field(gt=0)] = 1.0
    correct_above: float = 0.5
    """A ``model`` item is ``correct`` when its normalised score is at least this."""
    max_pending: Annotated[int, Field(ge=1)] = 1024
    """Items admitted at once (running + waiting); beyond this 429."""
    load_timeout_s: Annotated[float, Field(gt=0)] = 600.0
    """The worker must have loaded the model within this, or the service refuses to start."""
    score_timeout_s: Annotated[float, Field(gt=0)] = 300.0
    """One batch's limit; a worker still busy after it is killed, restarted, and the batch's
    items score 0 with reason ``model_error``."""
    threads: Annotated[int, Field(ge=1)] = 1
    """torch CPU threads of the worker."""


DEFAULT_JUDGE_TEMPLATE = (
    "Rate the response to the question on a scale from 0 to 10.\n\n"
    "Question:\n{prompt}\n\nReference answer (may be empty):\n{reference}\n\n"
    "Response:\n{response}\n\nAnswer with a line 'Score: N'."
)


class JudgeSpec(Section):
    """An LLM judge behind an OpenAI-compatible API (vLLM, SGLang, the embedded engine, hosted)."""

    url: str
    """Base URL, e.g. ``http://127.0.0.1:8000``; ``/v1/chat/completions`` (or
    ``/v1/completions``) is appended."""
    api: Literal["chat", "completions"] = "chat"
    """``chat``: messages to ``/v1/chat/completions``; ``completions``: the rendered template as a
    text prompt to ``/v1/completions`` (engines without a chat route, such as the embedded one)."""
    model: str | None = None
    """The request's ``model`` field (required by most servers that host several models)."""
    api_key_env: str | None = None
    """Name of an environment variable holding a bearer token (never the token itself)."""
    system: str | None = None
    """Optional system message (chat only)."""
    template: str = DEFAULT_JUDGE_TEMPLATE
    """The judge's prompt; ``{prompt}``, ``{response}`` and ``{reference}`` are filled in."""
    score_pattern: str = r"(?i)score\s*[:=]\s*(-?\d+(?:\.\d+)?)"
    """Regex searched in the judge's answer; its first group is the score (the last match
    counts)."""
    min_score: float = 0.0
    max_score: float = 10.0
    """The judge's scale; the normalised score is ``(s - min) / (max - min)``; a parsed value
    outside the scale makes the answer unparseable."""
    correct_above: float = 0.5
    """A ``judge`` item is ``correct`` when its normalised score is at least this."""
    max_tokens: Annotated[int, Field(ge=1)] = 256
    temperature: Annotated[float, Field(ge=0)] = 0.0
    timeout_s: Annotated[float, Field(gt=0)] = 60.0
    """Per attempt."""
    retries: Annotated[int, Field(ge=0, le=10)] = 2
    """Extra attempts after a timeout, a connection error, 429 or 5xx (not after other 4xx)."""
    retry_backoff_s: Annotated[float, Field(ge=0)] = 0.5
    """Wait before retry k: ``retry_backoff_s * 2**k``, capped at ``retry_backoff_max_s`` and
    shortened by up to 20% of jitter (``dynamo_rl.retry.Backoff``)."""
    retry_backoff_max_s: Annotated[float, Field(ge=0)] = 10.0
    """Longest wait between two attempts."""
    concurrency: Annotated[int, Field(ge=1, le=4096)] = 8
    """Requests in flight to the judge at once."""
    max_pending: Annotated[int, Field(ge=1)] = 1024
    """Items admitted at once (running + waiting); beyond this 429."""

    @field_validator("score_pattern")
    @classmethod
    def _one_group(cls, v: str) -> str:
        try:
            groups = re.compile(v).groups
        except re.error as e:
            raise ValueError(f"not a valid regex: {e}") from None
        if groups < 1:
            raise ValueError("needs a capturing group around the number")
        return v

    @field_validator("template")
    @classmethod
    def _placeholders(cls, v: str) -> str:
        try:
            v.format(prompt="", response="", reference="")
        except (KeyError, IndexError, ValueError) as e:
            raise ValueError(
                f"bad placeholder {e}; allowed: {{prompt}}, {{response}}, {{reference}} "
                "(write {{ and }} for literal braces)"
            ) from None
        return v

    @model_validator(mode="after")
    def _scale(self) -> JudgeSpec:
        if self.max_score <= self.min_score:
            raise ValueError("max_score must be greater than min_score")
        if self.retry_backoff_s > self.retry_backoff_max_s:
            raise ValueError(
                f"retry_backoff_s ({self.retry_backoff_s}) must be <= retry_backoff_max_s "
                f"({self.retry_backoff_max_s})"
            )
        return self


class _Component(Section):
    name: str | None = None
    """How the component is reported (``components`` of the result); defaults to its kind."""
    weight: float = 1.0
    """The total is the weighted sum of component scores."""
    gate: str | None = None
    """Name of an ungated component: this one counts (and runs) only when that one is
    ``correct``; otherwise it scores 0."""

    @property
    def label(self) -> str:
        return self.name or self.kind  # type: ignore[attr-defined]


class MathComponent(_Component):
    """The item's ``math`` verdict (needs ``ground_truth``)."""

    kind: Literal["math"]


class CodeComponent(_Component):
    """The item's ``code`` verdict (needs ``tests``)."""

    kind: Literal["code"]


class ModelComponent(_Component):
    """A reward model's normalised score (the raw one is reported as ``<name>_raw``)."""

    kind: Literal["model"]
    model: str | None = None
    """Key in ``reward.models``; may be left out when there is exactly one."""


class JudgeComponent(_Component):
    """An LLM judge's normalised score."""

    kind: Literal["judge"]
    judge: str | None = None
    """Key in ``reward.judges``; may be left out when there is exactly one."""


class FormatComponent(_Component):
    """1 when the response has the expected form, else 0."""

    kind: Literal["format"]
    pattern: str | None = None
    """Regex searched in the response (dot matches newlines); without it, the verifier's
    ``format_ok`` (an answer or a program was found)."""

    @field_validator("pattern")
    @classmethod
    def _compiles(cls, v: str | None) -> str | None:
        if v is not None:
            try:
                re.compile(v)
            except re.error as e:
                raise ValueError(f"not a valid regex: {e}") from None
        return v


class LengthComponent(_Component):
    """DAPO's soft overlong penalty: 0 up to ``max_length - buffer``, then falling linearly to
    -1 at ``max_length``, -1 beyond. Length is the item's ``response_length`` (tokens) when sent,
    else the response's characters."""

    kind: Literal["length"]
    max_length: Annotated[int, Field(ge=1)]
    buffer: Annotated[int, Field(ge=0)] = 0

    @model_validator(mode="after")
    def _fits(self) -> LengthComponent:
        if self.buffer > self.max_length:
            raise ValueError("buffer must not exceed max_length")
        return self


Component = Annotated[
    MathComponent
    | CodeComponent
    | ModelComponent
    | JudgeComponent
    | FormatComponent
    | LengthComponent,
    Field(discriminator="kind"),
]
VERIFIERS = ("math", "code")


class RewardSpec(Section):
    """The reward of one data source: weighted components, optionally gated."""

    components: Annotated[list[Component], Field(min_length=1)]
    correct_from: str | None = None
    """Component whose ``correct`` is the sample's (what rollout allocation counts as a
    success); defaults to the first ``math``/``code`` component."""
    correct_threshold: float = 0.5
    """Without a verifier component, the sample is correct when the total reaches this."""

    def verifier(self) -> str | None:
        if self.correct_from is not None:
            return self.correct_from
        return next((c.label for c in self.components if c.kind in VERIFIERS), None)


class Route(Section):
    """How the items of one data source are scored, where an item does not say so itself. A route
    applies only to items of its ``kind``; an item's own ``extraction``/``scoring`` wins."""

    kind: Literal["math", "code"]
    """The item kind the route is for."""
    extraction: Extraction | None = None
    """math: how the answer is found (``last_boxed``, ``answer_line``, ``math_verify``,
    ``whole_response``, ``gsm8k``, ``gsm8k_flexible``, ``qa_exact_match``; docs/reward.md);
    unset: ``last_boxed``."""
    scoring: Literal["fraction", "all_or_nothing"] | None = None
    """code: passed cases / cases, or 1/0; unset: ``fraction``."""
    first_cases: Annotated[int, Field(ge=1)] | None = None
    """code: score on the first N cases only (verl's continuous scoring: 10); unset: all cases."""

    @model_validator(mode="after")
    def _fits_kind(self) -> Route:
        if self.kind != "math" and self.extraction is not None:
            raise ValueError("extraction is for kind 'math' routes only")
        if self.kind != "code" and (self.scoring is not None or self.first_cases is not None):
            raise ValueError("scoring and first_cases are for kind 'code' routes only")
        return self


SEARCH_R1_SETS = ("nq", "triviaqa", "popqa", "hotpotqa", "2wikimultihopqa", "musique", "bamboogle")
"""The question-answering sets verl routes as ``searchR1_<set>``."""
_MATH_BOXED = {"kind": "math", "extraction": "last_boxed"}
_ANSWER_LINE = {"kind": "math", "extraction": "answer_line"}
_CODE_CASES = {"kind": "code", "scoring": "fraction"}
_QA = {"kind": "math", "extraction": "qa_exact_match"}
DEFAULT_ROUTES: dict[str, dict[str, str]] = {
    "arith": _MATH_BOXED,  # the built-in task (dynamo-rl task arith)
    "products": _MATH_BOXED,  # the agent recipe's task (tasks.products)
    "longtail": _MATH_BOXED,  # the update-mode benchmark's task (tasks.longtail)
    "openai/gsm8k": {"kind": "math", "extraction": "gsm8k"},
    "lighteval/MATH": _MATH_BOXED,
    "DigitalLearningGmbH/MATH-lighteval": _MATH_BOXED,
    "HuggingFaceH4/MATH-500": _MATH_BOXED,
    "math_dapo": _ANSWER_LINE,
    "math": _ANSWER_LINE,
    "math_dapo_reasoning": _ANSWER_LINE,
    "aime*": _ANSWER_LINE,
    "numina_*": {"kind": "math", "extraction": "whole_response"},
    "hiyouga/geometry3k": _MATH_BOXED,
    **{f"searchR1_{name}": _QA for name in SEARCH_R1_SETS},
    # The benchmarks and sets `dynamo-rl data` converts (tasks/convert.py), with the boxed
    # instruction; OlympiadBench's multi-answer problems need several boxes combined.
    "amc*": _MATH_BOXED,
    "minerva_math": _MATH_BOXED,
    "deepscaler": _MATH_BOXED,
    "olympiadbench": {"kind": "math", "extraction": "math_verify"},
    "codecontests": _CODE_CASES,
    "apps": _CODE_CASES,
    "codeforces": _CODE_CASES,
    "taco": _CODE_CASES,
}
"""verl's data-source names and how verl scores them (docs/reward.md has the table)."""


class RewardConfig(Section):
    host: Host = "127.0.0.1"
    port: Port = 8080
    max_body_bytes: Annotated[int, Field(ge=1024)] = 32 << 20
    """Largest request body accepted; larger ones get 413."""
    max_items: Annotated[int, Field(ge=1)] = 4096
    """Items in one /v1/verify request; more is a 422 naming ``items``."""
    retry_after_s: Annotated[int, Field(ge=1)] = 1
    """``Retry-After`` seconds sent with 429 when a kind's queue is full."""
    math: RewardMathConfig = RewardMathConfig()
    code: RewardCodeConfig = RewardCodeConfig()
    reasoning_gym: RewardReasoningGymConfig = RewardReasoningGymConfig()
    models: dict[str, RewardModelSpec] = {}
    """Reward models by name; enables the ``model`` kind."""
    judges: dict[str, JudgeSpec] = {}
    """LLM judges by name; enables the ``judge`` kind."""
    composite: dict[str, RewardSpec] = {}
    """Reward specs by ``data_source`` (``"*"``: every other data source). An item whose
    ``data_source`` has a spec is scored by it; others by their ``kind`` alone."""
    composite_max_pending: Annotated[int, Field(ge=1)] = 4096
    """Composite items admitted at once (running + waiting); beyond this 429."""
    routes: dict[str, Route | None] = Field(
        default_factory=lambda: {k: Route.model_validate(v) for k, v in DEFAULT_ROUTES.items()}
    )
    """Routes by ``data_source``: exact names, or patterns with ``*``/``?`` (an exact name
    first, then the longest matching pattern). Entries given here are merged over the defaults
    (verl's names): an entry of the same kind changes only the keys it sets, ``null`` removes a
    default route."""

    @field_validator("routes", mode="before")
    @classmethod
    def _over_defaults(cls, v: object) -> object:
        if not isinstance(v, dict):
            return v
        merged: dict[str, object] = dict(DEFAULT_ROUTES)
        for key, entry in v.items():
            default = DEFAULT_ROUTES.get(key)
            if isinstance(entry, Route):
                entry = entry.model_dump(exclude_unset=True)
            if (
                isinstance(entry, dict)
                and default is not None
                and entry.get("kind", default["kind"]) == default["kind"]
            ):
                entry = {**default, **entry}
            merged[key] = entry
        return merged

    @model_validator(mode="after")
    def _check_composite(self) -> RewardConfig:
        problems: list[str] = []
        for source, spec in self.composite.items():
            where = f"reward.composite.{source}"
            labels = [c.label for c in spec.components]
            ungated = {c.label for c in spec.components if c.gate is None}
            for i, c in enumerate(spec.components):
                key = f"{where}.components.{i}"
                if labels.count(c.label) > 1:
                    problems.append(
                        f"{key}: component name {c.label!r} is used twice; give one a 'name'"
                    )
                if c.gate is not None and c.gate not in ungated:
                    problems.append(
                        f"{key}.gate: {c.gate!r} is not an ungated component of this spec "
                        f"(ungated: {', '.join(sorted(ungated)) or 'none'})"
                    )
                if isinstance(c, ModelComponent):
                    problems += _named(f"{key}.model", c.model, self.models, "reward.models")
                if isinstance(c, JudgeComponent):
                    problems += _named(f"{key}.judge", c.judge, self.judges, "reward.judges")
                if isinstance(c, CodeComponent) and not self.code.enabled:
                    problems.append(f"{key}: a code component needs reward.code.enabled=true")
                if isinstance(c, FormatComponent) and c.pattern is None and not spec.verifier():
                    problems.append(
                        f"{key}.pattern: required when the spec has no math/code component"
                    )
            if spec.correct_from is not None and spec.correct_from not in ungated:
                problems.append(
                    f"{where}.correct_from: {spec.correct_from!r} is not an ungated component "
                    f"of this spec (ungated: {', '.join(sorted(ungated)) or 'none'})"
                )
        if problems:
            raise ValueError("; ".join(problems))
        return self


def _named(key: str, name: str | None, table: dict[str, object], table_key: str) -> list[str]:
    if name is None:
        if len(table) == 1:
            return []
        return [f"{key}: required when {table_key} has {len(table)} entries (not exactly one)"]
    if name not in table:
        return [f"{key}: {name!r} is not in {table_key} (known: {', '.join(table) or 'none'})"]
    return []


_GLOB = frozenset("*?[")


class RouteTable:
    """Finds a data source's route: an exact key first, then the longest matching pattern. The
    reward service applies what it finds (``services.reward.routes``); the rollout worker checks
    its dataset's data sources against the same table before it starts (:func:`unrouted`)."""

    def __init__(self, routes: Mapping[str, Route | None]) -> None:
        self.exact = {k: r for k, r in routes.items() if r is not None and not _GLOB & set(k)}
        self.patterns = sorted(
            ((k, r) for k, r in routes.items() if r is not None and _GLOB & set(k)),
            key=lambda kr: -len(kr[0]),
        )

    def find(self, data_source: str | None) -> tuple[str, Route] | None:
        """``(key, route)`` for ``data_source``, or None."""
        if data_source is None:
            return None
        if data_source in self.exact:
            return data_source, self.exact[data_source]
        for key, route in self.patterns:
            if fnmatch.fnmatchcase(data_source, key):
                return key, route
        return None


def unrouted(cfg: RewardConfig, sources: Mapping[str, str]) -> dict[str, str]:
    """The data sources (``{data_source: kind}``, math and code rows) that nothing in ``cfg`` says
    how to score: no composite spec and no route of their kind. Empty when a ``*`` route or a
    ``*`` composite spec is configured (every data source is accepted as it is)."""
    if cfg.routes.get("*") is not None or "*" in cfg.composite:
        return {}
    table = RouteTable(cfg.routes)
    out: dict[str, str] = {}
    for source, kind in sources.items():
        if kind not in VERIFIERS or source in cfg.composite:
            continue
        found = table.find(source)
        if found is None or found[1].kind != kind:
            out[source] = kind
    return out
