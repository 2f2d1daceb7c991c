"""Bad requests to the allocator service: ``INVALID_ARGUMENT`` naming the field, never retried,
changing nothing; the control token; a bad config refused at start."""

from __future__ import annotations

import re
import subprocess

import grpc
import pytest

from allocator.server import RunningServer
from dynamo_rl.clients.allocator import AllocatorClient
from tests.allocator.helpers import requests_total, start_allocator
from tests.conftest import REPO, dynamo_rl_argv

BAD_ALLOCATE = [
    ({"namespace": ""}, "namespace"),
    ({"namespace": "a b"}, "namespace"),
    ({"n_min": 10, "n_max": 8}, "n_min"),
    ({"n_min": -1}, "n_min"),
    ({"n_max": 0}, "n_max"),
    ({"budget": -1, "n_per_prompt": None}, "budget"),
    ({"n_per_prompt": 0}, "n_per_prompt"),
    ({"prompt_ids": ["a", "b", "a"]}, r"prompt_ids\[2\]: duplicate"),
    ({"prompt_ids": ["a", ""]}, r"prompt_ids\[1\]: empty"),
    ({"prompt_ids": ["a", "b\0c"]}, r"prompt_ids\[1\]: .*NUL"),
    ({"prompt_ids": [f"p{i}" for i in range(101)]}, "max_prompts_per_request"),
    ({"priority": "entropy"}, "priority"),
    ({"scheme": "greedy"}, "scheme"),
    ({"mastery_threshold": 1.5}, "mastery_threshold"),
    ({"min_priority": -0.1}, "min_priority"),
    ({"initial_budget": -2}, "initial_budget"),
]


@pytest.mark.parametrize(("change", "field"), BAD_ALLOCATE)
def test_bad_allocate_is_invalid_argument_naming_the_field(
    server: RunningServer, client: AllocatorClient, change: dict, field: str
) -> None:
    args: dict = {"namespace": "exp", "prompt_ids": ["a", "b"], "n_per_prompt": 8, **change}
    with pytest.raises(grpc.RpcError) as err:
        client.allocate(args.pop("namespace"), args.pop("prompt_ids"), **args)
    assert err.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert err.value.details() is not None

    assert re.search(field, err.value.details()), err.value.details()


BAD_REPORTS = [
    ([("a", -1, 0)], r"outcomes\[0\]\.attempts"),
    ([("a", 2, -1)], r"outcomes\[0\]\.successes"),
    ([("a", 4, 1), ("b", 2, 3)], r"outcomes\[1\]\.successes: 3 is more than attempts 2"),
    ([("a", 4, 1), ("a", 2, 1)], r"outcomes\[1\]: duplicate"),
    ([(f"p{i}", 1, 0) for i in range(101)], "max_prompts_per_request"),
]


@pytest.mark.parametrize(("outcomes", "field"), BAD_REPORTS)
def test_bad_report_is_invalid_argument_and_changes_nothing(
    server: RunningServer, client: AllocatorClient, outcomes: list, field: str
) -> None:
    with pytest.raises(grpc.RpcError) as err:
        client.report_outcomes("exp", outcomes)
    assert err.value.code() == grpc.StatusCode.INVALID_ARGUMENT

    assert re.search(field, err.value.details()), err.value.details()
    assert client.export_namespace("exp")["prompts"] == {}


def test_invalid_argument_is_not_retried(server: RunningServer) -> None:
    with (
        AllocatorClient(f"127.0.0.1:{server.port}", retries=3, backoff_s=0.01) as c,
        pytest.raises(grpc.RpcError),
    ):
        c.allocate("exp", ["a"], 8, n_min=9, n_max=8)
    assert requests_total(server, "Allocate", "INVALID_ARGUMENT") == 1


def test_reset_needs_the_control_token(redis_url: str) -> None:
    running = start_allocator(redis_url, control_token="s3cret")
    try:
        addr = f"127.0.0.1:{running.port}"
        with AllocatorClient(addr) as anonymous:
            anonymous.report_outcomes("exp", [("a", 1, 1)])
            with pytest.raises(grpc.RpcError) as err:
                anonymous.reset_namespace("exp")
            assert err.value.code() == grpc.StatusCode.UNAUTHENTICATED
        with AllocatorClient(addr, control_token="s3cret") as admin:
            assert admin.reset_namespace("exp") == 1
    finally:
        running.stop(grace=0.5)


@pytest.mark.slow
def test_bad_config_exits_2_naming_the_key() -> None:
    result = subprocess.run(
        dynamo_rl_argv("allocator", "allocator.n_min=30", "allocator.n_max=8"),
        capture_output=True,
        text=True,
        timeout=60,
        cwd=REPO,
    )
    assert result.returncode == 2
    assert "allocator.n_min" in result.stderr and "Traceback" not in result.stderr
