"""Per-prompt success statistics in Redis, shared by every allocator replica and rollout worker.

Layout: one hash per namespace (``dynamo_rl.keys.stats_key``); field = prompt id, value =
``"<samples> <successes> <updated_unix>"``. One field per prompt keeps reads to one ``HMGET`` of N
fields and makes a namespace's reset one ``DEL``.

Writes go through a Lua script: for each prompt it reads the old pair, multiplies it by ``decay``,
adds the new attempts and successes and stamps the time — atomically, since Redis runs a script
without interleaving any other command. So concurrent reporters never lose an increment, and a
reader never sees samples updated without successes. A large report is cut into chunks (so one
script never blocks Redis for long) that travel in one pipelined round trip.

Decay trade-off: 1.0 (default, as the reference) keeps the whole history, the best estimate while
the policy stands still; below 1 old outcomes fade with every new report, so a prompt the policy has
since mastered stops looking half-solved, at the price of noisier estimates. With decay d and a
steady a attempts per report, samples tend to a/(1−d): keep that above ``initial_budget`` or the
prompt is explored forever.
"""

from __future__ import annotations

import json
import time
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
import numpy.typing as npt
import redis

from dynamo_rl.keys import stats_key

__all__ = ["REPORT_CHUNK", "StatsStore", "StoredStats"]

REPORT_CHUNK = 2048
"""Outcomes per script call; one call is atomic, a report of many chunks is pipelined."""

# KEYS[1] the hash; ARGV[1] decay, ARGV[2] now; then (prompt id, attempts, successes) triples.
# %.17g keeps doubles exact; whole numbers print without a decimal point.
_REPORT_LUA = """
local decay = tonumber(ARGV[1])
local now = ARGV[2]
local key = KEYS[1]
local updated = 0
for i = 3, #ARGV, 3 do
  local id = ARGV[i]
  local g, k = 0, 0
  local old = redis.call('HGET', key, id)
  if old then
    local og, ok = string.match(old, '^(%S+) (%S+)')
    g = tonumber(og) * decay
    k = tonumber(ok) * decay
  end
  g = g + tonumber(ARGV[i + 1])
  k = k + tonumber(ARGV[i + 2])
  redis.call('HSET', key, id, string.format('%.17g %.17g %s', g, k, now))
  updated = updated + 1
end
return updated
"""


@dataclass(frozen=True)
class StoredStats:
    """Statistics of a batch of prompts, in request order."""

    samples: npt.NDArray[np.float64]
    successes: npt.NDArray[np.float64]
    updated_unix: npt.NDArray[np.float64]


def _parse(values: Sequence[bytes | None]) -> StoredStats:
    n = len(values)
    out = np.zeros((n, 3), dtype=np.float64)
    for i, v in enumerate(values):
        if v is not None:
            a, b, c = v.split()
            out[i, 0] = float(a)
            out[i, 1] = float(b)
            out[i, 2] = float(c)
    return StoredStats(out[:, 0].copy(), out[:, 1].copy(), out[:, 2].copy())


class StatsStore:
    """Reads and updates the statistics of one Redis; thread-safe (a redis-py connection pool)."""

    def __init__(self, client: redis.Redis, decay: float = 1.0) -> None:
        if not 0 < decay <= 1:
            raise ValueError(f"decay must be in (0, 1], got {decay}")
        self.client = client
        self.decay = decay
        self._report = client.register_script(_REPORT_LUA)

    @classmethod
    def from_url(cls, url: str, decay: float = 1.0, timeout_s: float = 2.0) -> StatsStore:
        client = redis.Redis.from_url(
            url,
            socket_timeout=timeout_s,
            socket_connect_timeout=timeout_s,
            health_check_interval=30,
        )
        return cls(client, decay)

    def get(self, namespace: str, prompt_ids: Sequence[str]) -> StoredStats:
        """Statistics per prompt in order; zeros for prompts never reported."""
        if not prompt_ids:
            empty = np.zeros(0)
            return StoredStats(empty, empty.copy(), empty.copy())
        values = self.client.hmget(stats_key(namespace), list(prompt_ids))
        return _parse(values)

    def report(self, namespace: str, outcomes: Sequence[tuple[str, int, int]]) -> int:
        """Add (prompt_id, attempts, successes) per prompt; returns how many prompts were updated."""
        if not outcomes:
            return 0
        key = stats_key(namespace)
        now = f"{time.time():.3f}"
        decay = repr(float(self.decay))
        pipe = self.client.pipeline(transaction=False)
        for start in range(0, len(outcomes), REPORT_CHUNK):
            args: list[Any] = [decay, now]
            for pid, attempts, successes in outcomes[start : start + REPORT_CHUNK]:
                args += (pid, attempts, successes)
            self._report(keys=[key], args=args, client=pipe)
        return int(sum(pipe.execute()))

    def reset(self, namespace: str) -> int:
        """Delete a namespace's statistics; returns how many prompts had some."""
        key = stats_key(namespace)
        pipe = self.client.pipeline(transaction=True)
        pipe.hlen(key)
        pipe.delete(key)
        removed, _ = pipe.execute()
        return int(removed)

    def export(self, namespace: str) -> dict[str, Any]:
        """Every statistic of a namespace as a JSON-ready dict (read with HSCAN, not blocking)."""
        prompts: dict[str, dict[str, float]] = {}
        for field, value in self.client.hscan_iter(stats_key(namespace), count=1000):
            samples, successes, updated = (float(x) for x in value.split())
            prompts[field.decode()] = {
                "samples": samples,
                "successes": successes,
                "updated_unix": updated,
            }
        return {
            "namespace": namespace,
            "exported_unix": time.time(),
            "decay": self.decay,
            "prompts": prompts,
        }

    def export_json(self, namespace: str) -> str:
        return json.dumps(self.export(namespace), sort_keys=True)

    def ping(self) -> bool:
        return bool(self.client.ping())

    def close(self) -> None:
        self.client.close()
