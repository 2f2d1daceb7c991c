"""The allocation parameters are declared once (``dynamo_rl.contracts.allocator``) and the proto is
their wire format: the model and ``AllocateRequest`` agree field by field, the client's request
and the server's reading of it round-trip, and the config section is the model.

The client and the server are imported inside the tests that use them: the server reads the proto's
descriptor for every parameter at import, so a parameter missing from the proto must fail the
field-by-field tests here with their message, not the collection of this file."""

from __future__ import annotations

import math
import typing
from typing import Any, Literal

import pytest
from google.protobuf.descriptor import FieldDescriptor

from dynamo_rl.config import AllocatorConfig, ConfigError, load_config
from dynamo_rl.contracts.allocator import (
    CONFIG_ONLY,
    REQUEST_FIELDS,
    AllocationParams,
    InvalidParams,
)
from dynamo_rl.proto.dynamo.v1 import allocator_pb2 as pb

REQUEST = pb.AllocateRequest.DESCRIPTOR
BATCH = {"namespace", "prompt_ids"}
"""AllocateRequest's fields that say which batch, not how to share its budget."""
TOTAL = "total"
"""The proto's oneof: a request gives the whole budget or n_per_prompt."""

PROTO_TYPES: dict[int, type] = {
    FieldDescriptor.TYPE_INT32: int,
    FieldDescriptor.TYPE_INT64: int,
    FieldDescriptor.TYPE_DOUBLE: float,
    FieldDescriptor.TYPE_FLOAT: float,
    FieldDescriptor.TYPE_STRING: str,
}


def _python_type(annotation: Any) -> type:
    """int, float or str: a Literal of strings is a str on the wire."""
    if typing.get_origin(annotation) is Literal:
        kinds = {type(v) for v in typing.get_args(annotation)}
        assert len(kinds) == 1, annotation
        return kinds.pop()
    return annotation


def test_every_parameter_is_a_request_field_and_every_request_field_a_parameter() -> None:
    wire = set(REQUEST.fields_by_name) - BATCH - {"budget"}
    assert wire == set(REQUEST_FIELDS), (
        "AllocationParams and AllocateRequest disagree: "
        f"only in the proto {sorted(wire - set(REQUEST_FIELDS))}, "
        f"only in the model {sorted(set(REQUEST_FIELDS) - wire)}"
    )
    assert set(AllocationParams.model_fields) == set(REQUEST_FIELDS) | set(CONFIG_ONLY)
    assert not set(CONFIG_ONLY) & set(REQUEST.fields_by_name)


@pytest.mark.parametrize("name", REQUEST_FIELDS)
def test_each_field_has_the_models_type_and_can_be_left_unset(name: str) -> None:
    field = REQUEST.fields_by_name[name]
    info = AllocationParams.model_fields[name]
    assert not field.is_repeated, name
    assert PROTO_TYPES[field.type] is _python_type(info.annotation), (name, field.type)
    if field.type == FieldDescriptor.TYPE_STRING:
        # No presence: the empty string means "the server's default", so it must not be a value.
        allowed = typing.get_args(info.annotation)
        assert not field.has_presence and allowed and "" not in allowed, name
    else:
        # A number's zero may be a real value (n_min=0): unset must be told apart from it.
        assert field.has_presence, f"{name}: declare it `optional` (or in a oneof) in the proto"
    oneof = field.containing_oneof
    if name == "n_per_prompt":
        assert oneof is not None and oneof.name == TOTAL
    else:
        assert oneof is None or oneof.name.startswith("_"), (name, oneof and oneof.name)


def test_budget_is_the_alternative_to_n_per_prompt() -> None:
    budget = REQUEST.fields_by_name["budget"]
    assert budget.containing_oneof is not None and budget.containing_oneof.name == TOTAL
    assert {f.name for f in REQUEST.oneofs_by_name[TOTAL].fields} == {"budget", "n_per_prompt"}
    assert budget.type == FieldDescriptor.TYPE_INT64


def test_the_config_section_is_the_model() -> None:
    cfg = AllocatorConfig()
    assert isinstance(cfg, AllocationParams)
    for name, info in AllocationParams.model_fields.items():
        ours = AllocatorConfig.model_fields[name]
        assert ours.default == info.default and ours.metadata == info.metadata, name
        assert ours.description and ours.description == info.description, name
    tree = load_config(overrides=["allocator.n_min=2", "allocator.scheme=water-level"]).allocator
    assert (tree.n_min, tree.scheme) == (2, "water-level")


def test_config_errors_name_the_dotted_key() -> None:
    with pytest.raises(ConfigError, match=r"allocator\.n_min \(30\) must be <= allocator\.n_max"):
        load_config(overrides=["allocator.n_min=30", "allocator.n_max=8"])
    with pytest.raises(ConfigError, match=r"allocator\.hopeless_n"):
        load_config(overrides=["allocator.hopeless_after=8", "allocator.hopeless_n=5"])


SENT = [
    {},
    {"n_min": 0, "n_max": 1, "initial_budget": 0},
    {"mastery_threshold": 1.0, "min_priority": 0.0, "priority": "std", "scheme": "water-level"},
    {"n_per_prompt": 3, "n_min": 2},
]


@pytest.mark.parametrize("sent", SENT)
def test_what_the_client_sends_is_what_the_server_reads(sent: dict) -> None:
    from allocator.server import request_params
    from dynamo_rl.clients.allocator import allocate_request

    defaults = AllocatorConfig(n_min=1, hopeless_after=0)
    request = allocate_request("ns", ["a", "b"], **sent)
    wire = pb.AllocateRequest.FromString(request.SerializeToString())
    got = request_params(wire, defaults)
    assert got == defaults.with_overrides(sent)
    assert type(got) is AllocationParams  # the config's own settings do not travel on
    for name in REQUEST_FIELDS:
        if name not in sent:
            assert getattr(got, name) == getattr(defaults, name), name


def test_none_leaves_a_field_unset_and_budget_excludes_n_per_prompt() -> None:
    from dynamo_rl.clients.allocator import allocate_request

    request = allocate_request("ns", ["a"], None, budget=7, n_min=None, scheme=None)
    assert request.WhichOneof("total") == "budget" and request.budget == 7
    assert not request.HasField("n_min") and request.scheme == ""
    with pytest.raises(ValueError, match="not both"):
        allocate_request("ns", ["a"], 8, budget=8)
    with pytest.raises(TypeError, match=r"hopeless_n .*server's config"):
        allocate_request("ns", ["a"], hopeless_n=2)


@pytest.mark.parametrize(
    ("overrides", "message"),
    [
        ({"n_min": -1}, "n_min: must be >= 0, got -1"),
        ({"n_max": 0}, "n_max: must be >= 1, got 0"),
        ({"n_per_prompt": 0}, "n_per_prompt: must be >= 1, got 0"),
        ({"mastery_threshold": 1.5}, r"mastery_threshold: must be in \(0, 1\], got 1.5"),
        ({"mastery_threshold": math.nan}, r"mastery_threshold: must be in \(0, 1\], got nan"),
        ({"min_priority": -0.1}, r"min_priority: must be in \[0, 1\], got -0.1"),
        ({"priority": "entropy"}, "priority: 'entropy' is not one of variance, std"),
        ({"scheme": "greedy"}, "scheme: 'greedy' is not one of reference, water-level"),
        ({"n_min": 10, "n_max": 8}, r"n_min \(10\) must be <= n_max \(8\)"),
        ({"n_min": 0}, r"hopeless_n \(1\) must be <= n_min \(0\) when hopeless_after is on"),
    ],
)
def test_a_bad_request_names_the_field_and_what_it_allows(overrides: dict, message: str) -> None:
    from allocator.server import BadRequest, request_params
    from dynamo_rl.clients.allocator import allocate_request

    defaults = AllocatorConfig(hopeless_after=16)
    with pytest.raises(InvalidParams, match=f"^{message}$"):
        defaults.with_overrides(overrides)
    request = allocate_request("ns", ["a"], **overrides)
    with pytest.raises(BadRequest, match=f"^{message}$"):
        request_params(request, defaults)


def test_the_model_is_frozen_and_the_config_is_not() -> None:
    params = AllocationParams()
    with pytest.raises(ValueError):
        params.n_min = 2  # type: ignore[misc]
    cfg = AllocatorConfig()
    cfg.n_min = 2
    with pytest.raises(ValueError, match="n_min"):
        cfg.n_min = 99
