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


def rollouts(rewards: list[float], groups: list[int], seed: int = 0) -> tuple:
    """8 rollouts for the tiny model: prompts of 5 tokens (every other one left-padded by 2),
    responses of 6 tokens of which 6, 3, 5, 1, 6, 4, 2, 6 are valid; ``(token ids [8, 11], prompt
    attention [8, 5], response mask [8, 6], rewards [8], groups)``."""
    import torch

    gen = torch.Generator().manual_seed(seed)
    b, p, t = 8, 5, 6
    prompt_attn = torch.ones(b, p, dtype=torch.long)
    prompt_attn[::2, :2] = 0
    seq = torch.randint(3, 200, (b, p + t), generator=gen)
    lengths = torch.tensor([6, 3, 5, 1, 6, 4, 2, 6])
    rmask = (torch.arange(t)[None] < lengths[:, None]).long()
    return seq, prompt_attn, rmask, torch.tensor(rewards), groups
