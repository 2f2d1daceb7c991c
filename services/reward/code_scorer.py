"""The ``code`` kind: a program from the response, run against test cases in the sandbox.

Tests are either stdio cases (run once per case with its stdin; stdout compared after trimming
trailing whitespace on each line and trailing blank lines) or an ``assert`` block appended to a
Python program (one case: exit status 0 passes). The score is the fraction of passed cases, or
1/0 with ``scoring: all_or_nothing`` (which also stops at the first failure). The verdict is
always decided here, outside the sandbox: a program cannot report its own success.
"""

from __future__ import annotations

import asyncio
import secrets
import signal
import time
from concurrent.futures import ThreadPoolExecutor
from typing import Annotated, Any, Literal

from pydantic import BaseModel, ConfigDict, Field, model_validator

from dynamo_rl.config import RewardConfig
from services.reward.base import ItemBase, ItemResult, Reason, Scorer
from services.reward.code_runner import CodeRunner, Language, extract_code
from services.reward.metrics import RewardMetrics
from services.reward.sandbox import RunResult


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


class CodeItem(ItemBase):
    """A program (possibly inside a fenced block) and the tests it must pass."""

    kind: Literal["code"]
    response: str = Field(description="the model's response; the last fenced block is the program")
    language: Language = "python"
    tests: Annotated[StdioTests | AssertTests, Field(discriminator="type")]
    scoring: Literal["fraction", "all_or_nothing"] = "fraction"
    timeout_s: float | None = Field(
        None, gt=0, description="wall-clock limit per run (capped by the server)"
    )
    memory_mb: int | None = Field(
        None, ge=16, description="address space per process (capped by the server)"
    )

    @model_validator(mode="after")
    def _assert_needs_python(self) -> CodeItem:
        if self.tests.type == "assert" and self.language != "python":
            raise ValueError("tests.type 'assert' is only supported with language 'python'")
        return self


def normalize_output(text: str) -> str:
    """Trailing whitespace of each line and trailing blank lines do not count; leading whitespace
    (indentation, leading blank lines) does: it is part of the output for many judges."""
    return "\n".join(line.rstrip() for line in text.replace("\r\n", "\n").split("\n")).rstrip("\n")


def failure_reason(result: RunResult) -> Reason:
    """Map a run that did not pass to a reason (the caller handles wrong output)."""
    if result.status == "sandbox_error":
        return "sandbox_error"
    if result.status == "timeout":
        return "timeout"
    if result.status == "output_limit":
        return "output_limit"
    if result.memory_exhausted:
        return "memory_limit"
    if result.return_code in (128 + signal.SIGXCPU, 128 + signal.SIGKILL):
        return "timeout"  # RLIMIT_CPU: SIGXCPU, then SIGKILL at the hard limit
    return "runtime_error"


def _tail(data: bytes, n: int = 300) -> str:
    return data[-n:].decode(errors="replace").strip()


class CodeScorer(Scorer):
    kind = "code"
    item_model = CodeItem

    def __init__(self, cfg: RewardConfig, metrics: RewardMetrics) -> None:
        super().__init__(cfg, metrics)
        self.runner = CodeRunner(cfg.code, metrics)
        self._sem = asyncio.Semaphore(cfg.code.concurrency)
        self._executor = ThreadPoolExecutor(cfg.code.concurrency, thread_name_prefix="sandbox")

    @classmethod
    def enabled(cls, cfg: RewardConfig) -> bool:
        return cfg.code.enabled

    @property
    def capacity(self) -> int:
        return self.cfg.code.max_pending

    async def start(self) -> None:
        await asyncio.get_running_loop().run_in_executor(self._executor, self.runner.sandbox.check)

    async def close(self) -> None:
        self._executor.shutdown(wait=False, cancel_futures=True)

    def check(self, item: CodeItem) -> list[tuple[tuple[str | int, ...], str]]:
        if isinstance(item.tests, StdioTests) and len(item.tests.cases) > self.cfg.code.max_cases:
            return [(("tests", "cases"), f"at most {self.cfg.code.max_cases} cases per item")]
        return []

    async def in_sandbox(self, fn: Any, *args: Any) -> Any:
        """Run a blocking sandbox job on one of ``concurrency`` slots."""
        async with self._sem:
            return await asyncio.get_running_loop().run_in_executor(self._executor, fn, *args)

    async def score(self, item: CodeItem) -> ItemResult:
        start = time.monotonic()
        result = await self.in_sandbox(self._score_blocking, item)
        self.metrics.item_seconds.labels(self.kind).observe(time.monotonic() - start)
        return result

    def _score_blocking(self, item: CodeItem) -> ItemResult:
        code = extract_code(item.response, item.language)

        def verdict(
            score: float, reason: Reason, detail: str, format_ok: bool = True
        ) -> ItemResult:
            return ItemResult(
                id=item.id,
                score=score,
                correct=reason == "ok",
                format_ok=format_ok,
                reason=reason,
                detail=detail,
            )

        if not code:
            return verdict(0.0, "no_answer", "no program in the response", format_ok=False)
        done: bytes | None = None
        if isinstance(item.tests, AssertTests):
            # The asserts run in the program's own process, so a program could leave with status 0
            # before them (sys.exit(0), os._exit(0), an excepthook or atexit that exits 0). The
            # block passes only if it ran to its end: it then writes a fresh random marker.
            done = secrets.token_hex(16).encode()
            code = (
                f"{code}\n\n{item.tests.code}\n\n"
                f"__import__('os').write(1, b'\\n{done.decode()}\\n')\n"
            )
            cases = [("", None)]
        else:
            cases = [(c.stdin, c.stdout) for c in item.tests.cases]
        program, compiled = self.runner.prepare(item.language, code)
        if program is None:
            assert compiled is not None
            reason = failure_reason(compiled)
            if reason == "runtime_error":
                reason = "compile_error"
            return verdict(0.0, reason, f"compilation failed: {_tail(compiled.stderr, 600)}")
        limits = self.runner.limits(item.timeout_s, item.memory_mb)
        passed = 0
        first_failure: tuple[int, Reason, str] | None = None
        for i, (stdin, expected) in enumerate(cases):
            run = self.runner.run(program, stdin.encode(), limits)
            if run.ok and (
                (expected is None and done is not None and done in run.stdout)
                or (
                    expected is not None
                    and normalize_output(run.stdout.decode(errors="replace"))
                    == normalize_output(expected)
                )
            ):
                passed += 1
                continue
            if run.ok:
                reason: Reason = "wrong_answer"
                why = (
                    "exited with status 0 before the end of the assert block"
                    if expected is None
                    else f"expected {expected[:80]!r}, got {_tail(run.stdout, 80)!r}"
                )
            else:
                reason = failure_reason(run)
                if reason == "runtime_error" and b"AssertionError" in run.stderr[-4096:]:
                    reason = "wrong_answer"
                why = _tail(run.stderr) or f"exit status {run.return_code}"
            if first_failure is None:
                first_failure = (i, reason, why)
            if item.scoring == "all_or_nothing":
                break
        total = len(cases)
        if first_failure is None:
            return verdict(1.0, "ok", f"passed {total}/{total}")
        i, reason, why = first_failure
        score = 0.0 if item.scoring == "all_or_nothing" else passed / total
        return verdict(score, reason, f"passed {passed}/{total}; case {i}: {reason}: {why}")
