"""The codec's checks of multi-turn responses (loss mask, turns, a fork's own prompt)."""

from __future__ import annotations

import pytest

from dynamo_rl.codec import (
    Response,
    TrajectoryDecodeError,
    TrajectoryGroup,
    Turn,
    decode_group,
    encode_group,
    response_loss_mask,
    response_prompt,
)

# Model tokens 0 and 3, an observation (tokens 1 and 2) between them.
TWO_TURNS = [Turn(start=0, end=1, observation_end=3), Turn(start=3, end=4, observation_end=4)]


def group(**response: object) -> TrajectoryGroup:
    r = Response(token_ids=[5, 6, 7, 8], logprobs=[-1.0, 0.0, 0.0, -0.5], **response)
    return TrajectoryGroup(prompt_id="p", prompt_token_ids=[1, 2], responses=[r])


def test_episode_fields_round_trip() -> None:
    g = group(loss_mask=[1, 0, 0, 1], prompt_token_ids=[3, 4, 5], episode=2, segment=1,
              turns=[Turn(start=0, end=1, observation_end=3), Turn(start=3, end=4,
                                                                  observation_end=4)])  # fmt: skip
    back = decode_group(encode_group(g))
    assert back == g
    assert response_loss_mask(back.responses[0]) == [1, 0, 0, 1]
    assert response_prompt(back, back.responses[0]) == [3, 4, 5]
    single = decode_group(encode_group(group()))
    assert response_loss_mask(single.responses[0]) == [1, 1, 1, 1]
    assert response_prompt(single, single.responses[0]) == [1, 2]


@pytest.mark.parametrize(
    ("fields", "reason"),
    [
        ({"loss_mask": [1, 0, 1]}, "3 loss_mask values for 4 tokens"),
        ({"loss_mask": [1, 0, 2, 1]}, "must be 0 or 1"),
        ({"turns": [Turn(start=0, end=5, observation_end=5)]}, "beyond its 4 tokens"),
        (
            {
                "turns": [
                    Turn(start=2, end=3, observation_end=3),
                    Turn(start=0, end=1, observation_end=1),
                ]
            },
            "out of order",
        ),
        ({"turns": [Turn(start=0, end=2, observation_end=1)]}, "out of order"),
        ({"prompt_token_ids": [3, -1]}, "negative token id"),
        # The mask must be 1 exactly on the turns' model tokens [start, end) and 0 elsewhere.
        (
            {"loss_mask": [1, 1, 0, 1], "turns": TWO_TURNS},
            r"loss_mask.*token 1 is 1.*turns' model tokens",
        ),
        (
            {"loss_mask": [1, 0, 0, 0], "turns": TWO_TURNS},
            r"loss_mask.*token 3 is 0.*turns' model tokens",
        ),
        ({"loss_mask": [1, 0, 0, 1]}, r"loss_mask.*token 0 is 1.*turns' model tokens"),
        ({"turns": TWO_TURNS}, r"loss_mask.*token 1 is 1.*turns' model tokens"),
    ],
)
def test_bad_episode_fields_are_refused(fields: dict, reason: str) -> None:
    with pytest.raises(TrajectoryDecodeError, match=reason):
        encode_group(group(**fields))
