"""Write deploy/seccomp/reward.json, the reward service's seccomp profile.

An allowlist (every other call fails with EPERM, so calls added to later kernels are refused): the
x86-64 system call table of the kernel headers this runs on, less ``DENIED``, the calls container
runtimes' default profiles refuse to an unprivileged container (loading kernel code, keys, BPF,
tracing other processes, clocks, swap, reboot, raw I/O ports, the new mount API). What bubblewrap
needs to build the sandbox stays allowed: ``unshare`` and ``clone``/``clone3`` with namespace flags,
``mount``, ``umount2``, ``pivot_root``, ``chroot``, ``sethostname``. Run it after editing
``DENIED``:

    python scripts/gen_seccomp.py [--header /usr/include/x86_64-linux-gnu/asm/unistd_64.h]
"""

from __future__ import annotations

import argparse
import json
import re
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
OUT = REPO / "deploy" / "seccomp" / "reward.json"

# The sandbox's own calls: what bubblewrap uses to create its namespaces and its root.
BUBBLEWRAP = ("unshare", "clone", "clone3", "mount", "umount2", "pivot_root", "chroot",
              "sethostname")  # fmt: skip

DENIED = {
    # kernel code and configuration
    "init_module", "finit_module", "delete_module", "create_module", "query_module",
    "get_kernel_syms", "kexec_load", "kexec_file_load", "bpf", "_sysctl", "sysfs", "uselib",
    "nfsservctl", "lookup_dcookie", "syslog", "acct", "quotactl", "quotactl_fd", "ustat",
    # keys, tracing and reading other processes
    "add_key", "request_key", "keyctl", "ptrace", "process_vm_readv", "process_vm_writev",
    "kcmp", "perf_event_open", "fanotify_init", "userfaultfd", "pidfd_getfd",
    "open_by_handle_at", "name_to_handle_at", "setns",
    # the machine: clocks, swap, power, raw I/O, NUMA policy
    "settimeofday", "clock_settime", "clock_adjtime", "adjtimex", "swapon", "swapoff", "reboot",
    "ioperm", "iopl", "vhangup", "mbind", "set_mempolicy", "migrate_pages", "move_pages",
    "vm86", "vm86old", "personality",
    # the new mount API and io_uring (bubblewrap uses neither; both widen the kernel surface)
    "fsopen", "fsconfig", "fsmount", "fspick", "move_mount", "open_tree", "mount_setattr",
    "io_uring_setup", "io_uring_enter", "io_uring_register",
}  # fmt: skip


def syscalls(header: Path) -> list[str]:
    names = re.findall(r"#define __NR_(\w+)\s+\d+", header.read_text())
    return sorted(set(names))


def profile(names: list[str]) -> dict:
    missing = [n for n in BUBBLEWRAP if n not in names]
    assert not missing, f"the header lacks {missing}"
    allowed = sorted(n for n in names if n not in DENIED)
    return {
        "defaultAction": "SCMP_ACT_ERRNO",
        "defaultErrnoRet": 1,
        "archMap": [
            {
                "architecture": "SCMP_ARCH_X86_64",
                "subArchitectures": ["SCMP_ARCH_X86", "SCMP_ARCH_X32"],
            }
        ],
        "syscalls": [{"names": allowed, "action": "SCMP_ACT_ALLOW"}],
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--header", type=Path,
                        default=Path("/usr/include/x86_64-linux-gnu/asm/unistd_64.h"))  # fmt: skip
    args = parser.parse_args()
    OUT.parent.mkdir(parents=True, exist_ok=True)
    OUT.write_text(json.dumps(profile(syscalls(args.header)), indent=1) + "\n")
    print(f"wrote {OUT}")


if __name__ == "__main__":
    main()
