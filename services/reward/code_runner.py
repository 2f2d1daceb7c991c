"""Compile and run one program in the sandbox: language table, code extraction, limit capping.

Shared by the ``code`` scorer and the SandboxFusion-style ``/run_code`` route. C and C++ are
compiled inside a sandbox of their own; the binary comes back over stdout and is copied into each
run's fresh sandbox, so no host directory is ever writable from inside.
"""

from __future__ import annotations

import dataclasses
import re
import time

from dynamo_rl.config.reward import RewardCodeConfig
from services.reward.metrics import RewardMetrics
from services.reward.sandbox import RunLimits, RunResult, Sandbox


@dataclasses.dataclass(frozen=True)
class LanguageSpec:
    source: str
    compile_cmd: str | None
    fences: tuple[str, ...]


SPECS: dict[str, LanguageSpec] = {
    "python": LanguageSpec("main.py", None, ("python", "py", "python3")),
    "c": LanguageSpec("main.c", "gcc -O2 -std=gnu17 -o prog main.c -lm", ("c",)),
    "cpp": LanguageSpec("main.cpp", "g++ -O2 -std=gnu++17 -o prog main.cpp", ("cpp", "c++", "cc")),
}

_FENCE = re.compile(r"```[ \t]*([^\n`]*)\n(.*?)```", re.DOTALL)


def extract_code(response: str, language: str) -> str:
    """The last fenced block tagged with ``language`` (else the last fenced block, else all)."""
    blocks = [(m.group(1).strip().lower(), m.group(2)) for m in _FENCE.finditer(response)]
    if not blocks:
        return response.strip()
    tagged = [code for tag, code in blocks if tag in SPECS[language].fences]
    return (tagged or [code for _tag, code in blocks])[-1].strip()


@dataclasses.dataclass
class Program:
    """A program ready to run: the files to copy in and the command."""

    files: dict[str, tuple[bytes, int]]
    argv: list[str]


class CodeRunner:
    """Turns (language, code) into sandboxed runs under the server's caps."""

    def __init__(self, cfg: RewardCodeConfig, metrics: RewardMetrics) -> None:
        self.cfg = cfg
        self.metrics = metrics
        self.sandbox = Sandbox(
            bwrap=cfg.bwrap,
            uid=cfg.uid,
            ro_paths=cfg.ro_paths,
            unsafe_no_sandbox=cfg.unsafe_no_sandbox,
        )

    def limits(self, timeout_s: float | None, memory_mb: int | None) -> RunLimits:
        """Per-run limits: the item's values, defaulted and capped by the server maxima."""
        c = self.cfg
        return RunLimits(
            timeout_s=min(timeout_s or c.default_timeout_s, c.max_timeout_s),
            memory_mb=min(memory_mb or c.default_memory_mb, c.max_memory_mb),
            max_processes=c.max_processes,
            max_open_files=c.max_open_files,
            max_file_mb=c.max_file_mb,
            workdir_mb=c.workdir_mb,
            max_output_bytes=c.max_output_bytes,
        )

    def _run(
        self, argv: list[str], limits: RunLimits, files: dict[str, tuple[bytes, int]], stdin: bytes
    ) -> RunResult:
        start = time.monotonic()
        result = self.sandbox.run(argv, limits, files=files, stdin=stdin)
        self.metrics.sandbox_starts.labels(result.status).inc()
        self.metrics.sandbox_seconds.observe(time.monotonic() - start)
        return result

    def prepare(
        self, language: str, code: str, compile_timeout_s: float | None = None
    ) -> tuple[Program | None, RunResult | None]:
        """Compile if needed. Returns (program, compile result); program is None on failure."""
        spec = SPECS[language]
        source = code.encode()
        if spec.compile_cmd is None:
            return Program(
                {spec.source: (source, 0o644)}, [self.cfg.python, "-I", spec.source]
            ), None
        c = self.cfg
        limits = RunLimits(
            timeout_s=min(compile_timeout_s or c.compile_timeout_s, c.compile_timeout_s),
            memory_mb=max(c.max_memory_mb, 1024),
            max_processes=max(c.max_processes, 16),
            max_open_files=max(c.max_open_files, 256),
            max_file_mb=max(c.max_file_mb, 64),
            workdir_mb=max(c.workdir_mb, 128),
            max_output_bytes=max(c.max_output_bytes, 64 << 20),  # the binary comes back on stdout
        )
        # The compiler's own messages go to stderr; only the binary is written to stdout.
        script = f"{spec.compile_cmd} 1>&2 && cat prog"
        result = self._run(["/bin/sh", "-c", script], limits, {spec.source: (source, 0o644)}, b"")
        if result.status != "finished" or result.return_code != 0 or result.truncated:
            return None, result
        return Program({"prog": (result.stdout, 0o755)}, ["./prog"]), result

    def run(self, program: Program, stdin: bytes, limits: RunLimits) -> RunResult:
        return self._run(program.argv, limits, program.files, stdin)
