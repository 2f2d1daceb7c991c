"""The informative-batch benchmark's loop (``benchmarks/informative_batch.py``) on the tiny model
with a scorer that makes a third of the prompts always wrong, a third always right and a third
depend on the response: every learner step trains exactly B groups, each with a signal; the step
records' generation figures plus the groups still waiting add up to everything generated; the
skip rule skips prompts whose visits gave no signal, and the baseline skips none."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from tests.benchmarks.bench import bench_module


@pytest.fixture(scope="module")
def ib():
    return bench_module("informative_batch")


def verdict(response: str, ground_truth: str) -> bool:
    kind = abs(int(ground_truth)) % 3
    return kind == 1 or (kind == 2 and len(response) % 2 == 1)


def run(ib, arm: str, tmp_path: Path, tiny_dir: Path, monkeypatch) -> dict:
    monkeypatch.setattr(ib.se, "is_correct", verdict)
    s = ib.Settings(
        task_train=400, test_prompts=12, train_prompts=12, steps=6, batch_size=3, draw=4, n=4,
        n_min=2, n_max=8, max_new_tokens=6, eval_every=3, eval_subset=6, micro_batch=8,
    )  # fmt: skip
    out = tmp_path / f"{arm}.json"
    ib.run_one(arm, 0, s, tiny_dir, out)
    return json.loads(out.read_text())


@pytest.mark.parametrize("arm", ["ds", "skip", "rounds"])
def test_every_step_trains_b_groups_with_a_signal_and_counts_all_generation(
    ib, arm, tmp_path, tiny_dir, monkeypatch
):
    r = run(ib, arm, tmp_path, tiny_dir, monkeypatch)
    assert [entry["gen_groups_kept"] for entry in r["log"]] == [3] * 6
    # Every trained group had a signal: its rewards are not all equal, so its mean is in (0, 1).
    means = [m for entry in r["log"] for m in entry["group_means"]]
    assert len(means) == 18 and all(0.0 < m < 1.0 for m in means)
    for key in ("groups", "rollouts", "tokens"):
        trained = sum(e[f"gen_{key}_kept"] + e[f"gen_{key}_dropped"] for e in r["log"])
        assert trained + r["waiting"][key] == r["spent"][key], key
    assert r["curve"][-1]["tokens"] == r["spent"]["tokens"]


def test_the_skip_rule_skips_prompts_without_a_signal_and_the_baseline_none(
    ib, tmp_path, tiny_dir, monkeypatch
):
    ds = run(ib, "ds", tmp_path, tiny_dir, monkeypatch)
    skip = run(ib, "skip", tmp_path, tiny_dir, monkeypatch)
    assert ds["spent"]["skipped"] == 0
    assert skip["spent"]["skipped"] > 0
    # A skipped prompt is generated for nothing: fewer rollouts per visit than uniform n.
    assert skip["spent"]["rollouts"] / skip["spent"]["draws"] < 4 * 4


def test_a_pool_without_signal_stops_with_an_error_naming_the_setting(ib, tmp_path, tiny_dir,
                                                                       monkeypatch):  # fmt: skip
    monkeypatch.setattr(ib.se, "is_correct", lambda _r, _g: False)
    s = ib.Settings(
        task_train=400, test_prompts=12, train_prompts=8, steps=2, batch_size=2, draw=4, n=2,
        max_new_tokens=4, eval_subset=4, max_draws=3,
    )  # fmt: skip
    with pytest.raises(RuntimeError, match="max_draws"):
        ib.run_one("ds", 0, s, tiny_dir, tmp_path / "none.json")
