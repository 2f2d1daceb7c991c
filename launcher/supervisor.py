"""A compose-like supervisor for local processes: spawn, wait, restart with back-off, stop all.

:class:`Supervisor` knows nothing of what it runs (``dynamo-rl up``'s recipe says that):

- :meth:`~Supervisor.spawn` starts a child in its own process group with its log in
  ``logs/<name>.log`` and its name in ``DYNAMO_RL_SERVICE`` (the service it names in the run's
  warnings, :mod:`dynamo_rl.notices`); :meth:`~Supervisor.run_step` runs a one-shot child to
  completion while supervising the rest (and polling what the caller prints meanwhile).
- :meth:`~Supervisor.spawn_supervised` puts a long-running child under the restart policy
  (``up.restart``, like a compose ``restart: always``): :meth:`~Supervisor.check_services`
  notices an exit, restarts the child after a delay from :class:`dynamo_rl.retry.Backoff`
  (``backoff_s`` doubled per earlier restart within ``window_s``, capped at ``backoff_max_s``,
  shortened by up to ``jitter``), and stops the run when a child needs more than ``max_restarts``
  restarts within ``window_s`` (a crash loop), with its last log lines. ``pids.json`` in the run
  folder names each supervised child's current pid.
- :meth:`~Supervisor.signals` turns SIGINT/SIGTERM into :class:`Interrupted` and, on the way out,
  ignores further signals while :meth:`~Supervisor.stop_all` stops every child (whole process
  groups, SIGTERM then SIGKILL), so a second Ctrl-C leaves no orphans.
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import sys
import time
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import TextIO

from dynamo_rl.config.up import RestartConfig
from dynamo_rl.notices import SERVICE_ENV
from dynamo_rl.procs import ServiceProcess
from dynamo_rl.retry import Backoff

__all__ = ["Interrupted", "Supervised", "Supervisor", "restart_backoff"]


class Interrupted(Exception):
    """SIGINT/SIGTERM arrived: stop everything."""


@dataclass
class Supervised:
    """A long-running child under the restart policy."""

    proc: ServiceProcess
    restart: Callable[[], ServiceProcess]
    """Starts the child again (same ports, same folders) and returns its new process."""
    restarts: list[float] = field(default_factory=list)  # monotonic times, pruned to the window
    due: float | None = None  # when the pending restart happens (None: running)


def restart_backoff(policy: RestartConfig) -> Backoff:
    """``up.restart``'s delays as the project's one back-off policy."""
    # A first delay above the cap is the cap (Backoff refuses base > cap).
    return Backoff(
        base_s=min(policy.backoff_s, policy.backoff_max_s),
        cap_s=policy.backoff_max_s,
        jitter=policy.jitter,
    )


class Supervisor:
    """Starts, watches, restarts and stops the local processes of one run."""

    def __init__(
        self,
        run_dir: Path,
        policy: RestartConfig,
        *,
        env: dict[str, str] | None = None,
        out: TextIO = sys.stdout,
    ) -> None:
        self.run_dir = Path(run_dir).resolve()
        self.logs = self.run_dir / "logs"
        self.policy = policy
        self.backoff = restart_backoff(policy)
        self.env = env
        self.out = out
        self.children: list[ServiceProcess] = []
        self.supervised: dict[str, Supervised] = {}
        self.restart_counts: dict[str, int] = {}
        self.t0 = time.monotonic()

    def say(self, text: str) -> None:
        elapsed = time.monotonic() - self.t0
        print(f"[{elapsed:6.1f}s] {text}", file=self.out, flush=True)

    # -- children ------------------------------------------------------------------------------

    def spawn(self, name: str, argv: Sequence[str]) -> ServiceProcess:
        env = {**(self.env if self.env is not None else os.environ), SERVICE_ENV: name}
        proc = ServiceProcess(name, argv, self.logs / f"{name}.log", env=env).start()
        self.children.append(proc)
        return proc

    def adopt(self, proc: ServiceProcess) -> ServiceProcess:
        """Take a child started elsewhere (Redis) into the stop-all list."""
        self.children.append(proc)
        return proc

    def supervise(
        self, name: str, proc: ServiceProcess, restart: Callable[[], ServiceProcess]
    ) -> None:
        self.supervised[name] = Supervised(proc, restart)
        self.write_pids()

    def spawn_supervised(
        self, name: str, argv: Sequence[str] | Callable[[], list[str]]
    ) -> ServiceProcess:
        """Spawn a child and put it under the restart policy (``argv`` may be a function: a fresh
        command line per start)."""

        def start() -> ServiceProcess:
            return self.spawn(name, argv() if callable(argv) else argv)

        proc = start()
        self.supervise(name, proc, start)
        return proc

    def release(self, name: str, grace: float = 15.0) -> None:
        """Stop a supervised child for good and take it off the policy (a finished stage)."""
        proc = self.supervised.pop(name).proc
        proc.stop(grace=grace)
        if proc in self.children:
            self.children.remove(proc)
        self.write_pids()

    def write_pids(self) -> None:
        pids = {name: s.proc.pid for name, s in self.supervised.items() if s.proc.proc}
        (self.run_dir / "pids.json").write_text(json.dumps(pids, indent=2))

    # -- the policy ----------------------------------------------------------------------------

    def check_services(self, finished: Sequence[str] = ()) -> None:
        """One supervision pass: notice exits, restart what is due, stop a crash loop.

        ``finished``: children whose exit with code 0 means done (the learner), not a crash."""
        policy = self.policy
        now = time.monotonic()
        for name, s in self.supervised.items():
            if s.proc.alive():
                continue
            code = s.proc.proc.returncode if s.proc.proc else None
            if name in finished and code == 0:
                continue
            if s.due is None:
                tail = f"last log lines ({s.proc.log_path}):\n{s.proc.log_tail()}"
                if not policy.enabled:
                    raise RuntimeError(f"{name} exited with code {code}; {tail}")
                s.restarts = [t for t in s.restarts if now - t < policy.window_s]
                if len(s.restarts) >= policy.max_restarts:
                    raise RuntimeError(
                        f"{name} keeps crashing: exited with code {code} after {len(s.restarts)} "
                        f"restarts within {policy.window_s:.0f}s; {tail}"
                    )
                delay = self.backoff.delay(len(s.restarts))
                s.due = now + delay
                self.say(f"{name} exited with code {code}: restarting in {delay:.1f}s")
            elif now >= s.due:
                s.proc.stop(grace=5)  # what is left of its process group (torchrun's ranks)
                if s.proc in self.children:
                    self.children.remove(s.proc)
                s.restarts.append(time.monotonic())
                s.due = None
                try:
                    s.proc = s.restart()
                except (RuntimeError, TimeoutError) as e:  # counts as one more crash
                    self.say(f"restart of {name} failed: {str(e).splitlines()[0]}")
                    continue
                count = self.restart_counts[name] = self.restart_counts.get(name, 0) + 1
                self.write_pids()
                self.say(f"restarted {name} (pid {s.proc.pid}, restart {count})")

    def run_step(
        self, name: str, argv: Sequence[str], poll: Callable[[], object] | None = None
    ) -> None:
        """Run a one-shot child to completion, calling ``poll`` meanwhile and once at its end;
        fail with its log tail if it fails."""
        proc = self.spawn(name, argv)
        assert proc.proc is not None
        while proc.proc.poll() is None:
            self.check_services()
            if poll is not None:
                poll()
            time.sleep(0.2)
        if poll is not None:
            poll()
        self.children.remove(proc)
        if proc.proc.returncode != 0:
            raise RuntimeError(
                f"{name} failed with exit code {proc.proc.returncode}; last log lines "
                f"({proc.log_path}):\n{proc.log_tail()}"
            )

    def stop_all(self) -> None:
        for proc in reversed(self.children):
            if proc.alive():
                self.say(f"stopping {proc.name}")
            proc.stop(grace=15)
        self.children.clear()

    @contextlib.contextmanager
    def signals(self) -> Iterator[None]:
        """SIGINT/SIGTERM raise :class:`Interrupted` inside; every child is stopped on the way out,
        with further signals ignored until then."""

        def interrupt(signum: int, _frame: object) -> None:
            raise Interrupted(signal.Signals(signum).name)

        old = {s: signal.signal(s, interrupt) for s in (signal.SIGINT, signal.SIGTERM)}
        try:
            yield
        finally:
            # A second Ctrl-C / SIGTERM must not cut the shutdown short and leave orphans.
            for sig in old:
                signal.signal(sig, signal.SIG_IGN)
            self.stop_all()
            for s, handler in old.items():
                signal.signal(s, handler)
