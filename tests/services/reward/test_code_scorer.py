"""The code scorer in-process: verdicts, details and case handling, with the real sandbox.

test_code.py sends programs through a real server, whose process imports its own copy of
:mod:`services.reward.code_scorer`; these tests build a :class:`CodeScorer` here and score items
on a sandbox thread-free (``_score_blocking``), so that a change to the module (a mutant, in
scripts/mutation.py) is seen by the test process too. Programs are tiny: each run is one
bubblewrap sandbox.
"""

from __future__ import annotations

import asyncio
import json
import re
import signal
import time
from collections.abc import Iterator
from typing import Any

import pytest
from prometheus_client import CollectorRegistry

from dynamo_rl.config import RewardConfig
from dynamo_rl.contracts.reward import CodeItem, ItemResult
from services.reward.code_scorer import CodeScorer, _check_call, _check_stdio, failure_reason
from services.reward.metrics import RewardMetrics
from services.reward.sandbox import RunResult


@pytest.fixture(scope="module")
def scorer() -> Iterator[CodeScorer]:
    cfg = RewardConfig.model_validate({"code": {"max_cases": 3}})
    s = CodeScorer(cfg, RewardMetrics(CollectorRegistry()))
    asyncio.run(s.start())  # the sandbox check: raises if bubblewrap cannot run here
    yield s
    asyncio.run(s.close())


def score(scorer: CodeScorer, program: str, tests: dict[str, Any], **extra: Any) -> ItemResult:
    item = CodeItem.model_validate(
        {"id": "i", "kind": "code", "response": f"```python\n{program}\n```", "tests": tests,
         **extra}
    )  # fmt: skip
    return scorer._score_blocking(item)


def stdio(*cases: tuple[str, str]) -> dict[str, Any]:
    return {"type": "stdio", "cases": [{"stdin": i, "stdout": o} for i, o in cases]}


ECHO_DOUBLE = "print(2 * int(input()))"


def test_all_cases_pass(scorer: CodeScorer) -> None:
    res = score(scorer, ECHO_DOUBLE, stdio(("1", "2"), ("4", "8\n")))
    assert (res.id, res.score, res.correct, res.format_ok, res.reason) == (
        "i",
        1.0,
        True,
        True,
        "ok",
    )
    assert res.detail == "passed 2/2"


def test_fraction_counts_every_case_and_reports_the_first_failure(scorer: CodeScorer) -> None:
    res = score(scorer, ECHO_DOUBLE, stdio(("1", "2"), ("2", "5"), ("3", "7")))
    assert (res.score, res.correct, res.reason) == (pytest.approx(1 / 3), False, "wrong_answer")
    assert res.detail == "passed 1/3; case 1: wrong_answer: expected '5', got '4'"


def test_all_or_nothing_stops_at_the_first_failure(scorer: CodeScorer) -> None:
    program = "import sys\nn = int(input())\nprint(n)\nsys.stderr.write(f'ran {n}')"
    res = score(scorer, program, stdio(("1", "9"), ("2", "2")), scoring="all_or_nothing")
    assert (res.score, res.reason) == (0.0, "wrong_answer")
    assert res.detail == "passed 0/2; case 0: wrong_answer: expected '9', got '1'"


def test_a_crash_is_a_runtime_error_with_the_stderr_tail(scorer: CodeScorer) -> None:
    res = score(scorer, "raise SystemExit('boom')", stdio(("", "x")))
    assert (res.score, res.reason, res.format_ok) == (0.0, "runtime_error", True)
    assert res.detail == "passed 0/1; case 0: runtime_error: boom"
    res = score(scorer, "import os; os._exit(3)", stdio(("", "x")))
    assert res.detail == "passed 0/1; case 0: runtime_error: exit status 3"


def test_an_assertion_error_is_a_wrong_answer(scorer: CodeScorer) -> None:
    res = score(scorer, "assert 1 == 2", stdio(("", "")))
    assert res.reason == "wrong_answer" and "AssertionError" in res.detail


def test_no_program_is_no_answer(scorer: CodeScorer) -> None:
    item = CodeItem.model_validate(
        {"id": "i", "kind": "code", "response": "   ", "tests": stdio(("", ""))}
    )
    res = scorer._score_blocking(item)
    assert (res.score, res.correct, res.format_ok, res.reason) == (0.0, False, False, "no_answer")
    assert res.detail == "no program in the response"


def test_assert_block_must_run_to_its_end(scorer: CodeScorer) -> None:
    tests = {"type": "assert", "code": "assert f(2) == 4"}
    assert score(scorer, "def f(x):\n    return x * x", tests).correct
    res = score(scorer, "def f(x):\n    return x + 3", tests)
    assert (res.reason, res.score) == ("wrong_answer", 0.0)
    # Leaving with status 0 before the asserts is not a pass.
    res = score(scorer, "import sys\ndef f(x):\n    return 0\nsys.exit(0)", tests)
    assert res.reason == "wrong_answer"
    assert res.detail.endswith("exited with status 0 before the end of the assert block")


def test_call_cases_compare_json_and_one_element_lists(scorer: CodeScorer) -> None:
    tests = {"type": "call", "fn_name": "add",
             "cases": [{"args": [1, 2], "expected": 3}, {"args": [2, 2], "expected": [4]},
                       {"args": [0, 0], "expected": 1}]}  # fmt: skip
    res = score(scorer, "def add(a, b):\n    return a + b", tests)
    assert (res.score, res.reason) == (pytest.approx(2 / 3), "wrong_answer")
    assert res.detail == "passed 2/3; case 2: wrong_answer: expected 1, got 0"
    cls = "class Solution:\n    def add(self, a, b):\n        return a + b"
    assert score(scorer, cls, {**tests, "cases": tests["cases"][:2]}).correct
    res = score(scorer, "x = 1", {**tests, "cases": tests["cases"][:1]})
    assert res.reason == "runtime_error" and "NameError: no function add" in res.detail


def test_check_call_parses_only_the_marked_line() -> None:
    assert _check_call("M", 3, b"noise\nM3\n") == (True, "")
    assert _check_call("M", [3], b"M3\n") == (True, "")
    assert _check_call("M", [3, 4], b"M3\n") == (False, "expected [3, 4], got 3")
    assert _check_call("M", 3, b"M1\nM3\n") == (True, "")  # the last marked line
    assert _check_call("M", 3, b"3\n") == (
        False,
        "returned nothing (exited before the call finished)",
    )
    assert _check_call("M", 3, b"Mnot json\n") == (False, "return value is not JSON")


def test_check_stdio_detail() -> None:
    assert _check_stdio("1  \n\n", b"1\n") == (True, "")
    assert _check_stdio("1", b"2\n") == (False, "expected '1', got '2'")
    assert _check_stdio("a" * 100, b"b" * 100) == (
        False,
        f"expected {'a' * 80!r}, got {'b' * 80!r}",
    )


def test_c_program_and_compile_error(scorer: CodeScorer) -> None:
    c = '#include <stdio.h>\nint main(){int n; scanf("%d",&n); printf("%d\\n", n+1); return 0;}'
    item = {"id": "i", "kind": "code", "language": "c", "tests": stdio(("1", "2"))}
    res = scorer._score_blocking(CodeItem.model_validate({**item, "response": f"```c\n{c}\n```"}))
    assert res.correct, res
    bad = scorer._score_blocking(CodeItem.model_validate({**item, "response": "```c\nint x(\n```"}))
    assert (bad.reason, bad.score) == ("compile_error", 0.0)
    assert bad.detail.startswith("compilation failed: ")


def test_too_many_cases_is_refused_by_check(scorer: CodeScorer) -> None:
    ok = CodeItem.model_validate({"id": "i", "kind": "code", "response": "x",
                                  "tests": stdio(*[("", "")] * 3)})  # fmt: skip
    assert scorer.check(ok) == []
    over = ok.model_copy(
        update={"tests": ok.tests.model_copy(update={"cases": ok.tests.cases * 2})}
    )
    assert scorer.check(over) == [(("tests", "cases"), "at most 3 cases per item")]
    call = CodeItem.model_validate({"id": "i", "kind": "code", "response": "x", "tests": {
        "type": "call", "fn_name": "f", "cases": [{"args": [], "expected": 1}] * 4}})  # fmt: skip
    assert scorer.check(call) != []
    asserts = CodeItem.model_validate({"id": "i", "kind": "code", "response": "x",
                                       "tests": {"type": "assert", "code": "pass"}})  # fmt: skip
    assert scorer.check(asserts) == []
    assert CodeScorer.enabled(scorer.cfg) and scorer.capacity == scorer.cfg.code.max_pending


def _result(status: str = "finished", rc: int | None = 1, stderr: bytes = b"") -> RunResult:
    return RunResult(status, rc, b"", stderr, 0.1)


@pytest.mark.parametrize(
    ("result", "reason"),
    [
        (_result("sandbox_error", None), "sandbox_error"),
        (_result("timeout", None), "timeout"),
        (_result("output_limit", None), "output_limit"),
        (_result(stderr=b"MemoryError"), "memory_limit"),
        (_result(rc=128 + signal.SIGXCPU), "timeout"),
        (_result(rc=128 + signal.SIGKILL), "timeout"),
        (_result(rc=128 + signal.SIGTERM), "runtime_error"),
        (_result(rc=1), "runtime_error"),
    ],
)
def test_failure_reason(result: RunResult, reason: str) -> None:
    assert failure_reason(result) == reason


def test_check_call_tolerates_bytes_that_are_not_utf8() -> None:
    assert _check_call("M", 3, b"\xff\xfe garbage\nM3\n") == (True, "")


def test_score_runs_on_the_sandbox_threads_and_is_timed() -> None:
    cfg = RewardConfig.model_validate({"code": {"concurrency": 2}})
    registry = CollectorRegistry()
    metrics = RewardMetrics(registry)
    s = CodeScorer(cfg, metrics)
    assert s.cfg is cfg and s.metrics is metrics and s.capacity == cfg.code.max_pending
    busy = {"now": 0, "max": 0}

    def job(i: int) -> str:
        import threading

        busy["now"] += 1
        busy["max"] = max(busy["max"], busy["now"])
        time.sleep(0.2)
        busy["now"] -= 1
        return f"{threading.current_thread().name}:{i}"

    async def main() -> tuple[list[ItemResult], list[str]]:
        await s.start()
        names = await asyncio.gather(*(s.in_sandbox(job, i) for i in range(5)))
        items = [
            CodeItem.model_validate(
                {
                    "id": str(i),
                    "kind": "code",
                    "response": ECHO_DOUBLE,
                    "tests": stdio((str(i), str(2 * i))),
                }
            )
            for i in range(2)
        ]
        return list(await asyncio.gather(*(s.score(it) for it in items))), list(names)

    try:
        results, names = asyncio.run(main())
    finally:
        asyncio.run(s.close())
    assert [(r.id, r.correct) for r in results] == [("0", True), ("1", True)]
    assert all(re.fullmatch(r"sandbox_\d+:\d", n) for n in names), names
    assert [n.split(":")[1] for n in names] == ["0", "1", "2", "3", "4"]
    assert busy["max"] <= 2  # concurrency slots
    count = registry.get_sample_value("dynamo_reward_item_duration_seconds_count", {"kind": "code"})
    total = registry.get_sample_value("dynamo_reward_item_duration_seconds_sum", {"kind": "code"})
    assert count == 2 and 0 < total < 120


def test_all_or_nothing_scores_zero_even_after_passing_cases(scorer: CodeScorer) -> None:
    res = score(scorer, ECHO_DOUBLE, stdio(("1", "2"), ("2", "5")), scoring="all_or_nothing")
    assert (res.score, res.reason) == (0.0, "wrong_answer")
    assert res.detail == "passed 1/2; case 1: wrong_answer: expected '5', got '4'"


def test_output_that_is_not_utf8_is_compared_and_reported_not_raised(scorer: CodeScorer) -> None:
    res = score(scorer, "import sys\nsys.stdout.buffer.write(b'\\xff1\\n')", stdio(("", "1")))
    assert res.reason == "wrong_answer"
    assert res.detail == "passed 0/1; case 0: wrong_answer: expected '1', got '\ufffd1'"
    program = "import sys\nsys.stderr.buffer.write(b'bad \\xff')\nsys.exit(3)"
    res = score(scorer, program, stdio(("", "1")))
    assert res.reason == "runtime_error" and res.detail.endswith(
        "case 0: runtime_error: bad \ufffd"
    )


def test_trailing_whitespace_is_forgiven_on_every_line_and_nothing_else_is_stripped() -> None:
    assert _check_stdio("a\nb", b"a  \nb\n") == (True, "")
    assert _check_stdio("aX", b"aX\n") == (True, "")
    assert _check_stdio("X", b"") == (False, "expected 'X', got ''")


def test_an_assert_block_reads_an_empty_stdin(scorer: CodeScorer) -> None:
    tests = {"type": "assert", "code": "import sys\nassert sys.stdin.read() == ''"}
    assert score(scorer, "pass", tests).correct


def test_the_items_own_time_and_memory_limits_apply(scorer: CodeScorer) -> None:
    slow = "import time\ntime.sleep(4)\nprint(1)"
    assert score(scorer, slow, stdio(("", "1")), timeout_s=1).reason == "timeout"
    big = "x = bytearray(300 * 2**20)\nprint(1)"
    assert score(scorer, big, stdio(("", "1")), memory_mb=64).reason == "memory_limit"


def test_check_call_cuts_long_values_at_80_characters() -> None:
    assert _check_call("M", "a" * 100, b'M"' + b"b" * 100 + b'"\n') == (
        False,
        f"expected {json.dumps('a' * 100)[:80]}, got {json.dumps('b' * 100)[:80]}",
    )
