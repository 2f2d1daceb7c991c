"""The one Redis client factory against a real server: timeouts, blocking reads, redaction."""

from __future__ import annotations

import asyncio
import time

import pytest

from dynamo_rl.redis_client import TIMEOUT_S, async_client, redact_url, sync_client


@pytest.mark.parametrize(
    ("url", "shown"),
    [
        ("redis://:s3cret@redis:6379/0", "redis://:***@redis:6379/0"),
        ("redis://user:s3cret@10.0.0.1:6380", "redis://user:***@10.0.0.1:6380"),
        ("rediss://:p%40ss@[::1]:6379/2", "rediss://:***@[::1]:6379/2"),
        ("redis://localhost:6379/0", "redis://localhost:6379/0"),
        ("unix:///run/redis.sock", "unix:///run/redis.sock"),
    ],
)
def test_redact_url_hides_only_the_password(url: str, shown: str):
    assert redact_url(url) == shown
    assert "s3cret" not in redact_url(url)


def test_sync_client_talks_and_has_the_shared_timeouts(redis_url: str):
    client = sync_client(redis_url)
    try:
        assert client.ping()
        client.set("k", b"\x00\xff")
        assert client.get("k") == b"\x00\xff"  # raw bytes, never decoded
        kwargs = client.connection_pool.connection_kwargs
        assert kwargs["socket_timeout"] == TIMEOUT_S
    finally:
        client.close()


def test_a_blocking_read_longer_than_the_timeout_does_not_time_out(redis_url: str):
    client = sync_client(redis_url, timeout_s=0.3, block_s=1.0)
    try:
        client.xgroup_create("s", "g", id="0", mkstream=True)
        started = time.monotonic()
        assert client.xreadgroup("g", "c", {"s": ">"}, count=1, block=800) == []
        assert time.monotonic() - started >= 0.7
    finally:
        client.close()


def test_retrying_client_is_configured_with_the_project_backoff(redis_url: str):
    client = sync_client(redis_url, retries=3)
    try:
        retry = client.get_retry()
        assert retry is not None and retry._retries == 3
        assert client.ping()
    finally:
        client.close()


def test_async_client_talks(redis_url: str):
    async def go() -> bytes:
        client = async_client(redis_url, retries=2)
        try:
            await client.set("a", b"1")
            return await client.get("a")
        finally:
            await client.aclose()

    assert asyncio.run(go()) == b"1"
