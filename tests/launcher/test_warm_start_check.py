"""``up``'s checked warm start on the built-in task: per-tier greedy accuracy on held-out train rows,
extensions that resume the same sft run, and a clear error when a tier stays unlearned."""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

import pyarrow.parquet as pq
import pytest

from tests.conftest import REPO, dynamo_rl_argv

TIERS = ["easy", "medium", "medium-rev", "medium-sub", "hard"]


def up_stopped_by_the_check(run_dir: Path, *overrides: str) -> subprocess.CompletedProcess:
    """The quickstart shrunk to a 10-step warm start checked on 8 rows per tier, whose tiers
    (below 0.5) get one 3-step extension and then stop the run (exit 1)."""
    argv = dynamo_rl_argv(
        "up", "--config", str(REPO / "configs" / "quickstart.yaml"), f"run.dir={run_dir}",
        "up.task_train=300", "up.task_test=16", "up.tiny_model.hidden_size=32",
        "up.tiny_model.num_heads=2", "up.tiny_model.num_kv_heads=1", "up.warm_start.steps=10",
        "up.warm_start.batch_size=16", "up.warm_start.check_rows=8",
        "up.warm_start.min_tier_accuracy=0.5", "up.warm_start.max_extensions=1",
        "up.warm_start.extend_steps=3", *overrides,
    )  # fmt: skip
    r = subprocess.run(argv, capture_output=True, text=True, timeout=900, cwd=REPO, check=False)
    assert r.returncode == 1, r.stdout[-3000:] + r.stderr[-3000:]
    return r


@pytest.mark.slow
def test_unlearned_tiers_extend_the_warm_start_then_stop_the_run(tmp_path: Path) -> None:
    run_dir = tmp_path / "run"
    # 10 steps of a tiny model learn nothing exactly: every tier is below 0.5, so the warm start
    # is extended once (3 more steps, resumed) and then the run stops naming the keys.
    r = up_stopped_by_the_check(run_dir, "up.warm_start.target_exact=null")
    assert "supervised warm start: 10 steps on" in r.stdout  # no target: the steps as given
    data = run_dir / "data"
    check = pq.read_table(data / "warm_check.parquet").to_pylist()
    train = pq.read_table(data / "warm_start.parquet").to_pylist()
    assert len(check) == 8 * len(TIERS)
    assert not {c["extra_info"]["index"] for c in check} & {t["extra_info"]["index"] for t in train}
    assert r.stdout.count("warm start checked (greedy accuracy on 40 held-out train rows)") == 2
    assert "extended for easy, medium, medium-rev, medium-sub, hard (below 0.5): 13 steps" in (
        r.stdout
    )
    assert "up.warm_start.min_tier_accuracy (0.5) after 13 steps and 1 extensions" in r.stdout
    assert "up.warm_start.max_extensions" in r.stdout
    records = [json.loads(x) for x in (run_dir / "model" / "sft.run" / "metrics.jsonl")
               .read_text().splitlines()]  # fmt: skip
    # One run resumed, not restarted: steps 1..13 once each; the checks at steps 10 and 13.
    assert [x["step"] for x in records if x.get("kind") != "eval"] == list(range(1, 14))
    evals = [x for x in records if x.get("kind") == "eval"]
    assert {x["step"] for x in evals} == {0, 10, 13}
    assert all(set(TIERS) <= {k.split("/", 1)[1] for k in x if "/" in k} for x in evals)


@pytest.mark.slow
def test_a_reached_target_stops_the_warm_start_and_extensions_count_from_there(
    tmp_path: Path,
) -> None:
    run_dir = tmp_path / "run"
    # target_exact 0: the check before any step already reaches it, so the warm start trains 0 of
    # its 10 steps; the tiers are then below 0.5, and the one extension trains 3 steps from there
    # (not from the 10 the config allowed).
    r = up_stopped_by_the_check(
        run_dir, "up.warm_start.target_exact=0", "up.warm_start.check_every=5"
    )
    assert "until the check's exact match reaches 0.0, at most: 10 steps" in r.stdout
    assert "warm start: 0 steps, exact match 0.000 on the check (target 0.0)" in r.stdout
    assert "(below 0.5): 3 steps" in r.stdout
    assert "up.warm_start.min_tier_accuracy (0.5) after 3 steps and 1 extensions" in r.stdout
    records = [json.loads(x) for x in (run_dir / "model" / "sft.run" / "metrics.jsonl")
               .read_text().splitlines()]  # fmt: skip
    assert [x["step"] for x in records if x.get("kind") != "eval"] == [1, 2, 3]
    assert sorted({x["step"] for x in records if x.get("kind") == "eval"}) == [0, 3]
