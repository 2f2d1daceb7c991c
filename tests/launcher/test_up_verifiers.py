"""``dynamo-rl up`` with a verifiers environment (``configs/verifiers_multi_turn.yaml``, its
two-turn arithmetic environment) at the smallest settings: real processes, real Redis."""

from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path

import pyarrow.parquet as pq
import pytest

from tests.conftest import REPO, dynamo_rl_argv

STEPS = 2
MODULE = "tasks/vf_envs/two_step_arith.py"


@pytest.mark.slow
def test_up_runs_the_verifiers_recipe_from_the_env_data(tmp_path: Path, redis_url: str) -> None:
    run_dir = tmp_path / "run"
    argv = dynamo_rl_argv(
        "up", "--config", str(REPO / "configs" / "verifiers_multi_turn.yaml"),
        "--steps", str(STEPS), f"run.dir={run_dir}", "run.name=upvf",
        "rollout.env.verifiers.args={train: 24, test: 6, seed: 1, digits: 1}",
        "up.warm_start.steps=4", "up.warm_start.batch_size=8", "up.eval.prompts=4",
        "up.eval.samples=2", "up.tiny_model.hidden_size=32", "up.tiny_model.num_layers=1",
        "rollout.batch_size=4", "learner.train_batch_size=4", "allocator.n_per_prompt=2",
    )  # fmt: skip
    env = {**os.environ, "REDIS_URL": redis_url}
    result = subprocess.run(
        argv, capture_output=True, text=True, env=env, timeout=600, check=False, cwd=REPO
    )
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    out = result.stdout
    # No task written: the environment's rows train, as the data check printed.
    assert not (run_dir / "data" / "train.parquet").exists()
    assert f"training data rollout.env.verifiers {MODULE}: 24 of 24 rows kept" in out
    assert "data source two_step_arith: 24 rows, scored by verifiers rubric" in out
    # The warm start trained on each row's answer as the reply to its prompt.
    demos = run_dir / "data" / "warm_start_verifiers.parquet"
    assert f"supervised warm start: 4 steps on {demos}" in out
    rows = pq.read_table(demos).to_pylist()
    assert len(rows) == 24
    question = rows[0]["prompt"][-1]["content"]
    a, b = question.removeprefix("What is ").removesuffix("?").split("+")
    assert rows[0]["extra_info"]["answer"] == str(int(a) + int(b))
    assert f"step {STEPS}/{STEPS}" in out
    # Both evaluations played the environment's eval_dataset, both turns, on the rubric.
    for label in ("before", "after"):
        assert f"held-out accuracy {label} RL" in out
        result_ = json.loads((run_dir / f"eval_{label}.json").read_text())
        bench = result_["benchmarks"]["eval"]
        assert bench["data"] == f"rollout.env.verifiers {MODULE} (eval)"
        assert bench["prompts"] == 4 and bench["n"] == 2
        assert bench["episodes"]["turns_mean"] == 2.0
    after = json.loads((run_dir / "eval_after.json").read_text())
    assert list(after["weight_versions"].values()) == [STEPS]  # the last push, served
    summary = json.loads((run_dir / "summary.json").read_text())
    assert 0.0 <= summary["accuracy_before"] <= 1.0 and 0.0 <= summary["accuracy_after"] <= 1.0


def test_up_refuses_the_sft_control_with_a_verifiers_env(tmp_path: Path) -> None:
    argv = dynamo_rl_argv(
        "up", "--config", str(REPO / "configs" / "verifiers_multi_turn.yaml"),
        f"run.dir={tmp_path / 'run'}", "up.sft_control=true",
    )  # fmt: skip
    result = subprocess.run(argv, capture_output=True, text=True, timeout=120, check=False)
    assert result.returncode == 2
    assert "up.sft_control must be false with rollout.env.name 'verifiers'" in result.stderr
    assert not (tmp_path / "run").exists()
