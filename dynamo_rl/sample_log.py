"""The rollout worker's sample log: every group it pushed, as one JSON line, in the run folder.

``<run.dir>/samples/<worker_id>.jsonl`` keeps what the Redis stream forgets (the learner trims
what it has read; the stream goes with Redis at the end of a run): the prompt, each response's
text, reward, verdict and length (and for a multi-turn episode each turn, tool call and tool
output: :func:`episode_view`), the allocated count and priority the allocator gave the prompt,
and the weight version it was sampled with. The dashboard's samples page and its DynaMO views read
it after the run. Bounded by rotation: past ``rollout.sample_log_mb`` the file is renamed
``<worker_id>.jsonl.1`` (replacing the previous one) and a new file starts, so at most twice the
bound is kept, the newest groups always.
"""

from __future__ import annotations

import json
import os
import re
from collections.abc import Iterable, Sequence
from pathlib import Path
from typing import Any

from dynamo_rl.jsonl import read_records

__all__ = ["SampleLog", "episode_view", "group_record", "read_samples"]


def episode_view(response: Any) -> dict[str, Any]:
    """A multi-turn response's turns as the samples page shows them (``{}`` for a single-turn
    one): each turn's model text and the observation after it (tool output, feedback), its tool
    calls, its reward when the environment gave one, and the token split (model tokens, loss mask
    1; observation tokens, loss mask 0). The stream's responses and the sample log's records
    both go through here, so the page shows the same either way."""
    if not response.turns:
        return {}
    mask = list(response.loss_mask)
    model = sum(mask) if mask else len(response.token_ids)
    turns = [
        {
            "text": t.text,
            "observation": t.observation,
            "model_tokens": t.end - t.start,
            "observation_tokens": t.observation_end - t.end,
            "reward": t.reward if t.has_reward else None,
            "weight_version": t.weight_version,
            "tool_calls": [
                {
                    "name": c.name,
                    "arguments": c.arguments,
                    "error": c.error,
                    "latency_s": c.latency_s,
                    "malformed": c.malformed,
                }
                for c in t.tool_calls
            ],
        }
        for t in response.turns
    ]
    return {
        "episode": response.episode,
        "segment": response.segment,
        "end_reason": response.end_reason,
        "model_tokens": model,
        "masked_tokens": len(response.token_ids) - model,
        "turns": turns,
    }


def group_record(group: Any) -> dict[str, Any]:
    """One pushed ``TrajectoryGroup`` as the sample log stores it."""
    return {
        "t": group.timing.created_unix if group.HasField("timing") else 0.0,
        "worker_id": group.worker_id,
        "batch_id": group.batch_id,
        "prompt_id": group.prompt_id,
        "data_source": group.data_source,
        "prompt": group.prompt_text,
        "allocated_n": group.allocated_n,
        "priority": group.priority,
        "weight_version": group.weight_version,
        "responses": [
            {
                "text": r.text,
                "reward": r.reward,
                "correct": r.correct,
                "format_ok": r.format_ok,
                "reason": r.reason,
                "finish_reason": r.finish_reason,
                "tokens": len(r.token_ids),
                **episode_view(r),  # multi-turn episodes only: single-turn records are unchanged
            }
            for r in group.responses
        ],
    }


class SampleLog:
    """Appends pushed groups to ``path``, rotating it past ``max_bytes``."""

    def __init__(self, path: Path, max_bytes: int) -> None:
        self.path = path
        self.max_bytes = max(max_bytes, 4096)
        self.path.parent.mkdir(parents=True, exist_ok=True)

    @classmethod
    def in_run(cls, run_dir: str | Path, worker_id: str, max_mb: float) -> SampleLog:
        safe = re.sub(r"[^A-Za-z0-9_.-]", "_", worker_id) or "worker"
        return cls(Path(run_dir) / "samples" / f"{safe}.jsonl", int(max_mb * 2**20))

    def write(self, groups: Sequence[Any]) -> None:
        if not groups:
            return
        text = "".join(json.dumps(group_record(g), separators=(",", ":")) + "\n" for g in groups)
        with open(self.path, "a") as f:
            f.write(text)
            f.flush()
        if self.path.stat().st_size > self.max_bytes:
            os.replace(self.path, self.path.with_name(self.path.name + ".1"))


def read_samples(folder: str | Path) -> list[dict[str, Any]]:
    """Every group in a run's ``samples/`` folder, oldest first (a half-written line skipped)."""
    files: Iterable[Path] = sorted(Path(folder).glob("*.jsonl.1")) + sorted(
        Path(folder).glob("*.jsonl")
    )
    out = [record for path in files for record in read_records(path, "responses")]
    out.sort(key=lambda r: r.get("t", 0.0))
    return out
