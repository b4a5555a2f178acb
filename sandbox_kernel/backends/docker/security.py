"""What a Docker sandbox may do to the kernel, beyond dropped capabilities: the
system-call policy every engine shares (:mod:`..seccomp`), as the seccomp profile
Docker's API takes, applied when a container is created (what it may do on the network
is :mod:`.network`'s).

A profile given to Docker replaces its default, so the policy carries Docker's default
allowlist itself and renders it with our stricter rules. The profile keeps to what
Docker 20.10 reads (``errnoRet``, ``includes``/``excludes`` with ``arches`` and
``minKernel``); ``defaultErrnoRet`` is for newer engines and says what 20.10 does anyway.
"""

from __future__ import annotations

import errno
import json
from functools import lru_cache
from typing import Any

from ..base import Spec
from ..seccomp import ALLOW, RULES, Rule

_OPS = {
    "clear": "SCMP_CMP_MASKED_EQ",
    "eq": "SCMP_CMP_EQ",
    "lt": "SCMP_CMP_LT",
}


def _syscall(rule: Rule) -> dict[str, Any]:
    """One rule as an entry of the profile's ``syscalls``."""
    entry: dict[str, Any] = {"names": list(rule.names)}
    if rule.errno == ALLOW:
        entry["action"] = "SCMP_ACT_ALLOW"
    else:
        entry.update(action="SCMP_ACT_ERRNO", errnoRet=rule.errno)
    if rule.arg >= 0:
        # MASKED_EQ compares arg & value with valueTwo: "clear" is valueTwo 0.
        entry["args"] = [{"index": rule.arg, "value": rule.value, "op": _OPS[rule.op]}]
    includes: dict[str, Any] = {}
    if rule.arches:
        includes["arches"] = list(rule.arches)
    if rule.min_kernel != (0, 0):
        includes["minKernel"] = "{}.{}".format(*rule.min_kernel)
    if includes:
        entry["includes"] = includes
    if rule.not_arches:
        entry["excludes"] = {"arches": list(rule.not_arches)}
    return entry


@lru_cache(maxsize=1)
def seccomp_profile() -> str:
    """The profile as Docker's API takes it (``security_opt=["seccomp=<json>"]``)."""
    profile = {
        "defaultAction": "SCMP_ACT_ERRNO",
        "defaultErrnoRet": errno.EPERM,
        # The rules apply to every ABI a binary of this machine may use (32-bit x86
        # programs on x86_64, arm on aarch64), so no other ABI is a way around them.
        "archMap": [
            {
                "architecture": "SCMP_ARCH_X86_64",
                "subArchitectures": ["SCMP_ARCH_X86", "SCMP_ARCH_X32"],
            },
            {"architecture": "SCMP_ARCH_AARCH64", "subArchitectures": ["SCMP_ARCH_ARM"]},
        ],
        "syscalls": [_syscall(rule) for rule in RULES if rule.names],
    }
    return json.dumps(profile, separators=(",", ":"))


def hardened_host(
    spec: Spec, mounts: list[dict[str, Any]], cpus: float, network: str
) -> dict[str, Any]:
    """A new container's host configuration: no capabilities, no new privileges, our
    seccomp profile, the flavor's limits (memory without swap beyond it), ``mounts``,
    ``network`` (or ``"none"``) and the runtime the administrator chose."""
    host: dict[str, Any] = {
        "Init": True,
        "Mounts": mounts,
        "CapDrop": ["ALL"],
        "SecurityOpt": ["no-new-privileges", f"seccomp={seccomp_profile()}"],
        "PidsLimit": spec.pids,
        "Memory": spec.memory,
        "MemorySwap": spec.memory,
        "NanoCpus": int(cpus * 1e9),
        "NetworkMode": network,
    }
    if spec.runtime:
        host["Runtime"] = spec.runtime
    return host
