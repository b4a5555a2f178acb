"""Sandboxes without an engine: the workspace folder plus processes started for it.

This is the embedded default when no container engine answers (``backend=auto``).
When bubblewrap works, every process of a sandbox runs as uid 1000 ``sandbox`` in
namespaces of its own (:mod:`.view` says what it sees), inside the sandbox's user and
network namespaces (:mod:`.holder`), its cgroup where the host allows one
(:mod:`.cgroup`), under a seccomp filter (:mod:`..seccomp`). With a root server it
runs as a host uid of its own, and sees the workspace, home, /tmp and work folder through
idmapped mounts (:mod:`.launch`): what it writes there is root's on disk, and root's
other files are no more its than any stranger's. A root server bounds its workspace
and its own files with disk images (:mod:`.disk`); a sandbox with an egress allowlist
reaches out only through a proxy of its own (:mod:`.egress`); previews reach its ports
from inside its network namespace (:mod:`.netns`). Without bubblewrap, processes are
plain children of the host in the workspace folder; ``SandboxInfo.isolation`` says
which, and what does not hold.

Everything that must outlive a process is on disk under ``<state_dir>/local/``:
``<id>.json`` (the record, :mod:`.records`), ``<id>/own/home`` and ``<id>/own/tmp``
(tier-2 files: ``pip install`` lands in the home; ``<id>/home`` and ``<id>/tmp`` for
sandboxes made before disk bounds), ``.etc/`` (the /etc sandboxes see, see
view.shared_etc), ``<id>/holder.json`` (its namespaces' holder while it runs),
``<id>/procs/<pid>`` (live processes, so stop and destroy can end them from any
process). ``SANDBOX_KERNEL_LOCAL_NO_BWRAP=1`` forces plain processes.
"""

from __future__ import annotations

import builtins
import contextlib
import fcntl
import functools
import json
import logging
import os
import resource
import shutil
import struct
import subprocess
import sys
import termios
import time
import uuid
from collections.abc import Callable, Iterator
from dataclasses import asdict
from pathlib import Path, PurePosixPath
from typing import IO, Any

from ...errors import FileMissing
from ...identity import ScopeKey
from ...safefs import Beneath, make_folder
from ...volumes import Volume
from ..base import (
    LABEL_INSTALLATION,
    LABEL_SPEC,
    LABEL_WORKSPACE,
    SHARED,
    WORKSPACE,
    AlreadyExists,
    Backend,
    EgressCount,
    EngineSettings,
    ExecResult,
    Health,
    NotSupported,
    PortTarget,
    Progress,
    SandboxError,
    SandboxFailed,
    SandboxInfo,
    Spec,
    not_found,
)
from ..egress import PROXY_ENV
from . import cgroup, egress, holder
from .channels import LocalChannel, LocalPty, kill_spawn
from .disk import OWN, LocalDisks, own_folder
from .folders import (
    folder_binds,
    identity,
    mapped_protected,
    mapped_volumes,
    protected_paths,
    workspace_relative,
)
from .folders import seccomp_fd as filter_fd
from .launch import Launch, close_all, pass_fds, start
from .netns import PortOpeners
from .records import Records, make_tmp, marker_matches, network_of, process_limits, resources
from .status import bwrap_works, isolation, limits_report
from .view import HOME, bwrap_command, shared_etc, system_args

log = logging.getLogger("sandbox_kernel")


# Sandboxes made before this backend had egress proxies got no network at all for a list.
EGRESS_CLOSED = "; egress_allow: no network at all (made before local egress proxies)"
NO_PREVIEWS = (
    "without bubblewrap a local sandbox has no network of its own: its ports are the "
    "host's, which previews never reach"
)


class LocalBackend(Backend):
    """Sandboxes as workspace folders and (bubblewrap'd) processes."""

    # Each process is its own bubblewrap with its own pid namespace: no kernel could
    # vouch for a spare's pid.
    keeps_spares = False
    uses_images = False
    keeps_files_on_remake = True

    name = "local"
    resizes = True

    def __init__(self, settings: EngineSettings) -> None:
        super().__init__(settings)
        self.root = Path(settings.state_dir) / "local"
        self._records = Records(self.root)
        self._load, self._save = self._records.load, self._records.save
        self._disks = LocalDisks(settings.state_dir, self.root)
        self._ports = PortOpeners(self.root)
        # Previews reach a port in the sandbox's own network namespace, which only
        # bubblewrap gives it.
        self.previews = bwrap_works()

    def _place(self) -> cgroup.Place:
        return cgroup.place(self.settings.installation) if bwrap_works() else cgroup.Place()

    def _isolation(self, record: dict[str, Any], disk: bool) -> str:
        network = network_of(record)
        said = isolation(self._place(), network, disk)
        return said + (EGRESS_CLOSED if record.get("egress_allow") and network == "none" else "")

    def _info(self, record: dict[str, Any]) -> SandboxInfo:
        labels = record.get("labels", {})
        place = self._place()
        memory, pids, cpus = resources(record)
        bounds: dict[str, Any] = {}
        disk_note = self._disks.describe(record, bounds)
        network = network_of(record)
        return SandboxInfo(
            id=record["id"],
            backend=self.name,
            scope=record["scope"],
            user=record["user"],
            thread=record["thread"],
            state=record["state"],
            image=f"host python {'.'.join(map(str, sys.version_info[:3]))}",
            created=record["created"],
            engine_id=record["engine_id"],
            flavor=record["flavor"],
            isolation=self._isolation(record, "disk" in bounds),
            workspace=record["workspace"],
            # What holds, not what was asked: 0 where nothing bounds it.
            limits={
                "memory": memory if "memory" in place.controllers else 0,
                "cpus": cpus if "cpu" in place.controllers else 0,
                "pids": pids if bwrap_works() else 0,
                "network": network == "egress"
                or (network == "open" and (not bwrap_works() or bool(holder.slirp_program()))),
                **({"egress_allow": record["egress_allow"]} if record.get("egress_allow") else {}),
                **bounds,
            },
            disk_note=disk_note,
            finished=record.get("stopped_at", 0.0) if record["state"] == "stopped" else 0.0,
            started=record.get("started_at", record["created"])
            if record["state"] == "running"
            else 0.0,
            spec=labels.get(LABEL_SPEC, ""),
            installation=labels.get(LABEL_INSTALLATION, ""),
            work_folder=record.get("work_folder", ""),
            volumes=[v.to_dict() for v in mapped_volumes(record)],
        )

    # -- engine -------------------------------------------------------------------
    def health(self) -> Health:
        if not bwrap_works():
            return Health(
                True, self.name, "local sandboxes (bubblewrap unavailable: plain processes)"
            )
        report = "; ".join(limits_report(self.settings.installation))
        return Health(True, self.name, f"local sandboxes under bubblewrap ({report})")

    # -- sandboxes ------------------------------------------------------------------
    def find(self, sandbox_id: str) -> SandboxInfo | None:
        record = self._load(sandbox_id)
        return None if record is None else self._info(record)

    def create(
        self, sandbox_id: str, key: ScopeKey, spec: Spec, labels: dict[str, str], progress: Progress
    ) -> SandboxInfo:
        if spec.egress and spec.network and not bwrap_works():
            raise SandboxFailed(
                "egress_allow is set, and the local backend cannot hold a sandbox to it (nor "
                "keep it off the network) without bubblewrap: install bubblewrap, use Docker, "
                "or clear egress_allow"
            )
        self.root.mkdir(parents=True, exist_ok=True)
        workspace = make_folder(Path(self.settings.workspace_root), key.user_id)
        said = f"creating local sandbox {sandbox_id} in {workspace}"
        if bwrap_works() and spec.network and not spec.egress and not holder.slirp_program():
            said += " (no network: slirp4netns is not installed; apt-get install slirp4netns)"
        progress(said)
        record = {
            "id": sandbox_id,
            "user": key.user,
            "scope": key.scope,
            "thread": key.thread,
            "state": "running",
            "created": time.time(),
            "engine_id": uuid.uuid4().hex,
            "flavor": spec.flavor,
            "memory": spec.memory,
            "cpus": spec.cpus,
            "pids": spec.pids,
            "network": spec.network,
            "egress_allow": list(spec.egress) if spec.network else [],
            "disk": spec.disk,
            OWN: True,  # its home and /tmp in <id>/own, on a disk of its own where one can be
            "shared_folder": spec.shared_folder,
            "work_folder": spec.work_folder,
            "work_read_only": spec.work_read_only,
            "masks": [list(m) for m in spec.masks],
            "volumes": [[v.source, v.target, v.mode] for v in spec.volumes],
            "workspace": str(workspace),
            # The folders it was made with: a later start shows only these very ones.
            "identities": {
                "workspace": identity(str(workspace)),
                "work": identity(spec.work_folder) if spec.work_folder else "",
            },
            "labels": {**labels, LABEL_WORKSPACE: str(workspace)},
        }
        (self.root / sandbox_id / "procs").mkdir(parents=True, exist_ok=True)
        try:  # O_EXCL: of many processes creating at once, exactly one writes the record
            fd = os.open(
                self._records.path(sandbox_id), os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600
            )
        except FileExistsError:
            deadline = time.monotonic() + 5
            while self._load(sandbox_id) is None and time.monotonic() < deadline:
                time.sleep(0.02)  # the winner is still writing it
            raise AlreadyExists(f"{sandbox_id} was made by another process") from None
        with os.fdopen(fd, "w") as fh:
            json.dump(record, fh)
        with self._locked(sandbox_id):  # before any process of it: the first waits for this
            self._prepare(record, first=True)
        return self._info(record)

    def _prepare(self, record: dict[str, Any], first: bool = False) -> None:
        """Before the first process of the sandbox (its making, or a start after it ran
        none): its disks mounted (see :mod:`.disk`), its home and /tmp made on them."""
        self._disks.prepare(record, first=first, plain_in_use=lambda: not self._quiet(record))
        if not first:
            self._disks.settle_workspace(record, lambda: self._quiet(record))
        own = own_folder(self.root, record)
        (own / "home").mkdir(parents=True, exist_ok=True)
        make_tmp(own)

    def _quiet(self, record: dict[str, Any]) -> bool:
        """Whether no process of another sandbox with this workspace runs (none has its
        folder mounted)."""
        return not any(
            o["id"] != record["id"]
            and o["workspace"] == record["workspace"]
            and self._records.busy(o["id"])
            for o in self._records.all()
        )

    def resize(self, sandbox_id: str, spec: Spec) -> bool:
        """The record, and the cgroup's limits at once when it has one."""
        record = self._load(sandbox_id)
        if record is None:
            raise not_found(sandbox_id)
        record.update(
            flavor=spec.flavor, memory=spec.memory, cpus=spec.cpus, pids=spec.pids, disk=spec.disk
        )
        self._save(record)
        self._disks.resize(
            record, spec.disk, not self._records.busy(sandbox_id), lambda: self._quiet(record)
        )
        place = self._place()
        folders = place.folders(sandbox_id).values() if place else []
        if record["state"] == "running" and folders and all(f.is_dir() for f in folders):
            with contextlib.suppress(OSError):  # the record holds it for the next start
                place.limit(sandbox_id, spec.memory, spec.pids, spec.cpus)
        return True

    def get(self, sandbox_id: str) -> SandboxInfo:
        record = self._load(sandbox_id)
        if record is None:
            raise not_found(sandbox_id)
        return self._info(record)

    def list(self, user: str | None = None) -> list[SandboxInfo]:
        if not self.root.is_dir():
            return []
        records = (self._load(p.stem) for p in self.root.glob("*.json"))
        return sorted(
            (self._info(r) for r in records if r and (user is None or r["user"] == user)),
            key=lambda i: i.id,
        )

    def usage(self, infos: builtins.list[SandboxInfo]) -> dict[str, dict[str, float]]:
        place = self._place()
        if not place:
            return {}
        return {i.id: u for i in infos if i.backend == self.name and (u := place.usage(i.id))}

    def disk_usage(self, infos: builtins.list[SandboxInfo]) -> dict[str, dict[str, int]]:
        records = [self._load(i.id) for i in infos if i.backend == self.name]
        return self._disks.usage([r for r in records if r])

    def disk_bound(self) -> str:
        return self._disks.bound_note()

    def workspace_ready(self, info: SandboxInfo) -> None:
        if info.workspace:
            self._disks.workspace_ready(Path(info.workspace).name, Path(info.workspace))

    def egress_denied(self) -> builtins.list[EgressCount]:
        """What the egress proxies of this installation's sandboxes refused, by list and
        reason (each since its proxy started)."""
        return egress.denied(self.root, self._records.all())

    def port_target(self, info: SandboxInfo, port: int) -> PortTarget:
        """Each connection's socket made in the sandbox's own network namespace and
        connected to its loopback (see :mod:`.netns`): no address of the host is
        involved. Only apps that listen on every address are reached (an app on its
        loopback only is not, as on Docker)."""
        if not self.previews:
            raise NotSupported(NO_PREVIEWS)
        self._running(info.id)
        return PortTarget(
            f"http://127.0.0.1:{port}", opener=functools.partial(self._ports.open, info.id, port)
        )

    def no_previews(self) -> str:
        return "" if self.previews else NO_PREVIEWS

    def _folder(self, record: dict[str, Any]) -> Path:
        return self.root / record["id"]

    @contextlib.contextmanager
    def _locked(self, sandbox_id: str) -> Iterator[None]:
        """One process at a time starts or ends a sandbox's holder."""
        folder = self.root / sandbox_id
        folder.mkdir(parents=True, exist_ok=True)
        with open(folder / "holder.lock", "a") as lock:
            fcntl.flock(lock, fcntl.LOCK_EX)
            yield

    def _end_processes(self, sandbox_id: str, then: Callable[[], None] | None = None) -> None:
        """End every process of the sandbox, its holder and network helper; then, still
        holding the lock no process starts without (see :meth:`_holder`), ``then``."""
        with self._locked(sandbox_id):
            procs = self.root / sandbox_id / "procs"
            for marker in procs.glob("*") if procs.is_dir() else []:
                if marker.name.isdigit() and marker_matches(marker):
                    kill_spawn(int(marker.name))
                marker.unlink(missing_ok=True)
            holder.end(self.root / sandbox_id)
            place = self._place()
            if place:
                place.remove(sandbox_id)
            if then is not None:
                then()

    def sweep(self) -> None:
        """End the processes of sandboxes whose record is gone (removed by hand, or a
        destroy that died half-way): a holder would otherwise run for ever; and their
        disks go."""
        if not self.root.is_dir():
            return
        live, orphans = set(), []
        for folder in self.root.iterdir():
            if not folder.is_dir() or folder.name.startswith("."):
                continue
            record = self._load(folder.name)
            if record is None:
                self._end_processes(folder.name)
                orphans.append(folder)
            else:
                live.add(record["engine_id"])
        self._disks.sweep(live, orphans)

    def end_all(self) -> None:
        """End every process of every sandbox of this installation (they stay as they
        are on disk, and start again at their next use)."""
        if self.root.is_dir():
            for folder in self.root.iterdir():
                if folder.is_dir() and not folder.name.startswith("."):
                    self._end_processes(folder.name)

    def stop(self, sandbox_id: str) -> SandboxInfo:
        record = self._load(sandbox_id)
        if record is None:
            raise not_found(sandbox_id)

        def stopped() -> None:  # before a process waiting to start may look
            record.update(self._load(sandbox_id) or {}, state="stopped", stopped_at=time.time())
            self._save(record)

        self._end_processes(sandbox_id, then=stopped)
        return self._info(record)

    def start(self, sandbox_id: str, progress: Progress | None = None) -> SandboxInfo:
        record = self._load(sandbox_id)
        if record is None:
            raise not_found(sandbox_id)
        if record["state"] != "running":
            record["state"] = "running"
            record["started_at"] = time.time()
            self._save(record)
        return self._info(record)

    def remake(
        self, sandbox_id: str, key: ScopeKey, spec: Spec, labels: dict[str, str], progress: Progress
    ) -> SandboxInfo:
        """Its processes get their folders at their start (the stop ended its holder):
        the record takes the new mappings, and everything of the sandbox is kept."""
        with self._locked(sandbox_id):
            record = self._load(sandbox_id)
            if record is None:
                return self.create(sandbox_id, key, spec, labels, progress)
            record["volumes"] = [[v.source, v.target, v.mode] for v in spec.volumes]
            record["labels"] = {**labels, LABEL_WORKSPACE: record["workspace"]}
            self._save(record)
        return self.start(sandbox_id, progress)

    def check_volumes(self, volumes: tuple[Volume, ...]) -> None:
        super().check_volumes(volumes)
        if volumes and not bwrap_works():
            raise NotSupported(
                f"mapping '{volumes[0]}': local sandboxes here are plain host processes (no "
                f"bubblewrap), which cannot see a folder at {volumes[0].target}; install "
                "bubblewrap, or use Docker"
            )

    def destroy(self, sandbox_id: str) -> bool:
        record = self._load(sandbox_id)
        if record is None:
            return False
        removed: builtins.list[bool] = []

        def forget() -> None:  # before a process waiting to start may look
            try:
                self._records.path(sandbox_id).unlink()
                removed.append(True)
            except FileNotFoundError:
                pass  # another process destroyed it first

        self._end_processes(sandbox_id, then=forget)
        if not removed:
            return False
        self._disks.release(record)
        shutil.rmtree(self.root / sandbox_id, ignore_errors=True)  # tier 2 goes; workspace stays
        return True

    # -- processes -------------------------------------------------------------------
    def host_path(self, sandbox_id: str, sandbox_path: str) -> Path:
        """The host file behind a sandbox path under /workspace (or /shared)."""
        record = self._running(sandbox_id)
        path = PurePosixPath(sandbox_path)
        for mount, host in (
            (WORKSPACE, record["workspace"]),
            (SHARED, record.get("shared_folder", "")),
        ):
            if host and (path == PurePosixPath(mount) or PurePosixPath(mount) in path.parents):
                return Path(host, *path.relative_to(mount).parts)
        raise SandboxError(f"{sandbox_path} is not under {WORKSPACE}")

    def _running(self, sandbox_id: str) -> dict[str, Any]:
        record = self._load(sandbox_id)
        if record is None:
            raise not_found(sandbox_id)
        if record["state"] != "running":
            raise SandboxError(
                f"sandbox {sandbox_id} is {record['state']}; start it with `sandbox-kernel start {sandbox_id}`"
            )
        return record

    def workspace_source(self, record: dict[str, Any]) -> str:
        """The host folder shown at /workspace: the user's workspace folder (with its
        disk mounted over it, where one bounds it)."""
        return str(record["workspace"])

    def _base_env(
        self, env: dict[str, str] | None, home: str, proxy: dict[str, str] | None = None
    ) -> dict[str, str]:
        return {
            # No ~/.local/bin: the host's programs must not find a planted python3 (the
            # agent puts it first for cells, agent.as_user for the user's commands).
            "PATH": f"{os.path.dirname(sys.executable)}:/usr/local/bin:/usr/bin:/bin",
            "LANG": os.environ.get("LANG", "C.UTF-8"),
            "USER": "sandbox",
            "LOGNAME": "sandbox",
            "PYTHONUNBUFFERED": "1",
            "PIP_BREAK_SYSTEM_PACKAGES": "1",
            "PIP_USER": "1",  # the interpreter's site-packages are the host's: never write there
            **dict(self.settings.env),  # what sandboxes inherit (pass_env): proxies, index
            "HOME": home,
            **(proxy or {}),
            **(env or {}),
        }

    def _holder(self, record: dict[str, Any]) -> tuple[holder.Holder, builtins.list[str]]:
        """The sandbox's holder, started when it is not running, and the cgroup files its
        processes join (with the sandbox's lock held)."""
        sandbox_id, folder = record["id"], self._folder(record)
        place = self._place()
        files: builtins.list[str] = []
        if place:
            try:
                made = place.make(sandbox_id, *resources(record))
            except OSError as exc:
                raise SandboxFailed(
                    f"cannot make the cgroup of sandbox {sandbox_id}: {exc.strerror or exc}"
                ) from None
            files = [str(f) for f in made]
        found = holder.load(folder)
        if found is None:
            if os.geteuid() == 0:
                uid, claim = holder.claim_uid(self.settings.installation, sandbox_id)
                gid = uid
            else:
                uid, gid, claim = os.getuid(), os.getgid(), -1
            network = network_of(record)
            proxy = (
                functools.partial(
                    egress.start_proxy,
                    folder,
                    entries=list(record["egress_allow"]),
                    cgroup_files=files,
                    limits=process_limits(record, self._place().controllers),
                )
                if network == "egress"
                else None
            )
            found = holder.make(
                folder, uid, gid, claim, network == "open", files, system_args(), egress=proxy
            )
            found.protected = protected_paths(record, self.settings.protected_paths)
            found.mapped = mapped_protected(record, self.settings.protected_paths)
            (folder / holder.HOLDER_FILE).write_text(json.dumps(asdict(found)))
        if not os.path.isdir(found.etc):  # its /etc, as of this start
            kind = "slirp4netns" if found.network == "slirp4netns" else "none"
            found.etc = str(shared_etc(self.root / ".etc", kind))
            (folder / holder.HOLDER_FILE).write_text(json.dumps(asdict(found)))
        return found, files

    def _spawn(
        self,
        sandbox_id: str,
        cmd: builtins.list[str],
        cwd: str,
        env: dict[str, str] | None,
        terminal: bool = False,
        **kw: Any,
    ) -> tuple[subprocess.Popen[bytes], Path]:
        record = self._running(sandbox_id)
        if cmd and cmd[0] in ("python3", "python"):
            cmd = [
                sys.executable,
                *cmd[1:],
            ]  # the interpreter running sandbox-kernel: it has IPython
        folder = self._folder(record)
        # Under the sandbox's lock until the process is recorded: a stop or destroy
        # waits for it and ends it, and none starts after them.
        with self._locked(sandbox_id):
            record = self._running(sandbox_id)
            if not self._records.runs(sandbox_id):
                self._prepare(record)
            if bwrap_works():
                proc = self._spawn_bwrap(record, cmd, cwd, env, terminal, **kw)
            else:
                proc = self._spawn_plain(record, cmd, cwd, env, terminal, **kw)
            marker = folder / "procs" / str(proc.pid)
            marker.parent.mkdir(parents=True, exist_ok=True)
            marker.write_text(holder.start_time(proc.pid))
        return proc, marker

    def _spawn_plain(
        self,
        record: dict[str, Any],
        cmd: builtins.list[str],
        cwd: str,
        env: dict[str, str] | None,
        terminal: bool,
        **kw: Any,
    ) -> subprocess.Popen[bytes]:
        """A plain child process of the host (no bubblewrap): no isolation at all."""
        if record.get("egress_allow"):
            raise SandboxFailed(
                f"sandbox {record['id']} has an egress_allow list, which the local backend "
                "cannot hold it to without bubblewrap: install bubblewrap, or destroy it "
                "and clear egress_allow"
            )
        work = record.get("work_folder") or ""
        if cwd.startswith(WORKSPACE):
            host_cwd = str(self.host_path(record["id"], cwd))
        elif work and (cwd == work or cwd.startswith(work + "/")):
            host_cwd = cwd  # the work folder is at its own path
        else:
            host_cwd = record["workspace"]
        memory = int(record.get("memory") or 1 << 30)
        launch = Launch(limits=[(resource.RLIMIT_DATA, memory)], terminal=terminal)
        return start(
            cmd,
            launch,
            cmd[0],
            cwd=host_cwd,
            env=self._base_env(env, str(own_folder(self.root, record) / "home")),
            start_new_session=True,
            **kw,
        )

    def _spawn_bwrap(
        self,
        record: dict[str, Any],
        cmd: builtins.list[str],
        cwd: str,
        env: dict[str, str] | None,
        terminal: bool,
        **kw: Any,
    ) -> subprocess.Popen[bytes]:
        """``cmd`` under bubblewrap in the sandbox's namespaces (see the module)."""
        found, cgroup_files = self._holder(record)
        namespaces = found.namespaces()
        opened = [fd for fd, _ in namespaces]
        staged: builtins.list[tuple[int, str, bool]] = []
        kept: builtins.list[int] = []
        try:
            binds, etc_folder, masks = folder_binds(
                record,
                own_folder(self.root, record),
                self.workspace_source(record),
                self._disks.workspace_image(record),
                found.etc,
                found.protected,
                found.mapped,
                namespaces[0][0],
                staged,
                kept,
                opened,
            )
            memory = resources(record)[0]
            seccomp_fd = filter_fd(opened)
            argv = bwrap_command(
                cmd,
                binds=binds,
                etc_folder=etc_folder,
                masks=masks,
                cwd=cwd,
                env=self._base_env(env, HOME, PROXY_ENV if found.network == "egress" else None),
                tmp_size=memory,
                seccomp_fd=seccomp_fd,
                new_session=not terminal,
            )
            root = os.geteuid() == 0
            launch = Launch(
                cgroup_files=cgroup_files,
                staged=staged,
                become=(found.uid, found.gid) if root else None,
                namespaces=namespaces,
                limits=process_limits(record, self._place().controllers),
                terminal=terminal,
            )
            return start(
                argv,
                launch,
                f"{cmd[0]} in {record['id']}",
                cwd="/",
                env={"PATH": os.environ.get("PATH", "/usr/bin:/bin")},
                start_new_session=True,
                pass_fds=pass_fds(kept, [seccomp_fd] if seccomp_fd >= 0 else []),
                **kw,
            )
        finally:
            close_all(opened)

    def open_channel(
        self,
        sandbox_id: str,
        cmd: builtins.list[str],
        *,
        cwd: str = WORKSPACE,
        env: dict[str, str] | None = None,
    ) -> LocalChannel:
        log = (self.root / sandbox_id / "stderr.log").open("ab")
        try:
            proc, marker = self._spawn(
                sandbox_id, cmd, cwd, env, stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=log
            )
        finally:
            log.close()
        return LocalChannel(proc, marker)

    def open_pty(
        self,
        sandbox_id: str,
        cmd: builtins.list[str],
        *,
        cwd: str = WORKSPACE,
        env: dict[str, str] | None = None,
        rows: int = 24,
        cols: int = 80,
    ) -> LocalPty:
        """``cmd`` in the sandbox's isolation on a pseudo-terminal made for it.

        Never the host's own terminal: a sandboxed process holding the user's terminal
        could push keystrokes into it (TIOCSTI) or rewrite its console (TIOCLINUX), and
        they would run on the host. It gets the slave of a new pair as stdin, stdout,
        stderr and controlling terminal of a session of its own (so Ctrl-C and job
        control work); the host keeps the master and relays it.
        """
        master, slave = os.openpty()  # both close-on-exec: only fds 0-2 reach the child
        try:
            fcntl.ioctl(slave, termios.TIOCSWINSZ, struct.pack("HHHH", rows, cols, 0, 0))
            proc, marker = self._spawn(
                sandbox_id,
                cmd,
                cwd,
                env,
                terminal=True,
                stdin=slave,
                stdout=slave,
                stderr=slave,
            )
        except BaseException:
            os.close(master)
            raise
        finally:
            os.close(slave)
        return LocalPty(proc, marker, master)

    def exec(
        self,
        sandbox_id: str,
        cmd: builtins.list[str],
        *,
        cwd: str = WORKSPACE,
        env: dict[str, str] | None = None,
        timeout: float | None = None,
    ) -> ExecResult:
        proc, marker = self._spawn(
            sandbox_id,
            cmd,
            cwd,
            env,
            stdin=subprocess.DEVNULL,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
        )
        try:
            out, _ = proc.communicate(timeout=timeout)
            code = proc.returncode
        except subprocess.TimeoutExpired:
            kill_spawn(proc.pid)
            out, _ = proc.communicate()
            out += f"timed out after {timeout} s\n".encode()
            code = 124
        finally:
            marker.unlink(missing_ok=True)
        return ExecResult(code if code >= 0 else 128 - code, out)

    # -- files ------------------------------------------------------------------------
    def _files(self, sandbox_id: str, path: str) -> tuple[Beneath, str]:
        """The workspace (as a :class:`Beneath`: a cell can plant links and FIFOs in it,
        so files are reached through descriptors only) and the path in it."""
        record = self._load(sandbox_id)
        if record is None:
            raise not_found(sandbox_id)
        return Beneath(record["workspace"]), workspace_relative(path)

    def put_file(self, sandbox_id: str, path: str, data: bytes | IO[bytes]) -> None:
        files, rel = self._files(sandbox_id, path)
        upload = files.start_write(rel)
        try:
            if isinstance(data, bytes | bytearray):
                upload.write(bytes(data))
            else:
                while chunk := data.read(1 << 20):
                    upload.write(chunk)
            upload.commit()
        finally:
            upload.abort()  # no-op after a commit

    def get_file(self, sandbox_id: str, path: str) -> Iterator[bytes]:
        files, rel = self._files(sandbox_id, path)
        try:
            _, chunks = files.read_chunks(rel)
        except FileMissing:
            raise SandboxError(f"no file {path!r} in sandbox {sandbox_id}") from None
        yield from chunks
