"""Where the built-in dashboard's numbers come from, and how they become chart lines.

- :class:`JsonlLog` follows the learner's JSONL metrics log: it reads only the lines appended since
  the last call (the log grows for the whole run), tolerates a half-written last line, and starts
  over if the file is replaced by a shorter one.
- :class:`Scraper` polls Prometheus ``/metrics`` endpoints on a background thread and keeps a window
  of snapshots; rates are computed between consecutive snapshots, so a counter needs two scrapes
  before its chart shows a point.
- :class:`SampleReader` reads the newest trajectory groups from the Redis stream and flattens them
  into one row per response for the samples page.
- :func:`chart_data` turns a :class:`~dashboard.charts.Chart` into the lines the page
  draws.
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
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from dashboard.charts import Chart, Series

__all__ = ["JsonlLog", "RunFolder", "SampleFilter", "SampleReader", "Scraper", "chart_data"]

# A snapshot's samples: (sample name, sorted label pairs) -> value.
SampleKey = tuple[str, tuple[tuple[str, str], ...]]
MAX_POINTS = 2000
# Snapshots per run-folder history file that the charts are drawn from (RunFolder.snapshots).
MAX_SNAPSHOTS = 400
# Accuracy range of a "half-solved" prompt, for the allocation chart computed from the stream.
HALF_SOLVED = (0.25, 0.75)
# Fields of a multi-turn response (dynamo_rl.sample_log.episode_view) a samples row carries.
EPISODE_FIELDS = ("episode", "segment", "end_reason", "model_tokens", "masked_tokens", "turns")


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


@dataclass
class SampleFilter:
    """What the samples page asks for (query parameters of ``/api/samples``)."""

    source: str | None = None
    min_reward: float | None = None
    max_reward: float | None = None
    correct: bool | None = None
    reason: str | None = None
    text: str | None = None
    limit: int = 100

    @classmethod
    def from_query(cls, query: Mapping[str, list[str]]) -> SampleFilter:
        def one(key: str) -> str | None:
            values = query.get(key)
            return values[0] if values and values[0] != "" else None

        def number(key: str) -> float | None:
            raw = one(key)
            if raw is None:
                return None
            value = float(raw)  # ValueError -> 400 in the server
            if not math.isfinite(value):
                raise ValueError(f"{key} must be finite")
            return value

        correct = one("correct")
        if correct not in (None, "true", "false"):
            raise ValueError("correct must be true or false")
        limit = int(one("limit") or 100)
        return cls(
            source=one("source"),
            min_reward=number("min_reward"),
            max_reward=number("max_reward"),
            correct=None if correct is None else correct == "true",
            reason=one("reason"),
            text=one("q"),
            limit=max(1, min(limit, 1000)),
        )

    def accepts(self, row: Mapping[str, Any]) -> bool:
        if self.source is not None and row["data_source"] != self.source:
            return False
        if self.min_reward is not None and row["reward"] < self.min_reward:
            return False
        if self.max_reward is not None and row["reward"] > self.max_reward:
            return False
        if self.correct is not None and row["correct"] != self.correct:
            return False
        if self.reason is not None and row["reason"] != self.reason:
            return False
        if self.text is not None:
            needle = self.text.lower()
            if needle not in row["prompt"].lower() and needle not in row["response"].lower():
                return False
        return True


@dataclass
class SampleReader:
    """Newest trajectory groups of a namespace's stream, one row per response."""

    redis_url: str
    namespace: str
    scan: int = 500
    estimator: str = "grpo"
    """The learner's advantage estimator (its registry name): the advantage column uses its
    formula (``dashboard.advantages``); estimators with no per-group figure give None."""
    _client: Any = field(default=None, repr=False)

    def _redis(self) -> Any:
        if self._client is None:
            from dynamo_rl.redis_client import sync_client

            self._client = sync_client(self.redis_url)
        return self._client

    def read(self, flt: SampleFilter) -> dict[str, Any]:
        from dashboard.advantages import group_advantages
        from dynamo_rl.contracts.stream import newest
        from dynamo_rl.keys import trajectory_stream, weight_version_key
        from dynamo_rl.sample_log import episode_view

        client = self._redis()
        stream = trajectory_stream(self.namespace)
        entries = newest(client, self.namespace, self.scan)
        rows: list[dict[str, Any]] = []
        sources: set[str] = set()
        reasons: set[str] = set()
        errors: list[dict[str, str]] = []
        for entry in entries:
            eid, group = entry.entry_id, entry.group
            if group is None:
                errors.append({"id": eid, "reason": entry.error or ""})
                continue
            advantages = group_advantages([r.reward for r in group.responses], self.estimator)
            sources.add(group.data_source)
            for i, r in enumerate(group.responses):
                reasons.add(r.reason)
                row = {
                    "entry_id": eid,
                    "prompt_id": group.prompt_id,
                    "data_source": group.data_source,
                    "prompt": group.prompt_text,
                    "response": r.text,
                    "index": i,
                    "group_size": len(group.responses),
                    "reward": r.reward,
                    "correct": r.correct,
                    "format_ok": r.format_ok,
                    "reason": r.reason,
                    "finish_reason": r.finish_reason,
                    "tokens": len(r.token_ids),
                    # What this response would be pushed by under the configured estimator.
                    "advantage": advantages[i] if advantages is not None else None,
                    "allocated_n": group.allocated_n,
                    "priority": group.priority,
                    "weight_version": group.weight_version,
                    "created_unix": group.timing.created_unix if group.HasField("timing") else 0.0,
                    # A multi-turn episode's turns, tool calls and outputs, and mask split.
                    **episode_view(r),
                }
                if flt.accepts(row) and len(rows) < flt.limit:
                    rows.append(row)
        length = client.xlen(stream)
        version = client.get(weight_version_key(self.namespace))
        return {
            "rows": rows,
            "sources": sorted(sources),
            "reasons": sorted(reasons),
            "scanned_groups": len(entries),
            "decode_errors": errors[:20],
            "stream": stream,
            "stream_length": length,
            "weight_version": int(version) if version is not None else None,
        }

    def stream_charts(self) -> list[dict[str, Any]]:
        """Allocation charts computed from the newest groups of the stream itself.

        - the distribution of the allocator's counts over those groups;
        - per weight version, the share of responses that went to half-solved prompts: groups whose
          own accuracy lies in [``HALF_SOLVED``], where the Bernoulli variance (what DRA allocates
          by) is largest. A rising share means the allocator spends its budget where the gradient
          signal is.
        """
        from dynamo_rl.contracts.stream import newest

        groups = (e.group for e in newest(self._redis(), self.namespace, self.scan) if e.group)
        return allocation_charts(
            ((g.allocated_n, g.weight_version, [r.correct for r in g.responses]) for g in groups),
            "Allocated count of the newest groups (stream)",
        )

    def close(self) -> None:
        if self._client is not None:
            self._client.close()
            self._client = None


def _mean(values: list[float]) -> float:
    return sum(values) / len(values)


class RunFolder:
    """What a run leaves in its folder, read for the dashboard while it runs and after it ended.

    - ``metrics/<service>-<instance>.jsonl``: every service's metric snapshots
      (:class:`dynamo_rl.metrics.History`), served to :func:`chart_data` exactly like the
      :class:`Scraper`'s (one target per file), so every Prometheus chart has its whole history;
    - ``samples/*.jsonl``: the rollout workers' sample logs (:mod:`dynamo_rl.sample_log`) for the
      samples page, the allocation charts and the DynaMO views;
    - ``eval_before.json``/``eval_after.json``: ``up``'s held-out evaluations;
    - ``summary.json``: written by ``up`` at the end, so the run reads as finished.

    History files are read incrementally (only what was appended since the last refresh; from the
    start again when downsampling replaced one: a new inode, or a shorter file).
    """

    def __init__(
        self, run_dir: Path | None, grpo_n: int = 8, estimator: str = "grpo", scan: int = 5000
    ) -> None:
        self.run_dir = run_dir
        self.grpo_n = grpo_n
        self.estimator = estimator
        self.scan = scan
        self.interval = 5.0
        # path -> (inode, offset read up to, snapshots)
        self._history: dict[Path, tuple[int, int, list[Snapshot]]] = {}
        self._samples: tuple[tuple[tuple[str, int, float], ...], list[dict[str, Any]]] = ((), [])
        self._lock = threading.Lock()

    # -- metric histories ----------------------------------------------------------------------

    def _files(self, sub: str, pattern: str) -> list[Path]:
        if self.run_dir is None:
            return []
        return sorted((self.run_dir / sub).glob(pattern))

    def refresh(self) -> None:
        """Read what was appended to each history file since the last call (a file that shrank
        was rewritten by downsampling: read again from its start)."""
        with self._lock:
            seen = set()
            for path in self._files("metrics", "*.jsonl"):
                seen.add(path)
                try:
                    st = path.stat()
                except FileNotFoundError:
                    continue
                size = st.st_size
                inode, offset, snaps = self._history.get(path, (st.st_ino, 0, []))
                if st.st_ino != inode or size < offset:  # replaced by a downsampled copy
                    offset, snaps = 0, []
                if size == offset:
                    self._history[path] = (st.st_ino, offset, snaps)
                    continue
                with open(path, "rb") as f:
                    f.seek(offset)
                    chunk = f.read(size - offset)
                end = chunk.rfind(b"\n") + 1  # a line still being written waits for next time
                for line in chunk[:end].splitlines():
                    try:
                        record = json.loads(line)
                        samples = {
                            (str(name), tuple(sorted(labels.items()))): float(value)
                            for name, labels, value in record["samples"]
                        }
                    except (ValueError, KeyError, TypeError):
                        continue
                    snaps.append(Snapshot(float(record["t"]), samples))
                    self.interval = max(float(record.get("interval_s", 5.0)), 0.5)
                self._history[path] = (st.st_ino, offset + end, snaps)
            for gone in set(self._history) - seen:
                del self._history[gone]

    def has_history(self) -> bool:
        with self._lock:
            return any(snaps for _inode, _offset, snaps in self._history.values())

    def snapshots(self) -> list[tuple[str, list[Snapshot]]]:
        """Each file's snapshots, thinned to at most ``MAX_SNAPSHOTS`` evenly spaced ones (the
        last kept): counters are cumulative, so rates between the kept ones stay exact, and a
        long run's charts cost the same to draw as a short one's."""
        with self._lock:
            out = []
            for path, (_inode, _offset, snaps) in sorted(self._history.items()):
                stride = -(-len(snaps) // MAX_SNAPSHOTS)
                kept = snaps[::-1][::stride][::-1] if stride > 1 else list(snaps)
                out.append((path.stem, kept))
            return out

    # -- run state and evaluations -------------------------------------------------------------

    def _json(self, name: str) -> dict[str, Any] | None:
        if self.run_dir is None:
            return None
        try:
            value = json.loads((self.run_dir / name).read_text())
        except (FileNotFoundError, ValueError):
            return None
        return value if isinstance(value, dict) else None

    def finished(self) -> bool:
        return self._json("summary.json") is not None

    def evaluations(self) -> dict[str, Any]:
        """``{"before"|"after": {"accuracy", "n", "prompts", "by_data_source": {part:
        {"accuracy"}}}}`` for the evaluations present; the parts are each data source (and
        benchmark, when several ran: :func:`dynamo_rl.trackers.eval_breakdown`)."""
        from dynamo_rl.trackers import eval_breakdown

        out: dict[str, Any] = {}
        for label in ("before", "after"):
            result = self._json(f"eval_{label}.json")
            if result is None or "accuracy" not in result:
                continue
            out[label] = {
                "accuracy": result["accuracy"],
                "n": result.get("n"),
                "prompts": result.get("prompts"),
                "by_data_source": {k: {"accuracy": v} for k, v in eval_breakdown(result).items()},
            }
        return out

    def status(self) -> dict[str, Any]:
        with self._lock:
            files = [path.name for path in sorted(self._history)]
        return {
            "path": str(self.run_dir) if self.run_dir else None,
            "state": "finished" if self.finished() else "running",
            "history_files": files,
            "sample_groups": len(self.groups()),
        }

    # -- the sample log ------------------------------------------------------------------------

    def groups(self) -> list[dict[str, Any]]:
        """The sample log's groups, oldest first (the newest ``scan`` of them)."""
        from dynamo_rl.sample_log import read_samples

        files = self._files("samples", "*.jsonl*")
        key = []
        for path in files:
            try:
                st = path.stat()
            except FileNotFoundError:
                continue
            key.append((path.name, st.st_size, st.st_mtime))
        with self._lock:
            if tuple(key) != self._samples[0]:
                groups = read_samples(self.run_dir / "samples") if self.run_dir else []
                self._samples = (tuple(key), groups[-self.scan :])
            return self._samples[1]

    def has_samples(self) -> bool:
        return bool(self.groups())

    def read(self, flt: SampleFilter) -> dict[str, Any]:
        """The samples page's rows from the sample log, newest group first."""
        from dashboard.advantages import group_advantages

        groups = self.groups()
        rows: list[dict[str, Any]] = []
        sources: set[str] = set()
        reasons: set[str] = set()
        for group in reversed(groups):
            responses = group["responses"]
            advantages = group_advantages([r["reward"] for r in responses], self.estimator)
            sources.add(group["data_source"])
            for i, r in enumerate(responses):
                reasons.add(r["reason"])
                row = {
                    "entry_id": group["batch_id"],
                    "prompt_id": group["prompt_id"],
                    "data_source": group["data_source"],
                    "prompt": group["prompt"],
                    "response": r["text"],
                    "index": i,
                    "group_size": len(responses),
                    "reward": r["reward"],
                    "correct": r["correct"],
                    "format_ok": r["format_ok"],
                    "reason": r["reason"],
                    "finish_reason": r["finish_reason"],
                    "tokens": r["tokens"],
                    "advantage": advantages[i] if advantages is not None else None,
                    "allocated_n": group["allocated_n"],
                    "priority": group["priority"],
                    "weight_version": group["weight_version"],
                    "created_unix": group["t"],
                    **{k: r[k] for k in EPISODE_FIELDS if k in r},
                }
                if flt.accepts(row) and len(rows) < flt.limit:
                    rows.append(row)
        return {
            "rows": rows,
            "sources": sorted(sources),
            "reasons": sorted(reasons),
            "scanned_groups": len(groups),
            "decode_errors": [],
            "stream": None,
            "stream_length": None,
            "weight_version": max((g["weight_version"] for g in groups), default=None),
            "origin": "run folder",
        }

    def stream_charts(self) -> list[dict[str, Any]]:
        """The allocation charts :meth:`SampleReader.stream_charts` draws from Redis, from the
        sample log instead (every group the workers pushed, not only those still in Redis)."""
        return allocation_charts(
            ((g["allocated_n"], g["weight_version"], [r["correct"] for r in g["responses"]])
             for g in self.groups()),
            "Allocated count of the groups (sample log)",
        )  # fmt: skip

    # -- DynaMO views --------------------------------------------------------------------------

    def prompts(self, limit: int = 200) -> list[dict[str, Any]]:
        """The most sampled prompts: ``[{"id", "groups", "text"}]``, most groups first."""
        seen: dict[str, dict[str, Any]] = {}
        for group in self.groups():
            entry = seen.setdefault(
                group["prompt_id"], {"id": group["prompt_id"], "groups": 0, "text": group["prompt"]}
            )
            entry["groups"] += 1
        ranked = sorted(seen.values(), key=lambda e: (-e["groups"], e["id"]))
        return [{**e, "text": e["text"][:80]} for e in ranked[:limit]]

    def dynamo_charts(self, prompt_id: str | None) -> tuple[str | None, list[dict[str, Any]]]:
        """The DynaMO views: compute spent on zero-advantage groups against GRPO's expected share,
        and, for one prompt (``prompt_id``; default: the most sampled), its success statistics,
        allocated n and priority over time. Returns (the prompt shown, charts)."""
        groups = self.groups()
        common = {"group": "dynamo", "series": [], "kind": "line", "bars": []}
        # Pooled success rate of each prompt over the whole log: the p of GRPO's expectation.
        pooled: dict[str, list[int]] = {}
        for g in groups:
            tally = pooled.setdefault(g["prompt_id"], [0, 0])
            tally[0] += sum(bool(r["correct"]) for r in g["responses"])
            tally[1] += len(g["responses"])
        n = self.grpo_n
        actual: dict[int, list[int]] = {}  # weight version -> [zero-advantage responses, all]
        expected: dict[int, list[float]] = {}
        for g in groups:
            rewards = [r["reward"] for r in g["responses"]]
            if not rewards:
                continue
            version = g["weight_version"]
            tally = actual.setdefault(version, [0, 0])
            tally[0] += len(rewards) if max(rewards) == min(rewards) else 0
            tally[1] += len(rewards)
            hits, total = pooled[g["prompt_id"]]
            p = hits / total
            expected.setdefault(version, []).append(p**n + (1 - p) ** n)
        zero = {
            **common,
            "id": "zero_advantage",
            "title": f"Compute on zero-advantage groups: this run vs GRPO's expected share "
            f"(n={n}, p = each prompt's success rate)",
            "unit": "share of responses",
            "lines": []
            if not actual
            else [
                {
                    "label": "this run",
                    "x": "version",
                    "points": [[float(v), z / t] for v, (z, t) in sorted(actual.items())],
                },
                {
                    "label": f"GRPO, n={n}",
                    "x": "version",
                    "points": [[float(v), _mean(e)] for v, e in sorted(expected.items())],
                },
            ],
        }
        ranked = self.prompts(limit=1)
        chosen = prompt_id if prompt_id in pooled else (ranked[0]["id"] if ranked else None)
        mine = [g for g in groups if g["prompt_id"] == chosen]
        success, cumulative, alloc, priority = [], [], [], []
        hits = total = 0
        for g in mine:
            rs = g["responses"]
            if not rs:
                continue
            k = sum(bool(r["correct"]) for r in rs)
            hits, total = hits + k, total + len(rs)
            t = float(g["t"])
            success.append([t, k / len(rs)])
            cumulative.append([t, hits / total])
            alloc.append([t, float(g["allocated_n"])])
            priority.append([t, float(g["priority"])])

        def line(label: str, points: list[list[float]]) -> list[dict[str, Any]]:
            return [{"label": label, "x": "time", "points": points}] if points else []

        title = f"prompt {chosen}" if chosen is not None else "prompt (none sampled yet)"
        return chosen, [
            zero,
            {**common, "id": "prompt_success", "title": f"{title}: success rate", "unit": "",
             "lines": line("group accuracy", success) + line("running mean", cumulative)},
            {**common, "id": "prompt_alloc", "title": f"{title}: allocated n", "unit": "responses",
             "lines": line("allocated n", alloc)},
            {**common, "id": "prompt_priority", "title": f"{title}: allocator priority", "unit": "",
             "lines": line("priority", priority)},
        ]  # fmt: skip


def allocation_charts(groups: Iterable[tuple[int, int, list[bool]]], title: str) -> list[dict]:
    """The two allocation charts of the samples' groups, each ``(allocated n, weight version,
    correctness of each response)``: the distribution of the allocator's counts, and per weight
    version the share of responses to half-solved prompts (group accuracy in ``HALF_SOLVED``)."""
    counts: dict[int, int] = {}
    responses: dict[int, list[int]] = {}  # weight version -> [half-solved, all]
    lo, hi = HALF_SOLVED
    for allocated_n, version, correct in groups:
        counts[allocated_n] = counts.get(allocated_n, 0) + 1
        if not correct:
            continue
        n = len(correct)
        tally = responses.setdefault(version, [0, 0])
        tally[0] += n if lo <= sum(map(bool, correct)) / n <= hi else 0
        tally[1] += n
    common = {"group": "allocation", "series": []}
    return [
        {
            **common,
            "id": "stream_alloc",
            "title": title,
            "unit": "groups",
            "kind": "bars",
            "lines": [],
            "bars": [{"label": str(k), "value": float(counts[k])} for k in sorted(counts)],
        },
        {
            **common,
            "id": "stream_half_solved",
            "title": f"Share of responses to half-solved prompts (accuracy {lo:g}-{hi:g})",
            "unit": "",
            "kind": "line",
            "bars": [],
            "lines": [
                {
                    "label": "by weight version",
                    "x": "version",
                    "points": [[float(v), h / t] for v, (h, t) in sorted(responses.items())],
                }
            ]
            if responses
            else [],
        },
    ]
