"""Reading back the JSON-lines files the services append to a run folder (metric histories,
sample logs): one JSON object per line, written while others read, so a half-written last line
or a line that is not an object is skipped, and a file not there yet reads as empty."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

__all__ = ["read_records"]


def read_records(path: str | Path, key: str) -> list[dict[str, Any]]:
    """The objects of the file at ``path`` that have ``key``, in file order."""
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
