"""How a local sandbox's disk is bounded: its workspace, and its own files.

Two bounds, each the flavor's ``disk``, both disk images of :mod:`..disks` (sparse
ext4 files in ``<state_dir>/disks/``, root only, loop-mounted by the host):

* **the workspace** (``<workspace_root>/<user id>``, shared by all of a user's
  sandboxes and kept when they go) gets an image mounted over that very folder, so
  the server's file routes, every sandbox of the user and the host all see one
  bounded file system. It is made before the first process of a sandbox made since
  disk bounds came, when the folder is empty (a folder holding files is left as it is:
  mounting would hide them; listings say so) and no running sandbox of the user has the
  plain folder.
  It grows to the largest flavor that uses it and never shrinks.
* **the sandbox's own files** (its home, where ``pip install --user`` lands, and its
  ``/tmp``) live in ``<state_dir>/local/<id>/own``, over which an image of its own is
  mounted before its home and ``/tmp`` are made there; it goes when the sandbox does.
  Its name is the record's ``engine_id``, unique to this sandbox, never the id that a
  later sandbox may take again. Sandboxes made before keep their files beside their
  record, unbounded.

Both are mounted before any process of the sandbox runs, again when its first process
starts after a reboot (which drops mounts), and before the host uses a workspace
itself (:meth:`LocalDisks.workspace_ready`). The sandbox sees them through the same
idmapped mounts as before: their roots belong to root on disk, which is the sandbox's
own user inside, as a Docker sandbox's disk belongs to its user. Only a server running
as root can mount images (:func:`..disks.support` says why not elsewhere): otherwise
the sandbox runs unbounded and its listing says why.
"""

from __future__ import annotations

import errno
import logging
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from ...units import format_size
from .. import disks
from ..base import SandboxFailed

log = logging.getLogger("sandbox_kernel")

OWN = "own"  # <state>/local/<id>/own: the folder of its home and /tmp, over which its disk goes
OLD_WORKSPACE = (
    "the workspace held files before disk bounds came, and mounting a disk over it would "
    "hide them: move them out (or into a new sandbox's /workspace) and empty it; it is "
    "bounded from the next sandbox made"
)
NO_ONLINE_GROWTH = "this server may not grow a mounted disk: it lacks CAP_SYS_RESOURCE"
RELEASE_SECONDS = 5.0  # how long a destroy waits for its disk's loop device to let go


def own_folder(root: Path, record: dict[str, Any]) -> Path:
    """The folder holding the sandbox's home and /tmp: ``own`` for sandboxes made since
    disk bounds came (their disk goes over it), the sandbox's folder for older ones."""
    folder = root / record["id"]
    return folder / OWN if record.get(OWN) else folder


class LocalDisks:
    """The disk bounds of one installation's local sandboxes (``root``: its records)."""

    def __init__(self, state_dir: str, root: Path) -> None:
        self.images = disks.DiskImages(state_dir)
        self.root = root

    @staticmethod
    def reason() -> str:
        """Why this host cannot bound local sandboxes' disks ("" when it can)."""
        support = disks.support()
        return "" if support.ok else support.reason

    def bound_note(self) -> str:
        """Why new sandboxes' disks are not bounded here, in one line ("" when they are)."""
        why = self.reason()
        return f"{why} (neither workspaces nor sandboxes' own files are bounded)" if why else ""

    # -- mounting -----------------------------------------------------------------------
    def prepare(
        self, record: dict[str, Any], *, first: bool, plain_in_use: Callable[[], bool]
    ) -> None:
        """Before any process of the sandbox runs (its making, ``first``, and each first
        process after it ran none): its disks mounted, made where there are none yet
        (its maker may have died before it made them), and grown where a resize had to
        wait for nothing to use them. The workspace's first disk goes only over an empty
        folder, and waits while ``plain_in_use()`` says a running sandbox of the user
        has the plain folder (a disk over it then would split the workspace in two)."""
        size = int(record.get("disk") or 0)
        if self.reason() or not size:
            return
        user_id, workspace = _user_id(record), Path(record["workspace"])
        exists = self.images.image(disks.WORKSPACE, user_id).exists()
        try:
            if exists:  # (a new sandbox's flavor may be larger: its making grows it)
                self.images.mount(disks.WORKSPACE, user_id, size if first else 0, workspace)
            elif not plain_in_use():
                self.images.mount(disks.WORKSPACE, user_id, size, workspace, only_if_empty=True)
            if record.get(OWN):
                own = own_folder(self.root, record)
                self.images.mount(disks.SANDBOX, record["engine_id"], size, own)
                if self.images.pending(disks.SANDBOX, record["engine_id"]):
                    self.images.settle(disks.SANDBOX, record["engine_id"], own)
        except disks.DiskError as exc:
            if exc.errno == errno.EBUSY and "another file system" in str(exc):
                return  # the administrator's own mount, which bounds it if anything
            raise SandboxFailed(f"cannot bound the disk of {record['id']}: {exc}") from None
        except OSError as exc:
            raise SandboxFailed(
                f"cannot bound the disk of {record['id']}: {exc.strerror or exc}"
            ) from None

    def settle_workspace(self, record: dict[str, Any], quiet: Callable[[], bool]) -> None:
        """Give the workspace's disk a size it was given while in use, when ``quiet()``
        says no sandbox of its user runs a process."""
        user_id = _user_id(record)
        if self.reason() or not self.images.pending(disks.WORKSPACE, user_id):
            return
        if quiet() and not self.images.settle(disks.WORKSPACE, user_id, Path(record["workspace"])):
            log.info("workspace %s is in use: its disk grows later", record["workspace"])

    def workspace_ready(self, user_id: str, folder: Path) -> None:
        """Before the host uses a workspace itself: its disk mounted (after a reboot)."""
        if self.reason() or not self.images.image(disks.WORKSPACE, user_id).exists():
            return
        try:
            self.images.mount(disks.WORKSPACE, user_id, 0, folder)
        except OSError as exc:
            raise SandboxFailed(
                f"cannot mount the workspace {folder}: {exc.strerror or exc}"
            ) from None

    def resize(
        self, record: dict[str, Any], size: int, idle: bool, quiet: Callable[[], bool]
    ) -> None:
        """A larger flavor: both disks grow, at once where the host can grow a mounted
        disk or nothing uses them (``idle``: no process of the sandbox runs; ``quiet()``:
        none of its user's other sandboxes'), else before the sandbox's next first
        process (the workspace's: before one once none of its user's runs); never
        smaller."""
        if self.reason() or not size:
            return
        engine_id, user_id = record["engine_id"], _user_id(record)
        try:
            own = self.images.image(disks.SANDBOX, engine_id)
            if (
                record.get(OWN)
                and own.exists()
                and not self.images.grow(disks.SANDBOX, engine_id, size)
            ):
                if idle:
                    self.images.settle(disks.SANDBOX, engine_id, own_folder(self.root, record))
            if self.images.image(disks.WORKSPACE, user_id).exists():
                self.images.grow(disks.WORKSPACE, user_id, size)
                self.settle_workspace(record, lambda: idle and quiet())
        except OSError as exc:
            raise SandboxFailed(f"cannot grow the disk of {record['id']}: {exc}") from None

    def release(self, record: dict[str, Any]) -> None:
        """When the sandbox is destroyed (its processes ended): its own disk goes."""
        if record.get(OWN):
            self._unmount_and_remove(own_folder(self.root, record), record["engine_id"])

    def sweep(self, live: set[str], orphans: list[Path]) -> None:
        """Remove the disks of sandboxes whose record is gone: those still mounted in the
        folders ``orphans`` (of sandboxes whose destroy died half-way), and the rest."""
        if self.reason():
            return
        images = {target: image for image, target in disks.mount_points()}
        for folder in orphans:
            image = Path(images.get(str(folder / OWN), ""))
            if image.parent == self.images.folder / disks.SANDBOX:
                self._unmount_and_remove(folder / OWN, image.stem)
        self.images.sweep(disks.SANDBOX, live)

    def _unmount_and_remove(self, folder: Path, name: str) -> None:
        """Take the disk ``name`` off ``folder`` and delete it once its loop device has
        let go (at once, unless a process still inside keeps it: then the sweep)."""
        disks.unmount(folder)
        if not self.images.image(disks.SANDBOX, name).exists():
            return
        deadline = time.monotonic() + RELEASE_SECONDS
        while True:
            try:
                self.images.remove(disks.SANDBOX, name)
                return
            except OSError as exc:
                if exc.errno != errno.EBUSY or time.monotonic() > deadline:
                    log.info("disk %s kept for now: %s", name, exc)
                    return
            time.sleep(0.02)  # a detached mount's device goes once its last user has

    # -- listings -----------------------------------------------------------------------
    def describe(self, record: dict[str, Any], limits: dict[str, Any]) -> str:
        """The sandbox's disk limits, put into ``limits`` (the sizes bounding it now),
        and its disk note: what is not bounded, or grows later, and why."""
        user_id = _user_id(record)
        own_why = ws_why = ""
        growing = []
        if not record.get(OWN):
            own_why = "it was made before disk bounds"
        elif not record.get("disk"):
            own_why = "its flavor has no disk size"
        else:
            fs = disks.fs_size(self.images.image(disks.SANDBOX, record["engine_id"]))
            if fs:
                limits["disk"] = fs
                wanted = self.images.size(disks.SANDBOX, record["engine_id"])
                if wanted > fs:
                    growing.append(f"its disk grows to {format_size(wanted)} at its next start")
            else:
                own_why = self.reason() or "its disk is missing"
        fs = disks.fs_size(self.images.image(disks.WORKSPACE, user_id))
        if fs:
            limits["workspace_disk"] = fs
            wanted = self.images.size(disks.WORKSPACE, user_id)
            if wanted > fs:
                growing.append(
                    f"its workspace's to {format_size(wanted)} when none of its user's "
                    "sandboxes runs"
                )
        else:
            ws_why = self.reason() or OLD_WORKSPACE
        notes = [f"{', '.join(growing)} ({NO_ONLINE_GROWTH})"] if growing else []
        if own_why and own_why == ws_why:
            notes.append(f"not bounded: {own_why}")
        else:
            notes += [f"its own files are not bounded: {own_why}"] if own_why else []
            notes += [f"its workspace is not bounded: {ws_why}"] if ws_why else []
        return "; ".join(notes)

    def usage(self, records: list[dict[str, Any]]) -> dict[str, dict[str, int]]:
        """Bytes used on each sandbox's disk and its workspace's, where each is an image
        (from this host's mounts), running or not."""
        found: dict[str, dict[str, int]] = {}
        mounts = disks.mounted()
        for record in records:
            for key, kind, name in (
                ("disk", disks.SANDBOX, record["engine_id"] if record.get(OWN) else ""),
                ("workspace_disk", disks.WORKSPACE, _user_id(record)),
            ):
                where = mounts.get(str(self.images.image(kind, name))) if name else None
                use = disks.usage(where) if where else None
                if use is not None:
                    found.setdefault(record["id"], {})[key] = use.used
        return found

    def workspace_image(self, record: dict[str, Any]) -> str:
        """The image of the sandbox's workspace, when disks bound it here ("" if not)."""
        if self.reason():
            return ""
        return str(self.images.image(disks.WORKSPACE, _user_id(record)))


def _user_id(record: dict[str, Any]) -> str:
    """The workspace's folder name: the user's id (see :class:`~...identity.ScopeKey`)."""
    return Path(record["workspace"]).name
