"""How a Docker sandbox's disk is bounded: its workspace, and its own files.

Two bounds, each the flavor's ``disk`` (see :mod:`..disks`):

* **the workspace** (``<workspace_root>/<user id>``, shared by all of a user's
  sandboxes and kept when they go) is a disk image mounted over that very folder, so
  the server's file routes, every sandbox of the user and the host all see one bounded
  file system. It grows to the largest flavor that uses it and never shrinks. A folder
  that already holds files (from before disk bounds) is left as it is: mounting would
  hide them; listings say so.
* **the sandbox's own files** (its home with ``pip install --user``, /tmp, anything
  outside the workspace) live in the container's writable layer. With the engine's
  overlay2 driver on this host, that layer's folder gets a disk image of its own,
  mounted over it between create and start: Docker keeps using the folder as it is, so
  snapshots (``docker commit``), stop and start work unchanged, and ``docker rm``
  unmounts it. Where the engine's storage driver bounds a container itself (btrfs, zfs,
  overlay2 on xfs with project quotas), ``--storage-opt size`` is used instead; it
  cannot grow afterwards.

Where neither works (a server that is not root, an engine on another host), the
sandbox runs unbounded and :attr:`~..base.SandboxInfo.disk_note` says why.
"""

from __future__ import annotations

import errno
import logging
import os
import subprocess
from collections.abc import Callable
from pathlib import Path
from typing import Any

from ...errors import SandboxFailed
from ...identity import ScopeKey
from ...units import format_size
from .. import disks
from ..base import (
    LABEL_INSTALLATION,
    LABEL_MANAGED,
    LABEL_USER_ID,
    LABEL_WORKSPACE,
    EngineSettings,
    SandboxInfo,
)
from .errors import engine_errors, engine_reason
from .info import LABEL_DISK, LABEL_WORKSPACE_DISK, Inspected
from .wire import EngineCalls

log = logging.getLogger(__name__)

IMAGE = "image"  # LABEL_DISK's way: a disk image over the layer's folder
STORAGE_OPT = "storage-opt"  # the engine's own bound (--storage-opt size)
# Storage drivers whose --storage-opt size bounds a container (overlay2 only on xfs
# mounted with project quotas, which the engine's info does not say: tried, and
# dropped when refused).
SIZED_DRIVERS = ("btrfs", "zfs")
NO_ONLINE_GROWTH = "this server may not grow a mounted disk: it lacks CAP_SYS_RESOURCE"
OLD_WORKSPACE = (
    "the workspace held files before disk bounds came, and mounting a disk over it would "
    "hide them: move them out (or into a new sandbox's /workspace) and empty it; it is "
    "bounded from the next sandbox made"
)


def disk_label(how: str, size: int) -> str:
    """LABEL_DISK's value: the way the sandbox's own files are bounded, and the size."""
    return f"{how}:{size}" if how else ""


def read_label(labels: dict[str, str]) -> tuple[str, int]:
    """(way, size at creation) from LABEL_DISK; ("", 0): made unbounded."""
    how, _, size = labels.get(LABEL_DISK, "").partition(":")
    return (how, int(size)) if size.isdigit() else ("", 0)


class DockerDisks:
    """The disk bounds of one installation's Docker sandboxes (host side)."""

    def __init__(
        self,
        settings: EngineSettings,
        engine: Callable[[], EngineCalls],
        local_engine: Callable[[], bool],
        release_views: Callable[[str], object],
    ) -> None:
        self.settings = settings
        self.images = disks.DiskImages(settings.state_dir)
        self._engine = engine
        self._local = local_engine  # whether the engine is this host's (it mounts our folders)
        self._release_views = release_views  # a container's idmapped mounts, by its name
        self._storage_opt_refused = ""  # why the engine refused --storage-opt, once it did

    # -- what bounds what -------------------------------------------------------------
    def unbounded_reason(self) -> str:
        """Why this host cannot mount disk images for its sandboxes ("" when it can)."""
        if not self._local():
            return "the engine is not on this host, which cannot mount a disk into its sandboxes"
        support = disks.support()
        return "" if support.ok else support.reason

    def layer_way(self, driver: dict[str, Any]) -> str:
        """How a new sandbox's own files are bounded, from the engine's info: IMAGE,
        STORAGE_OPT or "" (not at all)."""
        name = driver.get("Driver", "")
        if name == "overlay2" and not self.unbounded_reason():
            return IMAGE
        backing = dict(driver.get("DriverStatus") or []).get("Backing Filesystem", "")
        if name in SIZED_DRIVERS or (name == "overlay2" and backing == "xfs"):
            return "" if self._storage_opt_refused else STORAGE_OPT
        return ""

    def layer_reason(self, driver: dict[str, Any]) -> str:
        """Why a new sandbox's own files are not bounded ("" when they are)."""
        if self.layer_way(driver):
            return ""
        if self._storage_opt_refused:
            return f"the engine refused --storage-opt size ({self._storage_opt_refused})"
        return self.unbounded_reason() or (
            f"the engine's storage driver ({driver.get('Driver') or '?'}) cannot bound a "
            "container's files"
        )

    def bound_note(self, driver: dict[str, Any]) -> str:
        """Why new sandboxes' disks are not bounded here, in one line ("" when they are)."""
        everything = self.unbounded_reason()
        if everything:
            return f"{everything} (neither workspaces nor sandboxes' own files are bounded)"
        own = self.layer_reason(driver)
        return f"sandboxes' own files: {own}" if own else ""

    def create_container(self, name: str, sandbox_id: str, config: dict[str, Any]) -> str:
        """Create the container; where the engine refuses --storage-opt after all (overlay2
        on xfs without project quotas), again without it, and new ones go without."""
        try:
            with engine_errors(f"create {sandbox_id}", refused=SandboxFailed):
                return self._engine().create_container(name, config)
        except SandboxFailed as exc:
            if "StorageOpt" not in config["HostConfig"] or "storage" not in str(exc).lower():
                raise
            self._storage_opt_refused = engine_reason(exc)
            log.warning("the engine refused --storage-opt size: sandboxes' own files are unbounded")
        del config["HostConfig"]["StorageOpt"]
        config["Labels"][LABEL_DISK] = ""
        with engine_errors(f"create {sandbox_id}", refused=SandboxFailed):
            return self._engine().create_container(name, config)

    def containers_of(self, user_id: str, running: bool = False) -> list[dict[str, Any]]:
        """The containers of one user (by id) of this installation, or the running ones."""
        filters = {
            "label": [
                f"{LABEL_MANAGED}=1",
                f"{LABEL_INSTALLATION}={self.settings.installation}",
                f"{LABEL_USER_ID}={user_id}",
            ]
        }
        if running:
            filters["status"] = ["running"]
        with engine_errors("list sandboxes"):
            return self._engine().list_containers(filters)

    def quiet(self, user_id: str) -> bool:
        """Whether no sandbox of the user runs; then their idmapped views of the
        workspace are taken down too (each start remakes its own), so that nothing
        but the host's own mount holds the workspace's disk while it grows offline."""
        mine = self.containers_of(user_id)
        if any(c.get("State") in ("running", "restarting", "paused", "created") for c in mine):
            return False  # ("created": another process may be starting it right now)
        for summary in mine:
            self._release_views((summary.get("Names") or ["/?"])[0].lstrip("/"))
        return True

    def remount(self, container: Inspected) -> Path | None:
        """The disks of a container about to start, mounted (and grown where a resize had
        to wait for this); the workspace folder when a disk is mounted over it."""
        labels = container.labels
        user_id, folder = labels.get(LABEL_USER_ID, ""), labels.get(LABEL_WORKSPACE, "")
        self.remount_layer(container)
        if not (user_id and folder):
            return None
        workspace = Path(folder)
        self.remount_workspace(user_id, workspace)
        self.settle_workspace(user_id, workspace, lambda: self.quiet(user_id))
        mounted = self.images.mounted_at(disks.WORKSPACE, user_id, workspace)
        return workspace if mounted else None

    def resize(self, container: Inspected, size: int) -> None:
        """A larger flavor: the container's disk and its workspace's grow (at once where
        the host can grow a mounted disk, else when nothing uses them); never smaller."""
        self.grow(container, size)
        user_id, folder = (
            container.labels.get(LABEL_USER_ID, ""),
            container.labels.get(LABEL_WORKSPACE, ""),
        )
        if user_id and folder:
            self.grow_workspace(user_id, size)
            self.settle_workspace(user_id, Path(folder), lambda: self.quiet(user_id))

    # -- the workspace -----------------------------------------------------------------
    def bound(self, user_id: str, folder: Path, size: int, owner: tuple[int, int] | None) -> str:
        """Mount (or grow) the workspace's disk over ``folder``; "" when bounded, else
        why not. Before the first mount, a running sandbox made before disk bounds has
        the plain folder: a disk over it then would split the workspace in two."""
        reason = self.unbounded_reason()
        if reason or not size:
            return reason or "its flavor has no disk size"
        first = not self.images.image(disks.WORKSPACE, user_id).exists()
        running = self.containers_of(user_id, running=True) if first else []
        if any((c.get("Labels") or {}).get(LABEL_WORKSPACE_DISK) != "1" for c in running):
            return "a sandbox that has the plain folder mounted is running with this workspace"
        try:
            mounted = self.images.mount(
                disks.WORKSPACE, user_id, size, folder, owner=owner, only_if_empty=first
            )
        except disks.DiskError as exc:
            if exc.errno != errno.EBUSY:
                raise SandboxFailed(f"cannot bound the workspace {folder}: {exc}") from None
            return f"{exc.strerror}: the administrator's own mount, which bounds it if anything"
        except OSError as exc:
            raise SandboxFailed(
                f"cannot bound the workspace {folder}: {exc.strerror or exc}"
            ) from None
        if not mounted:
            return OLD_WORKSPACE
        return ""

    def remount_workspace(self, user_id: str, folder: Path) -> None:
        """Before a start: the workspace's disk over its folder again (a reboot drops
        mounts), when it has one."""
        if self.unbounded_reason():
            return
        if not self.images.image(disks.WORKSPACE, user_id).exists():
            return
        try:
            self.images.mount(disks.WORKSPACE, user_id, 0, folder)
        except OSError as exc:
            raise SandboxFailed(
                f"cannot mount the workspace {folder}: {exc.strerror or exc}"
            ) from None

    def settle_workspace(self, user_id: str, folder: Path, idle: Callable[[], bool]) -> None:
        """Give a workspace whose disk was made larger its new size, when ``idle()``
        says no sandbox of its user runs (and has let go of it): the host could not
        grow it mounted."""
        if self.images.pending(disks.WORKSPACE, user_id) and idle():
            if not self.images.settle(disks.WORKSPACE, user_id, folder):
                log.info("workspace %s is in use: its disk grows later", folder)

    # -- the sandbox's own files --------------------------------------------------------
    def bound_layer(self, container: Inspected, size: int) -> None:
        """Mount a new disk image over a just-created container's writable layer, with
        what Docker keeps there copied in first (``container``: a full inspect)."""
        layer = _layer_folder(container)
        try:
            self.images.mount(disks.SANDBOX, container.id, size, layer, fill=_copy_from(layer))
        except OSError as exc:
            raise SandboxFailed(
                f"cannot bound the disk of {container.name}: {exc.strerror or exc}"
            ) from None

    def remount_layer(self, container: Inspected) -> None:
        """Before a start: the container's disk over its layer (again), grown offline
        to the size it was given while it could not be grown mounted."""
        how, size = read_label(container.labels)
        if how != IMAGE or self.unbounded_reason():
            return
        if not self.images.image(disks.SANDBOX, container.id).exists():
            if container.status == "created":  # made by a process that stopped right after
                self.bound_layer(container, size)
                return
            raise SandboxFailed(
                f"the disk of {container.name} is gone from {self.images.folder}; destroy the "
                "sandbox (`sandbox-kernel destroy ID`, the workspace is kept) and start again"
            )
        layer = _layer_folder(container)
        try:
            self.images.mount(disks.SANDBOX, container.id, 0, layer)
            if self.images.pending(disks.SANDBOX, container.id):
                self.images.settle(disks.SANDBOX, container.id, layer)
        except OSError as exc:
            raise SandboxFailed(f"cannot mount the disk of {container.name}: {exc}") from None

    def grow(self, container: Inspected, size: int) -> None:
        """A larger flavor: the container's disk grows (at once where the host can grow
        a mounted disk, else at its next start); it never shrinks."""
        if read_label(container.labels)[0] != IMAGE or self.unbounded_reason():
            return
        try:
            self.images.grow(disks.SANDBOX, container.id, size)
            if container.status != "running" and self.images.pending(disks.SANDBOX, container.id):
                self.images.settle(disks.SANDBOX, container.id, _layer_folder(container))
        except OSError as exc:
            raise SandboxFailed(f"cannot grow the disk of {container.name}: {exc}") from None

    def grow_workspace(self, user_id: str, size: int) -> None:
        """The workspace's disk made at least ``size`` (online where the host can)."""
        if self.unbounded_reason() or not self.images.image(disks.WORKSPACE, user_id).exists():
            return
        try:
            self.images.grow(disks.WORKSPACE, user_id, size)
        except OSError as exc:
            raise SandboxFailed(f"cannot grow the workspace's disk: {exc}") from None

    def release(self, container_id: str) -> None:
        """After ``docker rm``: the container's disk image goes with it."""
        if not container_id or not self.images.image(disks.SANDBOX, container_id).exists():
            return
        try:
            self.images.remove(disks.SANDBOX, container_id)
        except OSError as exc:  # still mounted: the sweep takes it once it is not
            log.info("disk of %s kept for now: %s", container_id[:12], exc)

    def sweep(self, live: set[str]) -> None:
        """Remove the disk images of containers that are gone (removed behind our back)."""
        if not self.unbounded_reason():
            self.images.sweep(disks.SANDBOX, live)

    # -- listings ----------------------------------------------------------------------
    def describe(self, info: SandboxInfo, labels: dict[str, str]) -> SandboxInfo:
        """``info`` with its disk limits and note (from its container's ``labels``): the
        sizes bounding it now (a resize grows them), what is not bounded, and why."""
        how, size = read_label(labels)
        user_id = labels.get(LABEL_USER_ID, "")
        own = ws_why = ""  # why its own files, and its workspace, are not bounded
        growing = []
        if how == IMAGE:
            fs = disks.fs_size(self.images.image(disks.SANDBOX, info.engine_id))
            info.limits["disk"] = fs or size
            wanted = self.images.size(disks.SANDBOX, info.engine_id)
            if fs and wanted > fs:
                growing.append(f"its disk grows to {format_size(wanted)} at its next start")
        elif how == STORAGE_OPT:
            info.limits["disk"] = size
        elif LABEL_DISK not in labels:
            own = "it was made before disk bounds"
        else:
            own = (
                self.unbounded_reason()
                or self._storage_opt_refused
                or "the engine's storage driver cannot bound a container's files"
            )
        if info.workspace and user_id:
            ws = disks.fs_size(self.images.image(disks.WORKSPACE, user_id))
            wanted = self.images.size(disks.WORKSPACE, user_id)
            if ws:
                info.limits["workspace_disk"] = ws
                if wanted > ws:
                    growing.append(
                        f"its workspace's to {format_size(wanted)} when none of its user's "
                        "sandboxes runs"
                    )
            else:
                ws_why = self.workspace_reason(user_id)
        notes = [f"{', '.join(growing)} ({NO_ONLINE_GROWTH})"] if growing else []
        if own and own == ws_why:
            notes.append(f"not bounded: {own}")
        else:
            notes += [f"its own files are not bounded: {own}"] if own else []
            notes += [f"its workspace is not bounded: {ws_why}"] if ws_why else []
        info.disk_note = "; ".join(notes)
        return info

    def workspace_reason(self, user_id: str) -> str:
        """Why a user's workspace has no disk (when it has none)."""
        return self.unbounded_reason() or OLD_WORKSPACE

    def usage(self, infos: list[SandboxInfo]) -> dict[str, dict[str, int]]:
        """Bytes used on each sandbox's disk and its workspace's where each is an image,
        read from this host's mounts (no engine call), running or not."""
        found: dict[str, dict[str, int]] = {}
        mounts = disks.mounted()
        for info in infos:
            user_id = ScopeKey(info.user).user_id if info.user else ""
            for key, kind, name in (
                ("disk", disks.SANDBOX, info.engine_id),
                ("workspace_disk", disks.WORKSPACE, user_id),
            ):
                where = mounts.get(str(self.images.image(kind, name))) if name else None
                use = disks.usage(where) if where else None
                if use is not None:
                    found.setdefault(info.id, {})[key] = use.used
        return found

    def workspace_ready(self, info: SandboxInfo) -> None:
        """Before the host uses a workspace itself: its disk mounted (after a reboot)."""
        if info.workspace and info.user:
            self.remount_workspace(ScopeKey(info.user).user_id, Path(info.workspace))


def _layer_folder(container: Inspected) -> Path:
    """The folder of the container's writable layer (overlay2's, on this host), as the
    engine's inspect names it; checked to be one."""
    data = (container.attrs.get("GraphDriver") or {}).get("Data") or {}
    upper, work = data.get("UpperDir", ""), data.get("WorkDir", "")
    if not (
        isinstance(upper, str)
        and isinstance(work, str)
        and os.path.isabs(upper)
        and upper.endswith("/diff")
        and os.path.dirname(upper) == os.path.dirname(work)
    ):
        raise SandboxFailed(
            f"the engine did not say where the layer of {container.name} is; cannot bound its disk"
        )
    return Path(os.path.dirname(upper))


def _copy_from(layer: Path) -> Callable[[str], None]:
    """What fills a new disk before it goes over ``layer``: everything Docker keeps in
    that folder, as it is (owners, modes, extended attributes)."""

    def fill(root: str) -> None:
        done = subprocess.run(
            ["cp", "-a", "--", f"{layer}/.", f"{root}/"],
            capture_output=True,
            text=True,
            check=False,
            env={"PATH": disks.PROGRAMS, "LC_ALL": "C"},
        )
        if done.returncode != 0:
            raise disks.DiskError(errno.EIO, f"cannot copy {layer}: {done.stderr.strip()[-300:]}")

    return fill
