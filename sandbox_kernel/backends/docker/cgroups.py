"""A container's processes as this host sees them through its cgroup files: live
memory and CPU, and ending processes from outside the sandbox.

Reading files costs no engine round trip, so listing a hundred sandboxes stays fast;
when the engine runs elsewhere (or cgroups are hidden) callers fall back to the
engine's stats call, or to a program run inside the sandbox.
"""

from __future__ import annotations

import errno
import fcntl
import os
import re
import signal
import time
from collections.abc import Callable, Iterable, Iterator
from contextlib import contextmanager
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
    read = _proc_files(pid, "stat", "cgroup")
    if read is None:
        return None
    stat, groups = read
    fields = _stat_fields(stat)
    if not (
        STUCK_START in stat[: stat.rfind(b") ") + 2]
        and fields[:1] in ([b"T"], [b"t"])  # the state: stopped
        and container_id.encode() in groups
    ):
        return None
    # A start lasts milliseconds; the reaper's own freeze stops a start under way for
    # about as long. Only one that is still stopped at STUCK_AFTER seconds is stuck.
    try:
        started = int(fields[19]) / os.sysconf("SC_CLK_TCK")
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
    pidfd = _pidfd(pid)
    if pidfd is None:
        return False  # gone (ESRCH), or out of descriptors: nothing sent blind
    try:
        if not still_it():
            return False  # ended, or another process took the pid
        return _send(pidfd, pid, sig)
    except OSError:
        return False
    finally:
        if pidfd >= 0:
            os.close(pidfd)


def _pidfd(pid: int) -> int | None:
    """A pidfd of ``pid``, to check it and then signal that very process; -1 where
    pidfds do not exist (Linux < 5.3, or Python without them: a plain kill after the
    check); None when it cannot be had (gone, or out of descriptors)."""
    try:
        return os.pidfd_open(pid)
    except AttributeError:
        return -1
    except OSError as exc:
        return -1 if exc.errno == errno.ENOSYS else None


def _send(pidfd: int, pid: int, sig: int) -> bool:
    """``sig`` through ``pidfd`` (or to ``pid`` without one, see :func:`_pidfd`)."""
    try:
        if pidfd >= 0:
            signal.pidfd_send_signal(pidfd, sig)
        else:
            os.kill(pid, sig)
        return True
    except OSError:
        return False


def end_process_trees_apart(
    container_id: str, targets: Iterable[tuple[int, str]], lock: Path, within: float = 20.0
) -> bool:
    """:func:`end_process_trees` in a process of its own, in a session of its own: the
    caller may be killed meanwhile (an MCP server its client stops, a kernel killed as
    it starts), and a reaper that dies while the container is frozen would leave it
    frozen, every process start in it hanging. The helper finishes and thaws
    whatever becomes of the caller. Whether it killed the trees (False: do it inside)."""
    import json
    import subprocess

    from ...host_python import python_module

    command = python_module(__name__, container_id, str(lock), json.dumps(list(targets)))
    try:
        done = subprocess.run(
            command,
            start_new_session=True,
            stdin=subprocess.DEVNULL,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
            timeout=within,
            check=False,
        )
    except (OSError, subprocess.SubprocessError):
        return False
    return done.returncode == 0


def end_process_trees(container_id: str, targets: Iterable[tuple[int, str]], lock: Path) -> bool:
    """Kill, from this host, the trees of the container's processes named by
    ``targets`` ((pid inside the sandbox, start time) pairs); whether it did.

    Nothing in the sandbox can hinder it: no program of ours has to start there (a
    cell can take every pid the sandbox may have, and stop or continue any process of
    its user, a killer of ours too). While a target lives, the container's cgroup is
    frozen, so the one listing of its processes is of an instant: no pid hopper forks
    past it, no colluding process continues what was stopped, and every tree is whole
    when its processes are sent SIGKILL (they die as the cgroup thaws, before they
    run again). Zombies stay in the trees (a process whose main thread exited shows as
    one and may still fork). One reaper of this installation at a time (``lock``), so
    none thaws what another froze.

    False when this host does not show the container's processes, may not use the
    lock or freeze the container (a server that is not root), or finds it frozen
    already (the engine's pause), all before anything is killed; or when a target
    outlived the kill. The caller then ends them from inside instead.
    """
    wanted = {(int(pid), str(start)) for pid, start in targets}
    mark = lock.with_name(lock.name + ".frozen")  # which container a reaper holds frozen
    table = _container_processes(container_id)
    if table is None:
        return False
    if not any((p.inner_pid, p.start) in wanted for p in table.values()) and not mark.exists():
        return True  # all ended by themselves: nothing to freeze for
    roots: dict[int, str] = {}
    try:
        with _held(lock) as held:
            if not held:
                return False
            with _frozen(container_id, mark) as frozen:
                if not frozen:
                    return False
                table = _container_processes(container_id) or {}
                roots = {
                    pid: p.start for pid, p in table.items() if (p.inner_pid, p.start) in wanted
                }
                _kill_listed(
                    container_id,
                    {
                        pid: table[pid].start
                        for root in roots
                        for pid in (root, *_descendants(root, table))
                    },
                )
    except OSError:  # the lock or the freezer is not ours to use
        return False
    return _ended(roots, within=1.0)


def _kill_listed(container_id: str, doomed: dict[int, str]) -> None:
    """SIGKILL each process of ``doomed`` ({host pid: start time}) that still is that
    process of the container: its pidfd is opened first, then the pid must be in the
    container's list and have that start time. (Membership comes from the list, not
    from /proc/<pid>/cgroup, which cgroup v1 shows as "/" for a process whose main
    thread exited.) Without pidfds, a plain kill after the same checks."""
    items = list(doomed.items())
    for first in range(0, len(items), 256):  # a bounded number of descriptors at once
        chunk = items[first : first + 256]
        fds: dict[int, int] = {}
        try:
            for pid, _ in chunk:
                fd = _pidfd(pid)
                if fd is not None:
                    fds[pid] = fd
            listed = set(container_pids(container_id) or [])
            for pid, start in chunk:
                if pid in fds and pid in listed and _start_of(pid) == start:
                    _send(fds[pid], pid, signal.SIGKILL)
        finally:
            for fd in fds.values():
                if fd >= 0:
                    os.close(fd)


def _ended(processes: dict[int, str], within: float) -> bool:
    """Whether none of {host pid: start time} exists any more, waiting up to ``within``."""
    deadline = time.monotonic() + within
    while any(_start_of(pid) == start for pid, start in processes.items()):
        if time.monotonic() > deadline:
            return False
        time.sleep(0.01)
    return True


def _start_of(pid: int) -> str:
    """The start time of process ``pid`` (field 22 of its stat), "" when it is gone."""
    read = _proc_files(pid, "stat")
    fields = _stat_fields(read[0]) if read is not None else []
    return fields[19].decode() if len(fields) > 19 else ""


LOCK_WAIT = 10.0  # seconds a reaper waits for another before it leaves it to the sandbox


@contextmanager
def _held(lock: Path) -> Iterator[bool]:
    """An exclusive lock on the file ``lock`` (made if missing) while inside: True, or
    False when another held it for LOCK_WAIT seconds (a stopped `gc`, say)."""
    lock.parent.mkdir(parents=True, exist_ok=True, mode=0o700)
    fd = os.open(lock, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC | os.O_NOFOLLOW, 0o600)
    try:
        deadline = time.monotonic() + LOCK_WAIT
        while True:
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
                break
            except BlockingIOError:
                if time.monotonic() > deadline:
                    yield False
                    return
                time.sleep(0.005)
        yield True
    finally:
        os.close(fd)


FREEZE_WAIT = 1.0  # seconds a freeze may take before the host gives up on it


@contextmanager
def _frozen(container_id: str, mark: Path) -> Iterator[bool]:
    """The container's cgroup frozen while inside (True), thawed after; False, and
    nothing touched, when there is no freezer this process may write, the cgroup was
    frozen already (not ours to thaw), or it did not freeze within FREEZE_WAIT.

    ``mark`` names the container while it is frozen: a reaper killed in those
    milliseconds would leave it frozen for good, so the next one (holding the same
    lock) thaws what the mark names first, and freezes nothing while it cannot."""
    freezer = _freezer(container_id)
    if not _thaw_left_frozen(mark) or freezer is None or not freezer.thawed():
        yield False
        return
    try:
        _write_mark(mark, container_id)
        freezer.set(frozen=True)
    except OSError:
        mark.unlink(missing_ok=True)
        yield False
        return
    try:
        deadline = time.monotonic() + FREEZE_WAIT
        while not freezer.frozen() and time.monotonic() < deadline:
            time.sleep(0.001)
        yield freezer.frozen()
    finally:
        if _thaw(freezer):
            mark.unlink(missing_ok=True)


def _thaw_left_frozen(mark: Path) -> bool:
    """Thaw the container a reaper that died left frozen (see :func:`_frozen`); False
    while it cannot (the mark stays for the next reaper)."""
    try:
        left = mark.read_text().strip()
    except FileNotFoundError:
        return True
    except OSError:
        return False
    freezer = _freezer(left) if re.fullmatch(r"[0-9a-f]{64}", left) else None
    if freezer is not None and not _thaw(freezer):
        return False
    mark.unlink(missing_ok=True)
    return True


def _thaw(freezer: _Freezer) -> bool:
    """Thaw; whether it is thawed now (or gone with its container)."""
    try:
        freezer.set(frozen=False)
    except FileNotFoundError:
        return True  # the container was removed meanwhile
    except OSError:
        return False
    return True


def _write_mark(mark: Path, text: str) -> None:
    fd = os.open(mark, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_CLOEXEC | os.O_NOFOLLOW, 0o600)
    try:
        os.write(fd, text.encode())
    finally:
        os.close(fd)


def wait_thawed(container_id: str, within: float = 3.0) -> None:
    """Wait while a reaper of ours holds the container frozen (milliseconds, up to
    FREEZE_WAIT): the runtime refuses to start a process in a frozen container."""
    freezer = _freezer(container_id)
    deadline = time.monotonic() + within
    while freezer is not None and not freezer.thawed() and time.monotonic() < deadline:
        time.sleep(0.005)


class _Freezer:
    """A cgroup's freezer: ``freezer.state`` (v1) or ``cgroup.freeze`` (v2)."""

    def __init__(self, folder: Path) -> None:
        self.folder = folder
        self.v1 = (folder / "freezer.state").exists()

    def _read(self, name: str) -> str:
        try:
            return (self.folder / name).read_text()
        except OSError:
            return ""

    def thawed(self) -> bool:
        if self.v1:
            return self._read("freezer.state").strip() == "THAWED"
        return self._read("cgroup.freeze").strip() == "0"

    def frozen(self) -> bool:
        if self.v1:
            return self._read("freezer.state").strip() == "FROZEN"
        return "frozen 1" in self._read("cgroup.events").splitlines()

    def set(self, frozen: bool) -> None:
        if self.v1:
            (self.folder / "freezer.state").write_text("FROZEN" if frozen else "THAWED")
        else:
            (self.folder / "cgroup.freeze").write_text("1" if frozen else "0")


def _freezer(container_id: str) -> _Freezer | None:
    """The container's freezer on this host, if it has one there."""
    for folder in _cgroup_dirs(container_id, "freezer"):
        if (folder / "freezer.state").exists() or (folder / "cgroup.freeze").exists():
            return _Freezer(folder)
    return None


class _Process:
    """One process of a container as this host's /proc shows it."""

    __slots__ = ("inner_pid", "parent", "start")

    def __init__(self, inner_pid: int, parent: int, start: str) -> None:
        self.inner_pid = inner_pid
        self.parent = parent
        self.start = start


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
    read = _proc_files(pid, "stat", "status")
    if read is None:
        return None
    fields, pids = _stat_fields(read[0]), _namespace_pids(read[1])
    try:
        return _Process(int(pids[-1]) if pids else 0, int(fields[1]), fields[19].decode())
    except (ValueError, IndexError):
        return None


def process_identity(host_pid: int) -> tuple[int, str] | None:
    """(pid inside its own pid namespace, start time) of a process of this host: how a
    sandbox's process is known across pid reuse. None when it is gone, or when it lives
    in this host's pid namespace only: then it is no sandbox's (a remote engine's pid
    that happens to exist here too)."""
    read = _proc_files(host_pid, "stat", "status") if host_pid > 0 else None
    if read is None:
        return None
    fields, pids = _stat_fields(read[0]), _namespace_pids(read[1])
    if len(pids) < 2 or len(fields) <= 19:
        return None
    return int(pids[-1]), fields[19].decode()


def _stat_fields(stat: bytes) -> list[bytes]:
    """The fields of /proc/<pid>/stat after the command's name, which may hold spaces
    and parentheses: [0] is the state, [1] the parent, [19] the start time."""
    return stat[stat.rfind(b")") + 2 :].split()


def _namespace_pids(status: bytes) -> list[bytes]:
    """The process's pid in each pid namespace it is in, this host's first (``NSpid``)."""
    return next(
        (line.split()[1:] for line in status.splitlines() if line.startswith(b"NSpid:")), []
    )


def _descendants(root: int, table: dict[int, _Process]) -> list[int]:
    """Host pids of every descendant of ``root`` in ``table``, zombies too (a process
    whose main thread exited shows as one while its other threads may fork)."""
    children: dict[int, list[int]] = {}
    for pid, process in table.items():
        children.setdefault(process.parent, []).append(pid)
    found, seen, todo = [], {root}, [root]
    while todo:
        for child in children.get(todo.pop(), ()):
            if child not in seen:  # a listing across a pid's reuse could make a loop
                seen.add(child)
                found.append(child)
                todo.append(child)
    return found


def _proc_files(pid: int, *names: str) -> list[bytes] | None:
    """The contents of /proc/<pid>/<name> for each name; None once one cannot be read
    (the process is gone)."""
    found = []
    for name in names:
        try:
            with open(f"/proc/{pid}/{name}", "rb") as fh:
                found.append(fh.read())
        except OSError:
            return None
    return found


if __name__ == "__main__":  # the helper of end_process_trees_apart
    import json
    import sys

    pairs = [(int(pid), str(start)) for pid, start in json.loads(sys.argv[3])]
    sys.exit(0 if end_process_trees(sys.argv[1], pairs, Path(sys.argv[2])) else 1)
