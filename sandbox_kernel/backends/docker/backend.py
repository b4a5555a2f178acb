"""Sandboxes as Docker containers, one per scope key: their life cycle and processes.

A container is found again by its deterministic name (the sandbox id plus this
installation's tag, see :func:`~.base.engine_name`) and our labels, so the kernel, the
CLI and the server agree without sharing a process; a name conflict on create means
another process won the race, and we use its container. Containers run hardened
(:mod:`.security`); the container's main process only waits, and the interpreters are
``docker exec`` processes whose stdin and stdout form a :class:`~.channel.DockerChannel`.

The rest of the backend lives beside this module, one concern each: :mod:`.errors`
(every engine error becomes ours there), :mod:`.info` (labels; a container as a
SandboxInfo), :mod:`.images`, :mod:`.home` (what a new container gets before its first
start), :mod:`.mounts`, :mod:`.disk`, :mod:`.protect`, :mod:`.network`,
:mod:`.egress`, :mod:`.env`, :mod:`.snapshots`, :mod:`.carry`, :mod:`.files`,
:mod:`.sockets`, :mod:`.cgroups`. The calls on a kernel's path (look up, create,
start, processes) are requests stated in :mod:`.wire` and sent without the docker SDK
to a local engine; the SDK serves the rest, and everything for a remote engine.
"""

from __future__ import annotations

import builtins
import logging
import os
import time
from collections.abc import Iterator
from functools import partial
from pathlib import Path
from typing import IO, Any

from ...agent import bootstrap_command, bundle, inline, program
from ...identity import ScopeKey
from .. import idmap
from ..base import (
    LABEL_AGENT_SOCKETS,
    LABEL_INSTALLATION,
    LABEL_MANAGED,
    LABEL_SPEC,
    LABEL_USER_ID,
    LABEL_WORKSPACE,
    SHARED,
    WORKSPACE,
    AlreadyExists,
    Backend,
    Conflict,
    EgressCount,
    EngineSettings,
    EngineUnavailable,
    ExecResult,
    Health,
    PortTarget,
    Progress,
    SandboxError,
    SandboxFailed,
    SandboxInfo,
    SandboxNotFound,
    SnapshotInfo,
    Spec,
    engine_name,
    not_found,
    sandbox_id_of,
)
from .accounts import (
    bundle_folder,
    refresh_trust,
    trust_for_new,
)
from .carry import DockerCarry, remake_lock
from .cgroups import end_stuck_starts, unwedge_container
from .channel import DockerChannel, DockerPty, open_docker_pty
from .disk import IMAGE, STORAGE_OPT, DockerDisks, disk_label, read_label
from .egress import EgressProxies
from .egress import sandbox_config as egress_config
from .env import (
    DEFAULT_PATH,
    env_of,
    exec_env,
    path_of,
    process_env,
    sandbox_environment,
    sandbox_path,
)
from .errors import create_failed, engine_errors, exec_failure, unreachable
from .files import HelperOpener, helper_opener, read_file, write_file
from .home import HomeMaker
from .images import ensure_image, image_present, local_images
from .info import (
    LABEL_CPUS,
    LABEL_DISK,
    LABEL_MEMORY,
    LABEL_MOUNT,
    LABEL_MOUNT_ID,
    LABEL_OWNERSHIP,
    LABEL_PIDS,
    LABEL_RUNTIME,
    LABEL_SNAPSHOT_REF,
    LABEL_TRUST,
    LABEL_UID,
    LABEL_VOLUME_MOUNTS,
    LABEL_WORK_MOUNT,
    LABEL_WORK_MOUNT_ID,
    LABEL_WORKSPACE_DISK,
    STATES,
    Inspected,
    container_info,
    memory_usage,
    summary_info,
)
from .mounts import WorkspaceMounts, bind_mount
from .network import NETWORK, port_target_of, shared_network
from .protect import protect_started
from .security import hardened_host
from .snapshots import DockerSnapshots
from .sockets import AGENT_SOCKETS, AgentListener, AgentSocketFolders
from .wire import ENGINE_TIMEOUT, EngineCalls, EngineWire, SdkCalls

# The container's PID 1 (under docker-init) only waits; python3 is the one thing every
# image we support has, so we do not depend on `sleep` or a shell.
IDLE_COMMAND = inline("import signal; signal.pause()")
EXEC_OUTPUT_LIMIT = 64 << 20  # bytes of a command's output kept by exec(); the rest is dropped
log = logging.getLogger(__name__)
EXEC_GRACE = 5.0  # seconds the host waits past an exec's time limit before it gives up on it
# Seconds an inspect may take before the host looks for frozen starts holding the
# container (a healthy engine answers in milliseconds, a loaded one in a second or two).
INSPECT_PATIENCE = 5.0


class DockerBackend(Backend):
    """The default engine: Docker, through its socket and the ``docker`` SDK."""

    name = "docker"
    finds_engine_ids = True
    keeps_spares = True
    resizes = True
    previews = True
    keeps_files_on_remake = True

    def __init__(self, settings: EngineSettings) -> None:
        super().__init__(settings)
        self._client: Any = None
        self._installation = settings.installation
        self._network_checked = False
        self._mounts = WorkspaceMounts(settings)
        self._sockets = AgentSocketFolders(settings.state_dir)
        self._snapshots = DockerSnapshots(settings.installation, lambda: self.client)
        self._carry = DockerCarry(
            settings.installation, lambda: self._engine, lambda: self.client, settings.idle_delete
        )
        # The calls on a kernel's path go straight to a local engine's socket, without
        # the SDK (see docker_wire); None: the SDK carries them too (a remote engine).
        self._wire = EngineWire.from_env()
        self._home = HomeMaker(lambda: self._engine, self._wire is not None, settings.ca_bundle)
        self._disks = DockerDisks(
            settings, lambda: self._engine, lambda: self._wire is not None, self._mounts.release
        )
        self._egress = EgressProxies(
            settings.installation, lambda: self._engine, lambda: self.client
        )

    @property
    def _engine(self) -> EngineCalls:
        """Who carries the calls of a kernel's path (look up, create, start, processes)."""
        return self._wire if self._wire is not None else SdkCalls(self.client.api)

    # -- engine --------------------------------------------------------------
    @property
    def client(self) -> Any:
        """The SDK client, made (and the engine pinged) on first use."""
        if self._client is None:
            import docker  # only here: a kernel's start never needs it (see docker_wire)

            try:
                client = docker.from_env(timeout=ENGINE_TIMEOUT)
                client.ping()
            except Exception as exc:  # whatever stops us connecting, the advice is the same
                raise EngineUnavailable(unreachable(exc)) from None
            self._client = client
        return self._client

    def health(self) -> Health:
        try:
            with engine_errors("ask the engine its version"):
                version = self.client.version().get("Version", "?")
        except SandboxError as exc:
            return Health(False, self.name, str(exc))
        return Health(True, self.name, f"Docker engine {version} answers")

    def _engine_info(self) -> dict[str, Any]:
        """The engine's info (CPUs, storage driver), asked once per backend."""
        if not hasattr(self, "_info"):
            with engine_errors("ask the engine about itself"):
                self._info: dict[str, Any] = self._engine.info()
        return self._info

    def disk_bound(self) -> str:
        return self._disks.bound_note(self._engine_info())

    # -- lookups -------------------------------------------------------------
    def _id(self, container: Any) -> str:
        """The sandbox id of one of our containers (its name without our installation tag)."""
        return sandbox_id_of(self._installation, container.name)

    def _ours(self, labels: dict[str, str] | None) -> bool:
        """Made by sandbox-kernel, and by this installation (this state folder)."""
        labels = labels or {}
        return (
            labels.get(LABEL_MANAGED) == "1"
            and labels.get(LABEL_INSTALLATION) == self._installation
        )

    def _lookup(self, sandbox_id: str) -> Inspected | None:
        """Our container by sandbox id (or engine id), as one inspect sees it, or None;
        others' are never ours."""
        for candidate in (engine_name(self._installation, sandbox_id), sandbox_id):
            try:
                found = Inspected(self._inspect_attrs(candidate, sandbox_id))
            except SandboxNotFound:
                continue
            if self._ours(found.labels):
                return found
        return None

    def _container(self, sandbox_id: str) -> Any:
        """Our container as the SDK's model, to act on it (stop, start, remove), or None."""
        found = self._lookup(sandbox_id)
        return None if found is None else self.client.containers.prepare_model(found.attrs)

    def _inspect_attrs(self, name: str, sandbox_id: str) -> dict[str, Any]:
        """Inspect one container. Every call that acts on a sandbox (stop, destroy, a
        process) looks it up here first, so this is where a sandbox whose processes
        froze a start is noticed: the engine then holds the container's lock and the
        inspect gets no answer (see :meth:`unwedge`). After INSPECT_PATIENCE seconds
        the host frees it from such starts and asks once more, with the usual patience."""
        try:
            with engine_errors(f"look up {sandbox_id}"):
                return self._get_attrs(name, INSPECT_PATIENCE)
        except EngineUnavailable:
            self.unwedge(sandbox_id)
        with engine_errors(f"look up {sandbox_id}"):
            return self._get_attrs(name, ENGINE_TIMEOUT)

    def _get_attrs(self, name: str, timeout: float) -> dict[str, Any]:
        return self._engine.inspect_container(name, timeout)

    def _require(self, sandbox_id: str) -> Any:
        container = self._container(sandbox_id)
        if container is None:
            raise not_found(sandbox_id)
        return container

    def find(self, sandbox_id: str) -> SandboxInfo | None:
        container = self._lookup(sandbox_id)
        if container is None:
            return None
        return self._disks.describe(container_info(self._installation, container), container.labels)

    def list(self, user: str | None = None) -> list[SandboxInfo]:
        filters = [f"{LABEL_MANAGED}=1", f"{LABEL_INSTALLATION}={self._installation}"]
        if user is not None:
            filters.append(f"{LABEL_USER_ID}={ScopeKey(user).user_id}")
        # One round trip for the whole list (the SDK's containers.list inspects each one).
        with engine_errors("list sandboxes"):
            summaries = self._engine.list_containers({"label": filters})
        return sorted(
            (
                self._disks.describe(summary_info(self._installation, s), s.get("Labels") or {})
                for s in summaries
            ),
            key=lambda i: i.id,
        )

    # -- create ----------------------------------------------------------------
    def create(
        self, sandbox_id: str, key: ScopeKey, spec: Spec, labels: dict[str, str], progress: Progress
    ) -> SandboxInfo:
        name = engine_name(self._installation, sandbox_id)

        def pulled() -> Inspected:
            return ensure_image(self._engine, lambda: self.client, spec.image, progress)

        image = self._carry.find(sandbox_id, spec) or (
            self._snapshots.image(spec) if spec.snapshot_ref else pulled()
        )
        if spec.egress and spec.network:  # its one way out, before it can need it
            # Never a user's snapshot: the proxy would keep it from being deleted.
            base = pulled() if spec.snapshot_ref else image
            labels = self._egress.for_sandbox(spec.egress, labels, base)
        config = self._create_config(sandbox_id, key, spec, labels, image)
        try:
            engine_id = self._disks.create_container(name, sandbox_id, config)
        except Conflict:  # the name is taken: another process of ours won the race?
            raise self._lost_race(name, sandbox_id) from None
        except (SandboxFailed, SandboxNotFound) as exc:  # refused, or its image removed meanwhile
            self._mounts.release(name)
            self._sockets.release(name)
            raise create_failed(sandbox_id, spec.runtime, exc) from None
        created = Inspected({"Id": engine_id, "Name": "/" + name, "Config": config})
        if read_label(config["Labels"])[0] == IMAGE:
            created = self._reinspect(created)  # where its layer is
            try:
                self._disks.bound_layer(created, spec.disk)
            except SandboxError:
                self._remove_failed(created)
                raise
        self._prepare(created, just_created=True)
        return self._start(created, fresh=True, progress=progress)

    def _remove_failed(self, container: Inspected) -> None:
        """A container whose making failed half-way goes, with what the host made for it."""
        try:
            with engine_errors("remove", self._id(container)):
                self.client.api.remove_container(container.id, force=True)
        except SandboxError:
            pass
        self._mounts.release(container.name)
        self._sockets.release(container.name)
        self._disks.release(container.id)

    def _lost_race(self, name: str, sandbox_id: str) -> SandboxError:
        """Why the name was taken: by the winner of a create race (take its container), or
        by a container that is not ours (never touched)."""
        labels = self._labels_when_visible(name, sandbox_id)
        if labels is not None and not self._ours(labels):
            return SandboxFailed(
                f"a container named {name} exists but was not made by this sandbox-kernel "
                "installation; rename or remove it (we never touch containers that are not ours)"
            )
        return AlreadyExists(f"{sandbox_id} was made by another process")

    def _labels_when_visible(self, name: str, sandbox_id: str) -> dict[str, str] | None:
        """The labels of container ``name``, waiting a little for it: the winner of a
        create race takes the name before it can be looked up. None if it never shows."""
        deadline = time.monotonic() + 5
        while True:
            try:
                with engine_errors(f"look up {sandbox_id}"):
                    return Inspected(self._engine.inspect_container(name)).labels
            except SandboxNotFound:
                if time.monotonic() > deadline:
                    return None
                time.sleep(0.05)

    def image_present(self, name: str) -> bool:
        """Whether image ``name`` is on the engine (nothing is pulled)."""
        return image_present(self._engine, name)

    def local_images(self) -> builtins.list[str]:
        """Tagged images on the engine, newest first (what a user could start from)."""
        return local_images(self.client)

    def _network(self) -> str:
        """Our shared network, made or checked once per process."""
        if not self._network_checked:
            shared_network(self._engine)
            self._network_checked = True
        return NETWORK

    def _create_config(
        self, sandbox_id: str, key: ScopeKey, spec: Spec, labels: dict[str, str], image: Any
    ) -> dict[str, Any]:
        """The engine's create request for the sandbox: the hardening lives here."""
        name = engine_name(self._installation, sandbox_id)
        uid, gid, how = self._mounts.ownership(image)
        owner = (uid, gid) if how == "chown" else None
        unbounded: list[str] = []  # why the workspace has no disk, if it has none
        bound = partial(self._disks.bound, key.user_id, size=spec.disk, owner=owner)
        workspace, source = self._mounts.workspace(
            key, name, uid, gid, how, lambda folder: unbounded.append(bound(folder))
        )
        path = sandbox_path(env_of(image.attrs).get("PATH", DEFAULT_PATH))
        mounts = [bind_mount(WORKSPACE, str(source))]
        work_mounts, work_point = self._mounts.work_folder(name, spec, uid, gid, how)
        mounts += work_mounts
        if spec.shared_folder:
            mounts.append(bind_mount(SHARED, spec.shared_folder, read_only=True))
        volume_mounts, volume_points = self._mounts.volumes(name, spec, uid, gid, how)
        mounts += volume_mounts
        sockets = ""
        if self._wire is not None:  # a local engine: it mounts this host's folders
            sockets = str(self._sockets.ensure(name))
            mounts.append(bind_mount(AGENT_SOCKETS, sockets, read_only=True))
        trust_label, trust_mount = trust_for_new(
            self._wire is not None, self.settings.state_dir, self.settings.ca_bundle
        )
        if trust_mount is not None:
            mounts.append(trust_mount)
        cpus = self._cpus(spec)
        network = self._network() if spec.network else "none"
        host = hardened_host(spec, mounts, cpus, network)
        way = self._disks.layer_way(self._engine_info()) if spec.disk else ""
        if way == STORAGE_OPT:
            host["StorageOpt"] = {"size": str(spec.disk)}
        config = {
            "Image": image.id,
            "Cmd": IDLE_COMMAND,
            "Entrypoint": [],
            "User": f"{uid}:{gid}",
            "WorkingDir": WORKSPACE,
            "Hostname": "sandbox",
            "Env": [f"{k}={v}" for k, v in sandbox_environment(path, bool(trust_label)).items()],
            "Labels": {
                **labels,
                LABEL_WORKSPACE: str(workspace),
                LABEL_CPUS: f"{cpus:g}",
                LABEL_MEMORY: str(spec.memory),
                LABEL_PIDS: str(spec.pids),
                LABEL_UID: f"{uid}:{gid}",
                LABEL_OWNERSHIP: how,
                LABEL_MOUNT: str(source) if how == "idmap" else "",
                LABEL_WORK_MOUNT: work_point,
                LABEL_MOUNT_ID: idmap.identity(Path(source)) if how == "idmap" else "",
                LABEL_WORK_MOUNT_ID: idmap.identity(Path(work_point)) if work_point else "",
                LABEL_VOLUME_MOUNTS: volume_points,
                LABEL_RUNTIME: spec.runtime,
                LABEL_SNAPSHOT_REF: spec.snapshot_ref,
                LABEL_AGENT_SOCKETS: sockets,
                LABEL_DISK: disk_label(way, spec.disk),
                LABEL_WORKSPACE_DISK: "" if any(unbounded) else "1",
                LABEL_TRUST: trust_label,
            },
            "HostConfig": host,
        }
        if spec.egress and spec.network:
            egress_config(config, self._installation, spec.egress)
        return config

    def refresh_trust(self) -> None:
        refresh_trust(self._wire is not None, self.settings.state_dir, self.settings.ca_bundle)

    def _cpus(self, spec: Spec) -> float:
        # Docker refuses more CPUs than the engine's machine has: a large flavor on a
        # small host gets all of its CPUs rather than an error. Every engine has one
        # (no need to ask it, which costs a create 20 ms).
        if spec.cpus <= 1:
            return spec.cpus
        return min(spec.cpus, float(self._engine_info().get("NCPU") or os.cpu_count() or 1))

    def _prepare(self, container: Inspected, *, just_created: bool = False) -> None:
        """The sandbox user's HOME and the root files, before the first start (home.py)."""
        self._home.prepare(
            container, self._id(container), self._reinspect, just_created=just_created
        )

    def _start(
        self, container: Inspected, fresh: bool = False, progress: Progress | None = None
    ) -> SandboxInfo:
        """Start the container (its disks and idmapped mounts first: a reboot drops
        them; ``fresh``: all made just now); the sandbox as it runs."""
        disk_folder = None if fresh else self._disks.remount(container)
        self._mounts.remount(container.labels, disk_folder)
        if not fresh:  # its egress proxy, if it has one, may have been removed since
            self._egress.again(container.labels, path_of(container.attrs))
        with engine_errors("start", self._id(container), refused=SandboxFailed):
            self._engine.start_container(container.id)
        started = self._reinspect(container)
        if started.status != "running":
            with engine_errors("read the output of", self._id(container)):
                logs = self.client.api.logs(container.id, tail=5).decode("utf-8", "replace").strip()
            hint = (
                " (does the image have python3 on its PATH?)"
                if "python3" in logs or not logs
                else ""
            )
            raise SandboxFailed(
                f"sandbox {self._id(container)} stopped right after start{hint}: {logs[-300:]}"
            )
        self._protect(started, progress)
        return self._disks.describe(container_info(self._installation, started), started.labels)

    def _protect(self, container: Inspected, progress: Progress | None = None) -> None:
        """Make what host tools trust in the writable host folders (the work folder, the
        writable mapped folders) read-only inside the container, found afresh, and have
        the kernel refuse protected names made there later, before any process of the
        user's runs (see protect.py)."""
        sid = self._id(container)
        for line in protect_started(
            container.attrs, self.settings, self._wire is not None, progress
        ):
            log.warning("sandbox %s: %s", sid, line)

    def _reinspect(self, container: Inspected) -> Inspected:
        with engine_errors("read the state of", self._id(container)):
            return Inspected(self._engine.inspect_container(container.id))

    # -- life ------------------------------------------------------------------
    def unwedge(self, sandbox_id: str) -> None:
        """Kill the runtime's starts that the sandbox's processes froze
        (:func:`.cgroups.unwedge_container`)."""
        stuck = unwedge_container(self._engine, engine_name(self._installation, sandbox_id))
        if stuck:
            log.warning("sandbox %s: ended %d process start(s) it had frozen", sandbox_id, stuck)

    def stop(self, sandbox_id: str) -> SandboxInfo:
        container = self._require(sandbox_id)
        with engine_errors("stop", sandbox_id):
            container.stop(timeout=5)
        return container_info(self._installation, self._reinspect(Inspected(container.attrs)))

    def start(self, sandbox_id: str, progress: Progress | None = None) -> SandboxInfo:
        container = self._lookup(sandbox_id)
        if container is None:
            raise not_found(sandbox_id)
        if container.status == "created":
            # Either another process is between create and start (give it a moment), or
            # a create crashed half-way; preparing and starting is idempotent either way.
            deadline = time.monotonic() + 10
            while container.status == "created" and time.monotonic() < deadline:
                time.sleep(0.1)
                container = self._reinspect(container)
            if container.status == "created":
                self._prepare(container)
        if container.status == "paused":
            with engine_errors("unpause", sandbox_id):
                self._engine.unpause_container(container.id)
        elif container.status == "removing":  # `docker rm` under way: gone, as for a lookup
            raise not_found(sandbox_id)
        elif container.status == "dead":
            raise SandboxFailed(f"sandbox {sandbox_id} is dead and cannot start")
        elif container.status != "running":
            if progress:
                progress(f"starting sandbox {sandbox_id}")
            if container.labels.get(LABEL_AGENT_SOCKETS):  # (a create made it just now)
                self._sockets.ensure(container.name)
            if container.labels.get(LABEL_TRUST) == "mount":  # its source folder, current
                bundle_folder(self.settings.state_dir, self.settings.ca_bundle)
            return self._start(container, progress=progress)
        return container_info(self._installation, self._reinspect(container))

    def resize(self, sandbox_id: str, spec: Spec) -> bool:
        """CPUs, memory and processes of a container change in place (``docker update``)."""
        container = self._require(sandbox_id)
        api = self.client.api
        # The SDK's update_container knows neither NanoCpus nor PidsLimit; the API does.
        body = {
            "Memory": spec.memory,
            "MemorySwap": spec.memory,
            "NanoCpus": int(self._cpus(spec) * 1e9),
            "PidsLimit": spec.pids,
        }
        with engine_errors("resize", sandbox_id):
            api._raise_for_status(
                api._post_json(api._url("/containers/{0}/update", container.id), data=body)
            )
        self._disks.resize(Inspected(container.attrs), spec.disk)
        return True

    def destroy(self, sandbox_id: str) -> bool:
        container = self._container(sandbox_id)
        if container is None:
            return False
        try:
            self._remove(Inspected(container.attrs))
        except SandboxNotFound:
            return False
        except Conflict:  # removal already in progress elsewhere
            return True
        self._carry.remove(self._id(container))  # its files kept by a remake, if any
        return True

    def _remove(self, container: Inspected) -> None:
        """Remove ``container`` and what the host made for it (not its carry image)."""
        with engine_errors("remove", self._id(container)):
            self.client.api.remove_container(container.id, force=True)
        self._mounts.release(container.name)
        self._sockets.release(container.name)
        self._disks.release(container.id)

    def remake(
        self, sandbox_id: str, key: ScopeKey, spec: Spec, labels: dict[str, str], progress: Progress
    ) -> SandboxInfo:
        """The stopped container committed to its carry image, removed, and made anew from
        that image with ``spec``'s mounts (see carry.py): its own files are kept."""
        with remake_lock(self.settings.state_dir, sandbox_id):
            found = self._lookup(sandbox_id)
            if found is not None and found.labels.get(LABEL_SPEC) == labels.get(LABEL_SPEC):
                return self.start(sandbox_id, progress)  # another process made it meanwhile
            if found is not None:
                if found.status == "running":
                    raise Conflict(f"sandbox {sandbox_id} is running; stop it to make it anew")
                progress(f"keeping the files of {sandbox_id} to make it anew with its new folders")
                self._carry.commit(found, sandbox_id, spec)
                self._remove(found)
            return self.create(sandbox_id, key, spec, labels, progress)

    def workspace_ready(self, info: SandboxInfo) -> None:
        self._disks.workspace_ready(info)

    def sweep(self) -> None:
        """Unmount idmapped mounts whose container is gone (removed with `docker rm`), and
        free the engine from process starts that running sandboxes froze (whatever
        started them: a kernel, a terminal, a spare), so none stays wedged for longer
        than one reaper's round."""
        with engine_errors("list sandboxes"):
            summaries = self._engine.list_containers(
                {"label": [f"{LABEL_INSTALLATION}={self._installation}"]}
            )
        names = {(c.get("Names") or ["/?"])[0].lstrip("/") for c in summaries}
        self._mounts.sweep(names)
        self._sockets.sweep(names)
        self._disks.sweep({c["Id"] for c in summaries})
        self._carry.sweep({sandbox_id_of(self._installation, n) for n in names})
        for summary in summaries:
            if summary.get("State") == "running" and end_stuck_starts(summary["Id"]):
                log.warning("%s: ended process starts it had frozen", summary.get("Names"))

    # -- processes -------------------------------------------------------------
    def _running(self, sandbox_id: str) -> Inspected:
        container = self._lookup(sandbox_id)
        if container is None:
            raise not_found(sandbox_id)
        if container.status != "running":
            sid = self._id(container)
            raise SandboxError(
                f"sandbox {sid} is {STATES.get(container.status, container.status)}; "
                f"start it with `sandbox-kernel start {sid}`"
            )
        return container

    def open_channel(
        self,
        sandbox_id: str,
        cmd: builtins.list[str],
        *,
        cwd: str = WORKSPACE,
        env: dict[str, str] | None = None,
        merge_stderr: bool = False,
    ) -> DockerChannel:
        container = self._running(sandbox_id)
        config = {
            "User": "",
            "Privileged": False,
            "Tty": False,
            "AttachStdin": True,
            "AttachStdout": True,
            "AttachStderr": True,
            "Cmd": cmd,
            "Env": [
                f"{k}={v}"
                for k, v in exec_env(container.attrs, self._env(container.attrs, env)).items()
            ],
            "WorkingDir": cwd,
        }
        engine = self._engine
        with engine_errors("run a process in", self._id(container)):
            exec_id = engine.exec_create(container.id, config)
            raw, keep_alive = engine.exec_start(exec_id, False, ENGINE_TIMEOUT)
        raw.settimeout(None)
        channel = DockerChannel(raw, exec_id, merge_stderr=merge_stderr, api=engine)
        channel.keep_alive = keep_alive
        return channel

    def _env(self, attrs: dict[str, Any], env: dict[str, str] | None) -> dict[str, str]:
        return process_env(attrs, self.settings.env, self.settings.ca_bundle, env)

    def agent_listener(self, info: SandboxInfo) -> AgentListener | None:
        if not info.agent_sockets:
            return None  # made before these sockets, or on a remote engine
        try:
            return AgentListener(info.agent_sockets)
        except OSError as exc:  # its folder is gone: the exec stream still works
            log.info("%s: no socket for its interpreter (%s)", info.id, exc)
            return None

    def open_pty(
        self,
        sandbox_id: str,
        cmd: builtins.list[str],
        *,
        cwd: str = WORKSPACE,
        env: dict[str, str] | None = None,
        rows: int = 24,
        cols: int = 80,
    ) -> DockerPty:
        """``docker exec`` with a TTY, as the container's (non-root) user (see
        :func:`.channel.open_docker_pty`)."""
        container = self._running(sandbox_id)
        environment = exec_env(container.attrs, self._env(container.attrs, env))
        with engine_errors("open a terminal in", self._id(container)):
            return open_docker_pty(
                self.client.api,
                container.id,
                cmd,
                cwd=cwd,
                environment=environment,
                size=(rows, cols),
                timeout=min(60.0, self.settings.start_timeout),
            )

    def exec(
        self,
        sandbox_id: str,
        cmd: builtins.list[str],
        *,
        cwd: str = WORKSPACE,
        env: dict[str, str] | None = None,
        timeout: float | None = None,
    ) -> ExecResult:
        deadline = None
        if timeout:
            cmd = program("timeout_runner", str(timeout), *cmd)
            # The runner kills the command in the sandbox at the limit, but it is a
            # process of the sandbox's user: a cell can freeze it (SIGSTOP to all its
            # processes). The host keeps its own deadline, a little later.
            deadline = time.monotonic() + timeout + EXEC_GRACE
        channel = self.open_channel(sandbox_id, cmd, cwd=cwd, env=env, merge_stderr=True)
        try:
            channel.close_input()  # stdin is not used: closing our half tells the process so
            out = bytearray(channel.read_until(deadline, EXEC_OUTPUT_LIMIT))
        finally:
            channel.close()
        # Within the last half second the read gave up at the deadline: the runner in the
        # sandbox would have ended the command EXEC_GRACE seconds before.
        if deadline is not None and time.monotonic() >= deadline - 0.5:
            self.unwedge(sandbox_id)  # a start that never began holds the engine's lock
            out += f"timed out after {timeout} s (the sandbox did not end it)\n".encode()
            return ExecResult(124, bytes(out))
        code = self._exec_state(sandbox_id, channel.exec_id).get("ExitCode")
        code = code if code is not None else -1
        if code in (126, 127) and out.startswith(b"OCI runtime exec failed"):
            return exec_failure(cmd[0], code, bytes(out))
        return ExecResult(code, bytes(out))

    def _exec_state(self, sandbox_id: str, exec_id: str) -> dict[str, Any]:
        """What the engine knows of one ``docker exec`` (exit code, host pid)."""
        with engine_errors("read the state of a process in", sandbox_id):
            return self._engine.exec_inspect(exec_id)

    # -- the warm spare ------------------------------------------------------------------
    def start_spare(self, sandbox_id: str) -> None:
        """Start the sandbox's warm interpreter (agent/spare.py): it says "listening" once
        it waits (or ends at once when another one does), then leaves the exec's stdio,
        so the exec can end while it lives on."""
        channel = self.open_channel(sandbox_id, bootstrap_command("spare"), cwd=WORKSPACE)
        try:
            channel.write(bundle("spare"))
            channel.set_timeout(30)
            if channel.read_line() != b"listening":
                self.unwedge(sandbox_id)  # its start may be frozen, holding the engine
        except OSError:
            pass
        finally:
            channel.close()

    # -- ports ---------------------------------------------------------------------------
    def port_target(self, info: SandboxInfo, port: int) -> PortTarget:
        """The container's own address on our network (see :func:`.network.port_target_of`),
        looked up afresh, for the very container ``info`` was (its engine id)."""
        found = self._lookup(info.engine_id or info.id)
        if found is None or (info.engine_id and found.id != info.engine_id):
            raise not_found(info.id)
        if found.status != "running":
            raise Conflict(
                f"sandbox {info.id} is not running; start it with `sandbox-kernel start {info.id}`"
            )
        return port_target_of(info.id, found.attrs, port)

    # -- usage -----------------------------------------------------------------------
    def usage(self, infos: builtins.list[SandboxInfo]) -> dict[str, dict[str, float]]:
        return memory_usage(infos, lambda: self.client)

    def disk_usage(self, infos: builtins.list[SandboxInfo]) -> dict[str, dict[str, int]]:
        return self._disks.usage(infos)

    def egress_denied(self) -> builtins.list[EgressCount]:
        return self._egress.denied()

    # -- snapshots (docker_snapshots.py) ---------------------------------------------------
    def create_snapshot(self, sandbox_id: str, ref: str, labels: dict[str, str]) -> SnapshotInfo:
        return self._snapshots.create(self._require(sandbox_id), sandbox_id, ref, labels)

    def list_snapshots(self) -> builtins.list[SnapshotInfo]:
        return self._snapshots.all()

    def delete_snapshot(self, ref: str) -> bool:
        return self._snapshots.delete(ref)

    # -- files (files.py) -------------------------------------------------------------------
    def _file_helper(self, sandbox_id: str) -> HelperOpener:
        return helper_opener(partial(self.open_channel, sandbox_id))

    def put_file(self, sandbox_id: str, path: str, data: bytes | IO[bytes]) -> None:
        try:
            write_file(self._file_helper(sandbox_id), sandbox_id, path, data)
        except SandboxError:
            self.unwedge(sandbox_id)  # a helper frozen at its start holds the engine
            raise

    def get_file(self, sandbox_id: str, path: str) -> Iterator[bytes]:
        try:
            yield from read_file(self._file_helper(sandbox_id), sandbox_id, path)
        except SandboxError:
            self.unwedge(sandbox_id)
            raise
