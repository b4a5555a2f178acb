"""What a Docker sandbox may do to the kernel, beyond dropped capabilities: a seccomp
profile of ours, applied when a container is created (what it may do on the network is
:mod:`.network`'s).

Docker's own default profile cannot be extended (a custom profile replaces it), so this
one is written from what we need to refuse: a denylist over an allow default. It
refuses the set-user-ID and set-group-ID bits on every path that makes or changes a
file mode (``chmod``, ``open(O_CREAT)``, ``mknod`` ...): the workspace is a host folder,
and a setuid file made there would be a setuid program on the host. It refuses new
namespaces (the door to most kernel exploits reachable without capabilities), mounts,
keyrings, BPF, io_uring (its operations bypass seccomp), and the module/clock/reboot
family. Calls whose arguments seccomp cannot read (``clone3``, ``openat2``,
``fchmodat2``) answer ``ENOSYS`` so the C library falls back to the filtered ones.
"""

from __future__ import annotations

import errno
import json
from functools import lru_cache
from typing import Any

S_ISUID = 0o4000
S_ISGID = 0o2000
# Namespace flags of clone(2): CLONE_NEWNS, NEWCGROUP, NEWUTS, NEWIPC, NEWUSER, NEWPID, NEWNET.
_CLONE_NS_FLAGS = (
    0x00020000,
    0x02000000,
    0x04000000,
    0x08000000,
    0x10000000,
    0x20000000,
    0x40000000,
)

# Refused outright: administration of the kernel and its namespaces, and interfaces
# that give unprivileged code a large kernel attack surface.
_DENIED = [
    "acct",
    "add_key",
    "bpf",
    "clock_adjtime",
    "clock_settime",
    "create_module",
    "delete_module",
    "finit_module",
    "fsconfig",
    "fsmount",
    "fsopen",
    "fspick",
    "get_kernel_syms",
    "init_module",
    "io_uring_enter",
    "io_uring_register",
    "io_uring_setup",
    "ioperm",
    "iopl",
    "kexec_file_load",
    "kexec_load",
    "keyctl",
    "lookup_dcookie",
    "mount",
    "mount_setattr",
    "move_mount",
    "name_to_handle_at",
    "nfsservctl",
    "open_by_handle_at",
    "open_tree",
    "perf_event_open",
    "pivot_root",
    "query_module",
    "quotactl",
    "quotactl_fd",
    "reboot",
    "request_key",
    "setns",
    "settimeofday",
    "stime",
    "swapoff",
    "swapon",
    "_sysctl",
    "sysfs",
    "syslog",
    "umount",
    "umount2",
    "unshare",
    "uselib",
    "userfaultfd",
    "ustat",
    "vhangup",
    "vm86",
    "vm86old",
]
# Answered "not implemented": callers (glibc, Python) fall back to calls we can filter.
_NOT_IMPLEMENTED = ["clone3", "fchmodat2", "openat2"]
# (syscall, index of its mode argument): the mode may not carry S_ISUID or S_ISGID.
_MODE_ARGS = [
    ("chmod", 1),
    ("fchmod", 1),
    ("fchmodat", 2),
    ("creat", 1),
    ("open", 2),
    ("openat", 3),
    ("mknod", 1),
    ("mknodat", 2),
]


def _masked(index: int, bit: int) -> dict[str, Any]:
    """A condition true when ``arg[index] & bit == bit``."""
    return {"index": index, "value": bit, "valueTwo": bit, "op": "SCMP_CMP_MASKED_EQ"}


@lru_cache(maxsize=1)
def seccomp_profile() -> str:
    """The profile as Docker's API takes it (``security_opt=["seccomp=<json>"]``)."""
    eperm = {"action": "SCMP_ACT_ERRNO", "errnoRet": errno.EPERM}
    rules: list[dict[str, Any]] = [{"names": _DENIED, **eperm}]
    rules.append({"names": _NOT_IMPLEMENTED, "action": "SCMP_ACT_ERRNO", "errnoRet": errno.ENOSYS})
    for name, index in _MODE_ARGS:
        for bit in (S_ISUID, S_ISGID):
            rules.append({"names": [name], **eperm, "args": [_masked(index, bit)]})
    for flag in _CLONE_NS_FLAGS:
        rules.append({"names": ["clone"], **eperm, "args": [_masked(0, flag)]})
    profile = {
        "defaultAction": "SCMP_ACT_ALLOW",
        # The rules apply to every ABI a binary of this machine may use (32-bit x86
        # programs on x86_64, arm on aarch64), so no other ABI is a way around them.
        "archMap": [
            {
                "architecture": "SCMP_ARCH_X86_64",
                "subArchitectures": ["SCMP_ARCH_X86", "SCMP_ARCH_X32"],
            },
            {"architecture": "SCMP_ARCH_AARCH64", "subArchitectures": ["SCMP_ARCH_ARM"]},
        ],
        "syscalls": rules,
    }
    return json.dumps(profile, separators=(",", ":"))
