"""The distillation benchmark's reading of its run folders: the curve of held-out accuracy against
generated tokens, the tokens a distilling arm needs to reach RL's final accuracy, and which
exports it evaluates."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from tests.benchmarks.bench import bench_module


@pytest.fixture(scope="module")
def distill():
    return bench_module("distill")


def fake_run(run_dir: Path, before: float, after: float, evals: dict[int, float]) -> Path:
    """A finished run of 60 steps of 100 + 10 generated tokens each, exported every 20 steps,
    with ``evals`` (step -> accuracy) written for its exports."""
    run_dir.mkdir(parents=True)
    (run_dir / "summary.json").write_text(
        json.dumps({"accuracy_before": before, "accuracy_after": after, "wall_s": 1.0})
    )
    lines = [{"step": 0, "kind": "warm start"}]  # a record without generation is not counted
    lines += [{"step": s, "gen_tokens_kept": 100, "gen_tokens_dropped": 10, "opd_reverse_kl": 1 / s}
              for s in range(1, 61)]  # fmt: skip
    (run_dir / "metrics.jsonl").write_text("\n".join(map(json.dumps, lines)) + "\n")
    for step in (20, 40, 60):
        (run_dir / "export" / f"step_{step:06d}").mkdir(parents=True)
    for step, acc in evals.items():
        (run_dir / f"eval_step_{step:06d}.json").write_text(json.dumps({"accuracy": acc}))
    return run_dir


def test_the_curve_is_each_export_against_the_tokens_generated_up_to_it(
    distill, tmp_path: Path
) -> None:
    run = fake_run(tmp_path / "opd-seed0", 0.1, 0.5, {20: 0.3, 40: 0.45})
    assert distill.curve(run) == [
        {"step": 0, "gen_tokens": 0, "accuracy": 0.1},
        {"step": 20, "gen_tokens": 2200, "accuracy": 0.3},
        {"step": 40, "gen_tokens": 4400, "accuracy": 0.45},
        {"step": 60, "gen_tokens": 6600, "accuracy": 0.5},  # up's evaluation after
    ]
    assert distill.reverse_kl(run) == {"first": 1.0, "last": round(1 / 60, 4),
                                       "last10_mean": round(sum(1 / s for s in range(51, 61)) / 10, 4)}  # fmt: skip


def test_only_the_exports_before_the_last_step_are_evaluated(distill, tmp_path: Path) -> None:
    run = fake_run(tmp_path / "rl-seed0", 0.1, 0.5, {20: 0.3})
    plan = distill.Plan(tmp_path, [0], tmp_path / "teacher", quick=False)
    plan.queue_evals(run)
    assert [out.name for _, _, out in plan.evals] == ["eval_step_000040.json"]


def test_the_tokens_to_reach_rls_final_accuracy_as_a_share_of_rls(distill, tmp_path: Path) -> None:
    runs = []
    for arm, after, evals in (("rl", 0.40, {20: 0.2, 40: 0.3}),
                              ("opd", 0.55, {20: 0.41, 40: 0.5}),   # reached at step 20
                              ("mixed", 0.38, {20: 0.3, 40: 0.35})):  # never: RL's 0.40 unmet  # fmt: skip
        run = fake_run(tmp_path / f"{arm}-seed0", 0.1, after, evals)
        runs.append({"arm": arm, "seed": 0, "accuracy_after": after, "curve": distill.curve(run)})
    summary = distill.summarise(runs)
    assert summary["opd"]["tokens_to_rl_final_share"] == {0: round(2200 / 6600, 4)}
    assert summary["opd"]["reached_within_a_third"] == {0: True}
    assert summary["mixed"]["tokens_to_rl_final_share"] == {0: None}
    assert summary["mixed"]["reached_within_a_third"] == {0: False}
    assert summary["opd"]["accuracy_after_minus_rl"]["per_seed"] == {0: 15.0}
    assert summary["mixed"]["accuracy_after_minus_rl"]["per_seed"] == {0: -2.0}
