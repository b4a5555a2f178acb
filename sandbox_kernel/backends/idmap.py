"""Idmapped bind mounts: a host folder that a sandbox uid sees as its own, without chown.

A sandbox runs as a non-root uid (1000, or the image's user). When the server runs as
root, the folders it shares with the sandbox (the workspace) belong to root: without
help the sandbox could not write there, and the old remedy, chowning the folder to uid
1000, hands host files to whatever host account has that uid. An idmapped mount
(Linux >= 5.12, ``mount_setattr(MOUNT_ATTR_IDMAP)``) instead presents the folder so
that files owned by the host user appear owned by the sandbox uid, and files the
sandbox creates land on disk owned by the host user. Nothing on disk changes owner.

The mount is made in the host's mount namespace under the state folder and given to
Docker as the bind source; it is remade before every container start (it does not
survive a reboot) and removed with the sandbox. It is also ``nosuid`` and ``nodev``.
Only root can make one; :func:`supported` says whether it works here.
"""

from __future__ import annotations

import ctypes
import errno
import os
import shutil
import stat
import struct
import subprocess
import sys
from functools import lru_cache
from pathlib import Path

from .mount_api import (
    AT_EMPTY_PATH,
    AT_FDCWD,
    AT_SYMLINK_NOFOLLOW,
    MNT_DETACH,
    MOUNT_ATTR_IDMAP,
    MOUNT_ATTR_NODEV,
    MOUNT_ATTR_NOSUID,
    MOVE_MOUNT_F_EMPTY_PATH,
    OPEN_TREE_CLOEXEC,
    OPEN_TREE_CLONE,
    SYS_MOUNT_SETATTR,
    SYS_MOVE_MOUNT,
    SYS_OPEN_TREE,
)

_CLONE_NEWUSER = 0x10000000


# What holds a user namespace open until the parent has read its descriptor (and
# written the id maps into it): ``cat`` on a pipe (Python without its site where there
# is no cat), made to enter a new namespace between fork and exec. Not a Python
# interpreter importing ctypes to call unshare itself: that cost each start 50 ms.
def _holder() -> list[str]:
    cat = shutil.which("cat", path="/usr/bin:/bin")
    return [cat] if cat else [sys.executable, "-I", "-S", "-c", "import sys; sys.stdin.read()"]


class IdmapError(OSError):
    """An idmapped mount could not be made (unsupported kernel or file system, not root)."""


def _libc() -> ctypes.CDLL:
    return ctypes.CDLL(None, use_errno=True)


def _check(result: int, what: str) -> int:
    if result < 0:
        err = ctypes.get_errno()
        raise IdmapError(err, f"{what}: {os.strerror(err)}")
    return result


def _userns_fd(inside_uid: int, inside_gid: int, host_uid: int, host_gid: int) -> int:
    """A descriptor of a user namespace whose map makes on-disk ``host_uid`` show as
    ``inside_uid`` through an idmapped mount (and files made as ``inside_uid`` land as
    ``host_uid``); the same for gids."""
    unshare = _libc().unshare  # looked up here: the child only calls it

    def enter_new_namespace() -> None:  # in the child, between fork and exec
        if unshare(_CLONE_NEWUSER) != 0:
            raise OSError(errno.EPERM, "unshare")

    try:
        holder = subprocess.Popen(  # returns once cat runs, in its new namespace
            _holder(),
            stdin=subprocess.PIPE,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
            preexec_fn=enter_new_namespace,
        )
    except (OSError, subprocess.SubprocessError) as exc:
        raise IdmapError(errno.EPERM, f"cannot create a user namespace here ({exc})") from None
    try:
        # An idmapped mount maps on-disk ids as ids *inside* the namespace: on-disk
        # host_uid is read as ns id host_uid, which the map turns into inside_uid.
        Path(f"/proc/{holder.pid}/uid_map").write_text(f"{host_uid} {inside_uid} 1\n")
        Path(f"/proc/{holder.pid}/setgroups").write_text("deny\n")
        Path(f"/proc/{holder.pid}/gid_map").write_text(f"{host_gid} {inside_gid} 1\n")
        return os.open(f"/proc/{holder.pid}/ns/user", os.O_RDONLY | os.O_CLOEXEC)
    except OSError as exc:
        raise IdmapError(exc.errno or errno.EPERM, f"cannot set up the id map: {exc}") from None
    finally:
        try:
            holder.stdin.close()  # type: ignore[union-attr]
        except OSError:
            pass
        holder.wait()


def is_mountpoint(path: Path) -> bool:
    """Whether ``path`` is a mount point in this process's mount namespace."""
    target = os.path.realpath(path)
    try:
        with open("/proc/self/mountinfo", encoding="utf-8", errors="surrogateescape") as fh:
            for line in fh:
                fields = line.split(" ")
                if len(fields) > 4 and _unescape(fields[4]) == target:
                    return True
    except OSError:
        pass
    return False


def _unescape(field: str) -> str:
    """mountinfo escapes space, tab, newline and backslash as octal."""
    return (
        field.replace("\\040", " ")
        .replace("\\011", "\t")
        .replace("\\012", "\n")
        .replace("\\134", "\\")
    )


def mount(
    source: Path,
    target: Path,
    inside_uid: int,
    inside_gid: int,
    host_uid: int = 0,
    host_gid: int = 0,
    expect: str = "",
) -> None:
    """Mount ``source`` at ``target`` so that ``host_uid`` files appear owned by ``inside_uid``.

    With ``expect`` ("device:inode", see :func:`identity`), the folder the path leads to
    must be that one: a sandbox's folders are remade by path after a reboot, and code in
    another sandbox whose folder holds this path may have put a link there meanwhile.
    The check is on the opened tree itself, so nothing can change between check and mount.

    Idempotent: an existing mount of ``source`` at ``target`` is kept; a mount of
    another folder there is replaced. Raises :class:`IdmapError`.
    """
    if is_mountpoint(target):
        if _same_folder(target, source):
            return
        unmount(target)  # of another folder: the one at that path was made anew meanwhile
    target.mkdir(parents=True, exist_ok=True)
    libc = _libc()
    ns_fd = _userns_fd(inside_uid, inside_gid, host_uid, host_gid)
    tree_fd = -1
    try:
        # The source is opened without following a final link (it is a host folder we made).
        tree_fd = _check(
            libc.syscall(
                SYS_OPEN_TREE,
                AT_FDCWD,
                os.fsencode(source),
                OPEN_TREE_CLONE | OPEN_TREE_CLOEXEC | AT_SYMLINK_NOFOLLOW,
            ),
            f"open_tree({source})",
        )
        st = os.fstat(tree_fd)
        # A link made where the folder was may get the folder's freed inode number: the
        # type counts as much as the identity.
        if not stat.S_ISDIR(st.st_mode) or (expect and f"{st.st_dev}:{st.st_ino}" != expect):
            if not expect:
                raise IdmapError(errno.ELOOP, f"{source} is a link, not a folder: not presented")
            raise IdmapError(
                errno.EPERM,
                f"{source} is no longer the folder this sandbox was made with (replaced, or "
                "a link): destroy the sandbox (your files stay) and open the notebook again",
            )
        attr = struct.pack(
            "QQQQ", MOUNT_ATTR_IDMAP | MOUNT_ATTR_NOSUID | MOUNT_ATTR_NODEV, 0, 0, ns_fd
        )
        buf = ctypes.create_string_buffer(attr, len(attr))
        _check(
            libc.syscall(SYS_MOUNT_SETATTR, tree_fd, b"", AT_EMPTY_PATH, buf, len(attr)),
            "mount_setattr",
        )
        _check(
            libc.syscall(
                SYS_MOVE_MOUNT,
                tree_fd,
                b"",
                AT_FDCWD,
                os.fsencode(target),
                MOVE_MOUNT_F_EMPTY_PATH,
            ),
            f"move_mount({target})",
        )
    finally:
        os.close(ns_fd)
        if tree_fd >= 0:
            os.close(tree_fd)


def _same_folder(mounted: Path, source: Path) -> bool:
    """Whether the mount at ``mounted`` shows the folder at ``source`` (not a link)."""
    try:
        there, here = os.stat(mounted), os.lstat(source)
    except OSError:
        return False
    return (there.st_dev, there.st_ino) == (here.st_dev, here.st_ino)


def identity(path: Path) -> str:
    """ "device:inode" of the folder at ``path`` (an idmapped mount keeps its source's)."""
    st = os.stat(path)
    return f"{st.st_dev}:{st.st_ino}"


def mounts_of(source_root: Path) -> list[tuple[str, str]]:
    """(source, mount point) of the idmapped mounts whose source lies under ``source_root``
    (the source as mountinfo gives it: exact for a file system mounted at /; for tests)."""
    root = os.path.realpath(source_root)
    found = []
    try:
        with open("/proc/self/mountinfo", encoding="utf-8", errors="surrogateescape") as fh:
            for line in fh:
                fields = line.split(" ")
                if len(fields) > 5 and "idmapped" in fields[5]:
                    source = _unescape(fields[3])
                    if source == root or source.startswith(root + "/"):
                        found.append((source, _unescape(fields[4])))
    except OSError:
        pass
    return found


def unmount(target: Path) -> None:
    """Detach the mount at ``target`` (if any) and remove the empty folder."""
    libc = _libc()
    for _ in range(4):  # stacked mounts (made twice in a race) come off one by one
        if not is_mountpoint(target):
            break
        if libc.umount2(os.fsencode(target), MNT_DETACH) != 0:
            break
    try:
        target.rmdir()
    except OSError:
        pass


@lru_cache(maxsize=8)
def supported(probe_dir: str) -> bool:
    """Whether an idmapped mount of a folder in ``probe_dir`` works (root, kernel, file system)."""
    if os.geteuid() != 0 or not sys.platform.startswith("linux"):
        return False
    base = Path(probe_dir)
    src, dst = base / ".idmap-probe-src", base / ".idmap-probe-dst"
    try:
        base.mkdir(parents=True, exist_ok=True)
        src.mkdir(exist_ok=True)
        mount(src, dst, 1000, 1000)
        ok = os.stat(dst).st_uid == 1000
    except OSError:
        ok = False
    finally:
        unmount(dst)
        try:
            src.rmdir()
        except OSError:
            pass
    return ok
