"""Both ends of the trajectory stream against each other, on a real Redis.

What :class:`TrajectoryWriter` pushes, :class:`TrajectoryReader` reads, acknowledges, reclaims
and dead-letters; the writer sees the reader's progress as lag and pending; the dashboard's
:func:`newest` decodes the same entries. Lease rules are here too (the worker-level cases are in
tests/reliability/test_faults_leases.py).
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Awaitable, Callable
from typing import Any

from dashboard.sources import SampleFilter, SampleReader
from dynamo_rl import keys
from dynamo_rl.codec import CODEC_VERSION, Response, TrajectoryGroup, encode_entry
from dynamo_rl.contracts.stream import (
    CONSUMER,
    LEASE_KEEP_S,
    TrajectoryReader,
    TrajectoryWriter,
    lag_from_groups,
    newest,
)
from dynamo_rl.redis_client import async_client, sync_client

NS = "contract"


def group(pid: str, tokens: int = 2, reward: float = 1.0) -> TrajectoryGroup:
    return TrajectoryGroup(
        prompt_id=pid,
        prompt_token_ids=[5, 6],
        responses=[
            Response(token_ids=[7] * tokens, logprobs=[-0.5] * tokens, reward=reward, text="r")
        ],
        namespace=NS,
        allocated_n=1,
    )


def run(url: str, scenario: Callable[[Any], Awaitable[Any]]) -> Any:
    """``scenario(async_client)`` on a fresh event loop, closing the client after."""

    async def main() -> Any:
        client = async_client(url)
        try:
            return await scenario(client)
        finally:
            await client.aclose()

    return asyncio.run(main())


def writer(client: Any, worker_id: str = "w0", **kw: Any) -> TrajectoryWriter:
    return TrajectoryWriter(client, NS, worker_id, **kw)


def lag_and_pending(url: str) -> tuple[int, int]:
    async def both(c: Any) -> tuple[int, int]:
        w = writer(c)
        return await w.lag(), await w.pending()

    return run(url, both)


def test_pushed_groups_are_read_acked_and_seen_as_lag_and_pending(redis_url: str) -> None:
    assert lag_and_pending(redis_url) == (0, 0)  # no stream yet

    async def push(c: Any) -> list[str]:
        w = writer(c)
        await w.hold_lease(["p0", "p1", "p2"], "w0:s:0", ttl_s=30)
        return await w.push([group("p0"), group("p1"), group("p2")], "w0:s:0")

    ids = run(redis_url, push)
    client = sync_client(redis_url)
    assert client.get(keys.lease_key(NS, "w0")) is None  # released by the push itself
    assert lag_and_pending(redis_url) == (3, 0)  # before the learner's group exists: all of it

    reader = TrajectoryReader(client, NS)
    assert reader.setup() == 0
    assert lag_and_pending(redis_url) == (3, 0)
    got = reader.read(2, block_ms=100)
    assert [e.entry_id for e in got] == ids[:2]
    assert [e.group.prompt_id for e in got] == ["p0", "p1"]
    assert lag_and_pending(redis_url) == (1, 2)  # read, unacknowledged: not lag
    assert reader.lag() == 1 and reader.pending_count() == 2
    reader.ack(e.entry_id for e in got)
    assert lag_and_pending(redis_url) == (1, 0)
    assert [e.entry_id for e in reader.read(5, block_ms=100)] == ids[2:]
    assert lag_and_pending(redis_url) == (0, 1)
    client.close()


def test_a_retried_push_adds_nothing_twice(redis_url: str) -> None:
    async def push_twice(c: Any) -> tuple[list[str], list[str], list[str]]:
        w = writer(c)
        first = await w.push([group("a"), group("b")], "w0:s:0")
        again = await w.push([group("a"), group("b")], "w0:s:0")  # the reply was lost
        other = await w.push([group("c")], "w0:s:1")
        return first, again, other

    first, again, other = run(redis_url, push_twice)
    assert first == again and len(first) == 2 and len(other) == 1
    client = sync_client(redis_url)
    assert client.xlen(keys.trajectory_stream(NS)) == 3
    client.close()


def test_an_empty_batch_only_releases_the_lease(redis_url: str) -> None:
    async def scenario(c: Any) -> list[str]:
        w = writer(c)
        await w.hold_lease(["p0"], "w0:s:0", ttl_s=30)
        return await w.push([], "w0:s:0")

    assert run(redis_url, scenario) == []
    client = sync_client(redis_url)
    assert client.get(keys.lease_key(NS, "w0")) is None
    assert client.exists(keys.trajectory_stream(NS)) == 0
    client.close()


def test_a_restarted_reader_retrains_what_no_checkpoint_holds(redis_url: str) -> None:
    ids = run(redis_url, lambda c: writer(c).push([group(f"p{i}") for i in range(5)], "w0:s:0"))
    client = sync_client(redis_url)
    first = TrajectoryReader(client, NS)
    first.setup()
    assert [e.entry_id for e in first.read(4, block_ms=100)] == ids[:4]
    # Crash; the checkpoint resumed from holds the step that used ids[0].
    second = TrajectoryReader(client, NS)
    assert second.setup(committed=ids[:1]) == 3
    assert lag_and_pending(redis_url) == (1, 3)
    again = second.read(5, block_ms=100)
    assert [e.entry_id for e in again] == ids[1:]
    pending = client.xpending_range(
        keys.trajectory_stream(NS), keys.learner_group(NS), "-", "+", 10
    )
    assert {p["consumer"].decode() for p in pending} == {CONSUMER}
    client.close()


def test_untrainable_entries_are_dead_lettered_and_the_dashboard_names_them(
    redis_url: str,
) -> None:
    ids = run(
        redis_url,
        lambda c: writer(c).push([group("ok"), group("long", tokens=40)], "w0:s:0"),
    )
    client = sync_client(redis_url)
    bad_id = client.xadd(keys.trajectory_stream(NS), {b"v": CODEC_VERSION, b"g": b"\xff"}).decode()
    dead: list[tuple[str, str]] = []
    reader = TrajectoryReader(
        client, NS, max_seq_len=16, on_dead_letter=lambda i, r: dead.append((i, r))
    )
    reader.setup()
    assert [e.entry_id for e in reader.read(5, block_ms=100)] == ids[:1]
    assert [i for i, _ in dead] == [ids[1], bad_id]
    letters = client.xrange(keys.dead_letter_stream(NS))
    assert [f[b"id"].decode() for _id, f in letters] == [ids[1], bad_id]
    assert "exceeds learner.max_seq_len 16" in letters[0][1][b"reason"].decode()
    assert lag_and_pending(redis_url) == (0, 1)  # dead letters acknowledged at once

    peeked = newest(client, NS, 10)
    assert [p.entry_id for p in peeked] == [bad_id, ids[1], ids[0]]  # newest first
    assert [p.entry_id for p in newest(client, NS, 2)] == [bad_id, ids[1]]  # only `count`
    assert peeked[0].group is None and "protobuf" in (peeked[0].error or "")
    assert peeked[2].group is not None and peeked[2].group.prompt_id == "ok"
    assert lag_and_pending(redis_url) == (0, 1)  # peeking reads nothing as a consumer

    samples = SampleReader(redis_url, NS)
    try:
        page = samples.read(SampleFilter())
    finally:
        samples.close()
    assert [r["prompt_id"] for r in page["rows"]] == ["long", "ok"]
    assert [e["id"] for e in page["decode_errors"]] == [bad_id]
    assert page["stream_length"] == 3
    client.close()


def test_lag_counts_the_whole_stream_when_redis_cannot_tell(redis_url: str) -> None:
    ids = run(redis_url, lambda c: writer(c).push([group(f"p{i}") for i in range(4)], "w0:s:0"))
    client = sync_client(redis_url)
    reader = TrajectoryReader(client, NS)
    reader.setup()
    reader.read(1, block_ms=100)
    assert lag_and_pending(redis_url) == (3, 1)
    client.xdel(keys.trajectory_stream(NS), ids[2])  # an unread entry deleted: Redis loses count
    assert lag_from_groups(client.xinfo_groups(keys.trajectory_stream(NS)), reader.group) is None
    assert lag_and_pending(redis_url) == (3, 1)  # the whole stream, read entries included
    assert reader.lag() == 3
    assert lag_from_groups([{b"name": b"other", b"lag": 0}], reader.group) is None  # no group
    client.close()


def test_a_lease_is_claimed_once_it_lapsed_by_one_claimant_only(redis_url: str) -> None:
    async def scenario(c: Any) -> None:
        a, b, d = writer(c, "wa"), writer(c, "wb"), writer(c, "wd")
        await a.hold_lease(["p1", "p2"], "wa:s:0", ttl_s=0.5)
        assert await b.claim_lapsed() == []  # still held
        await a.hold_lease(["p1", "p2"], "wa:s:0", ttl_s=0.5)  # renewed
        deadline = time.monotonic() + 5
        taken_b: list[Any] = []
        taken_d: list[Any] = []
        while not (taken_b or taken_d) and time.monotonic() < deadline:
            taken_b, taken_d = await asyncio.gather(b.claim_lapsed(), d.claim_lapsed())
            await asyncio.sleep(0.05)
        assert len(taken_b) + len(taken_d) == 1  # one claimant only
        (lease,) = taken_b or taken_d
        assert lease.prompt_ids == ["p1", "p2"] and lease.batch_id == "wa:s:0"
        assert lease.key == keys.lease_key(NS, "wa")
        assert await b.claim_lapsed() == []  # taken once

    run(redis_url, scenario)


def test_a_writer_takes_its_own_ids_lease_at_once(redis_url: str) -> None:
    async def scenario(c: Any) -> None:
        await writer(c, "w7").hold_lease(["p3"], "w7:old:2", ttl_s=60)
        assert await writer(c, "w8").claim_lapsed() == []  # another id waits for the expiry
        (lease,) = await writer(c, "w7").claim_lapsed()  # the same id restarted
        assert lease.prompt_ids == ["p3"]

    run(redis_url, scenario)


def test_every_writer_command_goes_through_its_guard(redis_url: str) -> None:
    """The guard is how the worker's retry policy covers the protocol: nothing bypasses it."""
    calls: list[str] = []

    async def guard(call: Callable[[], Awaitable[Any]]) -> Any:
        calls.append("call")
        return await call()

    async def scenario(c: Any) -> None:
        w = writer(c, "wg", guard=guard)
        await w.hold_lease(["p"], "wg:s:0", ttl_s=30)
        assert len(calls) == 1
        await w.push([group("p")], "wg:s:0")
        assert len(calls) == 2
        await w.lag()
        await w.pending()
        assert len(calls) == 4
        await w.hold_lease(["q"], "wg:s:1", ttl_s=30)
        await w.claim_lapsed()  # a scan, then one script for our own lease
        assert len(calls) == 7
        await w.release_lease()
        assert len(calls) == 8

    run(redis_url, scenario)


def test_a_lease_without_time_left_is_claimable(redis_url: str) -> None:
    async def scenario(c: Any) -> None:
        await writer(c, "wz").hold_lease(["p9"], "wz:s:0", ttl_s=0.0)
        (lease,) = await writer(c, "wy").claim_lapsed()
        assert lease.prompt_ids == ["p9"]

    run(redis_url, scenario)


def test_a_writer_dead_letters_a_prompt_with_its_reason_and_details(redis_url: str) -> None:
    """A prompt the engine refuses: one entry in the dead-letter stream, through the guard."""
    import json

    calls: list[str] = []

    async def guard(call: Callable[[], Awaitable[Any]]) -> Any:
        calls.append("call")
        return await call()

    async def scenario(c: Any) -> tuple[str, str]:
        w = writer(c, "wd", guard=guard)
        first = await w.dead_letter("p7", "too long", data_source="gsm8k", prompt_tokens=4097)
        second = await w.dead_letter("p8", "refused")  # no data source, no token count
        return first, second

    before = time.time()
    first, second = run(redis_url, scenario)
    after = time.time()
    assert len(calls) == 2
    entries = sync_client(redis_url).xrange(keys.dead_letter_stream(NS), first, second)
    assert [eid.decode() for eid, _ in entries] == [first, second]
    (_, f1), (_, f2) = entries
    assert set(f1) == {b"id", b"reason", b"payload", b"time_unix"}
    assert (f1[b"id"], f1[b"reason"]) == (b"prompt:p7", b"too long")
    assert json.loads(f1[b"payload"]) == {
        "prompt_id": "p7", "data_source": "gsm8k", "prompt_tokens": 4097, "worker_id": "wd",
    }  # fmt: skip
    assert before <= float(f1[b"time_unix"]) <= after
    assert (f2[b"id"], f2[b"reason"]) == (b"prompt:p8", b"refused")
    assert json.loads(f2[b"payload"]) == {
        "prompt_id": "p8", "data_source": "", "prompt_tokens": 0, "worker_id": "wd",
    }  # fmt: skip


def test_claim_takes_every_lapsed_lease_past_fresh_and_unreadable_ones(
    redis_url: str, caplog: Any
) -> None:
    """Ten leases of live workers, ten lapsed ones, one unreadable and one without a batch id, in
    Redis's own scan order: every lapsed one is taken (a fresh or an unreadable lease met first
    does not end the scan), the fresh ones are left, the unreadable one is dropped and named."""
    import json
    import logging

    sync = sync_client(redis_url)
    now = time.time()
    for i in range(10):
        lease = {"prompt_ids": [f"f{i}"], "batch_id": f"f{i}:s:0", "expires_unix": now + 600}
        sync.set(keys.lease_key(NS, f"live{i}"), json.dumps(lease))
        lease = {"prompt_ids": [f"d{i}"], "batch_id": f"d{i}:s:0", "expires_unix": now - 1}
        sync.set(keys.lease_key(NS, f"dead{i}"), json.dumps(lease))
    sync.set(keys.lease_key(NS, "garbled"), "not json")
    sync.set(keys.lease_key(NS, "old"), json.dumps({"prompt_ids": ["o"], "expires_unix": 0}))

    with caplog.at_level(logging.WARNING, logger="dynamo_rl.contracts.stream"):
        claimed = run(redis_url, lambda c: writer(c, "me").claim_lapsed())
    by_key = {c.key: c for c in claimed}
    expected = {keys.lease_key(NS, f"dead{i}") for i in range(10)} | {keys.lease_key(NS, "old")}
    assert set(by_key) == expected and len(claimed) == len(expected)
    assert by_key[keys.lease_key(NS, "dead3")].prompt_ids == ["d3"]
    assert by_key[keys.lease_key(NS, "dead3")].batch_id == "d3:s:0"
    assert by_key[keys.lease_key(NS, "old")].batch_id == ""  # a lease without one
    for i in range(10):  # live workers keep theirs
        assert sync.get(keys.lease_key(NS, f"live{i}")) is not None
    assert sync.get(keys.lease_key(NS, "garbled")) is None
    garbled = keys.lease_key(NS, "garbled")
    assert [r.getMessage() for r in caplog.records] == [f"dropped an unreadable lease {garbled}"]


def test_setup_on_a_namespace_without_a_stream_creates_it_and_the_group(redis_url: str) -> None:
    """A learner may start before any worker pushed: setup makes the stream and its group."""
    client = sync_client(redis_url)
    reader = TrajectoryReader(client, NS)
    assert reader.setup() == 0
    assert client.exists(keys.trajectory_stream(NS)) == 1
    names = [g["name"].decode() for g in client.xinfo_groups(keys.trajectory_stream(NS))]
    assert names == [keys.learner_group(NS)]
    assert TrajectoryReader(client, NS).setup() == 0  # the group exists already: no error
    ids = run(redis_url, lambda c: writer(c).push([group("p0")], "w0:s:0"))
    assert [e.entry_id for e in reader.read(2, block_ms=100)] == ids  # from the first entry on
    client.close()


def test_setup_reclaims_and_acknowledges_more_entries_than_one_page_or_one_batch(
    redis_url: str,
) -> None:
    """1200 pending entries: XAUTOCLAIM pages of 512 resumed where the last one stopped, and an
    acknowledgement of 1100 ids in XACK batches of 1000 that leaves none out."""
    client = sync_client(redis_url)
    stream = keys.trajectory_stream(NS)
    pipe = client.pipeline(transaction=False)
    for i in range(1200):
        pipe.xadd(stream, encode_entry(group(f"p{i}")))
    ids = [i.decode() for i in pipe.execute()]
    first = TrajectoryReader(client, NS)
    first.setup()
    assert len(first.read(1200, block_ms=100)) == 1200
    # Crash; the checkpoint holds the steps that used the first 1100.
    second = TrajectoryReader(client, NS)
    assert second.setup(committed=ids[:1100]) == 100
    assert second.pending_count() == 100
    again = second.read(200, block_ms=50)
    assert [e.entry_id for e in again] == ids[1100:]  # each once, in order
    second.ack(ids)  # all 1200 again: 1000 + 200, the acknowledged ones are no-ops
    assert second.pending_count() == 0
    client.close()


def test_setup_drops_pending_entries_deleted_from_the_stream(redis_url: str) -> None:
    """Entries read, then deleted (trimmed) before a restart: XAUTOCLAIM reports their ids,
    nothing is retrained from them and they leave the pending list."""
    ids = run(redis_url, lambda c: writer(c).push([group(f"p{i}") for i in range(5)], "w0:s:0"))
    client = sync_client(redis_url)
    first = TrajectoryReader(client, NS)
    first.setup()
    assert len(first.read(5, block_ms=100)) == 5
    client.xdel(keys.trajectory_stream(NS), ids[1], ids[3])
    second = TrajectoryReader(client, NS)
    assert second.setup() == 3
    assert [e.entry_id for e in second.read(5, block_ms=50)] == [ids[0], ids[2], ids[4]]
    assert second.pending_count() == 3
    client.close()


def test_a_reader_dead_letter_carries_id_reason_payload_and_time(
    redis_url: str, caplog: Any
) -> None:
    """Every field of the learner's dead letters, from a bytes-keyed and a str-keyed client."""
    import redis

    client = sync_client(redis_url)
    stream = keys.trajectory_stream(NS)
    no_g = client.xadd(stream, {b"v": CODEC_VERSION}).decode()
    text_g = client.xadd(stream, {b"v": CODEC_VERSION, b"g": b"plain text"}).decode()
    before = time.time()
    with caplog.at_level("WARNING", logger="dynamo_rl.contracts.stream"):
        reader = TrajectoryReader(client, NS)
        reader.setup()
        assert reader.read(5, block_ms=100) == []
        # A client that decodes replies hands the reader str keys and a str payload.
        decoding = redis.Redis.from_url(redis_url, decode_responses=True)
        text_g2 = decoding.xadd(stream, {"v": CODEC_VERSION.decode(), "g": "more text"})
        assert TrajectoryReader(decoding, NS).read(5, block_ms=100) == []
        decoding.close()
    after = time.time()
    letters = client.xrange(keys.dead_letter_stream(NS))
    assert [f[b"id"].decode() for _id, f in letters] == [no_g, text_g, text_g2]
    for _id, fields in letters:
        assert set(fields) == {b"id", b"reason", b"payload", b"time_unix"}
        assert before <= float(fields[b"time_unix"]) <= after
    assert [f[b"payload"] for _id, f in letters] == [b"", b"plain text", b"more text"]
    reasons = [f[b"reason"].decode() for _id, f in letters]
    assert "no 'g' field" in reasons[0] and "must be bytes" in reasons[2]
    logged = [r.getMessage() for r in caplog.records]
    assert logged == [
        f"entry {eid} sent to the dead-letter stream: {why}"
        for eid, why in zip([no_g, text_g, text_g2], reasons, strict=True)
    ]
    assert reader.pending_count() == 0
    client.close()


def test_lag_is_the_learner_groups_even_when_another_group_is_listed_first(
    redis_url: str,
) -> None:
    run(redis_url, lambda c: writer(c).push([group(f"p{i}") for i in range(4)], "w0:s:0"))
    client = sync_client(redis_url)
    stream = keys.trajectory_stream(NS)
    reader = TrajectoryReader(client, NS)
    reader.setup()
    reader.read(1, block_ms=100)
    client.xgroup_create(stream, "audit", id="0")  # an operator's group, nothing read
    groups = client.xinfo_groups(stream)
    assert [g["name"].decode() for g in groups] == ["audit", reader.group]  # listed first
    assert lag_from_groups(groups, reader.group) == 3
    assert reader.lag() == 3 and lag_and_pending(redis_url) == (3, 1)
    client.close()


def test_a_lease_is_kept_in_redis_a_day_past_its_expiry_then_dropped(redis_url: str) -> None:
    """The lease key's own TTL: long enough to stay claimable, finite so a dead worker's lease
    does not stay forever."""

    async def scenario(c: Any) -> int:
        await writer(c, "wt").hold_lease(["p1"], "wt:s:0", ttl_s=30)
        return int(await c.ttl(keys.lease_key(NS, "wt")))

    ttl = run(redis_url, scenario)
    assert 30 + LEASE_KEEP_S - 5 <= ttl <= 30 + LEASE_KEEP_S


def test_entries_of_a_read_whose_reply_was_lost_are_taken_back_once(redis_url: str, caplog) -> None:
    """A connection dropped mid-XREADGROUP can lose a reply Redis had sent: the entries are
    pending for the learner's consumer, which never saw them, and the repeated read delivers
    newer ones. The reader trains the lost ones first, each once."""
    ids = run(redis_url, lambda c: writer(c).push([group(f"p{i}") for i in range(5)], "w0:s:0"))
    client = sync_client(redis_url)
    stream, lgroup = keys.trajectory_stream(NS), keys.learner_group(NS)
    reader = TrajectoryReader(client, NS)
    reader.setup()
    assert [e.entry_id for e in reader.read(1, block_ms=100)] == ids[:1]

    def lose_a_read(count: int) -> None:  # what the lost reply had delivered
        client.xreadgroup(lgroup, CONSUMER, {stream: ">"}, count=count)

    lose_a_read(2)  # ids[1:3]
    with caplog.at_level(logging.WARNING, logger="dynamo_rl.contracts.stream"):
        got = reader.read(10, block_ms=100)
    assert caplog.messages == ["took back 2 entries delivered to a read whose reply was lost"]
    assert [e.entry_id for e in got] == ids[1:]  # the lost two first, then the rest
    assert reader.read(10, block_ms=50) == []  # nothing handed out twice
    assert reader.pending_count() == 5
    reader.ack(ids)
    assert reader.pending_count() == 0
    # After acknowledgements the reader still tells a lost read from what it holds.
    more = run(redis_url, lambda c: writer(c).push([group("q0"), group("q1")], "w0:s:1"))
    lose_a_read(1)
    assert [e.entry_id for e in reader.read(10, block_ms=100)] == more
    # A lost entry trimmed away before it was taken back: acknowledged, nothing to train.
    last = run(redis_url, lambda c: writer(c).push([group("r0")], "w0:s:2"))
    lose_a_read(1)
    client.xdel(stream, *last)
    assert reader.read(10, block_ms=50) == []
    assert reader.pending_count() == 2  # more, not acknowledged yet
    client.close()
