"""Malformed gRPC requests to a real ``dynamo-rl allocator`` process.

Bytes that are not the request message, fields of the wrong wire type, values outside their
domain, repeated fields over the limits: each is a clean ``INVALID_ARGUMENT`` (or grpc's own
``RESOURCE_EXHAUSTED`` past the message size limit), never ``INTERNAL``/``UNKNOWN``, and the
server stays healthy. Also the control token: needed for ``ResetNamespace``, required for a
public bind, and never written to the log or ``/metrics``.
"""

from __future__ import annotations

import math
import os
import random
import re
import subprocess
from collections.abc import Iterator

import grpc
import httpx
import pytest
from grpc_health.v1 import health_pb2, health_pb2_grpc

from dynamo_rl.procs import ServiceProcess, free_port, grpc_healthy
from dynamo_rl.proto.dynamo.v1 import allocator_pb2 as pb
from dynamo_rl.service_table import SERVICES
from tests.conftest import REPO, dynamo_rl_argv
from tests.reliability.helpers import CONTROL_TOKEN, assert_not_leaked

SERVICE = "dynamo.v1.Allocator"
METHODS = ["Allocate", "ReportOutcomes", "GetStats", "ResetNamespace", "ExportNamespace"]
CLEAN = {grpc.StatusCode.INVALID_ARGUMENT, grpc.StatusCode.UNAUTHENTICATED}


class Allocator:
    def __init__(self, proc: ServiceProcess, port: int, metrics_port: int) -> None:
        self.proc = proc
        self.addr = f"127.0.0.1:{port}"
        self.metrics_url = f"http://127.0.0.1:{metrics_port}/metrics"
        self.channel = grpc.insecure_channel(
            self.addr, options=[("grpc.max_send_message_length", -1)]
        )

    def raw(self, method: str, payload: bytes, token: str | None = None) -> grpc.RpcError | bytes:
        """Send ``payload`` as the request bytes; returns the reply bytes or the error."""
        call = self.channel.unary_unary(f"/{SERVICE}/{method}")
        metadata = [("authorization", f"Bearer {token}")] if token else None
        try:
            return call(payload, timeout=30, metadata=metadata)
        except grpc.RpcError as e:
            return e

    def assert_healthy(self) -> None:
        assert self.proc.alive(), self.proc.log_tail()
        stub = health_pb2_grpc.HealthStub(self.channel)
        status = stub.Check(health_pb2.HealthCheckRequest(service=SERVICE), timeout=5).status
        assert status == health_pb2.HealthCheckResponse.SERVING
        request = pb.AllocateRequest(namespace="ok", prompt_ids=["a", "b"], n_per_prompt=8)
        reply = pb.AllocateResponse.FromString(self.raw("Allocate", request.SerializeToString()))
        assert list(reply.counts) == [8, 8]


@pytest.fixture(scope="module")
def allocator(redis_server: str, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Allocator]:
    port, metrics_port = free_port(), free_port()
    env = {**os.environ, "DYNAMO_CONTROL_TOKEN": CONTROL_TOKEN}
    log = tmp_path_factory.mktemp("allocator") / "allocator.log"
    proc, _addr = SERVICES["allocator"].start(
        log, "--redis-url", redis_server, "--metrics-port", str(metrics_port),
        "allocator.max_prompts_per_request=1000", "run.log_level=debug",
        port=port, env=env, cwd=REPO,
    )  # fmt: skip
    try:
        proc.wait_ready(grpc_healthy(f"127.0.0.1:{port}", SERVICE), timeout=60)
        server = Allocator(proc, port, metrics_port)
        yield server
        server.channel.close()
    finally:
        proc.stop()


# Bytes no request message parses from: a truncated length, a bad tag, invalid UTF-8 in a string.
UNPARSABLE = [
    b"\xff\xff\xff",  # field number 0 / truncated varint
    b"\x0a\x10abc",  # namespace: length 16, 3 bytes follow
    b"\x0a\x02\xff\xfe",  # namespace: not UTF-8
    b"\x12\x05ab",  # repeated field 2: truncated
    b"\x80",  # a lone continuation byte
    b"\x0b\x12\x01a",  # a group start without its end
]


@pytest.mark.parametrize("method", METHODS)
@pytest.mark.parametrize("payload", UNPARSABLE, ids=lambda p: p.hex())
def test_bytes_that_are_not_the_message_are_invalid_argument(
    allocator: Allocator, method: str, payload: bytes
) -> None:
    err = allocator.raw(method, payload, token=CONTROL_TOKEN)
    assert isinstance(err, grpc.RpcError)
    assert err.code() == grpc.StatusCode.INVALID_ARGUMENT, err.details()
    assert f"not a valid dynamo.v1.{method}Request message" in err.details()


def test_random_bytes_never_give_internal_errors(allocator: Allocator) -> None:
    rng = random.Random(10)
    for i in range(60):
        payload = rng.randbytes(rng.randint(1, 64))
        for method in METHODS:
            got = allocator.raw(method, payload)
            if isinstance(got, grpc.RpcError):
                assert got.code() in CLEAN, (i, method, payload, got.code(), got.details())
    allocator.assert_healthy()


def _ns_varint() -> bytes:
    return b"\x08\x07"  # field 1 (namespace, a string) sent as a varint


def _ns_fixed64() -> bytes:
    return b"\x09" + b"\x00" * 8  # field 1 as a fixed64


# (method, request bytes, regex the error must match): wrong wire types and out-of-domain values.
WRONG = [
    ("Allocate", _ns_varint() + b"\x12\x01a", "namespace"),
    ("GetStats", _ns_fixed64() + b"\x12\x01a", "namespace"),
    ("ExportNamespace", _ns_varint(), "namespace"),
    ("ReportOutcomes", _ns_varint(), "namespace"),
    ("Allocate", pb.AllocateRequest(namespace="a {b}", prompt_ids=["x"]).SerializeToString(),
     "namespace"),
    ("Allocate", pb.AllocateRequest(namespace="e", prompt_ids=["x", "x"]).SerializeToString(),
     r"prompt_ids\[1\]"),
    ("Allocate", pb.AllocateRequest(namespace="e", prompt_ids=["x", ""]).SerializeToString(),
     r"prompt_ids\[1\]"),
    ("Allocate", pb.AllocateRequest(namespace="e", prompt_ids=["x\x00"]).SerializeToString(),
     r"prompt_ids\[0\]"),
    ("Allocate", pb.AllocateRequest(namespace="e", prompt_ids=["x"],
                                    mastery_threshold=math.nan).SerializeToString(),
     "mastery_threshold"),
    ("Allocate", pb.AllocateRequest(namespace="e", prompt_ids=["x"],
                                    min_priority=math.inf).SerializeToString(), "min_priority"),
    ("Allocate", pb.AllocateRequest(namespace="e", prompt_ids=["x"],
                                    n_min=-(2**31)).SerializeToString(), "n_min"),
    ("Allocate", pb.AllocateRequest(namespace="e", prompt_ids=["x"],
                                    budget=-(2**63)).SerializeToString(), "budget"),
    ("Allocate", pb.AllocateRequest(namespace="e", prompt_ids=["x"],
                                    n_per_prompt=-5).SerializeToString(), "n_per_prompt"),
    ("Allocate", pb.AllocateRequest(namespace="e", prompt_ids=["x"],
                                    initial_budget=-1).SerializeToString(), "initial_budget"),
    ("Allocate", pb.AllocateRequest(namespace="e", prompt_ids=["x"],
                                    priority="varianse").SerializeToString(), "priority"),
    ("Allocate", pb.AllocateRequest(namespace="e", prompt_ids=["x"],
                                    scheme="\u202e").SerializeToString(), "scheme"),
    ("ReportOutcomes", pb.ReportOutcomesRequest(namespace="e", outcomes=[
        pb.Outcome(prompt_id="a", attempts=2**62, successes=2**63 - 1)]).SerializeToString(),
     r"outcomes\[0\]\.successes"),
    ("ReportOutcomes", pb.ReportOutcomesRequest(namespace="e", outcomes=[
        pb.Outcome(prompt_id="", attempts=1, successes=0)]).SerializeToString(), r"outcomes\[0\]"),
    ("GetStats", pb.GetStatsRequest(namespace="e", prompt_ids=["a", "a"]).SerializeToString(),
     r"prompt_ids\[1\]"),
]  # fmt: skip


@pytest.mark.parametrize(("method", "payload", "field"), WRONG)
def test_wrong_types_and_values_name_the_field(
    allocator: Allocator, method: str, payload: bytes, field: str
) -> None:
    err = allocator.raw(method, payload)
    assert isinstance(err, grpc.RpcError), f"accepted: {payload!r}"
    assert err.code() == grpc.StatusCode.INVALID_ARGUMENT, err.details()
    assert re.search(field, err.details()), err.details()


def test_huge_repeated_fields(allocator: Allocator) -> None:
    # Over allocator.max_prompts_per_request (1000 here): refused naming the limit, nothing stored.
    ids = [f"p{i}" for i in range(1001)]
    for method, request in [
        ("Allocate", pb.AllocateRequest(namespace="big", prompt_ids=ids)),
        ("GetStats", pb.GetStatsRequest(namespace="big", prompt_ids=ids)),
        ("ReportOutcomes", pb.ReportOutcomesRequest(
            namespace="big", outcomes=[pb.Outcome(prompt_id=p, attempts=1) for p in ids])),
    ]:  # fmt: skip
        err = allocator.raw(method, request.SerializeToString())
        assert isinstance(err, grpc.RpcError) and err.code() == grpc.StatusCode.INVALID_ARGUMENT
        assert "max_prompts_per_request" in err.details(), err.details()
    export = pb.ExportNamespaceRequest(namespace="big").SerializeToString()
    assert (
        b'"prompts": {}'
        in pb.ExportNamespaceResponse.FromString(
            allocator.raw("ExportNamespace", export)
        ).json.encode()
    )
    # Past the 64 MiB message limit grpc itself refuses the request before the handler runs.
    blob = "x" * (1 << 20)
    big = pb.GetStatsRequest(namespace="big", prompt_ids=[f"{i}{blob}" for i in range(66)])
    err = allocator.raw("GetStats", big.SerializeToString())
    assert isinstance(err, grpc.RpcError) and err.code() == grpc.StatusCode.RESOURCE_EXHAUSTED
    # A million tiny ids in one message: one clean refusal, not a stalled server.
    many = pb.AllocateRequest(namespace="big", prompt_ids=[str(i) for i in range(1_000_000)])
    err = allocator.raw("Allocate", many.SerializeToString())
    assert isinstance(err, grpc.RpcError) and err.code() == grpc.StatusCode.INVALID_ARGUMENT
    allocator.assert_healthy()


def test_reset_needs_the_token_and_the_token_is_never_logged(allocator: Allocator) -> None:
    report = pb.ReportOutcomesRequest(
        namespace="tok", outcomes=[pb.Outcome(prompt_id="a", attempts=4, successes=2)]
    )
    assert not isinstance(allocator.raw("ReportOutcomes", report.SerializeToString()), Exception)
    reset = pb.ResetNamespaceRequest(namespace="tok").SerializeToString()
    for token in (
        None,
        "",
        "wrong",
        CONTROL_TOKEN[:-1],
        CONTROL_TOKEN + "x",
        CONTROL_TOKEN.upper(),
    ):
        err = allocator.raw("ResetNamespace", reset, token=token)
        assert isinstance(err, grpc.RpcError) and err.code() == grpc.StatusCode.UNAUTHENTICATED
    reply = pb.ResetNamespaceResponse.FromString(
        allocator.raw("ResetNamespace", reset, token=CONTROL_TOKEN)
    )
    assert reply.prompts_removed == 1
    metrics = httpx.get(allocator.metrics_url, timeout=10).text
    assert 'method="ResetNamespace"' in metrics
    assert_not_leaked(CONTROL_TOKEN, metrics, allocator.proc.log_path)
    allocator.assert_healthy()


def test_public_bind_without_a_token_is_refused() -> None:
    env = {k: v for k, v in os.environ.items() if k != "DYNAMO_CONTROL_TOKEN"}
    port = free_port()
    for host in ("0.0.0.0", "::", "192.0.2.1", "example.org"):  # "::" once broke the YAML parse
        out = subprocess.run(
            dynamo_rl_argv("allocator", "--host", host, "--port", str(port), "--metrics-port", "0"),
            capture_output=True, text=True, env=env, cwd=REPO, timeout=60,
        )  # fmt: skip
        assert out.returncode == 2, out.stderr
        assert "allocator.host" in out.stderr and "control token" in out.stderr, out.stderr
        assert "Traceback" not in out.stderr
