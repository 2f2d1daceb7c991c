"""The one table of the system's services: how each is started, probed and reached.

``SERVICES`` names every long-running process of the system — ``redis``, ``allocator``,
``reward``, ``engine`` (the embedded engine), ``vllm`` (a vLLM server behind ``dynamo-rl
vllm-server``), ``rollout``, ``learner`` — with

- its **command line**: ``python -m dynamo_rl.cli SUBCOMMAND ARGS`` (the CLI's name table decides
  which module serves it, so a service that moves between packages changes nothing here); the
  learner under ``torch.distributed.run``; Redis is the server binary of
  :func:`dynamo_rl.procs.redis_server_binary`;
- its **health probe** (built on :mod:`dynamo_rl.procs`' ``http_ok``, ``grpc_healthy``,
  ``redis_ok``), or none for the processes that serve nothing (a rollout worker, the learner);
- its **ports**: the config key of the port it serves on, the keys of its other ports (Prometheus)
  and the ``endpoints`` key its clients read its address from.

:meth:`Service.start` starts one on a free port and waits for its probe; ``dynamo-rl up``,
``dynamo-rl eval``, the benchmarks and the tests all start services through it. It lives in the
shared package, below the launcher and the services alike, and imports no service (it names each
by its subcommand) and no torch.
"""

from __future__ import annotations

import sys
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from dynamo_rl.procs import ServiceProcess, free_port, grpc_healthy, http_ok, redis_ok, start_redis

__all__ = ["ENGINE_SERVICES", "SERVICES", "Service", "cli_argv", "engine_service", "service"]

LOOPBACK = "127.0.0.1"


def cli_argv(*args: str) -> list[str]:
    """``dynamo-rl ARGS`` with this interpreter (no installed entry point needed)."""
    return [sys.executable, "-m", "dynamo_rl.cli", *args]


@dataclass(frozen=True)
class Service:
    """One row of the table."""

    name: str
    subcommand: str | None
    """``dynamo-rl`` subcommand that runs it (``None``: not a ``dynamo-rl`` program — Redis)."""
    scheme: str
    """How its address is written: ``http`` (``http://host:port``), ``grpc`` (``host:port``),
    ``redis`` (``redis://host:port/0``), or ``none`` (it serves nothing to probe)."""
    port_key: str | None
    """Config key of the port it serves on (``None``: none, or not a config key)."""
    endpoint_key: str | None
    """``endpoints`` key its clients read its address from."""
    health_path: str = ""
    """Path of the HTTP health endpoint (``http`` services)."""
    other_ports: tuple[str, ...] = ()
    """Config keys of its other ports (Prometheus): :meth:`start` sets them to 0 (a free one), so
    that two services on one machine never collide on a default."""

    def argv(self, *args: str, nproc: int = 1, master_port: int | None = None) -> list[str]:
        """Its command line with ``args`` after the subcommand (``--config``, flags, overrides).

        The learner runs under ``torch.distributed.run`` with ``nproc`` ranks and a rendezvous on
        ``master_port`` (a fresh free port by default: every (re)start needs its own)."""
        if self.subcommand is None:
            raise ValueError(f"{self.name} is not a dynamo-rl program; use Service.start")
        if self.name == "learner":
            port = master_port or free_port()
            return [sys.executable, "-m", "torch.distributed.run", "--nproc-per-node", str(nproc),
                    "--master-addr", LOOPBACK, "--master-port", str(port),
                    "-m", "dynamo_rl.cli", self.subcommand, *args]  # fmt: skip
        return cli_argv(self.subcommand, *args)

    def address(self, port: int, host: str = LOOPBACK) -> str:
        """The address clients use for it on ``host:port`` (the form ``endpoint_key`` holds)."""
        if self.scheme == "http":
            return f"http://{host}:{port}"
        if self.scheme == "redis":
            return f"redis://{host}:{port}/0"
        return f"{host}:{port}"

    def health(self, address: str) -> Callable[[], bool] | None:
        """Its readiness probe at ``address`` (``None``: nothing to probe)."""
        if self.scheme == "http":
            return http_ok(address.rstrip("/") + self.health_path)
        if self.scheme == "grpc":
            return grpc_healthy(address)
        if self.scheme == "redis":
            return redis_ok(address)
        return None

    def port_overrides(self, port: int) -> list[str]:
        """``KEY=VALUE`` overrides that put it on ``port`` and its other ports on free ones."""
        keys = [f"{key}=0" for key in self.other_ports]
        return [*keys, f"{self.port_key}={port}"] if self.port_key else keys

    def start(
        self,
        log_path: Path,
        *args: str,
        port: int | None = None,
        env: dict[str, str] | None = None,
        cwd: str | Path | None = None,
        timeout: float = 60.0,
        name: str | None = None,
        wait: bool = True,
    ) -> tuple[ServiceProcess, str]:
        """Start it on ``port`` (a free one by default), wait for its probe, and return the process
        and its address. ``args`` follow the subcommand, before the port overrides; give the port
        as ``port=``, not as a flag in ``args`` (a flag would win over the override and the address
        returned would be wrong), while a flag for another port (``--metrics-port``) is fine. A
        process that dies or is not ready within ``timeout`` raises with its last log lines (and
        is stopped)."""
        port = port or free_port()
        if self.subcommand is None:  # Redis: its own binary and data folder
            proc, url = start_redis(log_path.parent, port, timeout=timeout)
            return proc, url
        argv = self.argv(*args, *self.port_overrides(port))
        proc = ServiceProcess(name or self.name, argv, log_path, env=env, cwd=cwd).start()
        address = self.address(port)
        if wait:
            try:
                self.wait_ready(proc, address, timeout)
            except BaseException:
                proc.stop()
                raise
        return proc, address

    def wait_ready(self, proc: ServiceProcess, address: str, timeout: float) -> None:
        """Wait until ``proc`` answers its probe at ``address`` (nothing to wait for without one)."""
        check = self.health(address)
        if check is not None:
            proc.wait_ready(check, timeout)


SERVICES: dict[str, Service] = {
    s.name: s
    for s in (
        Service("redis", None, "redis", None, "endpoints.redis_url"),
        Service("allocator", "allocator", "grpc", "allocator.port", "endpoints.allocator_addr",
                other_ports=("allocator.metrics_port",)),
        Service("reward", "reward", "http", "reward.port", "endpoints.reward_url",
                health_path="/healthz"),
        Service("engine", "engine", "http", "engine.port", "endpoints.engine_urls",
                health_path="/health"),
        Service("vllm", "vllm-server", "http", "engine.port", "endpoints.engine_urls",
                health_path="/health"),
        Service("rollout", "rollout", "none", None, None, other_ports=("rollout.metrics_port",)),
        Service("learner", "learner", "none", None, None, other_ports=("learner.metrics_port",)),
    )
}  # fmt: skip


def service(name: str) -> Service:
    """The table's row for ``name`` (a ``KeyError`` naming the known ones otherwise)."""
    try:
        return SERVICES[name]
    except KeyError:
        raise KeyError(f"unknown service {name!r}; known: {', '.join(SERVICES)}") from None


ENGINE_SERVICES: dict[str, str | None] = {"embedded": "engine", "vllm": "vllm", "sglang": None}
"""``engine.kind`` -> the row that starts such an engine (``None``: not started by this project)."""


def engine_service(kind: str) -> Service:
    """The row that starts an engine of ``engine.kind`` (a ``ValueError`` saying why not)."""
    if kind not in ENGINE_SERVICES:
        raise ValueError(f"engine.kind: {kind!r} is not one of {', '.join(ENGINE_SERVICES)}")
    name = ENGINE_SERVICES[kind]
    if name is None:
        raise ValueError(
            f"engine.kind={kind}: {kind} servers are not started by dynamo-rl (SGLang needs CUDA); "
            "start them yourself, list them in endpoints.engine_urls (ENGINE_URLS) and run the "
            "services one by one (docs/deploy.md), or use engine.kind=embedded or vllm"
        )
    return SERVICES[name]
