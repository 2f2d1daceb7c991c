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


def _contracts() -> list[dict]:
    import tomllib
    from pathlib import Path

    root = Path(__file__).resolve().parents[1]
    return tomllib.loads((root / "pyproject.toml").read_text())["tool"]["importlinter"]["contracts"]


def test_every_service_folder_is_in_the_independence_contract_without_exceptions() -> None:
    """A new service folder must be listed (otherwise import-linter checks nothing of it), and the
    contracts that keep services apart and below the launcher allow no exception."""
    from pathlib import Path

    root = Path(__file__).resolve().parents[1]
    services = {f"services.{p.parent.name}" for p in (root / "services").glob("*/__init__.py")} | {
        "allocator",
        "learner",
    }
    by_name = {c["name"]: c for c in _contracts()}
    apart = by_name["no service imports another service's folder"]
    assert apart["type"] == "independence" and set(apart["modules"]) == services
    below = by_name["no service imports the launcher (nor the dashboard or tasks)"]
    assert set(below["source_modules"]) == {"services", "allocator", "learner"}
    assert "launcher" in below["forbidden_modules"]
    for contract in (apart, below):
        assert not contract.get("ignore_imports"), contract["name"]


def test_no_service_reaches_another_or_the_launcher_in_the_graph() -> None:
    """The same rule on the real graph (lazy imports included), so it holds in the test suite
    too, not only under ``scripts/lint.sh``."""
    graph = grimp.build_graph(*PACKAGES, cache_dir=None)
    services = ["services.rollout", "services.reward", "services.engine", "services.reward_model",
                "allocator", "learner"]  # fmt: skip
    chains = [
        chain
        for a in services
        for b in [*services, "launcher"]
        if a != b
        for chain in graph.find_shortest_chains(importer=a, imported=b, as_packages=True)
    ]
    assert chains == []
    # The search itself finds a package's chains (a service does import the shared package).
    assert graph.find_shortest_chains(importer="services.rollout", imported="dynamo_rl")
