"""The namespaces every process of one local sandbox shares: its user and its network.

Each bubblewrap process of a sandbox has its own mounts, processes and /tmp, but the
processes of one sandbox must share a network (a cell's server, reached from a
terminal), and no sandbox may share the host's (every loopback-only service of the
host, and the host's abstract Unix sockets, would be one ``connect()`` away) or
another sandbox's. So while a sandbox runs, a small *holder* keeps a user namespace
and a network namespace of its own open, and every process of the sandbox enters
both before bubblewrap makes the rest (see :mod:`.launch`):

* the holder is ``sleep infinity`` under bubblewrap with ``--unshare-user
  --unshare-net``, running as the sandbox's host user: with a root server a uid of
  its own per running sandbox (:func:`claim_uid`), which no host account has, so
  root-owned host files it sees stay root's; otherwise the server's own user;
* outbound traffic goes through ``slirp4netns --disable-host-loopback``, user-mode
  networking in its own sandbox and seccomp filter: connections leave from the host
  as the sandbox's uid, and the host's 127.0.0.1 is not reachable through it. With
  ``network = false``, or without slirp4netns, the namespace has nothing but ``lo``;
  with an egress allowlist, ``lo`` and its egress proxy listening there, started with
  the holder (:mod:`.egress`). The uid per sandbox is where firewall rules attach
  (``iptables -m owner``): a root server adds one, no link-local address (cloud
  metadata), which holds for the sandbox's egress proxy too.

The holder's pid, start time and uid are kept in ``holder.json`` beside the sandbox's
record; a holder that is gone (a reboot, a kill) is made anew at the next process.
"""

from __future__ import annotations

import contextlib
import fcntl
import grp
import hashlib
import json
import logging
import os
import pwd
import select
import shutil
import signal
import subprocess
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from functools import lru_cache
from pathlib import Path
from typing import IO

from ..base import SandboxFailed
from .launch import CLONE_NEWNET, CLONE_NEWUSER, Launch, close_all, pass_fds, start

log = logging.getLogger("sandbox_kernel")

HOLDER_FILE = "holder.json"
# The uids of root's sandboxes: a range no distribution gives accounts or containers
# (systemd's "unused" block between its container ranges and 2^31).
UID_BASE = 0x78000000
UID_SPAN = 1 << 24
CLAIMS = Path("/run/sandbox-kernel/uids")
LINK_LOCAL = "169.254.0.0/16"
READY_SECONDS = 10.0


@dataclass
class Holder:
    """A live holder: the process whose namespaces the sandbox's processes enter."""

    pid: int
    start: str  # its start time (field 22 of /proc/<pid>/stat): pids are reused
    uid: int  # the sandbox's host uid and gid
    gid: int
    network: str  # "slirp4netns", "egress" (only its egress proxy) or "none"
    etc: str = ""  # the folder its processes see as /etc (see view.shared_etc)
    # The work folder's protected paths as found at this start: (path, "read-only" | "pin")
    protected: list[list[str]] = field(default_factory=list)
    # The writable mapped folders' protected paths as found at this start, as the sandbox
    # sees them: (path, "read-only" | "pin")
    mapped: list[list[str]] = field(default_factory=list)

    def namespaces(self) -> list[tuple[int, int]]:
        """Descriptors of its user and network namespaces, to enter (close them after).
        Raises SandboxFailed if it is not the recorded process (anymore)."""
        opened: list[tuple[int, int]] = []
        try:
            for name, kind in (("user", CLONE_NEWUSER), ("net", CLONE_NEWNET)):
                opened.append(
                    (os.open(f"/proc/{self.pid}/ns/{name}", os.O_RDONLY | os.O_CLOEXEC), kind)
                )
        except OSError:
            close_all([fd for fd, _ in opened])
            raise SandboxFailed("the sandbox's namespaces are gone (its holder ended)") from None
        if start_time(self.pid) != self.start:  # opened another process's: the pid was reused
            close_all([fd for fd, _ in opened])
            raise SandboxFailed("the sandbox's namespaces are gone (its holder ended)")
        return opened


def start_time(pid: int) -> str:
    """A process's start time in clock ticks since boot ("" when it is gone or a zombie)."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return ""
    fields = stat.rsplit(")", 1)[-1].split()
    return "" if len(fields) < 20 or fields[0] == "Z" else fields[19]


def load(folder: Path) -> Holder | None:
    """The sandbox's holder, if it is alive."""
    try:
        holder = Holder(**json.loads((folder / HOLDER_FILE).read_text()))
    except (OSError, ValueError, TypeError):
        return None
    return holder if start_time(holder.pid) == holder.start else None


def _signal(pid: int, start: str) -> None:
    """SIGKILL ``pid`` if it still is the process that started at ``start``."""
    if not pid:
        return
    try:
        pidfd = os.pidfd_open(pid)
    except OSError:
        return
    try:
        if start_time(pid) == start:
            signal.pidfd_send_signal(pidfd, signal.SIGKILL)
    except OSError:
        pass
    finally:
        os.close(pidfd)


def end(folder: Path) -> None:
    """End the sandbox's holder (its network helper ends with it). With a root server,
    first every process of the sandbox's own uid (kill(-1) as that uid reaches exactly
    those, in every namespace), while the holder still holds the uid, so that no other
    sandbox can have it yet."""
    holder = load(folder)
    if holder is not None:
        if os.geteuid() == 0 and holder.uid >= UID_BASE:
            with contextlib.suppress(OSError, subprocess.SubprocessError):
                subprocess.run(
                    [_kill_program(), "-KILL", "-1"],
                    user=holder.uid,
                    group=holder.gid,
                    extra_groups=[],
                    stdin=subprocess.DEVNULL,
                    stdout=subprocess.DEVNULL,
                    stderr=subprocess.DEVNULL,
                    timeout=10,
                )
        _signal(holder.pid, holder.start)  # slirp4netns ends with it
    (folder / HOLDER_FILE).unlink(missing_ok=True)


@lru_cache(maxsize=1)
def _kill_program() -> str:
    return shutil.which("kill", path="/usr/bin:/bin") or "kill"


# -- the sandbox's uid (root server) -------------------------------------------------------
@lru_cache(maxsize=1)
def _taken_ids() -> tuple[set[int], list[tuple[int, int]]]:
    """Host accounts' and groups' ids, and the subordinate ranges (rootless containers)."""
    ids = {p.pw_uid for p in pwd.getpwall()} | {g.gr_gid for g in grp.getgrall()}
    ranges = []
    for table in ("/etc/subuid", "/etc/subgid"):
        with contextlib.suppress(OSError):
            for line in Path(table).read_text().splitlines():
                parts = line.strip().split(":")
                if len(parts) == 3 and parts[1].isdigit() and parts[2].isdigit():
                    ranges.append((int(parts[1]), int(parts[1]) + int(parts[2])))
    return ids, ranges


def claim_uid(installation: str, sandbox_id: str) -> tuple[int, int]:
    """(uid, lock descriptor): a uid of :data:`UID_BASE`'s range no host account, group,
    subordinate range or other running sandbox has, for a sandbox starting now.

    Its claim is a lock on ``/run/sandbox-kernel/uids/<uid>``, held by the holder for its
    life (pass it the descriptor): a uid is never shared by two running sandboxes, and
    needs no cleanup (a reboot empties /run and ends every holder)."""
    CLAIMS.mkdir(parents=True, exist_ok=True, mode=0o700)
    taken, ranges = _taken_ids()
    digest = int.from_bytes(
        hashlib.sha256(f"{installation}/{sandbox_id}".encode()).digest()[:8], "big"
    )
    for step in range(4096):
        uid = UID_BASE + (digest + step) % UID_SPAN
        if uid in taken or any(lo <= uid < hi for lo, hi in ranges):
            continue
        fd = os.open(CLAIMS / str(uid), os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o600)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError:
            os.close(fd)
            continue
        return uid, fd
    raise SandboxFailed("no free uid for the sandbox in sandbox-kernel's range (4096 tried)")


@lru_cache(maxsize=1)
def block_link_local() -> str:
    """As root: drop the sandboxes' connections to link-local addresses (cloud metadata
    services) with one firewall rule over the range of their uids; "" when in place,
    else why not (logged once)."""
    iptables = shutil.which("iptables")
    if os.geteuid() != 0:
        return "only root can add the firewall rule"
    if iptables is None:
        return "iptables is not installed"
    rule = [
        "OUTPUT",
        "-m",
        "owner",
        "--uid-owner",
        f"{UID_BASE}-{UID_BASE + UID_SPAN - 1}",
        "-d",
        LINK_LOCAL,
        "-j",
        "REJECT",
    ]
    try:
        if (
            subprocess.run(
                [iptables, "-w", "-C", *rule], capture_output=True, timeout=10
            ).returncode
            == 0
        ):
            return ""
        added = subprocess.run([iptables, "-w", "-I", *rule], capture_output=True, timeout=10)
    except (OSError, subprocess.TimeoutExpired) as exc:
        return str(exc)
    if added.returncode != 0:
        problem = added.stderr.decode(errors="replace").strip()[:200]
        log.warning("local sandboxes may reach link-local addresses (cloud metadata): %s", problem)
        return problem
    return ""


# -- making one --------------------------------------------------------------------------
def slirp_program() -> str:
    """slirp4netns, where this host has it ("" otherwise)."""
    return shutil.which("slirp4netns") or ""


def make(
    folder: Path,
    uid: int,
    gid: int,
    claim: int,
    network: bool,
    cgroup_files: list[str],
    system: list[str],
    egress: Callable[[Holder, int], None] | None = None,
) -> Holder:
    """Start the holder of the sandbox whose folder is ``folder``, running as ``uid``:
    its namespaces, and the network helper when ``network`` asks for one. ``claim``
    (-1 for none) is the uid's lock, kept by the holder; ``system`` the bubblewrap
    arguments that show it the host's programs (it only runs ``sleep``). With
    ``egress``, the namespace gets no network helper: ``egress(holder, exit_fd)``
    starts its egress proxy instead (``exit_fd`` reads end of file once the holder has
    ended)."""
    become = (uid, gid) if os.geteuid() == 0 and uid != 0 else None
    info_r, info_w = os.pipe2(os.O_CLOEXEC)
    # slirp4netns ends when this pipe's other end (held by the holder only) closes.
    exit_r, exit_w = os.pipe2(os.O_CLOEXEC)
    argv = [
        "bwrap",
        "--unshare-user",
        "--uid",
        "0",
        "--gid",
        "0",
        "--unshare-net",
        *system,
        "--info-fd",
        str(info_w),
        "--",
        shutil.which("sleep", path="/usr/bin:/bin") or "sleep",
        "infinity",
    ]
    launch = Launch(cgroup_files=cgroup_files, become=become)
    try:
        with open(folder / "holder.log", "wb") as log_file:
            detached_start(
                argv, launch, "the sandbox's namespaces", log_file, [info_w, exit_w, claim]
            )
    finally:
        close_all([info_w, claim])
    try:
        pid = _child_pid(info_r, folder / "holder.log")
    finally:
        os.close(info_r)
    holder = Holder(pid, start_time(pid), uid, gid, "none")
    (folder / HOLDER_FILE).write_text(json.dumps(asdict(holder)))  # so stop can end it
    try:
        if egress is not None:
            egress(holder, exit_r)
            holder.network = "egress"
        elif network and slirp_program():
            _slirp(folder, holder, exit_r, cgroup_files, become)
            holder.network = "slirp4netns"
    except BaseException:
        end(folder)
        raise
    finally:
        close_all([exit_r, exit_w])
    (folder / HOLDER_FILE).write_text(json.dumps(asdict(holder)))
    return holder


def detached_start(
    argv: list[str], launch: Launch, what: str, log_file: IO[bytes], keep: list[int]
) -> None:
    """Start ``argv`` as a daemon: through a shell that starts it in the background and
    exits, so it belongs to no process of ours (none has to reap it, however long it
    runs) and outlives the one that started it (a CLI command, a kernel)."""
    proc = start(
        ["/bin/sh", "-c", '"$@" &', "sh", *argv],
        launch,
        what,
        start_new_session=True,
        stdin=subprocess.DEVNULL,
        stdout=log_file,
        stderr=log_file,
        pass_fds=pass_fds(keep),
    )
    proc.wait()


def _tail(path: Path) -> str:
    """What a helper said (stderr comes before its buffered stdout in the log: all of it)."""
    text = path.read_text(errors="replace").strip() if path.exists() else ""
    return "; ".join(text.splitlines())[-500:]


def _child_pid(info_r: int, log_path: Path) -> int:
    """The holder's pid, from bubblewrap's --info-fd (or why it did not start)."""
    data = b""
    while True:
        ready, _, _ = select.select([info_r], [], [], READY_SECONDS)
        chunk = os.read(info_r, 4096) if ready else b""
        if not chunk:
            break
        data += chunk
    try:
        pid = int(json.loads(data)["child-pid"])
    except (ValueError, KeyError, TypeError):
        raise SandboxFailed(
            f"cannot make the sandbox's namespaces: {_tail(log_path) or 'bubblewrap said nothing'}"
        ) from None
    # bubblewrap says the pid before its child has mapped the ids of its user namespace;
    # whatever joins that namespace must wait until it has (the child runs sleep then).
    deadline = time.monotonic() + READY_SECONDS
    while _command_of(pid) != "sleep":
        if time.monotonic() > deadline or not start_time(pid):
            raise SandboxFailed(
                f"cannot make the sandbox's namespaces: {_tail(log_path) or 'the holder did not start'}"
            )
        time.sleep(0.002)
    return pid


def _command_of(pid: int) -> str:
    try:
        return Path(f"/proc/{pid}/comm").read_text().strip()
    except OSError:
        return ""


def _slirp(
    folder: Path,
    holder: Holder,
    exit_r: int,
    cgroup_files: list[str],
    become: tuple[int, int] | None,
) -> None:
    """Start slirp4netns on the holder's network namespace; return once the interface is
    up. It ends by itself when the holder does (``--exit-fd``: a pipe only the holder
    keeps open)."""
    ready_r, ready_w = os.pipe2(os.O_CLOEXEC)
    argv = [
        slirp_program(),
        "--configure",
        "--mtu=65520",
        "--disable-host-loopback",
        "--enable-sandbox",
        "--enable-seccomp",
        "--ready-fd",
        str(ready_w),
        "--exit-fd",
        str(exit_r),
        str(holder.pid),
        "tap0",
    ]
    if become is not None:
        block_link_local()
    log_path = folder / "slirp4netns.log"
    with open(log_path, "wb") as log_file:
        try:
            detached_start(
                argv,
                Launch(cgroup_files=cgroup_files, become=become),
                "the sandbox's network (slirp4netns)",
                log_file,
                [ready_w, exit_r],
            )
        finally:
            os.close(ready_w)
    try:
        ready, _, _ = select.select([ready_r], [], [], READY_SECONDS)
        said = os.read(ready_r, 1) if ready else b""
    finally:
        os.close(ready_r)
    if said != b"1":
        raise SandboxFailed(
            "cannot start the sandbox's network (slirp4netns): "
            + (_tail(log_path) or "it did not say it was ready")
        )
