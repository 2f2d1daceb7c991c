"""The agent-recipe benchmark: what it reads from a run folder, and its ``--quick`` form end to end
through ``dynamo-rl up`` (both recipes, one seed)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from tests.benchmarks.bench import bench_module


@pytest.fixture(scope="module")
def ar():
    return bench_module("agent_recipe")


def test_curve_keeps_step_records_and_quarters_average_them(ar, tmp_path: Path) -> None:
    lines = [{"kind": "eval", "step": 0}]  # not a train step
    for step in range(1, 9):
        lines.append(
            {
                "step": step,
                "responses": 16,
                "accuracy_mean": step / 10,
                "tool_call_rate": 1.0 if step > 4 else 0.5,
            }
        )
    (tmp_path / "metrics.jsonl").write_text("".join(json.dumps(x) + "\n" for x in lines))
    points = ar.curve(tmp_path)
    assert [p["step"] for p in points] == list(range(1, 9))
    assert ar.mean_over(points, "accuracy_mean", first=True) == pytest.approx(0.15)
    assert ar.mean_over(points, "accuracy_mean", first=False) == pytest.approx(0.75)
    assert ar.mean_over(points, "tool_call_rate", first=True) == 0.5
    assert ar.mean_over(points, "episode_turns_mean", first=True) is None


def test_settings_show_equal_rollout_budgets(ar) -> None:
    s = ar.settings_of(quick=False)
    assert s["tools"]["rollout_budget"] == s["text"]["rollout_budget"]
    assert s["tools"]["env"]["name"] == "tools" and s["text"]["env"]["name"] == "single_turn"
    assert s["tools"]["warm_start"]["demos"] == "tool_calls"
    assert s["text"]["warm_start"]["demos"] == "answers"
    # Everything else the two recipes set is the same.
    for key in ("task", "model", "eval", "allocation", "learner"):
        assert s["tools"][key] == s["text"][key], key
    same = {k: v for k, v in s["tools"]["warm_start"].items() if k != "demos"}
    assert same == {k: v for k, v in s["text"]["warm_start"].items() if k != "demos"}


@pytest.mark.slow
def test_quick_run_trains_both_recipes_and_writes_one_record_per_seed(ar, tmp_path: Path) -> None:
    out = tmp_path / "quick.json"
    assert (
        ar.main(["--quick", "--seeds", "1", "--runs", str(tmp_path / "runs"), "--out", str(out)])
        == 0
    )
    doc = json.loads(out.read_text())
    [record] = doc["seeds"]
    assert record["seed"] == 1 and doc["quick"] is True
    tools, text = record["tools"], record["text"]
    for recipe, r in (("tools", tools), ("text", text)):
        summary = json.loads((tmp_path / "runs" / f"{recipe}-seed1" / "summary.json").read_text())
        assert r["accuracy_after"] == summary["accuracy_after"]
        assert r["steps"] == 2 and r["rollouts"] == 2 * 4 * 4
    assert record["margin_points"] == round(
        100 * (tools["accuracy_after"] - text["accuracy_after"]), 2
    )
    # The tool recipe was evaluated in its episodes; the text recipe in one turn.
    assert tools["eval_episodes_before"]["env"] == "tools"
    assert tools["eval_episodes_before"]["episodes"] == 6 * 2
    assert text["eval_episodes_before"] is None
    assert "episode_turns_mean" in tools["curve"][0] and "tool_call_rate" in tools["curve"][0]
    assert "episode_turns_mean" not in text["curve"][0]


def test_warm_start_checks_are_one_per_step_the_first_taken(ar, tmp_path: Path) -> None:
    assert ar.warm_start_of(tmp_path) == {}  # no warm start log
    log = tmp_path / "model" / "sft.run" / "metrics.jsonl"
    log.parent.mkdir(parents=True)
    lines = [
        {"kind": "eval", "step": 0, "eval_exact": 0.0},  # before training: not a check
        {"step": 10},
        {"kind": "eval", "step": 10, "eval_exact": 0.41234},
        {"kind": "eval", "step": 10, "eval_exact": 0.5},  # a resumed run's repeat of step 10
        {"step": 20},
        {"kind": "eval", "step": 20, "eval_exact": 0.9},
    ]
    log.write_text("".join(json.dumps(x) + "\n" for x in lines))
    assert ar.warm_start_of(tmp_path) == {
        "steps": 20,
        "checks": [{"step": 10, "greedy_exact": 0.412}, {"step": 20, "greedy_exact": 0.9}],
    }
