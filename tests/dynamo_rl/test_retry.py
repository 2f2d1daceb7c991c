"""The one retry policy: capped, jittered delays; sync and async wrappers; exhaustion."""

from __future__ import annotations

import asyncio
import random

import pytest

from dynamo_rl.retry import Backoff, RetryExhausted, Retrying, RetryPolicy, aretry_call, retry_call


def test_delays_double_then_cap_and_jitter_only_shortens():
    b = Backoff(base_s=0.5, cap_s=4.0, jitter=0.0)
    assert [b.delay(k) for k in range(6)] == [0.5, 1.0, 2.0, 4.0, 4.0, 4.0]
    j = Backoff(base_s=0.5, cap_s=4.0, jitter=0.5)
    rng = random.Random(0)
    for k in range(8):
        d = j.delay(k, rng=rng)
        raw = min(0.5 * 2**k, 4.0)
        assert raw * 0.5 <= d <= raw


def test_jitter_spreads_a_fleet():
    b = Backoff(base_s=1.0, cap_s=1.0, jitter=0.5)
    rng = random.Random(1)
    assert len({round(b.delay(3, rng=rng), 6) for _ in range(20)}) > 10


def test_hint_raises_the_delay_but_is_bounded():
    b = Backoff(base_s=0.1, cap_s=1.0, jitter=0.0)
    assert b.delay(0, hint_s=3.0) == 3.0
    assert b.delay(0, hint_s=100.0) == 6.0  # 6 x cap by default
    assert Backoff(base_s=0.1, cap_s=1.0, jitter=0.0, hint_cap_s=2.0).delay(0, hint_s=9) == 2.0
    assert b.delay(3, hint_s=0.01) == 0.8  # a shorter hint never shortens the back-off


def test_huge_attempt_numbers_do_not_overflow():
    assert Backoff(base_s=1.0, cap_s=7.0, jitter=0.0).delay(10_000) == 7.0


@pytest.mark.parametrize(
    "kwargs", [dict(base_s=-1), dict(base_s=2, cap_s=1), dict(jitter=1.0), dict(jitter=-0.1)]
)
def test_bad_policies_are_refused(kwargs):
    with pytest.raises(ValueError):
        Backoff(**kwargs)


def test_retrying_counts_calls_hook_and_gives_up_after_max_attempts():
    seen: list[tuple[str, float]] = []
    r = Retrying("peer", Backoff(0.1, 0.1, 0.0), max_attempts=2, on_retry=lambda *a: seen.append(a))
    assert r.next_delay("down") == 0.1
    assert r.next_delay("down") == 0.1
    with pytest.raises(RetryExhausted, match="peer: gave up after 2 retries: down"):
        r.next_delay("down")
    assert seen == [("down", 0.1), ("down", 0.1)]
    r.reset()
    assert r.next_delay("again") == 0.1


def test_retrying_gives_up_after_max_wait(monkeypatch):
    now = [100.0]
    monkeypatch.setattr("dynamo_rl.retry.time.monotonic", lambda: now[0])
    r = Retrying("reward", Backoff(0.1, 0.1, 0.0), max_wait_s=5.0)
    r.next_delay("503")
    now[0] = 104.0
    r.next_delay("503")
    now[0] = 106.0
    with pytest.raises(RetryExhausted, match="unavailable for 6s"):
        r.next_delay("503")


def test_retry_call_retries_only_what_it_is_told():
    calls = []
    sleeps: list[float] = []

    def flaky() -> str:
        calls.append(1)
        if len(calls) < 3:
            raise ConnectionError("refused")
        return "ok"

    r = Retrying("x", Backoff(0.2, 1.0, 0.0))
    assert retry_call(flaky, retry_on=(ConnectionError,), retrying=r, sleep=sleeps.append) == "ok"
    assert sleeps == [0.2, 0.4]

    def bad() -> None:
        raise ValueError("not retryable")

    with pytest.raises(ValueError):
        retry_call(bad, retry_on=(ConnectionError,), retrying=Retrying("x"), sleep=sleeps.append)
    assert sleeps == [0.2, 0.4]


def test_retry_call_reraises_the_last_error_when_exhausted():
    def down() -> None:
        raise ConnectionError("still down")

    r = Retrying("x", Backoff(0.0, 0.0, 0.0), max_attempts=3)
    with pytest.raises(ConnectionError, match="still down"):
        retry_call(
            down,
            retry_on=lambda e: isinstance(e, ConnectionError),
            retrying=r,
            sleep=lambda s: None,
        )
    assert r.attempts == 3


def test_aretry_call_retries_and_never_swallows_cancellation():
    calls = []

    async def flaky() -> int:
        calls.append(1)
        if len(calls) < 2:
            raise TimeoutError
        return 7

    r = Retrying("x", Backoff(0.0, 0.0, 0.0))
    assert asyncio.run(aretry_call(flaky, retry_on=(TimeoutError,), retrying=r)) == 7

    async def cancelled() -> None:
        raise asyncio.CancelledError

    with pytest.raises(asyncio.CancelledError):
        asyncio.run(aretry_call(cancelled, retry_on=lambda e: True, retrying=Retrying("x")))


def test_a_policy_gives_each_operation_a_fresh_retrying_with_its_settings():
    seen: list[tuple[str, float]] = []
    backoff = Backoff(0.1, 0.4)
    policy = RetryPolicy(
        backoff, max_attempts=3, max_wait_s=9.0, on_retry=lambda *a: seen.append(a)
    )
    first = policy.start("peer op")
    assert (first.what, first.backoff, first.max_attempts, first.max_wait_s) == (
        "peer op",
        backoff,
        3,
        9.0,
    )
    first.next_delay("down")
    second = policy.start("peer op")
    assert second.attempts == 0 and first.attempts == 1  # no state shared between operations
    second.next_delay("down")
    assert [reason for reason, _ in seen] == ["down", "down"]


def test_every_client_builds_its_policy_from_the_same_keywords():
    """The allocator, reward and sandbox clients keep their keywords and their defaults."""
    from dynamo_rl.clients.allocator import AllocatorClient
    from dynamo_rl.envs.sandbox import SandboxClient
    from services.rollout.reward_client import RewardClient

    hook = print
    allocator = AllocatorClient("127.0.0.1:1", retries=5, backoff_s=0.2, backoff_max_s=0.8,
                                on_retry=hook)  # fmt: skip
    assert allocator.retry == RetryPolicy(Backoff(0.2, 0.8), max_attempts=5, on_retry=hook)
    assert AllocatorClient("127.0.0.1:1").retry == RetryPolicy(Backoff(0.1, 2.0), max_attempts=3)
    allocator.close()
    reward = RewardClient("http://x", backoff_s=0.3, max_wait_s=0.0, on_retry=hook)
    assert reward.retry == RetryPolicy(
        Backoff(0.3, 10.0), max_wait_s=None, on_retry=hook
    )  # 0: no limit
    assert RewardClient("http://x", max_wait_s=5.0).retry.max_wait_s == 5.0
    sandbox = SandboxClient("http://x", backoff_max_s=4.0)
    assert sandbox.retry == RetryPolicy(Backoff(0.5, 4.0), max_wait_s=30.0)
