"""The host folders a local sandbox's processes see, handed to bubblewrap safely.

A root server stages them (see :mod:`.launch`): the sandbox's own folders (workspace,
home, work folder, writable mapped folders) idmapped through the sandbox's user
namespace, the rest as they are.
Otherwise bubblewrap binds the host paths itself, the workspace and work folder by
descriptors checked to be the folders the sandbox was made with (bubblewrap checks
again that what it mounted is what the descriptor holds).
"""

from __future__ import annotations

import builtins
import logging
import os
import sys
from pathlib import Path, PurePosixPath
from typing import Any

from ...folders import protect
from ...volumes import Volume
from .. import disks, seccomp
from ..base import SHARED, WORKSPACE, SandboxError, SandboxFailed
from .launch import STAGE, detached, make_stage
from .view import HOME, Bind, bwrap_features

log = logging.getLogger("sandbox_kernel")

EXT4_ROOT = 2  # the inode of an ext4 file system's root folder


def folder_binds(
    record: dict[str, Any],
    own: Path,
    workspace: str,
    workspace_image: str,
    etc: str,
    protected: builtins.list[builtins.list[str]],
    mapped: builtins.list[builtins.list[str]],
    userns: int,
    staged: builtins.list[tuple[int, str, bool]],
    kept: builtins.list[int],
    opened: builtins.list[int],
) -> tuple[builtins.list[Bind], str, builtins.list[tuple[str, str, str]]]:
    """The sandbox's folders for bubblewrap: (binds, the folder of its /etc files,
    work folder masks as (path, how, source), outer first). ``own`` holds its home and
    /tmp; ``workspace_image`` is the disk image of its workspace where one bounds it
    (the workspace is then that image's file system, whatever loop device holds it now).
    ``protected`` are the work folder's protected paths and the folders on their way,
    (path, "read-only" | "pin"), as found when the sandbox started (see folders.protect);
    ``mapped`` the same of the writable mapped folders, as the sandbox sees them.

    A root server stages them (see :mod:`.launch`): its own folders idmapped through
    the sandbox's user namespace, the rest as they are. Otherwise bubblewrap binds
    the host paths itself, the workspace and work folder by descriptors checked to
    be the folders the sandbox was made with."""
    ids = record.get("identities") or {}
    work = record.get("work_folder") or ""
    wanted: builtins.list[
        tuple[str, str, str, bool, bool]
    ] = [  # name, host, inside, writable, idmapped
        ("workspace", workspace, WORKSPACE, True, True),
        ("home", str(own / "home"), HOME, True, True),
        ("tmp", str(own / "tmp"), "/tmp", True, True),
    ]
    if record.get("shared_folder"):
        wanted.append(("shared", record["shared_folder"], SHARED, False, False))
    if work and os.path.isdir(work):
        wanted.append(("work", work, work, not record.get("work_read_only"), True))
    volumes = mapped_volumes(record)
    for n, volume in enumerate(volumes):
        wanted.append((f"vol{n}", volume.source, volume.target, volume.writable, volume.writable))
    wanted += python_folders()
    binds: builtins.list[Bind] = []
    root = os.geteuid() == 0
    sources: dict[str, str] = {}
    for name, host, inside, writable, idmapped in wanted:
        expect = ids.get(name, "") if name in ("workspace", "work") else ""
        image = workspace_image if name == "workspace" else ""
        if root:
            fd = detached(host, userns if idmapped else -1, read_only=not writable)
            opened.append(fd)
            check_identity(fd, host, expect, image)
            staged.append((fd, name, True))
            source = f"{STAGE}/{name}"
        elif expect and "--bind-fd" in bwrap_features():
            fd = os.open(host, os.O_PATH | os.O_DIRECTORY | os.O_CLOEXEC)
            opened.append(fd)
            check_identity(fd, host, expect, image)
            kept.append(fd)
            source = f"fd:{fd}"
        else:
            if expect and identity(host) != expect:
                probe = os.open(host, os.O_PATH | os.O_CLOEXEC)
                opened.append(probe)
                check_identity(probe, host, expect, image)
            source = host
        sources[name] = source
        binds.append(Bind(source, inside, writable))
    if root:
        make_stage()
        fd = detached(etc, -1, read_only=True)
        opened.append(fd)
        staged.append((fd, "etc", True))
        etc_folder = f"{STAGE}/etc"
    else:
        etc_folder = etc
    masks: builtins.list[tuple[str, str, str]] = []
    if "work" in sources:
        base = sources["work"] if root else work
        for path, how in [*(record.get("masks") or []), *protected]:
            if how != "hide" and os.path.islink(path):
                how = "hide"  # a link planted where a folder or file was: show nothing
            masks.append((path, how, base + path[len(work) :]))
    for path, how in mapped:
        n, volume = next((n, v) for n, v in enumerate(volumes) if path.startswith(v.target + "/"))
        rest = path[len(volume.target) :]
        if how != "hide" and os.path.islink(volume.source + rest):
            how = "hide"
        masks.append((path, how, (sources[f"vol{n}"] if root else volume.source) + rest))
    masks.sort(key=lambda m: m[0])
    return binds, etc_folder, masks


def mapped_volumes(record: dict[str, Any]) -> tuple[Volume, ...]:
    """The administrator's folders mapped into a local sandbox (its record's)."""
    return tuple(Volume(*given) for given in record.get("volumes") or [] if len(given) == 3)


def python_folders() -> builtins.list[tuple[str, str, str, bool, bool]]:
    """The Python running sandbox-kernel, where /usr does not hold it already, as
    :func:`folder_binds` wants folders: (name, host, inside, writable, idmapped)."""
    return [
        (f"python{n}", prefix, prefix, False, False)
        for n, prefix in enumerate(sorted({sys.prefix, sys.base_prefix}))
        if not prefix.startswith("/usr/") and prefix != "/usr"
    ]


def plain_binds(
    wanted: builtins.list[tuple[str, str, str, bool, bool]],
    staged: builtins.list[tuple[int, str, bool]],
    opened: builtins.list[int],
) -> builtins.list[Bind]:
    """Host folders shown as they are (never idmapped) to a helper of the host under
    bubblewrap: as root staged (see :mod:`.launch`), so that a helper that is not root
    reaches them whatever the folders above them allow; otherwise by path."""
    binds = []
    root = os.geteuid() == 0
    for name, host, inside, writable, _ in wanted:
        source = host
        if root:
            fd = detached(host, -1, read_only=not writable)
            opened.append(fd)
            staged.append((fd, name, True))
            source = f"{STAGE}/{name}"
        binds.append(Bind(source, inside, writable))
    if root:
        make_stage()
    return binds


def identity(path: str) -> str:
    """ "device:inode" of a folder."""
    try:
        st = os.stat(path)
    except OSError:
        return ""
    return f"{st.st_dev}:{st.st_ino}"


def check_identity(fd: int, path: str, expect: str, image: str = "") -> None:
    """Refuse a folder that is not the one the sandbox was made with (another sandbox
    whose folder holds this path may have put a link there meanwhile). With ``image``,
    the root of that disk image's file system is the folder too (a disk mounted over
    the workspace since, or mounted again from another loop device after a reboot)."""
    if not expect:
        return
    st = os.fstat(fd)
    if image and st.st_ino == EXT4_ROOT and disks.image_of(st.st_dev) == image:
        return
    if f"{st.st_dev}:{st.st_ino}" != expect:
        raise SandboxFailed(
            f"{path} is no longer the folder this sandbox was made with (replaced, or a "
            "link): destroy the sandbox (your files stay) and open the notebook again"
        )


def seccomp_fd(opened: builtins.list[int]) -> int:
    """A pipe's read end holding the seccomp program, for ``bwrap --seccomp`` (-1 on an
    architecture :mod:`..seccomp` has no table for)."""
    if not seccomp.supported():
        return -1
    program = seccomp.bpf_program()
    read_end, write_end = os.pipe2(os.O_CLOEXEC)
    opened.append(read_end)
    try:
        os.write(write_end, program)  # a few KiB: a pipe holds it
    finally:
        os.close(write_end)
    return read_end


def protected_paths(
    record: dict[str, Any], paths: tuple[str, ...]
) -> builtins.list[builtins.list[str]]:
    """What host tools trust in the sandbox's writable work folder (``protected_paths``),
    found afresh at each start of the sandbox, before any of its processes runs: each is
    read-only in every process of it, every folder on its way pinned."""
    work = record.get("work_folder") or ""
    if not work or record.get("work_read_only") or not paths:
        return []
    hidden = [path for path, _ in record.get("masks") or []]
    found = protect(work, list(paths), hidden)
    if not found.complete:
        log.warning(
            "sandbox %s: protected paths %s; deeper ones stay writable", record["id"], found.why
        )
    return [[m.path, m.how] for m in found.masks]


def mapped_protected(
    record: dict[str, Any], paths: tuple[str, ...]
) -> builtins.list[builtins.list[str]]:
    """The same of the writable mapped folders, as the sandbox sees them."""
    found = []
    for volume in mapped_volumes(record):
        if volume.writable and paths:
            scanned = protect(volume.source, list(paths))
            for mask in scanned.masks:
                found.append([volume.target + mask.path[len(volume.source) :], mask.how])
    return found


def workspace_relative(path: str) -> str:
    """A path of the sandbox's workspace as one relative to it (``/workspace/a`` or
    ``a``); SandboxError for an absolute path outside it."""
    pure = PurePosixPath(path)
    if pure.is_absolute():
        if not (pure == PurePosixPath(WORKSPACE) or PurePosixPath(WORKSPACE) in pure.parents):
            raise SandboxError(f"{path!r} is outside {WORKSPACE}")
        pure = pure.relative_to(WORKSPACE)
    return str(pure)
