"""The reward service's section: where it listens, request limits, the math pool, the sandbox.

Every limit has a default that is safe on a shared machine; per-item limits sent by clients
(``timeout_s``, ``memory_mb``) are capped by the ``max_*`` values here, never raised above them.
"""

from __future__ import annotations

from typing import Annotated

from pydantic import Field

from dynamo_rl.config.base import Section
from dynamo_rl.config.common import Host, Port


class RewardMathConfig(Section):
    """Math verification: a pool of worker processes running math-verify."""

    workers: Annotated[int, Field(ge=1, le=256)] = 2
    """Worker processes; each scores one item at a time on its own main thread."""
    timeout_s: Annotated[float, Field(gt=0, le=600)] = 10.0
    """Hard per-item limit: a worker still busy after this is killed, replaced, and the item
    scores 0 with reason ``timeout``."""
    max_pending: Annotated[int, Field(ge=1)] = 4096
    """Math items admitted at once (running + waiting); beyond this a request gets 429."""
    memory_mb: Annotated[int, Field(ge=256)] = 4096
    """Address-space limit of each worker (MiB): an answer that makes sympy allocate more
    scores 0 instead of exhausting the host."""


class RewardCodeConfig(Section):
    """Code execution: every run is a fresh bubblewrap sandbox (see services/reward/sandbox.py)."""

    enabled: bool = True
    """Serve ``code`` items and ``/run_code``; when false they are refused with 422."""
    unsafe_no_sandbox: bool = False
    """Run code WITHOUT bubblewrap (rlimits and a temporary directory only). For machines where
    namespaces are unavailable and the code is trusted; logged loudly at start-up."""
    bwrap: str = "bwrap"
    """The bubblewrap binary (a name looked up on PATH, or a path)."""
    python: str = "/usr/bin/python3"
    """Interpreter that runs Python programs inside the sandbox; must live under a directory the
    sandbox mounts read-only (``/usr`` by default; ``ro_paths`` adds more)."""
    ro_paths: list[str] = []
    """Extra host directories mounted read-only inside the sandbox (for example a separate
    Python installation). Nothing else of the host is visible."""
    concurrency: Annotated[int, Field(ge=1, le=1024)] = 2
    """Sandboxes running at once."""
    max_pending: Annotated[int, Field(ge=1)] = 256
    """Code items and /run_code requests admitted at once (running + waiting); beyond this 429."""
    default_timeout_s: Annotated[float, Field(gt=0)] = 5.0
    """Wall-clock limit of one run when the item gives none."""
    max_timeout_s: Annotated[float, Field(gt=0)] = 30.0
    """Upper bound on any run's wall-clock limit (item values above it are capped)."""
    compile_timeout_s: Annotated[float, Field(gt=0)] = 30.0
    """Wall-clock limit of compiling a C/C++ program."""
    default_memory_mb: Annotated[int, Field(ge=16)] = 512
    """Address-space limit per process when the item gives none (MiB)."""
    max_memory_mb: Annotated[int, Field(ge=16)] = 2048
    """Upper bound on any run's address-space limit (MiB)."""
    max_processes: Annotated[int, Field(ge=1)] = 32
    """Processes (and threads) the sandboxed program may have at once (RLIMIT_NPROC)."""
    max_open_files: Annotated[int, Field(ge=8)] = 64
    """Open file descriptors per process (RLIMIT_NOFILE)."""
    max_file_mb: Annotated[int, Field(ge=1)] = 16
    """Largest file a program may write (RLIMIT_FSIZE, MiB)."""
    workdir_mb: Annotated[int, Field(ge=1)] = 64
    """Size of the sandbox's writable tmpfs work directory (MiB), its only writable place."""
    max_output_bytes: Annotated[int, Field(ge=1024)] = 1 << 20
    """stdout and stderr are each kept up to this many bytes; a run that writes more is stopped
    and its output marked truncated."""
    max_cases: Annotated[int, Field(ge=1)] = 256
    """Test cases per code item."""
    uid: Annotated[int, Field(ge=1)] = 65534
    """Unprivileged uid/gid the sandbox runs as (outside and inside); used when the service runs
    as root, otherwise the service's own uid is used outside."""


class RewardConfig(Section):
    host: Host = "127.0.0.1"
    port: Port = 8080
    max_body_bytes: Annotated[int, Field(ge=1024)] = 32 << 20
    """Largest request body accepted; larger ones get 413."""
    max_items: Annotated[int, Field(ge=1)] = 4096
    """Items in one /v1/verify request; more is a 422 naming ``items``."""
    retry_after_s: Annotated[int, Field(ge=1)] = 1
    """``Retry-After`` seconds sent with 429 when a kind's queue is full."""
    math: RewardMathConfig = RewardMathConfig()
    code: RewardCodeConfig = RewardCodeConfig()
