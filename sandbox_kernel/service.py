"""The orchestrator: the one place that decides about sandboxes.

Kernel, CLI, REST handlers (and MCP next) all come here, so each rule exists once:

* **whose** a sandbox is, and who may see, stop, start, destroy or snapshot it;
* **what** a sandbox is made from (a :class:`~.backends.base.Spec`), and what happens
  when a kernel asks for something else than the sandbox it finds: a named variant
  (a kernelspec installed with another image or snapshot) has its own sandbox, id
  ``sk-alice--v<hash>``, sharing the workspace; a different flavor resizes the sandbox
  in place where the engine can (never shrinking it under another live kernel); and a
  sandbox made from other settings than the kernel's is kept, used and reported as
  *outdated* in one line that says how to switch, never silently, never reaped for it;
* **quotas**, checked when a sandbox is made and when one starts, atomically across
  processes (a reservation under the state file's write lock), counting this
  installation only;
* **snapshots'** owners: snapshot names are per user on every backend;
* **records** that outlive processes (owner, spec, flavor, activity) in the store.

Backends are engine adapters: they receive a :class:`~.backends.base.Spec` and labels
and carry them out; none of them imports this module, the store or the lifecycle.
"""

from __future__ import annotations

import builtins
import hashlib
import re
import time
import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import replace
from pathlib import Path
from typing import Any

from . import events, notices
from .agent import as_user
from .backends import Backend, make_backend
from .backends.base import (
    LABEL_SNAPSHOT,
    LABEL_SOURCE,
    LABEL_USER,
    LABEL_USER_ID,
    LOST_NOTICE,
    WORKSPACE,
    Ensured,
    PortTarget,
    Progress,
    SandboxInfo,
    SnapshotInfo,
    Spec,
    check_snapshot_name,
    installation_id,
    is_files_sandbox,
    mapped_volumes,
    sandbox_labels,
    snapshot_ref,
    writable_host_folders,
)
from .config import SandboxConfig
from .errors import (
    AlreadyExists,
    BadRequest,
    Conflict,
    Forbidden,
    NotSupported,
    QuotaExceeded,
    SandboxError,
    SandboxFailed,
    SandboxNotFound,
    shorten,
)
from .files import RemoteWorkspace, Workspace
from .folders import (
    door_folder,
    folder_tag,
    installation_folders,
    jupyter_folders,
    masks,
    primary_folder,
    resolve_work_folder,
    server_root_dir,
    under,
)
from .identity import ScopeKey
from .lifecycle import CpuRates, agent_sessions, decide, quota_check, stats
from .preview import ListeningPort, check_port, ports_of_running
from .store import AGENT, Store
from .volumes import VolumeError, check_work_folder, described

_ID = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.-]{0,127}")
VARIANT = "--v"
WORK = "--w"


def _as_for(spec: Spec, info: SandboxInfo) -> Spec:
    """``spec`` as it would read for the sandbox ``info``: a caller without a work folder
    (CLI, REST, an agent) takes whatever folder the sandbox has."""
    return spec if spec.work_folder else replace(spec, work_folder=info.work_folder)


def _of_flavor(spec: Spec, config: SandboxConfig, flavor: str) -> Spec:
    """``spec`` with the egress allowlist of ``flavor`` (a sandbox's own, in listings)."""
    if not flavor or flavor not in config.flavors:
        return spec
    return replace(spec, egress=config.egress(flavor))


def workspace_dir(config: SandboxConfig, key: ScopeKey) -> Path:
    """The host folder of ``key``'s user, mounted at /workspace (one per user, shared by threads)."""
    return Path(config.workspace_root) / key.user_id


def check_id(value: str, what: str = "sandbox id") -> str:
    if not isinstance(value, str) or not _ID.fullmatch(value):
        shown = shorten(value, 40) if isinstance(value, str) else value
        raise BadRequest(f"bad {what} {shown!r}: ids are 1-128 letters, digits, '.', '_' or '-'")
    return value


class SandboxService:
    """The sandboxes of one installation, for whoever asks (kernel, CLI, REST)."""

    def __init__(self, config: SandboxConfig, backend: Backend | None = None) -> None:
        self.config = config
        self._backend = backend
        self.store = Store(config)
        self.installation = installation_id(config.state_dir)
        # CPU use is a rate: the previous sample per sandbox, kept by this (long-lived)
        # service object, turns cumulative CPU seconds into a live fraction.
        self._cpu_rates = CpuRates()

    @property
    def backend(self) -> Backend:
        if self._backend is None:
            self._backend = make_backend(self.config)
        return self._backend

    # -- specs and variants ----------------------------------------------------------
    def spec(self, user: str, config: SandboxConfig | None = None, work_folder: str = "") -> Spec:
        """What ``user``'s sandboxes are made from under ``config`` (the service's by
        default), with ``work_folder`` (a host folder) mounted at its own path."""
        cfg = config or self.config
        if not self.backend.workspace_on_host:
            work_folder = ""  # a remote engine sees no host folder (see folders.py)
        image = cfg.image
        if self.backend.name == "daytona" and image == SandboxConfig.image.default_value:
            image = ""  # the Docker-oriented default means "not chosen": Daytona's default snapshot
        try:
            check_work_folder(cfg.mappings, work_folder)
        except VolumeError as exc:
            raise SandboxFailed(str(exc)) from None
        return Spec(
            image=image,
            snapshot=cfg.snapshot,
            # A snapshot is always the user's own: its engine name carries the owner.
            snapshot_ref=snapshot_ref(user, cfg.snapshot) if cfg.snapshot else "",
            flavor=cfg.flavor,
            cpus=cfg.cpus,
            memory=cfg.memory,
            disk=cfg.disk,
            pids=cfg.pids_limit,
            network=cfg.network,
            egress=cfg.egress(),
            shared_folder=cfg.shared_folder,
            runtime=cfg.runtime,
            work_folder=work_folder,
            work_read_only=bool(work_folder) and cfg.work_mount == "ro",
            masks=tuple((m.path, m.how) for m in masks(work_folder, self._never_shown()))
            if work_folder
            else (),
            volumes=cfg.mappings,
        )

    def _never_shown(self) -> list[str]:
        """Host folders no sandbox sees, even inside a work folder that holds them."""
        return [
            self.config.state_dir,
            self.config.workspace_root,
            *jupyter_folders(),
            *installation_folders(),
        ]

    def work_folder(self, cwd: str, config: SandboxConfig | None = None, user: str = "") -> str:
        """The host folder a door opened in ``cwd`` works in ("" for none): the one rule
        for every door (a notebook's kernel, ``jupyter execute``, ``exec``, ``shell``,
        ``mcp``, a terminal), so one folder gives ``user`` one sandbox whichever they use.

        It is the primary folder (:meth:`primary_folder`) when ``cwd`` lies in it, else the
        git checkout around ``cwd``, else ``cwd`` itself (see folders.py)."""
        if not self.backend.workspace_on_host:
            return ""
        cfg = config or self.config
        here = str(Path(cwd).resolve())
        if server_root_dir():  # opened through a Jupyter server: only inside its root folder
            here = door_folder(here, server_root_dir())
        if any(under(here, str(Path(p).resolve())) for p in self._never_shown()):
            return ""  # a workspace is /workspace already; the state folder is never shown
        return resolve_work_folder(cfg.work_root, here, self.primary_folder(user, cfg))

    def primary_folder(self, user: str = "", config: SandboxConfig | None = None) -> str:
        """The folder whose sandbox is ``user``'s plain one, ``sk-<user>`` ("" for none):
        ``work_root`` when it names a folder; else the root folder of the Jupyter server
        this door came through; else the root folder of the last Jupyter server with this
        extension that ``user`` ran (it records it when it starts), so ``exec``, ``shell``,
        ``mcp`` and ``jupyter execute`` in that folder use the sandbox its notebooks use."""
        cfg = config or self.config
        if cfg.work_root != "auto" or server_root_dir():
            return primary_folder(cfg.work_root, server_root_dir())
        if not user:
            return ""
        try:
            recorded = self.store.lab_root(ScopeKey(user).user_id)
        except SandboxError:
            return ""
        return recorded if recorded and Path(recorded).is_dir() else ""

    def remember_lab_root(self, user: str, folder: str) -> None:
        """A Jupyter server of ``user`` with this extension serves ``folder``: its
        sandbox is ``user``'s plain one, for every door (see :meth:`primary_folder`)."""
        self.store.put_lab_root(ScopeKey(user).user_id, str(Path(folder).resolve()))

    def config_with(self, **values: Any) -> SandboxConfig:
        """A copy of the service's settings with some personal choices changed."""
        settings = {
            name: getattr(self.config, name) for name in self.config.trait_names(config=True)
        }
        settings.update(values)
        cfg = SandboxConfig(**settings)
        cfg.file_values = self.config.file_values
        cfg.asked = self.config.asked | set(values)
        return cfg

    def sandbox_id(
        self, key: ScopeKey, config: SandboxConfig | None = None, work_folder: str = ""
    ) -> str:
        """The id of ``key``'s sandbox: a named variant (a kernelspec made with another
        image or snapshot) has its own, beside the user's plain one; so has a work
        folder other than the primary one (a second checkout: see folders.py)."""
        cfg = config or self.config
        sid = key.name
        if cfg.variant:
            sid += f"{VARIANT}{hashlib.sha256(cfg.variant.encode()).hexdigest()[:8]}"
        if work_folder and cfg.work_mount == "ro":
            # Another mount of the folder is another sandbox: one made with it writable
            # must never serve code meant to see it read-only.
            sid += f"{WORK}{folder_tag(work_folder + chr(0) + 'ro')}"
        elif (
            key.scope == "user"
            and work_folder
            and work_folder != self.primary_folder(key.user, cfg)
        ):
            sid += f"{WORK}{folder_tag(work_folder)}"
        return sid

    # -- finding or making a sandbox ---------------------------------------------------
    def ensure(
        self,
        key: ScopeKey,
        progress: Progress | None = None,
        config: SandboxConfig | None = None,
        work_folder: str = "",
    ) -> Ensured:
        """Find ``key``'s sandbox for ``config`` (the service's by default) with
        ``work_folder`` mounted, making, starting or resizing it as needed; say in one
        line what the user should know.

        Safe to call from many processes at once: they all end up with one sandbox.
        Its outcome and, when a sandbox was made or started, how long that took are
        counted for the server's metrics (:mod:`.events`).
        """
        began = time.monotonic()
        sid = ""

        def say(line: str) -> None:
            if sid:
                self.record(sid, line)
            if progress is not None:
                progress(line)

        try:
            spec = self.spec(key.user, config, work_folder)
            sid = self.sandbox_id(key, config, spec.work_folder)
            ensured = self._ensure(key, spec, sid, say, config)
        except SandboxError as exc:
            if sid:
                self.record(sid, f"failed: {exc}")
            self._count_start("quota" if isinstance(exc, QuotaExceeded) else "failed", exc)
            raise
        self._count_start(ensured.event, None, time.monotonic() - began)
        if ensured.event != "existing" or ensured.notes:
            for line in [f"{ensured.event} ({ensured.info.state})", *ensured.notes]:
                self.record(sid, line)
        return ensured

    def _count_start(
        self, outcome: str, error: SandboxError | None, seconds: float | None = None
    ) -> None:
        name = self.backend.name
        events.count(self.store, events.STARTS, backend=name, outcome=outcome)
        if seconds is not None and outcome != "existing":
            events.observe(self.store, events.START_SECONDS, seconds, backend=name)
        if error is not None and events.error_kind(error):
            events.count(
                self.store,
                events.ENGINE_ERRORS,
                backend=name,
                operation="start",
                kind=events.error_kind(error),
            )

    def _ensure(
        self, key: ScopeKey, spec: Spec, sid: str, say: Progress, config: SandboxConfig | None
    ) -> Ensured:
        record = self.store.get(self.backend.name, sid)
        info = self.backend.find(sid)
        if info is not None and record is not None and record.engine_id == info.engine_id:
            info.flavor = record.flavor or info.flavor  # resized since its labels were written
        if info is not None and info.state == "error":
            reason = info.exit_reason or "in error"
            say(f"sandbox {sid} failed ({reason}): making a new one")
            self.backend.destroy(sid)
            created = self._create(sid, key, spec, say)
            ensured = Ensured(
                created,
                "recreated",
                f"sandbox restarted: {LOST_NOTICE} ({sid} had failed: {reason})",
            )
        elif info is None:
            ensured = self._made(sid, key, spec, say, record)
        elif info.state == "stopped" and self._remade_at_start(info, spec):
            made = self._remake(info, key, spec, say)
            ensured = Ensured(made, "started", notices.stopped(info))
        else:
            if spec.snapshot and info.snapshot != spec.snapshot:
                self._check_snapshot(key.user, spec.snapshot)
            self.backend.refresh_trust()
            ensured = self._revive(info, spec, say)
        ensured = self._fit(ensured, spec, config)
        self.store.put(
            self.backend.name,
            sid,
            key.user,
            ensured.info.engine_id,
            ensured.info.spec,
            ensured.info.flavor,
        )
        return ensured

    def record(self, sandbox_id: str, line: str) -> None:
        """One line in the sandbox's log (``sandbox-kernel logs ID``); never a failure."""
        try:
            self.store.add_event(self.backend.name, sandbox_id, line)
        except Exception:  # the log is a help, not a duty
            pass

    def _check_snapshot(self, user: str, name: str) -> None:
        """A snapshot asked for must exist: a sandbox kept from something else must not
        hide a misspelt ``SANDBOX_KERNEL_SNAPSHOT`` (a new one is made from it or fails)."""
        if not self.backend.uses_images:
            return
        try:
            self.owned_snapshot(user, name)
        except NotSupported:
            return
        except SandboxNotFound:
            raise SandboxNotFound(
                f"you have no snapshot named {name!r} (SANDBOX_KERNEL_SNAPSHOT, a kernelspec's "
                "--snapshot or the notebook's metadata.sandbox.snapshot); `sandbox-kernel "
                "snapshot list` shows yours"
            ) from None

    def _made(self, sid: str, key: ScopeKey, spec: Spec, say: Progress, record: Any) -> Ensured:
        """A new sandbox, or the one another process made meanwhile."""
        try:
            info = self._create(sid, key, spec, say)
        except AlreadyExists:
            return self._revive(self._wait_found(sid), spec, say)
        if record is not None and record.engine_id and record.engine_id != info.engine_id:
            return Ensured(
                info, "recreated", f"sandbox restarted: {LOST_NOTICE} ({sid} had been removed)"
            )
        return Ensured(info, "created")

    def _create(self, sid: str, key: ScopeKey, spec: Spec, say: Progress) -> SandboxInfo:
        self.backend.check_volumes(spec.volumes)
        with self._reservation(sid, spec.memory, new=True):
            if self.backend.uses_images:  # the local backend says where it makes its own
                say(f"creating sandbox {sid} from {spec.source} ({spec.flavor})")
            labels = sandbox_labels(key, spec, self.installation, "")
            return self.backend.create(sid, key, spec, labels, say)

    def _wait_found(self, sid: str) -> SandboxInfo:
        """After losing a create race, wait for the winner's sandbox to show up."""
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:
            info = self.backend.find(sid)
            if info is not None:
                return info
            time.sleep(0.1)
        raise SandboxFailed(f"{sid} was being made by another process and did not appear")

    def _remade_at_start(self, info: SandboxInfo, spec: Spec) -> bool:
        """Whether ``info`` differs from ``spec`` only in its mapped folders: then its
        next start makes it anew with them (see :meth:`_remake`)."""
        spec = _as_for(spec, info)
        mapped = mapped_volumes(info)
        return (
            bool(info.spec)
            and mapped != spec.volumes
            and info.spec == replace(spec, volumes=mapped).fingerprint()
        )

    def _remake(self, info: SandboxInfo, key: ScopeKey, spec: Spec, say: Progress) -> SandboxInfo:
        """The stopped sandbox ``info`` made anew with the mapped folders of ``spec``
        (keeping its own files where the engine can), under a quota reservation."""
        self.backend.check_volumes(spec.volumes)
        if info.work_folder and not spec.work_folder:  # (a caller with no folder of its own)
            found = masks(info.work_folder, self._never_shown())
            spec = replace(
                spec, work_folder=info.work_folder, masks=tuple((m.path, m.how) for m in found)
            )
        with self._reservation(info.id, spec.memory, new=False):
            labels = sandbox_labels(key, spec, self.installation, "")
            try:
                made = self.backend.remake(info.id, key, spec, labels, say)
            except AlreadyExists:  # another process made it anew meanwhile
                made = self.backend.start(self._wait_found(info.id).id, say)
        self.store.put(
            self.backend.name, info.id, info.user, made.engine_id, made.spec, made.flavor
        )
        say(
            f"sandbox {info.id} now maps {described(spec.volumes)}; {notices.remake_words(self.backend)}"
        )
        return made

    def _own_spec(self, info: SandboxInfo) -> Spec:
        """What the service's settings make of ``info`` for its start outside a kernel
        (REST, CLI): its own work folder and flavor kept."""
        spec = self.spec(info.user, work_folder=info.work_folder)
        record = self.store.get(self.backend.name, info.id)
        flavor = (
            record.flavor if record and record.engine_id == info.engine_id else ""
        ) or info.flavor
        if flavor in self.config.flavors:
            sizes = self.config.flavor_sizes(flavor)
            spec = replace(
                spec,
                flavor=flavor,
                cpus=float(sizes["cpus"]),
                memory=int(sizes["memory"]),
                disk=int(sizes["disk"]),
            )
        return _of_flavor(spec, self.config, flavor)

    def _revive(self, info: SandboxInfo, spec: Spec, say: Progress) -> Ensured:
        """Bring an existing sandbox to running; say what the user lost, if anything."""
        if info.state == "running":
            return Ensured(info, "existing")
        notice = notices.stopped(info)
        with self._reservation(info.id, spec.memory, new=False):
            info = self.backend.start(info.id, say)
        return Ensured(info, "started", notice)

    def _fit(self, ensured: Ensured, spec: Spec, config: SandboxConfig | None = None) -> Ensured:
        """Give an existing sandbox the flavor asked for, or say why it keeps its own;
        say when it was made from settings that have since changed.

        Only a flavor someone asked for changes a sandbox (a kernelspec's or the
        environment's ``SANDBOX_KERNEL_FLAVOR``, notebook metadata, ``--flavor``): a door
        that asks for none (a plain ``exec``) takes the sandbox as it is, never shrinking
        it back to the default."""
        cfg = config or self.config
        info, notes = ensured.info, list(ensured.notes)
        if info.spec and info.spec != _as_for(spec, info).fingerprint():
            notes.append(
                notices.outdated(info, spec, self._remade_at_start(info, spec), self.backend)
            )
        if ensured.event == "created" or ensured.event == "recreated":
            clamped = notices.clamped(info, spec)
            if clamped:
                notes.append(clamped)
        elif info.flavor and info.flavor != spec.flavor and "flavor" in cfg.asked:
            note, flavor = self._resize(info, spec)
            notes.append(note)
            info = self.backend.get(info.id)
            info.flavor = flavor  # the engine's labels keep the flavor it was made with
        return replace(ensured, info=info, notes=notes)

    def _resize(self, info: SandboxInfo, spec: Spec) -> tuple[str, str]:
        """Resize ``info`` to ``spec``'s flavor where it may be: (what to tell the user,
        the flavor it has now)."""
        asked, had = spec.flavor, info.flavor
        shrink = spec.memory < int(info.limits.get("memory") or 0)
        others = self.store.live_kernels(self.backend.name).get(info.id, [])
        if not self.backend.resizes:
            return (
                f"flavor {asked} asked, but {info.id} keeps flavor {had} (the {self.backend.name} backend cannot resize)",
                had,
            )
        if shrink and others:
            return (
                f"flavor {asked} asked, but {info.id} keeps flavor {had} while other kernels use it",
                had,
            )
        extra = (
            max(0, spec.memory - int(info.limits.get("memory") or 0))
            if info.state == "running"
            else 0
        )
        with self._reservation(info.id, int(info.limits.get("memory") or 0) + extra, new=False):
            self.backend.resize(info.id, spec)
        now = self.backend.get(info.id)
        return notices.resized(now, spec, had), asked

    @contextmanager
    def _reservation(self, sid: str, memory: int, new: bool) -> Iterator[None]:
        """Hold a quota reservation while a sandbox is made, started or resized."""
        check = quota_check(self.backend, self.config, sid, memory, new)
        try:
            self.store.reserve(
                self.backend.name, sid, memory, new, check, ttl=self.config.start_timeout + 60
            )
        except QuotaExceeded as exc:
            events.count(
                self.store,
                events.QUOTA_REFUSALS,
                backend=self.backend.name,
                quota=events.quota_name(exc),
            )
            raise
        try:
            yield
        finally:
            self.store.release(self.backend.name, sid)

    # -- listings ----------------------------------------------------------------------
    def describe(self, infos: list[SandboxInfo]) -> list[dict[str, Any]]:
        """Listing entries: the engine's view plus ours (kernels, activity, what comes next)."""
        holders = self.store.live_sessions(self.backend.name)
        records = {r.id: r for r in self.store.all(self.backend.name)}
        usage = self.backend.usage([i for i in infos if i.state == "running"])
        disk_usage = self.backend.disk_usage(infos)
        out = []
        for info in infos:
            everyone = holders.get(info.id, [])
            # Kernels and agent sessions both keep a sandbox in use (the lifecycle sees
            # them alike); a listing names them apart.
            live = [(h.id, h.busy) for h in everyone]
            kernels = [h for h in everyone if h.kind != AGENT]
            record = records.get(info.id)
            info.kernels = len(kernels)
            # Which kernels use it, and which are running a cell right now: a front end
            # matches its notebook's kernel against these; an agent sees a busy notebook.
            info.kernel_ids = sorted(h.id for h in kernels)
            info.busy_kernel_ids = sorted(h.id for h in kernels if h.busy)
            info.last_activity = record.last_activity if record else info.created
            if record is not None and record.flavor and record.engine_id == info.engine_id:
                info.flavor = record.flavor  # resized since its labels were written
            current = _of_flavor(_as_for(self.spec(info.user), info), self.config, info.flavor)
            if info.spec and info.spec != current.fingerprint() and VARIANT not in info.id:
                info.outdated = "made from other settings than the current ones (image, snapshot, network, egress_allow or mounts)"
                if self._remade_at_start(info, current):
                    info.outdated = (
                        f"made with other folder mappings ({described(mapped_volumes(info))}; "
                        f"now {described(current.volumes)})"
                    )
                    info.remake = f"made anew with them at its next start: {notices.remake_words(self.backend)}"
            item = info.to_dict()
            item["usage"] = {
                **self._cpu_rates.usage(info.id, usage.get(info.id, {})),
                **disk_usage.get(info.id, {}),
            }
            item["next"] = decide(info, record, live, self.config).to_dict()
            item["agent_sessions"] = agent_sessions(everyone)
            out.append(item)
        return out

    def list(self, user: str | None) -> list[dict[str, Any]]:
        """``user``'s sandboxes (None: everyone's, for administrators)."""
        return self.describe(self.backend.list(user))

    # -- one sandbox, for its owner ------------------------------------------------------
    def owned(self, user: str | None, sandbox_id: str) -> SandboxInfo:
        """The sandbox if ``user`` owns it (None: any owner): 404 unknown, 403 someone else's.

        A files sandbox is nobody's to use: it serves a workspace (see :meth:`workspace`)
        and the reaper stops and removes it, so its id is unknown here."""
        if is_files_sandbox(check_id(sandbox_id)):
            raise SandboxNotFound(
                f"{sandbox_id} is a files sandbox (it serves a workspace's files while the "
                "sandboxes that run code sleep), not one you can use; `sandbox-kernel list` "
                "shows the ids you have"
            )
        info = self.backend.get(sandbox_id)
        if user is not None and info.user != user:
            raise Forbidden(f"sandbox {sandbox_id} belongs to another user")
        return info

    def get(self, user: str | None, sandbox_id: str) -> dict[str, Any]:
        return self.describe([self.owned(user, sandbox_id)])[0]

    def destroy(self, user: str | None, sandbox_id: str) -> bool:
        self.owned(user, sandbox_id)
        with events.engine_call(self.store, self.backend.name, "destroy"):
            gone = self.backend.destroy(sandbox_id)
        self.store.delete(self.backend.name, sandbox_id)
        events.count(
            self.store, events.STOPS, backend=self.backend.name, action="destroy", reason="user"
        )
        self.record(sandbox_id, "destroyed (workspace kept)")
        return gone

    def stop(self, user: str | None, sandbox_id: str) -> dict[str, Any]:
        self.owned(user, sandbox_id)
        with events.engine_call(self.store, self.backend.name, "stop"):
            self.backend.stop(sandbox_id)
        events.count(
            self.store, events.STOPS, backend=self.backend.name, action="stop", reason="user"
        )
        self.record(sandbox_id, "stopped")
        return self.get(user, sandbox_id)

    def start(
        self, user: str | None, sandbox_id: str, progress: Progress | None = None
    ) -> dict[str, Any]:
        info = self.owned(user, sandbox_id)
        if info.state != "running":
            began = time.monotonic()
            try:
                spec = self._own_spec(info)
            except SandboxFailed:  # its folder clashes with a mapping: it starts as it is
                spec = None
            try:
                if spec and info.state == "stopped" and self._remade_at_start(info, spec):
                    key = ScopeKey(info.user, info.scope, info.thread)
                    self._remake(info, key, spec, progress or (lambda _m: None))
                else:
                    memory = int(info.limits.get("memory") or 0)
                    with self._reservation(sandbox_id, memory, new=False):
                        self.backend.start(sandbox_id, progress)
            except SandboxError as exc:
                self._count_start("quota" if isinstance(exc, QuotaExceeded) else "failed", exc)
                raise
            self._count_start("started", None, time.monotonic() - began)
            self.record(sandbox_id, "started")
        self.store.touch(self.backend.name, sandbox_id)
        return self.get(user, sandbox_id)

    def create_from_snapshot(self, user: str, snapshot: Any) -> dict[str, Any]:
        """A new thread-scoped sandbox of ``user`` started from one of their snapshots.

        Made exactly as a kernel with ``snapshot=NAME`` and ``scope=thread`` would make
        it (same labels, quota check and owner record); its thread names the snapshot,
        so it never takes the place of the user's own sandbox.
        """
        if not isinstance(snapshot, str):
            raise BadRequest('name the snapshot to start from: {"snapshot": "my-snapshot"}')
        self.owned_snapshot(user, snapshot)
        key = ScopeKey(
            user=user, scope="thread", thread=f"snapshot:{snapshot}:{uuid.uuid4().hex[:8]}"
        )
        info = self.ensure(key, config=self.config_with(snapshot=snapshot)).info
        return self.describe([info])[0]

    def stats(self, user: str | None) -> dict[str, Any]:
        totals = stats(self.backend, self.config)
        if user is not None:
            totals["yours"] = len(self.backend.list(user))
        return totals

    def as_user(self, info: SandboxInfo, cmd: builtins.list[str]) -> builtins.list[str]:
        """``cmd`` as the user's own command in sandbox ``info``, as cells run: their PATH,
        and beneath the host folders it writes (its work folder, writable mapped folders)
        no links, FIFOs or sockets may be made."""
        return as_user(cmd, writable_host_folders(info))

    def exec(
        self,
        info: SandboxInfo,
        argv: builtins.list[str],
        timeout: float | None = None,
        cwd: str = "",
    ) -> Any:
        """Run ``argv`` as given in a sandbox (a user's command goes through
        :meth:`as_user` first), counting as its use."""
        self.store.touch(self.backend.name, info.id)
        return self.backend.exec(info.id, argv, timeout=timeout, cwd=cwd or WORKSPACE)

    # -- ports (preview URLs) -----------------------------------------------------------
    def port_target(self, user: str | None, sandbox_id: str, port: Any) -> PortTarget:
        """Where the preview proxy reaches ``port`` of ``user``'s sandbox ``sandbox_id``.

        Owner rules as for every route; the address comes from the engine for that very
        sandbox, never from the request. A sandbox that is not running stays so: the
        proxy never wakes it (409, saying how to start it)."""
        number = check_port(port)
        info = self.owned(user, sandbox_id)
        if info.state != "running":
            raise Conflict(
                f"sandbox {sandbox_id} is {info.state}; previews never start it: start it with "
                f"`sandbox-kernel start {sandbox_id}` or the panel's Start button, then reload"
            )
        with events.engine_call(self.store, self.backend.name, "port"):
            return self.backend.port_target(info, number)

    def ports(self, user: str | None, sandbox_id: str) -> dict[str, Any]:
        """The TCP ports processes of the sandbox listen on, read from inside it (its
        own TCP tables, by a short program of the host's, bounded in time). A sandbox
        that is not running is never woken for it: it has none. Not its activity.
        ``preview`` says whether the engine serves previews of them (``preview_note``
        why not, when it does not)."""
        info = self.owned(user, sandbox_id)
        found: builtins.list[ListeningPort] = []
        state = info.state
        if state == "running":
            with events.engine_call(self.store, self.backend.name, "ports"):
                state, found = ports_of_running(self.backend, info.id)
        return {
            "sandbox_id": info.id,
            "state": state,
            "ports": [p.to_dict() for p in found],
            "preview": self.backend.previews,
            "preview_note": self.backend.no_previews(),
        }

    # -- files ----------------------------------------------------------------------
    def workspace(self, user: str | None, sandbox_id: str) -> Workspace | RemoteWorkspace:
        """The workspace of ``sandbox_id`` (owner rules as for every route); never wakes it.

        Files are not the code sandbox's business: file use neither starts it nor counts
        as its activity, so a stopped sandbox stays stopped and an idle one is stopped on
        time however much its files are used. A workspace on this host is read directly;
        a remote one (a Daytona volume) through its owner's files sandbox, whose activity
        this is (see :meth:`files_sandbox`).
        """
        info = self.owned(user, sandbox_id)
        if self.backend.workspace_on_host:
            self.backend.workspace_ready(info)
            owner = None
            if info.file_owner:  # the sandbox runs as a uid the server must hand files to
                uid, _, gid = info.file_owner.partition(":")
                owner = (int(uid), int(gid or uid))
            return Workspace(info.workspace, owner)
        return RemoteWorkspace(self.backend, self.files_sandbox(info.user).id)

    def files_sandbox(self, user: str, progress: Progress | None = None) -> SandboxInfo:
        """``user``'s files sandbox, running, with this use recorded as its activity.

        It is made from the configured image, never from one of the user's snapshots (a
        snapshot is taken of a sandbox that ran their code, so its ``python3`` could be
        anything), and counts against no quota: it is not one of the user's sandboxes.
        """
        info = self.backend.files_sandbox(user, self.spec(user).image, progress)
        record = self.store.get(self.backend.name, info.id)
        if record is None or record.engine_id != info.engine_id:
            self.store.put(self.backend.name, info.id, user, info.engine_id)
        self.store.touch(self.backend.name, info.id)
        return info

    # -- snapshots ------------------------------------------------------------------
    def snapshots(self, user: str | None) -> builtins.list[dict[str, Any]]:
        """``user``'s snapshots (None: everyone's, for administrators)."""
        found = self.backend.list_snapshots()
        if user is not None:
            found = [s for s in found if s.ref.startswith(ScopeKey(user).user_id + "--")]
        return [s.to_dict() for s in found]

    def create_snapshot(self, user: str | None, sandbox_id: str, name: Any) -> dict[str, Any]:
        if not isinstance(name, str):
            raise BadRequest('give the snapshot a name: {"name": "my-snapshot"}')
        check_snapshot_name(name)
        info = self.owned(user, sandbox_id)
        owner = info.user  # an administrator's snapshot of a sandbox is its owner's
        labels = {
            LABEL_SNAPSHOT: name,
            LABEL_USER: owner,
            LABEL_USER_ID: ScopeKey(owner).user_id,
            LABEL_SOURCE: sandbox_id,
        }
        return self.backend.create_snapshot(sandbox_id, snapshot_ref(owner, name), labels).to_dict()

    def delete_snapshot(self, user: str, name: str) -> bool:
        check_id(name, "snapshot name")
        snap = self.owned_snapshot(user, name)
        return self.backend.delete_snapshot(snap.ref)

    def owned_snapshot(self, user: str, name: str) -> SnapshotInfo:
        """``user``'s snapshot called ``name`` (another user may have one of that name)."""
        check_snapshot_name(name)
        ref = snapshot_ref(user, name)
        for snap in self.backend.list_snapshots():
            if snap.ref == ref:
                return snap
        raise SandboxNotFound(
            f"you have no snapshot named {name!r}; `sandbox-kernel snapshot list` shows yours"
        )
