"""The one client base (``dynamo_rl.clients.base``) against real peers: an HTTP server and a gRPC
server that fail a scripted number of times. A client retries exactly its configured number of
times, waits the back-off's capped, jittered delays between attempts, names its peer when it gives
up, and every network client of the project is built on the base with its own defaults."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Iterator
from concurrent import futures
from typing import Any

import grpc
import httpx
import pytest

from dynamo_rl.clients.allocator import AllocatorClient
from dynamo_rl.clients.base import Client, ClientSettings, HttpClient
from dynamo_rl.envs.sandbox import SandboxClient
from dynamo_rl.proto.dynamo.v1 import allocator_pb2 as pb
from dynamo_rl.retry import Backoff, RetryPolicy
from services.rollout.reward_client import RewardClient
from tests.scripted_http import Script, scripted_server


@pytest.fixture
def http_peer() -> Iterator[tuple[str, Script]]:
    """A real HTTP server answering as scripted (``tests/scripted_http.py``)."""
    with scripted_server() as (url, script):
        yield url + "/", script


def fail_then_answer(script: Script, failures: int) -> None:
    script.answers = [(503, {})] * failures + [(200, {})]


class Busy(Exception):
    pass


class PingClient(HttpClient):
    """The smallest client on the base: GET / until it is not 503."""

    peer = "ping"
    defaults = ClientSettings(timeout_s=5.0, backoff_s=0.5, backoff_max_s=10.0, retries=1)

    async def ping(self) -> int:
        async def once() -> int:
            r = await self.http.post(f"{self.url}/v1/verify", json={"items": []})
            if r.status_code == 503:
                raise Busy(f"HTTP {r.status_code}")
            return r.status_code

        return await self.acall(once, retry_on=(Busy,), operation="ping")


class PatientClient(PingClient):
    """No limit by count: only ``max_wait_s`` ends its retries (the sandbox's and reward's way)."""

    defaults = ClientSettings(timeout_s=5.0, backoff_s=0.5, backoff_max_s=10.0)


def _ping(
    url: str, cls: type[PingClient] = PingClient, **settings: Any
) -> tuple[int | BaseException, list[float]]:
    delays: list[float] = []

    async def go() -> int | BaseException:
        client = cls(url, on_retry=lambda _r, d: delays.append(d), **settings)
        try:
            return await client.ping()
        except Busy as e:
            return e
        finally:
            await client.aclose()

    return asyncio.run(go()), delays


def test_http_client_retries_its_configured_times_with_capped_backoff(http_peer) -> None:
    url, peer = http_peer
    fail_then_answer(peer, 3)
    result, delays = _ping(url, retries=3, backoff_s=0.05, backoff_max_s=0.1)
    assert result == 200 and len(peer.times) == 4  # three retries, the fourth attempt answers
    # Jittered doubling from 50 ms capped at 100 ms: [40, 50], [80, 100], [80, 100] ms.
    assert 0.04 <= delays[0] <= 0.05 and all(0.08 <= d <= 0.1 for d in delays[1:]), delays
    gaps = [b - a for a, b in zip(peer.times, peer.times[1:], strict=False)]
    assert all(g >= d * 0.9 for g, d in zip(gaps, delays, strict=True)), (gaps, delays)


def test_http_client_gives_up_after_its_retries(http_peer) -> None:
    url, peer = http_peer
    fail_then_answer(peer, 10)
    result, delays = _ping(url, retries=2, backoff_s=0.01, backoff_max_s=0.02)
    assert isinstance(result, Busy) and len(peer.times) == 3 and len(delays) == 2
    peer.times.clear()
    result, _ = _ping(url, retries=0)  # no retry at all
    assert isinstance(result, Busy) and len(peer.times) == 1


def test_http_client_gives_up_after_max_wait_s(http_peer) -> None:
    url, peer = http_peer
    peer.answers = [(503, {})]
    start = time.monotonic()
    result, delays = _ping(url, PatientClient, backoff_s=0.02, backoff_max_s=0.02, max_wait_s=0.3)
    assert isinstance(result, Busy)
    assert 0.3 <= time.monotonic() - start < 2.0 and len(delays) >= 5


def test_http_client_keeps_the_url_without_slash_and_its_timeout(http_peer) -> None:
    url, _ = http_peer
    client = PingClient(url, timeout_s=7.0)
    assert client.url == url.rstrip("/") and client.address == client.url
    assert client.http.timeout == httpx.Timeout(7.0, connect=5.0)
    assert client.retrying("ping").what == f"ping {client.url} ping"
    asyncio.run(client.aclose())


class _FlakyAllocator:
    """A real gRPC server of ``dynamo.v1.Allocator/Allocate`` answering UNAVAILABLE first."""

    def __init__(self, failures: int) -> None:
        self.failures = failures
        self.times: list[float] = []

        def allocate(request: pb.AllocateRequest, context: grpc.ServicerContext):
            self.times.append(time.monotonic())
            if len(self.times) <= self.failures:
                context.abort(grpc.StatusCode.UNAVAILABLE, "briefly gone")
            n = len(request.prompt_ids)
            return pb.AllocateResponse(counts=[request.n_per_prompt] * n,
                                       priorities=[-1.0] * n, budget=request.n_per_prompt * n)  # fmt: skip

        handler = grpc.unary_unary_rpc_method_handler(
            allocate,
            request_deserializer=pb.AllocateRequest.FromString,
            response_serializer=pb.AllocateResponse.SerializeToString,
        )
        self.server = grpc.server(futures.ThreadPoolExecutor(max_workers=2))
        self.server.add_generic_rpc_handlers(
            (grpc.method_handlers_generic_handler("dynamo.v1.Allocator", {"Allocate": handler}),)
        )
        self.port = self.server.add_insecure_port("127.0.0.1:0")
        self.server.start()

    def stop(self) -> None:
        self.server.stop(0)


def test_grpc_client_retries_unavailable_its_configured_times() -> None:
    flaky = _FlakyAllocator(failures=2)
    delays: list[float] = []
    try:
        with AllocatorClient(f"127.0.0.1:{flaky.port}", retries=2, backoff_s=0.02,
                             backoff_max_s=0.04, on_retry=lambda _r, d: delays.append(d)) as c:  # fmt: skip
            assert c.allocate("ns", ["a", "b"], 3).counts == [3, 3]
            assert len(flaky.times) == 3 and len(delays) == 2
            assert all(d <= 0.04 for d in delays)
            flaky.times.clear()
            flaky.failures = 5
            with pytest.raises(grpc.RpcError) as err:
                asyncio.run(c.aallocate("ns", ["a"], 3))
            assert err.value.code() == grpc.StatusCode.UNAVAILABLE
            assert len(flaky.times) == 3  # the first attempt and its two retries
    finally:
        flaky.stop()


def test_every_network_client_is_built_on_the_base_with_its_defaults() -> None:
    assert issubclass(AllocatorClient, Client) and not issubclass(AllocatorClient, HttpClient)
    assert issubclass(SandboxClient, HttpClient) and issubclass(RewardClient, HttpClient)
    allocator = AllocatorClient("127.0.0.1:1")
    assert allocator.retry == RetryPolicy(Backoff(0.1, 2.0), max_attempts=3)
    assert allocator.timeout_s == 5.0 and allocator.retrying("Allocate").what == (
        "allocator 127.0.0.1:1 Allocate"
    )
    allocator.close()
    sandbox, reward = SandboxClient("http://x/"), RewardClient("http://y", max_wait_s=0.0)
    assert sandbox.retry == RetryPolicy(Backoff(0.5, 10.0), max_wait_s=30.0)
    assert sandbox.retrying().what == "sandbox http://x" and sandbox.timeout_s == 30.0
    assert reward.retry == RetryPolicy(Backoff(0.5, 10.0))  # 0: no limit, as the config says
    assert reward.retrying().what == "reward service http://y" and reward.timeout_s == 120.0

    async def close() -> None:
        await sandbox.aclose()
        await reward.aclose()

    asyncio.run(close())


@pytest.mark.parametrize(
    ("settings", "match"),
    [
        ({"timeout_s": 0}, "timeout_s must be > 0, got 0"),
        ({"retries": -1}, "retries must be >= 0, got -1"),
        ({"max_wait_s": -1.0}, "max_wait_s must be >= 0, got -1.0"),
        ({"backoff_s": 3.0, "backoff_max_s": 1.0}, r"back-off base \(3.0\) must be <= its cap"),
    ],
)
def test_bad_settings_name_the_keyword(settings: dict[str, Any], match: str) -> None:
    with pytest.raises(ValueError, match=match):
        PingClient("http://x", **settings)
    with pytest.raises(ValueError, match=match):
        AllocatorClient("127.0.0.1:1", **settings)
