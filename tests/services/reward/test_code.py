"""Code items and /run_code through a real server: correct, wrong, crashing, slow and
memory-hungry programs, with stdio and assert tests, in Python and C/C++."""

from __future__ import annotations

from typing import Any

import httpx
import pytest

from dynamo_rl.config.reward import RewardCodeConfig
from services.reward.code_runner import CodeRunner, extract_code
from services.reward.code_scorer import normalize_output
from services.reward.metrics import RewardMetrics
from tests.services.reward.conftest import RewardServer

DOUBLE = "print(int(input()) * 2)"
STDIO = {
    "type": "stdio",
    "cases": [{"stdin": "2\n", "stdout": "4\n"}, {"stdin": "5", "stdout": "10"}],
}


def code_item(response: str, tests: dict[str, Any] = STDIO, **extra: Any) -> dict[str, Any]:
    return {"kind": "code", "response": response, "tests": tests, **extra}


def test_correct_program_in_fenced_block(reward: RewardServer) -> None:
    res = reward.one(code_item(f"Here you go:\n```python\n{DOUBLE}\n```\nDone."))
    assert (res["score"], res["correct"], res["reason"]) == (1.0, True, "ok")


def test_wrong_program_scores_fraction_of_cases(reward: RewardServer) -> None:
    cases = [{"stdin": "2", "stdout": "4"}, {"stdin": "3", "stdout": "7"}]
    res = reward.one(code_item(DOUBLE, {"type": "stdio", "cases": cases}))
    assert res["score"] == 0.5 and res["correct"] is False
    assert res["reason"] == "wrong_answer"
    assert "case 1" in res["detail"]


def test_all_or_nothing_scoring(reward: RewardServer) -> None:
    cases = [{"stdin": "2", "stdout": "4"}, {"stdin": "3", "stdout": "7"}]
    res = reward.one(code_item(DOUBLE, {"type": "stdio", "cases": cases}, scoring="all_or_nothing"))
    assert res["score"] == 0.0 and res["reason"] == "wrong_answer"


def test_crashing_program_is_runtime_error(reward: RewardServer) -> None:
    res = reward.one(code_item("raise SystemExit(3)"))
    assert (res["score"], res["reason"]) == (0.0, "runtime_error")
    res = reward.one(code_item("print(1/0)"))
    assert res["reason"] == "runtime_error" and "ZeroDivisionError" in res["detail"]


def test_slow_program_times_out(reward: RewardServer) -> None:
    res = reward.one(code_item("import time\ntime.sleep(30)", timeout_s=1))
    assert (res["score"], res["reason"]) == (0.0, "timeout")


def test_busy_loop_times_out(reward: RewardServer) -> None:
    res = reward.one(code_item("while True:\n    pass", timeout_s=1))
    assert res["reason"] == "timeout"


def test_memory_hungry_program_hits_memory_limit(reward: RewardServer) -> None:
    res = reward.one(code_item("x = bytearray(1 << 30)\nprint(len(x))", memory_mb=128))
    assert (res["score"], res["reason"]) == (0.0, "memory_limit")


def test_assert_tests_pass_and_fail(reward: RewardServer) -> None:
    program = "def add(a, b):\n    return a + b\n"
    ok = reward.one(code_item(program, {"type": "assert", "code": "assert add(2, 3) == 5"}))
    assert (ok["score"], ok["reason"]) == (1.0, "ok")
    bad = reward.one(code_item(program, {"type": "assert", "code": "assert add(2, 2) == 5"}))
    assert (bad["score"], bad["reason"]) == (0.0, "wrong_answer")


def test_assert_tests_with_crashing_and_slow_programs(reward: RewardServer) -> None:
    tests = {"type": "assert", "code": "assert f() == 1"}
    crash = reward.one(code_item("def f():\n    return [][1]\n", tests))
    assert crash["reason"] == "runtime_error" and "IndexError" in crash["detail"]
    slow = reward.one(code_item("def f():\n    while True: pass\n", tests, timeout_s=1))
    assert slow["reason"] == "timeout"
    hungry = reward.one(
        code_item("def f():\n    return len(bytearray(1 << 31))\n", tests, memory_mb=128)
    )
    assert hungry["reason"] == "memory_limit"


def test_no_program_is_no_answer(reward: RewardServer) -> None:
    res = reward.one(code_item("   "))
    assert (res["format_ok"], res["reason"]) == (False, "no_answer")


def test_cpp_program(reward: RewardServer) -> None:
    src = "#include <iostream>\nint main(){long x; std::cin >> x; std::cout << 2*x << '\\n';}"
    res = reward.one(code_item(f"```cpp\n{src}\n```", language="cpp"))
    assert (res["score"], res["reason"]) == (1.0, "ok"), res


def test_c_program_and_compile_error(reward: RewardServer) -> None:
    src = '#include <stdio.h>\nint main(){long x; scanf("%ld", &x); printf("%ld\\n", 2*x);}'
    assert reward.one(code_item(src, language="c"))["reason"] == "ok"
    res = reward.one(code_item("int main( { return 0; }", language="c"))
    assert (res["score"], res["reason"]) == (0.0, "compile_error")
    assert "error" in res["detail"]


def test_c_memory_hungry_program(reward: RewardServer) -> None:
    src = (
        "#include <stdlib.h>\n#include <string.h>\n#include <stdio.h>\n"
        'int main(){for(;;){char*p=malloc(1<<24); if(!p){fprintf(stderr,"out of memory\\n");'
        "return 1;} memset(p,1,1<<24);}}"
    )
    res = reward.one(code_item(src, language="c", memory_mb=64))
    assert res["reason"] == "memory_limit", res


def test_output_comparison_ignores_trailing_whitespace(reward: RewardServer) -> None:
    cases = [{"stdin": "", "stdout": "a\nb"}]
    res = reward.one(
        code_item("print('a  ')\nprint('b')\nprint()", {"type": "stdio", "cases": cases})
    )
    assert res["reason"] == "ok"


def run_code(reward: RewardServer, **body: Any) -> dict[str, Any]:
    r = httpx.post(f"{reward.url}/run_code", json=body, timeout=60)
    assert r.status_code == 200, r.text
    return r.json()


def test_run_code_success_with_stdin(reward: RewardServer) -> None:
    out = run_code(reward, code="import sys\nprint(sys.stdin.read()[::-1])", language="python",
                   stdin="abc")  # fmt: skip
    assert out["status"] == "Success"
    assert out["run_result"]["status"] == "Finished"
    assert out["run_result"]["stdout"] == "cba\n"
    assert out["run_result"]["return_code"] == 0
    assert out["run_result"]["execution_time"] > 0


def test_run_code_failure_and_timeout(reward: RewardServer) -> None:
    out = run_code(reward, code="import sys; sys.exit(4)", language="python")
    assert out["status"] == "Failed" and out["run_result"]["return_code"] == 4
    out = run_code(reward, code="while 1: pass", language="python", run_timeout=1)
    assert out["status"] == "Failed"
    assert out["run_result"]["status"] == "TimeLimitExceeded"


def test_run_code_cpp_and_compile_error(reward: RewardServer) -> None:
    out = run_code(reward, code='#include <cstdio>\nint main(){puts("hi");}', language="cpp",
                   memory_limit_MB=-1)  # fmt: skip
    assert out["status"] == "Success" and out["run_result"]["stdout"] == "hi\n"
    assert out["compile_result"]["status"] == "Finished"
    out = run_code(reward, code="int main( {", language="cpp")
    assert out["status"] == "Failed" and out["run_result"] is None
    assert out["compile_result"]["return_code"] != 0 and out["compile_result"]["stderr"]


def test_extract_code_prefers_matching_fence() -> None:
    text = "```text\nnot code\n```\n```python\nprint(1)\n```\n```bash\nls\n```"
    assert extract_code(text, "python") == "print(1)"
    assert extract_code("```\nx = 1\n```", "python") == "x = 1"
    assert extract_code("print(2)", "python") == "print(2)"


def test_normalize_output() -> None:
    assert normalize_output("a  \r\nb\n\n") == normalize_output("a\nb")
    assert normalize_output("a b") != normalize_output("ab")


@pytest.mark.parametrize(("asked", "capped"), [(None, 5.0), (1.5, 1.5), (1e6, 30.0)])
def test_item_timeout_is_capped_by_server(asked: float | None, capped: float) -> None:
    runner = CodeRunner(RewardCodeConfig(), RewardMetrics())
    assert runner.limits(asked, None).timeout_s == capped
    assert runner.limits(None, 10**6).memory_mb == RewardCodeConfig().max_memory_mb
