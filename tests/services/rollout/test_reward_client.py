"""The reward client's retry policy against a real HTTP server that answers as a busy or failing
reward service does (429 with ``Retry-After``, 503), then recovers.

The happy path against the real reward service is in test_worker.py
(``test_reward_client_matches_results_by_id_and_refuses_bad_items``).
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Iterator
from typing import Any

import pytest

from dynamo_rl.contracts.reward import MathItem
from services.rollout.reward_client import RewardClient, RewardRequestError, RewardUnavailable
from tests.scripted_http import Script, scripted_server

ITEMS = [MathItem(kind="math", id="0:0:0", response="2", ground_truth="2")]


@pytest.fixture
def peer() -> Iterator[tuple[str, Script]]:
    with scripted_server() as served:
        yield served


def verify(url: str, **kw: Any) -> tuple[list[dict[str, Any]], list[float]]:
    delays: list[float] = []

    async def main() -> list[dict[str, Any]]:
        client = RewardClient(url, on_retry=lambda _r, d: delays.append(d), **kw)
        try:
            return await client.verify(ITEMS)
        finally:
            await client.aclose()

    return asyncio.run(main()), delays


def test_retry_after_is_honoured(peer: tuple[str, Script]) -> None:
    url, script = peer
    script.answers = [(429, {"Retry-After": "0.3"}), (503, {"Retry-After": "0.3"}), (200, {})]
    results, delays = verify(url, backoff_s=0.01, backoff_max_s=0.1)
    assert [r.id for r in results] == ["0:0:0"]
    assert delays == [0.3, 0.3]  # the hint, not the 10-20 ms of the back-off
    gaps = [b - a for a, b in zip(script.times, script.times[1:], strict=False)]
    assert len(gaps) == 2 and all(g >= 0.29 for g in gaps)


def test_retry_after_is_bounded_by_six_times_the_cap(peer: tuple[str, Script]) -> None:
    url, script = peer
    script.answers = [(429, {"Retry-After": "3600"}), (200, {})]
    t0 = time.monotonic()
    _, delays = verify(url, backoff_s=0.01, backoff_max_s=0.05)
    assert delays == [pytest.approx(0.3)]
    assert time.monotonic() - t0 < 5


def test_delays_without_a_hint_double_up_to_the_cap(peer: tuple[str, Script]) -> None:
    url, script = peer
    script.answers = [(503, {})] * 6 + [(200, {})]
    _, delays = verify(url, backoff_s=0.01, backoff_max_s=0.04)
    assert len(delays) == 6 and all(d <= 0.04 for d in delays)
    assert delays[0] <= 0.01 and delays[-1] >= 0.04 * 0.8  # jitter shortens by at most 20%


def test_an_unavailable_service_fails_after_max_wait(peer: tuple[str, Script]) -> None:
    url, script = peer
    script.answers = [(503, {})]
    t0 = time.monotonic()
    reason = r"unavailable for .*HTTP 503 \(rollout.reward_max_wait_s=0.3\)"
    with pytest.raises(RewardUnavailable, match=reason):
        verify(url, backoff_s=0.02, backoff_max_s=0.05, max_wait_s=0.3)
    assert 0.3 <= time.monotonic() - t0 < 3


def test_a_refused_request_is_not_retried(peer: tuple[str, Script]) -> None:
    url, script = peer
    script.answers = [(400, {})]
    with pytest.raises(RewardRequestError, match="answered 400"):
        verify(url, backoff_s=0.01, backoff_max_s=0.02)
    assert len(script.times) == 1
