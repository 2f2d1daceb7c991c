"""The stream reader against a real Redis: reclaim on restart, exactly-once bookkeeping, and
dead-lettering of entries the learner cannot train on."""

from __future__ import annotations

import logging
import threading

import redis

from dynamo_rl import keys
from dynamo_rl.codec import Response, TrajectoryGroup, encode_entry
from dynamo_rl.contracts.stream import TrajectoryReader
from tests.conftest import wait_for_blocked_read
from tests.learner.helpers import make_groups, write_groups

NS = "streamtest"


def _client(url: str) -> redis.Redis:
    return redis.Redis.from_url(url)


def test_reclaim_skips_committed_ids_and_retrains_the_rest(redis_url: str, caplog) -> None:
    ids = write_groups(redis_url, NS, make_groups(6))
    client = _client(redis_url)
    first = TrajectoryReader(client, NS)
    first.setup()
    got = first.read(4, block_ms=100)
    assert [e.entry_id for e in got] == ids[:4]
    assert first.pending_count() == 4  # read, not acknowledged: the learner "crashed" here

    # A restarted learner whose checkpoint holds the steps that used ids[0] and ids[1].
    second = TrajectoryReader(client, NS)
    with caplog.at_level(logging.INFO, logger="dynamo_rl.contracts.stream"):
        assert second.setup(committed=ids[:2]) == 2
    assert caplog.messages == [
        "reclaimed 4 pending entries: 2 already trained (acknowledged), 2 to train"
    ]
    assert second.pending_count() == 2  # the committed ones were acknowledged at setup
    again = second.read(4, block_ms=100)
    assert [e.entry_id for e in again] == ids[2:6]  # the lost ones first, in order, then new
    assert again[0].group.prompt_id == "p2"
    second.ack(e.entry_id for e in again)
    assert second.pending_count() == 0
    assert second.read(4, block_ms=50) == []


def test_poison_entries_go_to_the_dead_letter_stream(redis_url: str) -> None:
    client = _client(redis_url)
    stream = keys.trajectory_stream(NS)
    good = make_groups(1)[0]
    client.xadd(stream, {b"v": b"1", b"g": b"\xff\x00 not a protobuf"})
    client.xadd(stream, {b"v": b"9", b"g": good.SerializeToString()})
    out_of_vocab = TrajectoryGroup(
        prompt_id="oov",
        prompt_token_ids=[5, 6],
        responses=[Response(token_ids=[300], logprobs=[-1.0], reward=1.0)],
    )
    client.xadd(stream, encode_entry(out_of_vocab))
    too_long = TrajectoryGroup(
        prompt_id="long",
        prompt_token_ids=[5] * 20,
        responses=[Response(token_ids=[7] * 20, logprobs=[-1.0] * 20, reward=1.0)],
    )
    client.xadd(stream, encode_entry(too_long))
    good_id = client.xadd(stream, encode_entry(good)).decode()

    dead: list[str] = []
    reader = TrajectoryReader(
        client, NS, vocab_size=259, max_seq_len=32, on_dead_letter=lambda i, r: dead.append(r)
    )
    reader.setup()
    got = reader.read(5, block_ms=100)
    assert [e.entry_id for e in got] == [good_id]
    letters = client.xrange(keys.dead_letter_stream(NS))
    reasons = [fields[b"reason"].decode() for _id, fields in letters]
    assert len(reasons) == 4 and reasons == dead
    assert "not a TrajectoryGroup protobuf" in reasons[0]
    assert "codec version" in reasons[1]
    assert "outside the model's vocabulary" in reasons[2]
    assert "exceeds learner.max_seq_len" in reasons[3]
    assert letters[1][1][b"payload"] == good.SerializeToString()
    # Dead letters are acknowledged at once; only the good entry waits for its checkpoint.
    assert reader.pending_count() == 1


def test_the_limits_take_what_fits_exactly_and_dead_letter_the_rest_with_a_reason(
    redis_url: str,
) -> None:
    """Token id ``vocab_size - 1`` and a sequence of exactly ``max_seq_len`` tokens train; one
    more of either, or an empty prompt, is dead-lettered with a reason naming it."""
    client = _client(redis_url)
    stream = keys.trajectory_stream(NS)

    def entry(pid: str, prompt: list[int], tokens: list[int]) -> str:
        g = TrajectoryGroup(
            prompt_id=pid,
            prompt_token_ids=prompt,
            responses=[Response(token_ids=tokens, logprobs=[-1.0] * len(tokens), reward=1.0)],
        )
        return client.xadd(stream, encode_entry(g)).decode()

    fits = [entry("top-id", [5, 258], [7]), entry("full", [5] * 20, [7] * 12)]
    entry("id-past-vocab", [5, 259], [7])
    entry("one-too-long", [5] * 20, [7] * 13)
    entry("no-prompt", [], [7])
    dead: dict[str, str] = {}
    reader = TrajectoryReader(
        client, NS, vocab_size=259, max_seq_len=32, on_dead_letter=lambda i, r: dead.update({i: r})
    )
    reader.setup()
    assert [e.entry_id for e in reader.read(10, block_ms=100)] == fits
    assert list(dead.values()) == [
        "token id 259 outside the model's vocabulary of 259",
        "prompt+response of 33 tokens exceeds learner.max_seq_len 32",
        "prompt_token_ids is empty",
    ]


def test_a_read_takes_the_backlog_first_and_never_more_than_count(redis_url: str) -> None:
    ids = write_groups(redis_url, NS, make_groups(9))
    client = _client(redis_url)
    TrajectoryReader(client, NS).setup()
    TrajectoryReader(client, NS).read(5, block_ms=100)  # read, never acknowledged: a crash
    reader = TrajectoryReader(client, NS)
    assert reader.setup() == 5
    assert [e.entry_id for e in reader.read(3, block_ms=100)] == ids[:3]  # backlog only
    assert [e.entry_id for e in reader.read(4, block_ms=100)] == ids[3:7]  # 2 backlog + 2 new
    assert [e.entry_id for e in reader.read(4, block_ms=100)] == ids[7:]


def test_a_read_waits_for_an_entry_up_to_block_ms(redis_url: str) -> None:
    """With nothing to read, ``read`` blocks in XREADGROUP and returns the entry pushed while it
    waits (the push is made once Redis reports the read as a blocked client)."""
    client = _client(redis_url)
    reader = TrajectoryReader(client, NS)
    reader.setup()
    pushed: list[str] = []

    def push_once_blocked() -> None:
        other = _client(redis_url)
        try:
            wait_for_blocked_read(other)
            pushed.extend(write_groups(redis_url, NS, make_groups(1)))
        finally:
            other.close()

    pusher = threading.Thread(target=push_once_blocked)
    pusher.start()
    got = reader.read(1, block_ms=30_000)
    pusher.join()
    assert pushed and [e.entry_id for e in got] == pushed
