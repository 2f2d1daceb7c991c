"""The benchmark scripts as modules for their tests (``benchmarks/`` is not a package: each script
runs as ``python benchmarks/<name>.py``)."""

from __future__ import annotations

import importlib.util
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
