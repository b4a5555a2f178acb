"""Who a Docker sandbox runs as, and how host folders (the workspace, the notebook's
work folder, the administrator's mapped folders) are mounted in it so that it can write
them and no host file changes owner.

* ``same-user``: a server that is not root runs sandboxes as its own uid: files the
  sandbox writes belong to the host user, and nothing changes owner.
* ``idmap``: a root server runs them as the image's non-root user (or 1000) and mounts
  the folders idmapped (:mod:`.idmap`), so root's files look like the sandbox user's
  inside and what the sandbox writes is root's on the host.
* ``chown``: a root server where idmapped mounts do not work hands the workspace to the
  sandbox uid; then that uid is one no host account has, so no host user gains files.

Idmapped mounts live on the host, not in the engine: they are remade before each start
(a reboot drops them) and released when their container goes.

A read-only mapped folder is bound as it is (the host's permissions say what the
sandbox user may read); a writable one is presented like the work folder: idmapped for
a root server, with its protected paths read-only.
"""

from __future__ import annotations

import fcntl
import json
import os
import pwd
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import IO, Any

from ...folders import protect
from ...identity import ScopeKey
from ...safefs import make_folder
from .. import idmap
from ..base import LABEL_WORK_FOLDER, LABEL_WORKSPACE, EngineSettings, SandboxFailed, Spec
from .info import (
    LABEL_MOUNT,
    LABEL_MOUNT_ID,
    LABEL_OWNERSHIP,
    LABEL_UID,
    LABEL_VOLUME_MOUNTS,
    LABEL_WORK_MOUNT,
    LABEL_WORK_MOUNT_ID,
)

DEFAULT_UID = 1000
# Seconds a sandbox's mounts are spared by the sweep after they were made: its container
# is created only after them, so a sweep that listed the engine a moment before would
# otherwise release them under a create in progress.
FRESH = 600.0


def bind_mount(target: str, source: str, read_only: bool = False) -> dict[str, Any]:
    """A host path at ``target`` in the sandbox, as the engine's create request says it."""
    return {"Target": target, "Source": source, "Type": "bind", "ReadOnly": read_only}


class WorkspaceMounts:
    """The host side of one installation's sandbox folders: ownership and idmapped mounts."""

    def __init__(self, settings: EngineSettings) -> None:
        self.settings = settings

    def ownership(self, image: Any) -> tuple[int, int, str]:
        """(uid, gid, how): the sandbox's user, and how its folders become writable to it."""
        if os.geteuid() != 0:
            return os.geteuid(), os.getegid(), "same-user"
        configured = (image.attrs.get("Config", {}) or {}).get("User") or ""
        uid = gid = DEFAULT_UID
        if configured and configured.split(":")[0] not in ("root", "0"):
            parts = configured.split(":")
            uid = int(parts[0]) if parts[0].isdigit() else DEFAULT_UID
            gid = int(parts[1]) if len(parts) > 1 and parts[1].isdigit() else uid
            if self._idmap_works():
                return uid, gid, "idmap"
            return uid, gid, "chown"
        if self._idmap_works():
            return uid, gid, "idmap"
        uid = gid = _unused_host_uid()
        return uid, gid, "chown"

    def _idmap_works(self) -> bool:
        """Whether idmapped mounts work here: probed once per boot and kernel, since the
        probe starts a helper process (30 ms of every sandbox's creation otherwise). The
        answer is kept beside the mounts, in a root-only folder that /run empties at
        boot; it names the kernel it holds for, for a folder outside /run."""
        base = self._base()
        kept = base / ".idmap-probed"
        release = os.uname().release
        try:
            said_release, _, answer = kept.read_text().partition("\n")
            if said_release == release and answer in ("yes", "no"):
                return answer == "yes"
        except OSError:
            pass
        works = idmap.supported(str(base))
        scratch = base / f".idmap-probed.{os.getpid()}"
        try:
            scratch.write_text(f"{release}\n{'yes' if works else 'no'}")
            scratch.replace(kept)
        except OSError:
            pass  # probed again next time
        return works

    def _base(self) -> Path:
        """Where idmapped mounts live: /run (root-only, emptied at boot like the mounts
        themselves), never under a folder a user might delete with ``rm -rf``, which
        would walk into the mount and delete the workspace."""
        if Path("/run").is_dir():
            return Path("/run/sandbox-kernel") / self.settings.installation[:8]
        return Path(self.settings.state_dir) / "mounts"

    def _point(self, name: str, what: str = "workspace") -> Path:
        return self._base() / name / what

    def workspace(
        self,
        key: ScopeKey,
        name: str,
        uid: int,
        gid: int,
        how: str,
        bound: Callable[[Path], object] | None = None,
    ) -> tuple[Path, Path]:
        """(the user's workspace folder, the host path to bind at /workspace);
        ``bound(folder)`` mounts its disk over the folder before anything presents it."""
        root = Path(self.settings.workspace_root)
        workspace = make_folder(root, key.user_id, owner=(uid, gid) if how == "chown" else None)
        if bound is not None:
            bound(workspace)
        if how != "idmap":
            return workspace, workspace
        point = self._point(name)
        self._idmap(workspace, point, uid, gid)
        return workspace, point

    def work_folder(
        self, name: str, spec: Spec, uid: int, gid: int, how: str
    ) -> tuple[list[dict[str, Any]], str]:
        """The work folder at its own path, and its masks; (mounts, idmapped point or "")."""
        if not spec.work_folder:
            return [], ""
        source, point = spec.work_folder, ""
        if how == "idmap":
            point = str(self._point(name, "work"))
            self._idmap(Path(spec.work_folder), Path(point), uid, gid)
            source = point
        mounts = [bind_mount(spec.work_folder, source, read_only=spec.work_read_only)]
        for path, kind in spec.masks:
            inside = source + path[len(spec.work_folder) :]
            if kind == "read-only":
                mounts.append(bind_mount(path, inside, read_only=True))
            elif Path(path).is_dir():
                mounts.append(
                    {"Target": path, "Type": "tmpfs", "TmpfsOptions": {"SizeBytes": 1 << 20}}
                )
            else:
                mounts.append(bind_mount(path, "/dev/null", read_only=True))
        if not spec.work_read_only and os.geteuid() != 0:
            # A root server mounts them at every start, in the container's own namespace
            # (see protect.py); this server cannot: they are those of the folder as it is now.
            hidden = [path for path, _ in spec.masks]
            found = protect(spec.work_folder, list(self.settings.protected_paths), hidden)
            for mask in found.masks:
                inside = source + mask.path[len(spec.work_folder) :]
                mounts.append(bind_mount(mask.path, inside, read_only=mask.how == "read-only"))
        return mounts, point

    def volumes(
        self, name: str, spec: Spec, uid: int, gid: int, how: str
    ) -> tuple[list[dict[str, Any]], str]:
        """The mapped folders (``spec.volumes``) at their places; (mounts, the label that
        lets :meth:`remount` remake their idmapped mounts: "" for none)."""
        mounts: list[dict[str, Any]] = []
        idmapped: list[list[str]] = []
        for index, volume in enumerate(spec.volumes):
            if not volume.writable:
                mounts.append(bind_mount(volume.target, volume.source, read_only=True))
                continue
            source = volume.source
            if how == "idmap":
                point = self._point(name, f"vol-{index}")
                self._idmap(Path(volume.source), point, uid, gid)
                source = str(point)
                idmapped.append([volume.source, source, idmap.identity(Path(volume.source))])
            mounts.append(bind_mount(volume.target, source))
            if os.geteuid() != 0:
                # As for the work folder: a root server mounts them at every start.
                found = protect(volume.source, list(self.settings.protected_paths))
                for mask in found.masks:
                    rest = mask.path[len(volume.source) :]
                    mounts.append(
                        bind_mount(
                            volume.target + rest, source + rest, read_only=mask.how == "read-only"
                        )
                    )
        return mounts, json.dumps(idmapped) if idmapped else ""

    def _idmap(self, folder: Path, point: Path, uid: int, gid: int, expect: str = "") -> None:
        """Make (or keep) the idmapped mount; one process at a time per sandbox. With
        ``expect`` ("device:inode"), only of that very folder."""
        with folder_lock(point.parent) as lock:
            os.utime(lock.fileno())  # made now: the sweep spares it for FRESH seconds
            try:
                idmap.mount(folder, point, uid, gid, expect=expect)
            except OSError as exc:
                raise SandboxFailed(
                    f"cannot present the folder {folder} to the sandbox: {exc.strerror or exc}"
                ) from None

    def remount(self, labels: dict[str, str], disk_folder: Path | None = None) -> None:
        """Before a start: idmapped mounts do not survive a reboot, so remake them.
        ``disk_folder``: the workspace, when its disk was just mounted over it by path
        (checked to be ours there): its identity is that disk's now (a loop device's
        number changes with each mount), not the one recorded."""
        if labels.get(LABEL_OWNERSHIP) != "idmap":
            return
        uid, _, gid = labels.get(LABEL_UID, f"{DEFAULT_UID}:{DEFAULT_UID}").partition(":")
        found = [
            (labels.get(source, ""), labels.get(point, ""), labels.get(ident, ""))
            for source, point, ident in (
                (LABEL_WORKSPACE, LABEL_MOUNT, LABEL_MOUNT_ID),
                (LABEL_WORK_FOLDER, LABEL_WORK_MOUNT, LABEL_WORK_MOUNT_ID),
            )
        ]
        try:
            found += [tuple(v) for v in json.loads(labels.get(LABEL_VOLUME_MOUNTS) or "[]")]
        except ValueError:
            pass  # not ours to read: no mapped folder is presented rather than a wrong one
        for source, point, expect in found:
            if source and point:
                if disk_folder is not None and Path(source) == disk_folder:
                    expect = idmap.identity(disk_folder)
                self._idmap(Path(source), Path(point), int(uid), int(gid or uid), expect=expect)

    def release(self, name: str, older_than: float = 0.0) -> bool:
        """Unmount what container ``name`` had (it is gone, or was never made), unless
        its mounts were made less than ``older_than`` seconds ago; whether it did."""
        folder = self._base() / name
        if not folder.is_dir():
            return False
        with folder_lock(folder) as lock:
            if time.time() - os.fstat(lock.fileno()).st_mtime < older_than:
                return False
            for what in ("work", "workspace", *(p.name for p in folder.glob("vol-*"))):
                idmap.unmount(folder / what)
            # The lock file last, while held: whoever waits on it then finds it gone and
            # starts over (see folder_lock), never mounting into a folder being removed.
            remove_mount_folder(folder)
        return True

    def sweep(self, live: set[str]) -> None:
        """Release the mounts of every container not in ``live`` (removed with `docker
        rm`), except those just made for a sandbox whose container is not created yet."""
        base = self._base()
        if not base.is_dir():
            return
        for folder in base.iterdir():
            if folder.is_dir() and not folder.name.startswith(".") and folder.name not in live:
                self.release(folder.name, older_than=FRESH)


def remove_mount_folder(folder: Path) -> None:
    """A sandbox's mount folder, its mounts gone: its lock file, itself, and the
    installation's folder above it when that is left empty."""
    for leftover in (folder / ".lock", folder, folder.parent):
        try:
            leftover.unlink() if leftover.name == ".lock" else leftover.rmdir()
        except OSError:
            pass


@contextmanager
def folder_lock(folder: Path) -> Iterator[IO[str]]:
    """The lock of one sandbox's mount folder, held: one process at a time mounts or
    releases there. Its file's time says when the mounts were last made. A release
    removes the file with the folder: whoever waited on that file tries again."""
    while True:
        folder.mkdir(parents=True, exist_ok=True, mode=0o700)
        try:
            opened = open(folder / ".lock", "a")
        except FileNotFoundError:
            continue  # a release removed the folder in between
        with opened as lock:
            fcntl.flock(lock, fcntl.LOCK_EX)
            try:
                current = os.stat(folder / ".lock").st_ino == os.fstat(lock.fileno()).st_ino
            except FileNotFoundError:
                current = False
            if current:
                yield lock
                return


def _unused_host_uid() -> int:
    """1000 when no host account has it, else the first uid from 100000 that none has:
    what a sandbox writes must never belong to a real host user."""
    for uid in (DEFAULT_UID, *range(100_000, 165_536)):
        try:
            pwd.getpwuid(uid)
        except KeyError:
            return uid
    return 165_536
