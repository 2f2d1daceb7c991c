"""Warnings a user must act on, from every service to one file in the run folder.

A service's log says everything; a few of its warnings are for the user to act on — prompts the
length policy dropped or truncated, prompts an engine refused, steps with no learning signal,
items of a data source the reward service has no route for, examples left out of the warm start,
an engine left out of a weight push. Those go through :meth:`Notices.warn`, which logs the line
as a WARNING (the service's log keeps every occurrence) and appends one JSON line to
``<run.dir>/warnings.jsonl`` (:data:`FILE`):

    {"t": 1733390000.0, "service": "rollout0", "kind": "prompts_over_length",
     "about": "data/train.parquet", "message": "5,427 of 7,473 prompts exceed 256 tokens: dropped"}

``kind`` says what happened (one of :data:`KINDS`), ``about`` what it happened to (a dataset, an
engine; "" when the kind says it all). One warning is one ``(kind, about)``: a service writes each
at most once, and the readers — ``dynamo-rl up``'s console, ``dynamo-rl stage eval-after``, the
dashboard — show each once (:func:`read_notices`), however many workers or restarts repeat it.
``service`` names the process: ``DYNAMO_RL_SERVICE`` (:data:`SERVICE_ENV`) when its launcher sets
it (``up`` does, with the name of its log: ``logs/rollout0.log``), else the service's own name
(in compose, the container's). Writing never fails a service: a full disk loses the line, not the
log's copy.
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import time
from dataclasses import dataclass
from pathlib import Path

from dynamo_rl.jsonl import Tail, read_records

__all__ = [
    "FILE",
    "KINDS",
    "SERVICE_ENV",
    "Notice",
    "NoticeTail",
    "Notices",
    "notice_of",
    "read_notices",
]

FILE = "warnings.jsonl"
SERVICE_ENV = "DYNAMO_RL_SERVICE"

KINDS = {
    "prompts_over_length": "prompts dropped or truncated by rollout.prompt_len_policy",
    "prompt_refused": "a prompt an engine refused (dead-lettered, served no more)",
    "no_signal": "train steps in a row whose rewards were all equal (no learning signal)",
    "unrouted_data": "math items of a data source with no reward route, scored by the default",
    "examples_too_long": "warm-start examples longer than learner.max_seq_len, left out",
    "engine_left_out": "an engine left out of a weight push (it catches up at the next one)",
}
"""Every kind of notice, with what it means (the dashboard's legend)."""


@dataclass(frozen=True)
class Notice:
    """One line of ``warnings.jsonl``."""

    service: str
    kind: str
    about: str
    message: str
    t: float = 0.0

    @property
    def key(self) -> tuple[str, str]:
        """What makes two notices the same warning."""
        return self.kind, self.about


class Notices:
    """A service's channel for warnings a user must act on (see the module's docstring)."""

    def __init__(self, run_dir: str | Path | None, service: str) -> None:
        """``run_dir`` None: log only (a process outside any run, as a unit test's)."""
        self.path = Path(run_dir) / FILE if run_dir is not None else None
        self.service = os.environ.get(SERVICE_ENV) or service
        self.written: set[tuple[str, str]] = set()

    def warn(self, log: logging.Logger, kind: str, message: str, about: str = "") -> None:
        """Log ``message`` as a warning on ``log``; the first time for ``(kind, about)`` in this
        process, also append it to the run folder's notices."""
        if kind not in KINDS:
            raise ValueError(f"notice kind must be one of {', '.join(KINDS)}, got {kind!r}")
        log.warning("%s", message)
        if self.path is None or (kind, about) in self.written:
            return
        self.written.add((kind, about))
        line = json.dumps({"t": time.time(), "service": self.service, "kind": kind,
                           "about": about, "message": message})  # fmt: skip
        with contextlib.suppress(OSError):
            self.path.parent.mkdir(parents=True, exist_ok=True)
            # One short write in append mode: lines of several processes do not interleave.
            with open(self.path, "a") as f:
                f.write(line + "\n")


def read_notices(path: str | Path) -> list[Notice]:
    """The notices of a ``warnings.jsonl`` (a file or the run folder holding it), each warning once
    (its first occurrence), in file order."""
    p = Path(path)
    if p.is_dir():
        p = p / FILE
    out: dict[tuple[str, str], Notice] = {}
    for r in read_records(p, "kind"):
        n = notice_of(r)
        out.setdefault(n.key, n)
    return list(out.values())


def notice_of(r: dict) -> Notice:
    """One line of ``warnings.jsonl`` (a record with a ``kind``) as a :class:`Notice`."""
    return Notice(str(r.get("service", "?")), str(r["kind"]), str(r.get("about", "")),
                  str(r.get("message", "")), float(r.get("t", 0.0)))  # fmt: skip


class NoticeTail:
    """The notices of some run folders' ``warnings.jsonl``, each warning once (its first
    occurrence), read incrementally: :meth:`poll` reads only what was appended since the last
    poll and returns the warnings not seen before; :attr:`seen` holds every one so far."""

    def __init__(self, folders: list[Path]) -> None:
        self.tails = [Tail(Path(f) / FILE, "kind") for f in folders]
        self.seen: dict[tuple[str, str], Notice] = {}

    def poll(self) -> list[Notice]:
        new = []
        for tail in self.tails:
            for n in map(notice_of, tail.read()):
                if n.key not in self.seen:
                    self.seen[n.key] = n
                    new.append(n)
        return new
