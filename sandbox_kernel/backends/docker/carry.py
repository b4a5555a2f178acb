"""A sandbox made anew with other mounts, its own files kept (Docker).

Docker cannot add, remove or change a container's mounts, so a sandbox whose mapped
folders changed is made anew at its next start: its stopped container is committed to
an image of ours, the *carry* image (``sandbox-kernel-carry-<installation>:<sandbox id>``,
labelled with the sandbox and the settings its files go with), the container is
removed, and the new one is made from that image with the new mounts. Everything the
sandbox wrote outside its mounts is kept, deletions included: its home with the user's
packages (``~/.local``), ``/tmp``, what ``pip`` put anywhere else it could write.

The carry image lives as long as the sandbox: it is the base of the new container, and
goes when the sandbox is destroyed (with the carry images beneath it that nothing else
holds; a snapshot taken since keeps what it needs). A create that finds a carry image
of its sandbox made for the same settings starts from it, so a process that died
between removing the old container and making the new one loses nothing; the sweep
removes carry images whose sandbox is gone once a stopped sandbox would have been
(``idle_delete``). Each remake adds a layer (the overlay
driver allows about 125): mappings change seldom.
"""

from __future__ import annotations

import fcntl
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from ..base import (
    LABEL_INSTALLATION,
    LABEL_USER,
    LABEL_USER_ID,
    Conflict,
    SandboxError,
    SandboxNotFound,
    Spec,
)
from .errors import engine_errors
from .info import Inspected
from .wire import EngineCalls

CARRY_REPO = "sandbox-kernel-carry"
LABEL_CARRY = "sandbox-kernel.carry"  # on a carry image: the sandbox whose files it holds
LABEL_CARRY_BASE = "sandbox-kernel.carry-base"  # the settings its files go with (see base())
FRESH = 600.0  # seconds a carry image is spared at least (its container may be being made)


def base(spec: Spec) -> str:
    """What a sandbox's own files go with: its image or snapshot, network, runtime and
    shared folder (neither its mapped folders nor its work folder, which are mounts)."""
    return Spec(
        image=spec.image,
        snapshot_ref=spec.snapshot_ref,
        network=spec.network,
        shared_folder=spec.shared_folder,
        runtime=spec.runtime,
    ).fingerprint(work=False)


@contextmanager
def remake_lock(state_dir: str, sandbox_id: str) -> Iterator[None]:
    """Held while ``sandbox_id`` is made anew: of the processes that find it outdated at
    once, one remakes it and the others then find it done."""
    folder = Path(state_dir) / "remake"
    folder.mkdir(parents=True, exist_ok=True, mode=0o700)
    with open(folder / f"{sandbox_id}.lock", "a") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        yield


class DockerCarry:
    """One installation's carry images, through the backend's engine calls and client."""

    def __init__(
        self,
        installation: str,
        engine: Callable[[], EngineCalls],
        client: Callable[[], Any],
        idle_delete: float = 0.0,
    ) -> None:
        self._installation = installation
        self._engine = engine
        self._client = client
        # Seconds the carry image of a sandbox that is gone is kept: as long as a stopped
        # sandbox would be (idle_delete minutes; 0: as stopped ones, for ever).
        self.keep = max(FRESH, idle_delete * 60) if idle_delete else float("inf")

    @property
    def repository(self) -> str:
        return f"{CARRY_REPO}-{self._installation[:8]}"

    def _name(self, sandbox_id: str) -> str:
        return f"{self.repository}:{sandbox_id}"

    def commit(self, container: Inspected, sandbox_id: str, spec: Spec) -> None:
        """Commit the stopped ``container`` of ``sandbox_id`` as its carry image, for
        sandboxes of ``spec``'s settings (the mounts are not part of it)."""
        labels = container.labels
        carried = {
            LABEL_CARRY: sandbox_id,
            LABEL_CARRY_BASE: base(spec),
            LABEL_INSTALLATION: self._installation,
            LABEL_USER: labels.get(LABEL_USER, ""),
            LABEL_USER_ID: labels.get(LABEL_USER_ID, ""),
        }
        with engine_errors("keep the files of", sandbox_id):
            self._client().api.commit(
                container.id,
                repository=self.repository,
                tag=sandbox_id,
                conf={"Labels": carried},
                pause=False,
            )

    def find(self, sandbox_id: str, spec: Spec) -> Inspected | None:
        """The carry image of ``sandbox_id`` when it holds files for ``spec``'s settings."""
        try:
            with engine_errors("look for the kept files of", sandbox_id):
                found = Inspected(self._engine().inspect_image(self._name(sandbox_id)))
        except SandboxNotFound:
            return None
        labels = found.labels
        if (
            labels.get(LABEL_INSTALLATION) != self._installation
            or labels.get(LABEL_CARRY) != sandbox_id
            or labels.get(LABEL_CARRY_BASE) != base(spec)
        ):
            return None
        return found

    def remove(self, sandbox_id: str) -> None:
        """Untag ``sandbox_id``'s carry image: the engine removes it, and the carry
        images beneath it, once no container or snapshot holds them. Never forced."""
        try:
            with engine_errors("remove the kept files of", sandbox_id):
                self._client().api.remove_image(self._name(sandbox_id))
        except (SandboxNotFound, Conflict):
            pass  # gone, or still the base of a container of that id (an older incarnation)

    def sweep(self, live: set[str]) -> None:
        """Remove the carry images of sandboxes not in ``live`` (ids) made more than
        :attr:`keep` seconds ago: a start may still want them (its maker died half-way)."""
        try:
            with engine_errors("list kept files"):
                images = self._client().api.images(
                    filters={"label": [LABEL_CARRY, f"{LABEL_INSTALLATION}={self._installation}"]}
                )
        except SandboxError:
            return
        now = time.time()
        for image in images:
            sandbox_id = (image.get("Labels") or {}).get(LABEL_CARRY, "")
            created = float(image.get("Created") or 0)
            if sandbox_id and sandbox_id not in live and now - created > self.keep:
                if self._name(sandbox_id) in (image.get("RepoTags") or []):
                    self.remove(sandbox_id)
