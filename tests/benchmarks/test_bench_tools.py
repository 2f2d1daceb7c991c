"""The tool benchmark (benchmarks/bench_tools.py): its ``--quick`` form drives code_interpreter
episodes against a real reward service's ``/run_code`` end to end, every call is counted, the
clean cells run without error, and the faulty mix's timeouts and failures are each counted as the
cells were written (none escapes as a crash)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from tests.benchmarks.bench import bench_module


@pytest.fixture(scope="module")
def bench():
    return bench_module("bench_tools")


def test_faulty_mix_has_both_faults_and_clean_cells_print_their_product(bench) -> None:
    want = bench.expected_faults(8, 3)
    assert want["timeout"] >= 1 and want["failed"] >= 1
    assert want["timeout"] + want["failed"] < 8 * 3
    assert bench.cell(2, 1) == "print(1007 * 2049)"


@pytest.mark.slow
def test_quick_run_counts_every_call_and_fault(bench, tmp_path: Path) -> None:
    out = tmp_path / "tools.json"
    assert bench.main(["--quick", "--json", str(out)]) == 0
    report = json.loads(out.read_text())
    episodes, turns = report["episodes"], report["turns"]
    assert [r["tool_path"]["concurrency"] for r in report["rounds"]] == [1, 4]
    for r in report["rounds"]:
        for side in ("tool_path", "bare"):
            f = r[side]
            assert f["tool_calls"] == episodes * turns and f["errors"] == {}
            assert f["tool_calls_per_s"] > 0 and 0 < f["p50_ms"] <= f["p99_ms"]
        assert r["tool_path"]["episodes"] == episodes and r["tool_path"]["crashes"] == 0
    faulty = report["faulty"]
    assert faulty["crashes"] == 0 and faulty["episodes"] == episodes
    assert faulty["tool_calls"] == episodes * turns
    assert faulty["errors"] == faulty["expected"]
