"""HTTP surface of a real server: health, metrics, OpenAPI, and 422s that name the field."""

from __future__ import annotations

import json
from typing import Any

import httpx
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from tests.services.reward.conftest import RewardServer

MATH = {"id": 1, "kind": "math", "response": r"\boxed{1}", "ground_truth": "1"}
CODE = {"id": 2, "kind": "code", "response": "print(1)",
        "tests": {"type": "stdio", "cases": [{"stdout": "1"}]}}  # fmt: skip


def test_healthz(reward: RewardServer) -> None:
    body = httpx.get(f"{reward.url}/healthz").json()
    assert body["status"] == "ok"
    assert body["kinds"] == ["math", "code", "reasoning_gym"]  # reasoning-gym is installed
    assert body["sandbox"] == "bwrap"


def test_openapi_docs(reward: RewardServer) -> None:
    assert httpx.get(f"{reward.url}/docs").status_code == 200
    spec = httpx.get(f"{reward.url}/openapi.json").json()
    assert {"/v1/verify", "/run_code", "/healthz", "/metrics"} <= set(spec["paths"])
    assert {"MathItem", "CodeItem", "RunCodeRequest"} <= set(spec["components"]["schemas"])


def test_metrics_count_requests_items_and_sandboxes(reward: RewardServer) -> None:
    reward.verify(MATH, CODE)
    text = httpx.get(f"{reward.url}/metrics").text
    for name in (
        'dynamo_reward_requests_total{code="200",route="/v1/verify"}',
        'dynamo_reward_items_total{kind="math",reason="ok"}',
        'dynamo_reward_items_total{kind="code",reason="ok"}',
        'dynamo_reward_request_duration_seconds_bucket{le="0.5",route="/v1/verify"}',
        'dynamo_reward_item_duration_seconds_count{kind="math"}',
        'dynamo_reward_queue_depth{kind="code"} 0.0',
        'dynamo_reward_sandbox_starts_total{status="finished"}',
        "dynamo_reward_sandbox_run_duration_seconds_count",
        "dynamo_reward_math_worker_restarts_total",
    ):
        assert name in text, name


def post(reward: RewardServer, path: str, body: Any) -> httpx.Response:
    content = body if isinstance(body, (bytes, str)) else json.dumps(body)
    return httpx.post(f"{reward.url}{path}", content=content,
                      headers={"content-type": "application/json"}, timeout=60)  # fmt: skip


def item(base: dict[str, Any], **changes: Any) -> dict[str, Any]:
    out = {**base, **changes}
    return {k: v for k, v in out.items() if v is not None}


INVALID: list[tuple[str, Any, str]] = [
    ("/v1/verify", b"{not json", "body"),
    ("/v1/verify", {}, "items"),
    ("/v1/verify", {"items": "x"}, "items"),
    ("/v1/verify", {"items": [], "extra": 1}, "extra"),
    ("/v1/verify", {"items": [item(MATH, ground_truth=None)]}, "items.0.ground_truth"),
    ("/v1/verify", {"items": [item(MATH, id=None)]}, "items.0.id"),
    ("/v1/verify", {"items": [item(MATH, kind="poetry")]}, "items.0.kind"),
    ("/v1/verify", {"items": [item(MATH, extraction="first_boxed")]}, "items.0.extraction"),
    ("/v1/verify", {"items": [item(MATH, surprise=True)]}, "items.0.surprise"),
    ("/v1/verify", {"items": [MATH, item(CODE, language="rust")]}, "items.1.language"),
    ("/v1/verify", {"items": [item(CODE, tests={"type": "fuzz"})]}, "items.0.tests.type"),
    ("/v1/verify", {"items": [item(CODE, tests={"type": "stdio", "cases": []})]},
     "items.0.tests.cases"),
    ("/v1/verify", {"items": [item(CODE, timeout_s=-1)]}, "items.0.timeout_s"),
    ("/v1/verify", {"items": [item(CODE, memory_mb=1)]}, "items.0.memory_mb"),
    ("/v1/verify", {"items": [item(CODE, language="cpp", tests={"type": "assert", "code": "x"})]},
     "items.0"),
    ("/run_code", {"code": "print(1)", "language": "rust"}, "language"),
    ("/run_code", {"code": "print(1)", "language": "python", "files": {"a": "b"}}, "files"),
    ("/run_code", {"code": "print(1)", "language": "python", "memory_limit_MB": 3},
     "memory_limit_MB"),
    ("/run_code", {"language": "python"}, "code"),
]  # fmt: skip


@pytest.mark.parametrize(("path", "body", "field"), INVALID)
def test_invalid_input_is_422_naming_the_field(
    reward: RewardServer, path: str, body: Any, field: str
) -> None:
    r = post(reward, path, body)
    assert r.status_code == 422, r.text
    fields = [d["field"] for d in r.json()["detail"]]
    assert field in fields, r.json()


def test_unsupported_value_lists_allowed_values(reward: RewardServer) -> None:
    r = post(reward, "/run_code", {"code": "print(1)", "language": "rust"})
    msg = r.json()["detail"][0]["msg"]
    assert "python" in msg and "cpp" in msg


json_values = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats(allow_nan=False) | st.text(max_size=20),
    lambda children: (
        st.lists(children, max_size=4) | st.dictionaries(st.text(max_size=10), children, max_size=4)
    ),
    max_leaves=12,
)
item_like = st.fixed_dictionaries(
    {"kind": st.sampled_from(["math", "code", "judge", 3])},
    optional={
        "id": json_values,
        "response": json_values,
        "ground_truth": json_values,
        "tests": json_values,
        "language": st.sampled_from(["python", "c", "cpp", "rust", None]),
        "timeout_s": json_values,
    },
)


@settings(max_examples=25, deadline=None, suppress_health_check=list(HealthCheck))
@given(body=json_values | st.fixed_dictionaries({"items": st.lists(item_like, max_size=3)}))
def test_client_mistakes_never_get_500(reward: RewardServer, body: Any) -> None:
    r = post(reward, "/v1/verify", body)
    assert r.status_code in (200, 422), r.text
    r = post(reward, "/run_code", body)
    assert r.status_code in (200, 422), r.text
