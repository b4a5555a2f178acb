"""The notebook's folder for sandboxes that cannot mount it (Daytona: no host folder).

A remote sandbox sees only its workspace volume, so the folder beside the notebook is
copied in when the kernel starts and what changed there is copied back when the
kernel shuts down cleanly: ``jupyter execute report.ipynb`` reads ``data.csv`` beside
it and leaves ``out.csv`` beside it, as with Docker. Cells start in the copy,
``/workspace/.sk-folders/<hash>``. Bounded both ways (files and bytes) and never a
link or a dot-entry; what comes back from the sandbox is written through
:mod:`.safefs` (no link followed on the host, whole files or nothing). What a kernel
killed hard wrote is not copied back; it stays in the copy in the workspace.
"""

from __future__ import annotations

import json
import os
import stat
from dataclasses import dataclass, field
from pathlib import Path, PurePosixPath
from typing import Any

from .agent import program
from .backends import Backend
from .backends.base import WORKSPACE
from .config import SandboxConfig
from .folders import folder_tag
from .safefs import Beneath

MAX_FILES = 2_000
MAX_BYTES = 200 << 20
MAX_FILE = 50 << 20


def wanted(cfg: SandboxConfig, backend: Backend | type[Backend]) -> bool:
    """Whether kernels copy their notebook's folder in and back: the backend has no host
    folders and work folders are not off (the kernel's session and its provisioner ask)."""
    return cfg.work_root != "none" and not backend.workspace_on_host


@dataclass
class FolderCopy:
    """A host folder copied into a sandbox, and what it held after the copy."""

    host: Path
    remote: str
    seen: dict[str, tuple[int, float]] = field(
        default_factory=dict
    )  # rel -> (size, mtime) in the sandbox
    skipped: list[str] = field(default_factory=list)


def remote_folder(host: Path) -> str:
    return str(PurePosixPath(WORKSPACE, ".sk-folders", folder_tag(str(host.resolve()))))


def push(backend: Backend, sandbox_id: str, host: Path) -> FolderCopy:
    """Copy ``host`` (regular files, no dot-entries, bounded) into the sandbox."""
    copy = FolderCopy(host=host, remote=remote_folder(host))
    files, total = 0, 0
    for top, dirs, names in os.walk(host):
        dirs[:] = sorted(
            d for d in dirs if not d.startswith(".") and not os.path.islink(os.path.join(top, d))
        )
        for name in sorted(names):
            if name.startswith("."):
                continue
            path = Path(top, name)
            try:
                st = path.lstat()
            except OSError:
                continue
            rel = str(path.relative_to(host))
            if (
                not stat.S_ISREG(st.st_mode)
                or st.st_size > MAX_FILE
                or files >= MAX_FILES
                or total + st.st_size > MAX_BYTES
            ):
                copy.skipped.append(rel)
                continue
            with path.open("rb") as fh:
                backend.put_file(sandbox_id, f"{copy.remote}/{rel}", fh)
            files, total = files + 1, total + st.st_size
    copy.seen = listing(backend, sandbox_id, copy.remote)
    return copy


def listing(backend: Backend, sandbox_id: str, remote: str) -> dict[str, tuple[int, float]]:
    """rel -> (size, mtime) of the regular files below ``remote`` in the sandbox."""
    result = backend.exec(sandbox_id, program("fs_helper", "walk", remote, ""), cwd="/", timeout=60)
    try:
        answer: Any = json.loads(result.output.decode("utf-8", "replace").strip().splitlines()[-1])
    except (ValueError, IndexError):
        return {}
    found = {}
    for item in answer.get("files", []) if isinstance(answer, dict) else []:
        try:
            rel, size, mtime = str(item[0]), int(item[1]), float(item[2])
        except (TypeError, ValueError, IndexError):
            continue  # what the sandbox says is checked, not trusted
        if not rel.startswith(("/", "..")) and ".." not in PurePosixPath(rel).parts:
            found[rel] = (size, mtime)
    return found


def pull(backend: Backend, sandbox_id: str, copy: FolderCopy) -> list[str]:
    """Copy back what is new or changed in the sandbox's copy; the names copied."""
    now = listing(backend, sandbox_id, copy.remote)
    changed = [
        rel
        for rel, meta in sorted(now.items())
        if copy.seen.get(rel) != meta and meta[0] <= MAX_FILE
    ]
    folder = Beneath(copy.host)
    done, total = [], 0
    for rel in changed[:MAX_FILES]:
        size = now[rel][0]
        if total + size > MAX_BYTES:
            break
        upload = folder.start_write(rel)
        try:
            for chunk in backend.get_file(sandbox_id, f"{copy.remote}/{rel}"):
                upload.write(chunk)
            upload.commit()
        finally:
            upload.abort()  # nothing left behind if the copy failed half-way
        done.append(rel)
        total += size
    copy.seen = now
    return done
