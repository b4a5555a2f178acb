"""A container's processes as this host sees them through its cgroup files: live
memory and CPU (no engine round trip, so listing a hundred sandboxes stays fast), and
freeing the engine from a process start that the sandbox froze.

When the engine runs elsewhere (or cgroups are hidden) callers fall back to the
engine's stats call, and nothing is freed from here.
"""

from __future__ import annotations

import errno
import os
import re
import signal
import time
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING

from ...errors import SandboxError
from .errors import engine_errors

if TYPE_CHECKING:
    from .wire import EngineCalls


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


def _stat_fields(stat: bytes) -> list[bytes]:
    """The fields of /proc/<pid>/stat after the command's name, which may hold spaces
    and parentheses: [0] is the state, [1] the parent, [19] the start time."""
    return stat[stat.rfind(b")") + 2 :].split()


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


def unwedge_container(engine: EngineCalls, name: str) -> int:
    """End the runtime's process starts that the processes of container ``name`` froze
    (:func:`end_stuck_starts`), found through the engine's list, which takes no lock of
    the container, unlike inspect, which would hang on it; how many. 0 when the engine
    cannot list (its next call says what is wrong)."""
    try:
        with engine_errors("list sandboxes"):
            summaries = engine.list_containers({"name": [f"^/{re.escape(name)}$"]})
    except SandboxError:
        return 0
    return sum(end_stuck_starts(summary["Id"]) for summary in summaries)
