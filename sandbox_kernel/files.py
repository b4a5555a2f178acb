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
import secrets
import tempfile
from collections.abc import Iterator
from pathlib import Path, PurePosixPath
from typing import Any, BinaryIO, cast

from .agent import program
from .agent.beneath import Refused
from .agent.fs_helper import STAGE
from .errors import BadRequest, FileMissing, SandboxError
from .safefs import MAX_ENTRIES, AtomicWrite, Beneath, Entry, refusal_error, split_path

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


META_TIMEOUT = 60.0  # seconds for an operation on names
DATA_TIMEOUT = 3600.0  # seconds for one that copies bytes inside the sandbox


class RemoteWorkspace:
    """The workspace of a sandbox whose files are not on this host (a Daytona volume),
    reached through a sandbox that runs no user code (the user's files sandbox).

    Same operations and errors as :class:`Workspace`. Paths are checked twice: here (no
    ``..``, no absolute path) and inside the sandbox by :mod:`.agent.fs_helper`, which
    refuses real paths leading out and then walks beneath open folders without
    following a link, because the volume is shared with the user's code sandbox, which
    can rewrite it at any moment. Bytes go in and out through the files sandbox's own
    stage folder, so Daytona's file API never resolves a path in the shared volume (a
    link swapped in there could otherwise point it at the files sandbox's own system).
    What comes back from the sandbox is checked before use.
    """

    def __init__(self, backend: Any, sandbox_id: str, root: str = "/workspace") -> None:
        self.backend = backend
        self.sandbox_id = sandbox_id
        self.root = root

    def _ask(
        self, op: str, path: str, *extra: str, dst: str = "", timeout: float = META_TIMEOUT
    ) -> dict[str, Any]:
        """One helper operation on ``path`` (and ``dst``); its answer, or our error."""
        result = self.backend.exec(
            self.sandbox_id,
            program("fs_helper", op, self.root, _rel(path), *extra),
            cwd="/",
            timeout=timeout,
        )
        try:
            answer = json.loads(result.output.decode("utf-8", "replace").strip().splitlines()[-1])
        except (ValueError, IndexError):
            answer = None
        if not isinstance(answer, dict):
            raise SandboxError(
                f"could not reach the files of {self.sandbox_id}: {result.output[-300:]!r}"
            )
        if "error" in answer:
            raise refusal_error(_refused(answer), path, dst)
        return answer

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

    def stat(self, path: str) -> Entry:
        """The item itself (a link is described, never followed); ``""`` is the workspace."""
        parts = _parts(path)
        answer = self._ask("entry", path)
        try:
            return Entry(
                parts[-1] if parts else "",
                _rel(path),
                str(answer["type"]),
                int(answer["size"]),
                float(answer["modified"]),
            )
        except (KeyError, TypeError, ValueError):
            raise SandboxError(f"the files of {self.sandbox_id} gave no usable answer") from None

    def open_file(self, path: str) -> BinaryIO:
        """A seekable reader of a regular file's bytes as they were when it was opened,
        spooled to a temporary file on this host (never more than that size)."""
        token = secrets.token_hex(16)
        answer = self._ask("stage-out", path, token, timeout=DATA_TIMEOUT)
        size = answer.get("size")
        spool = tempfile.TemporaryFile()
        try:
            if not isinstance(size, int) or size < 0:
                raise SandboxError(f"the files of {self.sandbox_id} gave no size for {path!r}")
            for chunk in _at_most(
                size, self.backend.get_file(self.sandbox_id, _staged("out", token))
            ):
                spool.write(chunk)
            spool.seek(0)
        except BaseException:
            spool.close()
            raise
        finally:
            self._unstage(token)
        return cast(BinaryIO, spool)

    def open_read(self, path: str) -> tuple[int, Iterator[bytes]]:
        """(size, chunks) of a regular file; never more than ``size`` bytes."""
        spool = self.open_file(path)
        size = spool.seek(0, 2)
        spool.seek(0)
        return size, _spooled_chunks(spool)

    def start_upload(self, path: str) -> RemoteUpload:
        """Begin writing ``path``: checked now, sent whole and put in place on commit."""
        if not _parts(path):
            raise BadRequest("give a file path to upload to")
        self._ask("check-upload", path, dst=path)
        return RemoteUpload(self, path)

    def delete(self, path: str) -> None:
        if not _parts(path):
            raise BadRequest("refusing to delete the workspace itself")
        self._ask("delete", path)

    def make_folder(self, path: str) -> None:
        """Create exactly one folder; its parent must exist (:class:`Conflict` if taken)."""
        self._ask("mkdir", path)

    def remove(self, path: str) -> None:
        """A file, link, special file or a whole folder tree (never following a link)."""
        if not _parts(path):
            raise BadRequest("refusing to remove the workspace itself")
        self._ask("remove", path, timeout=DATA_TIMEOUT)

    def move(self, src: str, dst: str) -> None:
        """Rename a file or folder tree (an existing destination file is replaced)."""
        self._ask("move", src, _rel(dst), dst=dst)

    def copy_file(self, src: str, dst: str) -> None:
        """Copy a regular file; the copy appears whole at ``dst`` or not at all."""
        self._ask("copy", src, _rel(dst), dst=dst, timeout=DATA_TIMEOUT)

    def _unstage(self, token: str) -> None:
        """Remove what a transfer left in the stage (the helper also sweeps old ones)."""
        try:
            self._ask("unstage", "", token)
        except SandboxError:
            pass


def _rel(path: str) -> str:
    parts = _parts(path)
    return str(PurePosixPath(*parts)) if parts else ""


def _staged(prefix: str, token: str) -> str:
    """Where the helper stages a transfer (see fs_helper.staged_name)."""
    return f"{STAGE}/{prefix}-{token}"


def _refused(answer: dict[str, Any]) -> Refused:
    """The helper's refusal, as it was raised in the sandbox (see :mod:`.agent.beneath`)."""
    refused = Refused(str(answer.get("error")), "dst" if answer.get("which") == "dst" else "src")
    refused.details = {k: v for k, v in answer.items() if k not in ("error", "which")}
    return refused


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


def _spooled_chunks(spool: BinaryIO) -> Iterator[bytes]:
    """The chunks of a spooled download; closing the iterator removes the spool."""
    try:
        while chunk := spool.read(CHUNK):
            yield chunk
    finally:
        spool.close()


class RemoteUpload:
    """An upload to a remote workspace: spooled on this host, sent whole to the files
    sandbox's stage on commit and put in place there, so a broken request leaves
    nothing behind in the workspace."""

    def __init__(self, workspace: RemoteWorkspace, path: str) -> None:
        self.workspace = workspace
        self.path = path
        self._fh = tempfile.TemporaryFile()
        self.size = 0

    def write(self, chunk: bytes) -> None:
        self._fh.write(chunk)
        self.size += len(chunk)

    def commit(self) -> int:
        ws = self.workspace
        token = secrets.token_hex(16)
        try:
            self._fh.seek(0)
            ws.backend.put_file(ws.sandbox_id, _staged("in", token), self._fh)
            ws._ask(
                "stage-in",
                self.path,
                token,
                str(self.size),
                dst=self.path,
                timeout=DATA_TIMEOUT,
            )
        except BaseException:
            ws._unstage(token)
            raise
        finally:
            self._fh.close()
        return self.size

    def abort(self) -> None:
        self._fh.close()
