"""The sandbox in-process: what a program sees and may do, read from inside one real run.

The server tests (test_adversarial*.py, test_limits.py) reach :mod:`services.reward.sandbox`
through a reward server's own process; these call :class:`Sandbox` here, so a change to its
command construction (a mutant, in scripts/mutation.py) is seen by the test process too. One
program reports everything at once (one sandbox start per case).
"""

from __future__ import annotations

import json
import os
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from services.reward.sandbox import RunLimits, RunResult, Sandbox, SandboxUnavailable

PY = "/usr/bin/python3"

FACTS = r"""
import json, os, socket, sys
def writable(path):
    try:
        with open(path, "w") as f:
            f.write("x")
        return True
    except OSError:
        return False
limits = {}
for line in open("/proc/self/limits").read().splitlines()[1:]:
    name = line[:26].strip()
    limits[name] = line[26:47].split()[0]
def net():
    try:
        socket.create_connection(("127.0.0.1", int(sys.argv[1])), timeout=1).close()
        return True
    except OSError:
        return False
print(json.dumps({
    "uid": os.getuid(), "gid": os.getgid(), "hostname": socket.gethostname(),
    "cwd": os.getcwd(), "env": dict(os.environ), "stdin": sys.stdin.read(),
    "limits": limits, "given": open("given.txt").read(),
    "given_mode": oct(os.stat("given.txt").st_mode & 0o777),
    "tmp": writable("/tmp/w"), "root": writable("/w"), "usr": writable("/usr/w"),
    "dev": writable("/dev/w"), "etc_linker": os.path.exists("/etc/ld.so.cache"),
    "bin": os.readlink("/bin"), "lib": os.readlink("/lib"), "sbin": os.readlink("/sbin"),
    "lib64": os.readlink("/lib64"), "ro_path": os.listdir(sys.argv[2]) if os.path.isdir(sys.argv[2]) else None,
    "ro_path_writable": writable(sys.argv[2] + "/w"),
    "net": net(), "pid": os.getpid(), "shadow": os.path.exists("/etc/shadow"),
}))
"""


@pytest.fixture(scope="module")
def host_dir() -> Iterator[Path]:
    # Outside /tmp (a folder there is mounted over the work directory: a case of its own, below),
    # and reachable by the
    # unprivileged uid bwrap runs as (pytest's own temp folders are private to root).
    with tempfile.TemporaryDirectory(prefix="sandbox-ro-", dir="/var/tmp") as d:
        Path(d).chmod(0o755)
        (Path(d) / "seen.txt").write_text("host")
        yield Path(d)


def _facts(sandbox: Sandbox, limits: RunLimits, host_dir: Path) -> tuple[RunResult, dict]:
    import socket

    listener = socket.socket()
    listener.bind(("127.0.0.1", 0))
    listener.listen()
    try:
        res = sandbox.run(
            [PY, "-I", "facts.py", str(listener.getsockname()[1]), str(host_dir)], limits,
            files={"facts.py": (FACTS.encode(), 0o644), "given.txt": (b"payload", 0o640)},
            stdin=b"from stdin",
        )  # fmt: skip
    finally:
        listener.close()
    assert res.ok, (res.status, res.return_code, res.stderr[-2000:], res.sandbox_error)
    return res, json.loads(res.stdout)


def test_what_a_program_sees_inside_the_sandbox(host_dir: Path) -> None:
    sandbox = Sandbox(ro_paths=[str(host_dir)])
    sandbox.check()
    limits = RunLimits(timeout_s=7.5, memory_mb=300, max_processes=9, max_open_files=40,
                       max_file_mb=3, workdir_mb=5)  # fmt: skip
    res, f = _facts(sandbox, limits, host_dir)
    assert (f["uid"], f["gid"]) == (65534, 65534)
    assert f["hostname"] == "sandbox" and f["cwd"] == "/tmp" and f["pid"] > 1
    env = {"PATH": "/usr/local/bin:/usr/bin:/bin", "LANG": "C.UTF-8", "HOME": "/tmp", "PWD": "/tmp"}
    assert f["env"] == env  # bwrap sets PWD on --chdir
    assert f["stdin"] == "from stdin"
    assert (f["given"], f["given_mode"]) == ("payload", "0o640")
    assert f["limits"] == {
        **f["limits"],
        "Max address space": str(300 << 20), "Max cpu time": "8", "Max file size": str(3 << 20),
        "Max processes": "9", "Max open files": "40", "Max core file size": "0",
    }  # fmt: skip
    assert f["tmp"] and not f["root"] and not f["usr"] and not f["dev"]
    assert f["etc_linker"] and not f["shadow"]
    assert (f["bin"], f["sbin"], f["lib"], f["lib64"]) == (
        "usr/bin",
        "usr/sbin",
        "usr/lib",
        "usr/lib64",
    )
    assert f["ro_path"] == ["seen.txt"] and not f["ro_path_writable"]
    assert not f["net"]
    assert sandbox.starts == 2  # the check and this run
    assert res.status == "finished" and res.return_code == 0 and not res.truncated


def test_the_work_directory_is_capped_at_workdir_mb() -> None:
    prog = "open('big', 'wb').write(b'x' * (3 << 20))"
    limits = RunLimits(max_file_mb=16, workdir_mb=2)
    res = Sandbox().run([PY, "-I", "-c", prog], limits)
    assert res.status == "finished" and res.return_code != 0 and b"No space left" in res.stderr
    assert Sandbox().run([PY, "-I", "-c", prog], RunLimits(max_file_mb=16, workdir_mb=4)).ok


def test_prlimit_arguments() -> None:
    s = Sandbox()
    argv = s._prlimit_argv(RunLimits(timeout_s=5.2, memory_mb=7, max_processes=3,
                                     max_open_files=11, max_file_mb=2))  # fmt: skip
    assert argv == [s.prlimit, f"--as={7 << 20}", "--cpu=6", f"--fsize={2 << 20}", "--nproc=3",
                    "--nofile=11", "--core=0", "--"]  # fmt: skip
    assert "--cpu=1" in s._prlimit_argv(RunLimits(timeout_s=0.1))  # at least one second


def test_timeout_kills_the_run_and_reports_it() -> None:
    start = time.monotonic()
    res = Sandbox().run([PY, "-I", "-c", "import time; print('up', flush=True); time.sleep(60)"],
                        RunLimits(timeout_s=1.0))  # fmt: skip
    assert (res.status, res.return_code, res.ok) == ("timeout", None, False)
    assert res.stdout == b"up\n" and 1.0 <= res.duration_s < 30
    assert time.monotonic() - start < 30


def test_output_over_the_cap_is_truncated_and_stopped() -> None:
    prog = "import sys\nwhile True: sys.stdout.write('y' * 4096)"
    res = Sandbox().run([PY, "-I", "-c", prog], RunLimits(max_output_bytes=10_000))
    assert (res.status, res.truncated, len(res.stdout)) == ("output_limit", True, 10_000)


def test_exit_status_and_stderr_come_back() -> None:
    res = Sandbox().run([PY, "-I", "-c", "import sys; sys.stderr.write('bad'); sys.exit(7)"],
                        RunLimits())  # fmt: skip
    assert (res.status, res.return_code, res.stderr, res.ok) == ("finished", 7, b"bad", False)


def test_a_sandbox_that_cannot_start_is_a_sandbox_error() -> None:
    broken = Sandbox(bwrap="/bin/false")  # exits 1 without ever reporting a started child
    res = broken.run([PY, "-c", "print(1)"], RunLimits())
    assert (res.status, res.ok) == ("sandbox_error", False)
    with pytest.raises(SandboxUnavailable, match="bubblewrap cannot create a sandbox on this host"):
        broken.check()


def test_missing_tools_are_named() -> None:
    with pytest.raises(SandboxUnavailable, match=r"bubblewrap not found \('/no/bwrap'\)"):
        Sandbox(bwrap="/no/bwrap").check()
    s = Sandbox()
    s.prlimit = "/no/prlimit"
    with pytest.raises(
        SandboxUnavailable, match=r"prlimit \(util-linux\) not found at /no/prlimit"
    ):
        s.check()


def test_unsafe_mode_keeps_the_limits_and_a_private_directory() -> None:
    s = Sandbox(unsafe_no_sandbox=True)
    s.check()  # no bwrap needed
    prog = ("import os; print(os.getcwd(), open('f').read(), oct(os.stat('f').st_mode & 0o777), "
            "os.stat('.').st_uid, os.getuid(), open('/proc/self/limits').read().count('1048576'))")  # fmt: skip
    res = s.run([PY, "-I", "-c", prog], RunLimits(max_file_mb=1), files={"f": (b"hi", 0o604)})
    assert res.ok, res
    cwd, content, mode, owner, uid, fsize = res.stdout.decode().split()
    assert (content, mode, fsize) == ("hi", "0o604", "2")  # RLIMIT_FSIZE soft and hard: 1 MiB
    assert Path(cwd).name.startswith("dynamo-reward-unsafe-") and not Path(cwd).exists()
    if os.geteuid() == 0:  # the directory and the process belong to the unprivileged uid
        assert (owner, uid) == ("65534", "65534")


def test_parent_pid_reads_the_hosts_proc() -> None:
    from services.reward.sandbox import _child_pid, _parent_pid

    assert _parent_pid(os.getpid()) == os.getppid()
    assert _parent_pid(2**22 + 1) is None  # above pid_max: no such process
    assert _child_pid(b'{"child-pid": 42}\n{"exit-code": 0}\n') == 42
    assert _child_pid(b"not json\n") is None


def test_bwraps_json_status_decides_started_and_exit_code() -> None:
    def applied(raw: bytes, stderr: bytes = b"why") -> RunResult:
        res = RunResult("finished", 0, b"", stderr, 0.1)
        Sandbox._apply_status(res, raw)
        return res

    res = applied(b'\xff garbage\n{"child-pid": 5}\n{"exit-code": 3}\n')
    assert (res.status, res.return_code) == ("finished", 3)
    assert (applied(b'{"child-pid": 5}\n').status, applied(b'{"child-pid": 5}\n').return_code) == (
        "finished", 0,
    )  # fmt: skip
    res = applied(b'{"exit-code": 1}\n', stderr=b" bwrap: no namespaces \n")
    assert (res.status, res.sandbox_error) == ("sandbox_error", "bwrap: no namespaces")


def test_a_sandbox_that_never_starts_is_named_with_its_status() -> None:
    with pytest.raises(SandboxUnavailable, match=r"on this host: sandbox_error$"):
        Sandbox(bwrap="/bin/false").check()  # no stderr: the status is the detail


def test_a_ro_path_under_tmp_is_seen_above_the_work_directory() -> None:
    # The work directory's tmpfs is mounted at /tmp; a read-only path under the host's /tmp must
    # be bound after it (on top), or the tmpfs hides it.
    with tempfile.TemporaryDirectory(prefix="sandbox-ro-", dir="/tmp") as d:
        Path(d).chmod(0o755)
        (Path(d) / "seen.txt").write_text("host")
        prog = (
            "import os, sys; d = sys.argv[1]; print(os.listdir(d), open(d + '/seen.txt').read(), "
            "os.access(d, os.W_OK), open('given').read(), os.access('/tmp', os.W_OK))"
        )
        res = Sandbox(ro_paths=[d]).run(
            [PY, "-I", "-c", prog, d], RunLimits(), files={"given": (b"work", 0o644)}
        )
    assert res.ok, (res.status, res.stderr[-2000:], res.sandbox_error)
    assert res.stdout.decode().split() == ["['seen.txt']", "host", "False", "work", "True"]


@pytest.mark.parametrize("path", ["/tmp", "/", "/tmp/../tmp"])
def test_a_ro_path_over_the_work_directory_is_refused(path: str) -> None:
    with pytest.raises(ValueError, match=r"code\.ro_paths: .* would cover the work directory /tmp"):
        Sandbox(ro_paths=[path])


FAKE_BWRAP = r"""#!/usr/bin/python3
import os, sys
fd = int(sys.argv[sys.argv.index("--json-status-fd") + 1])
os.write(fd, b'{"child-pid": %d}\n{"exit-code": 0}\n' % os.getpid())
sys.stdout.write("not the expected output\n")
sys.stderr.buffer.write(b"\xff odd bytes\n")
"""


def test_a_sandbox_that_starts_but_prints_the_wrong_thing_fails_the_check(host_dir: Path) -> None:
    # A bwrap that starts its child (bwrap's JSON status says so) and finishes, but whose output is
    # not the check's: refused, with its stderr decoded even when it is not UTF-8. (In host_dir:
    # bwrap runs as the unprivileged uid, which cannot reach pytest's private temp folders.)
    fake = host_dir / "fake-bwrap"
    fake.write_text(FAKE_BWRAP)
    fake.chmod(0o755)
    try:
        res = Sandbox(bwrap=str(fake)).run(["/bin/true"], RunLimits())
        assert (res.status, res.return_code) == ("finished", 0), res  # it started, and finished
        with pytest.raises(SandboxUnavailable, match=r"on this host: � odd bytes$"):
            Sandbox(bwrap=str(fake)).check()
    finally:
        fake.unlink()


def test_a_bwrap_that_cannot_be_executed_is_a_sandbox_error_and_leaks_no_descriptor() -> None:
    """The OS refuses to start the sandbox (here: no such binary): the run says so with the OS
    error, and the status pipe and the files' memfds are closed all the same."""
    fds = set(os.listdir("/proc/self/fd"))
    res = Sandbox(bwrap="/nonexistent/bwrap").run(
        [PY, "-c", "print(1)"], RunLimits(), files={"a.py": (b"print(1)", 0o644)}
    )
    assert res == RunResult(
        "sandbox_error", None, b"", b"", 0.0,
        sandbox_error="[Errno 2] No such file or directory: '/nonexistent/bwrap'",
    )  # fmt: skip
    assert set(os.listdir("/proc/self/fd")) == fds


def test_a_run_without_stdin_reads_nothing_and_output_at_the_cap_is_not_cut() -> None:
    prog = "import sys\nassert sys.stdin.buffer.read() == b''\nsys.stdout.write('y' * 10_000)"
    res = Sandbox().run([PY, "-I", "-c", prog], RunLimits(max_output_bytes=10_000))
    assert res.status == "finished" and res.return_code == 0, res.stderr
    assert res.truncated is False and res.stdout == b"y" * 10_000
