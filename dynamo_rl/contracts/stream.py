"""The trajectory stream, both ends: rollout workers write it, the learner reads it, the dashboard
peeks at it. Every Redis command on ``trajectory_stream(ns)`` and its companion keys is here.

Entries are ``dynamo_rl.codec`` entries (fields ``v`` and ``g``). The rest of the protocol:

**Writer** (:class:`TrajectoryWriter`, async, one per rollout worker):

- :meth:`~TrajectoryWriter.push` adds a batch's groups with one Lua script (:data:`PUSH_SCRIPT`):
  the ``XADD``\\ s, a marker ``pushed_batch_key(ns, batch_id)`` holding their ids, and the deletion
  of the worker's lease, in one transaction. The batch lands whole or not at all, and at most
  once: a push retried after a lost reply finds the marker and returns the same ids.
- Leases: :meth:`~TrajectoryWriter.hold_lease` writes ``lease_key(ns, worker_id)`` (JSON
  ``prompt_ids``, ``batch_id``, ``expires_unix``), kept in Redis :data:`LEASE_KEEP_S` past its
  expiry so a lapsed one stays claimable; :meth:`~TrajectoryWriter.claim_lapsed` takes every
  lapsed lease — and the worker's own id's at once, which can only be a dead earlier run — with
  :data:`CLAIM_SCRIPT`, so each lease is taken by one claimant only.
- A prompt an engine refuses (HTTP 4xx: bad input, not a reason to stop) goes to the learner's
  dead-letter stream, ``dead_letter_stream(ns)``, with the same fields: ``id`` is
  ``prompt:<prompt id>``, ``reason`` the engine's answer, ``payload`` JSON (``prompt_id``,
  ``data_source``, ``prompt_tokens``, ``worker_id``) — :meth:`~TrajectoryWriter.dead_letter`.
- Backpressure: :meth:`~TrajectoryWriter.lag` is the number of entries the learner's group has not
  read yet (all of them before the group exists, or when Redis cannot tell after deletions).
  Entries read but not acknowledged are not counted: the learner acknowledges only when a
  checkpoint commits, so counting them would stall the worker between checkpoints.
  :meth:`~TrajectoryWriter.pending` (read, not acknowledged) is there for monitoring.

**Reader** (:class:`TrajectoryReader`, sync, learner rank 0 only; exactly-once training by entry
id over at-least-once delivery):

- :meth:`~TrajectoryReader.setup` creates the group ``learner_group(ns)`` and reclaims every
  pending entry (``XAUTOCLAIM``, whichever consumer held it). Ids the resumed checkpoint already
  trained on are acknowledged and skipped; the others are trained again, in id order, before new
  entries — so a restarted learner rebuilds the very batches it lost.
- :meth:`~TrajectoryReader.read` reads as consumer :data:`CONSUMER`; :meth:`~TrajectoryReader.ack`
  is called only once the checkpoint containing the step that used an entry has been written.
  A read's reply lost with a dropped connection leaves entries pending that the reader never
  saw: before each read it compares the group's pending count with the entries it holds, and
  claims any others back (``XCLAIM``) to train them first.
- An entry that cannot be trained on (it does not decode, a token id outside the vocabulary,
  longer than ``max_seq_len``) goes to ``dead_letter_stream(ns)`` (fields ``id``, ``reason``,
  ``payload``, ``time_unix``) and is acknowledged at once: never retried, never a crash.

**Peeking** (:func:`newest`): the newest entries, decoded, for the dashboard; undecodable ones come
back with their reason instead of a group.

Redis clients must not decode responses (the payload is protobuf); make them with
:mod:`dynamo_rl.redis_client`. The writer's Redis calls go through ``guard`` (the worker's retry
policy): each call is one command or one script, safe to repeat.
"""

from __future__ import annotations

import json
import logging
import time
from collections import deque
from collections.abc import Awaitable, Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import redis

from dynamo_rl import keys
from dynamo_rl.codec import (
    TrajectoryDecodeError,
    TrajectoryGroup,
    decode_entry,
    encode_entry,
    response_prompt,
)

__all__ = [
    "CLAIM_SCRIPT",
    "CONSUMER",
    "LEASE_KEEP_S",
    "PUSH_MARKER_TTL_S",
    "PUSH_SCRIPT",
    "ClaimedLease",
    "PeekedEntry",
    "StreamEntry",
    "TrajectoryReader",
    "TrajectoryWriter",
    "lag_from_groups",
    "newest",
]

log = logging.getLogger(__name__)

CONSUMER = "learner-0"
"""The learner's consumer name in ``learner_group(ns)`` (one reader: rank 0)."""

PUSH_MARKER_TTL_S = 86400
"""How long a batch's push marker lasts (a retry after a lost reply comes within seconds)."""

LEASE_KEEP_S = 86400
"""How long a lapsed lease stays in Redis, claimable."""

# KEYS: stream, marker, lease. ARGV: marker TTL, fields per entry x 2, then every entry's fields.
PUSH_SCRIPT = """
redis.call('DEL', KEYS[3])
local done = redis.call('GET', KEYS[2])
if done then return cjson.decode(done) end
local width = tonumber(ARGV[2])
local ids = {}
for i = 3, #ARGV, width do
  local fields = {}
  for j = 0, width - 1 do fields[#fields + 1] = ARGV[i + j] end
  ids[#ids + 1] = redis.call('XADD', KEYS[1], '*', unpack(fields))
end
redis.call('SET', KEYS[2], cjson.encode(ids), 'EX', tonumber(ARGV[1]))
return ids
"""

# KEYS: the lease. ARGV: now (unix seconds), "1" to take it whatever its expiry (our own id).
# Returns the lease's JSON if it was taken (and deletes it), else nil: each lease is taken once.
CLAIM_SCRIPT = """
local raw = redis.call('GET', KEYS[1])
if not raw then return nil end
local ok, lease = pcall(cjson.decode, raw)
if ok and ARGV[2] ~= '1' and tonumber(lease['expires_unix'] or 0) > tonumber(ARGV[1]) then
  return nil
end
redis.call('DEL', KEYS[1])
return raw
"""

Guard = Callable[[Callable[[], Awaitable[Any]]], Awaitable[Any]]


async def _direct(call: Callable[[], Awaitable[Any]]) -> Any:
    return await call()


def _str(raw: bytes | str) -> str:
    return raw.decode() if isinstance(raw, bytes) else str(raw)


def lag_from_groups(groups: Sequence[Mapping[Any, Any]], group: str) -> int | None:
    """The ``lag`` of ``group`` in an ``XINFO GROUPS`` reply; ``None`` when the group does not
    exist or Redis cannot tell (after deletions), meaning "count the whole stream"."""
    for g in groups:
        if _str(g.get("name", b"")) != group:
            continue
        lag = g.get("lag")
        return int(lag) if lag is not None else None
    return None


# -- writer ---------------------------------------------------------------------------------------


@dataclass(frozen=True)
class ClaimedLease:
    """A lease taken over by :meth:`TrajectoryWriter.claim_lapsed`."""

    key: str
    prompt_ids: list[str]
    batch_id: str


class TrajectoryWriter:
    """A rollout worker's end of the stream: push, leases, lag (``redis.asyncio`` client)."""

    def __init__(
        self, client: Any, namespace: str, worker_id: str, *, guard: Guard | None = None
    ) -> None:
        self.client = client
        self.namespace = namespace
        self.worker_id = worker_id
        self.stream = keys.trajectory_stream(namespace)
        self.group = keys.learner_group(namespace)
        self.lease = keys.lease_key(namespace, worker_id)
        self._guard = guard or _direct

    async def push(self, groups: Sequence[TrajectoryGroup], batch_id: str) -> list[str]:
        """Add a batch's groups atomically and at most once, releasing the lease; their ids."""
        if not groups:
            await self.release_lease()
            return []
        entries = [encode_entry(g) for g in groups]
        width = 2 * len(entries[0])
        args: list[Any] = [PUSH_MARKER_TTL_S, width]
        for fields in entries:
            for key, value in fields.items():
                args += [key, value]
        script_keys = [self.stream, keys.pushed_batch_key(self.namespace, batch_id), self.lease]
        ids = await self._guard(
            lambda: self.client.eval(PUSH_SCRIPT, len(script_keys), *script_keys, *args)
        )
        return [_str(i) for i in ids]

    async def dead_letter(
        self, prompt_id: str, reason: str, *, data_source: str = "", prompt_tokens: int = 0
    ) -> str:
        """Record a prompt that cannot be sampled in ``dead_letter_stream(ns)``; its entry id."""
        payload = json.dumps(
            {
                "prompt_id": prompt_id,
                "data_source": data_source,
                "prompt_tokens": prompt_tokens,
                "worker_id": self.worker_id,
            }
        )
        fields = {
            "id": f"prompt:{prompt_id}",
            "reason": reason,
            "payload": payload,
            "time_unix": str(time.time()),
        }
        dead = keys.dead_letter_stream(self.namespace)
        return _str(await self._guard(lambda: self.client.xadd(dead, fields)))

    async def hold_lease(self, prompt_ids: Sequence[str], batch_id: str, ttl_s: float) -> None:
        """Write (or renew) this worker's lease on ``prompt_ids`` for ``ttl_s`` from now."""
        value = json.dumps(
            {
                "prompt_ids": list(prompt_ids),
                "batch_id": batch_id,
                "expires_unix": time.time() + ttl_s,
            }
        )
        await self._guard(lambda: self.client.set(self.lease, value, ex=int(ttl_s + LEASE_KEEP_S)))

    async def release_lease(self) -> None:
        await self._guard(lambda: self.client.delete(self.lease))

    async def claim_lapsed(self) -> list[ClaimedLease]:
        """Take every lapsed lease of the namespace, and this worker id's own at once."""
        pattern = keys.lease_key(self.namespace, "*")

        async def scan() -> list[str]:
            return [_str(k) async for k in self.client.scan_iter(match=pattern, count=100)]

        out: list[ClaimedLease] = []
        for key in await self._guard(scan):
            own = "1" if key == self.lease else "0"
            # One script per lease, each retried alone: a lease taken is never taken twice.
            raw = await self._guard(
                lambda key=key, own=own: self.client.eval(CLAIM_SCRIPT, 1, key, time.time(), own)
            )
            if raw is None:
                continue
            try:
                lease = json.loads(raw)
                ids = [str(p) for p in lease["prompt_ids"]]
            except (ValueError, KeyError, TypeError):
                log.warning("dropped an unreadable lease %s", key)
                continue
            out.append(ClaimedLease(key, ids, str(lease.get("batch_id", ""))))
        return out

    async def lag(self) -> int:
        """Entries the learner's group has not read yet (see the module docstring)."""

        async def read() -> int:
            try:
                groups = await self.client.xinfo_groups(self.stream)
            except redis.ResponseError:  # no stream yet
                return 0
            lag = lag_from_groups(groups, self.group)
            return lag if lag is not None else int(await self.client.xlen(self.stream))

        return int(await self._guard(read))

    async def pending(self) -> int:
        """Entries the learner has read and not acknowledged yet (0 before its group exists)."""

        async def read() -> int:
            try:
                info = await self.client.xpending(self.stream, self.group)
            except redis.ResponseError:  # no stream or no group yet
                return 0
            return int(info["pending"])

        return int(await self._guard(read))


# -- reader ---------------------------------------------------------------------------------------


@dataclass
class StreamEntry:
    """A decoded, validated trajectory group and the stream id it came from."""

    entry_id: str
    group: TrajectoryGroup


class TrajectoryReader:
    """The learner's end: consumer-group reads with reclaim and dead-lettering (sync client)."""

    def __init__(
        self,
        client: Any,
        namespace: str,
        *,
        vocab_size: int | None = None,
        max_seq_len: int | None = None,
        on_dead_letter: Callable[[str, str], None] | None = None,
    ) -> None:
        self.client = client
        self.stream = keys.trajectory_stream(namespace)
        self.group = keys.learner_group(namespace)
        self.dead = keys.dead_letter_stream(namespace)
        self.vocab_size = vocab_size
        self.max_seq_len = max_seq_len
        self.on_dead_letter = on_dead_letter
        self.backlog: deque[StreamEntry] = deque()
        # Pending entries this reader knows of: in the backlog or handed out by read(), not
        # acknowledged yet. Any other pending entry was delivered to a read whose reply never
        # arrived (see read()).
        self.held: set[str] = set()

    def setup(self, committed: Iterable[str] = ()) -> int:
        """Create the group if needed and reclaim pending entries; returns how many will be
        retrained. ``committed``: ids the restored checkpoint already trained on."""
        try:
            self.client.xgroup_create(self.stream, self.group, id="0", mkstream=True)
        except redis.ResponseError as e:
            if "BUSYGROUP" not in str(e):
                raise
        committed = set(committed)
        reclaimed: list[tuple[str, dict]] = []
        start = "0-0"
        while True:
            reply = self.client.xautoclaim(
                self.stream, self.group, CONSUMER, min_idle_time=0, start_id=start, count=512
            )
            # Pending ids whose entries were trimmed away: Redis 7 lists them third in the reply
            # and drops them from the pending list itself, so there is nothing to acknowledge.
            next_start, entries = _str(reply[0]), reply[1]
            reclaimed.extend((_str(eid), fields) for eid, fields in entries)
            if next_start == "0-0":
                break
            start = next_start
        already = [eid for eid, _ in reclaimed if eid in committed]
        if already:
            self.ack(already)
        for eid, fields in reclaimed:
            if eid not in committed:
                entry = self._decode(eid, fields)
                if entry is not None:
                    self.backlog.append(entry)
        self.held = {e.entry_id for e in self.backlog}
        if reclaimed:
            log.info(
                "reclaimed %d pending entries: %d already trained (acknowledged), %d to train",
                len(reclaimed),
                len(already),
                len(self.backlog),
            )
        return len(self.backlog)

    def read(self, count: int, block_ms: int) -> list[StreamEntry]:
        """Up to ``count`` trainable entries: the backlog first (reclaimed, or taken back from a
        lost read), then new ones (waiting at most ``block_ms`` when there are none)."""
        self._take_back_lost()
        out: list[StreamEntry] = []
        while self.backlog and len(out) < count:
            out.append(self.backlog.popleft())
        if len(out) == count:
            return out
        reply = self.client.xreadgroup(
            self.group, CONSUMER, {self.stream: ">"}, count=count - len(out), block=block_ms
        )
        for _stream, entries in reply or []:
            for eid, fields in entries:
                entry = self._decode(_str(eid), fields)
                if entry is not None:
                    out.append(entry)
                    self.held.add(entry.entry_id)
        return out

    def _take_back_lost(self) -> None:
        """Entries delivered to a read whose reply was lost, into the backlog.

        A connection that drops while ``XREADGROUP`` waits (Redis restarting) can lose the reply
        to a read Redis had already served: its entries are pending for :data:`CONSUMER`, and
        the client repeats the read, which delivers newer ones. Nothing would train the lost ones until the
        learner restarted, so whenever the group holds more pending entries than this reader
        knows of, it claims the others back (in id order)."""
        pending = int(self.client.xpending(self.stream, self.group)["pending"])
        if pending <= len(self.held):
            return
        rows = self.client.xpending_range(self.stream, self.group, "-", "+", pending)
        lost = [i for i in (_str(r["message_id"]) for r in rows) if i not in self.held]
        if not lost:
            return
        # Redis 7 leaves out, and drops from the pending list, ids trimmed away meanwhile.
        claimed = self.client.xclaim(self.stream, self.group, CONSUMER, 0, lost)
        for eid, fields in claimed:
            entry = self._decode(_str(eid), fields)
            if entry is not None:
                self.backlog.append(entry)
                self.held.add(entry.entry_id)
        log.warning("took back %d entries delivered to a read whose reply was lost", len(claimed))

    def ack(self, entry_ids: Iterable[str]) -> None:
        """Acknowledge entries whose step is in a written checkpoint."""
        ids = list(entry_ids)
        for i in range(0, len(ids), 1000):
            self.client.xack(self.stream, self.group, *ids[i : i + 1000])
        self.held.difference_update(ids)

    def pending_count(self) -> int:
        """Entries read and not acknowledged yet."""
        info = self.client.xpending(self.stream, self.group)
        return int(info["pending"])

    def lag(self) -> int:
        """Entries not read yet (what the writers' backpressure counts)."""
        lag = lag_from_groups(self.client.xinfo_groups(self.stream), self.group)
        return lag if lag is not None else int(self.client.xlen(self.stream))

    def _decode(self, entry_id: str, fields: dict) -> StreamEntry | None:
        try:
            group = decode_entry(fields)
            self._check(group)
        except TrajectoryDecodeError as e:
            self.dead_letter(entry_id, fields, str(e))
            return None
        return StreamEntry(entry_id, group)

    def _check(self, group: TrajectoryGroup) -> None:
        """What the codec cannot know: the model's vocabulary and context length."""
        prompt_len = len(group.prompt_token_ids)
        if self.vocab_size is not None:
            ids = [
                *group.prompt_token_ids,
                *(t for r in group.responses for t in (*r.prompt_token_ids, *r.token_ids)),
            ]
            if ids and max(ids) >= self.vocab_size:
                raise TrajectoryDecodeError(
                    f"token id {max(ids)} outside the model's vocabulary of {self.vocab_size}"
                )
        if prompt_len == 0:
            raise TrajectoryDecodeError("prompt_token_ids is empty")
        if self.max_seq_len is not None:
            longest = max(
                len(response_prompt(group, r)) + len(r.token_ids) for r in group.responses
            )
            if longest > self.max_seq_len:
                raise TrajectoryDecodeError(
                    f"prompt+response of {longest} tokens exceeds learner.max_seq_len "
                    f"{self.max_seq_len}"
                )

    def dead_letter(self, entry_id: str, fields: dict, reason: str) -> None:
        """Move an entry to the dead-letter stream with its reason, and acknowledge it."""
        payload = fields.get(b"g", fields.get("g", b""))
        if isinstance(payload, str):
            payload = payload.encode()
        self.client.xadd(
            self.dead,
            {"id": entry_id, "reason": reason, "payload": payload, "time_unix": str(time.time())},
        )
        self.client.xack(self.stream, self.group, entry_id)
        log.warning("entry %s sent to the dead-letter stream: %s", entry_id, reason)
        if self.on_dead_letter is not None:
            self.on_dead_letter(entry_id, reason)


# -- peeking --------------------------------------------------------------------------------------


@dataclass(frozen=True)
class PeekedEntry:
    """One entry as :func:`newest` found it: its group, or why it does not decode."""

    entry_id: str
    group: TrajectoryGroup | None
    error: str | None = None


def newest(client: Any, namespace: str, count: int) -> list[PeekedEntry]:
    """The ``count`` newest entries of the stream, newest first, decoded (sync client); reads
    nothing as a consumer, so the learner's group is untouched."""
    out: list[PeekedEntry] = []
    for eid, fields in client.xrevrange(keys.trajectory_stream(namespace), count=count):
        try:
            out.append(PeekedEntry(_str(eid), decode_entry(fields)))
        except TrajectoryDecodeError as e:
            out.append(PeekedEntry(_str(eid), None, str(e)))
    return out
