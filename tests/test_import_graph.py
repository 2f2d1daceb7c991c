"""No import cycle anywhere in the project, lazy imports included.

import-linter checks which package may import which (``[tool.importlinter]`` in pyproject.toml);
its contracts have no "no cycles between modules" type, so this walks the same graph with grimp
(installed with import-linter), which also sees imports inside functions and under
``TYPE_CHECKING``, and fails on every strongly connected set of modules."""

from __future__ import annotations

import sys

import pytest

grimp = pytest.importorskip("grimp")

PACKAGES = ("dynamo_rl", "allocator", "learner", "services", "launcher", "dashboard", "tasks")

# Cycles tolerated, each to be removed by the change that breaks it (the test then fails until its
# entry goes too). None today.
KNOWN: list[list[str]] = []


def cycles(graph) -> list[list[str]]:
    """The sets of modules that import each other, directly or through others (Tarjan's strongly
    connected components with more than one module, or a module importing itself)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[list[str]] = []

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        on_stack.add(v)
        imported = graph.find_modules_directly_imported_by(v)
        for w in sorted(imported):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on_stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            component = []
            while True:
                w = stack.pop()
                on_stack.discard(w)
                component.append(w)
                if w == v:
                    break
            if len(component) > 1 or v in imported:
                found.append(sorted(component))

    limit = sys.getrecursionlimit()
    sys.setrecursionlimit(max(limit, 10_000))
    try:
        for module in sorted(graph.modules):
            if module not in index:
                visit(module)
    finally:
        sys.setrecursionlimit(limit)
    return sorted(found)


def test_the_cycle_finder_finds_a_lazy_cycle_and_no_false_one() -> None:
    graph = grimp.ImportGraph()
    for m in ("a", "a.x", "a.y", "a.z"):
        graph.add_module(m)
    graph.add_import(importer="a.x", imported="a.y")
    graph.add_import(importer="a.y", imported="a.z")
    assert cycles(graph) == []
    graph.add_import(importer="a.z", imported="a.x")  # e.g. inside a function
    assert cycles(graph) == [["a.x", "a.y", "a.z"]]


def test_no_import_cycle_between_modules() -> None:
    graph = grimp.build_graph(*PACKAGES, cache_dir=None)
    assert cycles(graph) == KNOWN
