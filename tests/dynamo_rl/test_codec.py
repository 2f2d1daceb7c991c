from __future__ import annotations

import pytest

from dynamo_rl.codec import (
    Response,
    TrajectoryDecodeError,
    TrajectoryGroup,
    decode_entry,
    decode_group,
    encode_entry,
    oldest_version,
    response_versions,
)


def _group() -> TrajectoryGroup:
    return TrajectoryGroup(
        prompt_id="p1",
        prompt_token_ids=[1, 2, 3],
        weight_version=4,
        responses=[
            Response(token_ids=[5, 6], logprobs=[-0.5, -1.0], reward=1.0, reason="ok"),
            Response(token_ids=[7], logprobs=[-2.0], reward=0.0, reason="wrong_answer"),
        ],
    )


def test_roundtrip_through_stream_fields() -> None:
    fields = encode_entry(_group())
    back = decode_entry({k.decode(): v for k, v in fields.items()})
    assert back == _group()
    assert list(back.responses[0].token_ids) == [5, 6]


def test_roundtrip_through_real_redis_stream(redis_url: str) -> None:
    import redis

    client = redis.Redis.from_url(redis_url)
    entry_id = client.xadd("s", encode_entry(_group()))
    [(_, [(got_id, fields)])] = client.xread({"s": 0})
    assert got_id == entry_id
    assert decode_entry(fields) == _group()


@pytest.mark.parametrize(
    ("mutate", "reason"),
    [
        (lambda g: g.responses[0].logprobs.append(-1.0), "3 logprobs for 2 tokens"),
        (lambda g: g.ClearField("responses"), "no responses"),
        (lambda g: setattr(g, "prompt_id", ""), "prompt_id"),
        (lambda g: setattr(g.responses[1], "reward", float("nan")), "not finite"),
        (lambda g: g.responses[1].logprobs.__setitem__(0, 0.5), "<= 0"),
        (lambda g: g.responses[0].weight_versions.extend([4]), "1 weight_versions for 2 tokens"),
        (lambda g: g.responses[1].weight_versions.extend([-1]), "negative weight version"),
        (lambda g: setattr(g, "skipped_prompts", -1), "skipped_prompts is negative"),
        (lambda g: g.responses[0].teacher_logprobs.extend([-1.0]), "1 teacher_logprobs for 2"),
        (lambda g: g.responses[1].teacher_logprobs.extend([0.25]), "teacher log-probs must be"),
    ],
)
def test_invalid_groups_are_refused(mutate, reason: str) -> None:
    group = _group()
    mutate(group)
    with pytest.raises(TrajectoryDecodeError, match=reason):
        decode_group(group.SerializeToString())


def test_teacher_logprobs_roundtrip() -> None:
    group = _group()
    group.responses[0].teacher_logprobs.extend([-0.25, -3.0])
    back = decode_entry({k.decode(): v for k, v in encode_entry(group).items()})
    assert list(back.responses[0].teacher_logprobs) == [-0.25, -3.0]
    assert not back.responses[1].teacher_logprobs


def test_oldest_version_is_the_oldest_token() -> None:
    group = _group()
    assert oldest_version(group) == 4  # no per-token versions: the group's
    group.responses[0].weight_versions.extend([4, 6])
    group.responses[1].weight_versions.extend([5])
    assert oldest_version(decode_group(group.SerializeToString())) == 4
    assert response_versions(group, group.responses[0]) == [4, 6]
    group.responses[0].weight_versions[:] = [3, 6]  # older than the group says
    assert oldest_version(group) == 3
    group.responses[1].ClearField("weight_versions")
    assert response_versions(group, group.responses[1]) == [4]


def test_garbage_and_wrong_version() -> None:
    with pytest.raises(TrajectoryDecodeError, match="protobuf"):
        decode_group(b"\xff\xff\xff")
    with pytest.raises(TrajectoryDecodeError, match="version"):
        decode_entry({b"v": b"9", b"g": b""})
    with pytest.raises(TrajectoryDecodeError, match="no 'g'"):
        decode_entry({b"v": b"1"})
