from __future__ import annotations

import subprocess
from collections import Counter
from pathlib import Path

import pyarrow.parquet as pq

from dynamo_rl.tasks.arith import TIERS, generate_rows
from tests.conftest import dynamo_rl_argv


def _question(row: dict) -> str:
    return row["prompt"][0]["content"]


def test_rows_follow_verl_layout_and_answers_are_right() -> None:
    train, test = generate_rows(300, 100, seed=1)
    assert len(train) == 300 and len(test) == 100
    for row in train + test:
        assert row["data_source"] == "arith"
        assert row["prompt"][0]["role"] == "user"
        q = _question(row).removesuffix("=")
        assert str(eval(q)) == row["reward_model"]["ground_truth"]
        assert row["extra_info"]["answer"] == "\\boxed{" + row["reward_model"]["ground_truth"] + "}"
    assert [r["extra_info"]["index"] for r in train] == list(range(300))


def test_splits_are_disjoint_mixed_and_seeded() -> None:
    train, test = generate_rows(2000, 1000, seed=0)
    assert not {_question(r) for r in train} & {_question(r) for r in test}
    tiers = Counter(r["extra_info"]["tier"] for r in test)
    assert set(tiers) == {t.name for t in TIERS}
    assert generate_rows(50, 10, seed=3) == generate_rows(50, 10, seed=3)
    assert generate_rows(50, 10, seed=3) != generate_rows(50, 10, seed=4)


def test_cli_writes_parquet(tmp_path: Path) -> None:
    result = subprocess.run(
        dynamo_rl_argv("task", "arith", "--out", str(tmp_path), "--train", "40", "--test", "10"),
        capture_output=True,
        text=True,
        check=False,
    )
    assert result.returncode == 0, result.stderr
    table = pq.read_table(tmp_path / "train.parquet")
    assert table.num_rows == 40
    assert set(table.column_names) == {
        "data_source",
        "prompt",
        "ability",
        "reward_model",
        "extra_info",
    }
    bad = subprocess.run(
        dynamo_rl_argv("task", "arith", "--out", str(tmp_path), "--test", "0"),
        capture_output=True,
        text=True,
        check=False,
    )
    assert bad.returncode == 2 and "--test" in bad.stderr
