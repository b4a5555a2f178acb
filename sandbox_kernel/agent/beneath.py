"""Files beneath a folder that other code may rewrite at any moment: the one walk used
on both sides of the boundary.

A folder a sandbox can write (a workspace, a Daytona volume) can change while we work
in it: a folder swapped for a symlink between our check and our use, a link planted
where a temporary file will be, a FIFO that blocks whoever opens it. Resolving a path
once and then using the name again is the race of CVE-2018-15664 (``docker cp``), so
nothing here uses a name twice or follows a link:

* a path is walked one component at a time beneath an open folder descriptor, each
  folder opened ``O_DIRECTORY | O_NOFOLLOW`` relative to the previous one (as runc's
  ``securejoin`` and ``openat2(RESOLVE_BENEATH|RESOLVE_NO_SYMLINKS)`` do), so a link
  anywhere on the way is a refusal, not a detour;
* a file is opened ``O_NOFOLLOW | O_NONBLOCK`` and checked with ``fstat`` on the
  descriptor: FIFOs, sockets and devices are refused and can never block;
* a file is written to an ``O_EXCL`` temporary beside its place, set up through its
  descriptor, renamed with the folder's descriptor and checked by inode before and
  after: a temporary replaced meanwhile is a refusal, never a false success;
* a tree is removed level by level through descriptors, to a bounded depth and in a
  bounded number of passes.

The host uses it on folders it holds (:mod:`sandbox_kernel.safefs`), the in-sandbox
file helper on files the host cannot reach (:mod:`.fs_helper`). What it refuses is a
:class:`Refused`, which each side turns into its own answer: an error with words for a
user on the host, a JSON line from the helper. Standard library only, Python >= 3.8.
"""

from __future__ import annotations

import contextlib
import errno
import os
import stat
from typing import Any, Iterator, Sequence

CHUNK = 1 << 20
MAX_ENTRIES = 10000  # a listing stops here: a folder of millions must not hold a thread
MAX_DEPTH = 256  # folders deep a removal goes (each level holds a descriptor)
REMOVE_ROUNDS = 8  # passes over a folder that keeps filling while it is removed
TEMP_PREFIX = ".sk-upload-"
TEMP_TRIES = 8  # names tried for a temporary before giving up
DIR_FLAGS = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC
READ_FLAGS = os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC | os.O_NOCTTY
TEMP_FLAGS = os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC


class Refused(Exception):
    """Something refused, for each side to report in its own words.

    ``code`` is an errno name (``ENOENT``) or one of ours: ``notfile`` (not a regular
    file), ``target`` (a file's place holds something else), ``folder`` (a delete met a
    folder), ``inway`` and ``intoself`` (a move), ``changed``, ``filling`` and ``deep``
    (a removal), ``shrank`` (a copy's source), ``temporary``, ``interfered`` and
    ``replaced`` (a placement). ``which`` says whether it is about the operation's
    source or destination path (``"src"``, ``"dst"``); ``details`` may hold ``kind``,
    ``shown`` (the path within a tree), ``how`` and ``message`` (the system's words).
    """

    def __init__(self, code: str, which: str = "src", **details: Any) -> None:
        Exception.__init__(self, code)
        self.code = code
        self.which = which
        self.details = details

    def answer(self) -> dict[str, Any]:
        """The refusal as one JSON object: ``{"error": code, "which": ..., details...}``."""
        return dict(self.details, error=self.code, which=self.which)


def refusal(exc: OSError, which: str = "src", **details: Any) -> Refused:
    """The refusal reporting an OSError: its errno's name, its words as ``message``."""
    code = errno.errorcode.get(exc.errno or 0, "EIO")
    return Refused(code, which, message=exc.strerror or str(exc), **details)


def kind(mode: int) -> str:
    """What an item is, from its mode: "file", "directory", "symlink" or "other"."""
    if stat.S_ISLNK(mode):
        return "symlink"
    if stat.S_ISDIR(mode):
        return "directory"
    if stat.S_ISREG(mode):
        return "file"
    return "other"


@contextlib.contextmanager
def held(fd: int) -> Iterator[int]:
    """``fd``, closed when the block ends however it ends."""
    try:
        yield fd
    finally:
        os.close(fd)


def open_at(dir_fd: int, name: str, flags: int, which: str = "src") -> int:
    """``os.open`` of ``name`` beneath ``dir_fd``, an OSError refused about ``which``."""
    try:
        return os.open(name, flags, dir_fd=dir_fd)
    except OSError as exc:
        raise refusal(exc, which) from None


# -- walking ----------------------------------------------------------------------------
def walk(
    start_fd: int,
    parts: Sequence[str],
    which: str = "src",
    create: bool = False,
    owner: tuple[int, int] | None = None,
) -> int:
    """A new descriptor (the caller closes it) of the folder ``parts`` beneath
    ``start_fd``, each component opened without following a link; missing folders
    are made on the way when ``create`` (and handed to ``owner``)."""
    fd = os.dup(start_fd)
    try:
        for name in parts:
            if create:
                make_folder_at(fd, name, which, owner)
            nxt = open_at(fd, name, DIR_FLAGS, which)
            os.close(fd)
            fd = nxt
    except BaseException:
        os.close(fd)
        raise
    return fd


def make_folder_at(
    dir_fd: int,
    name: str,
    which: str = "src",
    owner: tuple[int, int] | None = None,
    exist_ok: bool = True,
) -> None:
    """Make the folder ``name`` beneath ``dir_fd`` (one already there is kept when
    ``exist_ok``, else refused), and hand a new one to ``owner``."""
    try:
        os.mkdir(name, 0o755, dir_fd=dir_fd)
    except FileExistsError as exc:
        if exist_ok:
            return
        raise refusal(exc, which) from None
    except OSError as exc:
        raise refusal(exc, which) from None
    if owner is not None:
        # Through a descriptor: if the name was swapped for a link meanwhile, the open
        # fails instead of handing over the link's target.
        with held(open_at(dir_fd, name, DIR_FLAGS, which)) as fd:
            os.fchown(fd, *owner)


def lstat_at(dir_fd: int, name: str, which: str = "src") -> os.stat_result:
    """lstat of ``name`` beneath ``dir_fd``: a link is described, never followed."""
    try:
        return os.stat(name, dir_fd=dir_fd, follow_symlinks=False)
    except OSError as exc:
        raise refusal(exc, which) from None


def existing(dir_fd: int, name: str, which: str = "src") -> os.stat_result | None:
    """:func:`lstat_at`, or None when nothing is there."""
    try:
        return os.stat(name, dir_fd=dir_fd, follow_symlinks=False)
    except FileNotFoundError:
        return None
    except OSError as exc:
        raise refusal(exc, which) from None


def stat_beneath(root_fd: int, parts: Sequence[str]) -> os.stat_result:
    """lstat of the item ``parts`` beneath ``root_fd`` (the folder itself for no parts)."""
    if not parts:
        return os.fstat(root_fd)
    with held(walk(root_fd, parts[:-1])) as fd:
        return lstat_at(fd, parts[-1])


def scan(dir_fd: int, limit: int = MAX_ENTRIES) -> tuple[list[tuple[str, os.stat_result]], bool]:
    """(name, lstat) of at most ``limit`` items of a folder, and whether it holds more:
    links and special files are described, never opened."""
    items: list[tuple[str, os.stat_result]] = []
    with os.scandir(dir_fd) as found:
        for item in found:
            if len(items) >= limit:
                return items, True
            try:
                items.append((item.name, item.stat(follow_symlinks=False)))
            except OSError:
                continue  # removed while we looked
    return items, False


def open_regular(dir_fd: int, name: str, which: str = "src") -> tuple[int, os.stat_result]:
    """(blocking descriptor, fstat) of the regular file ``name`` beneath ``dir_fd``:
    a link, folder, FIFO, socket or device is refused, and never blocks the open."""
    before = lstat_at(dir_fd, name, which)
    if not stat.S_ISREG(before.st_mode):
        raise Refused("notfile", which, kind=kind(before.st_mode))
    fd = open_at(dir_fd, name, READ_FLAGS, which)
    st = os.fstat(fd)
    if not stat.S_ISREG(st.st_mode):  # swapped between the look and the open
        os.close(fd)
        raise Refused("notfile", which, kind=kind(st.st_mode))
    os.set_blocking(fd, True)
    return fd, st


# -- operations on an item beneath a folder ------------------------------------------
def delete(dir_fd: int, name: str) -> None:
    """Remove a file, link or special file (a link itself, never its target); a folder
    is refused."""
    if stat.S_ISDIR(lstat_at(dir_fd, name).st_mode):
        raise Refused("folder")
    try:
        os.unlink(name, dir_fd=dir_fd)
    except IsADirectoryError:  # swapped for a folder after the look
        raise Refused("folder") from None
    except OSError as exc:
        raise refusal(exc) from None


def remove(dir_fd: int, name: str, shown: str) -> None:
    """Remove a file, link, special file or a whole folder tree; ``shown`` is its path
    in refusals. A folder swapped for a link mid-way stops the removal (``changed``)
    instead of emptying the link's target."""
    is_dir = stat.S_ISDIR(lstat_at(dir_fd, name).st_mode)
    _remove_item(dir_fd, name, is_dir, shown, 0)


def _remove_item(dir_fd: int, name: str, is_dir: bool, shown: str, depth: int) -> None:
    """Remove ``name`` beneath ``dir_fd``: unlink it, or empty it first if it is a folder."""
    try:
        if is_dir:
            _empty_folder(dir_fd, name, shown, depth + 1)
            os.rmdir(name, dir_fd=dir_fd)
        else:
            os.unlink(name, dir_fd=dir_fd)
    except FileNotFoundError:
        return  # gone already: the goal is met
    except OSError as exc:
        if exc.errno in (errno.ENOTEMPTY, errno.ENOTDIR, errno.ELOOP, errno.EISDIR):
            raise Refused("changed", shown=shown) from None
        raise refusal(exc, shown=shown) from None


def _empty_folder(parent_fd: int, name: str, shown: str, depth: int) -> None:
    """Remove everything in the folder ``name``, opened without following a link."""
    if depth > MAX_DEPTH:
        raise Refused("deep", shown=shown, limit=MAX_DEPTH)
    # ELOOP or ENOTDIR (so "changed") if it was swapped for a link
    with held(os.open(name, DIR_FLAGS, dir_fd=parent_fd)) as fd:
        for _ in range(REMOVE_ROUNDS):
            with os.scandir(fd) as found:
                items = [(item.name, item.is_dir(follow_symlinks=False)) for item in found]
            if not items:
                return
            for child, is_dir in items:
                _remove_item(fd, child, is_dir, shown + "/" + child, depth)
        raise Refused("filling", shown=shown)


def move(src_fd: int, src_name: str, dst_fd: int, dst_name: str) -> None:
    """Rename a file or folder tree; a file at the destination is replaced, a folder
    there is in the way."""
    try:
        os.rename(src_name, dst_name, src_dir_fd=src_fd, dst_dir_fd=dst_fd)
    except OSError as exc:
        if exc.errno == errno.EINVAL:
            raise Refused("intoself") from None
        if exc.errno in (errno.EISDIR, errno.ENOTEMPTY, errno.EEXIST):
            raise Refused("inway", "dst") from None
        raise refusal(exc, "src" if exc.errno == errno.ENOENT else "dst") from None


def check_target(dir_fd: int, name: str) -> None:
    """Refuse a file's place beneath ``dir_fd`` when it holds anything but a regular
    file (or nothing)."""
    st = existing(dir_fd, name, "dst")
    if st is not None and not stat.S_ISREG(st.st_mode):
        raise Refused("target", "dst", kind=kind(st.st_mode))


# -- placing a file whole ---------------------------------------------------------------
class Temporary:
    """A file on its way to a name beneath a folder: written to an ``O_EXCL`` temporary
    beside its place, put there whole by :meth:`land`, removed by :meth:`close` if it
    never landed. The folder's descriptor stays the caller's."""

    def __init__(self, dir_fd: int) -> None:
        self.dir_fd = dir_fd
        self.size = 0
        self.landed = False
        self.name, self.fd = _new_temporary(dir_fd)
        self.ino = os.fstat(self.fd).st_ino

    def __enter__(self) -> Temporary:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()

    def write(self, data: bytes) -> None:
        """Append ``data`` to the temporary."""
        view = memoryview(data)
        while view:
            view = view[os.write(self.fd, view) :]
        self.size += len(data)

    def copy_from(self, source_fd: int, size: int) -> None:
        """Append exactly ``size`` bytes read from ``source_fd`` (``shrank`` if fewer come)."""
        left = size
        while left > 0:
            chunk = os.read(source_fd, min(CHUNK, left))
            if not chunk:
                raise Refused("shrank", "src")
            self.write(chunk)
            left -= len(chunk)

    def land(self, name: str, owner: tuple[int, int] | None = None) -> None:
        """Put the file in place as ``name`` (mode 0644, handed to ``owner``): refused
        when the temporary was replaced or removed, or what landed is not it."""
        os.fchmod(self.fd, 0o644)
        if owner is not None:
            os.fchown(self.fd, *owner)
        if not self._ours(self.name):
            raise Refused("interfered", "dst", how="replaced")
        try:
            os.rename(self.name, name, src_dir_fd=self.dir_fd, dst_dir_fd=self.dir_fd)
        except FileNotFoundError:  # the folder is held open: only the temporary can be gone
            raise Refused("interfered", "dst", how="removed") from None
        except OSError as exc:
            raise refusal(exc, "dst") from None
        self.landed = True
        if not self._ours(name):
            raise Refused("replaced", "dst")

    def close(self) -> None:
        """Remove the temporary unless it landed (only while it is still ours); release it."""
        if self.fd < 0:
            return
        try:
            if not self.landed and self._ours(self.name):
                os.unlink(self.name, dir_fd=self.dir_fd)
        except OSError:
            pass
        finally:
            os.close(self.fd)
            self.fd = -1

    def _ours(self, name: str) -> bool:
        """Whether ``name`` beneath the folder is still our file (by its inode)."""
        try:
            st = os.stat(name, dir_fd=self.dir_fd, follow_symlinks=False)
        except OSError:
            return False
        return stat.S_ISREG(st.st_mode) and st.st_ino == self.ino


def _new_temporary(dir_fd: int) -> tuple[str, int]:
    """(name, descriptor) of a new empty file of ours beneath ``dir_fd``."""
    for _ in range(TEMP_TRIES):
        name = TEMP_PREFIX + os.urandom(8).hex()
        try:
            return name, os.open(name, TEMP_FLAGS, 0o600, dir_fd=dir_fd)
        except FileExistsError:
            continue  # taken (planted, perhaps): another name
        except OSError as exc:
            raise refusal(exc, "dst") from None
    raise Refused("temporary", "dst")


def place(
    dir_fd: int, name: str, source_fd: int, size: int, owner: tuple[int, int] | None = None
) -> None:
    """Copy ``size`` bytes of ``source_fd`` to ``name`` beneath ``dir_fd``, whole or not
    at all (the place is checked by the caller: see :func:`check_target`)."""
    with Temporary(dir_fd) as temporary:
        temporary.copy_from(source_fd, size)
        temporary.land(name, owner)
