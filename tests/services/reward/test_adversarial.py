"""Attacks on the sandbox, one property per test, through a real server.

Each test asserts that the attack failed AND that the service still answers (health check and a
correctly scored item) afterwards. The threat model is in services/reward/sandbox.py.
"""

from __future__ import annotations

import os
import socket
import threading
import time
import uuid
from pathlib import Path
from typing import Any

import httpx

from tests.conftest import REPO
from tests.services.reward.conftest import SECRET_ENV, SECRET_VALUE, RewardServer


def run(reward: RewardServer, code: str, timeout: float = 5, **extra: Any) -> dict[str, Any]:
    body = {"code": code, "language": "python", "run_timeout": timeout, **extra}
    r = httpx.post(f"{reward.url}/run_code", json=body, timeout=120)
    assert r.status_code == 200, r.text
    return r.json()


def host_processes_with(marker: str) -> list[int]:
    """Host pids whose command line contains ``marker``."""
    found = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            cmdline = (entry / "cmdline").read_bytes()
        except OSError:
            continue
        if marker.encode() in cmdline:
            found.append(int(entry.name))
    return found


def test_fork_bomb_is_capped_and_cleaned_up(reward: RewardServer) -> None:
    marker = str(900000 + os.getpid() % 99999)
    code = f"""
import os, sys, time
n = 0
try:
    while True:
        if os.fork() == 0:
            os.execv("/bin/sleep", ["sleep", "{marker}"])
        n += 1
except OSError as e:
    print("forks", n, e.errno, flush=True)
while True:  # keep the children alive until the wall clock ends the run
    time.sleep(1)
"""
    out = run(reward, code, timeout=3)
    forks = int(out["run_result"]["stdout"].split()[1])
    assert forks < 32, out  # RLIMIT_NPROC (reward.code.max_processes) stopped it
    assert out["run_result"]["status"] == "TimeLimitExceeded"
    assert host_processes_with(marker) == []
    reward.assert_serving()


def test_fork_bomb_does_not_starve_other_sandboxes(reward: RewardServer) -> None:
    # RLIMIT_NPROC is counted per user namespace: a bomb at its limit in one sandbox leaves
    # another (same uid outside) free to start processes.
    bomb = "import os, time\nwhile True:\n    try:\n        os.fork()\n    except OSError:\n        time.sleep(0.01)"
    t = threading.Thread(target=run, args=(reward, bomb, 4))
    t.start()
    time.sleep(1.0)
    try:
        out = run(
            reward,
            "import subprocess\nprint(subprocess.run(['echo', 'alive'], capture_output=True).stdout.decode())",
        )
    finally:
        t.join()
    assert out["status"] == "Success" and "alive" in out["run_result"]["stdout"], out
    reward.assert_serving()


def test_memory_bomb_fails(reward: RewardServer) -> None:
    code = "chunks = []\nwhile True:\n    chunks.append(bytearray(64 << 20))"
    out = run(reward, code, memory_limit_MB=256)
    assert out["status"] == "Failed"
    assert "MemoryError" in out["run_result"]["stderr"]
    reward.assert_serving()


def test_children_do_not_outlive_the_timeout(reward: RewardServer) -> None:
    marker = str(800000 + os.getpid() % 99999)
    code = f"""
import os, subprocess, time
# a setsid'd child and a double-forked, setsid'd grandchild
subprocess.Popen(["sleep", "{marker}"], start_new_session=True)
if os.fork() == 0:
    os.setsid()
    if os.fork() == 0:
        os.execv("/bin/sleep", ["sleep", "{marker}"])
    os._exit(0)
while True:
    pass
"""
    out = run(reward, code, timeout=1)
    assert out["run_result"]["status"] == "TimeLimitExceeded"
    assert host_processes_with(marker) == [], "a sandboxed process survived its run"
    # The same escape when the main program exits at once instead of running into the limit.
    out = run(reward, code.replace("while True:\n    pass", "print('bye')"), timeout=5)
    assert out["run_result"]["stdout"] == "bye\n"
    assert host_processes_with(marker) == [], "a sandboxed process survived its run"
    reward.assert_serving()


def test_cannot_connect_to_host_loopback(reward: RewardServer) -> None:
    listener = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    listener.bind(("127.0.0.1", 0))
    listener.listen(8)
    listener.settimeout(0.5)
    port = listener.getsockname()[1]
    accepted: list[Any] = []
    done = threading.Event()

    def accept() -> None:
        while not done.is_set():
            try:
                accepted.append(listener.accept())
            except TimeoutError:
                continue

    t = threading.Thread(target=accept)
    t.start()
    code = f"""
import socket
for host in ("127.0.0.1", "localhost", "::1"):
    try:
        socket.create_connection((host, {port}), timeout=2).sendall(b"escaped")
        print("CONNECTED", host)
    except OSError as e:
        print("refused", host, type(e).__name__)
"""
    try:
        out = run(reward, code)
    finally:
        done.set()
        t.join()
        listener.close()
    assert "CONNECTED" not in out["run_result"]["stdout"], out
    assert accepted == []
    reward.assert_serving()


def test_cannot_reach_host_abstract_unix_socket(reward: RewardServer) -> None:
    name = f"dynamo-reward-test-{uuid.uuid4().hex}"
    listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    listener.bind("\0" + name)  # abstract: no file, scoped by network namespace
    listener.listen(8)
    listener.setblocking(False)
    code = f"""
import socket
s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
try:
    s.connect("\\0{name}")
    s.sendall(b"escaped")
    print("CONNECTED")
except OSError as e:
    print("refused", type(e).__name__)
"""
    try:
        out = run(reward, code)["run_result"]["stdout"]
        try:
            conn, _ = listener.accept()
            conn.close()
            accepted = True
        except BlockingIOError:
            accepted = False
    finally:
        listener.close()
    assert "CONNECTED" not in out and not accepted, out
    reward.assert_serving()


def test_cannot_read_etc_shadow(reward: RewardServer) -> None:
    code = """
import os
for p in ("/etc/shadow", "/etc/passwd", "/root", "/home"):
    try:
        print(p, "READ", open(p).read()[:50] if os.path.isfile(p) else os.listdir(p))
    except OSError as e:
        print(p, "denied", type(e).__name__)
"""
    out = run(reward, code)["run_result"]["stdout"]
    assert "READ" not in out, out
    assert "/etc/shadow denied" in out
    reward.assert_serving()


def test_cannot_read_service_source(reward: RewardServer) -> None:
    target = REPO / "services" / "reward" / "sandbox.py"
    code = f"""
import os
try:
    print("READ", open({str(target)!r}).read()[:40])
except OSError as e:
    print("denied", type(e).__name__)
print("cwd entries", os.listdir("."))
print("root entries", sorted(os.listdir("/")))
"""
    out = run(reward, code)["run_result"]["stdout"]
    assert "READ" not in out and "denied" in out, out
    assert "work" not in out.split("root entries")[1]  # the repository's tree is not mounted
    reward.assert_serving()


def test_cannot_see_service_environment(reward: RewardServer) -> None:
    code = f"""
import os
seen = [str(dict(os.environ))]
for pid in os.listdir("/proc"):
    if pid.isdigit():
        try:
            seen.append(open(f"/proc/{{pid}}/environ", "rb").read().decode(errors="replace"))
        except OSError:
            pass
text = "\\n".join(seen)
print("LEAK" if {SECRET_VALUE!r} in text or {SECRET_ENV!r} in text else "clean")
print(sorted(os.environ))
"""
    out = run(reward, code)["run_result"]["stdout"]
    assert out.startswith("clean"), out
    assert SECRET_VALUE not in out
    reward.assert_serving()


def test_cannot_write_outside_work_dir(reward: RewardServer) -> None:
    name = f"escape-{uuid.uuid4().hex}"
    code = f"""
import os
wrote = []
for d in ("/tmp", "/usr", "/usr/lib", "/etc", "/", "/dev", "/dev/shm", "/proc", {str(REPO)!r}):
    try:
        with open(os.path.join(d, {name!r}), "w") as f:
            f.write("x")
        wrote.append(d)
    except OSError:
        pass
print(wrote)
"""
    out = run(reward, code)["run_result"]["stdout"]
    assert out.strip() == "['/tmp']", out  # the private work directory only
    for d in ("/tmp", "/usr", "/usr/lib", "/etc", "/", str(REPO)):
        assert not (Path(d) / name).exists(), f"{d}/{name} appeared on the host"
    reward.assert_serving()


def test_killing_the_parent_fails(reward: RewardServer) -> None:
    code = """
import os, signal
for target in (os.getppid(), 1, -1):
    try:
        os.kill(target, signal.SIGKILL)
        print("sent", target)
    except OSError as e:
        print("denied", target, type(e).__name__)
"""
    server_pid = reward.proc.pid
    run(reward, code)
    assert reward.proc.alive()
    os.kill(server_pid, 0)  # raises if the service is gone
    reward.assert_serving()


def test_stdout_flood_is_truncated(reward: RewardServer) -> None:
    out = run(reward, "import sys\nwhile True:\n    sys.stdout.write('x' * 65536)", timeout=30)
    rr = out["run_result"]
    assert rr["truncated"] is True
    assert len(rr["stdout"]) <= 1 << 20
    assert "truncated" in out["message"]
    assert rr["status"] == "Error"  # stopped at the cap, not left to run into its timeout
    reward.assert_serving()


def test_filling_the_disk_is_bounded(reward: RewardServer) -> None:
    code = """
import os
total = 0
i = 0
try:
    while True:
        with open(f"/tmp/fill{i}", "wb") as f:
            for _ in range(64):
                f.write(b"\\0" * (1 << 20))
                total += 1 << 20
        i += 1
except OSError as e:
    print("stopped", total, type(e).__name__, e.errno)
"""
    out = run(reward, code, timeout=20)["run_result"]["stdout"]
    assert out.startswith("stopped"), out
    written = int(out.split()[1])
    assert written <= 64 << 20  # reward.code.workdir_mb
    reward.assert_serving()
