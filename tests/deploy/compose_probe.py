"""Run inside the reward container (``docker compose exec -T reward python - < this file``): the
code sandbox through the real service, from where it runs. Prints one JSON object: each program's
stdout/stderr, the service's own seccomp mode, and whether the control token is in its environment
(so the caller can check no program saw it). Standard library only: the image has no test tools.
"""

import json
import os
import urllib.request

PROGRAMS = {
    "plain": "print(6 * 7)",
    # No route out, and no peer reachable from inside the sandbox's own network namespace.
    "network": """
import socket
for host, port in (("1.1.1.1", 53), ("redis", 6379), ("127.0.0.1", 8080)):
    try:
        socket.create_connection((host, port), timeout=2)
        print("CONNECTED", host, port)
    except OSError as e:
        print("refused", host, port, type(e).__name__)
""",
    # The service's environment (the control token) through every /proc entry and its own env.
    "environ": """
import os
seen = dict(os.environ)
for pid in os.listdir("/proc"):
    if pid.isdigit():
        try:
            seen[pid] = open(f"/proc/{pid}/environ", "rb").read().decode(errors="replace")
        except OSError:
            pass
print(repr(seen))
""",
    # The container's files (the project's code, /etc/shadow) are not in the sandbox root.
    "files": """
import os
for p in ("/opt/dynamo-rl/pyproject.toml", "/etc/shadow", "/proc/1/root/opt/dynamo-rl",
          "/data/run/config.yaml"):
    try:
        open(p).read(1)
        print("READ", p)
    except OSError as e:
        print("denied", p, type(e).__name__)
print("root", sorted(os.listdir("/")))
""",
    # No new user namespace from inside (bwrap --disable-userns), and the profile's refusals.
    "unshare": """
import ctypes, os
libc = ctypes.CDLL(None, use_errno=True)
print("unshare-user", libc.unshare(0x10000000), ctypes.get_errno())
print("keyctl", libc.syscall(250, 0, 0, 0, 0, 0), ctypes.get_errno())
print("bpf", libc.syscall(321, 0, 0, 0), ctypes.get_errno())
""",
}


def run(code: str) -> dict:
    body = json.dumps({"code": code, "language": "python", "run_timeout": 10}).encode()
    req = urllib.request.Request(
        "http://127.0.0.1:8080/run_code", body, {"Content-Type": "application/json"}
    )
    with urllib.request.urlopen(req, timeout=60) as r:
        out = json.loads(r.read())
    result = out.get("run_result") or {}
    return {"status": out.get("status"), "stdout": result.get("stdout", ""),
            "stderr": result.get("stderr", "")}  # fmt: skip


def seccomp_mode() -> str:
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith("Seccomp:"):
                return line.split()[1]
    return "?"


print(json.dumps({
    "results": {name: run(code) for name, code in PROGRAMS.items()},
    "seccomp": seccomp_mode(),
    "token": os.environ.get("DYNAMO_CONTROL_TOKEN", ""),
}))  # fmt: skip
