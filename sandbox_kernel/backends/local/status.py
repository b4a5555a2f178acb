"""What a local sandbox's isolation is on this machine, and what of it does not hold.

Said in every listing (``SandboxInfo.isolation``), in the backend's health, and line by
line by :func:`limits_report` (for ``sandbox-kernel doctor``).
"""

from __future__ import annotations

import logging
import os
import shutil
import subprocess
import time
from functools import lru_cache

from .. import disks, seccomp
from . import cgroup, holder

log = logging.getLogger(__name__)
PLAIN_ISOLATION = "none: plain host processes in the workspace folder, no isolation"


@lru_cache(maxsize=1)
def bwrap_works() -> bool:
    """Whether bubblewrap can create namespaces here (it can't in some containers).

    Asked once per process, and the answer decides every sandbox's isolation: a probe
    that failed by chance (a moment without memory or processes) must not leave a
    server running plain processes, so bubblewrap gets three tries, and a refusal is
    logged with what bubblewrap said."""
    if os.environ.get("SANDBOX_KERNEL_LOCAL_NO_BWRAP") == "1" or not shutil.which("bwrap"):
        return False
    said = ""
    for attempt in range(3):
        if attempt:
            time.sleep(0.2 * attempt)
        try:
            probe = subprocess.run(
                ["bwrap", "--ro-bind", "/", "/", "--unshare-all", "--die-with-parent", "true"],
                capture_output=True,
                timeout=10,
            )
        except (OSError, subprocess.TimeoutExpired) as exc:
            said = str(exc)
            continue
        if probe.returncode == 0:
            return True
        said = probe.stderr.decode(errors="replace").strip() or f"exit {probe.returncode}"
    log.warning("bubblewrap cannot make namespaces here (%s): local sandboxes run plain", said)
    return False


def limits_report(installation: str) -> list[str]:
    """Which of a sandbox's bounds hold on this machine for this process's user, and
    why not where one does not: one line each (for ``doctor`` and the backend's health)."""
    if not bwrap_works():
        why = (
            "SANDBOX_KERNEL_LOCAL_NO_BWRAP=1"
            if os.environ.get("SANDBOX_KERNEL_LOCAL_NO_BWRAP") == "1"
            else "bubblewrap is missing or cannot make namespaces here (apt-get install bubblewrap)"
        )
        return [f"isolation: none ({why}): cells run as plain processes of yours"]
    place = cgroup.place(installation)
    lines = [
        "user: "
        + (
            "a uid of its own per running sandbox (root server)"
            if os.geteuid() == 0
            else "yours (uid 1000 'sandbox' inside)"
        ),
        "network: "
        + (
            "a namespace of its own, out through slirp4netns without the host's loopback"
            if holder.slirp_program()
            else "a namespace of its own with only lo: slirp4netns is not installed "
            "(apt-get install slirp4netns) so sandboxes have no network"
        ),
        "limits: " + _limits_text(place),
        "system calls: "
        + (
            "seccomp filter (no setuid files, namespaces, mounts, keyrings, BPF, io_uring)"
            if seccomp.supported()
            else f"no seccomp filter (no system-call table for {os.uname().machine})"
        ),
        "disk: "
        + (
            "the workspace and each sandbox's own files (home, /tmp) on disk images of "
            "the flavor's size"
            if disks.support().ok
            else f"not bounded ({disks.support().reason})"
        ),
        "egress_allow: "
        + (
            "held by an egress proxy per sandbox, on the host, reached only from the "
            "sandbox's own loopback"
        ),
    ]
    return lines


def _limits_text(place: cgroup.Place) -> str:
    if place:
        return place.describe()
    return (
        f"processes bounded per sandbox (RLIMIT_NPROC), memory per process only (RLIMIT_DATA), "
        f"CPU not limited: {place.describe()}"
    )


def isolation(place: cgroup.Place, network: str, disk: bool) -> str:
    """What separates this sandbox from the host, and what does not hold, in a line:
    ``network`` is "open", "egress" or "none"; ``disk`` whether disks bound it."""
    if not bwrap_works():
        return PLAIN_ISOLATION
    who = "a uid of its own" if os.geteuid() == 0 else "your uid"
    if network == "none":
        net = "no network"
    elif network == "egress":
        net = "network only through its egress proxy (egress_allow)"
    elif holder.slirp_program():
        net = "network through slirp4netns, not the host's loopback"
    else:
        net = "no network (slirp4netns is not installed)"
    bounds = (
        f"{'/'.join(place.controllers)} limited by cgroup v{place.version}"
        + ("" if "cpu" in place.controllers else ", CPU not")
        if place
        else f"processes limited, memory per process only, CPU not (no cgroup: {place.reason})"
    )
    return (
        f"bubblewrap as {who} (own namespaces, read-only system, minimal /etc, seccomp; "
        f"{net}; {bounds}; disk {'limited by disk images' if disk else 'not limited'}): "
        "weaker than a container"
    )
