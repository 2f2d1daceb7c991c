"""Run untrusted, model-written programs: one fresh bubblewrap sandbox per run.

Every program the reward service executes was written by a model being trained to maximise its
reward, so it is treated as hostile: it may try to escape, to starve the host, or to forge its own
result. The judge (comparison of outputs, exit codes) always runs outside the sandbox, here.

How a run is built
------------------
``bwrap --unshare-all --unshare-user --disable-userns --die-with-parent --new-session --cap-drop
ALL``: new network, pid, ipc, uts, cgroup, mount and user namespaces; no nested user namespaces.
The new root holds only ``/usr`` (read-only), the ``/bin``, ``/lib``, ``/lib64`` symlinks, a few
read-only files of ``/etc`` the dynamic linker needs, a fresh ``/proc`` of the new pid namespace,
a minimal ``/dev`` remounted read-only, and a size-limited tmpfs at ``/tmp`` — the work
directory and the only writable place (the root bwrap builds is remounted read-only last);
``code.ro_paths`` are bound read-only after it, so a folder under the host's ``/tmp`` shows on
top of the work directory (``/tmp`` itself or ``/`` is refused). The program is copied in from an anonymous memory file
(``memfd``), so no host path is bound. bwrap starts as the unprivileged uid/gid 65534 (the
service drops to it when it runs as root; a uid mapped to root outside would still be root for
the kernel's process limits) with a three-variable environment, so even ``/proc/1/environ`` (bwrap
is pid 1 inside) shows nothing of the service's. Inside, ``prlimit`` sets hard and soft rlimits
before the program starts: address space, CPU seconds, file size, process count, open files.
The service holds a wall-clock deadline and, when it passes, SIGKILLs bwrap's process group; bwrap
is the pid namespace's init, so its death makes the kernel kill every process in the namespace,
including ones that called ``setsid`` or double-forked. stdout and stderr are read up to a cap;
a run that writes more is stopped and its output marked truncated.

Covered (each has an adversarial test in tests/services/reward/test_adversarial.py or
test_adversarial_escapes.py)
- fork bombs (RLIMIT_NPROC, counted per user namespace, so one sandbox cannot starve another);
- running as root on the host: the program and bwrap are uid/gid 65534 in the host's ``/proc``
  (test_sandbox_host_uid.py; inside, the uid reads 65534 whether or not the service dropped it);
- memory bombs (RLIMIT_AS per process);
- infinite loops and children that try to outlive the limit (setsid, double fork): pid namespace
  + wall-clock kill + RLIMIT_CPU;
- network access, including the host's 127.0.0.1 and abstract unix sockets (own network
  namespace; no host filesystem, so no host unix sockets either);
- reading host files (``/etc/shadow``, the service's source, its environment): not mounted;
- writing outside the work directory: everything else is read-only; the work directory is a
  private tmpfs that vanishes with the run;
- killing the parent: the service is outside the pid namespace; bwrap (pid 1 inside) ignores
  signals from inside it;
- flooding stdout/stderr (capped, run stopped);
- filling the disk (tmpfs size limit + RLIMIT_FSIZE; nothing else writable);
- ``/proc`` tricks (``/proc/1/root``, ``/proc/self/exe``, host pids), symlinks out of the work
  directory, another sandbox's processes (invisible, so untraceable), a program rewriting its own
  file between test cases (every case starts from the submitted program), looking for the
  expected output (it never enters the sandbox), leaving with status 0 before an ``assert`` block
  (the block must reach its end and print a fresh random marker; code_scorer.py).

Not covered — say so plainly
- ``assert`` tests run in the program's own process: a program that reads its own code (the
  marker is a constant of the module) can forge a pass; stdio tests are judged outside and are
  the robust kind;
- ``ptrace`` of the sandbox's pid 1 (bwrap) succeeds: same uid, no capabilities, same
  namespaces, so it gains nothing (tested), but a seccomp filter would refuse it;
- kernel vulnerabilities: there is no seccomp filter, so every syscall the kernel allows an
  unprivileged user in its own namespaces is reachable; a kernel bug is an escape;
- total memory is bounded only per process (RLIMIT_AS × RLIMIT_NPROC + the tmpfs), not by a
  cgroup; size the machine or run the service in a memory-limited container;
- CPU and memory-bandwidth contention with other sandboxes (no cgroup CPU quota), timing side
  channels, and reading what ``/usr`` and ``/proc`` reveal about the host (kernel version, CPU);
- math items: they never reach the sandbox. math-verify parses hostile text in worker processes
  running as the service's user, bounded by an address-space limit and the hard timeout only;
  a bug in its LaTeX parser or in sympy is reachable (its plain-expression path feeds sympy only
  digits and operators, never identifiers, so it does not evaluate Python names);
- hosts where unprivileged user namespaces are disabled: bwrap fails and the service refuses to
  run code at start-up unless started with ``--unsafe-no-sandbox``, which keeps only rlimits, a
  temporary directory and the wall-clock kill (no isolation at all — trusted code only).
"""

from __future__ import annotations

import contextlib
import dataclasses
import json
import logging
import os
import select
import selectors
import shutil
import signal
import subprocess
import tempfile
import time
from collections.abc import Sequence
from pathlib import Path

log = logging.getLogger(__name__)

__all__ = ["RunLimits", "RunResult", "Sandbox", "SandboxUnavailable"]

# Read-only bits of /etc that dynamic linking and compilers look at; nothing secret.
_ETC_FILES = ("/etc/ld.so.cache", "/etc/ld.so.conf", "/etc/ld.so.conf.d", "/etc/alternatives")
_ENV = {"PATH": "/usr/local/bin:/usr/bin:/bin", "LANG": "C.UTF-8", "HOME": "/tmp"}
WORKDIR = "/tmp"


class SandboxUnavailable(RuntimeError):
    """bubblewrap is missing or cannot create namespaces on this host."""


@dataclasses.dataclass(frozen=True)
class RunLimits:
    """Limits of one run."""

    timeout_s: float = 5.0
    memory_mb: int = 512
    max_processes: int = 32
    max_open_files: int = 64
    max_file_mb: int = 16
    workdir_mb: int = 64
    max_output_bytes: int = 1 << 20


@dataclasses.dataclass
class RunResult:
    """What happened to one run. ``status``: finished | timeout | output_limit | sandbox_error."""

    status: str
    return_code: int | None
    stdout: bytes
    stderr: bytes
    duration_s: float
    truncated: bool = False
    sandbox_error: str = ""

    @property
    def ok(self) -> bool:
        return self.status == "finished" and self.return_code == 0

    @property
    def memory_exhausted(self) -> bool:
        """Best guess that the program died for lack of memory (RLIMIT_AS makes malloc fail)."""
        tail = self.stderr[-4096:]
        return any(
            marker in tail
            for marker in (
                b"MemoryError",
                b"bad_alloc",
                b"Cannot allocate memory",
                b"out of memory",
            )
        )


class Sandbox:
    """Runs programs in fresh sandboxes; thread-safe (one call per run, any thread)."""

    def __init__(
        self,
        bwrap: str = "bwrap",
        uid: int = 65534,
        ro_paths: Sequence[str] = (),
        unsafe_no_sandbox: bool = False,
    ) -> None:
        self.unsafe = unsafe_no_sandbox
        self.uid = uid
        self.ro_paths = [str(Path(p).resolve()) for p in ro_paths]
        for path in self.ro_paths:
            if Path(WORKDIR).is_relative_to(path):
                raise ValueError(
                    f"code.ro_paths: {path} would cover the work directory {WORKDIR} (read-only, "
                    f"so no program could be written there); name directories outside it, or "
                    f"below it (a folder under {WORKDIR} is mounted over the work directory)"
                )
        self.prlimit = shutil.which("prlimit") or "/usr/bin/prlimit"
        found = shutil.which(bwrap)
        self.bwrap = found or bwrap
        self.starts = 0  # read by the metrics collector

    # ------------------------------------------------------------------ checks
    def check(self) -> None:
        """Raise :class:`SandboxUnavailable` unless a trivial run succeeds in the sandbox."""
        if not os.path.exists(self.prlimit):
            raise SandboxUnavailable(f"prlimit (util-linux) not found at {self.prlimit}")
        if self.unsafe:
            return
        if not shutil.which(self.bwrap):
            raise SandboxUnavailable(
                f"bubblewrap not found ({self.bwrap!r}); install the 'bubblewrap' package"
            )
        result = self.run(["/bin/sh", "-c", "echo sandbox-ok"], RunLimits(timeout_s=10))
        if result.status != "finished" or result.stdout.strip() != b"sandbox-ok":
            detail = (result.sandbox_error or result.stderr.decode(errors="replace")).strip()
            raise SandboxUnavailable(
                f"bubblewrap cannot create a sandbox on this host: {detail or result.status}"
            )

    # ------------------------------------------------------------------ one run
    def run(
        self,
        argv: Sequence[str],
        limits: RunLimits,
        files: dict[str, tuple[bytes, int]] | None = None,
        stdin: bytes = b"",
    ) -> RunResult:
        """Run ``argv`` with ``files`` (name in the work dir -> (content, mode)) and ``stdin``."""
        files = files or {}
        memfds: list[int] = []
        status_r = status_w = -1
        tmpdir: tempfile.TemporaryDirectory[str] | None = None
        try:
            rl = self._prlimit_argv(limits)
            if self.unsafe:
                tmpdir = tempfile.TemporaryDirectory(prefix="dynamo-reward-unsafe-")
                for name, (data, mode) in files.items():
                    path = Path(tmpdir.name) / name
                    path.write_bytes(data)
                    path.chmod(mode)
                if os.geteuid() == 0:
                    os.chown(tmpdir.name, self.uid, self.uid)
                cmd = [*rl, *argv]
                cwd = tmpdir.name
                pass_fds: tuple[int, ...] = ()
            else:
                status_r, status_w = os.pipe()
                cmd = [self.bwrap, *self._bwrap_args(limits), "--json-status-fd", str(status_w)]
                for name, (data, mode) in files.items():
                    fd = os.memfd_create(f"sandbox-{name}")
                    memfds.append(fd)
                    view = memoryview(data)
                    while view:
                        view = view[os.write(fd, view) :]
                    os.lseek(fd, 0, os.SEEK_SET)
                    cmd += ["--perms", f"{mode:04o}", "--file", str(fd), f"{WORKDIR}/{name}"]
                # Last: the root tmpfs bwrap built (mount points, /etc for the linker files) goes
                # read-only too, or it would be a second, unbounded writable place.
                cmd += ["--remount-ro", "/", "--", *rl, *argv]
                cwd = "/"
                pass_fds = (status_w, *memfds)
            root = os.geteuid() == 0
            start = time.monotonic()
            proc = subprocess.Popen(
                cmd,
                stdin=subprocess.PIPE,
                stdout=subprocess.PIPE,
                stderr=subprocess.PIPE,
                env=dict(_ENV),
                cwd=cwd,
                pass_fds=pass_fds,
                start_new_session=True,  # its own process group: one killpg ends everything
                user=self.uid if root else None,
                group=self.uid if root else None,
                extra_groups=[] if root else None,
                close_fds=True,
            )
            self.starts += 1
            if status_w >= 0:
                os.close(status_w)
                status_w = -1
            for fd in memfds:
                os.close(fd)
            memfds.clear()
            result, status_raw = self._communicate(proc, stdin, limits, start, status_r)
            if status_r >= 0:
                self._apply_status(result, status_raw)
            return result
        except OSError as e:
            return RunResult("sandbox_error", None, b"", b"", 0.0, sandbox_error=str(e))
        finally:
            for fd in (*memfds, status_w, status_r):
                if fd >= 0:
                    with contextlib.suppress(OSError):
                        os.close(fd)
            if tmpdir is not None:
                tmpdir.cleanup()

    def _prlimit_argv(self, limits: RunLimits) -> list[str]:
        cpu = max(1, int(limits.timeout_s + 1.0))  # backstop; the wall clock is the real limit
        return [
            self.prlimit,
            f"--as={limits.memory_mb << 20}",
            f"--cpu={cpu}",
            f"--fsize={limits.max_file_mb << 20}",
            f"--nproc={limits.max_processes}",
            f"--nofile={limits.max_open_files}",
            "--core=0",
            "--",
        ]

    def _bwrap_args(self, limits: RunLimits) -> list[str]:
        args = [
            "--unshare-all", "--unshare-user", "--disable-userns",
            "--die-with-parent", "--new-session", "--cap-drop", "ALL",
            "--uid", str(self.uid), "--gid", str(self.uid), "--hostname", "sandbox",
            "--ro-bind", "/usr", "/usr",
            "--symlink", "usr/bin", "/bin", "--symlink", "usr/sbin", "/sbin",
            "--symlink", "usr/lib", "/lib", "--symlink", "usr/lib64", "/lib64",
        ]  # fmt: skip
        for path in _ETC_FILES:
            args += ["--ro-bind-try", path, path]
        args += [
            "--proc", "/proc",
            "--dev", "/dev", "--remount-ro", "/dev",
            "--size", str(limits.workdir_mb << 20), "--tmpfs", WORKDIR,
        ]  # fmt: skip
        # After the work directory's tmpfs: a path under the host's /tmp is bound on top of it
        # (bound before, the tmpfs would hide it).
        for path in self.ro_paths:
            args += ["--ro-bind", path, path]
        args += [
            "--chdir", WORKDIR,
            "--clearenv", *(x for k, v in _ENV.items() for x in ("--setenv", k, v)),
        ]  # fmt: skip
        return args

    @staticmethod
    def _kill(proc: subprocess.Popen[bytes], status_raw: bytes = b"") -> None:
        """SIGKILL the sandbox: its pid-namespace init first, then bwrap's process group.

        Killing the init makes the kernel kill every process of the namespace before the init
        finishes exiting; waiting for that makes the cleanup synchronous. (Killing only the outer
        bwrap would leave it to the asynchronous parent-death signal: processes could outlive
        the call by a moment.)
        """
        init_pid = _child_pid(status_raw)
        if init_pid is not None and proc.poll() is None:
            with contextlib.suppress(OSError):
                pidfd = os.pidfd_open(init_pid)
                try:
                    # The pidfd pins the process; check it is still bwrap's child, not a reused pid.
                    if _parent_pid(init_pid) == proc.pid:
                        signal.pidfd_send_signal(pidfd, signal.SIGKILL)
                        # The pidfd turns readable once the init has exited, which the kernel
                        # lets happen only after every process of its namespace is gone.
                        select.select([pidfd], [], [], 10.0)
                finally:
                    os.close(pidfd)
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(proc.pid, signal.SIGKILL)

    def _communicate(
        self,
        proc: subprocess.Popen[bytes],
        stdin: bytes,
        limits: RunLimits,
        start: float,
        status_r: int = -1,
    ) -> tuple[RunResult, bytes]:
        """Feed stdin, read both streams up to the cap, enforce the deadline, reap."""
        assert proc.stdin and proc.stdout and proc.stderr
        deadline = start + limits.timeout_s
        cap = limits.max_output_bytes
        out_fd, err_fd, in_fd = proc.stdout.fileno(), proc.stderr.fileno(), proc.stdin.fileno()
        out = {out_fd: bytearray(), err_fd: bytearray()}
        status = "finished"
        truncated = False
        status_raw = bytearray()
        sel = selectors.DefaultSelector()
        try:
            if status_r >= 0:
                os.set_blocking(status_r, False)
                sel.register(status_r, selectors.EVENT_READ)
            for stream in (proc.stdout, proc.stderr):
                os.set_blocking(stream.fileno(), False)
                sel.register(stream.fileno(), selectors.EVENT_READ)
            pending = memoryview(stdin)
            if pending:
                os.set_blocking(in_fd, False)
                sel.register(in_fd, selectors.EVENT_WRITE)
            else:
                proc.stdin.close()
            readers = 2
            while readers:
                left = deadline - time.monotonic()
                if left <= 0:
                    status = "timeout"
                    break
                for key, _ in sel.select(timeout=min(left, 0.5)):
                    fd = key.fd
                    if fd == in_fd:
                        try:
                            n = os.write(fd, pending[:65536])
                            pending = pending[n:]
                        except (BrokenPipeError, BlockingIOError) as e:
                            if isinstance(e, BlockingIOError):
                                continue
                            pending = pending[:0]
                        if not pending:
                            sel.unregister(fd)
                            proc.stdin.close()
                        continue
                    if fd == status_r:
                        with contextlib.suppress(BlockingIOError):
                            data = os.read(fd, 65536)
                            status_raw += data
                            if not data:
                                sel.unregister(fd)
                        continue
                    try:
                        chunk = os.read(fd, 65536)
                    except BlockingIOError:
                        continue
                    if not chunk:
                        sel.unregister(fd)
                        readers -= 1
                        continue
                    buf = out[fd]
                    buf += chunk
                    if len(buf) > cap:
                        del buf[cap:]
                        truncated = True
                if truncated:
                    status = "output_limit"
                    break
        finally:
            sel.close()
            if status != "finished":
                self._kill(proc, bytes(status_raw))
            try:
                proc.wait(timeout=max(0.1, deadline - time.monotonic()) + 1.0)
            except subprocess.TimeoutExpired:
                status = "timeout" if status == "finished" else status
                self._kill(proc, bytes(status_raw))
                proc.wait()
            if status_r >= 0:  # the rest of the status (the exit code) is there once bwrap exits
                with contextlib.suppress(OSError):
                    while data := os.read(status_r, 65536):
                        status_raw += data
            # Whatever survived the namespace's init (nothing should) goes with the group.
            self._kill(proc)
            for stream in (proc.stdin, proc.stdout, proc.stderr):
                with contextlib.suppress(OSError):
                    stream.close()
        rc = proc.returncode
        result = RunResult(
            status=status,
            return_code=None if status == "timeout" else rc,
            stdout=bytes(out[out_fd]),
            stderr=bytes(out[err_fd]),
            duration_s=time.monotonic() - start,
            truncated=truncated,
        )
        return result, bytes(status_raw)

    @staticmethod
    def _apply_status(result: RunResult, raw: bytes) -> None:
        """bwrap's JSON status tells a sandbox that never started from a program that failed."""
        started = False
        exit_code: int | None = None
        for line in raw.decode(errors="replace").splitlines():
            with contextlib.suppress(ValueError):
                doc = json.loads(line)
                started = started or "child-pid" in doc
                if "exit-code" in doc:
                    exit_code = int(doc["exit-code"])
        if not started and result.status == "finished":
            result.status = "sandbox_error"
            result.sandbox_error = result.stderr.decode(errors="replace").strip()[:2000]
        elif exit_code is not None and result.status == "finished":
            result.return_code = exit_code


def _child_pid(status_raw: bytes) -> int | None:
    """The host pid of the sandbox's init, from bwrap's JSON status."""
    for line in status_raw.decode(errors="replace").splitlines():
        with contextlib.suppress(ValueError, TypeError):
            doc = json.loads(line)
            if "child-pid" in doc:
                return int(doc["child-pid"])
    return None


def _parent_pid(pid: int) -> int | None:
    try:
        with open(f"/proc/{pid}/status") as f:
            for line in f:
                if line.startswith("PPid:"):
                    return int(line.split()[1])
    except (OSError, ValueError):
        pass
    return None
