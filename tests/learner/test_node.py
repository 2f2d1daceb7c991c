"""``python -m learner.node``: torchrun that names the node missing at a rendezvous timeout.

The line it adds, from torch's own error texts and torchrun's own argument parser (a node alone,
one of several that came, a node that cannot reach node 0, texts it must leave to torch); then one
real agent alone, which fails at its timeout with torch's exit code and the line last.
tests/learner/test_two_nodes.py runs it as the Kubernetes Job does, for node 0 and node 1.
"""

from __future__ import annotations

import subprocess
import sys
import time
from pathlib import Path

import pytest
from torch.distributed import DistError, DistStoreError, run

from dynamo_rl.procs import free_port
from learner import node
from tests.conftest import REPO

# torch 2.x's texts (c10d TCPStore), as node 0 and the other nodes raise them.
SERVER = "Timed out after 11 seconds waiting for clients. {joined}/{nodes} clients joined."
CLIENT = (
    "The client socket has timed out after 10000ms while trying to connect to "
    "(learner-0.learner-rdzv, 29500)."
)


def args(rank: int, nodes: int = 2, *extra: str) -> list[str]:
    return [f"--nnodes={nodes}", f"--node-rank={rank}", "--master-addr=learner-0.learner-rdzv",
            "--master-port=29500", *extra, "train.py"]  # fmt: skip


def line(error: str, argv: list[str]) -> str | None:
    return node.missing_nodes(error, run.parse_args(argv))


def test_node_zero_alone_names_every_other_node_rank() -> None:
    conf = "--rdzv-conf=timeout=10"
    assert line(SERVER.format(joined=1, nodes=2), args(0, 2, conf)) == (
        "learner node rank 0: node rank(s) 1 of 2 never joined the rendezvous at "
        "learner-0.learner-rdzv:29500 within 10 s (--rdzv-conf timeout); check that each missing "
        "node's pod or host runs this command with its --node-rank"
    )
    four = line(
        SERVER.format(joined=1, nodes=4), args(0, 4, "--rdzv-conf=join_timeout=5,timeout=7")
    )
    assert four is not None and "node rank(s) 1, 2, 3 of 4 never joined" in four
    assert "within 7 s (--rdzv-conf timeout)" in four


def test_several_came_then_only_how_many_are_missing_is_said() -> None:
    text = line(SERVER.format(joined=2, nodes=3), args(0, 3))
    assert text is not None
    assert "learner node rank 0: 1 of 3 nodes never joined (2 did; torch says not which)" in text
    assert "node rank(s)" not in text  # torch's count does not say which ranks came
    assert "within the rendezvous timeout;" in text  # no --rdzv-conf: torch's default


def test_another_node_names_node_zero_and_its_address() -> None:
    text = line(CLIENT, args(1, 2, "--rdzv-conf=timeout=10"))
    assert text is not None
    assert text.startswith(
        "learner node rank 1: node rank 0 never answered at learner-0.learner-rdzv:29500 "
        "(--master-addr, --master-port) within 10 s (--rdzv-conf timeout)"
    )


@pytest.mark.parametrize(
    ("error", "argv"),
    [
        ("Connection reset by peer", args(0)),  # not a rendezvous timeout
        (SERVER.format(joined=2, nodes=2), args(0)),  # all came: not what times out here
        (SERVER.format(joined=1, nodes=2), args(1)),  # only node 0 hosts the store
        (CLIENT, args(0)),  # node 0 connects to itself
        (SERVER.format(joined=1, nodes=2), [*args(0)[:-1], "--rdzv-backend=c10d", "train.py"]),
        ("Timed out after 11 seconds waiting for clients, 1 of 2 joined", args(0)),  # new words
    ],
    ids=[
        "other-error",
        "all-joined",
        "server-text-on-rank-1",
        "client-text-on-rank-0",
        "c10d",
        "unknown-format",
    ],
)
def test_what_it_does_not_recognise_is_left_to_torch(error: str, argv: list[str]) -> None:
    assert line(error, argv) is None


def test_an_unrecognised_error_is_torchs_unchanged(monkeypatch: pytest.MonkeyPatch) -> None:
    raised = DistStoreError("Timed out after 3 seconds waiting for the key 'x'")

    def fail(argv: list[str]) -> None:
        raise raised

    monkeypatch.setattr(run, "main", fail)
    with pytest.raises(DistError) as caught:
        node.main(args(0))
    assert caught.value is raised


def test_an_agent_alone_fails_at_its_timeout_naming_the_missing_node(tmp_path: Path) -> None:
    script = tmp_path / "train.py"
    script.write_text("raise SystemExit('no worker may start')\n")
    port = free_port()
    argv = [sys.executable, "-m", "learner.node", "--nnodes=2", "--nproc-per-node=1",
            "--node-rank=0", "--master-addr=127.0.0.1", f"--master-port={port}",
            "--rdzv-conf=timeout=2", str(script)]  # fmt: skip
    start = time.monotonic()
    result = subprocess.run(argv, cwd=REPO, capture_output=True, text=True, timeout=120,
                            check=False)  # fmt: skip
    took = time.monotonic() - start
    assert result.returncode == 1, result.stderr[-3000:]  # an uncaught error's, as torchrun's
    assert took >= 2, took
    lines = result.stderr.strip().splitlines()
    assert "1/2 clients joined" in lines[-2]  # torch's error first, unchanged
    assert lines[-1].startswith(
        f"learner node rank 0: node rank(s) 1 of 2 never joined the rendezvous at "
        f"127.0.0.1:{port} within 2 s (--rdzv-conf timeout)"
    )
    assert "no worker may start" not in result.stderr
