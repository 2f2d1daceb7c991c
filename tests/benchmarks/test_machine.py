"""The benchmarks' result writer (``benchmarks/_machine.py``): every result file carries the machine
it was measured on, and no script writes its result JSON around the writer."""

from __future__ import annotations

import ast
import json
import os
import platform
import subprocess
from collections import Counter
from pathlib import Path

import pytest
import torch

from tests.benchmarks.bench import BENCHMARKS, bench_module

REPO = BENCHMARKS.parent


@pytest.fixture(scope="module")
def machine():
    return bench_module("_machine")


def _git(*args: str) -> str | None:
    done = subprocess.run(["git", *args], cwd=REPO, capture_output=True, text=True)
    return done.stdout.strip() if done.returncode == 0 else None


def test_the_writer_adds_the_machine_record_and_keeps_the_payload(machine, tmp_path: Path) -> None:
    payload = {"figures": [1.5, 2.0], "settings": {"seeds": [0, 1]}, "note": "x"}
    out = tmp_path / "made" / "result.json"  # its folder made
    returned = machine.write_result(out, payload, indent=1)
    doc = json.loads(out.read_text())
    assert doc == returned
    assert {k: v for k, v in doc.items() if k != "machine"} == payload
    assert "machine" not in payload  # the caller's dict is not changed
    record = doc["machine"]
    assert tuple(record) == machine.FIELDS == (
        "cpu_model", "cpus", "torch_cpu_capability", "threads", "interop_threads", "python",
        "torch", "transformers", "commit", "dirty",
    )  # fmt: skip
    assert record["cpu_model"] and record["cpus"] == os.cpu_count()
    assert record["torch_cpu_capability"] == torch.backends.cpu.get_cpu_capability()
    assert record["threads"] == torch.get_num_threads()
    assert record["interop_threads"] == torch.get_num_interop_threads()
    assert record["python"] == platform.python_version()
    assert record["torch"] == torch.__version__ and record["transformers"]
    # The commit of the checkout the benchmarks live in, and whether a tracked file differs from it
    # (None, None outside a git checkout).
    head = _git("rev-parse", "HEAD")
    assert record["commit"] == head
    status = _git("status", "--porcelain", "--untracked-files=no")
    assert record["dirty"] is (None if head is None else bool(status))
    assert [p.name for p in out.parent.iterdir()] == ["result.json"]  # no temporary file left


def test_the_writer_keeps_a_given_machine_dicts_other_keys(machine, tmp_path: Path) -> None:
    out = tmp_path / "r.json"
    machine.write_result(out, {"machine": {"cpus": -1, "loadavg_at_end": [1.0, 2.0, 3.0]}})
    record = json.loads(out.read_text())["machine"]
    assert record["loadavg_at_end"] == [1.0, 2.0, 3.0] and record["cpus"] == os.cpu_count()


def test_outside_a_git_checkout_the_commit_is_none(machine, tmp_path, monkeypatch) -> None:
    monkeypatch.setattr(machine, "REPO", tmp_path)
    out = tmp_path / "r.json"
    machine.write_result(out, {"a": 1})
    record = json.loads(out.read_text())["machine"]
    assert record["commit"] is None and record["dirty"] is None


def test_a_failed_write_leaves_the_old_file(machine, tmp_path: Path, monkeypatch) -> None:
    out = tmp_path / "r.json"
    out.write_text('{"old": true}\n')
    with pytest.raises(TypeError):  # not JSON
        machine.write_result(out, {"figure": object()})

    def no_rename(*_):
        raise OSError("disk gone")

    monkeypatch.setattr(machine.os, "replace", no_rename)
    with pytest.raises(OSError, match="disk gone"):  # written, then not renamed over the old one
        machine.write_result(out, {"figure": 1.0})
    assert out.read_text() == '{"old": true}\n'
    assert [p.name for p in tmp_path.iterdir()] == ["r.json"]


# Files the scripts write as JSON themselves: scratch handed between their own processes, never a
# result. (script, function) -> why.
NOT_RESULTS = {
    ("agent_recipe.py", "run_up"): "load.json: the load average sampled during one run, read "
    "back into that run's record in the result",
    ("bench_lora.py", "worker"): "a variant's figures handed to the driver, which prints them",
    ("bench_push.py", "worker"): "a worker's pushes handed to the driver, which prints them",
    ("fleet.py", "serve_engines"): "the simulated engines' ports, read by the driver",
    ("fleet.py", "_write_json"): "the stream reader's running totals, read by the driver",
    ("informative_batch.py", "run_one"): "one (arm, seed) run's cache file, its figures copied "
    "into the result's runs",
    ("sample_efficiency.py", "run_one"): "one (method, seed) run's cache file, its figures "
    "copied into the result's runs",
    ("stability.py", "run_one"): "one (method, lr, seed) run's cache file, its figures copied "
    "into the result's runs",
}


def _is_json_dumps(node: ast.AST, name: str = "dumps") -> bool:
    return (
        isinstance(node, ast.Call)
        and isinstance(node.func, ast.Attribute)
        and node.func.attr == name
        and isinstance(node.func.value, ast.Name)
        and node.func.value.id == "json"
    )


def _own_nodes(scope: ast.AST) -> tuple[list[ast.AST], list[ast.AST]]:
    """The nodes of ``scope``'s own code (not those inside the functions nested in it), and those
    functions."""
    nodes: list[ast.AST] = []
    inner: list[ast.AST] = []
    stack = list(ast.iter_child_nodes(scope))
    while stack:
        node = stack.pop()
        if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef):
            inner.append(node)
            continue
        nodes.append(node)
        stack.extend(ast.iter_child_nodes(node))
    return nodes, inner


def json_writes(source: str) -> list[tuple[str, int]]:
    """``(innermost function, line)`` of each place ``source`` writes JSON to a file itself:
    ``json.dump(...)``; a ``.write_text``/``.write``/``.write_bytes`` call, or a ``print(...,
    file=...)``, given ``json.dumps(...)`` or a name assigned from it in the same function."""
    found: list[tuple[str, int]] = []

    def scan(scope: ast.AST, where: str) -> None:
        nodes, inner = _own_nodes(scope)
        dumped = {
            target.id
            for n in nodes
            if isinstance(n, ast.Assign | ast.AnnAssign) and n.value is not None
            and any(map(_is_json_dumps, ast.walk(n.value)))
            for target in (n.targets if isinstance(n, ast.Assign) else [n.target])
            if isinstance(target, ast.Name)
        }  # fmt: skip

        def holds_json(arg: ast.AST) -> bool:
            return any(
                _is_json_dumps(n) or (isinstance(n, ast.Name) and n.id in dumped)
                for n in ast.walk(arg)
            )

        for n in nodes:
            if not isinstance(n, ast.Call):
                continue
            writes = isinstance(n.func, ast.Attribute) and n.func.attr in (
                "write_text", "write", "write_bytes",
            )  # fmt: skip
            printed = (
                isinstance(n.func, ast.Name)
                and n.func.id == "print"
                and any(k.arg == "file" for k in n.keywords)
            )
            if _is_json_dumps(n, "dump") or ((writes or printed) and any(map(holds_json, n.args))):
                found.append((where, n.lineno))
        for fn in inner:
            scan(fn, fn.name)

    scan(ast.parse(source), "<module>")
    return sorted(found)


def test_the_scan_finds_direct_json_writes() -> None:
    source = """
import json
def direct(out, doc):
    out.write_text(json.dumps(doc, indent=2) + "\\n")
def through_a_name(out, doc):
    text = json.dumps(doc)
    with open(out, "w") as f:
        f.write(text)
def dumped(out, doc):
    def inner():
        with open(out, "w") as f:
            json.dump(doc, f)
    inner()
def printed(f, doc):
    print(json.dumps(doc), file=f)
def fine(out, doc):
    print(json.dumps(doc))
    out.write_text("ok")
"""
    assert json_writes(source) == [
        ("direct", 4), ("inner", 12), ("printed", 15), ("through_a_name", 8),
    ]  # fmt: skip


def test_no_benchmark_writes_its_result_json_around_the_writer() -> None:
    """Every JSON file a script writes itself is a scratch file named in ``NOT_RESULTS``; results
    go through ``_machine.write_result`` (which carries the machine record)."""
    scripts = sorted(p for p in BENCHMARKS.rglob("*.py") if p.name != "_machine.py")
    assert len(scripts) > 20
    found = [(p.name, where, line) for p in scripts for where, line in json_writes(p.read_text())]
    direct = [f"{name}:{line} in {where}" for name, where, line in found
              if (name, where) not in NOT_RESULTS]  # fmt: skip
    assert not direct, f"result JSON written without _machine.write_result: {direct}"
    # Each exception is one write, still there (a stale or wider one would let a result write
    # slip in under its name).
    per_function = Counter((name, where) for name, where, _ in found)
    assert per_function == dict.fromkeys(NOT_RESULTS, 1)


def test_the_scripts_that_write_results_use_the_writer() -> None:
    """The scripts whose result files are under ``benchmarks/results`` (or ``--out``/``--json``)
    call the writer (agent_code.py and agent_when.py through agent_recipe.write_doc, distill.py
    through quickstart_seeds.write_with_plot)."""
    users = {p.name for p in BENCHMARKS.glob("*.py") if "write_result(" in p.read_text()}
    assert users >= {
        "agent_recipe.py", "bench_tools.py", "fleet.py", "grad_variance.py",
        "longtail_updates.py", "quickstart_seeds.py", "recipes.py", "sample_efficiency.py",
        "stability.py",
    }  # fmt: skip
    for name in ("agent_code.py", "agent_when.py"):
        assert "write_doc(" in (BENCHMARKS / name).read_text()
    assert "write_with_plot(" in (BENCHMARKS / "distill.py").read_text()
    qs = (BENCHMARKS / "quickstart_seeds.py").read_text()
    assert "def write_with_plot(" in qs and "    write_result(out, doc" in qs
