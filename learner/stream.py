"""Reading the trajectory stream with exactly-once training (rank 0 only; no torch here).

Delivery is at-least-once (a Redis Stream consumer group); training is exactly-once by entry id:

- Rank 0 reads with ``XREADGROUP`` as consumer ``learner-0`` of ``learner_group(ns)`` and
  broadcasts each batch to the other ranks (see ``learner.trainer``).
- An entry is acknowledged (``XACK``) only once the checkpoint that contains the step which used
  it has been written. The checkpoint records the ids consumed since the previous checkpoint.
- On start, every pending entry of the group (whichever consumer held it) is reclaimed with
  ``XAUTOCLAIM``. Ids recorded in the checkpoint we resumed from are acknowledged and skipped (their
  step is in the restored weights); the others are trained again, in id order, before new entries —
  so a restarted learner rebuilds the very batches it lost.
- An entry that cannot be trained on (it does not decode, a token id outside the vocabulary, longer
  than ``max_seq_len``) goes to ``dead_letter_stream(ns)`` with its reason and is acknowledged at
  once: it never crashes the learner and is never retried.
"""

from __future__ import annotations

import logging
import time
from collections import deque
from collections.abc import Callable, Iterable
from dataclasses import dataclass

import redis

from dynamo_rl import keys
from dynamo_rl.codec import TrajectoryDecodeError, TrajectoryGroup, decode_entry

log = logging.getLogger(__name__)

CONSUMER = "learner-0"


@dataclass
class StreamEntry:
    """A decoded, validated trajectory group and the stream id it came from."""

    entry_id: str
    group: TrajectoryGroup


def _id(raw: bytes | str) -> str:
    return raw.decode() if isinstance(raw, bytes) else raw


class TrajectoryReader:
    """Consumer-group reader of ``trajectory_stream(ns)`` with reclaim and dead-lettering."""

    def __init__(
        self,
        client: redis.Redis,
        namespace: str,
        *,
        vocab_size: int | None = None,
        max_seq_len: int | None = None,
        on_dead_letter: Callable[[str, str], None] | None = None,
    ) -> None:
        self.client = client
        self.namespace = namespace
        self.stream = keys.trajectory_stream(namespace)
        self.group = keys.learner_group(namespace)
        self.dead = keys.dead_letter_stream(namespace)
        self.vocab_size = vocab_size
        self.max_seq_len = max_seq_len
        self.on_dead_letter = on_dead_letter
        self.backlog: deque[StreamEntry] = deque()

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
            next_start, entries = _id(reply[0]), reply[1]
            deleted = reply[2] if len(reply) > 2 else []
            if deleted:  # pending ids whose entries were trimmed away: nothing to train
                self.client.xack(self.stream, self.group, *deleted)
            reclaimed.extend((_id(eid), fields) for eid, fields in entries)
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
        if reclaimed:
            log.info(
                "reclaimed %d pending entries: %d already trained (acknowledged), %d to train",
                len(reclaimed),
                len(already),
                len(self.backlog),
            )
        return len(self.backlog)

    def read(self, count: int, block_ms: int) -> list[StreamEntry]:
        """Up to ``count`` trainable entries: the reclaimed backlog first, then new ones (waiting
        at most ``block_ms`` when there are none)."""
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
                entry = self._decode(_id(eid), fields)
                if entry is not None:
                    out.append(entry)
        return out

    def ack(self, entry_ids: Iterable[str]) -> None:
        ids = list(entry_ids)
        for i in range(0, len(ids), 1000):
            self.client.xack(self.stream, self.group, *ids[i : i + 1000])

    def pending_count(self) -> int:
        info = self.client.xpending(self.stream, self.group)
        return int(info["pending"])

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
            ids = [*group.prompt_token_ids, *(t for r in group.responses for t in r.token_ids)]
            if ids and max(ids) >= self.vocab_size:
                raise TrajectoryDecodeError(
                    f"token id {max(ids)} outside the model's vocabulary of {self.vocab_size}"
                )
        if prompt_len == 0:
            raise TrajectoryDecodeError("prompt_token_ids is empty")
        if self.max_seq_len is not None:
            longest = prompt_len + max(len(r.token_ids) for r in group.responses)
            if longest > self.max_seq_len:
                raise TrajectoryDecodeError(
                    f"prompt+response of {longest} tokens exceeds learner.max_seq_len "
                    f"{self.max_seq_len}"
                )

    def dead_letter(self, entry_id: str, fields: dict, reason: str) -> None:
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
