"""The sandboxed program runs as the unprivileged uid *as the host sees it*.

Inside the sandbox the uid reads 65534 whether or not the service dropped privileges (bwrap maps
it), so this looks from outside: a program submitted through the real service execs ``sleep``
under a unique ``argv[0]``; the test finds that process in the host's ``/proc``, reads its ``Uid``,
``Gid`` and ``Groups`` lines (and those of its ancestors up to the service), then kills it. Without
this check the uid drop was guarded only by the fork-bomb test (as root the process limit does not
apply), which would then really fork without bound on the test machine.
"""

from __future__ import annotations

import contextlib
import os
import signal
import threading
import time
import uuid
from pathlib import Path
from typing import Any

from tests.services.reward.conftest import RewardServer

UNPRIVILEGED = 65534  # the sandbox's default uid/gid (services.reward.sandbox.Sandbox)


def _find(marker: str, deadline: float) -> int:
    while time.monotonic() < deadline:
        for entry in Path("/proc").iterdir():
            if not entry.name.isdigit():
                continue
            try:
                argv0 = (entry / "cmdline").read_bytes().split(b"\0")[0]
            except OSError:  # gone meanwhile
                continue
            if argv0 == marker.encode():
                return int(entry.name)
        time.sleep(0.05)
    raise AssertionError(f"no host process with argv[0] {marker!r}")


def _ids(pid: int) -> dict[str, list[str]]:
    lines = Path(f"/proc/{pid}/status").read_text().splitlines()
    return {k: v.split() for k, _, v in (ln.partition(":") for ln in lines)
            if k in ("Uid", "Gid", "Groups", "PPid")}  # fmt: skip


def test_the_sandboxed_program_runs_as_the_unprivileged_uid_on_the_host(
    reward: RewardServer,
) -> None:
    marker = f"sandboxed-{uuid.uuid4().hex[:12]}"
    program = f"import os\nos.execv('/usr/bin/sleep', [{marker!r}, '25'])"
    item = {"kind": "code", "response": f"```python\n{program}\n```", "timeout_s": 25,
            "tests": {"type": "stdio", "cases": [{"stdin": "", "stdout": "x"}]}}  # fmt: skip
    result: dict[str, Any] = {}
    run = threading.Thread(target=lambda: result.update(reward.one(item, timeout=90)))
    run.start()
    pid = None
    try:
        pid = _find(marker, time.monotonic() + 60)
        # Unprivileged as the service runs: 65534 when it is root (it drops), else its own uid.
        expected = str(UNPRIVILEGED) if os.geteuid() == 0 else str(os.geteuid())
        chain = []
        current = pid
        service = reward.proc.pid
        while current not in (service, 0, 1):  # the program, prlimit's exec, bwrap (x2)
            ids = _ids(current)
            chain.append((current, ids))
            current = int(ids["PPid"][0])
        assert current == service, f"the program is not a descendant of the service: {chain}"
        for p, ids in chain:
            assert ids["Uid"] == [expected] * 4, (p, ids)  # real, effective, saved, filesystem
            assert ids["Gid"] == [expected] * 4, (p, ids)
            if os.geteuid() == 0:
                assert ids.get("Groups", []) == [], (p, ids)  # root's groups are dropped too
    finally:
        if pid is not None:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
        run.join(90)
    assert not run.is_alive()
    assert result["correct"] is False  # killed: it never printed the expected output
    reward.assert_serving()
