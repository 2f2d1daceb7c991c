"""Shared bits of the reliability tests: the fuzzing budget and a grep for leaked secrets."""

from __future__ import annotations

import os
from pathlib import Path

# Hypothesis examples per fuzzed operation: small in CI, larger by hand
# (DYNAMO_FUZZ_EXAMPLES=500 .venv/bin/python -m pytest tests/reliability).
FUZZ_EXAMPLES = int(os.environ.get("DYNAMO_FUZZ_EXAMPLES", "25"))

CONTROL_TOKEN = "ctl-9d4e1b7a5c3f-never-logged"


def assert_not_leaked(secret: str, *texts: str | Path) -> None:
    """``secret`` appears in none of ``texts`` (strings, or paths of files read as bytes)."""
    for text in texts:
        data = text.read_bytes() if isinstance(text, Path) else text.encode()
        assert secret.encode() not in data, f"control token leaked into {str(text)[:80]!r}"
