"""Docker snapshots: a sandbox's filesystem committed as an image new sandboxes start from.

Snapshot images live in one repository per installation (``sandbox-kernel-snapshot-
<installation>``), tagged with the owner-qualified ref the orchestrator gives them, so
two users can each have a snapshot called "base" and two installations never see each
other's. They are found by label, never by tag alone: labels say whose they are.
A sandbox made from a snapshot carries its ref as a label, which is how a snapshot in
use is refused deletion (Docker would only refuse for a running container).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from ..base import (
    LABEL_INSTALLATION,
    LABEL_SNAPSHOT,
    LABEL_SOURCE,
    LABEL_USER,
    Conflict,
    SandboxFailed,
    SandboxNotFound,
    SnapshotInfo,
    Spec,
    epoch_of,
    sandbox_id_of,
)
from .carry import LABEL_CARRY
from .errors import engine_errors
from .info import BACKEND, LABEL_SNAPSHOT_REF

SNAPSHOT_REPO = "sandbox-kernel-snapshot"


class DockerSnapshots:
    """One installation's snapshot images, through the backend's (lazily made) client."""

    def __init__(self, installation: str, client: Callable[[], Any]) -> None:
        self._installation = installation
        self._client = client

    @property
    def repository(self) -> str:
        """One image repository per installation: its snapshots are nobody else's."""
        return f"{SNAPSHOT_REPO}-{self._installation[:8]}"

    def image(self, spec: Spec) -> Any:
        """The image a sandbox of ``spec`` starts from (its snapshot must still exist)."""
        try:
            with engine_errors(f"find snapshot {spec.snapshot!r}", refused=SandboxFailed):
                return self._client().images.get(f"{self.repository}:{spec.snapshot_ref}")
        except SandboxNotFound:
            raise SandboxFailed(
                f"no snapshot named {spec.snapshot!r}; `sandbox-kernel snapshot list` shows yours"
            ) from None

    def create(
        self, container: Any, sandbox_id: str, ref: str, labels: dict[str, str]
    ) -> SnapshotInfo:
        """Commit the sandbox's filesystem (never the workspace: it is a bind mount)."""
        name = labels.get(LABEL_SNAPSHOT, ref)
        if self._find(ref):
            raise Conflict(
                f"you already have a snapshot named {name!r}; delete it first or pick another name"
            )
        labels = {
            **labels,
            LABEL_SNAPSHOT_REF: ref,
            LABEL_INSTALLATION: self._installation,
            LABEL_CARRY: "",  # not a carry image, though the sandbox may be made from one
        }
        with engine_errors("snapshot", sandbox_id):
            image = container.commit(
                repository=self.repository, tag=ref, conf={"Labels": labels}, pause=True
            )
        with engine_errors(f"read snapshot {name!r}"):
            attrs = self._client().images.get(image.id).attrs
        summary = {
            "Id": image.id,
            "Labels": labels,
            "Size": attrs.get("Size"),
            "Created": epoch_of(attrs.get("Created", "")),
        }
        return _snapshot_info(summary)

    def all(self) -> list[SnapshotInfo]:
        """Every snapshot of this installation, oldest first (one engine call)."""
        found = self._images([LABEL_SNAPSHOT])
        return sorted((_snapshot_info(s) for s in found), key=lambda s: (s.created, s.ref))

    def delete(self, ref: str) -> bool:
        """Remove a snapshot no sandbox uses; refuse (naming them) while some do."""
        found = self._find(ref)
        if not found:
            return False
        name = (found[0].get("Labels") or {}).get(LABEL_SNAPSHOT, ref)
        in_use = self._in_use(ref, name)
        if in_use:
            raise in_use
        try:
            with engine_errors(f"delete snapshot {name!r}"):
                self._client().images.remove(found[0]["Id"])
        except SandboxNotFound:  # removed meanwhile
            return False
        except Conflict as exc:  # a sandbox started from it meanwhile, or a container not ours
            raise self._in_use(ref, name) or exc from None
        return True

    def _find(self, ref: str) -> list[dict[str, Any]]:
        return self._images([f"{LABEL_SNAPSHOT_REF}={ref}"])

    def _images(self, labels: list[str]) -> list[dict[str, Any]]:
        """Listing entries of our snapshot images with ``labels`` (summaries: no inspect
        each, so an image removed meanwhile cannot fail the listing).

        An image built from a snapshot inherits its labels; one tagged outside our
        repository is such a child, not a snapshot. A snapshot with no tag left (untagged
        while a sandbox still uses it) is still one.
        """
        with engine_errors("list snapshots"):
            found = self._client().api.images(
                filters={"label": [*labels, f"{LABEL_INSTALLATION}={self._installation}"]}
            )
        # A carry image (see carry.py) of a sandbox made from a snapshot inherits its labels.
        return [
            image
            for image in found
            if self._in_repository(image) and not (image.get("Labels") or {}).get(LABEL_CARRY)
        ]

    def _in_repository(self, image: dict[str, Any]) -> bool:
        tags = [tag for tag in image.get("RepoTags") or [] if tag != "<none>:<none>"]
        return not tags or any(tag.startswith(f"{self.repository}:") for tag in tags)

    def _in_use(self, ref: str, name: str) -> Conflict | None:
        """The refusal to delete snapshot ``ref`` while sandboxes made from it exist."""
        with engine_errors(f"find the sandboxes made from snapshot {name!r}"):
            users = self._client().api.containers(
                all=True,
                filters={
                    "label": [
                        f"{LABEL_SNAPSHOT_REF}={ref}",
                        f"{LABEL_INSTALLATION}={self._installation}",
                    ]
                },
            )
        if not users:
            return None
        names = ", ".join(
            sandbox_id_of(self._installation, (c.get("Names") or ["/?"])[0].lstrip("/"))
            for c in users
        )
        return Conflict(f"snapshot {name!r} is used by {names}; destroy those sandboxes first")


def _snapshot_info(summary: dict[str, Any]) -> SnapshotInfo:
    """A snapshot as users see it, from an image listing entry."""
    labels = summary.get("Labels") or {}
    return SnapshotInfo(
        name=labels.get(LABEL_SNAPSHOT, ""),
        backend=BACKEND,
        user=labels.get(LABEL_USER, ""),
        source=labels.get(LABEL_SOURCE, ""),
        size=int(summary.get("Size") or 0),
        created=float(summary.get("Created") or 0),
        id=summary.get("Id", ""),
        ref=labels.get(LABEL_SNAPSHOT_REF, ""),
    )
