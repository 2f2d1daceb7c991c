"""The quickstart-over-seeds benchmark: its stage timings from ``up``'s log, and its ``--quick``
form end to end through ``dynamo-rl up``."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest

from tests.benchmarks.bench import bench_module


@pytest.fixture(scope="module")
def qs():
    return bench_module("quickstart_seeds")


LOG = """\
[   0.0s] run folder /tmp/r (logs in /tmp/r/logs)
[   1.2s] building a tiny Qwen2 model
[  36.6s] supervised warm start: 500 steps on /tmp/r/data/warm_start.parquet
[ 130.0s] warm start checked (greedy accuracy on 320 held-out train rows): easy 1.00
[ 140.0s] embedded Redis at redis://127.0.0.1:4000/0
[ 150.5s] held-out accuracy before RL (1000 prompts x 4 samples)
[ 170.5s] held-out accuracy before RL: 0.300
[ 180.0s] step 1/120  rollouts 256
[ 300.0s] held-out accuracy after RL (1000 prompts x 4 samples)
[ 321.0s] held-out accuracy after RL: 0.450
[ 321.0s] held-out accuracy: 0.300 -> 0.450 (+15.0 points)
"""


def test_stage_times_come_from_ups_timestamps(qs) -> None:
    assert qs.stage_times(LOG) == {
        "warm_start": 103.4,
        "services": 10.5,
        "eval_before": 20.0,
        "rl": 129.5,
        "eval_after": 21.0,
    }


@pytest.mark.slow
def test_quick_sweep_runs_up_and_writes_the_gains(qs, tmp_path: Path) -> None:
    out = tmp_path / "quick.json"
    code = qs.main(["--quick", "--seeds", "3", "--jobs", "1", "--runs", str(tmp_path / "runs"),
                    "--out", str(out)])  # fmt: skip
    assert code == 0
    doc = json.loads(out.read_text())
    [run] = doc["runs"]
    assert run["seed"] == 3 and doc["quick"] is True
    summary = json.loads((tmp_path / "runs" / "dynamo-seed3" / "summary.json").read_text())
    assert run["gain_points"] == round(
        100 * (summary["accuracy_after"] - summary["accuracy_before"]), 2
    )
    assert doc["gain_points"]["min"] == doc["gain_points"]["max"] == run["gain_points"]
    # The machine it ran on: the same code gives other figures on another CPU.
    import torch

    assert doc["machine"]["torch_cpu_capability"] == torch.backends.cpu.get_cpu_capability()
    assert doc["machine"]["torch"] == torch.__version__ and doc["machine"]["cpu_model"]
    # The warm start was checked per tier on held-out train rows after its 20 steps.
    assert run["warm_start"]["steps"] == 20
    assert set(run["warm_start"]["checks"][-1]["greedy_accuracy"]) == {
        "easy", "medium", "medium-rev", "medium-sub", "hard",
    }  # fmt: skip
    assert set(run["stages_s"]) == {"warm_start", "services", "eval_before", "rl", "eval_after"}
    # The learner's two step records: what they generated (a 2-step run's first visits: n = 4).
    learner = run["learner"]
    assert learner["steps"] == 2 and learner["gen_rollouts_per_step"] == 32.0
    assert learner["alloc_at"] == 16 and learner["first_step_off_uniform"] is None
    # A finished run is read back, not run again.
    mtime = (tmp_path / "runs" / "dynamo-seed3" / "summary.json").stat().st_mtime_ns
    assert qs.main(["--quick", "--seeds", "3", "--runs", str(tmp_path / "runs"),
                    "--out", str(out)]) == 0  # fmt: skip
    assert (tmp_path / "runs" / "dynamo-seed3" / "summary.json").stat().st_mtime_ns == mtime


def test_finished_runs_are_summed_up_and_plotted_or_the_plot_skipped(
    qs, tmp_path: Path, monkeypatch, capsys
) -> None:
    runs = tmp_path / "runs"
    for seed, (before, after) in {0: (0.3, 0.45), 1: (0.4, 0.52)}.items():
        run_dir = runs / f"dynamo-seed{seed}"
        run_dir.mkdir(parents=True)
        summary = {"accuracy_before": before, "accuracy_after": after, "wall_s": 300.0}
        (run_dir / "summary.json").write_text(json.dumps(summary))
        (run_dir / "up.log").write_text(LOG)
        # Two learner steps: seed 0 spends 1,000 then 3,000 tokens, seed 1 twice as much; the
        # second step's allocation is off uniform.
        steps = [
            {"step": k, "gen_groups_kept": 4, "gen_groups_dropped": k - 1,
             "gen_rollouts_kept": 32, "gen_rollouts_dropped": 8 * (k - 1),
             "gen_tokens_kept": (seed + 1) * 1000, "gen_tokens_dropped": (seed + 1) * 2000 * (k - 1),
             "alloc_above": k - 1, "alloc_at": 4 - 2 * (k - 1), "alloc_below": k - 1,
             "alloc_skipped": 0}
            for k in (1, 2)
        ]  # fmt: skip
        lines = [json.dumps(r) for r in [{"step": 0, "kind": "eval"}, *steps]]
        (run_dir / "metrics.jsonl").write_text("\n".join(lines) + "\n")
    out = tmp_path / "seeds.json"
    assert qs.main(["--seeds", "0,1", "--runs", str(runs), "--out", str(out)]) == 0
    doc = json.loads(out.read_text())
    assert [r["gain_points"] for r in doc["runs"]] == [15.0, 12.0]
    assert doc["gain_points"] == {"min": 12.0, "max": 15.0, "mean": 13.5}
    assert doc["runs"][0]["learner"] == {
        "steps": 2, "gen_tokens_per_step": 2000.0, "gen_rollouts_per_step": 36.0,
        "gen_groups_per_step": 4.5, "groups_dropped_share": round(1 / 9, 4),
        "alloc_above": 1, "alloc_at": 6, "alloc_below": 1, "alloc_skipped": 0,
        "first_step_off_uniform": 2,
    }  # fmt: skip
    assert doc["runs"][1]["learner"]["gen_tokens_per_step"] == 4000.0
    assert out.with_suffix(".png").stat().st_size > 0
    # Without matplotlib (the main job's environment) the figures are written, the plot skipped.
    out.with_suffix(".png").unlink()
    monkeypatch.setitem(sys.modules, "matplotlib", None)
    # --compare: an earlier sweep (here GRPO's) subtracted seed by seed, with a t interval.
    grpo = tmp_path / "grpo.json"
    grpo.write_text(json.dumps({"method": "grpo", "runs": [
        {"seed": 0, "accuracy_before": 0.3, "accuracy_after": 0.40, "gain_points": 10.0,
         "learner": {"gen_tokens_per_step": 4000.0}, "stages_s": {"rl": 259.0}},
        {"seed": 1, "accuracy_before": 0.4, "accuracy_after": 0.50, "gain_points": 10.0,
         "learner": {"gen_tokens_per_step": 5000.0}, "stages_s": {"rl": 129.5}},
        {"seed": 7, "accuracy_before": 0.4, "accuracy_after": 0.90, "gain_points": 50.0},
    ]}))  # fmt: skip
    assert qs.main(["--seeds", "0,1", "--runs", str(runs), "--out", str(out),
                    "--compare", str(grpo)]) == 0  # fmt: skip
    printed = capsys.readouterr().out
    assert "no plot: matplotlib is not installed" in printed
    assert "accuracy_after minus" in printed and "+3.50 points" in printed
    assert not out.with_suffix(".png").exists()
    compared = json.loads(out.read_text())
    paired = compared.pop("paired_to_compare")
    assert compared == doc
    after = paired["accuracy_after"]
    assert after["seeds"] == [0, 1] and after["per_seed"] == {"0": 5.0, "1": 2.0}
    # mean 3.5, s.d. 2.12 over 2 seeds: half-width 12.706 * 2.12 / sqrt(2) = 19.06
    assert after["mean"] == pytest.approx(3.5)
    assert after["ci95"] == pytest.approx([3.5 - 19.059, 3.5 + 19.059], abs=1e-2)
    assert paired["gain_points"]["per_seed"] == {"0": 5.0, "1": 2.0}
    # Ratios seed by seed: tokens per step 2000/4000 and 4000/5000, the RL stage 129.5/259 and 1.
    tokens = paired["gen_tokens_per_step_ratio"]
    assert tokens["per_seed"] == {"0": 0.5, "1": 0.8} and tokens["mean"] == pytest.approx(0.65)
    assert paired["rl_wall_s_ratio"]["per_seed"] == {"0": 0.5, "1": 1.0}
    # Several files: one comparison each, in the order given.
    uniform = tmp_path / "uniform.json"
    uniform.write_text(json.dumps({"method": "dynamo-uniform", "runs": [
        {"seed": 0, "accuracy_before": 0.3, "accuracy_after": 0.46, "gain_points": 16.0},
        {"seed": 1, "accuracy_before": 0.4, "accuracy_after": 0.53, "gain_points": 13.0},
    ]}))  # fmt: skip
    assert qs.main(["--seeds", "0,1", "--runs", str(runs), "--out", str(out),
                    "--compare", str(uniform), str(grpo)]) == 0  # fmt: skip
    both = json.loads(out.read_text())["paired_to_compare"]
    assert [c["method"] for c in both] == ["dynamo-uniform", "grpo"]
    assert both[0]["gain_points"]["per_seed"] == {"0": -1.0, "1": -1.0} and both[1] == paired


@pytest.mark.slow
def test_the_lora_quickstart_runs_through_up_with_adapter_pushes(qs, tmp_path: Path) -> None:
    # configs/quickstart_lora.yaml through `dynamo-rl up` (the --quick settings): every push is
    # an adapter folder the engine loaded under quickstart-v<step>, and the evaluation after RL
    # sampled with the newest one.
    out = tmp_path / "lora.json"
    code = qs.main(["--quick", "--config", "configs/quickstart_lora.yaml", "--seeds", "0",
                    "--jobs", "1", "--runs", str(tmp_path / "runs"), "--out", str(out)])  # fmt: skip
    assert code == 0
    doc = json.loads(out.read_text())
    assert doc["command"].startswith("dynamo-rl up --config configs/quickstart_lora.yaml")
    run_dir = tmp_path / "runs" / "dynamo-seed0"
    steps = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    assert [r["push_ok"] for r in steps] == [True, True]
    assert all(0 < r["push_bytes"] < 200_000 for r in steps)  # the adapters, not the model
    assert sorted(p.name for p in (run_dir / "push").iterdir()) == [
        "adapter_v000001", "adapter_v000002"
    ]  # fmt: skip
    assert (run_dir / "export" / "final" / "adapter_config.json").is_file()
    after = json.loads((run_dir / "eval_after.json").read_text())
    assert list(after["weight_versions"].values()) == [2]
