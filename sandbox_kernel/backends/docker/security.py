"""What a Docker sandbox may do to the kernel and to the network, beyond dropped capabilities.

Two policies live here, both applied when a container is created:

* a seccomp profile. Docker's own default profile cannot be extended (a custom profile
  replaces it), so this one is written from what we need to refuse: a denylist over
  an allow default. It refuses the set-user-ID and set-group-ID bits on every path
  that makes or changes a file mode (``chmod``, ``open(O_CREAT)``, ``mknod`` ...):
  the workspace is a host folder, and a setuid file made there would be a setuid
  program on the host. It refuses new namespaces (the door to most kernel exploits
  reachable without capabilities), mounts, keyrings, BPF, io_uring (its operations
  bypass seccomp), and the module/clock/reboot family. Calls whose arguments seccomp
  cannot read (``clone3``, ``openat2``, ``fchmodat2``) answer ``ENOSYS`` so the C
  library falls back to the filtered ones.
* the network: every sandbox joins one bridge network of ours on which containers
  cannot reach each other (inter-container communication off), so one user's code
  cannot talk to another user's sandbox, and link-local addresses (cloud metadata
  services, 169.254.0.0/16) are dropped by a firewall rule when this process may add
  one. Per-user bridges would run out of Docker's address pools near 30 users; one
  shared bridge with ICC off scales to the size of its subnet.
"""

from __future__ import annotations

import errno
import json
import logging
import os
import shutil
import subprocess
from functools import lru_cache
from typing import Any

from ..base import LABEL_MANAGED, Conflict, SandboxFailed, SandboxNotFound
from .errors import engine_errors
from .wire import EngineCalls

log = logging.getLogger("sandbox_kernel")

NETWORK = "sandbox-kernel"
BRIDGE = "sk-br0"
LINK_LOCAL = "169.254.0.0/16"

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


def shared_network(engine: EngineCalls) -> str:
    """The name of our shared network, made on first use; one of that name that we did
    not make is refused (its containers could reach each other)."""
    try:
        with engine_errors(f"look up the network {NETWORK}", refused=SandboxFailed):
            network = engine.inspect_network(NETWORK)
    except SandboxNotFound:
        network = _create_network(engine)
    if (network.get("Labels") or {}).get(LABEL_MANAGED) != "1":
        raise SandboxFailed(
            f"a Docker network named {NETWORK} exists but was not made by sandbox-kernel; "
            "remove or rename it (its sandboxes could reach each other)"
        )
    if os.geteuid() == 0:
        problem = block_link_local()
        if problem:
            log.warning("sandboxes may reach link-local addresses (cloud metadata): %s", problem)
    return NETWORK


def _create_network(engine: EngineCalls) -> dict[str, Any]:
    """Make the shared network; another process making it at the same moment is fine."""
    try:
        with engine_errors(f"create the network {NETWORK}", refused=SandboxFailed):
            engine.create_network({"Name": NETWORK, "CheckDuplicate": True, **network_options()})
    except Conflict:
        pass
    with engine_errors(f"look up the network {NETWORK}", refused=SandboxFailed):
        return engine.inspect_network(NETWORK)


def network_options() -> dict[str, Any]:
    """How our shared network is made (the engine's create request): a bridge on which
    containers cannot reach each other."""
    return {
        "Driver": "bridge",
        "Options": {
            "com.docker.network.bridge.enable_icc": "false",
            "com.docker.network.bridge.name": BRIDGE,
        },
        "Labels": {LABEL_MANAGED: "1"},
    }


def block_link_local() -> str:
    """Drop traffic from our bridge to link-local addresses (cloud metadata); '' when done.

    The rule goes in DOCKER-USER (traffic routed through the host) and INPUT (addresses
    the host itself holds). It needs root and iptables; otherwise the reason is returned
    so the caller can log it once and the README's manual rule applies.
    """
    iptables = shutil.which("iptables")
    if iptables is None:
        return "iptables is not installed"
    failures = []
    for chain in ("DOCKER-USER", "INPUT"):
        rule = [chain, "-i", BRIDGE, "-d", LINK_LOCAL, "-j", "DROP"]
        try:
            present = subprocess.run([iptables, "-w", "-C", *rule], capture_output=True, timeout=10)
            if present.returncode == 0:
                continue
            added = subprocess.run([iptables, "-w", "-I", *rule], capture_output=True, timeout=10)
        except (OSError, subprocess.TimeoutExpired) as exc:
            failures.append(f"{chain}: {exc}")
            continue
        if added.returncode != 0:
            failures.append(f"{chain}: {added.stderr.decode(errors='replace').strip()[:200]}")
    return "; ".join(failures)
