"""Trajectory codec: one :class:`TrajectoryGroup` per Redis Stream entry.

Wire format of a stream entry (a Redis hash of fields):

- ``v``: the codec version, ``b"1"``;
- ``g``: the ``dynamo.v1.TrajectoryGroup`` protobuf (``proto/dynamo/v1/trajectory.proto``),
  serialised.

:func:`decode_group` validates what the learner relies on (at least one response, one log-prob per
token, finite values, teacher log-probs one per token or none, one weight version per token or none; a multi-turn response's loss mask 1
exactly on its turns' model tokens) and
raises :class:`TrajectoryDecodeError` with the reason otherwise, so a poison entry goes to the
dead-letter stream instead of crashing the learner.

A group records the sampling settings it was drawn with as ``SamplingRecord``, the protobuf edge
of :class:`dynamo_rl.contracts.sampling.SamplingParams`: :func:`sampling_record` writes one (top-k
off as -1, no seed left absent so 0 stays a seed: the bytes written before), :func:`group_sampling`
reads a group's back.
"""

from __future__ import annotations

import math
from collections.abc import Mapping

from google.protobuf.message import DecodeError

from dynamo_rl.contracts.sampling import SamplingParams
from dynamo_rl.proto.dynamo.v1.trajectory_pb2 import (
    Response,
    SamplingRecord,
    Timing,
    ToolCall,
    TrajectoryGroup,
    Turn,
)

__all__ = [
    "CODEC_VERSION",
    "MAX_ENTRY_BYTES",
    "Response",
    "SamplingRecord",
    "Timing",
    "ToolCall",
    "TrajectoryDecodeError",
    "TrajectoryGroup",
    "Turn",
    "decode_entry",
    "decode_group",
    "encode_entry",
    "encode_group",
    "group_sampling",
    "oldest_version",
    "response_loss_mask",
    "response_prompt",
    "response_versions",
    "sampling_record",
]

CODEC_VERSION = b"1"
MAX_ENTRY_BYTES = 64 * 1024 * 1024


class TrajectoryDecodeError(ValueError):
    """A stream entry that is not a valid trajectory group; the message is the reason."""


def validate_group(group: TrajectoryGroup) -> TrajectoryGroup:
    if not group.prompt_id:
        raise TrajectoryDecodeError("prompt_id is empty")
    if not group.responses:
        raise TrajectoryDecodeError(f"group {group.prompt_id!r} has no responses")
    if any(t < 0 for t in group.prompt_token_ids):
        raise TrajectoryDecodeError("prompt_token_ids: negative token id")
    for name in ("dropped_groups", "dropped_rollouts", "dropped_tokens", "skipped_prompts"):
        if getattr(group, name) < 0:
            raise TrajectoryDecodeError(f"{name} is negative ({getattr(group, name)})")
    for i, r in enumerate(group.responses):
        if len(r.logprobs) != len(r.token_ids):
            raise TrajectoryDecodeError(
                f"response {i}: {len(r.logprobs)} logprobs for {len(r.token_ids)} tokens"
            )
        if not math.isfinite(r.reward):
            raise TrajectoryDecodeError(f"response {i}: reward is not finite ({r.reward})")
        if any(not math.isfinite(x) or x > 0 for x in r.logprobs):
            raise TrajectoryDecodeError(f"response {i}: log-probs must be finite and <= 0")
        if any(t < 0 for t in r.token_ids):
            raise TrajectoryDecodeError(f"response {i}: negative token id")
        if r.teacher_logprobs and len(r.teacher_logprobs) != len(r.token_ids):
            raise TrajectoryDecodeError(
                f"response {i}: {len(r.teacher_logprobs)} teacher_logprobs for "
                f"{len(r.token_ids)} tokens (one per token, or none)"
            )
        if any(not math.isfinite(x) or x > 0 for x in r.teacher_logprobs):
            raise TrajectoryDecodeError(f"response {i}: teacher log-probs must be finite and <= 0")
        if r.weight_versions and len(r.weight_versions) != len(r.token_ids):
            raise TrajectoryDecodeError(
                f"response {i}: {len(r.weight_versions)} weight_versions for "
                f"{len(r.token_ids)} tokens (one per token, or none)"
            )
        if any(v < 0 for v in r.weight_versions):
            raise TrajectoryDecodeError(f"response {i}: negative weight version")
        _validate_episode(i, r)
    return group


def _validate_episode(i: int, r: Response) -> None:
    """A multi-turn response's mask and turns (absent on single-turn responses): the mask's
    length and values, the turns' spans in order within the tokens, the mask on the spans."""
    n = len(r.token_ids)
    if r.loss_mask:
        if len(r.loss_mask) != n:
            raise TrajectoryDecodeError(
                f"response {i}: {len(r.loss_mask)} loss_mask values for {n} tokens"
            )
        if not set(r.loss_mask) <= {0, 1}:
            raise TrajectoryDecodeError(f"response {i}: loss_mask values must be 0 or 1")
    if any(t < 0 for t in r.prompt_token_ids):
        raise TrajectoryDecodeError(f"response {i}: prompt_token_ids: negative token id")
    prev = 0
    for k, t in enumerate(r.turns):
        if not prev <= t.start <= t.end <= t.observation_end <= n:
            raise TrajectoryDecodeError(
                f"response {i} turn {k}: spans [{t.start}, {t.end}, {t.observation_end}] out of "
                f"order or beyond its {n} tokens"
            )
        if not math.isfinite(t.reward):
            raise TrajectoryDecodeError(f"response {i} turn {k}: reward is not finite")
        prev = t.observation_end
    if r.loss_mask or r.turns:
        _check_mask_on_turns(i, r)


def _check_mask_on_turns(i: int, r: Response) -> None:
    """The mask is 1 exactly on the turns' model tokens ``[start, end)``, 0 elsewhere: what the
    learner trains is what the engine sampled, no more and no less."""
    model = [0] * len(r.token_ids)
    for t in r.turns:
        model[t.start : t.end] = [1] * (t.end - t.start)
    mask = response_loss_mask(r)
    if list(mask) == model:
        return
    for j, (m, want) in enumerate(zip(mask, model, strict=True)):
        if m != want:
            raise TrajectoryDecodeError(
                f"response {i}: loss_mask at token {j} is {m}, but must be 1 exactly on the "
                f"turns' model tokens [start, end) and 0 elsewhere ({len(r.turns)} turns)"
            )


def response_prompt(group: TrajectoryGroup, response: Response) -> list[int]:
    """The prompt a response continues: its own (a forked sample) or the group's."""
    return list(response.prompt_token_ids or group.prompt_token_ids)


def response_loss_mask(response: Response) -> list[int]:
    """1 at the tokens trained on: every token of a single-turn response, the model's tokens of
    a multi-turn one."""
    return list(response.loss_mask) if response.loss_mask else [1] * len(response.token_ids)


def response_versions(group: TrajectoryGroup, response: Response) -> list[int]:
    """The weight version of each token of a response: its own per-token versions, else the
    group's version for every token."""
    if response.weight_versions:
        return list(response.weight_versions)
    return [int(group.weight_version)] * len(response.token_ids)


def oldest_version(group: TrajectoryGroup) -> int:
    """The oldest weight version behind any token of the group, never newer than the group's
    own ``weight_version``: what a staleness bound is held to."""
    return min(
        [int(group.weight_version), *(v for r in group.responses for v in r.weight_versions)]
    )


def sampling_record(sampling: SamplingParams) -> SamplingRecord:
    """The stream's record of the settings a group was sampled with (top-k off: -1; no seed:
    absent, so 0 stays a seed)."""
    return SamplingRecord(
        temperature=sampling.temperature,
        top_p=sampling.top_p,
        top_k=-1 if sampling.top_k is None else sampling.top_k,
        max_tokens=sampling.max_tokens,
        seed=sampling.seed,
    )


def group_sampling(group: TrajectoryGroup) -> SamplingParams:
    """The settings ``group`` was sampled with, from its record (the fields it records; the
    others at their defaults); a group without a record reads as the defaults."""
    if not group.HasField("sampling"):
        return SamplingParams()
    r = group.sampling
    return SamplingParams(
        max_tokens=r.max_tokens,
        temperature=r.temperature,
        top_p=r.top_p,
        top_k=r.top_k,
        seed=r.seed if r.HasField("seed") else None,
    )


def encode_group(group: TrajectoryGroup) -> bytes:
    return validate_group(group).SerializeToString()


def decode_group(data: bytes) -> TrajectoryGroup:
    if len(data) > MAX_ENTRY_BYTES:
        raise TrajectoryDecodeError(f"entry of {len(data)} bytes exceeds {MAX_ENTRY_BYTES}")
    group = TrajectoryGroup()
    try:
        group.ParseFromString(data)
    except DecodeError as e:
        raise TrajectoryDecodeError(f"not a TrajectoryGroup protobuf: {e}") from None
    return validate_group(group)


def encode_entry(group: TrajectoryGroup) -> dict[bytes, bytes]:
    """The fields of a stream entry (for ``XADD``)."""
    return {b"v": CODEC_VERSION, b"g": encode_group(group)}


def decode_entry(fields: Mapping[bytes | str, bytes | str]) -> TrajectoryGroup:
    """Decode the fields of a stream entry (as ``XREADGROUP`` returns them)."""
    norm = {(k.encode() if isinstance(k, str) else k): v for k, v in fields.items()}
    version = norm.get(b"v")
    if isinstance(version, str):
        version = version.encode()
    if version != CODEC_VERSION:
        raise TrajectoryDecodeError(
            f"unknown codec version {version!r} (expected {CODEC_VERSION!r})"
        )
    payload = norm.get(b"g")
    if payload is None:
        raise TrajectoryDecodeError("entry has no 'g' field")
    if isinstance(payload, str):
        raise TrajectoryDecodeError("'g' field must be bytes (use a Redis client without decoding)")
    return decode_group(payload)
