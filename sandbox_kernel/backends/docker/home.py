"""The home folder and the root-owned files (:mod:`.accounts`) a new container gets
before its first start: the image may not have ``/home/sandbox``, and the sandbox user
cannot make it.

Nothing runs in the container yet, so nothing in it can race this. The files go in by
the engine's archive call, or, on a local overlay2 engine run by root, straight into
the container's own layer (:func:`home_in_layer`), which is much cheaper.
"""

from __future__ import annotations

import io
import os
import tarfile
import time
from collections.abc import Callable, Mapping, Sequence
from contextlib import suppress
from typing import Any

from ...trust import bundle as trust_bundle
from ...trust import write_all
from ..base import SandboxNotFound
from .accounts import LIMIT, RootFile, from_archive, from_layers, root_files
from .errors import engine_errors
from .info import LABEL_TRUST, LABEL_UID, Inspected
from .mounts import DEFAULT_UID
from .wire import EngineCalls


class HomeMaker:
    """Puts the home folder and the root files into containers that have not run yet,
    remembering whether this engine's layers can be written directly."""

    def __init__(self, engine: Callable[[], EngineCalls], local: bool, ca_bundle: str) -> None:
        self._engine = engine
        self._local = local  # a local engine: its layers are this host's folders
        self._ca_bundle = ca_bundle
        self._layers_writable: bool | None = None  # None: not known yet

    def prepare(
        self,
        container: Inspected,
        sandbox_id: str,
        reinspect: Callable[[Inspected], Inspected],
        *,
        just_created: bool = False,
    ) -> None:
        """Make the sandbox user's HOME (and the root files) in ``container``.

        Written straight into the layer only for a container this process just created:
        one found "created" may be starting in another process meanwhile, with its layer
        mounted (overlayfs does not allow writing beneath a mount); the engine's archive
        call waits for such a start."""
        text_uid, _, text_gid = container.labels.get(
            LABEL_UID, f"{DEFAULT_UID}:{DEFAULT_UID}"
        ).partition(":")
        uid, gid = int(text_uid), int(text_gid or text_uid)
        ca = b""
        if container.labels.get(LABEL_TRUST) == "copy":  # an engine that cannot mount ours
            ca = trust_bundle(self._ca_bundle)
        if just_created and self._layers_writable is not False and os.geteuid() == 0:
            if "GraphDriver" not in container.attrs:
                container = reinspect(container)
            driver = container.attrs.get("GraphDriver") or {}
            # A local engine whose layers are this host's folders; else never asked again.
            self._layers_writable = self._local and driver.get("Name") == "overlay2"
            if self._layers_writable:
                extra = root_files(uid, gid, from_layers(driver), ca)
                if home_in_layer(driver, uid, gid, extra):
                    return
                self._layers_writable = False  # remapped users, say: the archive from now on
        extra = root_files(uid, gid, lambda path: self._image_file(container, sandbox_id, path), ca)
        with engine_errors("make the home folder in", sandbox_id):
            self._engine().put_archive(container.id, "/", home_archive(uid, gid, extra))

    def _image_file(self, container: Inspected, sandbox_id: str, path: str) -> bytes | None:
        """A plain file of a container that has not run yet (its image's), or None."""
        try:
            with engine_errors(f"read /{path} of", sandbox_id):
                return from_archive(self._engine().get_archive(container.id, "/" + path, LIMIT))
        except SandboxNotFound:
            return None


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
