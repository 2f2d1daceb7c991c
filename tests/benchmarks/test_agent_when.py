"""The when-to-call benchmark: its paired-by-seed summary, and its ``--quick`` form end to end
through ``dynamo-rl up`` (the recipe, the SFT control and the mask ablation, one seed)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from tests.benchmarks.bench import bench_module


@pytest.fixture(scope="module")
def aw():
    return bench_module("agent_when")


def arm(gain: float, easy: float, hard: float) -> dict:
    return {"gain_points": gain, "call_rate_change": {"easy": easy, "hard": hard}}


def test_summary_pairs_the_arms_by_seed(aw) -> None:
    records = [
        {"seed": 0, "rl": arm(10.0, -0.4, 0.3), "sft": arm(2.0, 0.0, 0.1), "mask": arm(-5.0, 0, 0)},
        {"seed": 1, "rl": arm(14.0, -0.2, 0.5), "sft": arm(4.0, 0.1, 0.1), "mask": arm(-1.0, 0, 0)},
        {
            "seed": 2,
            "rl": arm(12.0, -0.3, 0.4),
            "sft": arm(0.0, -0.1, 0.1),
            "mask": arm(-3.0, 0, 0),
        },
    ]
    s = aw.summarise(records, ["rl", "sft", "mask"])
    assert s["rl_gain_points"]["mean"] == pytest.approx(12.0)
    # t(2 df) = 4.303, sd 2: half-width 4.303 * 2 / sqrt(3)
    lo, hi = s["rl_gain_points"]["ci"]
    assert (lo, hi) == pytest.approx((12 - 4.969, 12 + 4.969), abs=1e-3)
    assert s["rl_call_rate_change_easy"]["mean"] == pytest.approx(-0.3)
    assert s["rl_call_rate_change_hard"]["mean"] == pytest.approx(0.4)
    assert s["rl_minus_sft_gain_points"]["mean"] == pytest.approx(10.0)
    assert s["rl_minus_mask_gain_points"]["mean"] == pytest.approx(15.0)
    assert s["rl_minus_sft_gain_points"]["seeds"] == [0, 1, 2]
    assert "rl_minus_sft_gain_points" not in aw.summarise(records, ["rl"])


def test_tiers_of_reads_accuracy_and_call_rate_per_tier(aw) -> None:
    result = {"benchmarks": {"test": {"by_tier": {
        "easy": {"accuracy": 0.9, "prompts": 3, "episodes": {"tool_call_rate": 0.25,
                                                              "tool_calls_mean": 0.25}},
        "hard": {"accuracy": 0.5, "prompts": 3, "episodes": {"tool_call_rate": 1.0,
                                                              "tool_calls_mean": 1.5}},
    }}}}  # fmt: skip
    assert aw.tiers_of(result) == {
        "easy": {"accuracy": 0.9, "prompts": 3, "tool_call_rate": 0.25, "tool_calls_mean": 0.25},
        "hard": {"accuracy": 0.5, "prompts": 3, "tool_call_rate": 1.0, "tool_calls_mean": 1.5},
    }


def test_start_split_counts_calls_and_direct_answers_per_tier_at_rls_start(
    aw, tmp_path: Path
) -> None:
    import pyarrow as pa
    import pyarrow.parquet as pq

    (tmp_path / "data").mkdir()
    rows = [{"data_source": "products", "extra_info": {"index": i, "tier": t}}
            for i, t in enumerate(["easy", "hard"])]  # fmt: skip
    pq.write_table(pa.Table.from_pylist(rows), tmp_path / "data" / "train.parquet")

    def response(correct: bool, calls: int, text: str = "") -> dict:
        return {"correct": correct, "text": text,
                "turns": [{"tool_calls": [{"name": "calculator"}] * calls}]}  # fmt: skip

    groups = [
        {"prompt_id": "products-0", "weight_version": 0, "responses": [
            response(True, 1), response(False, 0), response(True, 0), response(False, 0)]},
        {"prompt_id": "products-1", "weight_version": 2, "responses": [
            response(True, 1), response(False, 1, "<tool_call>{unclosed")]},  # a malformed call
        {"prompt_id": "products-1", "weight_version": 3, "responses": [response(True, 0)]},
    ]  # fmt: skip
    (tmp_path / "samples").mkdir()
    (tmp_path / "samples" / "worker0.jsonl").write_text(
        "\n".join(json.dumps(g) for g in groups) + "\n"
    )
    assert aw.start_split(tmp_path) == {
        "easy": {"call": {"episodes": 1, "accuracy": 1.0},
                 "direct": {"episodes": 3, "accuracy": round(1 / 3, 4)}},
        "hard": {"call": {"episodes": 2, "accuracy": 0.5}},  # version 3 is past RL's start
    }  # fmt: skip


def test_done_only_leaves_out_an_arm_that_did_not_finish(aw, tmp_path: Path) -> None:
    (tmp_path / "rl-seed0").mkdir()  # started, never finished: no summary.json
    assert aw.seed_record(0, ["rl", "sft"], tmp_path, False, [], done_only=True) == {"seed": 0}


def test_a_seed_whose_warm_start_failed_its_check_is_recorded_as_such(aw, tmp_path: Path) -> None:
    error = "still below up.warm_start.min_tier_accuracy (0.3) after 1000 steps"
    run = tmp_path / "rl-seed3"
    run.mkdir()
    (run / "up.log").write_text(f"[  1.0s] warm start step 1/600\n[ 2.0s] error: up.warm_start: "
                                f"{error}\n")  # fmt: skip
    record = aw.seed_record(3, ["rl", "sft"], tmp_path, False, [], done_only=True)
    assert record == {"seed": 3, "warm_start_failed": {"error": error}}
    assert aw.summarise([record], ["rl", "sft"])["rl_gain_points"]["n"] == 0


@pytest.mark.slow
def test_quick_run_writes_one_record_per_seed_with_all_three_arms(aw, tmp_path: Path) -> None:
    out = tmp_path / "quick.json"
    assert aw.main(["--quick", "--seeds", "1", "--runs", str(tmp_path / "runs"),
                    "--out", str(out)]) == 0  # fmt: skip
    doc = json.loads(out.read_text())
    [record] = doc["seeds"]
    assert record["seed"] == 1 and doc["quick"] is True
    for name in ("rl", "sft", "mask"):
        r = record[name]
        for which in ("before", "after"):
            assert set(r[f"tiers_{which}"]) == {"easy", "hard"}
            assert all(t["tool_call_rate"] is not None for t in r[f"tiers_{which}"].values())
        assert set(r["call_rate_change"]) == {"easy", "hard"}
        assert ("start_split" in r) == (name != "sft")  # the SFT control samples no rollouts
    runs = tmp_path / "runs"
    # RL trained 2 steps; the SFT control trained none of RL's but its own sft run, at RL's
    # compute (2 steps of 4 x 4 rows), and the engines served its weights (version 1).
    assert record["rl"]["steps"] == record["mask"]["steps"] == 2 and record["sft"]["steps"] == 0
    control = [json.loads(x) for x in (runs / "sft-seed1" / "model" / "sft_control.run" /
                                       "metrics.jsonl").read_text().splitlines() if x.strip()]  # fmt: skip
    assert max(r.get("step", 0) for r in control) == 2
    after = json.loads((runs / "sft-seed1" / "eval_after.json").read_text())
    assert set(after["weight_versions"].values()) == {1}  # per engine
    config = (runs / "mask-seed1" / "config.yaml").read_text()
    assert "train_observations: true" in config
    assert set(doc["summary"]) >= {"rl_gain_points", "rl_minus_sft_gain_points",
                                   "rl_call_rate_change_easy", "sft_call_rate_change_hard"}  # fmt: skip
