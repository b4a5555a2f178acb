"""File operations beneath a folder that hostile code may rewrite at any moment.

A workspace is a host folder that the sandbox can change while the server works in
it. Every operation here goes through :mod:`sandbox_kernel.agent.beneath`, the one
walk the in-sandbox file helper uses too: a path is resolved one component at a time
beneath an open folder descriptor, never following a link; a file is opened without
blocking and checked on its descriptor; a write lands whole through an ``O_EXCL``
temporary checked by inode, or not at all. What this module adds is the host's side:
paths as users give them (checked up front), the user's words for each refusal, and
streams for downloads and uploads.

Only the workspace folder itself (``root``) is opened by name; it is made by the host,
and the sandbox sees it as its mount point, which it cannot replace.
"""

from __future__ import annotations

import errno
import io
import os
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import asdict, dataclass
from pathlib import Path, PurePosixPath
from typing import Any

from .agent import beneath
from .agent.beneath import CHUNK, DIR_FLAGS, MAX_DEPTH, MAX_ENTRIES, TEMP_PREFIX, Refused, kind
from .errors import BadRequest, Conflict, DiskFull, FileMissing, SandboxError, shorten

__all__ = [
    "MAX_ENTRIES",
    "TEMP_PREFIX",
    "AtomicWrite",
    "Beneath",
    "Entry",
    "FileReader",
    "make_folder",
    "refusal_error",
    "split_path",
]

MAX_PATH = 4096  # bytes of a workspace-relative path (PATH_MAX)

# What a user reads for each refusal (of the walk here, or of the in-sandbox file
# helper, which answers with the same codes): the error's class and its words.
_ACCESS = (BadRequest, "{shown!r} is not accessible ({message})")
_WORDS: dict[str, tuple[type[SandboxError], str]] = {
    "ENOENT": (FileMissing, "no such file or folder in the workspace: {shown!r}"),
    "ELOOP": (BadRequest, "{shown!r} goes through a symbolic link; links are never followed"),
    "ENOTDIR": (BadRequest, "{shown!r} is not a folder (or goes through a link)"),
    "ENAMETOOLONG": (BadRequest, "a name in {shown!r} is too long for the file system"),
    "EACCES": _ACCESS,
    "EPERM": _ACCESS,
    "ENXIO": (BadRequest, "{shown!r} is not a regular file"),
    "EEXIST": (Conflict, "{shown!r} already exists"),
    "EISDIR": (BadRequest, "{shown!r} is a folder; uploads only replace regular files"),
    "outside": (BadRequest, "{shown!r} leads outside the workspace (through a symlink)"),
    "workspace": (BadRequest, "the path names the workspace itself, not a file in it"),
    "notfile": (BadRequest, "{shown!r} is a {kind}, not a regular file"),
    "target": (BadRequest, "{shown!r} is a {kind}; uploads only replace regular files"),
    "folder": (BadRequest, "{shown!r} is a folder; only files can be deleted"),
    "inway": (Conflict, "{shown!r} is a folder that is in the way; remove it first"),
    "intoself": (BadRequest, "cannot move {src!r} into itself ({dst!r})"),
    "changed": (
        Conflict,
        "{shown!r} changed while it was removed (from inside the sandbox); try again",
    ),
    "filling": (Conflict, "{shown!r} kept filling while it was removed (from inside the sandbox)"),
    "deep": (BadRequest, "{shown!r} is more than {depth} folders deep"),
    "shrank": (Conflict, "{shown!r} shrank while it was copied; try again"),
    "temporary": (Conflict, "could not create a temporary file in the target folder; try again"),
    "interfered": (
        Conflict,
        "the upload to {shown!r} was interfered with (its temporary file was {how} from "
        "inside the sandbox); nothing was written, try again",
    ),
    "replaced": (
        Conflict,
        "the upload to {shown!r} was replaced from inside the sandbox as it landed; try again",
    ),
    "incomplete": (
        SandboxError,
        "the upload to {shown!r} did not arrive whole in the sandbox; nothing was written, "
        "try again",
    ),
}


def refusal_error(refused: Refused, src: str, dst: str = "") -> SandboxError:
    """The user's error for a refusal met on ``src`` or ``dst`` (paths as the user gave
    them). Its details may come from inside a sandbox: they are only ever shown, cut
    short, in words of ours."""
    details = refused.details
    path = dst if refused.which == "dst" and dst else src
    cls, words = _WORDS.get(refused.code, (SandboxError, "cannot use {shown!r}: {message}"))
    return cls(
        words.format(
            shown=shorten(str(details.get("shown") or path)),
            src=shorten(src),
            dst=shorten(dst),
            kind=shorten(str(details.get("kind")), 20),
            how="removed" if details.get("how") == "removed" else "replaced",
            message=shorten(str(details.get("message") or refused.code)),
            depth=MAX_DEPTH,
        )
    )


@contextmanager
def _refusals(src: str, dst: str = "") -> Iterator[None]:
    """Refusals of the walk in the block, raised as the user's errors about ``src``/``dst``."""
    try:
        yield
    except Refused as refused:
        raise refusal_error(refused, src, dst) from None


@dataclass
class Entry:
    """One item of a folder listing, described without following links."""

    name: str
    path: str
    type: str  # "file" | "directory" | "symlink" | "other"
    size: int
    modified: float

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


def split_path(path: str) -> list[str]:
    """The components of a workspace-relative path; refuses what could never stay inside.

    Links are not judged here (they can appear at any moment); the walk refuses them.
    """
    if not isinstance(path, str):
        raise BadRequest("the path must be a string")
    if "\0" in path:
        raise BadRequest("the path contains a NUL byte")
    if len(path.encode("utf-8", "surrogateescape")) > MAX_PATH:
        raise BadRequest(f"the path is longer than {MAX_PATH} bytes")
    if path.startswith(("/", "\\")):
        raise BadRequest(f"{shorten(path)!r} is absolute; paths are relative to the workspace")
    parts = [p for p in PurePosixPath(path).parts if p not in ("", ".")]
    if ".." in parts:
        raise BadRequest(f"{shorten(path)!r} leads outside the workspace ('..' is not allowed)")
    for part in parts:
        if len(part.encode("utf-8", "surrogateescape")) > 255:
            raise BadRequest(f"the name {shorten(part, 40)!r} is longer than 255 bytes")
    return parts


class Beneath:
    """A folder, and every operation on paths below it, done through descriptors.

    Each operation opens the folder afresh and closes what it opened, so an object
    can be kept and used from several threads.
    """

    def __init__(self, root: str | os.PathLike[str], owner: tuple[int, int] | None = None) -> None:
        self.root = str(root)
        # Who new folders and files belong to, when the server must hand them over
        # (a root server whose sandbox runs as another uid); None: leave them as made.
        self.owner = owner

    # -- walking ------------------------------------------------------------------
    @contextmanager
    def _root(self) -> Iterator[int]:
        try:
            fd = os.open(self.root, DIR_FLAGS)
        except OSError as exc:
            raise SandboxError(
                f"the workspace folder {self.root} cannot be opened: {exc.strerror}"
            ) from None
        with beneath.held(fd):
            yield fd

    @contextmanager
    def folder(self, path: str, create: bool = False) -> Iterator[int]:
        """A descriptor of the folder ``path`` (created with its parents when asked)."""
        parts = split_path(path)
        with self._root() as root_fd, _refusals(path):
            fd = beneath.walk(root_fd, parts, create=create, owner=self.owner)
        with beneath.held(fd):
            yield fd

    @contextmanager
    def parent_of(
        self, path: str, create: bool = False, which: str = "src"
    ) -> Iterator[tuple[int, str]]:
        """(descriptor of the containing folder, last name) of a path naming an item;
        a refusal on the way is about ``which`` path of the operation."""
        parts = split_path(path)
        if not parts:
            raise refusal_error(Refused("workspace"), path)
        with self._root() as root_fd:
            fd = beneath.walk(root_fd, parts[:-1], which, create, self.owner)
        with beneath.held(fd):
            yield fd, parts[-1]

    # -- operations -----------------------------------------------------------------
    def stat(self, path: str) -> os.stat_result:
        """lstat of ``path``: a link is described, never followed."""
        parts = split_path(path)
        with self._root() as root_fd, _refusals(path):
            return beneath.stat_beneath(root_fd, parts)

    def entry(self, path: str) -> Entry:
        """The item ``path`` itself (a link is described, never followed)."""
        parts = split_path(path)
        st = self.stat(path)
        return Entry(
            parts[-1] if parts else "",
            str(PurePosixPath(*parts)) if parts else "",
            kind(st.st_mode),
            st.st_size,
            st.st_mtime,
        )

    def list(self, path: str = "", limit: int = MAX_ENTRIES) -> tuple[list[Entry], bool]:
        """(entries, truncated) of a folder; links and special files are described, not opened."""
        prefix = split_path(path)
        with self.folder(path) as fd:
            items, truncated = beneath.scan(fd, limit)
        entries = [
            Entry(
                name, str(PurePosixPath(*prefix, name)), kind(st.st_mode), st.st_size, st.st_mtime
            )
            for name, st in items
        ]
        entries.sort(key=lambda e: (e.type != "directory", e.name))
        return entries, truncated

    def open_read(self, path: str) -> tuple[int, int]:
        """(descriptor, size) of a regular file; the caller reads at most ``size`` bytes."""
        with _refusals(path), self.parent_of(path) as (dir_fd, name):
            fd, st = beneath.open_regular(dir_fd, name)
        return fd, st.st_size

    def open_file(self, path: str) -> FileReader:
        """A seekable reader of a regular file that ends at its size when opened."""
        fd, size = self.open_read(path)
        return FileReader(fd, size)

    def read_chunks(self, path: str) -> tuple[int, Iterator[bytes]]:
        """(size, chunks) of a regular file: exactly ``size`` bytes or an error, never more."""
        fd, size = self.open_read(path)
        return size, _chunks(fd, size, path)

    def delete(self, path: str) -> None:
        """Remove a file, link or special file (a link itself, never its target)."""
        with _refusals(path), self.parent_of(path) as (dir_fd, name):
            beneath.delete(dir_fd, name)

    def make_folder(self, path: str) -> None:
        """Create exactly one folder; its parent must exist (:class:`Conflict` if taken)."""
        with _refusals(path), self.parent_of(path) as (dir_fd, name):
            beneath.make_folder_at(dir_fd, name, owner=self.owner, exist_ok=False)

    def remove(self, path: str) -> None:
        """Remove a file, link, special file or a whole folder tree, never following a
        link (a folder swapped for one mid-way is a :class:`Conflict`)."""
        with _refusals(path), self.parent_of(path) as (dir_fd, name):
            beneath.remove(dir_fd, name, path)

    def move(self, src: str, dst: str) -> None:
        """Rename a file or folder tree (an existing destination file is replaced)."""
        with (
            _refusals(src, dst),
            self.parent_of(src) as (src_fd, src_name),
            self.parent_of(dst, which="dst") as (dst_fd, dst_name),
        ):
            beneath.move(src_fd, src_name, dst_fd, dst_name)

    def copy_file(self, src: str, dst: str) -> None:
        """Copy a regular file; the copy appears whole at ``dst`` or not at all."""
        fd, size = self.open_read(src)
        with (
            beneath.held(fd),
            _refusals(src, dst),
            self.parent_of(dst, create=True, which="dst") as (dir_fd, name),
        ):
            beneath.check_target(dir_fd, name)
            beneath.place(dir_fd, name, fd, size, self.owner)

    def start_write(self, path: str) -> AtomicWrite:
        """Begin replacing the regular file ``path`` (parents created); see :class:`AtomicWrite`."""
        with _refusals(path), self.parent_of(path, create=True, which="dst") as (dir_fd, name):
            beneath.check_target(dir_fd, name)
            return AtomicWrite(os.dup(dir_fd), name, path, self.owner)

    def write_bytes(self, path: str, data: bytes) -> None:
        """Replace ``path`` with ``data`` atomically (small files; uploads stream instead)."""
        upload = self.start_write(path)
        try:
            upload.write(data)
            upload.commit()
        except BaseException:
            upload.abort()
            raise


def _chunks(fd: int, size: int, path: str) -> Iterator[bytes]:
    """Read ``size`` bytes from ``fd`` in chunks, then stop even if the file grew."""
    left = size
    try:
        while left > 0:
            chunk = os.read(fd, min(CHUNK, left))
            if not chunk:
                raise Conflict(f"{shorten(path)!r} shrank while it was read")
            left -= len(chunk)
            yield chunk
    finally:
        os.close(fd)


class FileReader(io.RawIOBase):
    """A regular file's bytes as a seekable stream that never goes past the size it had
    when opened: a file that grows while it is served cannot make a response endless."""

    def __init__(self, fd: int, size: int) -> None:
        super().__init__()
        self._fd = fd
        self.size = size
        self._pos = 0

    def readable(self) -> bool:
        return True

    def seekable(self) -> bool:
        return True

    def read(self, size: int | None = -1) -> bytes:
        # One copy (pread's), not RawIOBase's buffer-then-bytes two: this serves downloads.
        want = self.size - self._pos if size is None or size < 0 else size
        want = min(want, self.size - self._pos)
        if want <= 0:
            return b""
        data = os.pread(self._fd, want, self._pos)
        self._pos += len(data)
        return data

    def readinto(self, buffer: Any) -> int:
        want = min(len(buffer), self.size - self._pos)
        if want <= 0:
            return 0
        data = os.pread(self._fd, want, self._pos)
        buffer[: len(data)] = data
        self._pos += len(data)
        return len(data)

    def seek(self, offset: int, whence: int = io.SEEK_SET) -> int:
        base = {io.SEEK_SET: 0, io.SEEK_CUR: self._pos, io.SEEK_END: self.size}[whence]
        self._pos = max(0, base + offset)
        return self._pos

    def tell(self) -> int:
        return self._pos

    def close(self) -> None:
        if not self.closed:
            os.close(self._fd)
        super().close()


class AtomicWrite:
    """A file being written: bytes go to an ``O_EXCL`` temporary beside the target,
    ``commit`` renames it into place, ``abort`` removes it. Either the whole file lands
    or nothing does; a temporary the sandbox replaced is detected, never trusted."""

    def __init__(self, dir_fd: int, name: str, shown: str, owner: tuple[int, int] | None) -> None:
        self._dir = dir_fd  # ours: closed when the write ends
        self.name = name
        self.shown = shown
        self._owner = owner
        try:
            self._temporary = beneath.Temporary(dir_fd)
        except BaseException:
            os.close(dir_fd)
            raise

    @property
    def size(self) -> int:
        """Bytes written so far."""
        return self._temporary.size

    def write(self, chunk: bytes) -> None:
        try:
            self._temporary.write(chunk)
        except OSError as exc:
            if exc.errno in (errno.ENOSPC, errno.EDQUOT):
                raise DiskFull(
                    f"no room left for {shorten(self.shown)!r}: the workspace's disk is full "
                    "(delete files, or use a flavor with more disk)"
                ) from None
            raise

    def commit(self) -> int:
        """Put the file in place; :class:`Conflict` if the sandbox interfered."""
        try:
            with _refusals(self.shown):
                self._temporary.land(self.name, self._owner)
            return self.size
        finally:
            self._finish()

    def abort(self) -> None:
        """Drop the upload: remove the temporary if it is still ours."""
        self._finish()

    def _finish(self) -> None:
        if self._dir < 0:
            return
        try:
            self._temporary.close()
        finally:
            os.close(self._dir)
            self._dir = -1


def make_folder(
    parent: Path, name: str, owner: tuple[int, int] | None = None, mode: int = 0o755
) -> Path:
    """Create (or keep) ``parent/name`` as a real folder, never through a link, and hand it
    to ``owner`` through its descriptor. ``parent`` is a host path; ``name`` one component."""
    parent.mkdir(parents=True, exist_ok=True)
    split_path(name)
    dir_fd = os.open(parent, DIR_FLAGS)
    try:
        try:
            os.mkdir(name, mode, dir_fd=dir_fd)
        except FileExistsError:
            pass
        try:
            fd = os.open(name, DIR_FLAGS, dir_fd=dir_fd)
        except OSError as exc:
            raise SandboxError(
                f"{parent / name} is not a folder we can use ({exc.strerror})"
            ) from None
        try:
            if owner is not None:
                st = os.fstat(fd)
                if (st.st_uid, st.st_gid) != owner:
                    os.fchown(fd, *owner)
        finally:
            os.close(fd)
    finally:
        os.close(dir_fd)
    return parent / name
