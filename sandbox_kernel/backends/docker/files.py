"""Files into and out of a Docker sandbox.

The engine's archive API (``docker cp``, ``put_archive``) resolves paths on the host,
outside the container's view: a cell that swaps a folder for a symlink mid-copy turns it
against the host (CVE-2018-15664). So workspace files cross through a small helper
(:mod:`sandbox_kernel.agent.fs_helper`) run *inside* the container as the sandbox user,
over a ``docker exec`` channel: whatever it resolves stays within what the sandbox may
reach. The one archive we still send is the home folder (:mod:`.home`), into a
container that has never run (nothing in it is hostile yet).
"""

from __future__ import annotations

import io
import json
import os
from collections.abc import Callable, Iterator
from pathlib import PurePosixPath
from typing import IO, Any

from ...agent import program
from ..base import WORKSPACE, SandboxError
from .channel import DockerChannel

CHUNK = 1 << 20
HELPER_IDLE = 60.0  # seconds the file helper may stay silent before the host gives up
# Starts a command in the sandbox (in /, its stderr kept apart) and returns its channel.
HelperOpener = Callable[[list[str]], DockerChannel]


def helper_opener(open_channel: Callable[..., DockerChannel]) -> HelperOpener:
    """Starts the in-sandbox file helper through ``open_channel`` (a sandbox's): in /,
    its stderr apart from the data, and given up when it stays silent for HELPER_IDLE
    seconds (a cell can freeze it)."""

    def open_helper(cmd: list[str]) -> DockerChannel:
        channel = open_channel(cmd, cwd="/", merge_stderr=False)
        channel.set_timeout(HELPER_IDLE)
        return channel

    return open_helper


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
