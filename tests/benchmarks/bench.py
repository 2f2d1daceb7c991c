"""The benchmark scripts as modules for their tests (``benchmarks/`` is not a package: each script
runs as ``python benchmarks/<name>.py``)."""

from __future__ import annotations

import importlib.util
import json
import sys
from pathlib import Path
from types import ModuleType

BENCHMARKS = Path(__file__).resolve().parents[2] / "benchmarks"


def bench_module(name: str) -> ModuleType:
    """``benchmarks/<name>.py`` imported under ``name`` (registered in ``sys.modules``, so that a
    script importing another, and pickling for worker processes, find it)."""
    spec = importlib.util.spec_from_file_location(name, BENCHMARKS / f"{name}.py")
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module
    spec.loader.exec_module(module)
    return module


def quick_report(module: ModuleType, tmp_path: Path, name: str) -> dict:
    """Run ``module``'s ``--quick`` form with its cache and output in ``tmp_path``; the report it
    wrote (``<name>.json``), once its figure (``<name>.png``) is checked to be there."""
    out = tmp_path / name
    assert module.main(["--quick", "--cache", str(tmp_path / "cache"), "--out", str(out)]) == 0
    assert out.with_suffix(".png").stat().st_size > 0
    return json.loads(out.with_suffix(".json").read_text())
