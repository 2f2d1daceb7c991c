"""The machine a result was measured on, for the result file: the same code gives different figures
on another CPU (ATen picks its kernels by the CPU's capability) or with other library versions."""

from __future__ import annotations

import os
import platform
from importlib import metadata
from pathlib import Path
from typing import Any


def _cpu_model() -> str:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or "unknown"


def _version(package: str) -> str | None:
    try:
        return metadata.version(package)
    except metadata.PackageNotFoundError:
        return None


def machine_info() -> dict[str, Any]:
    """CPU model, cores, torch's CPU capability (the kernels it uses: ``AVX512``, ``AVX2``,
    ``DEFAULT``) and the versions of Python, torch and transformers."""
    import torch

    return {
        "cpu_model": _cpu_model(),
        "cpus": os.cpu_count(),
        "torch_cpu_capability": torch.backends.cpu.get_cpu_capability(),
        "python": platform.python_version(),
        "torch": _version("torch"),
        "transformers": _version("transformers"),
    }
