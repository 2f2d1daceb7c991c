from __future__ import annotations

import subprocess
from collections import Counter
from pathlib import Path

import pyarrow.parquet as pq
import pytest

from tasks.arith import TIERS, check_split, focus_mix, generate_rows
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


def test_check_split_holds_out_rows_per_tier_never_trained_on() -> None:
    train_rows, _ = generate_rows(1000, 10, seed=2)
    tiers = ["easy", "medium-sub", "hard"]
    train, check = check_split(train_rows, tiers, per_tier=20)
    by_tier = Counter(r["extra_info"]["tier"] for r in check)
    assert by_tier == dict.fromkeys(tiers, 20)
    assert {r["extra_info"]["tier"] for r in train} == set(tiers)
    assert not {_question(r) for r in train} & {_question(r) for r in check}
    wanted = [r for r in train_rows if r["extra_info"]["tier"] in tiers]
    assert len(train) + len(check) == len(wanted)
    # A small tier keeps at least half of its rows for training.
    few = [r for r in train_rows if r["extra_info"]["tier"] == "easy"][:6]
    train, check = check_split(few, ["easy"], per_tier=20)
    assert len(train) == len(check) == 3


def test_focus_mix_gives_the_focus_tiers_their_share_and_keeps_every_row() -> None:
    rows, _ = generate_rows(1000, 10, seed=2)
    focus = ["medium-sub"]
    mix = focus_mix(rows, focus, 0.5, seed=1)
    share = sum(r["extra_info"]["tier"] in focus for r in mix) / len(mix)
    assert abs(share - 0.5) < 0.01, share
    # Every row at least once; only the focus tier's rows repeat (and each at most once more
    # than the others of its tier).
    count = Counter(r["extra_info"]["index"] for r in mix)
    assert set(count) == {r["extra_info"]["index"] for r in rows}
    tier_of = {r["extra_info"]["index"]: r["extra_info"]["tier"] for r in rows}
    assert all(c == 1 for i, c in count.items() if tier_of[i] not in focus)
    repeats = [c for i, c in count.items() if tier_of[i] in focus]
    assert max(repeats) - min(repeats) <= 1 and max(repeats) >= 2
    assert focus_mix(rows, focus, 0.5, seed=1) == mix
    # A focus tier already above the share is not cut.
    assert len(focus_mix(rows, ["medium", "medium-rev", "medium-sub"], 0.2)) == len(rows)
    with pytest.raises(ValueError, match="no rows of the tiers nope"):
        focus_mix(rows, ["nope"], 0.5)
