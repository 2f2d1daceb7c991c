"""Load and size limits of a real server started with small limits: 429 with Retry-After when a
kind is full, 413 for big bodies, 422 for too many items or cases, and the math timeout."""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator
from typing import Any

import httpx
import pytest

from tests.services.reward.conftest import RewardServer, start_reward_server

OVERRIDES = [
    "reward.code.concurrency=1",
    "reward.code.max_pending=1",
    "reward.code.max_cases=2",
    "reward.math.workers=1",
    "reward.math.max_pending=2",
    "reward.math.timeout_s=2",
    "reward.max_items=3",
    "reward.max_body_bytes=65536",
]
MATH = {"kind": "math", "response": r"\boxed{2}", "ground_truth": "2"}
SLOW_CODE = {"kind": "code", "response": "import time\ntime.sleep(2)\nprint(1)",
             "tests": {"type": "stdio", "cases": [{"stdout": "1"}]}, "timeout_s": 10}  # fmt: skip


@pytest.fixture(scope="module")
def small(tmp_path_factory: pytest.TempPathFactory) -> Iterator[RewardServer]:
    server = start_reward_server(tmp_path_factory.mktemp("reward-small"), OVERRIDES)
    try:
        yield server
    finally:
        server.proc.stop()


def verify(server: RewardServer, items: list[dict[str, Any]]) -> httpx.Response:
    return httpx.post(f"{server.url}/v1/verify", json={"items": items}, timeout=60)


def test_full_kind_gets_429_with_retry_after(small: RewardServer) -> None:
    first: list[httpx.Response] = []
    t = threading.Thread(target=lambda: first.append(verify(small, [{"id": 0, **SLOW_CODE}])))
    t.start()
    try:
        deadline = time.monotonic() + 20
        while httpx.get(f"{small.url}/healthz").json()["pending"]["code"] < 1:
            assert time.monotonic() < deadline, "the slow item was never admitted"
            time.sleep(0.02)
        busy = verify(small, [{"id": 1, **SLOW_CODE}])
        assert busy.status_code == 429, busy.text
        assert busy.headers["Retry-After"] == "1"
        assert "code queue full" in busy.json()["detail"]
        run = httpx.post(f"{small.url}/run_code", json={"code": "print(1)", "language": "python"})
        assert run.status_code == 429
        # Other kinds have their own budget: math is still served meanwhile.
        assert verify(small, [{"id": 2, **MATH}]).json()["results"][0]["correct"] is True
    finally:
        t.join()
    assert first[0].status_code == 200 and first[0].json()["results"][0]["correct"] is True
    # Once the slot is free the same request succeeds.
    assert verify(small, [{"id": 3, **SLOW_CODE}]).status_code == 200
    assert (
        'dynamo_reward_rejections_total{reason="queue_full"}'
        in httpx.get(f"{small.url}/metrics").text
    )


def test_hung_math_worker_scores_timeout_and_is_replaced(small: RewardServer) -> None:
    hang = {"id": "h", "kind": "math", "response": r"\boxed{9^{9^{9^{9^{9}}}}}",
            "ground_truth": "1"}  # fmt: skip
    res = verify(small, [hang]).json()["results"][0]
    assert (res["score"], res["correct"], res["reason"]) == (0.0, False, "timeout")
    # The only worker was killed; its replacement scores the next item.
    assert verify(small, [{"id": 1, **MATH}]).json()["results"][0]["correct"] is True
    metrics = httpx.get(f"{small.url}/metrics").text
    line = next(
        x for x in metrics.splitlines() if x.startswith("dynamo_reward_math_worker_restarts_total")
    )
    assert float(line.split()[-1]) >= 1


def test_too_many_items_is_422(small: RewardServer) -> None:
    r = verify(small, [{"id": i, **MATH} for i in range(4)])
    assert r.status_code == 422
    assert r.json()["detail"][0]["field"] == "items"
    assert "reward.max_items" in r.json()["detail"][0]["msg"]


def test_more_items_of_a_kind_than_it_admits_is_422_not_429(small: RewardServer) -> None:
    r = verify(small, [{"id": i, **MATH} for i in range(3)])  # math admits 2 at once
    assert r.status_code == 422, r.text
    assert r.json()["detail"][0]["field"] == "items"


def test_too_many_cases_is_422(small: RewardServer) -> None:
    cases = [{"stdin": "", "stdout": "1"}] * 3
    code = {
        "id": 0,
        "kind": "code",
        "response": "print(1)",
        "tests": {"type": "stdio", "cases": cases},
    }
    r = verify(small, [code])
    assert r.status_code == 422
    assert r.json()["detail"][0]["field"] == "items.0.tests.cases"


def test_body_over_limit_is_413(small: RewardServer) -> None:
    big = {"items": [{"id": 0, **MATH, "response": "x" * 70000}]}
    r = httpx.post(f"{small.url}/v1/verify", json=big, timeout=30)
    assert r.status_code == 413
    assert "reward.max_body_bytes" in r.json()["detail"]

    def chunks() -> Iterator[bytes]:  # no Content-Length: counted while reading
        yield b'{"items": [{"id": 0, "kind": "math", "ground_truth": "1", "response": "'
        for _ in range(20):
            yield b"x" * 8192
        yield b'"}]}'

    r = httpx.post(f"{small.url}/v1/verify", content=chunks(),
                   headers={"content-type": "application/json"}, timeout=30)  # fmt: skip
    assert r.status_code == 413
    small.assert_serving()
