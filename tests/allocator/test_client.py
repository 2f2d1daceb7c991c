"""The allocator client without a server: it retries ``UNAVAILABLE`` with capped delays, gives
up after ``retries``, and its async form waits without holding a thread."""

from __future__ import annotations

import asyncio
import time
from concurrent.futures import ThreadPoolExecutor

import grpc
import pytest

from dynamo_rl.clients.allocator import AllocatorClient
from dynamo_rl.procs import free_port


def _unreachable(
    delays: list[float], retries: int, backoff_s: float, backoff_max_s: float
) -> AllocatorClient:
    """A client of a port nobody listens on, recording the delay before each retry."""
    return AllocatorClient(
        f"127.0.0.1:{free_port()}",
        timeout_s=1,
        retries=retries,
        backoff_s=backoff_s,
        backoff_max_s=backoff_max_s,
        on_retry=lambda _reason, d: delays.append(d),
    )


def test_client_gives_up_after_retries_when_no_server() -> None:
    with AllocatorClient(f"127.0.0.1:{free_port()}", timeout_s=1, retries=2, backoff_s=0.01) as c:
        with pytest.raises(grpc.RpcError) as err:
            c.allocate("exp", ["a"], 8)
        assert err.value.code() == grpc.StatusCode.UNAVAILABLE
    with pytest.raises(ValueError, match="not both"):
        AllocatorClient("127.0.0.1:1").allocate("exp", ["a"], 8, budget=8)


def test_client_delays_are_capped_and_bounded() -> None:
    """Uncapped doubling from 10 ms would sleep 0.01·(1+2+…+128) = 2.55 s over 8 retries."""
    delays: list[float] = []
    t0 = time.monotonic()
    with _unreachable(delays, 8, 0.01, 0.04) as c, pytest.raises(grpc.RpcError) as err:
        c.report_outcomes("exp", [("a", 1, 1)])
    assert err.value.code() == grpc.StatusCode.UNAVAILABLE
    assert len(delays) == 8  # exactly `retries` retries, then the error
    assert all(d <= 0.04 for d in delays) and delays[-1] >= 0.04 * 0.8
    assert time.monotonic() - t0 < 2.0


def test_async_client_gives_up_after_its_retries_with_capped_delays() -> None:
    delays: list[float] = []
    with _unreachable(delays, 5, 0.02, 0.05) as c:
        with pytest.raises(grpc.RpcError) as err:
            asyncio.run(c.aallocate("exp", ["a"], 8))
        assert err.value.code() == grpc.StatusCode.UNAVAILABLE
        assert len(delays) == 5 and all(d <= 0.05 for d in delays)
        delays.clear()
        with pytest.raises(grpc.RpcError):
            asyncio.run(c.areport_outcomes("exp", [("a", 1, 1)]))
        assert len(delays) == 5


def test_async_client_backoff_holds_no_thread() -> None:
    """With one executor thread, a job submitted while the client waits out its back-off runs at
    once: the wait is an asyncio.sleep, not a sleep inside ``to_thread``."""
    delays: list[float] = []

    async def scenario(c: AllocatorClient) -> float:
        asyncio.get_running_loop().set_default_executor(ThreadPoolExecutor(max_workers=1))
        call = asyncio.create_task(c.aallocate("exp", ["a"], 8))
        deadline = time.monotonic() + 10
        while not delays:  # the first attempt failed; the back-off (>= 0.8 s) has begun
            assert time.monotonic() < deadline and not call.done()
            await asyncio.sleep(0.005)
        t = time.monotonic()
        await asyncio.to_thread(lambda: None)
        latency = time.monotonic() - t
        with pytest.raises(grpc.RpcError):
            await call
        return latency

    with _unreachable(delays, 1, 1.0, 1.0) as c:
        assert asyncio.run(scenario(c)) < 0.4
