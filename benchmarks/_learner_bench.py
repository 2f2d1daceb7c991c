"""What the learner's benchmarks (``bench_learner``, ``bench_push``) share: the children's
environment (one thread each, the repository importable), a run whose output goes to a log file
(the log's tail in the error when it fails), and the memcpy baseline a push is compared with."""

from __future__ import annotations

import os
import subprocess
import time
from collections.abc import Sequence
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent


def child_env(drop: Sequence[str] = ()) -> dict[str, str]:
    """This process's environment for a child: one OpenMP thread, no tokenizer threads, the
    repository on ``PYTHONPATH``; the variables in ``drop`` left out."""
    env = dict(os.environ)
    env.update(OMP_NUM_THREADS="1", TOKENIZERS_PARALLELISM="false", PYTHONPATH=str(REPO))
    for name in drop:
        env.pop(name, None)
    return env


def run_logged(argv: Sequence[str], log: Path, what: str, env: dict[str, str]) -> None:
    """Run ``argv`` from the repository with its output in ``log``; exit with ``what`` and the
    log's last 4000 characters when it fails."""
    with open(log, "wb") as out:
        rc = subprocess.run(
            argv, stdout=out, stderr=subprocess.STDOUT, env=env, cwd=REPO
        ).returncode
    if rc != 0:
        raise SystemExit(f"{what} failed ({rc}):\n{log.read_text()[-4000:]}")


def memcpy_gbps(nbytes: int) -> float:
    """GB/s of one same-process copy of ``nbytes`` bytes (the best of five)."""
    import torch

    src = torch.empty(nbytes, dtype=torch.uint8).random_()
    dst = torch.empty_like(src)
    times = []
    for _ in range(5):
        t0 = time.perf_counter()
        dst.copy_(src)
        times.append(time.perf_counter() - t0)
    return nbytes / min(times) / 1e9
