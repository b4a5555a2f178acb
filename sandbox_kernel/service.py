"""What the REST API does, without Jupyter: ownership, listing, actions, files, snapshots.

The server extension's handlers are thin: they parse a request, call one method here
(off the event loop) and map the domain errors below to HTTP statuses. Keeping this
free of Jupyter lets the same rules be tested and reused (CLI, other servers).
"""

from __future__ import annotations

import re
import time
import uuid
from typing import Any

from .backends import Backend, make_backend
from .backends.base import SandboxInfo, SnapshotInfo, check_snapshot_name
from .config import SandboxConfig
from .errors import BadRequest, Forbidden, SandboxNotFound, shorten
from .files import RemoteWorkspace, Workspace
from .identity import ScopeKey
from .lifecycle import stats
from .store import Store

_ID = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.-]{0,127}")


def check_id(value: str, what: str = "sandbox id") -> str:
    if not isinstance(value, str) or not _ID.fullmatch(value):
        shown = shorten(value, 40) if isinstance(value, str) else value
        raise BadRequest(f"bad {what} {shown!r}: ids are 1-128 letters, digits, '.', '_' or '-'")
    return value


class SandboxService:
    """The sandboxes of one installation, seen as one user at a time."""

    def __init__(self, config: SandboxConfig, backend: Backend | None = None) -> None:
        self.config = config
        self._backend = backend
        self.store = Store(config)
        # CPU use is a rate: the previous sample per sandbox, kept by this (long-lived)
        # service object, turns cumulative CPU seconds into a live fraction.
        self._cpu_samples: dict[str, tuple[float, float]] = {}

    @property
    def backend(self) -> Backend:
        if self._backend is None:
            self._backend = make_backend(self.config)
        return self._backend

    # -- sandboxes ----------------------------------------------------------------
    def _describe(self, infos: list[SandboxInfo]) -> list[dict[str, Any]]:
        kernels = self.store.live_kernels(self.backend.name)
        records = {r.id: r for r in self.store.all(self.backend.name)}
        usage = self.backend.usage([i for i in infos if i.state == "running"])
        out = []
        for info in infos:
            item = info.to_dict()
            live = kernels.get(info.id, [])
            item["kernels"] = len(live)
            # Which kernels use it: a front end matches its notebook's kernel against these.
            item["kernel_ids"] = sorted(kernel_id for kernel_id, _ in live)
            record = records.get(info.id)
            item["last_activity"] = record.last_activity if record else info.created
            item["usage"] = self._with_cpu_rate(info.id, usage.get(info.id, {}))
            out.append(item)
        return out

    def _with_cpu_rate(self, sandbox_id: str, usage: dict[str, float]) -> dict[str, float]:
        usage = dict(usage)
        seconds = usage.pop("cpu_seconds", None)
        if seconds is None:
            return usage
        now = time.monotonic()
        previous = self._cpu_samples.get(sandbox_id)
        self._cpu_samples[sandbox_id] = (now, seconds)
        if previous and now > previous[0] and seconds >= previous[1]:
            usage["cpu"] = round((seconds - previous[1]) / (now - previous[0]), 3)
        return usage

    def list(self, user: str) -> list[dict[str, Any]]:
        return self._describe(self.backend.list(user))

    def create_from_snapshot(self, user: str, snapshot: Any) -> dict[str, Any]:
        """A new thread-scoped sandbox of ``user`` started from one of their snapshots.

        Made exactly as a kernel with ``snapshot=NAME`` and ``scope=thread`` would make
        it (same labels, quota check and owner record); its thread names the snapshot,
        so it never takes the place of the user's own sandbox.
        """
        if not isinstance(snapshot, str):
            raise BadRequest('name the snapshot to start from: {"snapshot": "my-snapshot"}')
        check_snapshot_name(snapshot)
        self._owned_snapshot(user, snapshot)
        settings = {name: getattr(self.config, name) for name in self.config.trait_names(config=True)}
        settings["snapshot"] = snapshot
        backend = type(self.backend)(SandboxConfig(**settings))
        key = ScopeKey(user=user, scope="thread", thread=f"snapshot:{snapshot}:{uuid.uuid4().hex[:8]}")
        info = backend.ensure(key).info
        return self._describe([info])[0]

    def owned(self, user: str, sandbox_id: str) -> SandboxInfo:
        """The sandbox if ``user`` owns it: 404 when unknown, 403 when someone else's."""
        info = self.backend.get(check_id(sandbox_id))
        if info.user != user:
            raise Forbidden(f"sandbox {sandbox_id} belongs to another user")
        return info

    def get(self, user: str, sandbox_id: str) -> dict[str, Any]:
        return self._describe([self.owned(user, sandbox_id)])[0]

    def destroy(self, user: str, sandbox_id: str) -> None:
        self.owned(user, sandbox_id)
        self.backend.destroy(sandbox_id)
        self.store.delete(self.backend.name, sandbox_id)

    def stop(self, user: str, sandbox_id: str) -> dict[str, Any]:
        self.owned(user, sandbox_id)
        self.backend.stop(sandbox_id)
        return self.get(user, sandbox_id)

    def start(self, user: str, sandbox_id: str) -> dict[str, Any]:
        self.owned(user, sandbox_id)
        self.backend.start(sandbox_id)
        self.store.touch(self.backend.name, sandbox_id)
        return self.get(user, sandbox_id)

    def stats(self, user: str) -> dict[str, Any]:
        totals = stats(self.backend, self.config)
        totals["yours"] = len(self.backend.list(user))
        return totals

    # -- files ----------------------------------------------------------------------
    def workspace(self, user: str, sandbox_id: str) -> Workspace | RemoteWorkspace:
        info = self.owned(user, sandbox_id)
        self.store.touch(self.backend.name, sandbox_id)  # file use is activity
        if self.backend.workspace_on_host:
            owner = None
            if info.file_owner:  # the sandbox runs as a uid the server must hand files to
                uid, _, gid = info.file_owner.partition(":")
                owner = (int(uid), int(gid or uid))
            return Workspace(info.workspace, owner)
        if info.state != "running":
            raise BadRequest(f"sandbox {sandbox_id} is {info.state}: start it to reach its files")
        return RemoteWorkspace(self.backend, sandbox_id)

    # -- snapshots ------------------------------------------------------------------
    def snapshots(self, user: str) -> list[dict[str, Any]]:
        return [s.to_dict() for s in self.backend.list_snapshots(user)]

    def create_snapshot(self, user: str, sandbox_id: str, name: Any) -> dict[str, Any]:
        if not isinstance(name, str):
            raise BadRequest('give the snapshot a name: {"name": "my-snapshot"}')
        self.owned(user, sandbox_id)
        return self.backend.create_snapshot(sandbox_id, name).to_dict()

    def delete_snapshot(self, user: str, name: str) -> None:
        check_id(name, "snapshot name")
        self._owned_snapshot(user, name)
        self.backend.delete_snapshot(name)

    def _owned_snapshot(self, user: str, name: str) -> SnapshotInfo:
        """The snapshot if ``user`` owns it: 404 when unknown, 403 when someone else's."""
        found = [s for s in self.backend.list_snapshots(None) if s.name == name]
        if not found:
            raise SandboxNotFound(f"no snapshot named {name!r}")
        if found[0].user != user:
            raise Forbidden(f"snapshot {name} belongs to another user")
        return found[0]
