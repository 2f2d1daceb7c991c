"""More attacks on the sandbox, one property per test, through the package's real server.

Escapes through ``/proc`` (``/proc/1/root``, ``/proc/self/exe``, host pids), ``ptrace`` of the
sandbox's pid 1 and of a concurrently running sandbox, symlinks out of the work directory,
environment leakage through every ``/proc/*/environ``, and time-of-check tricks with the test
files: a program that rewrites itself between cases, looks for the expected output, or leaves
before an ``assert`` block can fail. Each test asserts the attack failed AND the service still
answers (``RewardServer.assert_serving``). Threat model: services/reward/sandbox.py.
"""

from __future__ import annotations

import hashlib
import os
import shutil
import threading
import time
import uuid
from pathlib import Path
from typing import Any

import pytest

from tests.conftest import REPO
from tests.services.reward.conftest import SECRET_ENV, SECRET_VALUE, RewardServer
from tests.services.reward.test_adversarial import run


def stdout(reward: RewardServer, code: str, **extra: Any) -> str:
    return run(reward, code, **extra)["run_result"]["stdout"]


def test_proc_1_root_is_the_sandbox_root(reward: RewardServer) -> None:
    target = REPO / "services" / "reward" / "sandbox.py"
    code = f"""
import os
for p in ("/proc/1/root{target}", "/proc/1/root/etc/shadow", "/proc/1/cwd/../../etc/shadow",
          "/proc/self/root{target}", "/proc/1/root/proc/1/root{target}"):
    try:
        print(p, "READ", open(p).read()[:20])
    except OSError as e:
        print(p, "denied", type(e).__name__)
try:
    print("root-via-1", sorted(os.listdir("/proc/1/root/")))
except OSError as e:
    print("root-via-1 denied", type(e).__name__)
print("own-root", sorted(os.listdir("/")))
"""
    out = stdout(reward, code)
    assert "READ" not in out, out
    lines = dict(
        line.split(" ", 1) for line in out.splitlines() if line.startswith(("root", "own"))
    )
    if "root-via-1" in lines:  # readable: then it is the very same tiny root, nothing of the host
        assert lines["root-via-1"] == lines["own-root"], out
    assert "work" not in lines["own-root"] and "home" not in lines["own-root"], out
    reward.assert_serving()


def test_proc_self_exe_cannot_be_overwritten(reward: RewardServer) -> None:
    python = Path(os.path.realpath("/usr/bin/python3"))
    before = hashlib.sha256(python.read_bytes()).hexdigest()
    code = """
import os
for how in ("open", "os.open", "truncate", "exe-dir"):
    try:
        if how == "open":
            open("/proc/self/exe", "r+b").write(b"pwned")
        elif how == "os.open":
            os.write(os.open("/proc/self/exe", os.O_WRONLY), b"pwned")
        elif how == "truncate":
            os.truncate("/proc/self/exe", 0)
        else:
            open(os.path.join(os.path.dirname(os.readlink("/proc/self/exe")), "pwned"), "w")
        print(how, "WROTE")
    except OSError as e:
        print(how, "denied", type(e).__name__)
"""
    out = stdout(reward, code)
    assert "WROTE" not in out and out.count("denied") == 4, out
    assert hashlib.sha256(python.read_bytes()).hexdigest() == before
    assert not (python.parent / "pwned").exists()
    reward.assert_serving()


def test_host_pids_are_invisible(reward: RewardServer) -> None:
    host_pids = [reward.proc.pid, os.getpid(), 1]
    code = f"""
import os
visible = sorted(int(p) for p in os.listdir("/proc") if p.isdigit())
cmds = []
for pid in visible:
    try:
        cmds.append(open(f"/proc/{{pid}}/cmdline", "rb").read().replace(b"\\0", b" ").decode())
    except OSError:
        pass
print("visible", len(visible), cmds)
for pid in {host_pids[:2]!r}:
    for what in ("environ", "cmdline", "mem", "root/etc/hostname"):
        try:
            data = open(f"/proc/{{pid}}/{{what}}", "rb").read(200)
            print(pid, what, "READ", data[:40])
        except OSError as e:
            print(pid, what, "denied", type(e).__name__)
"""
    out = stdout(reward, code)
    visible_line = out.splitlines()[0]
    assert int(visible_line.split()[1]) <= 4, out  # bwrap, its child, prlimit/python: no host
    for word in ("uvicorn", "dynamo_rl", "pytest", "redis", SECRET_VALUE):
        assert word not in visible_line, out
    for pid in host_pids[:2]:
        if pid > 4:  # a host pid that collides with a sandbox pid names a sandbox process
            assert f"{pid} environ READ" not in out and f"{pid} cmdline READ" not in out, out
    reward.assert_serving()


PTRACE = """
import ctypes, os, time
libc = ctypes.CDLL(None, use_errno=True)
libc.ptrace.argtypes = [ctypes.c_long, ctypes.c_long, ctypes.c_void_p, ctypes.c_void_p]
def attach(pid):
    if libc.ptrace(16, pid, None, None) == 0:  # PTRACE_ATTACH
        libc.ptrace(17, pid, None, None)  # PTRACE_DETACH
        return "ATTACHED"
    return "failed errno " + str(ctypes.get_errno())
"""


def test_ptrace_of_pid_1_gains_nothing(reward: RewardServer) -> None:
    # bwrap is pid 1 inside and runs as the same unprivileged uid with no capabilities, so the
    # kernel lets the program attach to it (no seccomp filter; see the threat model). What must
    # hold is that doing so gives nothing the program does not already have.
    code = (
        PTRACE
        + """
print("pid1", attach(1))
status = open("/proc/1/status").read()
print("caps", [l.split()[1] for l in status.splitlines() if l.startswith(("CapEff", "CapPrm"))])
print("uid", [l.split()[1] for l in status.splitlines() if l.startswith("Uid")])
print("ns", os.readlink("/proc/1/ns/pid") == os.readlink("/proc/self/ns/pid"))
"""
    )
    out = stdout(reward, code)
    assert "caps ['0000000000000000', '0000000000000000']" in out, out
    assert f"uid ['{os.getuid() if os.getuid() else 65534}']" in out, out
    assert "ns True" in out, out  # the same pid namespace: nothing outside it to reach through it
    reward.assert_serving()


def test_ptrace_of_another_sandbox_is_impossible(reward: RewardServer) -> None:
    marker = f"victim-{uuid.uuid4().hex[:12]}"
    victim = f"import time\n{marker!r}\nwhile True:\n    time.sleep(0.05)"
    t = threading.Thread(target=run, args=(reward, victim, 4))
    t.start()
    time.sleep(1.5)  # the victim sandbox is running
    code = (
        PTRACE
        + f"""
me = os.getpid()
found, results = [], []
for p in os.listdir("/proc"):
    if not p.isdigit() or int(p) == me:
        continue
    try:
        src = open(f"/proc/{{p}}/cmdline", "rb").read()
    except OSError:
        src = b""
    if {marker!r}.encode() in src:
        found.append(p)
    results.append((int(p), attach(int(p))))
print("found", found)
print("attached", [r for r in results if r[1] == "ATTACHED"])
"""
    )
    try:
        out = stdout(reward, code)
    finally:
        t.join()
    assert "found []" in out, out  # the victim sandbox is not even visible
    # The only other process it can see (and trace) is its own sandbox's pid 1 (bwrap).
    attached = out.split("attached ")[1].strip()
    assert attached in ("[]", "[(1, 'ATTACHED')]"), out
    reward.assert_serving()


def test_symlinks_out_of_the_work_dir_reach_nothing(reward: RewardServer, tmp_path: Path) -> None:
    canary = tmp_path / "canary"
    canary.mkdir()
    (canary / "keep.txt").write_text("precious")
    targets = [str(canary), str(canary / "keep.txt"), str(REPO), "/etc/shadow", "/proc/1/root/..",
               "../../.."]  # fmt: skip
    code = f"""
import os, shutil
for i, t in enumerate({targets!r}):
    link = f"/tmp/l{{i}}"
    os.symlink(t, link)
    try:
        if os.path.isdir(link):
            print(t, "LISTED", os.listdir(link)[:5])
            shutil.rmtree(link + "/", ignore_errors=True)
        else:
            print(t, "READ", open(link).read()[:20])
            open(link, "w").write("overwritten")
            print(t, "WROTE")
    except OSError as e:
        print(t, "denied", type(e).__name__)
os.symlink({str(canary)!r}, "/tmp/exit-link")  # left behind for the service's cleanup
"""
    out = stdout(reward, code)
    for t in (str(canary), str(canary / "keep.txt"), str(REPO), "/etc/shadow"):
        assert f"{t} READ" not in out and f"{t} LISTED" not in out and f"{t} WROTE" not in out, out
    assert (canary / "keep.txt").read_text() == "precious"  # nothing followed a link out
    reward.assert_serving()


def test_environment_does_not_leak_through_any_proc_entry(reward: RewardServer) -> None:
    code = f"""
import os
texts = [str(dict(os.environ))]
for p in ["self", "thread-self", "1"] + [d for d in os.listdir("/proc") if d.isdigit()]:
    for what in ("environ", "cmdline", "status"):
        try:
            texts.append(open(f"/proc/{{p}}/{{what}}", "rb").read().decode(errors="replace"))
        except OSError:
            pass
blob = "\\n".join(texts)
print("LEAK" if ({SECRET_VALUE!r} in blob or {SECRET_ENV!r} in blob) else "clean", len(texts))
print(sorted(os.environ))
"""
    out = stdout(reward, code)
    assert out.startswith("clean"), out
    assert SECRET_VALUE not in out and "DYNAMO_CONTROL_TOKEN" not in out
    reward.assert_serving()


def test_program_rewriting_itself_does_not_carry_over_between_cases(
    reward: RewardServer,
) -> None:
    # Each case must start from the submitted program: a program that patches its own file on
    # the first case would otherwise answer later cases from the patch.
    program = (
        "import sys\n"
        "src = open(sys.argv[0]).read() if sys.argv[0] else ''\n"
        "print('patched' if '#PAT' + 'CHED' in src else 'fresh')\n"
        "try:\n"
        "    open(sys.argv[0], 'a').write('\\n#' + 'PATCHED')\n"
        "except OSError:\n"
        "    pass\n"
    )
    item = {"kind": "code", "response": f"```python\n{program}```",
            "tests": {"type": "stdio", "cases": [{"stdin": "", "stdout": "fresh"}] * 3}}  # fmt: skip
    res = reward.one(item)
    assert res["correct"] is True and res["score"] == 1.0, (res["reason"], res["detail"])
    reward.assert_serving()


def test_expected_output_never_enters_the_sandbox(reward: RewardServer) -> None:
    secret = f"expected-{uuid.uuid4().hex}"
    program = (
        "import os\n"
        "hit = ''\n"
        "for top in ('/tmp', '/etc', '/run', '/var', '/home', '/root', '/mnt', '/opt', '/srv'):\n"
        "    for root, dirs, files in os.walk(top):\n"
        "        for f in files:\n"
        "            try:\n"
        "                data = open(os.path.join(root, f), 'rb').read(1 << 20)\n"
        "            except OSError:\n"
        "                continue\n"
        "            i = data.find(b'expected-')\n"
        "            if i >= 0:\n"
        "                hit = data[i:i + 41].decode(errors='replace')\n"
        "print(hit or 'nothing')\n"
    )
    item = {"kind": "code", "response": f"```python\n{program}```",
            "tests": {"type": "stdio", "cases": [{"stdin": "", "stdout": secret}]}}  # fmt: skip
    res = reward.one(item)
    assert res["correct"] is False and res["reason"] == "wrong_answer", res
    assert secret not in res["detail"].split("got")[-1], res
    reward.assert_serving()


FAILING_ASSERTS = "assert add(1, 2) == 4, 'wrong sum'\n"
# Programs that try to leave with status 0 before the appended assert block can fail.
EARLY_EXITS = {
    "os._exit": "import os\ndef add(a, b):\n    return a + b\nos._exit(0)\n",
    "sys.exit": "import sys\ndef add(a, b):\n    return a + b\nsys.exit(0)\n",
    "SystemExit": "def add(a, b):\n    return a + b\nraise SystemExit\n",
    "excepthook": (
        "import os, sys\nsys.excepthook = lambda *a: os._exit(0)\n"
        "def add(a, b):\n    return a + b\n"
    ),
    "atexit": (
        "import atexit, os\natexit.register(lambda: os._exit(0))\n"
        "import sys\nsys.excepthook = lambda *a: None\n"
        "def add(a, b):\n    return a + b\n"
    ),
    "exec-self": (
        "import os, sys\n"
        "if not os.environ.get('AGAIN'):\n"
        "    os.environ['AGAIN'] = '1'\n"
        "    src = open(sys.argv[0]).read().split('assert add')[0]\n"
        "    open('/tmp/clean.py', 'w').write(src)\n"
        "    os.execv(sys.executable, [sys.executable, '/tmp/clean.py'])\n"
        "def add(a, b):\n    return a + b\n"
    ),
}


@pytest.mark.parametrize("program", EARLY_EXITS.values(), ids=EARLY_EXITS.keys())
def test_leaving_before_the_asserts_does_not_pass(reward: RewardServer, program: str) -> None:
    item = {"kind": "code", "response": f"```python\n{program}```",
            "tests": {"type": "assert", "code": FAILING_ASSERTS}}  # fmt: skip
    res = reward.one(item)
    assert res["correct"] is False and res["score"] == 0.0, res
    # The same program with asserts it satisfies still passes: the check is not a blanket refusal.
    if "exit" not in program and "SystemExit" not in program and "AGAIN" not in program:
        ok = {**item, "tests": {"type": "assert", "code": "assert add(1, 2) == 3\n"}}
        assert reward.one(ok)["correct"] is True
    reward.assert_serving()


def test_a_plain_assert_program_passes(reward: RewardServer) -> None:
    program = "def add(a, b):\n    return a + b\nprint('some output')\n"
    res = reward.one({"kind": "code", "response": f"```python\n{program}```",
                      "tests": {"type": "assert", "code": "assert add(2, 2) == 4\n"}})  # fmt: skip
    assert res["correct"] is True, res
    assert shutil.which("bwrap") is None or reward.proc.alive()
