"""What a Docker sandbox may do to the kernel, beyond dropped capabilities: the
system-call policy every engine shares (:mod:`..seccomp`), as the seccomp profile
Docker's API takes, applied when a container is created (what it may do on the network
is :mod:`.network`'s).

Docker's own default profile cannot be extended (a custom profile replaces it), so the
policy is a denylist over an allow default.
"""

from __future__ import annotations

import errno
import json
from functools import lru_cache
from typing import Any

from ..base import Spec
from ..seccomp import CLONE_NS_FLAGS, DENIED, MODE_ARGS, NOT_IMPLEMENTED, S_ISGID, S_ISUID


def _masked(index: int, bit: int) -> dict[str, Any]:
    """A condition true when ``arg[index] & bit == bit``."""
    return {"index": index, "value": bit, "valueTwo": bit, "op": "SCMP_CMP_MASKED_EQ"}


@lru_cache(maxsize=1)
def seccomp_profile() -> str:
    """The profile as Docker's API takes it (``security_opt=["seccomp=<json>"]``)."""
    eperm = {"action": "SCMP_ACT_ERRNO", "errnoRet": errno.EPERM}
    rules: list[dict[str, Any]] = [{"names": DENIED, **eperm}]
    rules.append({"names": NOT_IMPLEMENTED, "action": "SCMP_ACT_ERRNO", "errnoRet": errno.ENOSYS})
    for name, index in MODE_ARGS:
        for bit in (S_ISUID, S_ISGID):
            rules.append({"names": [name], **eperm, "args": [_masked(index, bit)]})
    for flag in CLONE_NS_FLAGS:
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
