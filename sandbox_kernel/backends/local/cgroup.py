"""A cgroup per local sandbox: its memory, processes and CPU bounded as a container's are.

Where the host lets this process make cgroups, each sandbox gets one, named by the
installation and the sandbox id, holding every process of the sandbox (its processes
join it before they run anything). Both layouts are handled:

* cgroup v2 (one hierarchy, most current distributions): ``memory.max`` (and no swap),
  ``pids.max``, ``cpu.max``. As root under ``<mount>/sandbox-kernel``; as an ordinary
  user under the highest cgroup delegated to them (one they own above their own, as
  systemd's ``user@UID.service`` is), since v2 moves a process only within a subtree
  its writer owns.
* cgroup v1 (a hierarchy per controller, as on hosts still on the hybrid layout):
  ``memory.limit_in_bytes`` (and ``memsw``), ``pids.max``, ``cpu.cfs_quota_us``, plus
  ``cpuacct`` for usage. As root under ``<controller>/sandbox-kernel``; as an ordinary
  user under their own cgroup of each controller when an administrator gave it to them.

Everywhere else :func:`place` says why not, and the backend falls back to resource
limits per process (see :mod:`.launch`) and says so in every listing.
"""

from __future__ import annotations

import contextlib
import os
import signal
import time
from dataclasses import dataclass, field
from functools import lru_cache
from pathlib import Path

ROOT_PARENT = "sandbox-kernel"
V1_CONTROLLERS = ("memory", "pids", "cpu", "cpuacct")
NEEDED = ("memory", "pids")  # without both, a cgroup bounds nothing that matters here
CPU_PERIOD = 100_000  # microseconds


def _read(path: Path) -> str:
    try:
        return path.read_text()
    except OSError:
        return ""


def _write(path: Path, value: str) -> None:
    fd = os.open(path, os.O_WRONLY | os.O_CLOEXEC)
    try:
        os.write(fd, value.encode())
    finally:
        os.close(fd)


@dataclass(frozen=True)
class Place:
    """Where this process makes sandbox cgroups, or why it cannot (``reason``)."""

    version: int = 0  # 1 or 2; 0: no cgroups here
    parents: dict[str, Path] = field(default_factory=dict)  # v1: per controller; v2: {"": base}
    controllers: tuple[str, ...] = ()  # those that hold: memory, pids, cpu
    reason: str = ""  # why there are none, or why cpu does not hold

    def __bool__(self) -> bool:
        return self.version != 0

    def describe(self) -> str:
        """One line for listings and ``doctor``: which limits hold, and how."""
        if not self:
            return f"no cgroup ({self.reason})"
        where = ", ".join(sorted({str(p) for p in self.parents.values()}))
        text = f"cgroup v{self.version} ({'/'.join(self.controllers)}) under {where}"
        return f"{text}; {self.reason}" if self.reason else text

    # -- one sandbox's cgroup --------------------------------------------------------------
    def folders(self, name: str) -> dict[str, Path]:
        """The sandbox's cgroup folder in each hierarchy ({"": folder} on v2)."""
        return {ctrl: parent / name for ctrl, parent in self.parents.items()}

    def make(self, name: str, memory: int, pids: int, cpus: float) -> list[Path]:
        """Make (or keep) cgroup ``name`` with these limits; the ``cgroup.procs`` files a
        process writes to join it. Raises OSError when the host refuses."""
        if self.version == 2:  # the installation's folder goes when its last sandbox does
            base = self.parents[""]
            _hand_down(base.parent.parent, [base.parent, base], self.controllers)
        for folder in self.folders(name).values():
            folder.mkdir(parents=True, exist_ok=True)
        self.limit(name, memory, pids, cpus)
        return [folder / "cgroup.procs" for folder in self.folders(name).values()]

    def limit(self, name: str, memory: int, pids: int, cpus: float) -> None:
        """Give cgroup ``name`` these limits (at creation, and to resize in place)."""
        folders = self.folders(name)
        quota = int(cpus * CPU_PERIOD) if cpus > 0 else 0
        if self.version == 2:
            folder = folders[""]
            _write(folder / "memory.max", str(memory) if memory else "max")
            if (folder / "memory.swap.max").exists():
                _write(folder / "memory.swap.max", "0")
            _write(folder / "pids.max", str(pids) if pids else "max")
            if "cpu" in self.controllers:
                _write(folder / "cpu.max", f"{quota or 'max'} {CPU_PERIOD}")
            return
        memory_folder = folders["memory"]
        limit = memory_folder / "memory.limit_in_bytes"
        swap = memory_folder / "memory.memsw.limit_in_bytes"  # memory and swap together
        current = int(_read(limit).strip() or 0)
        # memsw may never be below the memory limit: raise it first, lower it last.
        order = [swap, limit] if not memory or memory > current else [limit, swap]
        for path in order:
            if path.exists():
                _write(path, str(memory) if memory else "-1")
        _write(folders["pids"] / "pids.max", str(pids) if pids else "max")
        if "cpu" in self.controllers:
            _write(folders["cpu"] / "cpu.cfs_period_us", str(CPU_PERIOD))
            _write(folders["cpu"] / "cpu.cfs_quota_us", str(quota or -1))

    def pids(self, name: str) -> list[int]:
        """Every process in cgroup ``name`` (none when it does not exist)."""
        folder = self.folders(name).get("pids" if self.version == 1 else "")
        if folder is None:
            return []
        return [int(p) for p in _read(folder / "cgroup.procs").split() if p.isdigit()]

    def kill(self, name: str, seconds: float = 10.0) -> bool:
        """SIGKILL every process of cgroup ``name`` until none is left; whether it emptied.

        No new process can start in it meanwhile: its process limit is set to 0 first
        (a killed process cannot fork either), so a fork loop cannot outrun the kill."""
        folders = self.folders(name)
        pids_folder = folders.get("pids" if self.version == 1 else "")
        if pids_folder is None or not pids_folder.is_dir():
            return True
        with contextlib.suppress(OSError):
            _write(pids_folder / "pids.max", "0")
        kill_file = pids_folder / "cgroup.kill"  # v2, Linux >= 5.14: the kernel does it all
        if self.version == 2 and kill_file.exists():
            with contextlib.suppress(OSError):
                _write(kill_file, "1")
        deadline = time.monotonic() + seconds
        while True:
            left = self.pids(name)
            if not left:
                return True
            if time.monotonic() > deadline:
                return False
            for pid in left:
                with contextlib.suppress(OSError):
                    os.kill(pid, signal.SIGKILL)
            time.sleep(0.02)

    def remove(self, name: str) -> None:
        """End every process of cgroup ``name`` and remove it."""
        self.kill(name)
        for folder in self.folders(name).values():
            for _ in range(50):  # the last processes may still be leaving
                try:
                    folder.rmdir()
                    break
                except FileNotFoundError:
                    break
                except OSError:
                    time.sleep(0.02)
            with contextlib.suppress(OSError):  # the installation's folder, once empty
                folder.parent.rmdir()

    def usage(self, name: str) -> dict[str, float]:
        """Memory in use (less the file cache it can give back) and CPU seconds so far."""
        folders = self.folders(name)
        found: dict[str, float] = {}
        if self.version == 2:
            folder = folders[""]
            current, inactive = _read(folder / "memory.current"), _stat(folder, "inactive_file")
            usec = _stat(folder / "cpu.stat", "usage_usec", file=True)
            if current.strip().isdigit():
                found["memory"] = max(0, int(current) - inactive)
            if usec:
                found["cpu_seconds"] = usec * 1e-6
            return found
        current = _read(folders["memory"] / "memory.usage_in_bytes")
        if current.strip().isdigit():
            found["memory"] = max(0, int(current) - _stat(folders["memory"], "total_inactive_file"))
        nanoseconds = _read(folders["cpuacct"] / "cpuacct.usage") if "cpuacct" in folders else ""
        if nanoseconds.strip().isdigit():
            found["cpu_seconds"] = int(nanoseconds) * 1e-9
        return found


def _stat(folder: Path, key: str, file: bool = False) -> int:
    """A value of ``memory.stat`` in ``folder`` (or of the stat file ``folder`` itself)."""
    for line in _read(folder if file else folder / "memory.stat").splitlines():
        name, _, value = line.partition(" ")
        if name == key and value.strip().isdigit():
            return int(value)
    return 0


def _mounts() -> list[tuple[str, str, list[str]]]:
    """(mount point, file system type, super options) of every mount, from mountinfo."""
    found = []
    for line in _read(Path("/proc/self/mountinfo")).splitlines():
        left, _, right = line.partition(" - ")
        fields, tail = left.split(), right.split()
        if len(fields) > 4 and len(tail) > 2:
            found.append((fields[4], tail[0], tail[2].split(",")))
    return found


def _own_paths() -> dict[str, str]:
    """This process's cgroup path per v1 controller, and on v2 under ""."""
    found: dict[str, str] = {}
    for line in _read(Path("/proc/self/cgroup")).splitlines():
        parts = line.split(":", 2)
        if len(parts) == 3:
            for ctrl in parts[1].split(",") if parts[1] else [""]:
                found[ctrl] = parts[2]
    return found


def _owned(folder: Path) -> bool:
    try:
        return folder.stat().st_uid == os.geteuid() and os.access(folder, os.W_OK | os.X_OK)
    except OSError:
        return False


@lru_cache(maxsize=4)
def place(installation: str) -> Place:
    """Where this process (its uid) makes the cgroups of ``installation``'s sandboxes.

    Probed once per process: the host's layout does not change under a running server."""
    mounts = _mounts()
    own = _own_paths()
    v2 = next((m for m, kind, _ in mounts if kind == "cgroup2"), "")
    v2_controllers = set(_read(Path(v2, "cgroup.controllers")).split()) if v2 else set()
    v1 = {
        ctrl: mount
        for mount, kind, options in mounts
        if kind == "cgroup"
        for ctrl in options
        if ctrl in V1_CONTROLLERS
    }
    tag = installation[:8]
    if set(NEEDED) <= v2_controllers:
        return _place_v2(Path(v2), own.get("", "/"), v2_controllers, tag)
    if all(ctrl in v1 for ctrl in NEEDED):
        return _place_v1(v1, own, tag)
    return Place(reason="the host has no memory and pids cgroup controllers mounted")


def _place_v1(mounts: dict[str, str], own: dict[str, str], tag: str) -> Place:
    parents: dict[str, Path] = {}
    for ctrl, mount in mounts.items():
        if os.geteuid() == 0:
            base = Path(mount) / ROOT_PARENT
        else:  # an administrator's delegation: our own cgroup of that controller
            mine = Path(mount) / own.get(ctrl, "/").lstrip("/")
            if not _owned(mine):
                continue
            base = mine / ROOT_PARENT
        parent = base / tag
        try:
            parent.mkdir(parents=True, exist_ok=True)
        except OSError:
            continue
        if _owned(parent) and os.access(parent / "cgroup.procs", os.W_OK):
            parents[ctrl] = parent
    missing = [c for c in NEEDED if c not in parents]
    if missing:
        who = "root" if os.geteuid() == 0 else f"uid {os.geteuid()}"
        return Place(
            reason=f"cgroup v1: {who} cannot make cgroups of {'/'.join(missing)} here "
            "(an administrator can give this user a cgroup of each controller and start "
            "the server in it)"
        )
    controllers = [c for c in ("memory", "pids", "cpu") if c in parents]
    reason = "" if "cpu" in parents else "no cpu controller: CPU is not limited"
    return Place(1, parents, tuple(controllers), reason)


def _place_v2(mount: Path, own: str, available: set[str], tag: str) -> Place:
    if os.geteuid() == 0:
        candidates = [mount]
    else:  # a delegated subtree: a folder we own above our own cgroup, highest first
        parts = [p for p in own.split("/") if p]
        candidates = [mount.joinpath(*parts[:n]) for n in range(1, len(parts))]
        candidates = [c for c in candidates if _owned(c)]
    problem = (
        "no cgroup delegated to this user (systemd: run the server in a scope with Delegate=yes)"
    )
    for top in candidates:
        # What this level may hand down (a delegated one may lack cpu).
        here = available if top == mount else set(_read(top / "cgroup.controllers").split())
        wanted = [c for c in ("memory", "pids", "cpu") if c in here]
        if not all(c in wanted for c in NEEDED):
            problem = f"cgroup v2: {top} has no {'/'.join(c for c in NEEDED if c not in wanted)} controller"
            continue
        chain = [top / ROOT_PARENT, top / ROOT_PARENT / tag]
        try:
            _hand_down(top, chain, tuple(wanted))
        except OSError as exc:
            problem = f"cgroup v2: cannot enable {'/'.join(wanted)} under {top} ({exc.strerror})"
            continue
        reason = "" if "cpu" in wanted else "no cpu controller: CPU is not limited"
        return Place(2, {"": chain[-1]}, tuple(wanted), reason)
    return Place(reason=problem)


def _hand_down(top: Path, chain: list[Path], controllers: tuple[str, ...]) -> None:
    """Make the folders of ``chain`` below ``top`` and enable ``controllers`` for the
    children of each level (v2 hands a controller down one level at a time)."""
    for folder in (top, *chain):
        if folder != top:
            folder.mkdir(exist_ok=True)
        enabled = set(_read(folder / "cgroup.subtree_control").split())
        if not set(controllers) <= enabled:
            _write(folder / "cgroup.subtree_control", " ".join(f"+{c}" for c in controllers))
