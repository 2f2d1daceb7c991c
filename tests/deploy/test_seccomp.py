"""deploy/seccomp/reward.json, the reward container's seccomp profile: an allowlist that keeps what
runtime defaults refuse refused and lets bubblewrap build its sandbox. The live check (the sandbox
working, attacks failing, inside the container) is tests/deploy/test_compose_live.py."""

from __future__ import annotations

import importlib.util
import json
from pathlib import Path

import pytest

from tests.conftest import REPO

PROFILE = REPO / "deploy" / "seccomp" / "reward.json"
HEADER = Path("/usr/include/x86_64-linux-gnu/asm/unistd_64.h")


def _gen():
    spec = importlib.util.spec_from_file_location(
        "gen_seccomp", REPO / "scripts" / "gen_seccomp.py"
    )
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def _allowed() -> set[str]:
    doc = json.loads(PROFILE.read_text())
    assert doc["defaultAction"] == "SCMP_ACT_ERRNO"  # an allowlist: unknown calls are refused
    (rule,) = doc["syscalls"]
    assert rule["action"] == "SCMP_ACT_ALLOW" and "args" not in rule
    return set(rule["names"])


def test_bubblewrap_calls_are_allowed() -> None:
    allowed = _allowed()
    for call in ("unshare", "clone", "clone3", "mount", "umount2", "pivot_root", "chroot"):
        assert call in allowed, call
    # and what any Python service needs
    for call in ("read", "write", "openat", "mmap", "futex", "epoll_wait", "execve", "wait4"):
        assert call in allowed, call


@pytest.mark.parametrize(
    "call",
    ["kexec_load", "init_module", "finit_module", "bpf", "ptrace", "keyctl", "add_key",
     "perf_event_open", "reboot", "swapon", "settimeofday", "open_by_handle_at", "setns",
     "process_vm_readv", "userfaultfd", "io_uring_setup", "fsopen", "move_mount"],
)  # fmt: skip
def test_what_runtimes_refuse_stays_refused(call: str) -> None:
    assert call not in _allowed()
    assert call in _gen().DENIED


@pytest.mark.skipif(not HEADER.exists(), reason="no kernel headers to regenerate from")
def test_the_committed_profile_is_what_the_script_writes() -> None:
    gen = _gen()
    assert json.loads(PROFILE.read_text()) == gen.profile(gen.syscalls(HEADER))
