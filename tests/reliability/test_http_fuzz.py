"""Schema fuzzing of the reward service and the embedded engine, from their own OpenAPI specs.

Each service runs as a real process on a free loopback port. schemathesis draws requests from the
``/openapi.json`` the service publishes, both schema-valid ones (positive) and ones that break the
schema on purpose (negative), and every answer must hold: no 5xx, the process alive, and every 422
names the field it is about (a non-empty ``loc`` and, for the reward service, a ``field``; for the
engine the OpenAI-style ``error.param``). The budget per operation and mode is
``FUZZ_EXAMPLES`` (``DYNAMO_FUZZ_EXAMPLES`` raises it for a longer run).

The engine runs with a control token, so fuzzed weight control (either protocol) without it is
a 401; ``/update_weights_from_disk`` is also fuzzed with the token (``/init_weights_update_group``
is not: it would connect to whatever address the fuzzer draws, possibly off this machine).
"""

from __future__ import annotations

import json
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
import schemathesis
from hypothesis import HealthCheck, given, settings

from learner.tiny_model import build_tiny_model
from tests.reliability.helpers import CONTROL_TOKEN, FUZZ_EXAMPLES, assert_not_leaked
from tests.services.engine.engine_util import start_engine
from tests.services.reward.conftest import RewardServer, start_reward_server

MODES = [schemathesis.GenerationMode.POSITIVE, schemathesis.GenerationMode.NEGATIVE]
# Answers a fuzzed request may get: success, a named rejection, auth, size, back-off.
ALLOWED = {200, 400, 401, 404, 405, 413, 415, 422, 429, 503}


# POSTs that take neither a body nor parameters: like GETs, they have no negative cases.
NO_INPUT = {"/resume", "/start_weight_update", "/reset_prefix_cache"}


def _with_modes(ops: list[tuple[str, str]]) -> list[Any]:
    """Both modes for operations with a body; GETs without parameters have no negative cases."""
    return [
        pytest.param(path, method, mode, id=f"{method} {path} {mode.value}")
        for path, method in ops
        for mode in MODES
        if (method == "POST" and path not in NO_INPUT)
        or mode is schemathesis.GenerationMode.POSITIVE
    ]


def fuzz_operation(
    schema: Any,
    path: str,
    method: str,
    base_url: str,
    check: Callable[[Any, Any], None],
    mode: schemathesis.GenerationMode,
    headers: dict[str, str] | None = None,
) -> int:
    """Send ``FUZZ_EXAMPLES`` generated requests to one operation; return how many were sent."""
    strategy = schema[path][method].as_strategy(generation_mode=mode)
    sent = 0

    @settings(
        max_examples=FUZZ_EXAMPLES,
        deadline=None,
        database=None,
        derandomize=True,
        suppress_health_check=list(HealthCheck),
    )
    @given(case=strategy)
    def one(case: Any) -> None:
        nonlocal sent
        response = case.call(base_url=base_url, headers=headers, timeout=60)
        sent += 1
        check(case, response)

    one()
    return sent


def _json(response: Any) -> Any:
    try:
        return response.json()
    except (ValueError, json.JSONDecodeError):
        return None


def _common(case: Any, response: Any) -> Any:
    where = f"{case.method} {case.path} body={str(case.body)[:300]!r}"
    assert response.status_code < 500, f"{where} -> {response.status_code} {response.text[:500]}"
    assert response.status_code in ALLOWED, f"{where} -> {response.status_code} {response.text}"
    body = _json(response)
    if response.status_code == 422:
        assert isinstance(body, dict) and body.get("detail"), f"{where} -> {response.text}"
        for entry in body["detail"]:
            assert entry.get("loc") and entry.get("msg"), f"{where} -> {response.text}"
    return body


# -- reward service ----------------------------------------------------------------------------


@pytest.fixture(scope="module")
def reward(tmp_path_factory: pytest.TempPathFactory) -> Iterator[RewardServer]:
    # Short limits: fuzzed programs and answers must not hold the machine. The reward service has
    # no control endpoint; it gets the token in its environment (as in compose) and must not
    # reveal it anywhere.
    with pytest.MonkeyPatch.context() as env:
        env.setenv("DYNAMO_CONTROL_TOKEN", CONTROL_TOKEN)
        server = start_reward_server(
            tmp_path_factory.mktemp("reward-fuzz"),
            ["reward.code.max_timeout_s=2", "reward.code.compile_timeout_s=5",
             "reward.math.timeout_s=3", "reward.max_items=64", "reward.code.max_cases=8"],
        )  # fmt: skip
    try:
        yield server
    finally:
        server.proc.stop()


def test_reward_token_never_in_logs_metrics_or_sandbox(reward: RewardServer) -> None:
    code = "import os\nprint(open('/proc/1/environ','rb').read(), dict(os.environ))"
    r = httpx.post(f"{reward.url}/run_code", json={"code": code, "language": "python"}, timeout=60)
    assert r.status_code == 200 and r.json()["run_result"]["stdout"], r.text
    assert CONTROL_TOKEN not in r.text
    metrics = httpx.get(f"{reward.url}/metrics", timeout=10).text
    assert "dynamo_reward_requests_total" in metrics
    assert_not_leaked(CONTROL_TOKEN, metrics, reward.proc.log_path)


def check_reward(case: Any, response: Any) -> None:
    body = _common(case, response)
    if response.status_code == 422:
        for entry in body["detail"]:
            assert entry.get("field"), f"422 without a field name: {response.text}"
    if response.status_code == 200 and case.path == "/v1/verify":
        items = case.body["items"]
        results = body["results"]
        assert [r["id"] for r in results] == [i["id"] for i in items]
        assert all(r["reason"] != "internal_error" for r in results), results


REWARD_OPS = [("/v1/verify", "POST"), ("/run_code", "POST"), ("/healthz", "GET")]


@pytest.mark.parametrize(("path", "method", "mode"), _with_modes(REWARD_OPS))
def test_reward_api_fuzz(
    reward: RewardServer, path: str, method: str, mode: schemathesis.GenerationMode
) -> None:
    schema = schemathesis.openapi.from_url(f"{reward.url}/openapi.json")
    sent = fuzz_operation(schema, path, method, reward.url, check_reward, mode)
    assert sent >= 1
    reward.assert_serving()


# Bodies a schema cannot express: not JSON, the wrong shape, huge numbers, lone surrogates,
# another content type.
MALFORMED = [
    (b"{", "application/json"),
    (b"[]", "application/json"),
    (b"null", "application/json"),
    (b'{"items": [{"id": "a", "kind": "math", "response": 1e999, "ground_truth": "1"}]}',
     "application/json"),
    (b'{"items": [{"id": "a", "kind": "math", "response": "x", "ground_truth": "\\ud800"}]}',
     "application/json"),
    (b"items=1", "application/x-www-form-urlencoded"),
]  # fmt: skip
# Bodies FastAPI's own parser fails on before validation (bare 400 unless the app maps it).
UNDECODABLE = [
    (b"\xff\xfe", "application/json"),
    (b'{"items": [' + b"[" * 5000 + b"]" * 5000 + b"]}", "application/json"),
]


def _post_raw(url: str, raw: bytes, ctype: str) -> httpx.Response:
    return httpx.post(url, content=raw, headers={"content-type": ctype}, timeout=60)


def test_reward_malformed_bodies_name_the_field(reward: RewardServer) -> None:
    for raw, ctype in MALFORMED:
        r = _post_raw(f"{reward.url}/v1/verify", raw, ctype)
        assert r.status_code in (200, 422), (raw[:60], r.status_code, r.text[:300])
        if r.status_code == 422:
            assert all(e["field"] for e in r.json()["detail"]), r.text
    reward.assert_serving()


def test_reward_undecodable_bodies_are_422_naming_the_body(reward: RewardServer) -> None:
    for raw, ctype in UNDECODABLE:
        r = _post_raw(f"{reward.url}/v1/verify", raw, ctype)
        assert r.status_code == 422, (raw[:60], r.status_code, r.text[:300])
        assert r.json()["detail"][0]["field"] == "body"
    reward.assert_serving()


# -- embedded engine ---------------------------------------------------------------------------


@pytest.fixture(scope="module")
def engine(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[Any, str]]:
    model = build_tiny_model(
        tmp_path_factory.mktemp("tiny") / "model",
        hidden_size=16, num_layers=1, num_heads=2, num_kv_heads=1, max_positions=64,
    )  # fmt: skip
    proc, url = start_engine(
        model,
        tmp_path_factory.mktemp("engine-fuzz"),
        "engine.max_new_tokens=16",
        "engine.default_max_tokens=4",
        "engine.register_in_redis=false",
        "engine.weight_update_timeout_s=5",
        "run.log_level=debug",
        env={"DYNAMO_CONTROL_TOKEN": CONTROL_TOKEN},
    )
    try:
        yield proc, url
    finally:
        proc.stop()


def check_engine(case: Any, response: Any) -> None:
    body = _common(case, response)
    if response.status_code == 422 and case.path in ("/v1/completions", "/generate"):
        assert body.get("error", {}).get("param"), f"422 without error.param: {response.text}"
    if case.path.startswith(CONTROL_PREFIXES):
        # No token sent: refused (a body that does not parse is refused before the token check).
        assert response.status_code in (401, 422), (case.media_type, case.body, response.text)


# Weight control of both protocols (SGLang- and vLLM-shaped): all need the token.
CONTROL_PREFIXES = (
    "/init_weight", "/update_weights", "/pause", "/resume", "/start_weight_update",
    "/finish_weight_update", "/reset_prefix_cache",
)  # fmt: skip

ENGINE_OPS = [
    ("/v1/completions", "POST"),
    ("/pause", "POST"),
    ("/resume", "POST"),
    ("/init_weight_transfer_engine", "POST"),
    ("/start_weight_update", "POST"),
    ("/update_weights", "POST"),
    ("/finish_weight_update", "POST"),
    ("/reset_prefix_cache", "POST"),
    ("/weight_info", "GET"),
    ("/is_paused", "GET"),
    ("/generate", "POST"),
    ("/init_weights_update_group", "POST"),
    ("/update_weights_from_distributed", "POST"),
    ("/update_weights_from_disk", "POST"),
    ("/get_weight_version", "GET"),
    ("/v1/models", "GET"),
]


def _engine_ok(proc: Any, url: str) -> None:
    assert proc.alive(), proc.log_tail()
    r = httpx.post(
        f"{url}/v1/completions",
        json={"prompt": [5, 6], "max_tokens": 2, "return_token_ids": True},
        timeout=60,
    )
    assert r.status_code == 200 and len(r.json()["choices"][0]["token_ids"]) <= 2, r.text
    assert httpx.get(f"{url}/get_weight_version", timeout=10).json() == {"weight_version": 0}


@pytest.mark.parametrize(("path", "method", "mode"), _with_modes(ENGINE_OPS))
def test_engine_api_fuzz(
    engine: tuple[Any, str], path: str, method: str, mode: schemathesis.GenerationMode
) -> None:
    proc, url = engine
    schema = schemathesis.openapi.from_url(f"{url}/openapi.json")
    assert fuzz_operation(schema, path, method, url, check_engine, mode) >= 1
    _engine_ok(proc, url)


@pytest.mark.parametrize("mode", MODES, ids=lambda m: m.value)
def test_engine_weight_update_from_disk_fuzz_with_token(
    engine: tuple[Any, str], mode: schemathesis.GenerationMode, tmp_path: Path
) -> None:
    proc, url = engine
    schema = schemathesis.openapi.from_url(f"{url}/openapi.json")
    headers = {"Authorization": f"Bearer {CONTROL_TOKEN}"}

    def check(case: Any, response: Any) -> None:
        body = _common(case, response)
        # No fuzzed path is a loadable export: refused whole, the version unchanged.
        assert response.status_code in (400, 422), response.text
        if response.status_code == 400:  # the endpoint's own refusal, not a parse error
            assert body["success"] is False and body["message"], response.text

    sent = fuzz_operation(
        schema, "/update_weights_from_disk", "POST", url, check, mode, headers=headers
    )
    assert sent >= 1
    _engine_ok(proc, url)


def test_engine_malformed_bodies_name_the_field(engine: tuple[Any, str]) -> None:
    proc, url = engine
    token = {"authorization": f"Bearer {CONTROL_TOKEN}"}
    for path in ("/v1/completions", "/generate", "/update_weights_from_disk"):
        for raw, ctype in MALFORMED + UNDECODABLE:
            r = httpx.post(
                f"{url}{path}", content=raw, headers={"content-type": ctype, **token}, timeout=60
            )
            assert r.status_code in (400, 422), (path, raw[:60], r.status_code, r.text[:300])
            body = r.json()
            if r.status_code == 422:
                assert body["detail"][0]["loc"], r.text
                assert path == "/update_weights_from_disk" or body["error"]["param"], r.text
            else:  # only the weight loader's own refusal of a parsed request
                assert path == "/update_weights_from_disk" and body["success"] is False, r.text
    _engine_ok(proc, url)


def test_engine_token_never_in_logs_or_metrics(engine: tuple[Any, str]) -> None:
    proc, url = engine
    good = {"Authorization": f"Bearer {CONTROL_TOKEN}"}
    for headers in ({}, {"Authorization": f"Bearer {CONTROL_TOKEN}x"}, good):
        r = httpx.post(
            f"{url}/update_weights_from_disk",
            json={"model_path": "/nonexistent"},
            headers=headers,
            timeout=60,
        )
        assert r.status_code == (400 if headers is good else 401), r.text
        assert CONTROL_TOKEN not in r.text
    metrics = httpx.get(f"{url}/metrics", timeout=10).text
    assert "dynamo_engine_requests_total" in metrics
    assert_not_leaked(CONTROL_TOKEN, metrics, proc.log_path)
