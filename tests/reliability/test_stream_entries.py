"""Malformed and oversized trajectory-stream entries, through the learner's public reading path.

tests/learner/test_stream.py already covers an undecodable payload, a wrong codec version, a
token outside the vocabulary and a sequence over ``max_seq_len``. This adds every other way an
entry can be wrong — missing fields, a truncated protobuf, a truncated packed field, a negative prompt token, values
``validate_group`` refuses, an entry over ``codec.MAX_ENTRY_BYTES`` — each read by
:class:`dynamo_rl.contracts.stream.TrajectoryReader` from a real Redis: it goes to the dead-letter stream with
a reason naming the problem and its payload, is acknowledged at once, and the good entries around
it are still read.
"""

from __future__ import annotations

import re

import redis

from dynamo_rl import keys
from dynamo_rl.codec import CODEC_VERSION, MAX_ENTRY_BYTES, Response, TrajectoryGroup, encode_entry
from dynamo_rl.contracts.stream import TrajectoryReader

NS = "reliability-stream"


def good_group(pid: str) -> TrajectoryGroup:
    return TrajectoryGroup(
        prompt_id=pid,
        prompt_token_ids=[5, 6, 7],
        responses=[Response(token_ids=[8, 9], logprobs=[-0.5, -1.0], reward=1.0)],
    )


def raw(group: TrajectoryGroup) -> dict[bytes, bytes]:
    """Fields of an entry without the codec's validation (what a buggy writer could XADD)."""
    return {b"v": CODEC_VERSION, b"g": group.SerializeToString()}


def _bad_response(**kw: object) -> TrajectoryGroup:
    r = {"token_ids": [8], "logprobs": [-1.0], "reward": 1.0, **kw}
    return TrajectoryGroup(prompt_id="p", prompt_token_ids=[5], responses=[Response(**r)])


GOOD = good_group("good").SerializeToString()

# (fields XADDed, pattern the dead-letter reason must match)
BAD_ENTRIES: list[tuple[dict[bytes, bytes], str]] = [
    ({b"v": CODEC_VERSION}, r"no 'g' field"),
    ({b"g": GOOD}, r"codec version"),
    ({b"x": b"1"}, r"codec version"),
    ({b"v": CODEC_VERSION, b"g": GOOD[: len(GOOD) // 2]}, r"not a TrajectoryGroup protobuf"),
    ({b"v": CODEC_VERSION, b"g": b"\x12\x03\xff\xff\xff"}, r"protobuf"),  # packed varint truncated
    ({b"v": CODEC_VERSION, b"g": b""}, r"prompt_id is empty"),
    (raw(TrajectoryGroup(prompt_id="p", prompt_token_ids=[5])), r"no responses"),
    (raw(_bad_response(logprobs=[-1.0, -2.0])), r"2 logprobs for 1 tokens"),
    (raw(_bad_response(reward=float("nan"))), r"reward is not finite"),
    (raw(_bad_response(reward=float("inf"))), r"reward is not finite"),
    (raw(_bad_response(logprobs=[0.5])), r"log-probs must be finite and <= 0"),
    (raw(_bad_response(logprobs=[float("-inf")])), r"log-probs must be finite"),
    (raw(_bad_response(token_ids=[-3])), r"negative token id"),
    (raw(TrajectoryGroup(prompt_id="p", responses=[Response(token_ids=[8], logprobs=[-1.0])])),
     r"prompt_token_ids is empty"),
    (raw(TrajectoryGroup(prompt_id="p", prompt_token_ids=[-1],
                         responses=[Response(token_ids=[8], logprobs=[-1.0])])),
     r"prompt_token_ids: negative token id"),
]  # fmt: skip


def test_malformed_entries_are_dead_lettered_and_good_ones_read(redis_url: str) -> None:
    client = redis.Redis.from_url(redis_url)
    stream = keys.trajectory_stream(NS)
    good_ids = [client.xadd(stream, encode_entry(good_group("first"))).decode()]
    bad_ids = [client.xadd(stream, fields).decode() for fields, _ in BAD_ENTRIES]
    good_ids.append(client.xadd(stream, encode_entry(good_group("last"))).decode())

    reader = TrajectoryReader(client, NS, vocab_size=100, max_seq_len=64)
    reader.setup()
    got = reader.read(len(BAD_ENTRIES) + 2, block_ms=100)
    assert [e.entry_id for e in got] == good_ids
    letters = client.xrange(keys.dead_letter_stream(NS))
    assert [f[b"id"].decode() for _id, f in letters] == bad_ids
    for (fields, pattern), (_lid, letter) in zip(BAD_ENTRIES, letters, strict=True):
        reason = letter[b"reason"].decode()
        assert re.search(pattern, reason), (fields, reason)
        assert letter[b"payload"] == fields.get(b"g", b"")
    assert reader.pending_count() == 2  # dead letters acknowledged; the good ones await a commit


def test_oversized_entry_is_dead_lettered(redis_url: str) -> None:
    client = redis.Redis.from_url(redis_url)
    stream = keys.trajectory_stream(NS)
    huge = b"\x0a\x01p" + b"\x12" + b"\x00" * (MAX_ENTRY_BYTES + 1)  # past the codec's limit
    big_id = client.xadd(stream, {b"v": CODEC_VERSION, b"g": huge}).decode()
    good_id = client.xadd(stream, encode_entry(good_group("after"))).decode()
    reader = TrajectoryReader(client, NS)
    reader.setup()
    got = reader.read(5, block_ms=100)
    assert [e.entry_id for e in got] == [good_id]
    ((_lid, letter),) = client.xrange(keys.dead_letter_stream(NS))
    assert letter[b"id"].decode() == big_id
    assert f"exceeds {MAX_ENTRY_BYTES}" in letter[b"reason"].decode()
    assert reader.pending_count() == 1
    client.delete(keys.dead_letter_stream(NS), stream)  # free the 64 MiB at once
