"""Files of a sandbox's workspace, for the REST API (and anything else on the host).

Two kinds: :class:`Workspace` for a workspace that is a folder on this host (Docker's
bind mount, the local backend's folder) and :class:`RemoteWorkspace` for one that is
not (a Daytona volume). Both take paths relative to the workspace, refuse ``..``,
absolute paths and NUL bytes up front, and never follow a link out.

The host folder is hostile ground: the sandbox can rewrite it while a request is in
flight. :class:`Workspace` therefore does every operation through
:mod:`sandbox_kernel.safefs` (descriptors, one component at a time, no link followed,
special files refused, uploads through an exclusive temporary renamed into place).
"""

from __future__ import annotations

import json
import tempfile
from collections.abc import Iterator
from pathlib import Path, PurePosixPath
from typing import Any, BinaryIO, cast

from .agent import fs_helper_source
from .errors import BadRequest, FileMissing, SandboxError, shorten
from .safefs import MAX_ENTRIES, AtomicWrite, Beneath, Entry, split_path

__all__ = ["Entry", "FileMissing", "RemoteUpload", "RemoteWorkspace", "Upload", "Workspace"]

CHUNK = 1 << 20
Upload = AtomicWrite  # what Workspace.start_upload returns


def _parts(path: str) -> list[str]:
    return split_path(path)


class Workspace:
    """One workspace folder on this host and the confined operations on it."""

    def __init__(self, root: str | Path, owner: tuple[int, int] | None = None) -> None:
        if not root:
            raise SandboxError("this sandbox has no workspace folder on this host")
        self.root = Path(root)
        self._fs = Beneath(self.root, owner)

    def list(self, path: str = "", limit: int = MAX_ENTRIES) -> tuple[list[Entry], bool]:
        """(entries, truncated): at most ``limit`` entries of a folder."""
        return self._fs.list(path, limit)

    def open_read(self, path: str) -> tuple[int, Iterator[bytes]]:
        """(size, chunks) of a regular file; never more than ``size`` bytes."""
        return self._fs.read_chunks(path)

    def start_upload(self, path: str) -> AtomicWrite:
        """Begin writing ``path``: parents are created, the file appears only on commit."""
        if not split_path(path):
            raise BadRequest("give a file path to upload to")
        return self._fs.start_write(path)

    def delete(self, path: str) -> None:
        if not split_path(path):
            raise BadRequest("refusing to delete the workspace itself")
        self._fs.delete(path)

    # -- what WebDAV needs besides (same names and errors on RemoteWorkspace) ----------
    def stat(self, path: str) -> Entry:
        """The item itself; ``""`` is the workspace."""
        return self._fs.entry(path)

    def open_file(self, path: str) -> BinaryIO:
        """A seekable reader of a regular file, ending at its size when opened."""
        return cast(BinaryIO, self._fs.open_file(path))

    def make_folder(self, path: str) -> None:
        self._fs.make_folder(path)

    def remove(self, path: str) -> None:
        """A file, link or whole folder tree (never following a link)."""
        if not split_path(path):
            raise BadRequest("refusing to remove the workspace itself")
        self._fs.remove(path)

    def move(self, src: str, dst: str) -> None:
        self._fs.move(src, dst)

    def copy_file(self, src: str, dst: str) -> None:
        self._fs.copy_file(src, dst)


class RemoteWorkspace:
    """The workspace of a sandbox whose files are not on this host (a Daytona volume).

    Same operations and errors as :class:`Workspace`; paths are checked twice, here
    (no ``..``, no absolute path) and inside the sandbox by :mod:`.agent.fs_helper`
    (no symlink leading out). What comes back from the sandbox is checked before use.
    """

    def __init__(self, backend: Any, sandbox_id: str, root: str = "/workspace") -> None:
        self.backend = backend
        self.sandbox_id = sandbox_id
        self.root = root

    def _ask(self, op: str, path: str) -> dict[str, Any]:
        parts = _parts(path)
        rel = str(PurePosixPath(*parts)) if parts else ""
        result = self.backend.exec(
            self.sandbox_id,
            ["python3", "-c", fs_helper_source(), op, self.root, rel],
            cwd=self.root,
            timeout=60,
        )
        try:
            answer = json.loads(result.output.decode("utf-8", "replace").strip().splitlines()[-1])
        except (ValueError, IndexError):
            answer = None
        if not isinstance(answer, dict):
            raise SandboxError(
                f"could not reach the files of {self.sandbox_id}: {result.output[-300:]!r}"
            )
        error = answer.get("error")
        if error == "outside":
            raise BadRequest(f"{shorten(path)!r} leads outside the workspace (through a symlink)")
        if error == "missing":
            raise FileMissing(f"no such file or folder in the workspace: {shorten(path)!r}")
        if error == "notdir":
            raise BadRequest(f"{shorten(path)!r} is a file, not a folder")
        if error == "isdir":
            raise BadRequest(f"{shorten(path)!r} is a folder; only files can be deleted")
        return answer

    def _remote(self, path: str) -> str:
        return str(PurePosixPath(self.root, *_parts(path)))

    def list(self, path: str = "", limit: int = MAX_ENTRIES) -> tuple[list[Entry], bool]:
        answer = self._ask("list", path)
        prefix = _parts(path)
        entries = []
        # The answer comes from inside the sandbox: take only well-formed items.
        for item in answer.get("items") or []:
            try:
                name, kind, size, modified = item
                entries.append(
                    Entry(
                        str(name),
                        str(PurePosixPath(*prefix, str(name))),
                        str(kind),
                        int(size),
                        float(modified),
                    )
                )
            except (TypeError, ValueError):
                continue
        entries.sort(key=lambda e: (e.type != "directory", e.name))
        return entries[:limit], len(entries) > limit or bool(answer.get("truncated"))

    def open_read(self, path: str) -> tuple[int, Iterator[bytes]]:
        answer = self._ask("stat", path)
        size = answer.get("size")
        if answer.get("type") != "file" or not isinstance(size, int) or size < 0:
            raise BadRequest(f"{shorten(path)!r} is not a regular file")
        return size, _at_most(size, self.backend.get_file(self.sandbox_id, self._remote(path)))

    def start_upload(self, path: str) -> RemoteUpload:
        if not _parts(path):
            raise BadRequest("give a file path to upload to")
        if self._ask("check-upload", path).get("type") not in ("none", "file"):
            raise BadRequest(
                f"{shorten(path)!r} is a folder or a link; uploads only replace regular files"
            )
        return RemoteUpload(self.backend, self.sandbox_id, self._remote(path))

    def delete(self, path: str) -> None:
        if not _parts(path):
            raise BadRequest("refusing to delete the workspace itself")
        self._ask("delete", path)


def _at_most(size: int, chunks: Iterator[bytes]) -> Iterator[bytes]:
    """Exactly ``size`` bytes of ``chunks`` (the announced length), or an error if fewer come."""
    left = size
    for chunk in chunks:
        if left <= 0:
            break
        chunk = chunk[:left]
        left -= len(chunk)
        yield chunk
    if left > 0:
        raise SandboxError("the file shrank while it was read")


class RemoteUpload:
    """An upload to a remote workspace: spooled on this host, sent whole on commit, so a
    broken request leaves nothing behind in the sandbox."""

    def __init__(self, backend: Any, sandbox_id: str, target: str) -> None:
        self.backend = backend
        self.sandbox_id = sandbox_id
        self.target = target
        self._fh = tempfile.TemporaryFile()
        self.size = 0

    def write(self, chunk: bytes) -> None:
        self._fh.write(chunk)
        self.size += len(chunk)

    def commit(self) -> int:
        try:
            self._fh.seek(0)
            self.backend.put_file(self.sandbox_id, self.target, self._fh)
        finally:
            self._fh.close()
        return self.size

    def abort(self) -> None:
        self._fh.close()
