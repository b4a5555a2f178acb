"""Files into and out of a Docker sandbox.

The engine's archive API (``docker cp``, ``put_archive``) resolves paths on the host,
outside the container's view: a cell that swaps a folder for a symlink mid-copy turns it
against the host (CVE-2018-15664). So workspace files cross through a small helper
(:mod:`sandbox_kernel.agent.fs_helper`) run *inside* the container as the sandbox user,
over a ``docker exec`` channel: whatever it resolves stays within what the sandbox may
reach. The one archive we still send is :func:`home_archive`, into a container that has
never run (nothing in it is hostile yet); on a local engine even that is written
straight into the container's own layer (:func:`home_in_layer`).
"""

from __future__ import annotations

import io
import json
import os
import tarfile
import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from contextlib import suppress
from pathlib import PurePosixPath
from typing import IO, Any

from ...agent import program
from ...trust import write_all
from ..base import WORKSPACE, SandboxError
from .accounts import RootFile
from .channel import DockerChannel

CHUNK = 1 << 20
# Starts a command in the sandbox (in /, its stderr kept apart) and returns its channel.
HelperOpener = Callable[[list[str]], DockerChannel]


def helper_command(op: str, path: str, *extra: str) -> list[str]:
    """The command running the file helper on ``path`` (relative to the workspace, or absolute)."""
    target = PurePosixPath(path)
    if not target.is_absolute():
        target = PurePosixPath(WORKSPACE) / target
    return program("fs_helper", op, "/", str(target).lstrip("/"), *extra)


def write_file(
    open_helper: HelperOpener, sandbox_id: str, path: str, data: bytes | IO[bytes]
) -> None:
    """Stream ``data`` to ``path`` in the sandbox; the helper confirms the size it wrote."""
    if isinstance(data, bytes | bytearray):
        data = io.BytesIO(data)
    size = _size_of(data)
    channel = open_helper(helper_command("write", path, str(size)))
    try:
        left = size
        while left > 0:
            chunk = data.read(min(CHUNK, left))
            if not chunk:
                raise SandboxError("the upload ended early")
            channel.write(chunk)
            left -= len(chunk)
        channel.close_input()
        answer = _json_line(channel.read_line())
    finally:
        channel.close()
    if "error" in answer or answer.get("size") != size:
        raise SandboxError(
            f"could not write {path!r} in {sandbox_id}: {answer.get('error', 'no answer')}"
        )


def read_file(open_helper: HelperOpener, sandbox_id: str, path: str) -> Iterator[bytes]:
    """``path`` in the sandbox, in chunks, as long as the helper said it was."""
    channel = open_helper(helper_command("read", path))
    channel.close_input()
    try:
        answer = _json_line(channel.read_line())
        size = answer.get("size")
        if not isinstance(size, int) or size < 0:
            raise SandboxError(
                f"cannot read {path!r} in {sandbox_id}: {answer.get('error', 'no answer')}"
            )
        left = size
        while left > 0:
            chunk = channel.read(min(CHUNK, left))
            if not chunk:
                raise SandboxError(f"{path!r} shrank while it was read")
            left -= len(chunk)
            yield chunk
    finally:
        channel.close()


def home_archive(uid: int, gid: int, extra: Sequence[RootFile] = ()) -> bytes:
    """A tar of /home/sandbox owned by the sandbox user, to put in before the first
    start (the image may not have that folder, and the sandbox user cannot make it),
    with ``extra`` files owned by root (see :mod:`.accounts`)."""
    buf = io.BytesIO()
    now = int(time.time())
    with tarfile.open(fileobj=buf, mode="w") as tar:
        for name in ("home", "home/sandbox"):
            entry = tarfile.TarInfo(name)
            entry.type = tarfile.DIRTYPE
            entry.mode = 0o755
            entry.uid, entry.gid = (0, 0) if name == "home" else (uid, gid)
            entry.mtime = now
            tar.addfile(entry)
        for path, data, mode in extra:
            entry = tarfile.TarInfo(path)
            entry.size, entry.mode, entry.mtime = len(data), mode, now
            tar.addfile(entry, io.BytesIO(data))
    return buf.getvalue()


def home_in_layer(
    graph_driver: Mapping[str, Any], uid: int, gid: int, extra: Sequence[RootFile] = ()
) -> bool:
    """Make what :func:`home_archive` holds straight in a created container's own layer;
    False when that is not certain to be right (the caller sends the archive instead).

    The archive call costs a new sandbox 50 ms of the engine (it re-executes itself to
    unpack in a chroot), a fifth of its engine time; until the container first starts,
    its layer is an ordinary folder of the engine's host, and writing it takes well under
    a millisecond. Taken only with the engine's overlay2 driver, as root, and when the
    layer is owned by root: an engine that remaps users (rootless, userns-remap) owns
    it as another user, and the ids would then be wrong inside. Nothing runs in the
    container yet, so nothing in it can race this."""
    upper = (graph_driver.get("Data") or {}).get("UpperDir")
    if graph_driver.get("Name") != "overlay2" or os.geteuid() != 0:
        return False
    if not isinstance(upper, str) or not os.path.isabs(upper):
        return False
    try:
        layer = os.open(upper, os.O_RDONLY | os.O_DIRECTORY)
    except OSError:
        return False
    try:
        if os.fstat(layer).st_uid != 0:
            return False
        home = _owned_folder(layer, "home", 0, 0)
        try:
            os.close(_owned_folder(home, "sandbox", uid, gid))
        finally:
            os.close(home)
        for path, data, mode in extra:
            _root_file(layer, path, data, mode)
        return True
    except OSError:
        return False
    finally:
        os.close(layer)


def _root_file(layer: int, path: str, data: bytes, mode: int) -> None:
    """``path`` (relative to /) in the container's own layer, root's, its folders made
    as root's 0755 (they show merged with the image's). The layer of a container that
    never ran is empty but for what we wrote: an existing file is written over."""
    *folders, name = path.split("/")
    parent = os.dup(layer)
    try:
        for folder in folders:
            inner = _owned_folder(parent, folder, 0, 0)
            os.close(parent)
            parent = inner
        fd = os.open(
            name, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_NOFOLLOW, 0o600, dir_fd=parent
        )
        try:
            write_all(fd, data)
            os.fchown(fd, 0, 0)
            os.fchmod(fd, mode)
        finally:
            os.close(fd)
    finally:
        os.close(parent)


def _owned_folder(parent: int, name: str, uid: int, gid: int) -> int:
    """``name`` in ``parent`` as a folder (made when missing; never through a link),
    mode 0755 and owned as given, opened."""
    with suppress(FileExistsError):
        os.mkdir(name, 0o700, dir_fd=parent)
    folder = os.open(name, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW, dir_fd=parent)
    try:
        os.fchown(folder, uid, gid)
        os.fchmod(folder, 0o755)
    except OSError:
        os.close(folder)
        raise
    return folder


def _json_line(line: bytes) -> dict[str, Any]:
    """A JSON object from the in-sandbox helper, or {} for anything else (it is untrusted)."""
    try:
        value = json.loads(line)
    except ValueError:
        return {}
    return value if isinstance(value, dict) else {}


def _size_of(data: IO[bytes]) -> int:
    try:
        here = data.tell()
        end = data.seek(0, os.SEEK_END)
        data.seek(here)
        return end - here
    except (OSError, AttributeError, ValueError):
        raise SandboxError("uploads need a sized, seekable source") from None
