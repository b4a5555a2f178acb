"""File operations beneath a folder that hostile code may rewrite at any moment.

A workspace is a host folder that the sandbox can change while the server works in
it: swap a folder for a symlink between our check and our use, plant a link where a
temporary file will be, leave a FIFO that blocks whoever opens it. Resolving a path
once and then using the name again is exactly the race of CVE-2018-15664 (``docker
cp``), so nothing here ever uses a name twice or follows a link:

* a path is resolved one component at a time beneath an open directory descriptor,
  each folder opened with ``O_DIRECTORY | O_NOFOLLOW`` relative to the previous one
  (the way runc's ``securejoin`` and ``openat2(RESOLVE_BENEATH|RESOLVE_NO_SYMLINKS)``
  do it), so a link anywhere on the way is an error, not a detour;
* a file is opened ``O_NOFOLLOW | O_NONBLOCK`` and checked with ``fstat`` on the
  descriptor: FIFOs, sockets and devices are refused and can never block a thread;
* writes go to a temporary created with ``O_EXCL`` beneath the folder's descriptor,
  are set up with ``fchmod``/``fchown`` on the descriptor, renamed with both
  directory descriptors, and checked by inode afterwards: if the sandbox swapped the
  temporary, the caller gets a conflict, never a false success.

Only the workspace folder itself (``root``) is opened by name; it is made by the host,
and the sandbox sees it as its mount point, which it cannot replace.
"""

from __future__ import annotations

import errno
import io
import os
import secrets
import stat
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import asdict, dataclass
from pathlib import Path, PurePosixPath
from typing import Any

from .agent.fs_helper import kind
from .errors import BadRequest, Conflict, FileMissing, SandboxError, shorten

CHUNK = 1 << 20
MAX_PATH = 4096  # bytes of a workspace-relative path (PATH_MAX)
MAX_ENTRIES = 10_000  # a listing stops here: a folder of millions must not hold a thread
MAX_DEPTH = 256  # folders deep a removal goes (each level holds a descriptor)
REMOVE_ROUNDS = 8  # passes over a folder that keeps filling while it is removed
TEMP_PREFIX = ".sk-upload-"

_DIR_FLAGS = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC
_READ_FLAGS = os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC | os.O_NOCTTY


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


def kind_of(mode: int) -> str:
    """ "file", "directory", "symlink" or "other" (the in-sandbox helper says the same)."""
    return kind(os.stat_result((mode,) + (0,) * 9))


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


def _refusal(exc: OSError, shown: str) -> SandboxError:
    """The user-facing error for an OSError met while walking or opening ``shown``."""
    shown = shorten(shown)
    if exc.errno == errno.ENOENT:
        return FileMissing(f"no such file or folder in the workspace: {shown!r}")
    if exc.errno == errno.ELOOP:
        return BadRequest(f"{shown!r} goes through a symbolic link; links are never followed")
    if exc.errno == errno.ENOTDIR:
        return BadRequest(f"{shown!r} is not a folder (or goes through a link)")
    if exc.errno == errno.ENAMETOOLONG:
        return BadRequest(f"a name in {shown!r} is too long for the file system")
    if exc.errno in (errno.EACCES, errno.EPERM):
        return BadRequest(f"{shown!r} is not accessible ({exc.strerror})")
    if exc.errno == errno.ENXIO:
        return BadRequest(f"{shown!r} is not a regular file")
    return SandboxError(f"cannot use {shown!r}: {exc.strerror or exc}")


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
            fd = os.open(self.root, _DIR_FLAGS)
        except OSError as exc:
            raise SandboxError(
                f"the workspace folder {self.root} cannot be opened: {exc.strerror}"
            ) from None
        try:
            yield fd
        finally:
            os.close(fd)

    def _walk(self, root_fd: int, parts: list[str], shown: str, create: bool = False) -> int:
        """A new descriptor of the folder ``parts`` beneath ``root_fd`` (caller closes it)."""
        fd = os.dup(root_fd)
        try:
            for part in parts:
                if create:
                    self._mkdir(fd, part)
                try:
                    nxt = os.open(part, _DIR_FLAGS, dir_fd=fd)
                except OSError as exc:
                    raise _refusal(exc, shown) from None
                os.close(fd)
                fd = nxt
        except BaseException:
            os.close(fd)
            raise
        return fd

    def _mkdir(self, dir_fd: int, name: str, exist_ok: bool = True, shown: str = "") -> None:
        try:
            os.mkdir(name, 0o755, dir_fd=dir_fd)
        except FileExistsError:
            if exist_ok:
                return
            raise Conflict(f"{shorten(shown or name)!r} already exists") from None
        except OSError as exc:
            raise _refusal(exc, shown or name) from None
        if self.owner is not None:
            # Hand the new folder over through a descriptor: if the sandbox swapped the
            # name for a link meanwhile, the open fails instead of chowning its target.
            try:
                fd = os.open(name, _DIR_FLAGS, dir_fd=dir_fd)
            except OSError as exc:
                raise _refusal(exc, name) from None
            try:
                os.fchown(fd, *self.owner)
            finally:
                os.close(fd)

    @contextmanager
    def folder(self, path: str, create: bool = False) -> Iterator[int]:
        """A descriptor of the folder ``path`` (created with its parents when asked)."""
        parts = split_path(path)
        with self._root() as root_fd:
            fd = self._walk(root_fd, parts, path, create=create)
        try:
            yield fd
        finally:
            os.close(fd)

    @contextmanager
    def parent_of(self, path: str, create: bool = False) -> Iterator[tuple[int, str]]:
        """(descriptor of the containing folder, last name) of a path naming an item."""
        parts = split_path(path)
        if not parts:
            raise BadRequest("the path names the workspace itself, not a file in it")
        with self._root() as root_fd:
            fd = self._walk(root_fd, parts[:-1], path, create=create)
        try:
            yield fd, parts[-1]
        finally:
            os.close(fd)

    # -- operations -----------------------------------------------------------------
    def stat(self, path: str) -> os.stat_result:
        """lstat of ``path``: a link is described, never followed."""
        parts = split_path(path)
        if not parts:
            with self._root() as fd:
                return os.fstat(fd)
        with self.parent_of(path) as (dir_fd, name):
            try:
                return os.stat(name, dir_fd=dir_fd, follow_symlinks=False)
            except OSError as exc:
                raise _refusal(exc, path) from None

    def entry(self, path: str) -> Entry:
        """The item ``path`` itself (a link is described, never followed)."""
        parts = split_path(path)
        st = self.stat(path)
        return Entry(
            parts[-1] if parts else "",
            str(PurePosixPath(*parts)) if parts else "",
            kind_of(st.st_mode),
            st.st_size,
            st.st_mtime,
        )

    def list(self, path: str = "", limit: int = MAX_ENTRIES) -> tuple[list[Entry], bool]:
        """(entries, truncated) of a folder; links and special files are described, not opened."""
        prefix = split_path(path)
        entries: list[Entry] = []
        truncated = False
        with self.folder(path) as fd, os.scandir(fd) as it:
            for item in it:
                if len(entries) >= limit:
                    truncated = True
                    break
                try:
                    st = item.stat(follow_symlinks=False)
                except OSError:
                    continue  # removed while we looked
                rel = str(PurePosixPath(*prefix, item.name))
                entries.append(Entry(item.name, rel, kind_of(st.st_mode), st.st_size, st.st_mtime))
        entries.sort(key=lambda e: (e.type != "directory", e.name))
        return entries, truncated

    def open_read(self, path: str) -> tuple[int, int]:
        """(descriptor, size) of a regular file; the caller reads at most ``size`` bytes."""
        with self.parent_of(path) as (dir_fd, name):
            try:
                before = os.stat(name, dir_fd=dir_fd, follow_symlinks=False)
            except OSError as exc:
                raise _refusal(exc, path) from None
            if not stat.S_ISREG(before.st_mode):
                raise BadRequest(
                    f"{shorten(path)!r} is a {kind_of(before.st_mode)}, not a regular file"
                )
            try:
                fd = os.open(name, _READ_FLAGS, dir_fd=dir_fd)
            except OSError as exc:
                raise _refusal(exc, path) from None
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode):  # swapped between the look and the open
            os.close(fd)
            raise BadRequest(f"{shorten(path)!r} is not a regular file")
        os.set_blocking(fd, True)
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
        with self.parent_of(path) as (dir_fd, name):
            try:
                st = os.stat(name, dir_fd=dir_fd, follow_symlinks=False)
                if stat.S_ISDIR(st.st_mode):
                    raise BadRequest(f"{shorten(path)!r} is a folder; only files can be deleted")
                os.unlink(name, dir_fd=dir_fd)
            except IsADirectoryError:
                raise BadRequest(
                    f"{shorten(path)!r} is a folder; only files can be deleted"
                ) from None
            except OSError as exc:
                raise _refusal(exc, path) from None

    def make_folder(self, path: str) -> None:
        """Create exactly one folder; its parent must exist (:class:`Conflict` if taken)."""
        with self.parent_of(path) as (dir_fd, name):
            self._mkdir(dir_fd, name, exist_ok=False, shown=path)

    def remove(self, path: str) -> None:
        """Remove a file, link, special file or a whole folder tree.

        Every level is opened ``O_NOFOLLOW`` beneath its parent's descriptor, so a
        folder swapped for a link mid-way stops the removal (:class:`Conflict`) instead
        of emptying the link's target.
        """
        with self.parent_of(path) as (dir_fd, name):
            try:
                st = os.stat(name, dir_fd=dir_fd, follow_symlinks=False)
            except OSError as exc:
                raise _refusal(exc, path) from None
            _remove_item(dir_fd, name, stat.S_ISDIR(st.st_mode), path, 0)

    def move(self, src: str, dst: str) -> None:
        """Rename a file or folder tree (an existing destination file is replaced)."""
        with self.parent_of(src) as (src_fd, src_name), self.parent_of(dst) as (dst_fd, dst_name):
            try:
                os.rename(src_name, dst_name, src_dir_fd=src_fd, dst_dir_fd=dst_fd)
            except OSError as exc:
                if exc.errno == errno.EINVAL:
                    raise BadRequest(
                        f"cannot move {shorten(src)!r} into itself ({shorten(dst)!r})"
                    ) from None
                if exc.errno in (errno.EISDIR, errno.ENOTEMPTY, errno.EEXIST):
                    raise Conflict(
                        f"{shorten(dst)!r} is a folder that is in the way; remove it first"
                    ) from None
                raise _refusal(exc, src if exc.errno == errno.ENOENT else dst) from None

    def copy_file(self, src: str, dst: str) -> None:
        """Copy a regular file; the copy appears whole at ``dst`` or not at all."""
        with self.open_file(src) as reader:
            upload = self.start_write(dst)
            try:
                while chunk := reader.read(CHUNK):
                    upload.write(chunk)
                if upload.size != reader.size:
                    raise Conflict(f"{shorten(src)!r} shrank while it was copied; try again")
                upload.commit()
            finally:
                upload.abort()

    def start_write(self, path: str) -> AtomicWrite:
        """Begin replacing the regular file ``path`` (parents created); see :class:`AtomicWrite`."""
        with self.parent_of(path, create=True) as (dir_fd, name):
            try:
                existing = os.stat(name, dir_fd=dir_fd, follow_symlinks=False)
            except FileNotFoundError:
                existing = None
            except OSError as exc:
                raise _refusal(exc, path) from None
            if existing is not None and not stat.S_ISREG(existing.st_mode):
                raise BadRequest(
                    f"{shorten(path)!r} is a {kind_of(existing.st_mode)}; uploads only replace regular files"
                )
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
            raise Conflict(
                f"{shorten(shown)!r} changed while it was removed (from inside the sandbox); "
                "try again"
            ) from None
        raise _refusal(exc, shown) from None


def _empty_folder(parent_fd: int, name: str, shown: str, depth: int) -> None:
    if depth > MAX_DEPTH:
        raise BadRequest(f"{shorten(shown)!r} is more than {MAX_DEPTH} folders deep")
    fd = os.open(name, _DIR_FLAGS, dir_fd=parent_fd)  # ELOOP/ENOTDIR if swapped for a link
    try:
        for _ in range(REMOVE_ROUNDS):
            with os.scandir(fd) as it:
                items = [(item.name, item.is_dir(follow_symlinks=False)) for item in it]
            if not items:
                return
            for child, is_dir in items:
                _remove_item(fd, child, is_dir, f"{shown}/{child}", depth)
        raise Conflict(
            f"{shorten(shown)!r} kept filling while it was removed (from inside the sandbox)"
        )
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
        self._dir = dir_fd
        self.name = name
        self.shown = shown
        self._owner = owner
        self.size = 0
        self._tmp = ""
        self._fd = -1
        for _ in range(8):
            tmp = TEMP_PREFIX + secrets.token_hex(8)
            try:
                self._fd = os.open(
                    tmp,
                    os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC,
                    0o600,
                    dir_fd=dir_fd,
                )
            except FileExistsError:
                continue
            except OSError as exc:
                os.close(dir_fd)
                raise _refusal(exc, shown) from None
            self._tmp = tmp
            break
        else:
            os.close(dir_fd)
            raise Conflict("could not create a temporary file in the target folder; try again")
        self._ino = os.fstat(self._fd).st_ino
        self._done = False

    def write(self, chunk: bytes) -> None:
        view = memoryview(chunk)
        while view:
            view = view[os.write(self._fd, view) :]
        self.size += len(chunk)

    def _still_ours(self, name: str) -> bool:
        try:
            st = os.stat(name, dir_fd=self._dir, follow_symlinks=False)
        except OSError:
            return False
        return stat.S_ISREG(st.st_mode) and st.st_ino == self._ino

    def commit(self) -> int:
        """Put the file in place; :class:`Conflict` if the sandbox interfered."""
        try:
            os.fchmod(self._fd, 0o644)
            if self._owner is not None:
                os.fchown(self._fd, *self._owner)
            if not self._still_ours(self._tmp):
                raise self._interfered("replaced")
            try:
                os.rename(self._tmp, self.name, src_dir_fd=self._dir, dst_dir_fd=self._dir)
            except IsADirectoryError:
                raise BadRequest(
                    f"{shorten(self.shown)!r} is a folder; uploads only replace regular files"
                ) from None
            except FileNotFoundError:  # the folder is held open: only the temporary can be gone
                raise self._interfered("removed") from None
            except OSError as exc:
                raise _refusal(exc, self.shown) from None
            if not self._still_ours(self.name):
                raise Conflict(
                    f"the upload to {shorten(self.shown)!r} was replaced from inside the sandbox as it "
                    "landed; try again"
                )
            self._done = True
            return self.size
        finally:
            self._finish()

    def _interfered(self, how: str) -> Conflict:
        return Conflict(
            f"the upload to {shorten(self.shown)!r} was interfered with (its temporary file was "
            f"{how} from inside the sandbox); nothing was written, try again"
        )

    def abort(self) -> None:
        """Drop the upload: remove the temporary if it is still ours."""
        self._finish()

    def _finish(self) -> None:
        if self._fd < 0:
            return
        try:
            if not self._done and self._tmp and self._still_ours(self._tmp):
                os.unlink(self._tmp, dir_fd=self._dir)
        except OSError:
            pass
        finally:
            os.close(self._fd)
            os.close(self._dir)
            self._fd = -1


def make_folder(
    parent: Path, name: str, owner: tuple[int, int] | None = None, mode: int = 0o755
) -> Path:
    """Create (or keep) ``parent/name`` as a real folder, never through a link, and hand it
    to ``owner`` through its descriptor. ``parent`` is a host path; ``name`` one component."""
    parent.mkdir(parents=True, exist_ok=True)
    split_path(name)
    dir_fd = os.open(parent, _DIR_FLAGS)
    try:
        try:
            os.mkdir(name, mode, dir_fd=dir_fd)
        except FileExistsError:
            pass
        try:
            fd = os.open(name, _DIR_FLAGS, dir_fd=dir_fd)
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
