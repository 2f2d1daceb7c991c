"""The samples page's rows and the allocation charts, from the Redis trajectory stream or from a
run's sample log.

- :class:`SampleFilter` is what the page asks for (its query parameters).
- :class:`SampleReader` reads the newest trajectory groups from the Redis stream.
- :func:`sample_rows` flattens groups, as the sample log records them
  (:func:`dynamo_rl.sample_log.group_record`), into one row per response: the stream's groups go
  through that record too, so the page shows the same either way.
- :func:`allocation_charts` draws the allocator's counts and the half-solved share from groups.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

__all__ = ["SampleFilter", "SampleReader", "allocation_charts", "sample_rows"]

# Accuracy range of a "half-solved" prompt, for the allocation chart computed from the stream.
HALF_SOLVED = (0.25, 0.75)
# Fields of a multi-turn response (dynamo_rl.sample_log.episode_view) a samples row carries.
EPISODE_FIELDS = ("episode", "segment", "end_reason", "model_tokens", "masked_tokens", "turns")


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


def sample_rows(
    groups: Iterable[tuple[str, Mapping[str, Any]]], flt: SampleFilter, estimator: str
) -> tuple[list[dict[str, Any]], set[str], set[str]]:
    """One row per response of ``(entry id, group record)`` pairs, in the order given: the rows
    ``flt`` accepts (at most ``flt.limit``), and every data source and verdict reason seen. The
    advantage column is what the response would be pushed by under the learner's ``estimator``
    (:mod:`dashboard.advantages`; None for estimators with no per-group figure)."""
    from dashboard.advantages import group_advantages

    rows: list[dict[str, Any]] = []
    sources: set[str] = set()
    reasons: set[str] = set()
    for entry_id, group in groups:
        responses = group["responses"]
        # A multi-turn response's record has its "episode"; a single-turn one is its own.
        episodes = [r.get("episode") for r in responses]
        advantages = group_advantages([r["reward"] for r in responses], estimator, episodes)
        sources.add(group["data_source"])
        for i, r in enumerate(responses):
            reasons.add(r["reason"])
            row = {
                "entry_id": entry_id,
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
                # A multi-turn episode's turns, tool calls and outputs, and mask split.
                **{k: r[k] for k in EPISODE_FIELDS if k in r},
            }
            if flt.accepts(row) and len(rows) < flt.limit:
                rows.append(row)
    return rows, sources, reasons


@dataclass
class SampleReader:
    """Newest trajectory groups of a namespace's stream, one row per response."""

    redis_url: str
    namespace: str
    scan: int = 500
    estimator: str = "grpo"
    """The learner's advantage estimator (its registry name), for the advantage column."""
    _client: Any = field(default=None, repr=False)

    def _redis(self) -> Any:
        if self._client is None:
            from dynamo_rl.redis_client import sync_client

            self._client = sync_client(self.redis_url)
        return self._client

    def read(self, flt: SampleFilter) -> dict[str, Any]:
        from dynamo_rl.contracts.stream import newest
        from dynamo_rl.keys import trajectory_stream, weight_version_key
        from dynamo_rl.sample_log import group_record

        client = self._redis()
        stream = trajectory_stream(self.namespace)
        entries = newest(client, self.namespace, self.scan)
        errors = [{"id": e.entry_id, "reason": e.error or ""} for e in entries if e.group is None]
        decoded = ((e.entry_id, group_record(e.group)) for e in entries if e.group is not None)
        rows, sources, reasons = sample_rows(decoded, flt, self.estimator)
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
