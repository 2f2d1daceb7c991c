"""The sampling settings are declared once (``dynamo_rl.contracts.sampling.SamplingParams``) and
converted at two edges only: the HTTP bodies (``dynamo_rl.contracts.engine``) and the stream's
protobuf record (``dynamo_rl.codec``). The record agrees with the dataclass field by field and is
written with the bytes written before; top-k off is None in our type, and each edge reads the other
spellings (-1, 0, null) as None; no other class of ours is called ``SamplingParams``."""

from __future__ import annotations

import dataclasses
import re
from pathlib import Path

import pytest

from dynamo_rl.codec import (
    Response,
    SamplingRecord,
    TrajectoryGroup,
    decode_group,
    encode_group,
    group_sampling,
    sampling_record,
)
from dynamo_rl.config import ConfigError, load_config
from dynamo_rl.contracts.engine import CompletionRequest, GenerateRequest, sampling_knobs
from dynamo_rl.contracts.sampling import SamplingParams
from dynamo_rl.proto.dynamo.v1 import trajectory_pb2

REPO = Path(__file__).resolve().parents[2]
RECORD = SamplingRecord.DESCRIPTOR


def test_the_record_holds_settings_fields_under_their_old_numbers() -> None:
    numbers = {f.name: f.number for f in RECORD.fields}
    assert numbers == {"temperature": 1, "top_p": 2, "top_k": 3, "max_tokens": 4, "seed": 5}
    assert set(numbers) <= {f.name for f in dataclasses.fields(SamplingParams)}
    assert RECORD.fields_by_name["seed"].has_presence  # 0 is a seed, absent is none
    assert TrajectoryGroup.DESCRIPTOR.fields_by_name["sampling"].message_type is RECORD
    assert TrajectoryGroup.DESCRIPTOR.fields_by_name["sampling"].number == 5


@pytest.mark.parametrize(
    ("sampling", "hex_bytes"),
    [
        # The default settings: top-k off is -1 on the wire, no seed is absent.
        (SamplingParams(max_tokens=4), "09000000000000f03f11000000000000f03f18ffffffffffffffffff012004"),
        (SamplingParams(max_tokens=8, temperature=0.7, top_p=0.9, top_k=5, seed=0, stop=("x",)),
         "09666666666666e63f11cdccccccccccec3f180520082800"),
    ],
)  # fmt: skip
def test_the_record_is_written_with_the_bytes_written_before(
    sampling: SamplingParams, hex_bytes: str
) -> None:
    assert sampling_record(sampling).SerializeToString().hex() == hex_bytes


@pytest.mark.parametrize(
    "sampling",
    [SamplingParams(), SamplingParams(max_tokens=9, temperature=0.0, top_p=0.5, top_k=3, seed=0),
     SamplingParams(temperature=1.3, seed=12345678901)],
)  # fmt: skip
def test_a_group_reads_back_the_settings_it_records(sampling: SamplingParams) -> None:
    one = Response(token_ids=[5], logprobs=[-0.1])
    sent = TrajectoryGroup(prompt_id="p", responses=[one], sampling=sampling_record(sampling))
    group = decode_group(encode_group(sent))
    assert group_sampling(group) == sampling


def test_a_group_without_a_record_reads_as_the_defaults() -> None:
    assert group_sampling(TrajectoryGroup()) == SamplingParams()
    assert group_sampling(TrajectoryGroup()).logit_temperature == 1.0


@pytest.mark.parametrize(("temperature", "logit"), [(0.0, 1.0), (0.7, 0.7), (1.0, 1.0), (1.6, 1.6)])
def test_the_learner_divides_its_logits_by_the_temperature_greedy_by_one(
    temperature: float, logit: float
) -> None:
    sampling = SamplingParams(temperature=temperature)
    assert sampling.logit_temperature == logit and sampling.greedy == (temperature == 0)
    record = TrajectoryGroup(sampling=sampling_record(sampling))
    assert group_sampling(record).logit_temperature == logit


@pytest.mark.parametrize("off", [None, -1, 0])
def test_top_k_off_is_none_whatever_the_edge_was_given(off: int | None) -> None:
    assert SamplingParams(top_k=off).top_k is None
    assert dataclasses.replace(SamplingParams(top_k=4), top_k=off).top_k is None
    # The config (configs written before say -1).
    cfg = load_config(None, [f"rollout.sampling.top_k={'null' if off is None else off}"], env={})
    assert cfg.rollout.sampling.top_k is None
    # The HTTP bodies (vLLM's API spells it -1, SGLang's 0; both accept null).
    completion = CompletionRequest.model_validate({"prompt": [1], "top_k": off})
    generate = GenerateRequest.model_validate({"input_ids": [1], "sampling_params": {"top_k": off}})
    assert (
        completion.sampling(4).top_k is None and generate.sampling_params.sampling(4).top_k is None
    )
    # The record.
    assert group_sampling(TrajectoryGroup(sampling=SamplingRecord(top_k=off or 0))).top_k is None


def test_top_k_on_passes_every_edge() -> None:
    sampling = SamplingParams(top_k=5)
    assert sampling_knobs(sampling)["top_k"] == 5
    assert CompletionRequest.model_validate({"prompt": [1], **sampling_knobs(sampling)}).sampling(
        4
    ) == SamplingParams(max_tokens=4, top_k=5)
    assert sampling_record(sampling).top_k == 5
    assert load_config(None, ["rollout.sampling.top_k=5"], env={}).rollout.sampling.top_k == 5
    with pytest.raises(ConfigError, match=r"rollout\.sampling\.top_k"):
        load_config(None, ["rollout.sampling.top_k=-2"], env={})


def test_the_http_edge_sends_only_what_is_set_and_reads_it_back() -> None:
    assert sampling_knobs(SamplingParams(max_tokens=3)) == {
        "temperature": 1.0, "top_p": 1.0, "top_k": None, "stop": None, "stop_token_ids": None,
    }  # fmt: skip
    full = SamplingParams(max_tokens=7, temperature=0.5, top_p=0.8, top_k=2, stop=("a", "bc"),
                          stop_token_ids=(4,), seed=3, ignore_eos=True)  # fmt: skip
    knobs = sampling_knobs(full)
    assert knobs == {"temperature": 0.5, "top_p": 0.8, "top_k": 2, "stop": ["a", "bc"],
                     "stop_token_ids": [4], "ignore_eos": True}  # fmt: skip
    request = CompletionRequest(prompt=[1], max_tokens=7, seed=3, **knobs)
    assert request.sampling(request.max_tokens or 0, request.seed) == full
    # A single stop string (OpenAI allows it) is one stop string.
    one = CompletionRequest.model_validate({"prompt": [1], "stop": "ab"}).sampling(2)
    assert one.stop == ("ab",)


def test_the_config_section_is_the_settings() -> None:
    cfg = load_config(None, ["rollout.sampling.stop=[x, y]", "rollout.sampling.seed=0"], env={})
    sampling = cfg.rollout.sampling
    assert type(sampling) is SamplingParams
    assert sampling == SamplingParams(stop=("x", "y"), seed=0)
    hash(sampling)  # frozen, tuples: usable as a key
    dumped = cfg.model_dump(mode="json")["rollout"]["sampling"]
    assert dumped["top_k"] is None and dumped["stop"] == ["x", "y"]
    with pytest.raises(ConfigError, match=r"rollout\.sampling\.max_token: unknown key"):
        load_config(None, ["rollout.sampling.max_token=3"], env={})
    with pytest.raises(ConfigError, match=r"rollout\.sampling\.max_tokens"):
        load_config(None, ["rollout.sampling.max_tokens=0"], env={})


def test_one_class_is_called_sampling_params() -> None:
    """Outside the generated stubs, ``SamplingParams`` names the contract's class only: no other
    class, no alias of another (the trajectory's protobuf message is ``SamplingRecord``)."""
    assert not hasattr(trajectory_pb2, "SamplingParams")
    defined, aliased = [], []
    for path in REPO.rglob("*.py"):
        rel = path.relative_to(REPO).as_posix()
        if rel.startswith((".venv", "dynamo_rl/proto/")) or "/." in f"/{rel}":
            continue
        text = path.read_text(errors="replace")
        if re.search(r"^\s*class SamplingParams\b", text, re.MULTILINE):
            defined.append(rel)
        if re.search(r"\bas SamplingParams\b|^\s*SamplingParams\s*=", text, re.MULTILINE):
            aliased.append(rel)
    assert defined == ["dynamo_rl/contracts/sampling.py"]
    assert aliased == []
