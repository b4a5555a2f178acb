"""The sandbox's python3, copied so that what starts from it is hardened from its exec.

A program the host starts in the sandbox as ``python3`` is an ordinary process of the
sandbox's uid for its first milliseconds, until its first line makes it non-dumpable
(agent/boot.py). A cell that hunts new processes can open its stdin through
``/proc/<pid>/fd/0`` in that moment, and copy with ``tee(2)`` what the host sends next
(the spare's secret, the kernel socket's token), or ptrace it. Linux starts a process
non-dumpable when the file it executes is not readable by it. So the host puts a copy of
the python3 the sandbox's PATH finds beside it, owned by root, mode 0711: the sandbox's
user may execute it, not read it.

All of it goes through the engine's archive API; no process in the sandbox takes part,
so none can steer it (a root process there would run whatever python3 the user may own,
as in images whose Python prefix is the user's). The engine resolves each path inside
the container; it is used only where every folder on the way belongs to root and no
one else may write it, so nothing the sandbox does can swap a folder mid-call
(CVE-2018-15664), and nothing it could change is what we copy or where.
"""

from __future__ import annotations

import io
import posixpath
import tarfile

from .wire import EngineCalls

HEAD = 4096  # enough of a tar for its first entry's headers (a long name takes two)
LIMIT = 128 << 20  # a python3 larger than this is not one we copy
LINKS = 8  # symbolic links followed to python3's program, at most


def first_entry(
    engine: EngineCalls, container_id: str, path: str, limit: int = HEAD
) -> tarfile.TarInfo | None:
    """The tar entry of ``path`` itself (None when the tar holds none)."""
    data = engine.get_archive(container_id, path, limit)
    try:
        with tarfile.open(fileobj=io.BytesIO(data), mode="r|") as tar:
            return tar.next()
    except tarfile.TarError:
        return None


def root_only(entry: tarfile.TarInfo | None) -> bool:
    """Whether the sandbox's user can change what ``entry`` is: not if root owns it and
    neither its group nor others may write it."""
    return entry is not None and entry.uid == 0 and not entry.mode & 0o022


def folders_root_only(
    engine: EngineCalls, container_id: str, folder: str, checked: set[str]
) -> bool:
    """Whether ``folder`` and every folder above it are real folders only root changes;
    those found so go into ``checked``, and the walk up ends at one already there (each
    look is an engine call: a link's folder is often the program's)."""
    path, seen = folder, []
    while path not in checked:
        entry = first_entry(engine, container_id, path)
        if entry is None or not entry.isdir() or not root_only(entry):
            return False
        seen.append(path)
        if path == "/":
            break
        path = posixpath.dirname(path)
    checked.update(seen)
    return True


def program_of(engine: EngineCalls, container_id: str, path: str) -> str:
    """The program ``path`` leads to through its symbolic links, when nothing on the way
    is the sandbox user's to change: each link's folders and the program's are real
    folders only root changes (so ``..`` in a link means what the kernel takes it to),
    and the program is root's and anyone may run it. "" otherwise, or when the links
    go on too long."""
    checked: set[str] = set()
    for _ in range(LINKS):
        if not folders_root_only(engine, container_id, posixpath.dirname(path), checked):
            return ""
        entry = first_entry(engine, container_id, path)
        if entry is None:
            return ""
        if entry.isfile():
            return path if root_only(entry) and entry.mode & 0o005 == 0o005 else ""
        if not entry.issym():
            return ""
        path = posixpath.normpath(posixpath.join(posixpath.dirname(path), entry.linkname))
    return ""


def unreadable_copy(engine: EngineCalls, container_id: str, program: str, name: str) -> bytes:
    """A tar of ``program``'s bytes as ``name``: root's, mode 0711; b"" when it is not
    a file only root changes, or no ELF program (a script is read by its interpreter)."""
    data = engine.get_archive(container_id, program, LIMIT)
    try:
        with tarfile.open(fileobj=io.BytesIO(data)) as tar:
            entry = tar.next()
            if entry is None or not entry.isfile() or not root_only(entry):
                return b""
            source = tar.extractfile(entry)
            content = source.read() if source is not None else b""
    except tarfile.TarError:  # cut short: larger than LIMIT
        return b""
    if len(content) != entry.size or not content.startswith(b"\x7fELF"):
        return b""
    copy = tarfile.TarInfo(name)
    copy.size, copy.mode, copy.mtime = len(content), 0o711, entry.mtime
    copy.uid = copy.gid = 0
    out = io.BytesIO()
    with tarfile.open(fileobj=out, mode="w") as tar:
        tar.addfile(copy, io.BytesIO(content))
    return out.getvalue()


def is_copy(entry: tarfile.TarInfo | None, tar: bytes) -> bool:
    """Whether ``entry`` already is the copy ``tar`` holds (root's, 0711, the same size
    and time): it is then not written again, since kernels may be starting from it."""
    with tarfile.open(fileobj=io.BytesIO(tar)) as made:
        want = made.next()
    return (
        entry is not None
        and want is not None
        and entry.isfile()
        and entry.uid == 0
        and entry.mode & 0o7777 == 0o711
        and (entry.size, int(entry.mtime)) == (want.size, int(want.mtime))
    )
