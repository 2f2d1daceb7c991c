"""``dynamo-rl eval --model``: a real engine and reward service of its own, real samples."""

from __future__ import annotations

import json
import subprocess
from collections import defaultdict
from pathlib import Path

import pytest

from tests.conftest import REPO, dynamo_rl_argv


def _eval(model: Path, data: Path, out: Path, samples: Path) -> dict:
    argv = dynamo_rl_argv(
        "eval", "--model", str(model), "--data", str(data), "--n", "3", "--temperature", "1.0",
        "--out", str(out), "--samples", str(samples), "run.seed=5",
        "rollout.sampling.max_tokens=6",
    )  # fmt: skip
    done = subprocess.run(argv, cwd=REPO, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-3000:]
    return json.loads(out.read_text())


@pytest.mark.slow
def test_eval_samples_each_prompt_with_its_own_seed_and_reports_what_it_scored(
    tmp_path: Path,
) -> None:
    from learner.tiny_model import build_tiny_model

    model = build_tiny_model(tmp_path / "m", hidden_size=32, num_layers=1, num_heads=2,
                             num_kv_heads=1)  # fmt: skip
    # The same question under 12 ids: with one seed shared by every prompt, each would get the
    # very same samples (the bias that made `up`'s sampled accuracy depend on a few noise streams).
    data = tmp_path / "data.jsonl"
    rows = [{"id": f"q{i}", "prompt": "1+1=", "ground_truth": "2"} for i in range(12)]
    data.write_text("".join(json.dumps(r) + "\n" for r in rows))

    result = _eval(model, data, tmp_path / "a.json", tmp_path / "a.jsonl")
    lines = [json.loads(x) for x in (tmp_path / "a.jsonl").read_text().splitlines()]
    assert len(lines) == 12 * 3
    by_prompt: dict[str, list[str]] = defaultdict(list)
    for line in lines:
        by_prompt[line["prompt_id"]].append(line["text"])
    assert sorted(by_prompt) == sorted(r["id"] for r in rows)
    assert len({tuple(v) for v in by_prompt.values()}) > 1, "every prompt got the same samples"
    # The reported accuracy is the mean of the verdicts written.
    assert result["accuracy"] == pytest.approx(sum(x["correct"] for x in lines) / len(lines))
    assert result["prompts"] == 12 and result["n"] == 3

    # Seeded: the same command gives the same samples.
    _eval(model, data, tmp_path / "b.json", tmp_path / "b.jsonl")
    assert (tmp_path / "b.jsonl").read_text() == (tmp_path / "a.jsonl").read_text()
