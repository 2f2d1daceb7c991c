"""Reading the JSON-lines files the services append to (metrics history, sample log).

A writer appends whole lines and flushes each, so a crash leaves at most one half-written line:
readers skip any line that is not a JSON object holding the record's key, and a missing file reads
as empty (the service has not written yet).
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any


def read_records(path: str | Path, key: str) -> list[dict[str, Any]]:
    """The JSON objects of ``path`` that hold ``key``, in file order (other lines skipped)."""
    try:
        text = Path(path).read_text()
    except FileNotFoundError:
        return []
    out: list[dict[str, Any]] = []
    for line in text.splitlines():
        try:
            record = json.loads(line)
        except ValueError:
            continue
        if isinstance(record, dict) and key in record:
            out.append(record)
    return out
