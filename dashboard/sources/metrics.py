"""The charts' numbers while a run goes on: the learner's JSONL metrics log and the services'
Prometheus ``/metrics``, and how a chart's series become the lines the page draws.

- :class:`JsonlLog` follows the learner's JSONL metrics log: it reads only the lines appended since
  the last call (the log grows for the whole run), tolerates a half-written last line, and starts
  over if the file is replaced by a shorter one.
- :class:`Scraper` polls Prometheus ``/metrics`` endpoints on a background thread and keeps a window
  of snapshots; rates are computed between consecutive snapshots, so a counter needs two scrapes
  before its chart shows a point.
- :func:`chart_data` turns a :class:`~dashboard.charts.Chart` into the lines the page draws, from
  the scraped snapshots or from a run folder's recorded ones (:class:`~dashboard.sources.RunFolder`).
"""

from __future__ import annotations

import itertools
import json
import math
import threading
import time
import urllib.request
from collections import deque
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from dashboard.charts import Chart, Series

if TYPE_CHECKING:
    from pathlib import Path

__all__ = ["JsonlLog", "Scraper", "Snapshot", "chart_data", "parse_exposition"]

# A snapshot's samples: (sample name, sorted label pairs) -> value.
SampleKey = tuple[str, tuple[tuple[str, str], ...]]
MAX_POINTS = 2000


class JsonlLog:
    """Incremental reader of a JSONL metrics log (one JSON object per line, a ``step`` in each)."""

    def __init__(self, path: Path | None, max_records: int = 50_000) -> None:
        self.path = path
        self.records: deque[dict[str, Any]] = deque(maxlen=max_records)
        self.bad_lines = 0
        self._offset = 0
        self._partial = b""
        self._lock = threading.Lock()

    def refresh(self) -> None:
        if self.path is None:
            return
        with self._lock:
            try:
                size = self.path.stat().st_size
            except FileNotFoundError:
                return
            if size < self._offset:  # replaced or truncated: read it again from the start
                self.records.clear()
                self._offset, self._partial = 0, b""
            with open(self.path, "rb") as f:
                f.seek(self._offset)
                chunk = f.read()
            self._offset += len(chunk)
            lines = (self._partial + chunk).split(b"\n")
            # The last piece is empty after a newline, or a line the writer has not finished yet.
            self._partial = lines.pop()
            for line in lines:
                if not line.strip():
                    continue
                try:
                    record = json.loads(line)
                except ValueError:
                    self.bad_lines += 1
                    continue
                if isinstance(record, dict):
                    self.records.append(record)
                else:
                    self.bad_lines += 1

    def points(self, name: str) -> list[list[float]]:
        """``[[step, value], ...]`` of a numeric field (records without it are skipped)."""
        out: list[list[float]] = []
        with self._lock:
            for i, record in enumerate(self.records):
                value = record.get(name)
                if isinstance(value, bool) or not isinstance(value, int | float):
                    continue
                if not math.isfinite(value):
                    continue
                step = record.get("step", i)
                out.append([float(step), float(value)])
        return out[-MAX_POINTS:]

    def status(self) -> dict[str, Any]:
        exists = self.path is not None and self.path.exists()
        return {
            "path": str(self.path) if self.path else None,
            "exists": exists,
            "records": len(self.records),
            "bad_lines": self.bad_lines,
        }


@dataclass
class Snapshot:
    t: float
    samples: dict[SampleKey, float]


@dataclass
class TargetState:
    url: str
    snapshots: deque[Snapshot]
    error: str | None = None
    last_ok: float | None = None


def parse_exposition(text: str) -> dict[SampleKey, float]:
    """Prometheus text format -> {(sample name, labels): value}."""
    from prometheus_client.parser import text_string_to_metric_families

    out: dict[SampleKey, float] = {}
    for family in text_string_to_metric_families(text):
        for s in family.samples:
            out[(s.name, tuple(sorted(s.labels.items())))] = float(s.value)
    return out


class Scraper:
    """Polls ``/metrics`` URLs every ``interval`` seconds, keeping ``window`` snapshots of each."""

    def __init__(self, urls: Iterable[str], interval: float = 2.0, window: int = 900) -> None:
        self.interval = interval
        self.targets = [TargetState(u, deque(maxlen=window)) for u in dict.fromkeys(urls)]
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    def scrape_once(self) -> None:
        for target in self.targets:
            try:
                with urllib.request.urlopen(target.url, timeout=max(self.interval, 1.0)) as r:
                    text = r.read().decode("utf-8", errors="replace")
                samples = parse_exposition(text)
            except Exception as e:  # a service that is down or restarting: keep polling
                with self._lock:
                    target.error = f"{type(e).__name__}: {e}"
                continue
            now = time.time()
            with self._lock:
                target.snapshots.append(Snapshot(now, samples))
                target.error, target.last_ok = None, now

    def _run(self) -> None:
        while not self._stop.is_set():
            self.scrape_once()
            self._stop.wait(self.interval)

    def start(self) -> Scraper:
        if self.targets and self._thread is None:
            self._thread = threading.Thread(target=self._run, name="scraper", daemon=True)
            self._thread.start()
        return self

    def stop(self) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=5)

    def snapshots(self) -> list[tuple[str, list[Snapshot]]]:
        with self._lock:
            return [(t.url, list(t.snapshots)) for t in self.targets]

    def status(self) -> list[dict[str, Any]]:
        with self._lock:
            return [
                {
                    "url": t.url,
                    "ok": t.error is None and t.last_ok is not None,
                    "error": t.error,
                    "last_ok": t.last_ok,
                    "snapshots": len(t.snapshots),
                }
                for t in self.targets
            ]


def _total(snap: Snapshot, name: str, labels: Mapping[str, str]) -> float | None:
    """Sum of the samples called ``name`` whose labels include ``labels``; None if there are none."""
    total, seen = 0.0, False
    for (n, pairs), value in snap.samples.items():
        if n != name:
            continue
        have = dict(pairs)
        if all(have.get(k) == v for k, v in labels.items()):
            total += value
            seen = True
    return total if seen else None


def _line(series: Series, snaps: list[Snapshot]) -> list[list[float]]:
    points: list[list[float]] = []
    if series.how == "value":
        for snap in snaps:
            v = _total(snap, series.metric, series.labels)
            if v is not None and math.isfinite(v):
                points.append([snap.t, v])
        return points[-MAX_POINTS:]
    for prev, cur in itertools.pairwise(snaps):
        a, b = _total(prev, series.metric, series.labels), _total(cur, series.metric, series.labels)
        if a is None or b is None or b < a:  # missing, or the counter was reset by a restart
            continue
        if series.how == "rate":
            dt = cur.t - prev.t
            if dt > 0:
                points.append([cur.t, (b - a) / dt])
        elif series.how == "ratio" and series.per:
            ca, cb = _total(prev, series.per, series.labels), _total(cur, series.per, series.labels)
            if ca is not None and cb is not None and cb > ca:
                points.append([cur.t, (b - a) / (cb - ca)])
    return points[-MAX_POINTS:]


def _bars(series: Series, snap: Snapshot) -> list[dict[str, Any]]:
    """A histogram's cumulative ``le`` buckets (summed over other labels) as per-bucket counts."""
    cumulative: dict[float, float] = {}
    for (n, pairs), value in snap.samples.items():
        if n != series.metric:
            continue
        have = dict(pairs)
        if "le" not in have or not all(have.get(k) == v for k, v in series.labels.items()):
            continue
        le = float(have["le"])
        cumulative[le] = cumulative.get(le, 0.0) + value
    bars, below = [], 0.0
    for le in sorted(cumulative):
        count = cumulative[le] - below
        below = cumulative[le]
        label = "+Inf" if math.isinf(le) else f"≤{le:g}"
        bars.append({"label": label, "value": count})
    # Drop empty buckets at both ends so the bars are readable; keep the inner ones.
    while bars and bars[-1]["value"] == 0:
        bars.pop()
    while bars and bars[0]["value"] == 0:
        bars.pop(0)
    return bars


def _short(url: str) -> str:
    return url.split("://", 1)[-1].removesuffix("/metrics")


def chart_data(chart: Chart, log: JsonlLog, scraper: Scraper) -> dict[str, Any]:
    """The chart with its lines (``[[x, y], ...]``; x = step for log lines, unix time otherwise)."""
    targets = scraper.snapshots()
    out: dict[str, Any] = {**chart.to_json(), "lines": [], "bars": []}
    if chart.kind == "bars":
        bars: dict[str, float] = {}
        for s in chart.series:
            for _url, snaps in targets:
                if not snaps:
                    continue
                if s.how == "value":  # one bar of its own (a count beside the histogram)
                    v = _total(snaps[-1], s.metric, s.labels)
                    if v:
                        bars[s.label] = bars.get(s.label, 0.0) + v
                    continue
                for b in _bars(s, snaps[-1]):
                    bars[b["label"]] = bars.get(b["label"], 0.0) + b["value"]
        out["bars"] = [{"label": k, "value": v} for k, v in bars.items()]
        return out
    for s in chart.series:
        if s.field:
            pts = log.points(s.field)
            if pts:
                out["lines"].append({"label": s.label, "x": "step", "points": pts})
            if pts or log.records:
                # With a log, its fields are the chart's whole story: a key the learner does not
                # write (kl without a KL term) stays out rather than drawn on a time axis next
                # to the others' steps.
                continue
        if s.split == "target":
            for url, snaps in targets:
                pts = _line(s, snaps)
                if pts:
                    out["lines"].append({"label": _short(url), "x": "time", "points": pts})
            continue
        merged: dict[float, float] = {}
        for _url, snaps in targets:
            for x, y in _line(s, snaps):
                # Different targets scrape at slightly different times; bucket to the interval.
                key = round(x / max(scraper.interval, 0.5)) * max(scraper.interval, 0.5)
                merged[key] = merged.get(key, 0.0) + y
        if merged:
            pts = [[x, merged[x]] for x in sorted(merged)]
            out["lines"].append({"label": s.label, "x": "time", "points": pts})
    return out
