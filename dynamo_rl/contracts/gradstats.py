"""Per-prompt gradient statistics, learner → allocator, next to the success statistics in Redis.

The learner measures each prompt's gradient on every batch it trains on
(``learner/algorithms/gradstats.py``: the output-layer ghost norm times the loss's own token
coefficients, reduced to the group's mean and spread) and writes them here with the weight
version they were measured at. Groups the rollout workers drop because every reward was equal
(``rollout.drop_uniform_groups``) never reach the learner: the worker writes them instead
(:func:`dropped_records`: zero advantage, zero gradient, at the version they were sampled at),
so their zero-advantage streak still counts. The allocator reads them for its ``grad`` method
and the skip rule (``allocator/algorithm.py``). Both ends import this module and nothing else
of each other.

Layout: one hash per namespace (``dynamo_rl.keys.grad_stats_key``), field = prompt id, value =
five little-endian float64 — mean, spread, weight version, zero-advantage streak, visit weight
(40 bytes; a 32-byte value from before the weight was kept reads with weight 1). A write goes
through one Lua script that, per prompt and atomically, sets the streak to the old one + 1 when
the group had zero advantage (every reward equal) and to 0 otherwise, and merges the visit into
the statistics:

- without a half-life (``half_life`` None, the default): the visit replaces them (weight 1);
- with one (``allocator.stats_half_life`` = h): the old statistics count w = W·0.5^(Δv/h), W
  their weight and Δv = the visit's version − theirs (at least 0), and the visit 1: weight
  w + 1, mean (w·mean + m)/(w + 1), spread √((w·spread² + s²)/(w + 1)) — the spread the
  allocator reads is the root of a visit-weighted mean of spread², the statistic its Σσ²/n
  objective uses. The version stored is the visit's.

A read is one
``HMGET`` plus the namespace's current weight version (``dynamo_rl.keys.weight_version_key``,
which the learner sets after every push; 0 while unset), in one round trip; a prompt never
measured reads as NaN spread.

Staleness: the allocator turns the version distance into an age (current − measured, in weight
versions) and weighs the statistic by 0.5^(age / ``allocator.grad_half_life``) against the σ
fallback (``allocator.algorithm.grad_weights``), and the skip rule's probability likewise.
"""

from __future__ import annotations

import struct
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
import numpy.typing as npt

from dynamo_rl.keys import grad_stats_key, weight_version_key

__all__ = [
    "VALUE",
    "GradRecord",
    "GradStatsRead",
    "aread",
    "awrite",
    "decode",
    "dropped_records",
    "read",
    "write",
]

VALUE = struct.Struct("<ddddd")
"""A stored value: mean, spread, weight version, zero-advantage streak, visit weight."""

_MISSING = VALUE.pack(np.nan, np.nan, 0.0, 0.0, 0.0)
_WEIGHT_ONE = struct.pack("<d", 1.0)
"""Appended to a 32-byte value (written before the weight was kept)."""

# KEYS[1] the hash; ARGV[1] the version; ARGV[2] the half-life (0: none, the visit replaces);
# then per prompt: id, mean, spread, zero (0/1).
_WRITE_LUA = """
local version = tonumber(ARGV[1])
local half = tonumber(ARGV[2])
local m = math.floor((#ARGV - 2) / 4)
local ids = {}
for j = 1, m do ids[j] = ARGV[4 * j - 1] end
local olds = redis.call('HMGET', KEYS[1], unpack(ids))
local args = {}
for j = 1, m do
  local mean, spread = tonumber(ARGV[4 * j]), tonumber(ARGV[4 * j + 1])
  local zero = tonumber(ARGV[4 * j + 2]) > 0
  local streak, weight = 0, 1
  local old = olds[j]
  if old then
    local om, os, ov, s = struct.unpack('<dddd', old)
    local ow = 1
    if #old >= 40 then
      local _, _, _, _, w = struct.unpack('<ddddd', old)
      ow = w
    end
    if zero then streak = s + 1 end
    if half > 0 then
      local dv = version - ov
      local w = ow
      if dv > 0 then w = ow * 0.5 ^ (dv / half) end
      weight = w + 1
      mean = (w * om + mean) / weight
      spread = math.sqrt((w * os * os + spread * spread) / weight)
    end
  elseif zero then
    streak = 1
  end
  args[#args + 1] = ids[j]
  args[#args + 1] = struct.pack('<ddddd', mean, spread, version, streak, weight)
end
redis.call('HSET', KEYS[1], unpack(args))
return m
"""

WRITE_CHUNK = 1000
"""Prompts per script call (one call is atomic)."""


@dataclass(frozen=True)
class GradRecord:
    """One prompt's measurement: its group's mean and spread, and whether every reward was
    equal (zero advantage)."""

    prompt_id: str
    mean: float
    spread: float
    zero_advantage: bool


@dataclass(frozen=True)
class GradStatsRead:
    """Statistics of a batch of prompts in request order, and the namespace's current version."""

    mean: npt.NDArray[np.float64]
    spread: npt.NDArray[np.float64]
    """NaN where never measured."""
    version: npt.NDArray[np.float64]
    streak: npt.NDArray[np.float64]
    weight: npt.NDArray[np.float64]
    """The visits behind each statistic, each weighted by its age at the last write (1 without a
    half-life; 0 where never measured)."""
    current_version: int

    @property
    def age(self) -> npt.NDArray[np.float64]:
        """Weight versions since each measurement (0 where never measured or from the future)."""
        return np.maximum(self.current_version - self.version, 0.0)


def _write_calls(
    version: int, records: Sequence[GradRecord], half_life: float | None
) -> list[list[Any]]:
    """The script's argument lists for ``records`` (one per :data:`WRITE_CHUNK` prompts)."""
    if half_life is not None and not half_life > 0:
        raise ValueError(f"half_life must be > 0 (or None: off), got {half_life}")
    half = repr(float(half_life)) if half_life else "0"
    merged = {r.prompt_id: r for r in records}  # a prompt twice in one batch: the last counts
    rows = list(merged.values())
    calls = []
    for i in range(0, len(rows), WRITE_CHUNK):
        args: list[Any] = [int(version), half]
        for r in rows[i : i + WRITE_CHUNK]:
            if not r.prompt_id:
                raise ValueError("GradRecord.prompt_id: empty")
            args += [r.prompt_id, repr(float(r.mean)), repr(float(r.spread)), int(r.zero_advantage)]
        calls.append(args)
    return calls


def write(
    client: Any,
    namespace: str,
    version: int,
    records: Sequence[GradRecord],
    half_life: float | None = None,
) -> int:
    """Store ``records`` measured at weight ``version`` (a redis-py client), merged into the
    stored statistics with ``half_life`` (``allocator.stats_half_life``; None: each replaces
    the last); returns how many."""
    calls = _write_calls(version, records, half_life)
    if not calls:
        return 0
    script = client.register_script(_WRITE_LUA)
    return sum(int(script(keys=[grad_stats_key(namespace)], args=a)) for a in calls)


async def awrite(
    aclient: Any,
    namespace: str,
    version: int,
    records: Sequence[GradRecord],
    half_life: float | None = None,
) -> int:
    """:func:`write` on a ``redis.asyncio`` client."""
    calls = _write_calls(version, records, half_life)
    if not calls:
        return 0
    script = aclient.register_script(_WRITE_LUA)
    done = 0
    for a in calls:
        done += int(await script(keys=[grad_stats_key(namespace)], args=a))
    return done


def dropped_records(prompt_ids: Sequence[str]) -> list[GradRecord]:
    """What the learner would have measured for groups whose rewards were all equal, which the
    rollout side drops before the stream (``rollout.drop_uniform_groups``): zero advantage, so
    a zero gradient (mean and spread 0). The worker writes them so the zero-advantage streak
    (the skip rule's input) counts the visits the learner never sees."""
    return [GradRecord(p, 0.0, 0.0, True) for p in prompt_ids]


def decode(values: Sequence[bytes | None], current_version: bytes | str | None) -> GradStatsRead:
    """A read's replies (``HMGET`` values, the version key's value) as arrays."""
    packed = b"".join(
        (v if len(v) == VALUE.size else v + _WEIGHT_ONE) if v else _MISSING for v in values
    )
    table = np.frombuffer(packed, dtype="<f8").reshape(-1, 5)
    return GradStatsRead(
        *(table[:, i].copy() for i in range(5)),
        int(current_version) if current_version else 0,
    )


def _pipeline(pipe: Any, namespace: str, prompt_ids: Sequence[str]) -> Any:
    pipe.hmget(grad_stats_key(namespace), list(prompt_ids))
    pipe.get(weight_version_key(namespace))
    return pipe


def read(client: Any, namespace: str, prompt_ids: Sequence[str]) -> GradStatsRead:
    """The statistics of ``prompt_ids`` (a redis-py client)."""
    if not prompt_ids:
        return decode([], None)
    return decode(*_pipeline(client.pipeline(transaction=False), namespace, prompt_ids).execute())


async def aread(aclient: Any, namespace: str, prompt_ids: Sequence[str]) -> GradStatsRead:
    """:func:`read` on a ``redis.asyncio`` client."""
    if not prompt_ids:
        return decode([], None)
    pipe = _pipeline(aclient.pipeline(transaction=False), namespace, prompt_ids)
    return decode(*(await pipe.execute()))
