"""A container's processes as this host sees them through its cgroup files: live
memory and CPU, and ending processes from outside the sandbox.

Reading files costs no engine round trip, so listing a hundred sandboxes stays fast;
when the engine runs elsewhere (or cgroups are hidden) callers fall back to the
engine's stats call, or to a program run inside the sandbox.
"""

from __future__ import annotations

import os
import signal
import time
from collections.abc import Callable, Iterable
from pathlib import Path


def cgroup_usage(container_id: str) -> dict[str, float] | None:
    """Memory use and CPU seconds of a container from this host's cgroup files, if visible."""
    memory = cgroup_memory(container_id)
    if memory is None:
        return None
    found: dict[str, float] = {"memory": memory}
    for folder in _cgroup_dirs(container_id, "cpuacct", "cpu,cpuacct"):
        nanoseconds = _read_int(folder / "cpuacct.usage")  # v1
        if nanoseconds is not None:
            found["cpu_seconds"] = nanoseconds * 1e-9
            break
        microseconds = _stat_value(folder / "cpu.stat", "usage_usec")  # v2
        if microseconds is not None:
            found["cpu_seconds"] = microseconds * 1e-6
            break
    return found


def cgroup_memory(container_id: str) -> int | None:
    """Memory use of a container from cgroup v1 or v2 files on this host, if visible:
    what it uses less the file cache it could give back at once."""
    for folder in _cgroup_dirs(container_id, "memory"):
        for usage_file, inactive_key in (
            ("memory.usage_in_bytes", "total_inactive_file"),  # v1
            ("memory.current", "inactive_file"),  # v2
        ):
            usage = _read_int(folder / usage_file)
            if usage is not None:
                inactive = _stat_value(folder / "memory.stat", inactive_key) or 0
                return max(0, usage - inactive)
    return None


def container_pids(container_id: str) -> list[int] | None:
    """The host pids of every process of a container (cgroup v1 or v2), if visible here."""
    for folder in _cgroup_dirs(container_id, "pids"):
        try:
            return [int(line) for line in (folder / "cgroup.procs").read_text().split()]
        except (OSError, ValueError):
            continue
    return None


def _cgroup_dirs(container_id: str, *controllers: str) -> list[Path]:
    """Where a container's cgroup may be on this host: under each cgroup v1
    ``controllers`` folder, then the single v2 tree; each as Docker lays it out with
    the cgroupfs driver (``docker/<id>``) and the systemd one (``docker-<id>.scope``)."""
    root = Path("/sys/fs/cgroup")
    found = []
    for top in (*(root / c for c in controllers), root):
        found += [
            top / "docker" / container_id,
            top / "system.slice" / f"docker-{container_id}.scope",
        ]
    return found


def _read_int(path: Path) -> int | None:
    """The number a cgroup file holds, or None if it is not there."""
    try:
        return int(path.read_text())
    except (OSError, ValueError):
        return None


def _stat_value(path: Path, key: str) -> int | None:
    """The value of ``key`` in a cgroup ``*.stat`` file (``key value`` lines), or None."""
    try:
        for line in path.read_text().splitlines():
            name, _, value = line.partition(" ")
            if name == key:
                return int(value)
    except (OSError, ValueError):
        pass
    return None


STUCK_AFTER = 3.0  # seconds a start must have lasted to count as stuck
STUCK_START = b"(runc:[2:INIT]) "  # the runtime's own process, until it becomes the command


def end_stuck_starts(container_id: str) -> int:
    """Kill the runtime's half-started processes that a process of the sandbox stopped.

    ``docker exec`` starts a command through ``runc init``, which runs as the sandbox's
    user for a moment: a cell that sends SIGSTOP to every process of its user, over and
    over, stops it there. The engine then waits for ever on that start while holding the
    container's lock, and inspect, stop and remove of the container all hang (Docker
    20.10). Killing the stopped ``runc init`` fails that one start and frees the lock.
    Only processes of this container's cgroup that are stopped and named so are touched
    (a cell can name itself so and stop itself: then it is its own that ends). Returns
    how many were killed; 0 where the engine's processes are not visible here.
    """
    stopped = {
        pid: age
        for pid in container_pids(container_id) or []
        if (age := _stopped_start_age(pid, container_id)) is not None
    }
    if not stopped:
        return 0
    youngest = min(stopped.values())
    if youngest < STUCK_AFTER:  # stopped now, but maybe only for a moment: look again then
        time.sleep(STUCK_AFTER - youngest)
    return sum(
        1
        for pid in stopped
        if _is_stuck_start(pid, container_id) and _kill_exactly(pid, container_id)
    )


def _is_stuck_start(pid: int, container_id: str) -> bool:
    """Whether ``pid`` is, now, a stopped ``runc init`` in the container's cgroup, and
    has been one for STUCK_AFTER seconds at least."""
    age = _stopped_start_age(pid, container_id)
    return age is not None and age >= STUCK_AFTER


def _stopped_start_age(pid: int, container_id: str) -> float | None:
    """Seconds since ``pid`` started, if it is a stopped ``runc init`` of the container
    now; else None."""
    try:
        with open(f"/proc/{pid}/stat", "rb") as fh:
            stat = fh.read()
        with open(f"/proc/{pid}/cgroup", "rb") as fh:
            groups = fh.read()
    except OSError:
        return None
    name_end = stat.rfind(b") ") + 2
    if not (
        STUCK_START in stat[:name_end]
        and stat[name_end : name_end + 1] in (b"T", b"t")
        and container_id.encode() in groups
    ):
        return None
    # A start lasts milliseconds; the reaper's own freeze stops a start under way for
    # about as long. Only one that is still stopped at STUCK_AFTER seconds is stuck.
    try:
        started = int(stat[name_end:].split()[19]) / os.sysconf("SC_CLK_TCK")
        uptime = float(Path("/proc/uptime").read_text().split()[0])
    except (OSError, ValueError, IndexError):
        return None
    return max(0.0, uptime - started)


def _kill_exactly(pid: int, container_id: str) -> bool:
    """SIGKILL the stuck start that is ``pid`` now, and no other process."""
    return signal_exactly(pid, signal.SIGKILL, lambda: _is_stuck_start(pid, container_id))


def signal_exactly(pid: int, sig: int, still_it: Callable[[], bool]) -> bool:
    """Send ``sig`` to the process that is ``pid`` now, if ``still_it()`` holds for it:
    through a pidfd, checked once held, so a pid that ended and was reused meanwhile
    (by anything on the host) is never signalled. Without pidfds (Linux < 5.3), a
    plain kill after the check. Whether it was sent."""
    try:
        pidfd = os.pidfd_open(pid)
    except (AttributeError, OSError):
        try:
            if not still_it():
                return False
            os.kill(pid, sig)
            return True
        except OSError:
            return False
    try:
        if not still_it():
            return False  # ended, or another process took the pid
        signal.pidfd_send_signal(pidfd, sig)
        return True
    except OSError:
        return False
    finally:
        os.close(pidfd)


def end_process_trees(container_id: str, targets: Iterable[tuple[int, str]]) -> bool:
    """Kill, from this host, the trees of the container's processes named by
    ``targets`` ((pid inside the sandbox, start time) pairs).

    Nothing in the sandbox can hinder it: no program of ours has to start there (a
    cell can take every pid the sandbox may have, and stop any process of its user, a
    killer of ours too). Each tree is stopped whole before anything in it dies (see
    :func:`_stop_tree`), so no process escapes to init by forking while its parent is
    killed. Only processes of the container's cgroup are signalled, each checked by
    start time through a pidfd. False when this host does not show the container's
    processes, or may not signal them: the caller ends them from inside the sandbox.
    """
    table = _container_processes(container_id)
    if table is None:
        return False
    wanted = {(int(pid), str(start)) for pid, start in targets}
    roots = [(pid, p.start) for pid, p in table.items() if (p.inner_pid, p.start) in wanted]
    for root, start in roots:
        if not signal_exactly(root, signal.SIGSTOP, _same_process(root, start, container_id)):
            if _exists(root):
                return False  # not ours to signal (another uid): let the sandbox do it
            continue  # it ended meanwhile; what it left is under init now, reaped there
        for pid, child_start in [*_stop_tree(root, container_id), (root, start)]:
            signal_exactly(pid, signal.SIGKILL, _same_process(pid, child_start, container_id))
    return True


def _stop_tree(root: int, container_id: str, passes: int = 1000) -> list[tuple[int, str]]:
    """Stop every live descendant of the stopped ``root``; (host pid, start time) of each.

    A listing of /proc is not one instant: a process that forks and exits while it
    is read (a pid hopper) leaves a child the listing missed. So descendants are
    stopped pass after pass until a listing finds the very set of the pass before, all
    of which were stopped already then: nothing could fork since, and nothing is
    missing. Orphans meanwhile go to the nearest living subreaper, the interpreter's
    watcher, stopped but alive, so the tree holds them. Bounded in passes; what a
    pass found last is returned either way.
    """
    before: dict[int, bool] | None = None  # the pass before: {pid: whether stopped}
    found: dict[int, tuple[str, bool]] = {}
    for _ in range(passes):
        table = _container_processes(container_id) or {}
        found = {pid: (table[pid].start, table[pid].stopped) for pid in _descendants(root, table)}
        if before is not None and found.keys() == before.keys() and all(before.values()):
            break
        for pid, (start, stopped) in found.items():
            if not stopped:
                signal_exactly(pid, signal.SIGSTOP, _same_process(pid, start, container_id))
        before = {pid: stopped for pid, (_, stopped) in found.items()}
    return [(pid, start) for pid, (start, _) in found.items()]


class _Process:
    """One process of a container as this host's /proc shows it."""

    __slots__ = ("inner_pid", "parent", "start", "state")

    def __init__(self, inner_pid: int, parent: int, start: str, state: bytes) -> None:
        self.inner_pid = inner_pid
        self.parent = parent
        self.start = start
        self.state = state

    @property
    def stopped(self) -> bool:
        return self.state in (b"T", b"t")


def _container_processes(container_id: str) -> dict[int, _Process] | None:
    """{host pid: process} of every process of the container now; None if not visible."""
    pids = container_pids(container_id)
    if pids is None:
        return None
    table = {}
    for pid in pids:
        read = _read_process(pid)
        if read is not None:
            table[pid] = read
    return table


def _read_process(pid: int) -> _Process | None:
    try:
        with open(f"/proc/{pid}/stat", "rb") as fh:
            stat = fh.read()
        with open(f"/proc/{pid}/status", "rb") as fh:
            status = fh.read()
    except OSError:
        return None
    rest = stat[stat.rfind(b")") + 2 :].split()
    inner = next(
        (line.split()[-1] for line in status.splitlines() if line.startswith(b"NSpid:")), b"0"
    )
    try:
        return _Process(int(inner), int(rest[1]), rest[19].decode(), rest[0])
    except (ValueError, IndexError):
        return None


def _descendants(root: int, table: dict[int, _Process]) -> list[int]:
    """Host pids of the live (not zombie) descendants of ``root``."""
    children: dict[int, list[int]] = {}
    for pid, process in table.items():
        if process.state != b"Z":
            children.setdefault(process.parent, []).append(pid)
    found, todo = [], [root]
    while todo:
        for child in children.get(todo.pop(), ()):
            found.append(child)
            todo.append(child)
    return found


def _same_process(pid: int, start: str, container_id: str) -> Callable[[], bool]:
    """A check that ``pid`` is still the process that started at ``start``, in the
    container's cgroup (never a host process that took a freed pid)."""

    def check() -> bool:
        try:
            with open(f"/proc/{pid}/stat", "rb") as fh:
                stat = fh.read()
            with open(f"/proc/{pid}/cgroup", "rb") as fh:
                groups = fh.read()
        except OSError:
            return False
        now = stat[stat.rfind(b")") + 2 :].split()[19].decode()
        return now == start and container_id.encode() in groups

    return check


def _exists(pid: int) -> bool:
    return os.path.exists(f"/proc/{pid}")
