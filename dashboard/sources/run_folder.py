"""What a run leaves in its folder, read for the dashboard while it runs and after it ended:
the services' recorded metric histories, the rollout workers' sample logs, ``up``'s evaluations."""

from __future__ import annotations

import json
import threading
from pathlib import Path
from typing import Any

from dashboard.sources.metrics import Snapshot
from dashboard.sources.samples import SampleFilter, allocation_charts, sample_rows
from dynamo_rl.notices import NoticeTail
from dynamo_rl.run_layout import sft_run_dir, warm_start_model

__all__ = ["RunFolder"]

# Snapshots per run-folder history file that the charts are drawn from (RunFolder.snapshots).
MAX_SNAPSHOTS = 400


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
    - ``warnings.jsonl`` (and the warm start's, ``model/sft.run/warnings.jsonl``, read incrementally): the services'
      warnings a user must act on (:mod:`dynamo_rl.notices`), each once;
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
        self._notices: NoticeTail | None = None  # the warnings read so far

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

    def warnings(self) -> list[dict[str, Any]]:
        """The run's warnings, each once, oldest first: ``{"service", "kind", "message", "t"}``
        (what ``up`` printed on its console)."""
        if self.run_dir is None:
            return []
        with self._lock:
            if self._notices is None:
                sft_run = sft_run_dir(warm_start_model(self.run_dir))
                self._notices = NoticeTail([self.run_dir, sft_run])
            self._notices.poll()
            found = sorted(self._notices.seen.values(), key=lambda n: n.t)
        return [{"service": n.service, "kind": n.kind, "message": n.message, "t": n.t}
                for n in found]  # fmt: skip

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
        groups = self.groups()
        newest_first = ((g["batch_id"], g) for g in reversed(groups))
        rows, sources, reasons = sample_rows(newest_first, flt, self.estimator)
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
