"""The machine a result was measured on, and the one writer of the benchmarks' result files.

The same code gives different figures on another CPU (ATen picks its kernels by the CPU's
capability), with other library versions or another thread count, so every result JSON a benchmark
script writes goes through :func:`write_result`, which adds :func:`machine_info`'s record under
``"machine"``. ``tests/benchmarks/test_machine.py`` checks that no script writes its result JSON
another way."""

from __future__ import annotations

import json
import os
import platform
import subprocess
import uuid
from importlib import metadata
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]

# The record's keys, in order; stable (result files are compared across commits by them).
FIELDS = (
    "cpu_model",
    "cpus",
    "torch_cpu_capability",
    "threads",
    "interop_threads",
    "python",
    "torch",
    "transformers",
    "commit",
    "dirty",
)


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


def _git(*args: str) -> str | None:
    try:
        done = subprocess.run(
            ["git", *args], cwd=REPO, capture_output=True, text=True, timeout=30, check=True
        )
    except (OSError, subprocess.SubprocessError):
        return None
    return done.stdout


def git_commit() -> tuple[str | None, bool | None]:
    """``(commit, dirty)`` of the checkout holding ``benchmarks/``: ``git rev-parse HEAD``, and
    whether ``git status --porcelain --untracked-files=no`` lists a change to a tracked file.
    ``(None, None)`` where that folder is not the top of a git checkout or git is missing."""
    top = _git("rev-parse", "--show-toplevel")
    if top is None or Path(top.strip()).resolve() != REPO:
        return None, None
    head = _git("rev-parse", "HEAD")
    status = _git("status", "--porcelain", "--untracked-files=no")
    commit = head.strip() if head else None
    return commit, (None if status is None or commit is None else bool(status.strip()))


def machine_info() -> dict[str, Any]:
    """The machine record, its keys those of ``FIELDS``:

    - ``cpu_model``: the CPU's model name (``/proc/cpuinfo``);
    - ``cpus``: ``os.cpu_count()``;
    - ``torch_cpu_capability``: ``torch.backends.cpu.get_cpu_capability()``, the kernels ATen
      uses (``AVX512``, ``AVX2``, ``DEFAULT``);
    - ``threads``, ``interop_threads``: ``torch.get_num_threads()`` and
      ``torch.get_num_interop_threads()`` in the process that writes the file (runs in child
      processes may set their own: ``dynamo-rl up`` sets one thread);
    - ``python``, ``torch``, ``transformers``: their versions;
    - ``commit``: ``git rev-parse HEAD`` of this checkout; ``dirty``: whether a tracked file
      differs from it (untracked files are not counted). Both None outside a git checkout.

    The torch fields are None where torch is not installed."""
    try:
        import torch
    except ImportError:
        torch = None
    commit, dirty = git_commit()
    record = {
        "cpu_model": _cpu_model(),
        "cpus": os.cpu_count(),
        "torch_cpu_capability": torch.backends.cpu.get_cpu_capability() if torch else None,
        "threads": torch.get_num_threads() if torch else None,
        "interop_threads": torch.get_num_interop_threads() if torch else None,
        "python": platform.python_version(),
        "torch": _version("torch"),
        "transformers": _version("transformers"),
        "commit": commit,
        "dirty": dirty,
    }
    return record


def write_result(path: str | os.PathLike[str], payload: dict[str, Any], **dumps: Any) -> dict:
    """Write ``payload`` to ``path`` as JSON with :func:`machine_info`'s record under
    ``"machine"``: its folder made, through a temporary file in that folder renamed over ``path``
    (a reader never sees half a file). ``dumps`` goes to ``json.dumps`` (``indent``,
    ``separators``, ``default``). A ``"machine"`` dict already in the payload keeps its keys the
    record lacks (e.g. a load average). ``payload`` is not changed; the written document is
    returned."""
    given = payload.get("machine") or {}
    if not isinstance(given, dict):
        raise TypeError(f"payload['machine'] is {type(given).__name__}, not a dict")
    doc = {**payload, "machine": {**given, **machine_info()}}
    text = json.dumps(doc, **dumps) + "\n"
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    # A name of its own in the same folder (the rename stays on one file system), made with the
    # default permissions (``tempfile.mkstemp`` would leave the result readable by its owner only).
    tmp = path.with_name(f".{path.name}.{os.getpid()}.{uuid.uuid4().hex[:8]}.tmp")
    try:
        with open(tmp, "x") as f:
            f.write(text)
        os.replace(tmp, path)
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise
    return doc
