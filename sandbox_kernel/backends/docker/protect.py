"""Protected paths of the host folders a sandbox writes (its work folder, the writable
mapped folders), mounted inside a container's own mount namespace.

What host tools run or trust in a folder the sandbox writes (``protected_paths``: git's
config and hooks, shell and editor settings) is made read-only inside the sandbox, and
every folder on the way to it is *pinned* (mounted onto itself), so none of them can be
renamed, removed or swapped for another: a mount point is busy. A root server does it
at every start of the container, before any process of the user's runs there, found
afresh (:func:`sandbox_kernel.folders.protect`), and only in the container's namespace:
the host user's own view of the folder never changes. A server that is not root cannot
enter another namespace; it gets the same mounts from the engine when the container is
made (see mounts.py).

The mounts are made by a short helper process of this host (:func:`main`: it must be
single-threaded to enter a namespace) that walks each path one name at a time beneath
``/`` with ``O_PATH | O_NOFOLLOW`` and mounts by descriptor (``open_tree`` and
``move_mount``), so nothing the sandbox renamed meanwhile can send a mount elsewhere:
a path that is no longer a plain folder or file is skipped.
"""

from __future__ import annotations

import ctypes
import errno
import json
import logging
import os
import stat
import subprocess
import sys
from typing import Any

from ...host_python import python_module
from .. import lsm_guard
from ..mount_api import (
    AT_EMPTY_PATH,
    MOUNT_ATTR_RDONLY,
    MOVE_MOUNT_F_EMPTY_PATH,
    MOVE_MOUNT_T_EMPTY_PATH,
    OPEN_TREE_CLOEXEC,
    OPEN_TREE_CLONE,
    SYS_MOUNT_SETATTR,
    SYS_MOVE_MOUNT,
    SYS_OPEN_TREE,
)

_CLONE_NEWNS = 0x00020000
HELPER_TIMEOUT = 30.0
log = logging.getLogger("sandbox_kernel")


def writable_folders(attrs: dict[str, Any]) -> list[tuple[str, str]]:
    """The host folders a container (``attrs``: its inspect) writes: (host folder, where
    the sandbox sees it), its work folder first."""
    from ..base import LABEL_WORK_FOLDER, LABEL_WORK_MODE, volumes_of

    labels = (attrs.get("Config") or {}).get("Labels") or {}
    folders: list[tuple[str, str]] = []
    work = labels.get(LABEL_WORK_FOLDER, "")
    if work and labels.get(LABEL_WORK_MODE) != "ro":
        folders.append((work, work))
    return folders + [(v.source, v.target) for v in volumes_of(labels) if v.writable and v.on_host]


def protect_writable(attrs: dict[str, Any], patterns: list[str], guard: str = "") -> list[str]:
    """Mount the protected paths (``patterns``) of the started container's writable host
    folders (``attrs``: its inspect) in its namespace and, with ``guard`` (an
    installation whose kernel guard is loaded), register the mounts it sees those
    folders through with the guard (see lsm_guard.py); what could not be, in lines."""
    # Imported here: the helper process (main) runs this module and needs none of them.
    from ...folders import protect

    folders = writable_folders(attrs)
    destinations = [str(m.get("Destination", "")) for m in attrs.get("Mounts") or []]
    pid = int((attrs.get("State") or {}).get("Pid") or 0)
    said: list[str] = []
    masks: list[tuple[str, str]] = []
    for folder, inside in folders:
        # Folders mounted over parts of it (the work folder's hidden ones) are not walked.
        hidden = [
            folder + d[len(inside) :]
            for d in destinations
            if d.startswith(inside.rstrip("/") + "/")
        ]
        found = protect(folder, patterns, hidden)
        masks += [(inside + m.path[len(folder) :], m.how) for m in found.masks]
        if not found.complete:
            said.append(f"protected paths of {inside}: {found.why}; deeper ones stay writable")
    register = {"installation": guard, "folders": [i for _, i in folders]} if guard else None
    skipped = apply(pid, masks, register) if pid else []
    said += [f"a protected path was not mounted: {line}" for line in skipped[:5]]
    return said


_SAID: set[str] = set()  # what this process has logged about the guard


def protect_started(
    attrs: dict[str, Any], settings: Any, local_engine: bool, progress: Any = None
) -> list[str]:
    """At each start of a container (``attrs``: its inspect) with writable host folders:
    mount their protected paths in its namespace and register its mounts with the
    kernel's guard (lsm_guard.py) -- a root server on a local engine with runc, whose
    namespaces it may enter (other servers got the mounts when the container was made,
    see mounts.py). Where the guard does not hold, ``progress`` (the sandbox's log)
    says why, the server log once; what else could not be done, in lines."""
    patterns = list(settings.protected_paths)
    if not patterns or not writable_folders(attrs):
        return []
    runtime = (attrs.get("HostConfig") or {}).get("Runtime") or "runc"
    enter = os.geteuid() == 0 and local_engine and runtime == "runc"
    if os.geteuid() != 0:
        why = "the server does not run as root (loading the guard needs root)"
    elif not local_engine:
        why = "the engine is not on this machine"
    elif runtime != "runc":
        why = f"the sandbox runs under {runtime}, not runc"
    else:
        why = _load_guard(settings.installation, patterns)
    lsm_guard.remember(settings.state_dir, why)
    if why:
        if why not in _SAID:
            _SAID.add(why)
            log.warning("protected names made after a sandbox starts are not refused: %s", why)
        if progress is not None:
            progress(f"protected names made after this start are not refused by the kernel: {why}")
    if not enter:
        return []
    return protect_writable(attrs, patterns, "" if why else settings.installation)


def _load_guard(installation: str, patterns: list[str]) -> str:
    """Load (or find) the installation's guard; why it does not hold ("" when it does)."""
    try:
        lsm_guard.ensure(installation, patterns)
    except lsm_guard.GuardUnavailable as exc:
        return str(exc)
    except OSError as exc:
        return f"the guard could not be loaded: {exc.strerror or exc}"
    return ""


def apply(pid: int, masks: list[tuple[str, str]], guard: dict[str, Any] | None = None) -> list[str]:
    """Mount ``masks`` ((path, "pin" | "read-only"), outer first) in the mount namespace
    of process ``pid`` (the container's init) and register the mounts of ``guard``'s
    folders there with its installation's guard; what could not be done, and why."""
    if not masks and not (guard and guard["folders"]):
        return []
    command = python_module(__name__, str(pid), json.dumps(masks), json.dumps(guard))
    try:
        done = subprocess.run(
            command,
            capture_output=True,
            stdin=subprocess.DEVNULL,
            timeout=HELPER_TIMEOUT,
            cwd="/",
            check=False,
        )
    except (OSError, subprocess.TimeoutExpired) as exc:
        return [f"the helper did not run: {exc}"]
    if done.returncode != 0:
        return [done.stderr.decode("utf-8", "replace").strip()[-500:] or "the helper failed"]
    try:
        skipped = json.loads(done.stdout or b"[]")
    except ValueError:
        return ["the helper gave no readable answer"]
    return [str(s) for s in skipped] if isinstance(skipped, list) else []


def _register(pid: int, guard: dict[str, Any], mountinfo: int, mounts: int) -> list[str]:
    """In the container's namespace: register the mounts at or beneath the guarded
    folders (read from its mount table, opened before entering it); what failed."""
    chunks = []
    while chunk := os.read(mountinfo, 1 << 16):
        chunks.append(chunk)
    table = b"".join(chunks).decode("utf-8", "replace")
    ids, failed = [], []
    for point in lsm_guard.mount_points(table, list(guard["folders"])):
        try:
            fd = _open_beneath(point)
        except OSError:
            continue  # a mounted file (a hidden one's /dev/null): nothing is made in it
        try:
            ids.append(lsm_guard.mount_id(fd))
        except OSError as exc:
            failed.append(f"{point}: not guarded: {exc.strerror or exc}")
        finally:
            os.close(fd)
    lsm_guard.register(mounts, ids)
    return failed


def _libc() -> ctypes.CDLL:
    libc = ctypes.CDLL(None, use_errno=True)
    libc.syscall.restype = ctypes.c_long
    return libc


def _check(result: int, what: str) -> int:
    if result < 0:
        code = ctypes.get_errno()
        raise OSError(code, f"{what}: {os.strerror(code)}")
    return result


def _open_beneath(path: str) -> int:
    """An O_PATH descriptor of ``path``, walked from ``/`` one name at a time without
    following any link."""
    fd = os.open("/", os.O_PATH | os.O_DIRECTORY | os.O_CLOEXEC)
    try:
        for name in [p for p in path.split("/") if p]:
            nxt = os.open(name, os.O_PATH | os.O_NOFOLLOW | os.O_CLOEXEC, dir_fd=fd)
            os.close(fd)
            fd = nxt
        mode = os.fstat(fd).st_mode
        if not (stat.S_ISDIR(mode) or stat.S_ISREG(mode)):
            raise OSError(errno.ELOOP, "not a plain folder or file")
        return fd
    except BaseException:
        os.close(fd)
        raise


def _mount_onto_itself(libc: ctypes.CDLL, path: str, read_only: bool) -> None:
    target = _open_beneath(path)
    tree = -1
    try:
        tree = _check(
            libc.syscall(
                SYS_OPEN_TREE, target, b"", OPEN_TREE_CLONE | OPEN_TREE_CLOEXEC | AT_EMPTY_PATH
            ),
            "open_tree",
        )
        if read_only:
            attr = (ctypes.c_uint64 * 4)(MOUNT_ATTR_RDONLY, 0, 0, 0)
            _check(
                libc.syscall(SYS_MOUNT_SETATTR, tree, b"", AT_EMPTY_PATH, attr, 32),
                "mount_setattr",
            )
        _check(
            libc.syscall(
                SYS_MOVE_MOUNT,
                tree,
                b"",
                target,
                b"",
                MOVE_MOUNT_F_EMPTY_PATH | MOVE_MOUNT_T_EMPTY_PATH,
            ),
            "move_mount",
        )
    finally:
        if tree >= 0:
            os.close(tree)
        os.close(target)


def main() -> None:
    """``PID MASKS_JSON [GUARD_JSON]``: enter PID's mount namespace and mount each mask,
    then register the guarded folders' mounts; print what was skipped (a path gone, or
    no longer a plain folder or file; a mount not registered), as JSON."""
    pid, masks = int(sys.argv[1]), json.loads(sys.argv[2])
    guard = json.loads(sys.argv[3]) if len(sys.argv) > 3 else None
    libc = _libc()
    skipped = []
    mountinfo = mounts = -1
    if guard:  # both opened here: neither is reachable from inside the container
        mountinfo = os.open(f"/proc/{pid}/mountinfo", os.O_RDONLY | os.O_CLOEXEC)
        try:
            mounts = lsm_guard.open_mounts(guard["installation"])
        except OSError as exc:
            skipped.append(f"the kernel's guard: {exc.strerror or exc}")
    ns = os.open(f"/proc/{pid}/ns/mnt", os.O_RDONLY | os.O_CLOEXEC)
    _check(libc.setns(ns, _CLONE_NEWNS), "setns")
    os.close(ns)
    os.chdir("/")
    for path, how in masks:
        try:
            _mount_onto_itself(libc, path, read_only=how == "read-only")
        except OSError as exc:
            skipped.append(f"{path}: {exc.strerror or exc}")
    if guard and mounts >= 0:
        skipped += _register(pid, guard, mountinfo, mounts)
    print(json.dumps(skipped))


if __name__ == "__main__":
    main()
