"""A converted dataset trains: GSM8K-layout rows -> ``dynamo-rl data`` -> ``dynamo-rl up``.

Small settings: 20 one-digit sums written as GSM8K rows (``question``, ``answer`` ``#### N``), a one-layer tiny model warm-started on the converted rows' reference solutions
(``extra_info.answer``), three RL steps. The reward comes from the ``openai/gsm8k`` default route
(the last ``#### N``): nonzero means the converted prompt, its instruction, the ground truth and the
route fit together end to end.
"""

from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path

import pyarrow.parquet as pq
import pytest

from tests.conftest import REPO, dynamo_rl_argv

STEPS = 3


def convert_gsm8k(rows: list[dict], folder: Path) -> tuple[Path, str]:
    """``rows`` (GSM8K's layout) through ``dynamo-rl data gsm8k``: the parquet file and what the
    command printed."""
    src = folder / "gsm8k_train.jsonl"
    src.write_text("".join(json.dumps(r) + "\n" for r in rows))
    data = folder / "train.parquet"
    done = subprocess.run(dynamo_rl_argv("data", "gsm8k", str(src), "--out", str(data)),
                          cwd=REPO, capture_output=True, text=True, timeout=120)  # fmt: skip
    assert done.returncode == 0, done.stderr
    return data, done.stdout


@pytest.mark.slow
def test_up_trains_on_a_converted_gsm8k_file(tmp_path: Path, redis_url: str) -> None:
    # The answer is the final line alone: a tiny model learns "#### N" in a short warm start (with
    # a reasoning line before it, 80 steps left 1 correct sample in 192).
    rows = [{"question": f"What is {a} plus {b}?", "answer": f"#### {a + b}"}
            for a in range(1, 5) for b in range(1, 6)]  # fmt: skip
    data, said = convert_gsm8k(rows, tmp_path)
    assert "20 rows" in said
    assert {r["data_source"] for r in pq.read_table(data).to_pylist()} == {"openai/gsm8k"}

    run_dir = tmp_path / "run"
    argv = dynamo_rl_argv(
        "up", "--config", str(REPO / "configs" / "quickstart.yaml"), "--steps", str(STEPS),
        f"run.dir={run_dir}", "run.name=updata", f"rollout.dataset={data}",
        "up.warm_start.steps=120", "up.warm_start.batch_size=16", "up.warm_start.lr=3e-3",
        "up.tiny_model.hidden_size=32", "up.tiny_model.num_layers=1", "rollout.batch_size=8",
        "learner.train_batch_size=8", "rollout.sampling.max_tokens=16", "up.eval.prompts=0",
    )  # fmt: skip
    env = {**os.environ, "REDIS_URL": redis_url}
    result = subprocess.run(argv, capture_output=True, text=True, env=env, timeout=1200)
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    assert f"supervised warm start: 120 steps on {data}" in result.stdout
    assert f"step {STEPS}/{STEPS}" in result.stdout
    steps = [json.loads(x) for x in (run_dir / "metrics.jsonl").read_text().splitlines()]
    steps = [s for s in steps if "reward_mean" in s]
    assert len(steps) >= STEPS
    assert sum(s["reward_mean"] for s in steps) > 0, steps
