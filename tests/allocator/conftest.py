"""Fixtures of the allocator's service tests: a server (at most 100 prompts a request) and a
client of it without retries."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from allocator.server import RunningServer
from dynamo_rl.clients.allocator import AllocatorClient
from tests.allocator.helpers import start_allocator


@pytest.fixture
def server(redis_url: str) -> Iterator[RunningServer]:
    running = start_allocator(redis_url, max_prompts_per_request=100)
    yield running
    running.stop(grace=0.5)


@pytest.fixture
def client(server: RunningServer) -> Iterator[AllocatorClient]:
    with AllocatorClient(f"127.0.0.1:{server.port}", timeout_s=5.0, retries=0) as c:
        yield c
