"""The administrator's mapped folders on Daytona: its own volumes, by name.

Daytona cannot mount this host's folders, and mounts its volumes (S3 buckets over FUSE)
writable only; a mapping there names a volume (``corpora:/data:rw``) that the
administrator made, never one of sandbox-kernel's own (the users' workspaces).
"""

from __future__ import annotations

from ...volumes import Volume
from ..base import NotSupported


def check_mapped(volumes: tuple[Volume, ...]) -> None:
    """Refuse, in one line naming it, a mapping Daytona cannot mount as written."""
    for volume in volumes:
        if volume.on_host:
            raise NotSupported(
                f"mapping '{volume}': Daytona cannot mount this host's folders; name a "
                f"Daytona volume instead ('NAME:{volume.target}:rw')"
            )
        if not volume.writable:
            raise NotSupported(
                f"mapping '{volume}': Daytona mounts volumes writable only, so it cannot be "
                "read-only there; write it ':rw' if every sandbox may write it"
            )
        if volume.source.startswith("sk-"):
            raise NotSupported(
                f"mapping '{volume}': volumes named sk-... are sandbox-kernel's own (users' "
                "workspaces); map another volume"
            )
