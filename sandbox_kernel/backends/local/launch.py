"""How a process of a local sandbox is started: what happens between fork and exec.

Each process of a sandbox (bubblewrap, and the sandbox's holder and network helper)
is started by :class:`Launch`, the ``preexec_fn`` of its ``Popen``, which in the new
child, in this order:

1. joins the sandbox's cgroup (still as this process's user: root may move a process
   anywhere, an ordinary user only within a subtree given to them);
2. as root, enters a mount namespace of its own and puts there, on a small tmpfs at
   :data:`STAGE`, the host folders the sandbox may see (detached mounts the parent
   made with ``open_tree``, the sandbox's own folders idmapped), so that bubblewrap,
   which runs as the sandbox's unprivileged uid, reaches them without any right on
   the folders above them (a root-only state folder, ``/root/.pyenv``). Nothing of it
   is seen by the host: the namespace is private and ends with the process;
3. becomes the sandbox's host user (root: the sandbox's own uid; else unchanged);
4. enters the sandbox's user and network namespaces (its holder's, see
   :mod:`.holder`), so bubblewrap's processes share one network per sandbox;
5. sets resource limits and, for a terminal, its controlling terminal.

It runs in a child of a process that may have threads, so it only makes system calls
on values prepared before the fork: no import, no lock, no Python object that another
thread could have held. A failing step writes one line to the error pipe and raises;
:func:`start` turns that into a :class:`~sandbox_kernel.errors.SandboxFailed` naming it.
"""

from __future__ import annotations

import ctypes
import errno
import fcntl
import os
import resource
import struct
import subprocess
import termios
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from ..base import SandboxFailed
from ..mount_api import (
    AT_EMPTY_PATH,
    AT_FDCWD,
    AT_SYMLINK_NOFOLLOW,
    MOUNT_ATTR_IDMAP,
    MOUNT_ATTR_NODEV,
    MOUNT_ATTR_NOSUID,
    MOUNT_ATTR_RDONLY,
    MOVE_MOUNT_F_EMPTY_PATH,
    OPEN_TREE_CLONE,
    SYS_MOUNT_SETATTR,
    SYS_MOVE_MOUNT,
    SYS_OPEN_TREE,
)

#: Where a root server's spawns see the host folders they hand to bubblewrap (a private
#: tmpfs over an empty folder, in a mount namespace of the spawn's own). Every folder
#: above it must be one the sandbox's uid may pass through: not /run/sandbox-kernel,
#: which may be root's alone.
STAGE = "/run/sandbox-kernel-stage"

_libc = ctypes.CDLL(None, use_errno=True)
_libc.syscall.restype = ctypes.c_long
_syscall = _libc.syscall
_unshare = _libc.unshare
_setns = _libc.setns
_mount = _libc.mount
_get_errno = ctypes.get_errno

_MS_NOSUID = 0x2
_MS_NODEV = 0x4
_MS_REC = 0x4000
_MS_PRIVATE = 1 << 18
CLONE_NEWNS = 0x00020000
CLONE_NEWUSER = 0x10000000
CLONE_NEWNET = 0x40000000


def detached(source: str, idmap_userns: int = -1, read_only: bool = False) -> int:
    """A descriptor of a detached copy of the folder (or file) at ``source``, as a mount
    to attach elsewhere: with ``idmap_userns`` idmapped through that user namespace
    (root's files show as the sandbox user's, its writes land as root's); always
    ``nosuid`` and ``nodev``. Its final component is not followed if it is a link.
    Raises OSError."""
    fd = _syscall(
        SYS_OPEN_TREE,
        AT_FDCWD,
        os.fsencode(source),
        OPEN_TREE_CLONE | os.O_CLOEXEC | AT_SYMLINK_NOFOLLOW,
    )
    if fd < 0:
        err = _get_errno()
        raise OSError(err, f"cannot open {source}: {os.strerror(err)}")
    flags = MOUNT_ATTR_NOSUID | MOUNT_ATTR_NODEV | (MOUNT_ATTR_RDONLY if read_only else 0)
    if idmap_userns >= 0:
        flags |= MOUNT_ATTR_IDMAP
    attr = struct.pack("QQQQ", flags, 0, 0, max(idmap_userns, 0))
    buf = ctypes.create_string_buffer(attr, len(attr))
    if _syscall(SYS_MOUNT_SETATTR, fd, b"", AT_EMPTY_PATH, buf, len(attr)) < 0:
        err = _get_errno()
        os.close(fd)
        raise OSError(err, f"cannot present {source} to the sandbox: {os.strerror(err)}")
    return fd


@dataclass
class Launch:
    """The steps between fork and exec of one process of a sandbox (see the module)."""

    cgroup_files: Sequence[str] = ()  # cgroup.procs files to join
    staged: Sequence[
        tuple[int, str, bool]
    ] = ()  # (detached mount fd, name under STAGE, is a folder)
    become: tuple[int, int] | None = None  # (uid, gid) to run as; None: stay
    namespaces: Sequence[tuple[int, int]] = ()  # (namespace fd, CLONE_NEW* type) to enter
    limits: Sequence[tuple[int, int]] = ()  # (RLIMIT_*, value)
    terminal: bool = False  # stdin is a new terminal: make it the controlling one
    _fds: list[int] = field(default_factory=list)  # opened here for the child; closed by done()
    _err: tuple[int, int] = (-1, -1)

    def prepare(self) -> None:
        """Open what the child needs (before the fork)."""
        for path in self.cgroup_files:
            self._fds.append(os.open(path, os.O_WRONLY | os.O_CLOEXEC))
        self._err = os.pipe2(os.O_CLOEXEC)
        # Encoded now: the child must not allocate more than it has to.
        self._targets = [
            (fd, os.fsencode(f"{STAGE}/{name}"), folder) for fd, name, folder in self.staged
        ]
        self._stage = os.fsencode(STAGE)

    def _fail(self, what: str, err: int) -> None:
        os.write(self._err[1], f"{what}: {os.strerror(err)}".encode())
        raise OSError(err, what)

    def __call__(self) -> None:  # in the child: system calls only
        for fd in self._fds:
            try:
                os.write(fd, b"0")
            except OSError as exc:
                self._fail("cannot join the sandbox's cgroup", exc.errno or errno.EPERM)
        if self._targets:
            if _unshare(CLONE_NEWNS) != 0:
                self._fail("cannot make a mount namespace", _get_errno())
            if _mount(None, b"/", None, _MS_REC | _MS_PRIVATE, None) != 0:
                self._fail("cannot make the mounts private", _get_errno())
            if (
                _mount(
                    b"tmpfs", self._stage, b"tmpfs", _MS_NOSUID | _MS_NODEV, b"mode=0755,size=64k"
                )
                != 0
            ):
                self._fail(f"cannot mount a tmpfs on {STAGE}", _get_errno())
            for fd, target, folder in self._targets:
                try:
                    if folder:
                        os.mkdir(target, 0o755)
                    else:
                        os.close(os.open(target, os.O_CREAT | os.O_WRONLY | os.O_CLOEXEC, 0o644))
                except OSError as exc:
                    self._fail("cannot prepare the sandbox's view", exc.errno or errno.EIO)
                if _syscall(SYS_MOVE_MOUNT, fd, b"", AT_FDCWD, target, MOVE_MOUNT_F_EMPTY_PATH) < 0:
                    self._fail("cannot attach a folder of the sandbox", _get_errno())
        if self.become is not None:
            uid, gid = self.become
            try:
                os.setgroups([])
                os.setresgid(gid, gid, gid)
                os.setresuid(uid, uid, uid)
            except OSError as exc:
                self._fail(f"cannot become uid {uid}", exc.errno or errno.EPERM)
        for fd, kind in self.namespaces:
            if _setns(fd, kind) != 0:
                self._fail("cannot enter the sandbox's namespaces", _get_errno())
        for which, value in self.limits:
            try:
                resource.setrlimit(which, (value, value))
            except (OSError, ValueError):
                pass  # a hard limit below ours already bounds it
        if self.terminal:  # new session (start_new_session): stdin, a new pty, becomes its tty
            fcntl.ioctl(0, termios.TIOCSCTTY, 0)

    def done(self, failed: bool = False) -> str:
        """Close what :meth:`prepare` opened; with ``failed``, what the child said went
        wrong (it wrote that before it gave up)."""
        for fd in self._fds:
            os.close(fd)
        self._fds.clear()
        said = b""
        if self._err[0] >= 0:
            os.close(self._err[1])
            try:
                if failed:
                    said = os.read(self._err[0], 4096)
            finally:
                os.close(self._err[0])
            self._err = (-1, -1)
        return said.decode(errors="replace")


def start(argv: list[str], launch: Launch, what: str, **popen: Any) -> subprocess.Popen[bytes]:
    """``Popen(argv)`` with ``launch`` between fork and exec; SandboxFailed naming the
    step that failed (or why the program could not start)."""
    launch.prepare()
    try:
        proc = subprocess.Popen(argv, preexec_fn=launch, **popen)
    except (OSError, subprocess.SubprocessError) as exc:
        said = launch.done(failed=True)
        raise SandboxFailed(f"cannot start {what}: {said or exc}") from None
    launch.done()
    return proc


def pass_fds(*groups: Sequence[int]) -> tuple[int, ...]:
    """The descriptors a started program keeps (made inheritable: ``pass_fds`` needs that)."""
    kept = tuple(fd for group in groups for fd in group if fd >= 0)
    for fd in kept:
        os.set_inheritable(fd, True)
    return kept


def close_all(fds: Sequence[int]) -> None:
    for fd in fds:
        if fd >= 0:
            try:
                os.close(fd)
            except OSError:
                pass


def make_stage() -> None:
    """The empty folder each spawn mounts its own tmpfs over (anyone may pass through)."""
    if not os.path.isdir(STAGE):
        os.makedirs(STAGE, exist_ok=True)
    if os.stat(STAGE).st_mode & 0o7777 != 0o755:
        os.chmod(STAGE, 0o755)
