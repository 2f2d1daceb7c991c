"""The learner's JSONL step log (``<run dir>/metrics.jsonl``), plus TensorBoard when installed."""

from __future__ import annotations

import json
import time
from pathlib import Path
from typing import Any


class StepLog:
    """One JSON object per line in ``<run dir>/metrics.jsonl`` (appended across restarts)."""

    def __init__(self, path: str | Path) -> None:
        self.path = Path(path)
        self.path.parent.mkdir(parents=True, exist_ok=True)
        self._tb: Any = None
        try:  # TensorBoard only when installed; the JSONL log is the source of truth.
            from torch.utils.tensorboard import SummaryWriter

            self._tb = SummaryWriter(str(self.path.parent / "tensorboard"))
        except Exception:
            self._tb = None

    def write(self, record: dict[str, Any]) -> None:
        line = json.dumps({"time_unix": time.time(), **record}, sort_keys=True)
        with open(self.path, "a") as f:
            f.write(line + "\n")
        if self._tb is not None:
            step = int(record.get("step", 0))
            for key, value in record.items():
                if isinstance(value, int | float) and key != "step":
                    self._tb.add_scalar(key, value, step)
            self._tb.flush()


def read_log(path: str | Path) -> list[dict[str, Any]]:
    """The records of a JSONL step log (tests and benchmarks read it)."""
    p = Path(path)
    if not p.exists():
        return []
    return [json.loads(line) for line in p.read_text().splitlines() if line.strip()]
