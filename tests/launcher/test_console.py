"""What ``up`` prints while its children work (:mod:`launcher.console`), read from the files they
write: the warm start's progress, the step lines, the warnings (each once), the data summary."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest

from dynamo_rl.config.up import RestartConfig
from dynamo_rl.notices import FILE, SERVICE_ENV
from launcher import console
from launcher.console import NoticeBoard, StepProgress, WarmStartProgress, data_lines
from launcher.supervisor import Supervisor


def _append(path: Path, *records: dict) -> None:
    with open(path, "a") as f:
        f.write("".join(json.dumps(r) + "\n" for r in records))


def test_warm_start_lines_first_every_tenth_and_last_with_rate_and_eta(tmp_path: Path) -> None:
    log = tmp_path / "metrics.jsonl"
    _append(log, {"step": 40, "loss": 9.0, "time_unix": 0.0})  # an earlier sft call's: skipped
    lines: list[str] = []
    progress = WarmStartProgress(log, 50, lines.append)
    _append(log, *({"step": s, "loss": 1.0 / s, "time_unix": 100.0 + 2 * s} for s in range(1, 51)))
    progress.poll()
    assert [x.split("  ")[0] for x in lines] == [
        f"warm start step {s}/50" for s in (1, *range(5, 51, 5))
    ]
    assert lines[0] == "warm start step 1/50  loss 1.0000"
    assert lines[1] == "warm start step 5/50  loss 0.2000  0.50 steps/s  ETA 90s"
    assert lines[-1] == "warm start step 50/50  loss 0.0200  0.50 steps/s  ETA 0s"
    _append(log, {"kind": "eval", "step": 50, "eval_exact": 0.25, "eval_exact/easy": 0.5,
                  "eval_exact/hard": 0.0, "eval_loss": 1.0})  # fmt: skip
    progress.poll()
    assert lines[-1] == "warm start check at step 50: exact match 0.250 (easy 0.50, hard 0.00)"


def test_a_quiet_warm_start_still_prints_a_line_every_quiet_interval(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    log = tmp_path / "metrics.jsonl"
    lines: list[str] = []
    progress = WarmStartProgress(log, 500, lines.append)
    _append(log, {"step": 1, "loss": 1.0}, {"step": 2, "loss": 1.0})
    progress.poll()
    assert len(lines) == 1  # step 2 is neither first nor a tenth: not yet due
    monkeypatch.setattr(console, "QUIET_S", 0.0)
    _append(log, {"step": 3, "loss": 1.0})
    progress.poll()
    assert lines[-1].startswith("warm start step 3/500  loss 1.0000")


def test_a_step_without_learning_signal_is_marked(tmp_path: Path) -> None:
    log = tmp_path / "metrics.jsonl"
    lines: list[str] = []
    _append(log, {"step": 1, "responses": 8, "reward_mean": 0.0, "rewards_all_equal": True},
            {"step": 2, "responses": 8, "reward_mean": 0.5, "rewards_all_equal": False})  # fmt: skip
    progress = StepProgress(log, 2, lines.append)
    progress.poll()
    assert lines[0].startswith("step 1/2  rollouts 8  reward 0")
    assert lines[0].endswith("  no signal (every reward equal)")
    assert "no signal" not in lines[1] and progress.last == 2


def test_a_step_a_teacher_scored_shows_its_kl_and_has_a_signal(tmp_path: Path) -> None:
    """Distillation trains on the teacher's per-token log-probs even when every reward is equal."""
    log = tmp_path / "metrics.jsonl"
    lines: list[str] = []
    _append(log, {"step": 1, "responses": 8, "reward_mean": 0.0, "rewards_all_equal": True,
                  "opd_reverse_kl": 0.4321})  # fmt: skip
    StepProgress(log, 1, lines.append).poll()
    assert lines == ["step 1/1  rollouts 8  reward 0  kl to teacher 0.432"]


def test_each_warning_is_shown_once_naming_the_service_and_its_log(tmp_path: Path) -> None:
    run, sft, logs = tmp_path / "run", tmp_path / "run" / "model" / "sft.run", tmp_path / "logs"
    sft.mkdir(parents=True)
    logs.mkdir()
    (logs / "rollout0.log").write_text("")
    lines: list[str] = []
    board = NoticeBoard([run, sft], lines.append, logs)
    assert board.poll() == []
    note = {"kind": "prompts_over_length", "about": "d", "message": "2 of 3 prompts exceed 8"}
    _append(run / FILE, {"service": "rollout0", **note})
    _append(
        sft / FILE, {"service": "sft", "kind": "examples_too_long", "about": "d", "message": "m"}
    )
    board.poll()
    _append(run / FILE, {"service": "rollout1", **note})  # another worker: the same warning
    board.poll()
    assert lines == [
        f"warning from rollout0: 2 of 3 prompts exceed 8 (more in {logs / 'rollout0.log'})",
        "warning from sft: m (more in the sft service's log)",
    ]
    assert [n.service for n in board.shown] == ["rollout0", "sft"]  # what up's summary counts


def test_the_data_summary_names_rows_sources_context_and_the_setting() -> None:
    summary = {
        "dataset": "d.parquet", "rows": 7473, "kept": 2046, "over": 5427, "limit": 256,
        "policy": "drop", "context": 512, "max_tokens": 256, "max_prompt_len": None,
        "hint": "73% of the prompts are dropped: ...",
        "sources": [{"data_source": "openai/gsm8k", "kind": "math", "rows": 7473,
                     "scorer": "math, gsm8k (reward.routes.openai/gsm8k)"}],
    }  # fmt: skip
    assert data_lines(summary) == [
        "training data d.parquet: 2,046 of 7,473 rows kept (5,427 longer than 256 tokens dropped, "
        "rollout.prompt_len_policy=drop)",
        "  data source openai/gsm8k: 7,473 rows, scored by math, gsm8k (reward.routes.openai/gsm8k)",
        "  model context 512 tokens, rollout.sampling.max_tokens 256: prompts up to 256 tokens",
        "  73% of the prompts are dropped: ...",
    ]
    pool = summary | {"rows": 384, "kept": 384, "over": 0, "max_prompts": 384}
    assert data_lines(pool)[0] == (
        "training data d.parquet: 384 of 384 rows kept (the file's first rows, rollout.max_prompts)"
    )
    whole = summary | {"kept": 7473, "over": 0, "hint": None, "context": None, "limit": None}
    assert data_lines(whole)[0] == "training data d.parquet: 7,473 of 7,473 rows kept"
    assert data_lines(whole)[-1] == (
        "  model context unknown, rollout.sampling.max_tokens 256: no prompt length limit"
    )


def test_the_supervisor_names_each_child_and_polls_while_a_step_runs(tmp_path: Path) -> None:
    sup = Supervisor(tmp_path, RestartConfig())
    polls: list[int] = []
    code = f"import os, time; time.sleep(0.5); print(os.environ[{SERVICE_ENV!r}])"
    sup.run_step("data-check", [sys.executable, "-c", code], lambda: polls.append(1))
    assert (tmp_path / "logs" / "data-check.log").read_text().strip() == "data-check"
    assert len(polls) >= 2  # meanwhile, and once more at the end
