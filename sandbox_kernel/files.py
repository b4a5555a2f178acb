"""Files of a sandbox's workspace, reached through its host folder, confined to it.

The workspace is a host folder (bind-mounted at /workspace for Docker, the folder
itself for the local backend), so transfers go straight to disk: fast, streamed, and
never held whole in memory. Every path is relative to the workspace; anything that
could resolve outside it (``..``, an absolute path, a NUL byte, a symlink pointing
out) is refused before a byte is touched. Uploads go to a temporary file beside the
target and are renamed into place, so a failed upload leaves nothing behind.
"""

from __future__ import annotations

import json
import os
import stat
import tempfile
from collections.abc import Iterator
from dataclasses import asdict, dataclass
from pathlib import Path, PurePosixPath
from typing import Any

from .backends.base import BadRequest, SandboxError

CHUNK = 1 << 20


class FileMissing(SandboxError):
    """The path is inside the workspace but nothing is there (404)."""


@dataclass
class Entry:
    name: str
    path: str
    type: str  # "file" | "directory" | "symlink" | "other"
    size: int
    modified: float

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


def _parts(path: str) -> list[str]:
    """Validated components of a workspace-relative path."""
    if not isinstance(path, str):
        raise BadRequest("the path must be a string")
    if "\0" in path:
        raise BadRequest("the path contains a NUL byte")
    if path.startswith("/") or path.startswith("\\"):
        raise BadRequest(f"{path!r} is absolute; paths are relative to the workspace")
    parts = [p for p in PurePosixPath(path).parts if p not in ("", ".")]
    if any(p == ".." for p in parts):
        raise BadRequest(f"{path!r} leads outside the workspace ('..' is not allowed)")
    return parts


class Workspace:
    """One workspace folder and the confined operations on it."""

    def __init__(self, root: str | Path) -> None:
        if not root:
            raise SandboxError("this sandbox has no workspace folder on this host")
        self.root = Path(root).resolve()

    def resolve(self, path: str, must_exist: bool = True) -> Path:
        """The host path for ``path``; refuses symlinks anywhere along it that lead out."""
        target = self.root.joinpath(*_parts(path))
        real = Path(os.path.realpath(target))
        if real != self.root and self.root not in real.parents:
            raise BadRequest(f"{path!r} leads outside the workspace (through a symlink)")
        if must_exist and not os.path.lexists(target):
            raise FileMissing(f"no such file or folder in the workspace: {path!r}")
        return target

    def list(self, path: str = "") -> list[Entry]:
        folder = self.resolve(path)
        if not folder.is_dir():
            raise BadRequest(f"{path!r} is a file, not a folder")
        entries = []
        with os.scandir(folder) as it:
            for item in it:
                st = item.stat(follow_symlinks=False)
                kind = (
                    "symlink" if stat.S_ISLNK(st.st_mode)
                    else "directory" if stat.S_ISDIR(st.st_mode)
                    else "file" if stat.S_ISREG(st.st_mode)
                    else "other"
                )
                rel = str(PurePosixPath(*_parts(path), item.name))
                entries.append(Entry(item.name, rel, kind, st.st_size, st.st_mtime))
        return sorted(entries, key=lambda e: (e.type != "directory", e.name))

    def open_read(self, path: str) -> tuple[int, Iterator[bytes]]:
        """(size, chunks) of a regular file; opened without following a final symlink."""
        target = self.resolve(path)
        try:
            fd = os.open(target, os.O_RDONLY | os.O_NOFOLLOW)
        except OSError as exc:
            raise BadRequest(f"cannot read {path!r}: {exc.strerror}") from None
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode):
            os.close(fd)
            raise BadRequest(f"{path!r} is not a regular file")

        def chunks() -> Iterator[bytes]:
            with os.fdopen(fd, "rb") as fh:
                while chunk := fh.read(CHUNK):
                    yield chunk

        return st.st_size, chunks()

    def start_upload(self, path: str) -> Upload:
        """Begin writing ``path``: parents are created, the file appears only on commit."""
        parts = _parts(path)
        if not parts:
            raise BadRequest("give a file path to upload to")
        target = self.resolve(path, must_exist=False)
        if target.is_symlink() or target.is_dir():
            raise BadRequest(f"{path!r} is a folder or a link; uploads only replace regular files")
        self._make_parents(target.parent)
        return Upload(target, self._owner())

    def delete(self, path: str) -> None:
        parts = _parts(path)
        if not parts:
            raise BadRequest("refusing to delete the workspace itself")
        target = self.resolve(path)
        if target.is_dir() and not target.is_symlink():
            raise BadRequest(f"{path!r} is a folder; only files can be deleted")
        target.unlink()  # a symlink itself is removed, never what it points to

    def _owner(self) -> tuple[int, int]:
        st = self.root.stat()
        return st.st_uid, st.st_gid

    def _make_parents(self, folder: Path) -> None:
        missing = []
        probe = folder
        while not probe.exists():
            missing.append(probe)
            probe = probe.parent
        uid, gid = self._owner()
        for item in reversed(missing):
            item.mkdir()
            if os.getuid() == 0:  # the sandbox user owns its files, not the server's root
                os.chown(item, uid, gid)
        real = Path(os.path.realpath(folder))
        if real != self.root and self.root not in real.parents:
            raise BadRequest("the target folder leads outside the workspace")


class Upload:
    """A file being written: chunks go to a temporary file, ``commit`` renames it in place."""

    def __init__(self, target: Path, owner: tuple[int, int]) -> None:
        self.target = target
        fd, name = tempfile.mkstemp(dir=target.parent, prefix=f".{target.name}.upload-")
        self._tmp = Path(name)
        self._fh = os.fdopen(fd, "wb")
        self._owner = owner
        self.size = 0

    def write(self, chunk: bytes) -> None:
        self._fh.write(chunk)
        self.size += len(chunk)

    def commit(self) -> int:
        self._fh.close()
        os.chmod(self._tmp, 0o644)
        if os.getuid() == 0:
            os.chown(self._tmp, *self._owner)
        os.replace(self._tmp, self.target)
        return self.size

    def abort(self) -> None:
        try:
            self._fh.close()
        finally:
            self._tmp.unlink(missing_ok=True)


# The helper RemoteWorkspace runs inside the sandbox (any python3): it resolves the path
# there, where symlinks live, and refuses anything that leaves the workspace.
_REMOTE_FS = r"""
import json, os, stat, sys
op, root, rel = sys.argv[1], sys.argv[2], sys.argv[3]
path = os.path.join(root, rel) if rel else root
def out(**kw):
    print(json.dumps(kw)); sys.exit(0)
def inside(p):
    real = os.path.realpath(p)
    return real == root or real.startswith(root + "/")
probe = path if op != "upload" else os.path.dirname(path)
while op == "upload" and not os.path.lexists(probe) and probe != root:
    probe = os.path.dirname(probe)
if not inside(probe if op == "upload" else path):
    out(error="outside")
if op != "upload" and not os.path.lexists(path):
    out(error="missing")
def kind(st):
    m = st.st_mode
    return "symlink" if stat.S_ISLNK(m) else "directory" if stat.S_ISDIR(m) else "file" if stat.S_ISREG(m) else "other"
if op == "stat":
    st = os.lstat(path)
    out(type=kind(st), size=st.st_size)
if op == "upload":
    out(type=kind(os.lstat(path)) if os.path.lexists(path) else "none")
if op == "list":
    if not os.path.isdir(path):
        out(error="notdir")
    items = []
    for name in os.listdir(path):
        st = os.lstat(os.path.join(path, name))
        items.append([name, kind(st), st.st_size, st.st_mtime])
    out(items=items)
if op == "delete":
    if os.path.isdir(path) and not os.path.islink(path):
        out(error="isdir")
    os.unlink(path)
    out(ok=True)
"""


class RemoteWorkspace:
    """The workspace of a sandbox whose files are not on this host (a Daytona volume).

    Same operations and errors as :class:`Workspace`; paths are checked twice, here
    (no ``..``, no absolute path) and inside the sandbox (no symlink leading out).
    """

    def __init__(self, backend: Any, sandbox_id: str, root: str = "/workspace") -> None:
        self.backend = backend
        self.sandbox_id = sandbox_id
        self.root = root

    def _ask(self, op: str, path: str) -> dict[str, Any]:
        parts = _parts(path)
        rel = str(PurePosixPath(*parts)) if parts else ""
        result = self.backend.exec(
            self.sandbox_id, ["python3", "-c", _REMOTE_FS, op, self.root, rel], cwd=self.root, timeout=60
        )
        try:
            answer = json.loads(result.output.decode("utf-8", "replace").strip().splitlines()[-1])
        except (ValueError, IndexError):
            raise SandboxError(f"could not reach the files of {self.sandbox_id}: {result.output[-300:]!r}") from None
        error = answer.get("error")
        if error == "outside":
            raise BadRequest(f"{path!r} leads outside the workspace (through a symlink)")
        if error == "missing":
            raise FileMissing(f"no such file or folder in the workspace: {path!r}")
        if error == "notdir":
            raise BadRequest(f"{path!r} is a file, not a folder")
        if error == "isdir":
            raise BadRequest(f"{path!r} is a folder; only files can be deleted")
        return answer

    def _remote(self, path: str) -> str:
        return str(PurePosixPath(self.root, *_parts(path)))

    def list(self, path: str = "") -> list[Entry]:
        items = self._ask("list", path)["items"]
        entries = [
            Entry(name, str(PurePosixPath(*_parts(path), name)), kind, size, modified)
            for name, kind, size, modified in items
        ]
        return sorted(entries, key=lambda e: (e.type != "directory", e.name))

    def open_read(self, path: str) -> tuple[int, Iterator[bytes]]:
        answer = self._ask("stat", path)
        if answer["type"] != "file":
            raise BadRequest(f"{path!r} is not a regular file")
        return answer["size"], self.backend.get_file(self.sandbox_id, self._remote(path))

    def start_upload(self, path: str) -> RemoteUpload:
        if not _parts(path):
            raise BadRequest("give a file path to upload to")
        if self._ask("upload", path)["type"] not in ("none", "file"):
            raise BadRequest(f"{path!r} is a folder or a link; uploads only replace regular files")
        return RemoteUpload(self.backend, self.sandbox_id, self._remote(path))

    def delete(self, path: str) -> None:
        if not _parts(path):
            raise BadRequest("refusing to delete the workspace itself")
        self._ask("delete", path)


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
