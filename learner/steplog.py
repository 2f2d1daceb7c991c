"""The learner's JSONL step log (``<run dir>/metrics.jsonl``), and the trackers fed the same record
(``learner.trackers``: TensorBoard, wandb; see :mod:`dynamo_rl.trackers`)."""

from __future__ import annotations

import json
import time
from pathlib import Path
from typing import Any


class StepLog:
    """One JSON object per line in ``<run dir>/metrics.jsonl`` (appended across restarts); each
    record also goes to ``trackers`` (a :class:`dynamo_rl.trackers.Trackers`) when given."""

    def __init__(self, path: str | Path, trackers: Any = None) -> None:
        self.path = Path(path)
        self.path.parent.mkdir(parents=True, exist_ok=True)
        self.trackers = trackers

    def write(self, record: dict[str, Any]) -> None:
        line = json.dumps({"time_unix": time.time(), **record}, sort_keys=True)
        with open(self.path, "a") as f:
            f.write(line + "\n")
        if self.trackers is not None:
            self.trackers.log(record, int(record.get("step", 0)))

    def close(self) -> None:
        if self.trackers is not None:
            self.trackers.close()
            self.trackers = None


def read_log(path: str | Path) -> list[dict[str, Any]]:
    """The records of a JSONL step log (tests and benchmarks read it)."""
    p = Path(path)
    if not p.exists():
        return []
    return [json.loads(line) for line in p.read_text().splitlines() if line.strip()]
