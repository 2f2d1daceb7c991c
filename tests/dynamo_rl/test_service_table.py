"""The service table: every row names a real subcommand, real config keys, and starts for real."""

from __future__ import annotations

import sys
from pathlib import Path

import httpx
import pytest

from dynamo_rl.cli import SUBCOMMANDS
from dynamo_rl.config import ExperimentConfig
from dynamo_rl.service_table import ENGINE_SERVICES, SERVICES, engine_service, service
from tests.conftest import REPO


def _get(tree: object, dotted: str) -> object:
    for part in dotted.split("."):
        assert isinstance(tree, dict) and part in tree, f"no config key {dotted}"
        tree = tree[part]
    return tree


def test_the_table_names_every_service_once() -> None:
    assert list(SERVICES) == [
        "redis", "allocator", "reward", "engine", "vllm", "rollout", "learner"
    ]  # fmt: skip
    with pytest.raises(KeyError, match="known: redis, allocator"):
        service("nope")


@pytest.mark.parametrize("name", sorted(SERVICES))
def test_rows_name_real_subcommands_and_config_keys(name: str) -> None:
    row = SERVICES[name]
    tree = ExperimentConfig().model_dump(mode="json")
    for key in (row.port_key, *row.other_ports):
        if key:
            default = _get(tree, key)
            assert isinstance(default, int), f"{key} is not a port ({default!r})"
    if row.endpoint_key:
        _get(tree, row.endpoint_key)
    if row.subcommand is None:
        return
    assert row.subcommand in SUBCOMMANDS
    argv = row.argv("--config", "x.yaml", nproc=2, master_port=1234)
    # Through the CLI's name table, never a module path: a service that moves changes nothing here.
    cli = argv.index("dynamo_rl.cli")
    assert argv[cli - 1] == "-m" and argv[cli + 1 :] == [row.subcommand, "--config", "x.yaml"]
    assert argv[0] == sys.executable
    if name == "learner":
        assert argv[1:3] == ["-m", "torch.distributed.run"] and "--nproc-per-node" in argv
        assert argv[argv.index("--master-port") + 1] == "1234"


def test_addresses_and_port_overrides() -> None:
    assert SERVICES["reward"].address(5) == "http://127.0.0.1:5"
    assert SERVICES["allocator"].address(5) == "127.0.0.1:5"
    assert SERVICES["redis"].address(5) == "redis://127.0.0.1:5/0"
    assert SERVICES["allocator"].port_overrides(7) == [
        "allocator.metrics_port=0",
        "allocator.port=7",
    ]
    assert SERVICES["rollout"].port_overrides(7) == ["rollout.metrics_port=0"]
    assert SERVICES["rollout"].health("x") is None


def test_start_waits_for_the_probe_and_stops_a_service_that_dies(tmp_path: Path) -> None:
    proc, url = SERVICES["reward"].start(
        tmp_path / "reward.log", "reward.code.enabled=false", "--math-workers", "1", cwd=REPO
    )
    try:
        probe = SERVICES["reward"].health(url)
        assert probe is not None and probe() and proc.alive()
        elsewhere = SERVICES["reward"].health(url.rsplit(":", 1)[0] + ":1")
        with pytest.raises(httpx.ConnectError):  # nothing there
            elsewhere()
    finally:
        proc.stop()
    # A service that exits before it is ready: an error with its log, and nothing left running.
    with pytest.raises(RuntimeError, match="before it was ready"):
        SERVICES["allocator"].start(tmp_path / "allocator.log", "allocator.n_min=99", cwd=REPO)


def test_every_engine_kind_has_a_row_or_a_reason() -> None:
    from typing import get_args

    from dynamo_rl.config.engine import EngineKind

    assert set(ENGINE_SERVICES) == set(get_args(EngineKind))
    assert engine_service("embedded") is SERVICES["engine"]
    assert engine_service("vllm") is SERVICES["vllm"]
    # Both engine rows are reached at the address the rollout workers and the learner read.
    assert SERVICES["vllm"].endpoint_key == SERVICES["engine"].endpoint_key
    assert SERVICES["vllm"].health_path == "/health"
    with pytest.raises(ValueError, match=r"engine.kind=sglang: .*not started by dynamo-rl"):
        engine_service("sglang")
    with pytest.raises(ValueError, match=r"engine.kind: 'nope' is not one of embedded, vllm"):
        engine_service("nope")
