"""The long-tail task: short and worked-sum tiers whose reference responses differ over tenfold in
length, each reference ending in the boxed true sum."""

from __future__ import annotations

import re
from pathlib import Path

import pyarrow.parquet as pq

from tasks.longtail import CHAIN_TERMS, DATA_SOURCE, write_task


def test_rows_span_ten_times_in_length_and_are_right(tmp_path: Path) -> None:
    paths = write_task(tmp_path, 400, 100, seed=3)
    train = pq.read_table(paths["train"]).to_pylist()
    test = pq.read_table(paths["test"]).to_pylist()
    assert len(train) == 400 and len(test) == 100
    questions = [r["prompt"][0]["content"] for r in train + test]
    assert len(set(questions)) == 500  # train and test never share a question
    lengths: dict[str, list[int]] = {"short": [], "long": []}
    for r in train + test:
        info, truth = r["extra_info"], int(r["reward_model"]["ground_truth"])
        assert r["data_source"] == DATA_SOURCE
        terms = [int(t) for t in r["prompt"][0]["content"].rstrip("=").split("+")]
        assert sum(terms) == truth
        assert info["answer"].endswith(f"\\boxed{{{truth}}}")
        if info["tier"] == "long":
            assert len(terms) == CHAIN_TERMS
            # Every step of the worked sum is a true running total.
            for a, b, c in re.findall(r"(\d+)\+(\d+)=(\d+)", info["answer"]):
                assert int(a) + int(b) == int(c)
        lengths[info["tier"]].append(len(info["answer"]))
    assert 0.1 < len(lengths["long"]) / 500 < 0.3
    assert min(lengths["long"]) >= 10 * max(lengths["short"])
