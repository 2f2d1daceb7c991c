"""``up``'s one warm-start loop (:mod:`launcher.warm_start`) on both recipes, with the sft runs
faked: each recorded call writes the per-tier check the script gives it, so the loop's decisions
(stop, extend on which rows, give up with which error) are checked in milliseconds. The real sft
runs are ``test_warm_start_check.py``'s and ``tests/tasks/test_products.py``'s (slow)."""

from __future__ import annotations

import io
import json
from pathlib import Path

import pyarrow.parquet as pq
import pytest

from dynamo_rl.config import load_config
from launcher.warm_start import FOCUS_SHARE, WarmStart
from tests.conftest import REPO


class FakeSft:
    """``run_step`` for the warm start: records each sft call and writes its check (an eval
    record with the next scripted ``eval_exact/<tier>`` figures) where the loop reads it."""

    def __init__(self, checks: list[dict[str, float]]) -> None:
        self.checks = checks
        self.calls: list[dict[str, str]] = []

    def __call__(self, name: str, argv: list[str], poll) -> None:
        assert name == "sft"
        flags = {argv[i]: argv[i + 1] for i, a in enumerate(argv[:-1]) if a.startswith("--")}
        self.calls.append(flags)
        run = Path(flags["--out"] + ".run")
        run.mkdir(parents=True, exist_ok=True)
        accuracy = self.checks[len(self.calls) - 1]
        record = {"kind": "eval", "step": int(flags["--steps"]), "eval_exact": 0.0}
        record |= {f"eval_exact/{t}": a for t, a in accuracy.items()}
        with open(run / "metrics.jsonl", "a") as f:
            f.write(json.dumps(record) + "\n")
        poll()  # as the supervisor does when the step ends: the check reaches the console


def _warm_start(tmp_path: Path, config: str, checks: list[dict[str, float]], *overrides: str):
    cfg = load_config(
        str(REPO / "configs" / config),
        [f"run.dir={tmp_path}", "up.warm_start.steps=10", "up.warm_start.extend_steps=3",
         "up.warm_start.max_extensions=1", "up.warm_start.min_tier_accuracy=0.5", *overrides],
    )  # fmt: skip
    if cfg.up.task == "products":
        from tasks.products import write_task
    elif cfg.up.task == "when":
        from tasks.when import write_task
    else:
        from tasks.arith import write_task
    write_task(tmp_path / "data", 200, 10, seed=0)
    out = io.StringIO()
    sft = FakeSft(checks)
    return WarmStart(cfg, tmp_path, sft, lambda line: out.write(line + "\n")), sft, out


ARITH = ("quickstart.yaml", "up.task=arith", "up.warm_start.check_rows=4",
         "up.warm_start.tiers=[easy,hard]", "up.warm_start.target_exact=null")  # fmt: skip


def test_arith_extends_on_a_mix_toward_the_weak_tier_and_stops_once_learned(
    tmp_path: Path,
) -> None:
    config, *overrides = ARITH
    ws, sft, out = _warm_start(
        tmp_path, config, [{"easy": 0.1, "hard": 0.9}, {"easy": 0.6, "hard": 0.9}], *overrides
    )
    ws.run(tmp_path / "init", tmp_path / "sft")
    log = out.getvalue()
    assert log.count("warm start checked (greedy accuracy on 8 held-out train rows)") == 2
    assert "easy 0.10, hard 0.90" in log
    assert "supervised warm start extended for easy (below 0.5): 13 steps on" in log
    # Each check reached the console once, as its sft call ran (the resumed run's earlier lines
    # are not shown again).
    assert log.count("warm start check at step 10: exact match 0.000 (easy 0.10, hard 0.90)") == 1
    assert log.count("warm start check at step 13: exact match 0.000 (easy 0.60, hard 0.90)") == 1
    data = tmp_path / "data"
    assert [c["--data"] for c in sft.calls] == [str(data / "warm_start.parquet"),
                                                str(data / "warm_focus1.parquet")]  # fmt: skip
    assert [c["--steps"] for c in sft.calls] == ["10", "13"]
    # The extension's rows: the warm-start rows mixed toward the weak tier, seeded per extension.
    from tasks.arith import focus_mix

    train = pq.read_table(data / "warm_start.parquet").to_pylist()
    focus = pq.read_table(data / "warm_focus1.parquet").to_pylist()
    assert sum(r["extra_info"]["tier"] == "easy" for r in focus) / len(focus) >= FOCUS_SHARE
    assert focus == focus_mix(train, ["easy"], FOCUS_SHARE, seed=ws.cfg.run.seed)
    check = pq.read_table(data / "warm_check.parquet").to_pylist()
    assert len(check) == 8 and {r["extra_info"]["tier"] for r in check} == {"easy", "hard"}
    assert not {r["extra_info"]["index"] for r in check} & {r["extra_info"]["index"] for r in train}


def test_arith_names_the_tiers_it_gives_up_on(tmp_path: Path) -> None:
    config, *overrides = ARITH
    ws, sft, _ = _warm_start(tmp_path, config, [{"easy": 0.9, "hard": 0.1}] * 2, *overrides)
    with pytest.raises(RuntimeError) as e:
        ws.run(tmp_path / "init", tmp_path / "sft")
    assert str(e.value) == (
        "up.warm_start: tiers hard still below up.warm_start.min_tier_accuracy (0.5) after 13 "
        "steps and 1 extensions (up.warm_start.max_extensions); raise up.warm_start.steps or lr, "
        "or leave those tiers out of up.warm_start.tiers"
    )
    assert len(sft.calls) == 2


def test_products_extends_on_its_own_rows_and_gives_up_without_naming_tiers(
    tmp_path: Path,
) -> None:
    ws, sft, out = _warm_start(
        tmp_path, "agent_text.yaml", [{"products": 0.1}] * 2,
        "up.warm_start.rows=20", "up.warm_start.check_rows=5",
    )  # fmt: skip
    with pytest.raises(RuntimeError) as e:
        ws.run(tmp_path / "init", tmp_path / "sft")
    assert str(e.value) == (
        "up.warm_start: still below up.warm_start.min_tier_accuracy (0.5) after 13 steps and 1 "
        "extensions (up.warm_start.max_extensions); raise up.warm_start.steps or lr"
    )
    log = out.getvalue()
    assert (
        log.count("warm start checked (greedy exact match on 5 rows of unseen train questions)")
        == 2
    )
    assert "supervised warm start extended (below 0.5): 13 steps on" in log
    rows = str(tmp_path / "data" / "warm_start_answers.parquet")
    assert [c["--data"] for c in sft.calls] == [rows, rows]


def test_a_target_counts_the_extensions_from_the_step_the_check_stopped_at(tmp_path: Path) -> None:
    config, *overrides = ARITH
    overrides = [o for o in overrides if "target_exact" not in o]
    ws, sft, out = _warm_start(
        tmp_path, config, [{"easy": 0.9, "hard": 0.1}, {"easy": 0.9, "hard": 0.9}], *overrides,
        "up.warm_start.target_exact=0.5", "up.warm_start.check_every=5",
    )  # fmt: skip
    ws.run(tmp_path / "init", tmp_path / "sft")
    # The fake's first check is at its --steps (10): the extension trains to 13, not 10 + 10.
    assert [c["--steps"] for c in sft.calls] == ["10", "13"]
    assert "until the check's exact match reaches 0.5, at most: 10 steps" in out.getvalue()


def test_when_checks_each_tier_and_the_sft_control_trains_on_the_same_rows_at_rls_compute(
    tmp_path: Path,
) -> None:
    """The when task's half-and-half warm start is checked per tier; the SFT control then
    trains the warm-started model on the same demonstrations for learner.max_steps steps of
    train_batch_size x rollout.n rows."""
    ws, sft, out = _warm_start(
        tmp_path, "agent_when.yaml", [{"easy": 0.9, "hard": 0.8}, {}],
        "up.warm_start.rows=20", "up.warm_start.check_rows=6", "learner.max_steps=7",
        "learner.train_batch_size=3", "rollout.n=5",
    )  # fmt: skip
    ws.run(tmp_path / "init", tmp_path / "sft")
    assert "warm start checked (greedy exact match on " in out.getvalue()
    assert "easy 0.90, hard 0.80" in out.getvalue()
    rows = tmp_path / "data" / "warm_start_half_tool_calls.parquet"
    demos = pq.read_table(rows).to_pylist()
    called = {r["prompt"].split("\n")[1].split("=")[0] for r in demos if r["extra_info"]["called"]}
    direct = {
        r["prompt"].split("\n")[1].split("=")[0] for r in demos if not r["extra_info"]["called"]
    }
    assert len(called) == len(direct) == 10  # half of the 20 questions call
    ws.control(tmp_path / "sft", tmp_path / "control")
    control = sft.calls[-1]
    assert (control["--model"], control["--out"], control["--data"]) == (
        str(tmp_path / "sft"),
        str(tmp_path / "control"),
        str(rows),
    )
    assert (control["--steps"], control["--batch-size"]) == ("7", "15")
    assert control["--lr"] == str(ws.ws.lr)
    rows.unlink()
    with pytest.raises(RuntimeError, match=r"up\.sft_control: no warm-start demonstrations"):
        ws.control(tmp_path / "sft", tmp_path / "control")
