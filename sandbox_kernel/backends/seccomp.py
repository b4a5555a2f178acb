"""What sandboxed code may ask of the kernel: one system-call policy for every engine.

The policy is a denylist over an allow default. It refuses the set-user-ID and
set-group-ID bits on every path that makes or changes a file mode (``chmod``,
``open(O_CREAT)``, ``mknod`` ...): a sandbox writes host folders, and a setuid file made
there would be a setuid program on the host. It refuses new namespaces (the door to
most kernel exploits reachable without capabilities), mounts, keyrings, BPF, io_uring
(its operations bypass seccomp), and the module/clock/reboot family. Calls whose
arguments seccomp cannot read (``clone3``, ``openat2``, ``fchmodat2``) answer ``ENOSYS``
so the C library falls back to the filtered ones.

Docker takes the policy as a profile (:mod:`.docker.security` renders it); bubblewrap
takes a compiled classic-BPF program (:func:`bpf_program`, for ``bwrap --seccomp FD``).
The program allows only this machine's own system-call ABI: 32-bit x86 and x32 calls on
x86_64 (and 32-bit arm calls on aarch64) end the process, so no other ABI is a way
around the rules.
"""

from __future__ import annotations

import errno
import os
import struct
from functools import lru_cache

S_ISUID = 0o4000
S_ISGID = 0o2000
# Namespace flags of clone(2): CLONE_NEWNS, NEWCGROUP, NEWUTS, NEWIPC, NEWUSER, NEWPID, NEWNET.
CLONE_NS_FLAGS = (
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
DENIED = [
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
NOT_IMPLEMENTED = ["clone3", "fchmodat2", "openat2"]
# (syscall, index of its mode argument): the mode may not carry S_ISUID or S_ISGID.
MODE_ARGS = [
    ("chmod", 1),
    ("fchmod", 1),
    ("fchmodat", 2),
    ("creat", 1),
    ("open", 2),
    ("openat", 3),
    ("mknod", 1),
    ("mknodat", 2),
]

# System-call numbers of the names above, per architecture (from the kernel's tables:
# arch/x86/entry/syscalls/syscall_64.tbl and include/uapi/asm-generic/unistd.h).
_X86_64 = {
    "acct": 163,
    "add_key": 248,
    "bpf": 321,
    "chmod": 90,
    "clock_adjtime": 305,
    "clock_settime": 227,
    "clone": 56,
    "clone3": 435,
    "creat": 85,
    "create_module": 174,
    "delete_module": 176,
    "fchmod": 91,
    "fchmodat": 268,
    "fchmodat2": 452,
    "finit_module": 313,
    "fsconfig": 431,
    "fsmount": 432,
    "fsopen": 430,
    "fspick": 433,
    "get_kernel_syms": 177,
    "init_module": 175,
    "io_uring_enter": 426,
    "io_uring_register": 427,
    "io_uring_setup": 425,
    "ioperm": 173,
    "iopl": 172,
    "kexec_file_load": 320,
    "kexec_load": 246,
    "keyctl": 250,
    "lookup_dcookie": 212,
    "mknod": 133,
    "mknodat": 259,
    "mount": 165,
    "mount_setattr": 442,
    "move_mount": 429,
    "name_to_handle_at": 303,
    "nfsservctl": 180,
    "open": 2,
    "open_by_handle_at": 304,
    "open_tree": 428,
    "openat": 257,
    "openat2": 437,
    "perf_event_open": 298,
    "pivot_root": 155,
    "query_module": 178,
    "quotactl": 179,
    "quotactl_fd": 443,
    "reboot": 169,
    "request_key": 249,
    "setns": 308,
    "settimeofday": 164,
    "swapoff": 168,
    "swapon": 167,
    "_sysctl": 156,
    "sysfs": 139,
    "syslog": 103,
    "umount2": 166,
    "unshare": 272,
    "uselib": 134,
    "userfaultfd": 323,
    "ustat": 136,
    "vhangup": 153,
}
_AARCH64 = {
    "acct": 89,
    "add_key": 217,
    "bpf": 280,
    "clock_adjtime": 266,
    "clock_settime": 112,
    "clone": 220,
    "clone3": 435,
    "delete_module": 106,
    "fchmod": 52,
    "fchmodat": 53,
    "fchmodat2": 452,
    "finit_module": 273,
    "fsconfig": 431,
    "fsmount": 432,
    "fsopen": 430,
    "fspick": 433,
    "init_module": 105,
    "io_uring_enter": 426,
    "io_uring_register": 427,
    "io_uring_setup": 425,
    "kexec_file_load": 294,
    "kexec_load": 104,
    "keyctl": 219,
    "lookup_dcookie": 18,
    "mknodat": 33,
    "mount": 40,
    "mount_setattr": 442,
    "move_mount": 429,
    "name_to_handle_at": 264,
    "nfsservctl": 42,
    "open_by_handle_at": 265,
    "open_tree": 428,
    "openat": 56,
    "openat2": 437,
    "perf_event_open": 241,
    "pivot_root": 41,
    "quotactl": 60,
    "quotactl_fd": 443,
    "reboot": 142,
    "request_key": 218,
    "setns": 268,
    "settimeofday": 170,
    "swapoff": 225,
    "swapon": 224,
    "syslog": 116,
    "umount2": 39,
    "unshare": 97,
    "userfaultfd": 282,
    "vhangup": 58,
}
# uname's machine -> (AUDIT_ARCH_* of the native ABI, its numbers, first number of a
# foreign ABI sharing the architecture (x32), or 0).
_ARCHES = {
    "x86_64": (0xC000003E, _X86_64, 0x40000000),
    "aarch64": (0xC00000B7, _AARCH64, 0),
}

# Classic BPF, as seccomp runs it (linux/filter.h, linux/seccomp.h).
_LD_W_ABS = 0x20
_JEQ_K = 0x15
_JGE_K = 0x35
_JSET_K = 0x45
_RET_K = 0x06
_RET_ALLOW = 0x7FFF0000
_RET_ERRNO = 0x00050000
_RET_KILL_PROCESS = 0x80000000
_NR = 0  # offsets in struct seccomp_data
_ARCH = 4
_ARG0 = 16  # args[i] at 16 + 8 * i; the low 32 bits first on little-endian machines


def _insn(code: int, k: int, jt: int = 0, jf: int = 0) -> bytes:
    return struct.pack("<HBBI", code, jt, jf, k)


def supported(machine: str = "") -> bool:
    """Whether :func:`bpf_program` knows this machine's architecture."""
    return (machine or os.uname().machine) in _ARCHES


@lru_cache(maxsize=4)
def bpf_program(machine: str = "") -> bytes:
    """The policy as a seccomp classic-BPF program (an array of ``struct sock_filter``)
    for ``machine`` (``uname -m``; this one when empty). Raises ValueError for an
    architecture it does not know (:func:`supported`)."""
    machine = machine or os.uname().machine
    if machine not in _ARCHES:
        raise ValueError(f"no system-call table for {machine}")
    arch, numbers, foreign = _ARCHES[machine]
    eperm, enosys = _RET_ERRNO | errno.EPERM, _RET_ERRNO | errno.ENOSYS
    prog = [
        _insn(_LD_W_ABS, _ARCH),
        _insn(_JEQ_K, arch, 1, 0),
        _insn(_RET_K, _RET_KILL_PROCESS),
        _insn(_LD_W_ABS, _NR),
    ]
    if foreign:
        prog += [_insn(_JGE_K, foreign, 0, 1), _insn(_RET_K, _RET_KILL_PROCESS)]
    for names, answer in ((DENIED, eperm), (NOT_IMPLEMENTED, enosys)):
        for name in names:
            if name in numbers:  # the A register still holds the number here
                prog += [_insn(_JEQ_K, numbers[name], 0, 1), _insn(_RET_K, answer)]
    bits = S_ISUID | S_ISGID
    argument_checks = [(name, index, bits) for name, index in MODE_ARGS]
    ns_flags = 0
    for flag in CLONE_NS_FLAGS:
        ns_flags |= flag
    argument_checks.append(("clone", 0, ns_flags))
    for name, index, mask in argument_checks:
        if name not in numbers:
            continue
        # nr matches: load the argument (which leaves A), refuse or allow; else skip
        # the four instructions of this check with the number still in A.
        prog += [
            _insn(_JEQ_K, numbers[name], 0, 4),
            _insn(_LD_W_ABS, _ARG0 + 8 * index),
            _insn(_JSET_K, mask, 0, 1),
            _insn(_RET_K, eperm),
            _insn(_RET_K, _RET_ALLOW),
        ]
    prog.append(_insn(_RET_K, _RET_ALLOW))
    return b"".join(prog)
