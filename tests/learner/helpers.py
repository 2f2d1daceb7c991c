"""Shared pieces of the learner tests: synthetic trajectory groups written with the real codec,
and launching the learner under a real torchrun."""

from __future__ import annotations

import os
import random
import subprocess
import sys
from pathlib import Path

import redis

from dynamo_rl import keys
from dynamo_rl.codec import Response, TrajectoryGroup, encode_entry
from dynamo_rl.procs import ServiceProcess
from launcher.service_table import SERVICES
from tests.conftest import REPO

TORCHRUN = str(Path(sys.executable).with_name("torchrun"))


def make_groups(
    n_groups: int, n_responses: int = 4, seed: int = 0, sizes: list[int] | None = None
) -> list[TrajectoryGroup]:
    """Deterministic groups over the tiny model's byte vocabulary, with mixed rewards; ``sizes``
    gives each group its own response count (as dynamic allocation does)."""
    rng = random.Random(seed)
    groups = []
    for g in range(n_groups):
        prompt = [rng.randrange(3, 259) for _ in range(rng.randrange(4, 9))]
        responses = []
        for r in range(sizes[g] if sizes else n_responses):
            length = rng.randrange(3, 10)
            reward = float((r + g) % 2)  # half right, half wrong in every group
            responses.append(
                Response(
                    token_ids=[rng.randrange(3, 259) for _ in range(length)],
                    logprobs=[-5.5 - rng.random() * 0.1 for _ in range(length)],
                    reward=reward,
                    correct=reward > 0,
                    finish_reason="stop",
                )
            )
        groups.append(
            TrajectoryGroup(prompt_id=f"p{g}", prompt_token_ids=prompt, responses=responses)
        )
    return groups


def write_groups(url: str, namespace: str, groups: list[TrajectoryGroup]) -> list[str]:
    client = redis.Redis.from_url(url)
    try:
        ids = [client.xadd(keys.trajectory_stream(namespace), encode_entry(g)) for g in groups]
        return [i.decode() for i in ids]
    finally:
        client.close()


def learner_argv(nproc: int, overrides: list[str]) -> list[str]:
    return SERVICES["learner"].argv(*overrides, nproc=nproc)


def learner_env() -> dict[str, str]:
    env = dict(os.environ)
    env.update(OMP_NUM_THREADS="1", TOKENIZERS_PARALLELISM="false", PYTHONPATH=str(REPO))
    env.pop("REDIS_URL", None)
    return env


def run_learner(nproc: int, overrides: list[str], log: Path, timeout: float = 240) -> None:
    """Run the learner to completion; fail with its log when it does not exit 0."""
    with open(log, "ab") as out:
        result = subprocess.run(
            learner_argv(nproc, overrides), stdout=out, stderr=subprocess.STDOUT,
            env=learner_env(), cwd=REPO, timeout=timeout, check=False,
        )  # fmt: skip
    if result.returncode != 0:
        raise AssertionError(f"learner exited {result.returncode}:\n{log.read_text()[-6000:]}")


def start_learner(nproc: int, overrides: list[str], log: Path) -> ServiceProcess:
    return ServiceProcess("learner", learner_argv(nproc, overrides), log, env=learner_env(),
                          cwd=REPO).start()  # fmt: skip


def base_overrides(model: Path, run_dir: Path, redis_url: str, name: str) -> list[str]:
    return [
        f"learner.model={model}",
        f"run.name={name}",
        f"run.dir={run_dir}",
        f"endpoints.redis_url={redis_url}",
        "learner.metrics_port=0",
        "learner.push.every=0",
        "learner.lr=1e-3",
        "learner.micro_batch_size=4",
        "learner.stream.block_ms=200",
        "learner.stream.wait_timeout_s=30",
        "learner.checkpoint.export_every=0",
    ]
