"""Reading back the JSON-lines files the services append to a run folder (metric histories,
sample logs, warnings): one JSON object per line, written while others read, so a half-written
last line or a line that is not an object is skipped, and a file not there yet reads as empty.
:func:`read_records` reads the whole file; :class:`Tail` what was appended since its last read."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

__all__ = ["Tail", "read_records"]


def read_records(path: str | Path, key: str) -> list[dict[str, Any]]:
    """The objects of the file at ``path`` that have ``key``, in file order."""
    try:
        text = Path(path).read_text()
    except FileNotFoundError:
        return []
    return _objects(text, key)


def _objects(text: str, key: str) -> list[dict[str, Any]]:
    out: list[dict[str, Any]] = []
    for line in text.splitlines():
        try:
            record = json.loads(line)
        except ValueError:
            continue
        if isinstance(record, dict) and key in record:
            out.append(record)
    return out


class Tail:
    """The objects with ``key`` appended to a JSON-lines file since the last :meth:`read` (a file
    another process is writing): a half-written last line waits for the next read, a line that is
    not an object is skipped. ``from_end``: what the file holds when the tail is made is skipped
    (a resumed run's earlier records)."""

    def __init__(self, path: str | Path, key: str, from_end: bool = False) -> None:
        self.path = Path(path)
        self.key = key
        self.offset = self.path.stat().st_size if from_end and self.path.exists() else 0

    def read(self) -> list[dict[str, Any]]:
        try:
            with open(self.path, "rb") as f:
                f.seek(self.offset)
                data = f.read()
        except FileNotFoundError:
            return []
        complete = data[: data.rfind(b"\n") + 1]
        self.offset += len(complete)
        return _objects(complete.decode(errors="replace"), self.key)
