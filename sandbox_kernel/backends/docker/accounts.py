"""The few root-owned files a new container gets before its first start.

Images such as ``python:3.12-slim`` have no account for the uid a sandbox runs as
(1000, or the server's own uid), so a terminal's prompt read ``I have no name!@sandbox``
and ``whoami`` failed; and a login shell's ``PATH`` (the image's ``/etc/profile``) lacked
``~/.local/bin``, where ``pip install --user`` puts commands. So the host adds, with the
home folder (see :mod:`.files`), while nothing runs in the container yet:

* a ``passwd`` (and ``group``) line for the sandbox's uid (and gid) when the image has
  none, named ``sandbox``, home ``/home/sandbox``: the image's own file with one line
  more;
* ``/etc/profile.d/sandbox-kernel.sh``, which puts ``~/.local/bin`` first on a login
  shell's ``PATH``;
* the CA bundle, where the engine cannot mount this host's (see :mod:`...trust` and the
  functions at the end, which decide how a container gets it).

The image's files are read as the image has them: from its layers on this host
(beneath each layer's folder, never through a link) or through the engine's archive
call; an ``/etc/passwd`` that is not a plain file (a link, say) is left alone.
"""

from __future__ import annotations

import io
import logging
import os
import stat
import tarfile
from collections.abc import Callable, Mapping
from contextlib import suppress
from typing import Any

from ...errors import SandboxError
from ...trust import BUNDLE, INSIDE, bundle, write_bundle
from .mounts import bind_mount

log = logging.getLogger(__name__)

NAME = "sandbox"
HOME = "/home/sandbox"
LIMIT = 1 << 20  # bytes of an image's passwd or group file we read
PROFILE = (
    b"# Made by sandbox-kernel: commands that `pip install --user` installs, first.\n"
    b'case ":$PATH:" in\n'
    b'  *":$HOME/.local/bin:"*) ;;\n'
    b'  *) PATH="$HOME/.local/bin:$PATH"; export PATH ;;\n'
    b"esac\n"
)

# (path relative to /, contents, mode): files owned by root.
RootFile = tuple[str, bytes, int]
# Reads a file of the image (path relative to /): its bytes, or None when it is missing
# or not a plain file.
ImageReader = Callable[[str], "bytes | None"]


def root_files(uid: int, gid: int, read: ImageReader, ca: bytes = b"") -> list[RootFile]:
    """What a new container gets besides its home folder (see the module's docstring)."""
    files: list[RootFile] = [("etc/profile.d/sandbox-kernel.sh", PROFILE, 0o644)]
    passwd, group = read("etc/passwd"), read("etc/group")
    if passwd is not None:
        added = with_user(passwd, uid, gid)
        if added is not None:
            files.append(("etc/passwd", added, 0o644))
    if group is not None:
        added = with_group(group, gid)
        if added is not None:
            files.append(("etc/group", added, 0o644))
    if ca:
        files.append((f"{INSIDE}/{BUNDLE}".lstrip("/"), ca, 0o644))
    return files


def _entries(text: bytes) -> list[list[bytes]]:
    return [line.split(b":") for line in text.splitlines() if line and not line.startswith(b"#")]


def _name(entries: list[list[bytes]], number: int) -> bytes:
    taken = {e[0] for e in entries}
    return NAME.encode() if NAME.encode() not in taken else f"{NAME}{number}".encode()


def with_user(passwd: bytes, uid: int, gid: int) -> bytes | None:
    """``passwd`` with a line for ``uid``, or None when it has one already."""
    entries = _entries(passwd)
    if any(len(e) > 2 and e[2] == str(uid).encode() for e in entries):
        return None
    line = b"%s:x:%d:%d:sandbox user:%s:/bin/sh\n" % (_name(entries, uid), uid, gid, HOME.encode())
    return passwd.rstrip(b"\n") + b"\n" + line if passwd.strip() else line


def with_group(group: bytes, gid: int) -> bytes | None:
    """``group`` with a line for ``gid``, or None when it has one already."""
    entries = _entries(group)
    if any(len(e) > 2 and e[2] == str(gid).encode() for e in entries):
        return None
    line = b"%s:x:%d:\n" % (_name(entries, gid), gid)
    return group.rstrip(b"\n") + b"\n" + line if group.strip() else line


def from_archive(tar: bytes) -> bytes | None:
    """The one plain file in a tar the engine made of a path, or None."""
    try:
        with tarfile.open(fileobj=io.BytesIO(tar)) as archive:
            members = archive.getmembers()
            if len(members) != 1 or not members[0].isreg() or members[0].size > LIMIT:
                return None
            f = archive.extractfile(members[0])
            return f.read(LIMIT) if f is not None else None
    except (tarfile.TarError, OSError, EOFError):
        return None


def from_layers(graph_driver: Mapping[str, Any]) -> ImageReader:
    """Reads an image's files from a created container's lower layers (overlay2),
    topmost first, as overlayfs would show them: a whiteout or an opaque folder ends the
    search, and nothing is ever followed through a link."""
    lower = (graph_driver.get("Data") or {}).get("LowerDir") or ""
    layers = [p for p in str(lower).split(":") if os.path.isabs(p)]

    def read(path: str) -> bytes | None:
        parts = path.split("/")
        for layer in layers:
            found, stop = _in_layer(layer, parts)
            if found is not None or stop:
                return found
        return None

    return read


def _in_layer(layer: str, parts: list[str]) -> tuple[bytes | None, bool]:
    """(the file, whether lower layers are hidden) for ``parts`` beneath ``layer``."""
    try:
        folder = os.open(layer, os.O_RDONLY | os.O_DIRECTORY)
    except OSError:
        return None, False
    try:
        for name in parts[:-1]:
            try:
                entry = os.stat(name, dir_fd=folder, follow_symlinks=False)
            except FileNotFoundError:
                return None, False
            if not stat.S_ISDIR(entry.st_mode):
                return None, True  # a whiteout, or a link: nothing of it shows from below
            inner = os.open(name, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW, dir_fd=folder)
            os.close(folder)
            folder = inner
        try:
            entry = os.stat(parts[-1], dir_fd=folder, follow_symlinks=False)
        except FileNotFoundError:
            opaque = b""
            with suppress(OSError):
                opaque = os.getxattr(folder, "trusted.overlay.opaque")
            return None, opaque == b"y"
        if not stat.S_ISREG(entry.st_mode) or entry.st_size > LIMIT:
            return None, True
        fd = os.open(parts[-1], os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK, dir_fd=folder)
        try:
            return os.read(fd, LIMIT), True
        finally:
            os.close(fd)
    except OSError:
        return None, True
    finally:
        os.close(folder)


# -- the certificates a container trusts (see trust.py) ----------------------------------
def trust_for_new(local: bool, state_dir: str, ca_bundle: str) -> tuple[str, dict[str, Any] | None]:
    """How a new container gets the certificates it trusts: ("mount", the read-only mount
    of the bundle's host folder) on a ``local`` engine, ("copy", None) on one elsewhere
    (the bundle is among :func:`root_files`), ("", None) for none at all."""
    if not local:
        return ("copy", None) if bundle(ca_bundle).strip() else ("", None)
    folder = write_bundle(state_dir, ca_bundle)
    if folder is None:
        return "", None
    return "mount", bind_mount(INSIDE, str(folder), read_only=True)


def bundle_folder(state_dir: str, ca_bundle: str) -> None:
    """Before a container made with the mount starts: its source folder, current (with
    the host's store alone when ``ca_bundle`` is now "none": it names the file)."""
    write_bundle(state_dir, "" if ca_bundle == "none" else ca_bundle)


def refresh_trust(local: bool, state_dir: str, ca_bundle: str) -> None:
    """The mounted bundle rewritten when its sources changed (a stat or two when not):
    running sandboxes see it at once. "none" leaves it as it is, since containers made
    with the mount name the file in their environment."""
    if not local or ca_bundle == "none":
        return
    try:
        write_bundle(state_dir, ca_bundle)
    except SandboxError as exc:  # sandboxes keep what they trusted so far
        log.warning("%s", exc)
