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
from dynamo_rl.service_table import SERVICES
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


# DynaMO recipe pieces (modulation, clip-higher, dual-clip) plus a KL term, so the reference model
# and every loss term are in the comparisons between layouts.
RECIPE = [
    "learner.train_batch_size=4",
    "learner.ppo_epochs=2",
    "learner.algorithm.modulation.enabled=true",
    "learner.algorithm.policy_loss.clip_high=0.28",
    "learner.algorithm.policy_loss.dual_clip=10",
    "learner.algorithm.kl.coef=0.01",
    "learner.checkpoint.every=2",
]
# The same batch every step, with DynaMO-like uneven group sizes: two mini-batches of two groups
# (5 and 8 responses) over micro-batches of 2. With 2 ranks the first mini-batch splits 2 + 3 rows,
# so rank 0 runs an empty micro-batch to keep the collectives in step, and every layout sees the
# same micro-batches (DynaMO modulation is per micro-batch).
FIXED_SIZES = [2, 3, 4, 4]
FIXED_LAYOUT = ["learner.micro_batch_size=2", "learner.mini_batch_size=2"]
LAYOUT_TOLERANCE = 1e-4  # how far two layouts of the same ranks' work may differ (float sums)


def assert_same_training(a: list[dict], b: list[dict], tol: float = LAYOUT_TOLERANCE) -> None:
    """Two runs' step records agree step by step: loss terms, gradient norm, modulation, and the
    engine/learner mismatch (sums and IS-weight quantiles gathered over the ranks)."""
    import pytest

    assert [r["step"] for r in a] == [r["step"] for r in b]
    keys = ("loss", "grad_norm", "kl", "entropy", "beta_stab_mean", "beta_comp_mean",
            "mismatch_kl_token_mean", "mismatch_kl_seq_mean", "is_weight_p1", "is_weight_p50",
            "is_weight_p99", "is_masked_share")  # fmt: skip
    for x, y in zip(a, b, strict=True):
        for key in keys:
            assert x[key] == pytest.approx(y[key], abs=tol), (x["step"], key)
        assert x["update_losses"] == pytest.approx(y["update_losses"], abs=tol)
