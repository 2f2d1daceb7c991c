"""The recipes check (``benchmarks/recipes.py``): committed ranges read from result files of the
committed shapes, the verdict against them, the line when no quick range is committed, and what
``--record`` writes; on fake run folders (a ``summary.json`` each), so nothing is run."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from tests.benchmarks.bench import BENCHMARKS, bench_module


@pytest.fixture(scope="module")
def rc():
    return bench_module("recipes")


def finished(runs: Path, name: str, seed: int, before: float, after: float, full=False) -> None:
    """A run folder as ``up`` leaves it, as far as the script reads it."""
    run_dir = runs / f"{name}-{'full' if full else 'quick'}-seed{seed}"
    run_dir.mkdir(parents=True)
    summary = {"accuracy_before": before, "accuracy_after": after, "wall_s": 100.0 + seed}
    (run_dir / "summary.json").write_text(json.dumps(summary))


def test_values_at_follows_keys_and_lists_and_skips_missing_items(rc) -> None:
    doc = {"seeds": [{"rl": {"gain_points": 3.5}}, {"seed": 3}, {"rl": {"gain_points": -1}}]}
    assert rc.values_at(doc, "seeds.*.rl.gain_points") == [3.5, -1.0]
    assert rc.values_at({"record": {"gain_points": 2}}, "record.gain_points") == [2.0]
    assert rc.values_at({"runs": []}, "runs.*.gain_points") == []


def test_the_full_ranges_are_read_from_the_committed_files(rc) -> None:
    """Each recipe's range is the per-seed gains of its committed result, as the file holds them
    (min and max worked out here from the file independently)."""
    results = BENCHMARKS / "results"
    doc = json.loads((results / "quickstart_pool384_dynamo.json").read_text())
    gains = [r["gain_points"] for r in doc["runs"]]
    span = rc.committed_range("quickstart", True)
    assert span == {"min": min(gains), "max": max(gains), "seeds": len(gains),
                    "file": "quickstart_pool384_dynamo.json"}  # fmt: skip
    doc = json.loads((results / "agent_when.json").read_text())
    gains = [s["rl"]["gain_points"] for s in doc["seeds"] if "rl" in s]
    assert rc.committed_range("agent_when", True) == {
        "min": min(gains), "max": max(gains), "seeds": len(gains), "file": "agent_when.json"
    }  # fmt: skip
    # Every recipe's file is there and holds gains at its path.
    for name in rc.RECIPES:
        assert isinstance(rc.committed_range(name, True), dict), name


def test_a_committed_shaped_file_elsewhere_gives_its_range(rc, tmp_path: Path) -> None:
    doc = {"runs": [{"seed": s, "gain_points": g} for s, g in enumerate([6.6, 14.8, 9.0])]}
    (tmp_path / "quickstart_pool384_dynamo.json").write_text(json.dumps(doc))
    assert rc.committed_range("quickstart", True, tmp_path) == {
        "min": 6.6, "max": 14.8, "seeds": 3, "file": "quickstart_pool384_dynamo.json"
    }  # fmt: skip
    assert "missing" in rc.committed_range("agent_code", True, tmp_path)


def test_the_verdict_says_in_range_or_by_how_much_outside(rc) -> None:
    span = {"min": 6.6, "max": 14.8, "seeds": 5, "file": "f.json"}
    assert rc.verdict(20.6, span) == "above the range by +5.8"
    assert rc.verdict(3.5, span) == "below the range by -3.1"
    assert rc.verdict(6.6, span) == rc.verdict(14.8, span) == rc.verdict(10, span) == "in range"
    assert rc.verdict(3.5, "why not") == "why not"
    run = {"seed": 0, "accuracy_before": 0.379, "accuracy_after": 0.585, "gain_points": 20.6,
           "wall_s": 123.4}  # fmt: skip
    assert rc.line("quickstart", run, span) == (
        "quickstart seed 0: 37.9% -> 58.5% (+20.6 points); committed +6.6..+14.8 (5 seeds, "
        "f.json): above the range by +5.8; 123 s"
    )


def test_without_a_quick_range_the_line_says_so(rc, tmp_path: Path) -> None:
    assert rc.committed_range("quickstart", False, tmp_path) == rc.NO_QUICK_RANGE
    assert rc.NO_QUICK_RANGE == "no committed quick range yet (run recipes.py --record)"
    (tmp_path / "recipes_quick.json").write_text(json.dumps({"recipes": {}}))
    assert rc.committed_range("quickstart", False, tmp_path) == rc.NO_QUICK_RANGE
    run = {"seed": 0, "accuracy_before": 0.3, "accuracy_after": 0.4, "gain_points": 10.0,
           "wall_s": 90}  # fmt: skip
    assert rc.line("quickstart", run, rc.NO_QUICK_RANGE) == (
        "quickstart seed 0: 30.0% -> 40.0% (+10.0 points); no committed quick range yet "
        "(run recipes.py --record); 90 s"
    )


def test_record_writes_the_quick_ranges_and_a_later_check_reads_them(
    rc, tmp_path: Path, monkeypatch, capsys
) -> None:
    """``--record`` over finished runs (none is started) writes per recipe the settings, each
    seed's figures and the range, with the machine record; a later check against it says by how
    much each of its runs is outside."""
    monkeypatch.setattr(rc, "RESULTS", tmp_path / "results")
    monkeypatch.setattr(rc, "start", lambda *a, **k: pytest.fail("a finished run was started"))
    runs = tmp_path / "runs"
    finished(runs, "quickstart", 0, 0.30, 0.40)
    finished(runs, "quickstart", 1, 0.35, 0.55)
    finished(runs, "agent_code", 0, 0.90, 0.88)
    finished(runs, "agent_code", 1, 0.80, 0.85)
    argv = ["--only", "quickstart,agent_code", "--seeds", "0,1", "--runs", str(runs)]
    assert rc.main([*argv, "--record"]) == 0
    out = capsys.readouterr().out
    assert "quickstart seed 1: 35.0% -> 55.0% (+20.0 points); " + rc.NO_QUICK_RANGE in out
    doc = json.loads((tmp_path / "results" / "recipes_quick.json").read_text())
    assert doc["mode"] == "quick" and doc["seeds"] == [0, 1] and "cpu_model" in doc["machine"]
    assert list(doc["recipes"]) == ["quickstart", "agent_code"]
    qs = doc["recipes"]["quickstart"]
    assert qs["config"] == "configs/quickstart.yaml"
    assert qs["overrides"] == list(rc.RECIPES["quickstart"].quick)
    assert [(r["seed"], r["accuracy_before"], r["accuracy_after"], r["gain_points"])
            for r in qs["runs"]] == [(0, 0.3, 0.4, 10.0), (1, 0.35, 0.55, 20.0)]  # fmt: skip
    assert qs["gain_points"] == {"min": 10.0, "max": 20.0, "mean": 15.0}
    assert qs["wall_s"] == 201.0 and qs["failed"] == {}
    assert doc["recipes"]["agent_code"]["gain_points"] == {"min": -2.0, "max": 5.0, "mean": 1.5}

    # A machine whose quickstart gained +25 and +12, its agent_code -4: checked against the record.
    other = tmp_path / "other"
    finished(other, "quickstart", 0, 0.30, 0.55)
    finished(other, "quickstart", 1, 0.30, 0.42)
    finished(other, "agent_code", 0, 0.90, 0.86)
    report = tmp_path / "report.json"
    argv = ["--only", "quickstart,agent_code", "--runs", str(other), "--out", str(report)]
    assert rc.main(argv) == 0  # seed 0 (the default)
    out = capsys.readouterr().out
    span = "committed +10.0..+20.0 (2 seeds, recipes_quick.json)"
    assert (
        f"quickstart seed 0: 30.0% -> 55.0% (+25.0 points); {span}: above the range by +5.0" in out
    )
    assert "agent_code seed 0: 90.0% -> 86.0% (-4.0 points); committed -2.0..+5.0 (2 seeds, " \
           "recipes_quick.json): below the range by -2.0" in out  # fmt: skip
    assert json.loads(report.read_text())["recipes"]["quickstart"]["runs"][0]["verdict"] == (
        "above the range by +5.0"
    )
    assert rc.main(["--only", "quickstart", "--seeds", "1", "--runs", str(other), "--out",
                    str(report)]) == 0  # fmt: skip
    assert "(+12.0 points); " + span + ": in range" in capsys.readouterr().out


def test_record_takes_no_overrides(rc, tmp_path: Path) -> None:
    with pytest.raises(SystemExit) as e:
        rc.main(["--record", "--only", "quickstart", "--runs", str(tmp_path), "learner.lr=1"])
    assert e.value.code == 2 and not (tmp_path / "quickstart-quick-seed0").exists()


def test_a_range_recorded_with_other_quick_settings_is_not_used(rc, tmp_path: Path) -> None:
    recorded = {"recipes": {"quickstart": {"overrides": ["learner.max_steps=99"],
                                           "runs": [{"gain_points": 5.0}]}}}  # fmt: skip
    (tmp_path / "recipes_quick.json").write_text(json.dumps(recorded))
    assert "other quick settings" in rc.committed_range("quickstart", False, tmp_path)
    recorded["recipes"]["quickstart"]["overrides"] = list(rc.RECIPES["quickstart"].quick)
    (tmp_path / "recipes_quick.json").write_text(json.dumps(recorded))
    assert rc.committed_range("quickstart", False, tmp_path)["min"] == 5.0


class _Done:
    """A finished ``up`` process that exited with ``code``."""

    def __init__(self, code: int) -> None:
        self.returncode = code

    def poll(self) -> int:
        return self.returncode


def test_runs_get_their_modes_settings_and_a_failed_run_exits_1(
    rc, tmp_path: Path, monkeypatch, capsys
) -> None:
    """Quick runs get the recipe's overrides then the given ones, full runs only the given ones,
    each its own config; a run that fails is reported and makes the exit code 1, the others are
    still reported."""
    monkeypatch.setattr(rc, "POLL_S", 0.0)
    monkeypatch.setattr(rc, "RESULTS", tmp_path / "results")
    runs = tmp_path / "runs"
    started = []

    def start(run_dir, overrides, seed, quick, config):
        started.append((run_dir.name, overrides, seed, quick, config.name))
        if run_dir.name.startswith("quickstart-"):
            finished(runs, "quickstart", seed, 0.2, 0.3, full="full" in run_dir.name)
            return _Done(0)
        run_dir.mkdir(parents=True)
        return _Done(2)

    monkeypatch.setattr(rc, "start", start)
    assert rc.main(["--only", "quickstart,agent_when", "--runs", str(runs), "x.y=1"]) == 1
    assert started == [
        ("quickstart-quick-seed0", [*rc.RECIPES["quickstart"].quick, "x.y=1"], 0, False,
         "quickstart.yaml"),
        ("agent_when-quick-seed0", [*rc.RECIPES["agent_when"].quick, "x.y=1"], 0, False,
         "agent_when.yaml"),
    ]  # fmt: skip
    out = capsys.readouterr().out
    assert "quickstart seed 0: 20.0% -> 30.0% (+10.0 points)" in out
    assert "agent_when seed 0: failed: up exited 2" in out
    doc = json.loads((runs / "recipes_quick.json").read_text())
    assert list(doc["recipes"]["agent_when"]["failed"]) == ["0"]
    assert doc["recipes"]["agent_when"]["failed"]["0"].startswith("up exited 2; see ")
    assert doc["recipes"]["agent_when"]["runs"] == []
    started.clear()
    assert rc.main(["--full", "--only", "quickstart", "--runs", str(runs)]) == 0
    assert started == [("quickstart-full-seed0", [], 0, False, "quickstart.yaml")]
    # Full mode reads the recipe's own committed file (none in this results folder).
    out = capsys.readouterr().out
    assert "(+10.0 points); no committed range: quickstart_pool384_dynamo.json is missing" in out


@pytest.mark.slow
def test_one_recipe_runs_through_up_and_is_reported(
    rc, tmp_path: Path, monkeypatch, capsys
) -> None:
    """The quickstart through ``dynamo-rl up`` with the smoke settings of
    ``quickstart_seeds.QUICK`` given last (they override the recipe's quick ones): one line, the
    run's figures from its ``summary.json``, and no range for the settings (none is committed in
    this results folder)."""
    qs = bench_module("quickstart_seeds")
    out = tmp_path / "report.json"
    runs = tmp_path / "runs"
    monkeypatch.setattr(rc, "RESULTS", tmp_path / "results")
    code = rc.main(["--only", "quickstart", "--runs", str(runs), "--out", str(out), *qs.QUICK])
    assert code == 0
    doc = json.loads(out.read_text())
    [run] = doc["recipes"]["quickstart"]["runs"]
    summary = json.loads((runs / "quickstart-quick-seed0" / "summary.json").read_text())
    assert run["gain_points"] == round(
        100 * (summary["accuracy_after"] - summary["accuracy_before"]), 2
    )
    assert run["warm_start"]["steps"] == 20 and run["verdict"] == rc.NO_QUICK_RANGE
    assert doc["overrides"] == qs.QUICK and doc["machine"]["cpu_model"]
    assert (
        f"quickstart seed 0: {100 * summary['accuracy_before']:.1f}% -> " in capsys.readouterr().out
    )
