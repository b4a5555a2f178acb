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
import os
import stat
import subprocess
import sys
from typing import Any

from ...host_python import python_module

_SYS_OPEN_TREE = 428
_SYS_MOVE_MOUNT = 429
_SYS_MOUNT_SETATTR = 442
_OPEN_TREE_CLONE = 1
_OPEN_TREE_CLOEXEC = os.O_CLOEXEC
_AT_EMPTY_PATH = 0x1000
_MOVE_MOUNT_F_EMPTY_PATH = 0x4
_MOVE_MOUNT_T_EMPTY_PATH = 0x40
_MOUNT_ATTR_RDONLY = 0x1
_CLONE_NEWNS = 0x00020000
HELPER_TIMEOUT = 30.0


def protect_writable(attrs: dict[str, Any], patterns: list[str]) -> list[str]:
    """Mount the protected paths (``patterns``) of the started container's writable host
    folders (``attrs``: its inspect) in its namespace; what could not be, in lines."""
    # Imported here: the helper process (main) runs this module and needs none of them.
    from ...folders import protect
    from ..base import LABEL_WORK_FOLDER, LABEL_WORK_MODE, volumes_of

    labels = (attrs.get("Config") or {}).get("Labels") or {}
    folders: list[tuple[str, str]] = []  # (host folder, where the sandbox sees it)
    work = labels.get(LABEL_WORK_FOLDER, "")
    if work and labels.get(LABEL_WORK_MODE) != "ro":
        folders.append((work, work))
    folders += [(v.source, v.target) for v in volumes_of(labels) if v.writable and v.on_host]
    destinations = [str(m.get("Destination", "")) for m in attrs.get("Mounts") or []]
    pid = int((attrs.get("State") or {}).get("Pid") or 0)
    said: list[str] = []
    for folder, inside in folders:
        # Folders mounted over parts of it (the work folder's hidden ones) are not walked.
        hidden = [
            folder + d[len(inside) :]
            for d in destinations
            if d.startswith(inside.rstrip("/") + "/")
        ]
        found = protect(folder, patterns, hidden)
        masks = [(inside + m.path[len(folder) :], m.how) for m in found.masks]
        skipped = apply(pid, masks) if pid else []
        if not found.complete:
            said.append(f"protected paths of {inside}: {found.why}; deeper ones stay writable")
        said += [f"a protected path was not mounted: {line}" for line in skipped[:5]]
    return said


def apply(pid: int, masks: list[tuple[str, str]]) -> list[str]:
    """Mount ``masks`` ((path, "pin" | "read-only"), outer first) in the mount namespace
    of process ``pid`` (the container's init); the paths that could not be, and why."""
    if not masks:
        return []
    command = python_module(__name__, str(pid), json.dumps(masks))
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
                _SYS_OPEN_TREE, target, b"", _OPEN_TREE_CLONE | _OPEN_TREE_CLOEXEC | _AT_EMPTY_PATH
            ),
            "open_tree",
        )
        if read_only:
            attr = (ctypes.c_uint64 * 4)(_MOUNT_ATTR_RDONLY, 0, 0, 0)
            _check(
                libc.syscall(_SYS_MOUNT_SETATTR, tree, b"", _AT_EMPTY_PATH, attr, 32),
                "mount_setattr",
            )
        _check(
            libc.syscall(
                _SYS_MOVE_MOUNT,
                tree,
                b"",
                target,
                b"",
                _MOVE_MOUNT_F_EMPTY_PATH | _MOVE_MOUNT_T_EMPTY_PATH,
            ),
            "move_mount",
        )
    finally:
        if tree >= 0:
            os.close(tree)
        os.close(target)


def main() -> None:
    """``PID MASKS_JSON``: enter PID's mount namespace and mount each mask; print the
    paths skipped (gone, or no longer a plain folder or file), as JSON."""
    pid, masks = int(sys.argv[1]), json.loads(sys.argv[2])
    libc = _libc()
    ns = os.open(f"/proc/{pid}/ns/mnt", os.O_RDONLY | os.O_CLOEXEC)
    _check(libc.setns(ns, _CLONE_NEWNS), "setns")
    os.close(ns)
    os.chdir("/")
    skipped = []
    for path, how in masks:
        try:
            _mount_onto_itself(libc, path, read_only=how == "read-only")
        except OSError as exc:
            skipped.append(f"{path}: {exc.strerror or exc}")
    print(json.dumps(skipped))


if __name__ == "__main__":
    main()
