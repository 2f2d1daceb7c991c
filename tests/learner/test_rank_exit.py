"""How a torchrun rank ends once training has finished (``learner.cli.run_ranks``)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

from dynamo_rl.procs import free_port
from tests.learner.helpers import REPO, learner_env

RANK_SCRIPT = """
import atexit, os, sys
from pathlib import Path

out = Path(sys.argv[1])
rank = os.environ["RANK"]


class Teardown:
    def __del__(self):  # runs only if the interpreter tears itself down
        (out / f"teardown-{rank}").write_text("x")


keep = Teardown()
atexit.register(lambda: (out / f"atexit-{rank}").write_text("x"))

import torch
import torch.distributed as dist

from dynamo_rl.config import ExperimentConfig
from learner.cli import run_ranks


class Trainer:
    def run(self):
        dist.init_process_group("gloo")
        t = torch.ones(1)
        dist.all_reduce(t)
        (out / f"sum-{rank}").write_text(str(int(t.item())))
        return 0


def after(_trainer):
    (out / f"after-{rank}").write_text("x")


sys.exit(run_ranks(ExperimentConfig(), Trainer, after=after))
"""


def test_a_finished_torchrun_rank_runs_its_exit_handlers_and_skips_the_teardown(
    tmp_path: Path,
) -> None:
    """Each rank trains, runs ``after``, leaves the group, runs the exit handlers (the metrics
    history's last snapshot is one) and ends with ``os._exit``: the interpreter's teardown, which
    once aborted a finished rank in gloo's native code, never runs; torchrun sees exit 0."""
    script = tmp_path / "rank.py"
    script.write_text(RANK_SCRIPT)
    argv = [sys.executable, "-m", "torch.distributed.run", "--nproc-per-node", "2",
            "--master-addr", "127.0.0.1", "--master-port", str(free_port()),
            str(script), str(tmp_path)]  # fmt: skip
    r = subprocess.run(argv, env=learner_env(), cwd=REPO, capture_output=True, text=True,
                       timeout=180, check=False)  # fmt: skip
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-3000:]
    for rank in ("0", "1"):
        assert (tmp_path / f"sum-{rank}").read_text() == "2"
        assert (tmp_path / f"after-{rank}").exists()
        assert (tmp_path / f"atexit-{rank}").exists()
        assert not (tmp_path / f"teardown-{rank}").exists()
