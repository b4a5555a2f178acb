"""Egress allowlists on the local backend: sandboxes that reach only the listed destinations.

A sandbox with an allowlist (``egress_allow``) gets a network namespace with nothing
but its loopback: no slirp4netns, so raw addresses, other ports, DNS to any server,
IPv6 and UDP all fail at once (no route). On that loopback, at ``127.0.0.1:3128``,
listens its **egress proxy**, its one way out, which its programs find through
``HTTPS_PROXY``/``HTTP_PROXY`` (pip, git and curl need no setting).

The proxy is the program Docker's proxies run (:mod:`...agent.egress_proxy`, with the
same rules), one per sandbox, started with the sandbox's holder and ending with it (a
pipe only the holder holds: see :func:`.holder.make`). It is a process of the host, in
the host's network, so it can reach what the list allows; its listening socket was made
in the sandbox's network namespace (:mod:`.netns`), so only that sandbox reaches it, and
nothing of it is published on the host. It runs under bubblewrap as the sandbox's host
user (a root server's sandbox's own uid, for which the firewall rule keeps link-local
addresses dropped; an ordinary user's own uid), in the sandbox's cgroup and under the
seccomp policy, and sees the host's programs, the Python running sandbox-kernel, the
files of ``/etc`` that name resolution reads, and a folder of its own for its counts.
Because it runs on the host, it never reaches the host's own loopback, listed or not:
there are the host's own services (the Jupyter server among them).
"""

from __future__ import annotations

import json
import os
import resource
import stat
import sys
import time
from pathlib import Path
from typing import Any

from ...agent import program
from ..base import EgressCount, SandboxFailed
from ..egress import PORT, digest
from .folders import plain_binds, python_folders, seccomp_fd
from .holder import READY_SECONDS, Holder, detached_start
from .launch import Launch, close_all
from .netns import SandboxNetwork
from .view import HOSTNAME, bind_args, system_args

STATE = "egress"  # <state>/local/<id>/egress: the proxy's own folder (its counts)
LOG = "egress-proxy.log"  # <state>/local/<id>/egress-proxy.log: what it said
LOG_LIMIT = 1 << 20  # bytes of log a proxy may write (RLIMIT_FSIZE: then it writes no more)
COUNTS = "/run/egress-state/counts.json"
# The host's own loopback (and the "this host" addresses that reach it): never, for a
# proxy that runs on the host.
NEVER = ("127.0.0.0/8", "::1/128", "0.0.0.0/8", "::/128")
NEVER_WHY = "this host itself, where the proxy runs"
# Of /etc, what resolving names needs (the host's own files, read-only).
NAME_SERVICE = (
    "resolv.conf",
    "hosts",
    "nsswitch.conf",
    "host.conf",
    "gai.conf",
    "services",
    "protocols",
    "ld.so.cache",
    "localtime",
)
READY = b"egress proxy listening"


def start_proxy(
    folder: Path,
    found: Holder,
    exit_fd: int,
    entries: list[str],
    cgroup_files: list[str],
    limits: list[tuple[int, int]],
) -> None:
    """Start the egress proxy of the sandbox whose folder is ``folder`` and whose holder
    is ``found`` (see the module); return once it listens. ``exit_fd`` is the pipe that
    closes when the holder ends; ``limits`` its processes' resource limits."""
    state = folder / STATE
    state.mkdir(mode=0o700, exist_ok=True)
    st = os.lstat(state)
    if not stat.S_ISDIR(st.st_mode):
        raise SandboxFailed(f"{state} is not a folder: cannot start the egress proxy")
    if os.geteuid() == 0 and (st.st_uid, st.st_gid) != (found.uid, found.gid):
        os.chown(state, found.uid, found.gid, follow_symlinks=False)  # its uid, this start
    network = SandboxNetwork(found, folder.name)
    try:
        listener = network.listener("127.0.0.1", PORT)
    except OSError as exc:
        raise SandboxFailed(f"cannot make the sandbox's egress proxy a socket: {exc}") from None
    finally:
        network.close()
    opened: list[int] = []
    staged: list[tuple[int, str, bool]] = []
    try:
        config = {
            "allow": entries,
            "never": list(NEVER),
            "never_why": NEVER_WHY,
            "counts": COUNTS,
            "listen_fd": listener.fileno(),
            "exit_fd": exit_fd,
            "serves": str(folder),  # (for whoever reads the process list: which sandbox)
        }
        binds = plain_binds(
            [*python_folders(), ("egress", str(state), "/run/egress-state", True, False)],
            staged,
            opened,
        )
        filter_fd = seccomp_fd(opened)
        argv = [
            "bwrap",
            "--unshare-user",
            "--unshare-pid",
            "--unshare-ipc",
            "--unshare-uts",
            "--unshare-cgroup-try",
            "--new-session",
            "--hostname",
            f"{HOSTNAME}-egress",
            *system_args(),
        ]
        for name in NAME_SERVICE:
            argv += ["--ro-bind-try", f"/etc/{name}", f"/etc/{name}"]
        argv += ["--proc", "/proc", "--dev", "/dev"]
        for bind in binds:
            argv += bind_args(bind)
        if filter_fd >= 0:
            argv += ["--seccomp", str(filter_fd)]
        argv += ["--chdir", "/", "--clearenv", "--setenv", "PATH", "/usr/bin:/bin"]
        argv += ["--", sys.executable, *program("egress_proxy", json.dumps(config))[1:]]
        launch = Launch(
            cgroup_files=cgroup_files,
            staged=staged,
            become=(found.uid, found.gid) if os.geteuid() == 0 else None,
            limits=[*limits, (resource.RLIMIT_FSIZE, LOG_LIMIT)],
        )
        log_path = folder / LOG
        with open(log_path, "wb") as log_file:
            keep = [listener.fileno(), exit_fd, *([filter_fd] if filter_fd >= 0 else [])]
            detached_start(argv, launch, "the sandbox's egress proxy", log_file, keep)
    finally:
        listener.close()
        close_all(opened)
    _wait_until_listening(log_path)


def _wait_until_listening(log_path: Path) -> None:
    """Return once the proxy said it listens; SandboxFailed with what it said instead."""
    deadline = time.monotonic() + READY_SECONDS
    said = b""
    while time.monotonic() < deadline:
        try:
            said = log_path.read_bytes()[:4096]
        except OSError:
            said = b""
        if READY in said:
            return
        time.sleep(0.01)
    text = "; ".join(said.decode(errors="replace").strip().splitlines())[-400:]
    raise SandboxFailed("the sandbox's egress proxy did not start: " + (text or "it said nothing"))


def denied(root: Path, records: list[dict[str, Any]]) -> list[EgressCount]:
    """What the proxies of the sandboxes of ``records`` (kept in ``root``) refused, by
    allowlist and reason, each since it started."""
    totals: dict[tuple[str, str], int] = {}
    for record in records:
        if record.get("egress_allow"):
            for count in _denied(root / record["id"], record["egress_allow"]):
                key = (count.allowlist, count.reason)
                totals[key] = totals.get(key, 0) + count.count
    return [EgressCount(a, r, n) for (a, r), n in sorted(totals.items())]


def _denied(folder: Path, entries: list[str]) -> list[EgressCount]:
    """What the proxy of the sandbox whose folder is ``folder`` refused since it started
    (read from its counts file, never following a link)."""
    try:
        fd = os.open(folder / STATE / "counts.json", os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK)
    except OSError:
        return []
    try:
        if not stat.S_ISREG(os.fstat(fd).st_mode):
            return []
        raw = os.read(fd, 1 << 16)
    finally:
        os.close(fd)
    try:
        counts = json.loads(raw or b"{}").get("denied") or {}
        return [
            EgressCount(digest(entries), str(kind), int(count))
            for kind, count in sorted(counts.items())
        ]
    except (ValueError, TypeError, AttributeError):
        return []
