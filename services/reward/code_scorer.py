"""The ``code`` kind: a program from the response, run against test cases in the sandbox.

Tests are stdio cases (run once per case with its stdin; stdout compared after trimming
trailing whitespace on each line and trailing blank lines), an ``assert`` block appended to a
Python program (one case: exit status 0 passes), or call cases (APPS/TACO/LeetCode ``fn_name``:
the usual imports (:data:`CALL_IMPORTS`) go before the program, as verl's call wrapper does, and a
harness appended to it calls the function once per run with the case's arguments and prints the
return value as JSON, compared as a value with the expected one here). The score is the fraction of
passed cases, or 1/0 with ``scoring: all_or_nothing`` (which also stops at the first failure);
``first_cases: N`` runs and scores only the first N cases (verl's continuous scoring: 10). The
verdict is always decided here, outside the sandbox: a program cannot report its own success.
"""

from __future__ import annotations

import asyncio
import functools
import json
import re
import secrets
import signal
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from typing import Any

from dynamo_rl.config import RewardConfig
from dynamo_rl.contracts.reward import (
    AssertTests,
    CallTests,
    CodeItem,
    ItemResult,
    Reason,
    StdioTests,
)
from services.reward.base import Scorer
from services.reward.code_runner import CodeRunner, extract_code
from services.reward.metrics import RewardMetrics
from services.reward.sandbox import RunResult


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


def _check_stdio(expected: str, out: bytes) -> tuple[bool, str]:
    got = out.decode(errors="replace")
    if normalize_output(got) == normalize_output(expected):
        return True, ""
    return False, f"expected {expected[:80]!r}, got {_tail(out, 80)!r}"


CALL_MODULES = ("string", "re", "datetime", "collections", "heapq", "bisect", "copy", "math",
                "random", "statistics", "itertools", "functools", "operator", "io", "sys", "json",
                "typing")  # fmt: skip
"""Imported before a call-based program, both as modules and with ``from M import *`` (then
``builtins`` again, so ``pow`` and ``compile`` stay the built-ins): solutions written for LeetCode
use ``List``, ``defaultdict``, ``heappush`` and the like without importing them."""
CALL_IMPORTS = (
    "".join(f"from {m} import *\n" for m in CALL_MODULES)
    + "from builtins import *\n"
    + "".join(f"import {m}\n" for m in CALL_MODULES)
    + "__dynamo_imported = dict(globals())\n"
)
_FUTURE = re.compile(r"^from __future__ import[^\n]*\n?", re.MULTILINE)


def with_call_imports(code: str) -> str:
    """``code`` after :data:`CALL_IMPORTS` (its ``from __future__`` imports stay first)."""
    futures = "".join(m.group(0).rstrip("\n") + "\n" for m in _FUTURE.finditer(code))
    return f"{futures}{CALL_IMPORTS}\n{_FUTURE.sub('', code)}"


# Appended to the program for call-based tests: the case's arguments come as JSON on stdin, the
# return value goes out as JSON after a fresh marker (written with os.write: the program may have
# replaced sys.stdout). The verdict is still decided outside the sandbox, by _check_call.
_CALL_HARNESS = """
def __dynamo_call():
    import json, os, sys
    args = json.loads(sys.stdin.read())
    fn = globals().get({fn!r})
    # A name the imports brought in (operator's add) is not the program's function.
    if fn is not None and globals().get("__dynamo_imported", {{}}).get({fn!r}) is fn:
        fn = None
    if fn is None and "Solution" in globals():
        fn = getattr(globals()["Solution"](), {fn!r})
    if fn is None:
        raise NameError("no function {fn}")
    out = json.dumps(fn(*args), default=repr)
    os.write(1, ("\\n{marker}" + out + "\\n").encode())


__dynamo_call()
"""


def _check_call(
    marker: str, expected: Any, out: bytes, expected_text: str | None = None
) -> tuple[bool, str]:
    """Passed when the marked return value equals ``expected`` (or, as APPS lays it out, the one
    element of an ``expected`` list; or, a string, ``expected_text``)."""
    lines = [ln for ln in out.decode(errors="replace").splitlines() if ln.startswith(marker)]
    if not lines:
        return False, "returned nothing (exited before the call finished)"
    try:
        got = json.loads(lines[-1][len(marker) :])
    except ValueError:
        return False, "return value is not JSON"
    if (
        got == expected
        or (isinstance(expected, list) and len(expected) == 1 and got == expected[0])
        or (expected_text is not None and got == expected_text.rstrip("\n"))
    ):
        return True, ""
    return False, f"expected {json.dumps(expected)[:80]}, got {json.dumps(got)[:80]}"


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
        if (
            isinstance(item.tests, StdioTests | CallTests)
            and len(item.tests.cases) > self.cfg.code.max_cases
        ):
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
        # Each case: its stdin and a check of the program's stdout -> (passed, why not).
        cases: list[tuple[str, Callable[[bytes], tuple[bool, str]]]]
        if isinstance(item.tests, AssertTests):
            # The asserts run in the program's own process, so a program could leave with status 0
            # before them (sys.exit(0), os._exit(0), an excepthook or atexit that exits 0). The
            # block passes only if it ran to its end: it then writes a fresh random marker.
            done = secrets.token_hex(16).encode()
            code = (
                f"{code}\n\n{item.tests.code}\n\n"
                f"__import__('os').write(1, b'\\n{done.decode()}\\n')\n"
            )
            early = "exited with status 0 before the end of the assert block"
            cases = [("", lambda out: (done in out, early))]
        elif isinstance(item.tests, CallTests):
            marker = secrets.token_hex(16)
            harness = _CALL_HARNESS.format(fn=item.tests.fn_name, marker=marker)
            code = f"{with_call_imports(code)}\n\n{harness}"
            cases = [
                (
                    json.dumps(c.args),
                    functools.partial(
                        _check_call, marker, c.expected, expected_text=c.expected_text
                    ),
                )
                for c in item.tests.cases
            ]
        else:
            cases = [(c.stdin, functools.partial(_check_stdio, c.stdout)) for c in item.tests.cases]
        given = len(cases)
        cases = cases[: item.first_cases]  # None: all
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
        for i, (stdin, check) in enumerate(cases):
            run = self.runner.run(program, stdin.encode(), limits)
            ok, why = check(run.stdout) if run.ok else (False, "")
            if ok:
                passed += 1
                continue
            if run.ok:
                reason: Reason = "wrong_answer"
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
        of = f" (the first {total} of {given} cases)" if total < given else ""
        if first_failure is None:
            return verdict(1.0, "ok", f"passed {total}/{total}{of}")
        i, reason, why = first_failure
        score = 0.0 if item.scoring == "all_or_nothing" else passed / total
        return verdict(score, reason, f"passed {passed}/{total}{of}; case {i}: {reason}: {why}")
