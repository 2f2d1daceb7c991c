"""Fixtures shared by the rollout worker's tests: the tiny model, an embedded engine on it, an
allocator, a reward service, and a small dataset of sums; a tiny model with a chat template and
an engine on it (the verifiers tests)."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from dynamo_rl.service_table import SERVICES
from learner.tiny_model import build_tiny_model
from tests.conftest import REPO
from tests.services.engine.engine_util import CHAT_TEMPLATE, running_engine


@pytest.fixture(scope="module")
def model(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The default tiny model (seed 0) saved in Hugging Face format."""
    return build_tiny_model(tmp_path_factory.mktemp("model") / "m", seed=0)


@pytest.fixture(scope="module")
def engine(model: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    """An embedded engine on ``model``; its URL."""
    with running_engine(model, tmp_path_factory.mktemp("engine")) as url:
        yield url


@pytest.fixture(scope="module")
def chat_model(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A tiny model with a chat template (the engine's /v1/chat/completions renders with it)."""
    return build_tiny_model(
        tmp_path_factory.mktemp("vfw") / "m", hidden_size=32, num_layers=2, num_heads=2,
        num_kv_heads=1, max_positions=512, chat_template=CHAT_TEMPLATE,
    )  # fmt: skip


@pytest.fixture(scope="module")
def chat_engine(chat_model: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    with running_engine(chat_model, tmp_path_factory.mktemp("engine")) as url:
        yield url


@pytest.fixture(scope="module")
def allocator(redis_server: str, tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    """An allocator on the session's Redis; its address."""
    log = tmp_path_factory.mktemp("allocator") / "allocator.log"
    proc, addr = SERVICES["allocator"].start(log, "--redis-url", redis_server, cwd=REPO)
    try:
        yield addr
    finally:
        proc.stop()


@pytest.fixture(scope="module")
def reward(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    """A reward service (one math worker, no code sandbox); its URL."""
    log = tmp_path_factory.mktemp("reward") / "reward.log"
    proc, url = SERVICES["reward"].start(
        log, "--math-workers", "1", "reward.code.enabled=false", cwd=REPO, timeout=120
    )
    try:
        yield url
    finally:
        proc.stop()


def write_sums(path: Path, n: int) -> Path:
    """``n`` verl-layout rows ``i+i=`` (ground truth ``2i``, data source ``arith``) as parquet."""
    rows = [
        {
            "data_source": "arith",
            "prompt": [{"role": "user", "content": f"{i}+{i}="}],
            "reward_model": {"style": "rule", "ground_truth": str(2 * i)},
            "extra_info": {"index": i},
        }
        for i in range(n)
    ]
    pq.write_table(pa.Table.from_pylist(rows), path)
    return path
