"""Output comparison of stdio code tests: leading whitespace is part of the output.

Indentation and leading blank lines are what many judges check (a pattern, a formatted table), so
``"  1"`` expected against ``"1"`` printed must fail. What the comparison forgives is documented
and kept: trailing whitespace on each line, trailing blank lines, and ``\\r\\n`` line ends.
"""

from __future__ import annotations

from typing import Any

import pytest

from services.reward.code_scorer import normalize_output
from tests.services.reward.conftest import RewardServer


def _verdict(reward: RewardServer, program: str, expected: str) -> str:
    tests = {"type": "stdio", "cases": [{"stdin": "", "stdout": expected}]}
    item: dict[str, Any] = {
        "kind": "code",
        "response": f"```python\n{program}\n```",
        "tests": tests,
    }
    return str(reward.one(item)["reason"])


@pytest.mark.parametrize(
    ("program", "expected", "reason"),
    [
        ("print('1')", "  1", "wrong_answer"),  # indentation expected, none printed
        ("print('  1')", "1", "wrong_answer"),  # indentation printed, none expected
        ("print('  1')", "  1", "ok"),
        ("print('a')\nprint(' b')", "a\nb", "wrong_answer"),  # on a later line too
        ("print('\\ta')", "a", "wrong_answer"),  # a tab is whitespace too
        ("print()\nprint('1')", "1", "wrong_answer"),  # a leading blank line
        ("print('1')", "\n1", "wrong_answer"),
        ("print(' 1  ')\nprint()\nprint()", " 1", "ok"),  # trailing spaces and blank lines
        ("import sys\nsys.stdout.write(' 1\\r\\n 2\\r\\n')", " 1\n 2", "ok"),  # CRLF
    ],
)
def test_leading_whitespace_counts_trailing_does_not(
    reward: RewardServer, program: str, expected: str, reason: str
) -> None:
    assert _verdict(reward, program, expected) == reason


def test_normalize_output_keeps_leading_whitespace() -> None:
    assert normalize_output("  1") != normalize_output("1")
    assert normalize_output("\n1") != normalize_output("1")
    assert normalize_output(" 1 \r\n\n") == " 1"
