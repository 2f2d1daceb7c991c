"""Every shipped config trains: two steps of each on the tiny model in one process (a plain
``dynamo-rl learner`` without torchrun is a world of one), with the batch shrunk to fit."""

from __future__ import annotations

import math
import subprocess
from pathlib import Path

import pytest

from dynamo_rl.codec import Response, TrajectoryGroup
from learner.steplog import read_log
from learner.tiny_model import build_tiny_model
from tests.conftest import REPO, dynamo_rl_argv
from tests.learner.helpers import base_overrides, learner_env, make_groups, write_groups

pytestmark = pytest.mark.slow
CONFIGS = sorted(p.stem for p in (REPO / "configs").glob("*.yaml"))


@pytest.fixture(scope="module")
def tiny_model(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return build_tiny_model(tmp_path_factory.mktemp("model") / "m", hidden_size=32, num_layers=1)


@pytest.mark.parametrize("config", CONFIGS)
def test_shipped_config_trains(
    config: str, tiny_model: Path, redis_url: str, tmp_path: Path
) -> None:
    name = f"cfg-{config}"
    uniform = TrajectoryGroup(  # all rewards equal: DAPO's dynamic sampling must skip it
        prompt_id="same",
        prompt_token_ids=[5, 6, 7],
        responses=[Response(token_ids=[8, 9], logprobs=[-5.5, -5.5], reward=1.0)] * 3,
    )
    groups = [uniform, *make_groups(4)]
    if config == "distill":  # its teacher's log-probs, as the rollout's teacher stage writes them
        for g in groups:
            for r in g.responses:
                r.teacher_logprobs.extend(lp - 0.5 for lp in r.logprobs)
    write_groups(redis_url, name, groups)
    overrides = [
        *base_overrides(tiny_model, tmp_path / "run", redis_url, name),
        "learner.train_batch_size=2",
        "learner.mini_batch_size=1",
        "learner.max_steps=2",
        "learner.push.every=1",  # no engine is registered: each push is skipped, not an error
    ]
    result = subprocess.run(
        dynamo_rl_argv("learner", "--config", str(REPO / "configs" / f"{config}.yaml"), *overrides),
        env=learner_env(), cwd=REPO, capture_output=True, text=True, timeout=240, check=False,
    )  # fmt: skip
    assert result.returncode == 0, result.stderr[-4000:]
    records = read_log(tmp_path / "run" / "metrics.jsonl")
    assert [r["step"] for r in records] == [1, 2]
    assert "no engines registered (redis); push of version 2 skipped" in result.stderr
    assert all("push_ok" not in r for r in records)
    for r in records:
        assert math.isfinite(r["loss"]) and math.isfinite(r["grad_norm"]) and r["tokens"] > 0
        assert len(r["update_losses"]) == 2 * (2 if config == "ppo" else 1)  # minis × epochs
    if config == "dapo":
        assert records[0]["groups_skipped"] == 1 and records[0]["groups"] == 2
    else:
        assert sum(r["groups"] for r in records) == 4  # the uniform group is trained on too
    if config == "ppo":
        assert all("value_loss" in r and "kl_beta" in r for r in records)
    if config == "distill":
        assert all(abs(r["opd_reverse_kl"] - 0.5) < 1e-6 for r in records)
    if config == "dynamo_grpo":
        assert all(0 < r["beta_stab_mean"] <= 1 for r in records)


@pytest.mark.parametrize(
    "variant",
    [
        ["learner.algorithm.advantage.type=rloo", "learner.algorithm.agg=seq-mean-token-sum",
         "learner.algorithm.kl.kind=k1"],
        ["learner.algorithm.advantage.type=drgrpo", "learner.algorithm.agg=seq-mean-token-sum-norm",
         "learner.algorithm.kl.kind=k2", "learner.algorithm.entropy_coef=0.01"],
        ["learner.algorithm.advantage.type=reinforce_pp",
         "learner.algorithm.advantage.group_baseline=true",
         "learner.algorithm.agg=seq-mean-token-mean", "learner.algorithm.is_cap=null",
         "learner.optim.schedule=cosine", "learner.optim.warmup_steps=2",
         "learner.optim.total_steps=3"],
        ["learner.algorithm.is_mode=geometric-mask", "learner.algorithm.is_low=0.98",
         "learner.algorithm.is_cap=1.02"],
    ],
    ids=["rloo", "drgrpo", "reinforce_pp_baseline", "geometric_mask"],
)  # fmt: skip
def test_advantage_and_aggregation_variants_train(
    variant: list[str], tiny_model: Path, redis_url: str, tmp_path: Path
) -> None:
    name = "variant"
    write_groups(redis_url, name, make_groups(4))
    overrides = [
        *base_overrides(tiny_model, tmp_path / "run", redis_url, name),
        "learner.train_batch_size=2",
        "learner.mini_batch_size=null",
        "learner.max_steps=2",
        *variant,
    ]
    result = subprocess.run(
        dynamo_rl_argv("learner", "--config", str(REPO / "configs" / "grpo.yaml"), *overrides),
        env=learner_env(), cwd=REPO, capture_output=True, text=True, timeout=240, check=False,
    )  # fmt: skip
    assert result.returncode == 0, result.stderr[-4000:]
    records = read_log(tmp_path / "run" / "metrics.jsonl")
    assert [r["step"] for r in records] == [1, 2]
    assert all(math.isfinite(r["loss"]) and r["grad_norm"] > 0 and r["kl"] >= 0 for r in records)
    for r in records:  # the mismatch figures of every step (learner.mismatch.mismatch_record)
        assert r["mismatch_kl_token_mean"] >= 0 and r["mismatch_kl_seq_mean"] >= 0
        assert r["is_weight_p1"] <= r["is_weight_p50"] <= r["is_weight_p99"]
        assert 0 <= r["is_masked_share"] <= 1 and "mismatch_kl_lag0" in r
    if "learner.algorithm.is_mode=geometric-mask" in variant:  # test data: sampling far off
        assert all(r["is_masked_share"] > 0 for r in records), records
    if "learner.optim.warmup_steps=2" in variant:  # linear warmup over the two steps
        assert [r["lr"] for r in records] == pytest.approx([5e-4, 1e-3])
