"""Sandboxes as Docker containers, one per scope key.

A container is found again by its deterministic name (the sandbox id plus this
installation's tag, see :func:`~.base.engine_name`) and our labels, so the kernel, the
CLI and the server agree without sharing a process; a name conflict on create means
another process won the race, and we use its container.

Containers run hardened by default: a non-root user, every capability dropped,
no-new-privileges, a seccomp profile of ours (no setuid files, no namespaces, see
:mod:`.docker_security`), pids/memory/CPU limits from the flavor, no published
ports, one shared network on which sandboxes cannot reach each other (or none), and
the runtime the administrator chose (``runsc`` for gVisor). The user's workspace is a
host folder bind-mounted at /workspace, so it outlives the container; a root server
presents it through an idmapped mount (:mod:`.idmap`) so that no host file changes
owner.

The container's main process only waits (``signal.pause()`` under docker-init); the
interpreters are ``docker exec`` processes whose stdin/stdout form a :class:`Channel`.
"""

from __future__ import annotations

import fcntl
import io
import json
import logging
import os
import pwd
import re
import secrets
import tarfile
import time
from collections.abc import Iterator
from pathlib import Path, PurePosixPath
from typing import IO, Any

from ..agent import SPARE_SOCKET, agent_source, bootstrap_command, fs_helper_source
from ..config import FLAVORS
from ..identity import ScopeKey
from ..safefs import make_folder
from . import idmap
from .base import (
    LABEL_FLAVOR,
    LABEL_IMAGE,
    LABEL_INSTALLATION,
    LABEL_MANAGED,
    LABEL_PREFIX,
    LABEL_SCOPE,
    LABEL_SNAPSHOT,
    LABEL_SNAPSHOT_OF,
    LABEL_SOURCE,
    LABEL_SPEC,
    LABEL_THREAD,
    LABEL_USER,
    LABEL_USER_ID,
    LABEL_WORK_FOLDER,
    LABEL_WORKSPACE,
    SHARED,
    WORKSPACE,
    AlreadyExists,
    Backend,
    Conflict,
    EngineSettings,
    EngineUnavailable,
    ExecResult,
    Health,
    Progress,
    SandboxError,
    SandboxFailed,
    SandboxInfo,
    SnapshotInfo,
    Spare,
    Spec,
    engine_name,
    not_found,
    sandbox_id_of,
)
from .cgroups import cgroup_usage
from .docker_channel import DockerChannel
from .docker_security import NETWORK, block_link_local, network_options, seccomp_profile

log = logging.getLogger("sandbox_kernel")

HOME = "/home/sandbox"
SNAPSHOT_REPO = "sandbox-kernel-snapshot"
LABEL_SNAPSHOT_REF = LABEL_PREFIX + "snapshot-ref"  # on snapshots and the sandboxes made from them
LABEL_RUNTIME = LABEL_PREFIX + "runtime"
LABEL_CPUS = LABEL_PREFIX + "cpus"
LABEL_MEMORY = LABEL_PREFIX + "memory"
LABEL_PIDS = LABEL_PREFIX + "pids"
LABEL_UID = LABEL_PREFIX + "uid"  # "uid:gid" the sandbox runs as
LABEL_OWNERSHIP = LABEL_PREFIX + "ownership"  # same-user | idmap | chown (see _ownership)
LABEL_MOUNT = LABEL_PREFIX + "workspace-mount"  # the idmapped mount given to Docker, if any
LABEL_WORK_MOUNT = LABEL_PREFIX + "work-mount"  # the same for the work folder
DEFAULT_UID = 1000
# The container's PID 1 (under docker-init) only waits; python3 is the one thing every
# image we support has, so we do not depend on `sleep` or a shell.
IDLE_COMMAND = ["python3", "-c", "import signal; signal.pause()"]
_STATES = {
    "running": "running",
    "created": "creating",
    "restarting": "creating",
    "paused": "stopped",
    "exited": "stopped",
    "dead": "error",
    "removing": "error",
}


EXEC_OUTPUT_LIMIT = 64 << 20  # bytes of a command's output kept by exec(); the rest is dropped


def _process_identity(host_pid: int) -> tuple[int, str] | None:
    """(pid inside its pid namespace, start time) of a host process, from this host's /proc."""
    if host_pid <= 0:
        return None
    try:
        status = Path(f"/proc/{host_pid}/status").read_text()
        stat = Path(f"/proc/{host_pid}/stat").read_bytes()
    except OSError:
        return None
    nspid = next((line.split()[1:] for line in status.splitlines() if line.startswith("NSpid:")), [])
    if len(nspid) < 2:
        return None
    start = stat[stat.rfind(b")") + 2 :].split()[19].decode()
    return int(nspid[-1]), start


def _flavor_of(limits: dict[str, Any]) -> str:
    """The flavor whose memory a container has now (a resize changes it; labels cannot)."""
    return next((name for name, size in FLAVORS.items() if size["memory"] == limits.get("memory")), "")


def _unused_host_uid() -> int:
    """1000 when no host account has it, else the first uid from 100000 that none has:
    what a sandbox writes must never belong to a real host user."""
    for uid in (DEFAULT_UID, *range(100_000, 165_536)):
        try:
            pwd.getpwuid(uid)
        except KeyError:
            return uid
    return 165_536


def _human_bytes(n: int) -> str:
    for unit in ("B", "KiB", "MiB", "GiB"):
        if n < 1024 or unit == "GiB":
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.1f} {unit}".replace(".0 ", " ")
        n /= 1024
    return f"{n} B"


class DockerBackend(Backend):
    """The default engine: local Docker through the ``docker`` SDK."""

    name = "docker"
    finds_engine_ids = True
    keeps_spares = True
    resizes = True

    def __init__(self, settings: EngineSettings) -> None:
        super().__init__(settings)
        self._client: Any = None
        self._installation = settings.installation
        self._network_checked = False
        self._proc_visible: bool | None = None

    # -- engine --------------------------------------------------------------
    @property
    def client(self) -> Any:
        if self._client is None:
            import docker

            try:
                client = docker.from_env(timeout=60)
                client.ping()
            except Exception as exc:
                raise EngineUnavailable(self._unreachable(exc)) from None
            self._client = client
        return self._client

    @staticmethod
    def _unreachable(exc: Exception) -> str:
        where = os.environ.get("DOCKER_HOST", "unix:///var/run/docker.sock")
        reason = str(exc).splitlines()[0][:200] if str(exc) else type(exc).__name__
        return (
            f"cannot reach the Docker engine at {where} ({reason}); start it "
            "(`sudo systemctl start docker` or `sudo dockerd &`), check DOCKER_HOST and your "
            "permission on the socket, or use SANDBOX_KERNEL_BACKEND=local"
        )

    def health(self) -> Health:
        try:
            version = self.client.version().get("Version", "?")
        except EngineUnavailable as exc:
            return Health(False, self.name, str(exc))
        except Exception as exc:
            return Health(False, self.name, self._unreachable(exc))
        return Health(True, self.name, f"Docker engine {version} answers")

    def _engine_cpus(self) -> float:
        if not hasattr(self, "_ncpu"):
            self._ncpu = float(self._call(self.client.info).get("NCPU") or os.cpu_count() or 1)
        return self._ncpu

    def _call(self, fn: Any, *args: Any, **kwargs: Any) -> Any:
        """Run an SDK call, turning a lost connection into EngineUnavailable."""
        import docker.errors
        import requests

        try:
            return fn(*args, **kwargs)
        except (requests.exceptions.ConnectionError, docker.errors.DockerException) as exc:
            if isinstance(exc, docker.errors.APIError):
                raise
            raise EngineUnavailable(self._unreachable(exc)) from None

    # -- lookups -------------------------------------------------------------
    def _id(self, container: Any) -> str:
        """The sandbox id of one of our containers (its name without our installation tag)."""
        return sandbox_id_of(self._installation, container.name)

    def _ours(self, labels: dict[str, str] | None) -> bool:
        """Made by sandbox-kernel, and by this installation (this state folder)."""
        labels = labels or {}
        return labels.get(LABEL_MANAGED) == "1" and labels.get(LABEL_INSTALLATION) == self._installation

    def _container(self, sandbox_id: str) -> Any:
        """Our container by sandbox id (or engine id), or None; others' are never ours."""
        import docker.errors

        for candidate in (engine_name(self._installation, sandbox_id), sandbox_id):
            try:
                container = self._call(self.client.containers.get, candidate)
            except docker.errors.NotFound:
                continue
            except docker.errors.APIError as exc:
                raise SandboxError(f"Docker refused to look up {sandbox_id!r}: {exc.explanation}") from None
            if self._ours(container.labels):
                return container
        return None

    def _require(self, sandbox_id: str) -> Any:
        container = self._container(sandbox_id)
        if container is None:
            raise not_found(sandbox_id)
        return container

    def _info(self, container: Any) -> SandboxInfo:
        """Everything about one container, from a full inspect (exit reason, stop time)."""
        attrs = container.attrs
        state = attrs.get("State", {})
        host = attrs.get("HostConfig", {})
        exit_reason = ""
        if state.get("OOMKilled"):
            exit_reason = f"out of memory (limit {_human_bytes(host.get('Memory') or 0)})"
        elif state.get("Status") == "exited":
            exit_reason = f"exited with code {state.get('ExitCode')}"
        info = self._summary_info(
            {
                "Names": ["/" + container.name],
                "Id": container.id,
                "State": state.get("Status", ""),
                "Labels": container.labels,
                "Image": attrs.get("Config", {}).get("Image", ""),
                "Created": _parse_time(attrs.get("Created", "")),
                "HostConfig": {"NetworkMode": host.get("NetworkMode", "")},
            }
        )
        info.limits = {
            "cpus": (host.get("NanoCpus") or 0) / 1e9,
            "memory": host.get("Memory") or 0,
            "pids": host.get("PidsLimit") or 0,
            "network": host.get("NetworkMode") != "none",
        }
        info.flavor = _flavor_of(info.limits) or info.flavor
        info.exit_reason = exit_reason
        if state.get("Status") != "running":
            info.finished = _parse_time(state.get("FinishedAt", ""))
        else:
            info.started = _parse_time(state.get("StartedAt", ""))
        return info

    def _summary_info(self, summary: dict[str, Any]) -> SandboxInfo:
        """A listing entry: built from one list call, with limits read from our labels."""
        labels = summary.get("Labels") or {}
        runtime = labels.get(LABEL_RUNTIME, "")
        return SandboxInfo(
            id=sandbox_id_of(self._installation, (summary.get("Names") or ["/?"])[0].lstrip("/")),
            backend=self.name,
            scope=labels.get(LABEL_SCOPE, "user"),
            user=labels.get(LABEL_USER, ""),
            thread=labels.get(LABEL_THREAD, ""),
            state=_STATES.get(summary.get("State", ""), "error"),
            image=labels.get(LABEL_IMAGE) or summary.get("Image", ""),
            created=float(summary.get("Created") or 0),
            engine_id=summary.get("Id", ""),
            flavor=labels.get(LABEL_FLAVOR, ""),
            isolation=(
                "container (non-root, no capabilities, seccomp, pids/memory/CPU limits"
                + (f", runtime {runtime})" if runtime else ")")
            ),
            workspace=labels.get(LABEL_WORKSPACE, ""),
            limits={
                "cpus": float(labels.get(LABEL_CPUS) or 0),
                "memory": int(labels.get(LABEL_MEMORY) or 0),
                "pids": int(labels.get(LABEL_PIDS) or 0),
                "network": (summary.get("HostConfig") or {}).get("NetworkMode") != "none",
            },
            snapshot=labels.get(LABEL_SNAPSHOT_OF, ""),
            spec=labels.get(LABEL_SPEC, ""),
            installation=labels.get(LABEL_INSTALLATION, ""),
            started=_started_from_status(summary.get("Status", "")) if summary.get("State") == "running" else 0.0,
            file_owner=labels.get(LABEL_UID, "") if labels.get(LABEL_OWNERSHIP) == "chown" else "",
            work_folder=labels.get(LABEL_WORK_FOLDER, ""),
        )

    def find(self, sandbox_id: str) -> SandboxInfo | None:
        container = self._container(sandbox_id)
        return None if container is None else self._info(container)

    def list(self, user: str | None = None) -> list[SandboxInfo]:
        filters = [f"{LABEL_MANAGED}=1", f"{LABEL_INSTALLATION}={self._installation}"]
        if user is not None:
            filters.append(f"{LABEL_USER_ID}={ScopeKey(user).user_id}")
        # One round trip for the whole list (the SDK's containers.list inspects each one).
        summaries = self._call(self.client.api.containers, all=True, filters={"label": filters})
        return sorted((self._summary_info(s) for s in summaries), key=lambda i: i.id)

    # -- create ----------------------------------------------------------------
    def create(self, sandbox_id: str, key: ScopeKey, spec: Spec, labels: dict[str, str], progress: Progress) -> SandboxInfo:
        import docker.errors

        name = engine_name(self._installation, sandbox_id)
        image = self._snapshot_image(spec) if spec.snapshot_ref else self._ensure_image(spec.image, progress)
        try:
            container = self._call(self.client.containers.create, **self._create_args(sandbox_id, key, spec, labels, image))
        except docker.errors.APIError as exc:
            if exc.status_code == 409:  # the name is taken: another process of ours won the race?
                if self._foreign(name):
                    raise SandboxFailed(
                        f"a container named {name} exists but was not made by this sandbox-kernel "
                        "installation; rename or remove it (we never touch containers that are not ours)"
                    ) from None
                raise AlreadyExists(f"{sandbox_id} was made by another process") from None
            self._release_mount(name)
            raise self._create_failed(sandbox_id, spec, exc) from None
        self._prepare(container)
        self._start(container)
        return self._info(self._reload(container))

    def _foreign(self, name: str) -> bool:
        """Whether the container holding ``name`` is not ours (a winner of a create race
        may not be visible yet: its name is taken before it can be looked up)."""
        import docker.errors

        deadline = time.monotonic() + 5
        while True:
            try:
                return not self._ours(self._call(self.client.containers.get, name).labels)
            except docker.errors.NotFound:
                if time.monotonic() > deadline:
                    return False
                time.sleep(0.05)

    def _create_failed(self, sandbox_id: str, spec: Spec, exc: Any) -> SandboxFailed:
        """The one-line error for a refused create, naming the setting to change when known."""
        explanation = str(getattr(exc, "explanation", "") or exc)
        if spec.runtime and "runtime" in explanation.lower():
            return SandboxFailed(
                f"Docker has no runtime {spec.runtime!r} ({explanation}); install it and register it "
                "with dockerd (gVisor: runsc), or unset SANDBOX_KERNEL_RUNTIME / c.SandboxConfig.runtime"
            )
        return SandboxFailed(f"Docker could not create {sandbox_id}: {explanation}")

    def _reload(self, container: Any) -> Any:
        self._call(container.reload)
        return container

    def _ensure_image(self, name: str, say: Progress) -> Any:
        import docker.errors

        try:
            return self._call(self.client.images.get, name)
        except docker.errors.ImageNotFound:
            pass
        except docker.errors.APIError as exc:
            raise SandboxFailed(f"bad image name {name!r}: {exc.explanation}") from None
        say(f"image {name} is not here; pulling it")
        repo, _, tag = name.rpartition(":") if ":" in name.rsplit("/", 1)[-1] else (name, "", "latest")
        try:
            last = 0.0
            for event in self._call(self.client.api.pull, repo, tag=tag, stream=True, decode=True):
                if "error" in event:
                    raise SandboxFailed(event["error"])
                if time.monotonic() - last > 2 and event.get("status"):
                    last = time.monotonic()
                    say(f"pulling {name}: {event.get('status')} {event.get('progress', '')}".rstrip())
            return self._call(self.client.images.get, name)
        except (docker.errors.APIError, SandboxFailed) as exc:
            reason = getattr(exc, "explanation", None) or str(exc)
            raise SandboxFailed(
                f"image {name} is not present and could not be pulled ({reason}); "
                "load or build it locally, or set SANDBOX_KERNEL_IMAGE to an image you have"
            ) from None

    # -- who the sandbox runs as, and how it may write the workspace ---------------
    def _ownership(self, image: Any) -> tuple[int, int, str]:
        """(uid, gid, how): the sandbox's user, and how the workspace becomes writable to it.

        * ``same-user``: a server that is not root runs sandboxes as its own uid: files
          the sandbox writes belong to the host user, and nothing changes owner.
        * ``idmap``: a root server runs them as the image's non-root user (or 1000) and
          mounts the workspace idmapped, so root's files look like the sandbox user's
          inside and what the sandbox writes is root's on the host.
        * ``chown``: a root server where idmapped mounts do not work hands the workspace
          to the sandbox uid; then that uid is one no host account has, so no host user
          gains files.
        """
        if os.geteuid() != 0:
            return os.geteuid(), os.getegid(), "same-user"
        configured = (image.attrs.get("Config", {}) or {}).get("User") or ""
        uid = gid = DEFAULT_UID
        if configured and configured.split(":")[0] not in ("root", "0"):
            parts = configured.split(":")
            uid = int(parts[0]) if parts[0].isdigit() else DEFAULT_UID
            gid = int(parts[1]) if len(parts) > 1 and parts[1].isdigit() else uid
            if idmap.supported(str(self._mounts_dir())):
                return uid, gid, "idmap"
            return uid, gid, "chown"
        if idmap.supported(str(self._mounts_dir())):
            return uid, gid, "idmap"
        uid = gid = _unused_host_uid()
        return uid, gid, "chown"

    def _mounts_dir(self) -> Path:
        """Where idmapped mounts live: /run (root-only, emptied at boot like the mounts
        themselves), never under a folder a user might delete with ``rm -rf``, which
        would walk into the mount and delete the workspace."""
        if Path("/run").is_dir():
            return Path("/run/sandbox-kernel") / self._installation[:8]
        return Path(self.settings.state_dir) / "mounts"

    def _mount_point(self, name: str, what: str = "workspace") -> Path:
        return self._mounts_dir() / name / what

    def _workspace_source(self, key: ScopeKey, name: str, uid: int, gid: int, how: str) -> tuple[Path, Path]:
        """(the user's workspace folder, the host path to bind at /workspace)."""
        root = Path(self.settings.workspace_root)
        workspace = make_folder(root, key.user_id, owner=(uid, gid) if how == "chown" else None)
        if how != "idmap":
            return workspace, workspace
        point = self._mount_point(name)
        self._idmap(workspace, point, uid, gid)
        return workspace, point

    def _idmap(self, workspace: Path, point: Path, uid: int, gid: int) -> None:
        """Make (or keep) the idmapped mount; one process at a time per sandbox."""
        point.parent.mkdir(parents=True, exist_ok=True, mode=0o700)
        with open(point.parent / ".lock", "w") as lock:
            fcntl.flock(lock, fcntl.LOCK_EX)
            try:
                idmap.mount(workspace, point, uid, gid)
            except OSError as exc:
                raise SandboxFailed(f"cannot present the workspace {workspace} to the sandbox: {exc}") from None

    def _prepare_mounts(self, container: Any) -> None:
        """Before a start: idmapped mounts do not survive a reboot, so remake them."""
        labels = container.labels
        if labels.get(LABEL_OWNERSHIP) != "idmap":
            return
        uid, _, gid = labels.get(LABEL_UID, f"{DEFAULT_UID}:{DEFAULT_UID}").partition(":")
        for source, point in ((LABEL_WORKSPACE, LABEL_MOUNT), (LABEL_WORK_FOLDER, LABEL_WORK_MOUNT)):
            if labels.get(source) and labels.get(point):
                self._idmap(Path(labels[source]), Path(labels[point]), int(uid), int(gid or uid))

    def _release_mount(self, name: str) -> None:
        for what in ("work", "workspace"):
            point = self._mount_point(name, what)
            if point.parent.exists():
                idmap.unmount(point)

    def _work_mounts(self, name: str, spec: Spec, uid: int, gid: int, how: str) -> tuple[list[Any], str]:
        """The work folder at its own path, and its masks; (mounts, idmapped point or "")."""
        from docker.types import Mount

        if not spec.work_folder:
            return [], ""
        source, point = spec.work_folder, ""
        if how == "idmap":
            point = str(self._mount_point(name, "work"))
            self._idmap(Path(spec.work_folder), Path(point), uid, gid)
            source = point
        mounts = [Mount(spec.work_folder, source, type="bind", read_only=False)]
        for path, kind in spec.masks:
            inside = source + path[len(spec.work_folder) :]
            if kind == "read-only":
                mounts.append(Mount(path, inside, type="bind", read_only=True))
            elif Path(path).is_dir():
                mounts.append(Mount(path, None, type="tmpfs", tmpfs_size=1 << 20))
            else:
                mounts.append(Mount(path, "/dev/null", type="bind", read_only=True))
        return mounts, point

    def sweep(self) -> None:
        """Unmount idmapped mounts whose container is gone (removed with `docker rm`)."""
        base = self._mounts_dir()
        if not base.is_dir():
            return
        names = {
            (c.get("Names") or ["/?"])[0].lstrip("/")
            for c in self._call(self.client.api.containers, all=True, filters={"label": [f"{LABEL_INSTALLATION}={self._installation}"]})
        }
        for folder in base.iterdir():
            if folder.is_dir() and not folder.name.startswith(".") and folder.name not in names:
                self._release_mount(folder.name)

    # -- the network ---------------------------------------------------------------
    def _network(self) -> str:
        """Our shared network (made on first use): sandboxes on it cannot reach each other."""
        import docker.errors

        if self._network_checked:
            return NETWORK
        try:
            network = self._call(self.client.networks.get, NETWORK)
        except docker.errors.NotFound:
            try:
                network = self._call(self.client.networks.create, NETWORK, check_duplicate=True, **network_options())
            except docker.errors.APIError as exc:
                if exc.status_code != 409:
                    raise SandboxFailed(f"Docker could not create the network {NETWORK}: {exc.explanation}") from None
                network = self._call(self.client.networks.get, NETWORK)
        except docker.errors.APIError as exc:
            raise SandboxFailed(f"Docker could not look up the network {NETWORK}: {exc.explanation}") from None
        if network.attrs.get("Labels", {}).get(LABEL_MANAGED) != "1":
            raise SandboxFailed(
                f"a Docker network named {NETWORK} exists but was not made by sandbox-kernel; "
                "remove or rename it (its sandboxes could reach each other)"
            )
        if os.geteuid() == 0:
            problem = block_link_local()
            if problem:
                log.warning("sandboxes may reach link-local addresses (cloud metadata): %s", problem)
        self._network_checked = True
        return NETWORK

    def _create_args(self, sandbox_id: str, key: ScopeKey, spec: Spec, labels: dict[str, str], image: Any) -> dict[str, Any]:
        from docker.types import Mount

        name = engine_name(self._installation, sandbox_id)
        uid, gid, how = self._ownership(image)
        workspace, source = self._workspace_source(key, name, uid, gid, how)
        image_env = dict(
            item.split("=", 1) for item in (image.attrs.get("Config", {}).get("Env") or []) if "=" in item
        )
        path = image_env.get("PATH", "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin")
        mounts = [Mount(WORKSPACE, str(source), type="bind", read_only=False)]
        work_mounts, work_point = self._work_mounts(name, spec, uid, gid, how)
        mounts += work_mounts
        if spec.shared_folder:
            mounts.append(Mount(SHARED, spec.shared_folder, type="bind", read_only=True))
        cpus = self._cpus(spec)
        args: dict[str, Any] = {
            "image": image.id,
            "name": name,
            "command": IDLE_COMMAND,
            "entrypoint": [],
            "init": True,
            "user": f"{uid}:{gid}",
            "working_dir": WORKSPACE,
            "hostname": "sandbox",
            "environment": {
                "HOME": HOME,
                "USER": "sandbox",
                "LOGNAME": "sandbox",
                "PATH": f"{HOME}/.local/bin:{path}",
                # pip falls back to a user install (HOME, kept until destroy) as non-root;
                # Debian-based images refuse even that without this switch.
                "PIP_BREAK_SYSTEM_PACKAGES": "1",
                "PYTHONUNBUFFERED": "1",
            },
            "labels": {
                **labels,
                LABEL_WORKSPACE: str(workspace),
                LABEL_CPUS: f"{cpus:g}",
                LABEL_MEMORY: str(spec.memory),
                LABEL_PIDS: str(spec.pids),
                LABEL_UID: f"{uid}:{gid}",
                LABEL_OWNERSHIP: how,
                LABEL_MOUNT: str(source) if how == "idmap" else "",
                LABEL_WORK_MOUNT: work_point,
                LABEL_RUNTIME: spec.runtime,
                LABEL_SNAPSHOT_REF: spec.snapshot_ref,
            },
            "mounts": mounts,
            "cap_drop": ["ALL"],
            "security_opt": ["no-new-privileges", f"seccomp={seccomp_profile()}"],
            "pids_limit": spec.pids,
            "mem_limit": spec.memory,
            "memswap_limit": spec.memory,
            "nano_cpus": int(cpus * 1e9),
            "detach": True,
        }
        if spec.network:
            args["network"] = self._network()
        else:
            args["network_mode"] = "none"
        if spec.runtime:
            args["runtime"] = spec.runtime
        return args

    def _cpus(self, spec: Spec) -> float:
        # Docker refuses more CPUs than the engine's machine has: a large flavor on a
        # small host gets all of its CPUs rather than an error.
        return min(spec.cpus, self._engine_cpus())

    def _prepare(self, container: Any) -> None:
        """Create the sandbox user's HOME before start (the image may not have it)."""
        uid, _, gid = container.labels.get(LABEL_UID, f"{DEFAULT_UID}:{DEFAULT_UID}").partition(":")
        buf = io.BytesIO()
        with tarfile.open(fileobj=buf, mode="w") as tar:
            for name in ("home", "home/sandbox"):
                entry = tarfile.TarInfo(name)
                entry.type = tarfile.DIRTYPE
                entry.mode = 0o755
                entry.uid, entry.gid = (0, 0) if name == "home" else (int(uid), int(gid or uid))
                entry.mtime = int(time.time())
                tar.addfile(entry)
        self._call(container.put_archive, "/", buf.getvalue())

    def _start(self, container: Any) -> None:
        import docker.errors

        self._prepare_mounts(container)
        try:
            self._call(container.start)
        except docker.errors.APIError as exc:
            raise SandboxFailed(f"Docker could not start {self._id(container)}: {exc.explanation}") from None
        self._reload(container)
        if container.status != "running":
            logs = self._call(container.logs, tail=5).decode("utf-8", "replace").strip()
            hint = " (does the image have python3 on its PATH?)" if "python3" in logs or not logs else ""
            raise SandboxFailed(f"sandbox {self._id(container)} stopped right after start{hint}: {logs[-300:]}")

    # -- life ------------------------------------------------------------------
    def stop(self, sandbox_id: str) -> SandboxInfo:
        container = self._require(sandbox_id)
        self._call(container.stop, timeout=5)
        return self._info(self._reload(container))

    def start(self, sandbox_id: str, progress: Progress | None = None) -> SandboxInfo:
        container = self._require(sandbox_id)
        if container.status == "created":
            # Either another process is between create and start (give it a moment), or
            # a create crashed half-way; preparing and starting is idempotent either way.
            deadline = time.monotonic() + 10
            while container.status == "created" and time.monotonic() < deadline:
                time.sleep(0.1)
                container = self._reload(container)
            if container.status == "created":
                self._prepare(container)
        if container.status == "paused":
            self._call(container.unpause)
        elif container.status in ("dead", "removing"):
            raise SandboxFailed(f"sandbox {sandbox_id} is {container.status} and cannot start")
        elif container.status != "running":
            if progress:
                progress(f"starting sandbox {sandbox_id}")
            self._start(container)
        return self._info(self._reload(container))

    def resize(self, sandbox_id: str, spec: Spec) -> bool:
        """CPUs, memory and processes of a container change in place (``docker update``)."""
        import docker.errors

        container = self._require(sandbox_id)
        api = self.client.api
        # The SDK's update_container knows neither NanoCpus nor PidsLimit; the API does.
        body = {"Memory": spec.memory, "MemorySwap": spec.memory, "NanoCpus": int(self._cpus(spec) * 1e9), "PidsLimit": spec.pids}
        try:
            response = self._call(api._post_json, api._url("/containers/{0}/update", container.id), data=body)
            api._raise_for_status(response)
        except docker.errors.APIError as exc:
            raise SandboxFailed(f"Docker could not resize {sandbox_id}: {exc.explanation}") from None
        return True

    def destroy(self, sandbox_id: str) -> bool:
        import docker.errors

        container = self._container(sandbox_id)
        if container is None:
            return False
        try:
            self._call(container.remove, force=True)
        except docker.errors.NotFound:
            return False
        except docker.errors.APIError as exc:
            if exc.status_code == 409:  # removal already in progress elsewhere
                return True
            raise SandboxError(f"Docker could not remove {sandbox_id}: {exc.explanation}") from None
        self._release_mount(container.name)
        return True

    # -- processes -------------------------------------------------------------
    def _running(self, sandbox_id: str) -> Any:
        container = self._require(sandbox_id)
        if container.status != "running":
            sid = self._id(container)
            raise SandboxError(
                f"sandbox {sid} is {_STATES.get(container.status, container.status)}; "
                f"start it with `sandbox-kernel start {sid}`"
            )
        return container

    def _exec_create(self, container: Any, cmd: list[str], cwd: str, env: dict[str, str] | None) -> str:
        import docker.errors

        try:
            return self._call(
                self.client.api.exec_create,
                container.id,
                cmd,
                stdin=True,
                stdout=True,
                stderr=True,
                tty=False,
                workdir=cwd,
                environment=env or None,
            )["Id"]
        except docker.errors.APIError as exc:
            raise SandboxError(f"cannot run a process in {self._id(container)}: {exc.explanation}") from None

    def open_channel(
        self,
        sandbox_id: str,
        cmd: list[str],
        *,
        cwd: str = WORKSPACE,
        env: dict[str, str] | None = None,
        merge_stderr: bool = False,
    ) -> DockerChannel:
        container = self._running(sandbox_id)
        exec_id = self._exec_create(container, cmd, cwd, env)
        sock = self._call(self.client.api.exec_start, exec_id, socket=True, demux=False)
        raw = getattr(sock, "_sock", sock)
        raw.settimeout(None)
        channel = DockerChannel(raw, exec_id, merge_stderr=merge_stderr, api=self.client.api)
        # The SDK's wrapper holds the HTTP response; once that is garbage-collected it
        # closes the connection under us (an EOF mid-session, at a random moment).
        channel.keep_alive = sock
        return channel

    def exec(
        self,
        sandbox_id: str,
        cmd: list[str],
        *,
        cwd: str = WORKSPACE,
        env: dict[str, str] | None = None,
        timeout: float | None = None,
    ) -> ExecResult:
        if timeout:
            cmd = ["python3", "-c", _TIMEOUT_RUNNER, str(timeout), *cmd]
        channel = self.open_channel(sandbox_id, cmd, cwd=cwd, env=env, merge_stderr=True)
        out = bytearray()
        try:
            # stdin is not used: closing our half tells the process so.
            channel.close_input()
            while True:
                chunk = channel.read()
                if not chunk:
                    break
                if len(out) < EXEC_OUTPUT_LIMIT:
                    out += chunk[: EXEC_OUTPUT_LIMIT - len(out)]
        finally:
            channel.close()
        code = self._call(self.client.api.exec_inspect, channel.exec_id).get("ExitCode")
        code = code if code is not None else -1
        if code in (126, 127) and out.startswith(b"OCI runtime exec failed"):
            return _exec_failure(cmd[0], code, bytes(out))
        return ExecResult(code, bytes(out))

    # -- warm spares -------------------------------------------------------------------
    def start_spare(self, sandbox_id: str) -> Spare | None:
        """Start a warm interpreter for the sandbox's next kernel, and identify it as the
        host sees it: pid in the container and start time, read from this host's /proc
        for the exec's own process. Nothing a process in the sandbox says is trusted,
        so a listener planted by a cell at the same path is never mistaken for it."""
        container = self._running(sandbox_id)
        if not self._host_sees_processes(container):
            return None
        channel = self.open_channel(
            sandbox_id, bootstrap_command(), cwd=WORKSPACE, env={"SANDBOX_AGENT_SPARE_LISTEN": SPARE_SOCKET}
        )
        secret = secrets.token_hex(32)
        try:
            channel.write(agent_source() + secret.encode() + b"\n")
            channel._sock.settimeout(30)
            if channel.read_line() != b"listening":
                return None  # another spare already waits there, or it failed
            host_pid = self._call(self.client.api.exec_inspect, channel.exec_id).get("Pid") or 0
            identity = _process_identity(host_pid)
        except OSError:
            return None
        finally:
            channel.close()  # the spare no longer uses the exec's stdio
        if identity is None:
            return None
        return Spare(engine_id=container.id, pid=identity[0], start_time=identity[1], host_pid=host_pid, secret=secret)

    def spare_alive(self, spare: Spare) -> bool:
        """Whether a recorded spare still runs (the same process: pid and start time)."""
        identity = _process_identity(spare.host_pid)
        return identity == (spare.pid, spare.start_time)

    def _host_sees_processes(self, container: Any) -> bool:
        """Whether this host's /proc shows the engine's processes (a local engine)."""
        if self._proc_visible is None:
            pid = (container.attrs.get("State") or {}).get("Pid") or 0
            self._proc_visible = _process_identity(pid) is not None
        return self._proc_visible

    # -- usage -----------------------------------------------------------------------
    def usage(self, infos: list[SandboxInfo]) -> dict[str, dict[str, float]]:
        """Memory in use per running sandbox.

        Read from the engine host's cgroup files when they are here (no engine round
        trip, so listing 100 sandboxes stays fast); else one one-shot stats call each.
        """
        found: dict[str, dict[str, float]] = {}
        for info in infos:
            local = cgroup_usage(info.engine_id)
            if local is not None:
                found[info.id] = local
                continue
            try:
                raw = self._call(self.client.api.stats, info.engine_id, stream=False, one_shot=True)
            except Exception:
                continue  # it stopped meanwhile: no figure rather than an error
            mem = raw.get("memory_stats") or {}
            cache = (mem.get("stats") or {}).get("total_inactive_file", 0) or (mem.get("stats") or {}).get("cache", 0)
            found[info.id] = {"memory": max(0, (mem.get("usage") or 0) - cache), "pids": (raw.get("pids_stats") or {}).get("current", 0)}
        return found

    # -- snapshots -----------------------------------------------------------------------
    def _repository(self) -> str:
        """One image repository per installation: its snapshots are nobody else's."""
        return f"{SNAPSHOT_REPO}-{self._installation[:8]}"

    def _snapshot_image(self, spec: Spec) -> Any:
        import docker.errors

        try:
            image = self._call(self.client.images.get, f"{self._repository()}:{spec.snapshot_ref}")
        except docker.errors.ImageNotFound:
            raise SandboxFailed(
                f"no snapshot named {spec.snapshot!r}; `sandbox-kernel snapshot list` shows yours"
            ) from None
        return image

    def _snapshot_info(self, image: Any) -> SnapshotInfo:
        labels = image.labels or {}
        return SnapshotInfo(
            name=labels.get(LABEL_SNAPSHOT, ""),
            backend=self.name,
            user=labels.get(LABEL_USER, ""),
            source=labels.get(LABEL_SOURCE, ""),
            size=int(image.attrs.get("Size") or 0),
            created=_parse_time(image.attrs.get("Created", "")),
            id=image.id,
            ref=labels.get(LABEL_SNAPSHOT_REF, ""),
        )

    def create_snapshot(self, sandbox_id: str, ref: str, labels: dict[str, str]) -> SnapshotInfo:
        """Commit the sandbox's filesystem (never the workspace: it is a bind mount)."""
        import docker.errors

        container = self._require(sandbox_id)
        tag = f"{self._repository()}:{ref}"
        try:
            self._call(self.client.images.get, tag)
            raise Conflict(
                f"you already have a snapshot named {labels.get(LABEL_SNAPSHOT, ref)!r}; delete it first or pick another name"
            )
        except docker.errors.ImageNotFound:
            pass
        labels = {**labels, LABEL_SNAPSHOT_REF: ref, LABEL_INSTALLATION: self._installation}
        try:
            image = self._call(
                container.commit, repository=self._repository(), tag=ref, conf={"Labels": labels}, pause=True
            )
        except docker.errors.APIError as exc:
            raise SandboxError(f"Docker could not snapshot {sandbox_id}: {exc.explanation}") from None
        return self._snapshot_info(self._call(self.client.images.get, image.id))

    def list_snapshots(self) -> list[SnapshotInfo]:
        filters = [LABEL_SNAPSHOT, f"{LABEL_INSTALLATION}={self._installation}"]
        images = self._call(self.client.images.list, filters={"label": filters})
        return sorted((self._snapshot_info(i) for i in images), key=lambda s: s.created)

    def delete_snapshot(self, ref: str) -> bool:
        """Remove a snapshot no sandbox uses; refuse (naming them) while some do."""
        import docker.errors

        found = [s for s in self.list_snapshots() if s.ref == ref]
        if not found:
            return False
        users = self._call(
            self.client.api.containers, all=True,
            filters={"label": [f"{LABEL_SNAPSHOT_REF}={ref}", f"{LABEL_INSTALLATION}={self._installation}"]},
        )
        if users:
            names = ", ".join(sandbox_id_of(self._installation, (c.get("Names") or ["/?"])[0].lstrip("/")) for c in users)
            raise Conflict(f"snapshot {found[0].name!r} is used by {names}; destroy those sandboxes first")
        try:
            self._call(self.client.images.remove, found[0].id)
        except docker.errors.ImageNotFound:
            return False
        except docker.errors.APIError as exc:
            raise SandboxError(f"Docker could not delete snapshot {found[0].name!r}: {exc.explanation}") from None
        return True

    # -- files -------------------------------------------------------------------
    @staticmethod
    def _sandbox_path(path: str) -> PurePosixPath:
        p = PurePosixPath(path)
        return p if p.is_absolute() else PurePosixPath(WORKSPACE) / p

    def _file_helper(self, sandbox_id: str, op: str, target: PurePosixPath, *extra: str) -> DockerChannel:
        """The in-sandbox file helper on ``target``: it runs as the sandbox user, inside the
        container, so whatever it resolves stays within what the sandbox may reach
        (the engine's archive API resolves paths from the host: CVE-2018-15664)."""
        cmd = ["python3", "-c", fs_helper_source(), op, "/", str(target).lstrip("/"), *extra]
        return self.open_channel(sandbox_id, cmd, cwd="/", merge_stderr=False)

    def put_file(self, sandbox_id: str, path: str, data: bytes | IO[bytes]) -> None:
        target = self._sandbox_path(path)
        if isinstance(data, bytes | bytearray):
            data = io.BytesIO(data)
        size = _size_of(data)
        channel = self._file_helper(sandbox_id, "write", target, str(size))
        try:
            left = size
            while left > 0:
                chunk = data.read(min(1 << 20, left))
                if not chunk:
                    raise SandboxError("the upload ended early")
                channel.write(chunk)
                left -= len(chunk)
            channel.close_input()
            answer = _json_line(channel.read_line())
        finally:
            channel.close()
        if "error" in answer or answer.get("size") != size:
            raise SandboxError(f"could not write {path!r} in {sandbox_id}: {answer.get('error', 'no answer')}")

    def get_file(self, sandbox_id: str, path: str) -> Iterator[bytes]:
        target = self._sandbox_path(path)
        channel = self._file_helper(sandbox_id, "read", target)
        channel.close_input()
        try:
            answer = _json_line(channel.read_line())
            size = answer.get("size")
            if not isinstance(size, int) or size < 0:
                raise SandboxError(f"cannot read {path!r} in {sandbox_id}: {answer.get('error', 'no answer')}")
            left = size
            while left > 0:
                chunk = channel.read(min(1 << 20, left))
                if not chunk:
                    raise SandboxError(f"{path!r} shrank while it was read")
                left -= len(chunk)
                yield chunk
        finally:
            channel.close()


def _json_line(line: bytes) -> dict[str, Any]:
    """A JSON object from the in-sandbox helper, or {} for anything else (it is untrusted)."""
    try:
        value = json.loads(line)
    except ValueError:
        return {}
    return value if isinstance(value, dict) else {}


def _exec_failure(command: str, code: int, message: bytes) -> ExecResult:
    """The engine could not start the command: say it as a shell would ("cmd: command
    not found", exit 127; "cmd: permission denied", 126), not in the runtime's words."""
    text = message.decode(errors="replace")
    if "executable file not found" in text or "no such file or directory" in text:
        return ExecResult(127, f"{command}: command not found in the sandbox\n".encode())
    if "permission denied" in text:
        return ExecResult(126, f"{command}: permission denied (not an executable file?)\n".encode())
    reason = text.rsplit("unable to start container process:", 1)[-1].strip().removesuffix(": unknown")
    return ExecResult(code, f"{command}: cannot run it: {reason}\n".encode())


# Runs a command with a time limit inside the sandbox (images may lack `timeout`).
_TIMEOUT_RUNNER = (
    "import os,signal,subprocess,sys\n"
    "p=subprocess.Popen(sys.argv[2:],start_new_session=True)\n"
    "try:\n sys.exit(p.wait(float(sys.argv[1])))\n"
    "except subprocess.TimeoutExpired:\n"
    " os.killpg(p.pid,signal.SIGKILL);print('timed out after',sys.argv[1],'s',file=sys.stderr);sys.exit(124)\n"
)


def _size_of(data: IO[bytes]) -> int:
    try:
        here = data.tell()
        end = data.seek(0, os.SEEK_END)
        data.seek(here)
        return end - here
    except (OSError, AttributeError, ValueError):
        raise SandboxError("uploads need a sized, seekable source") from None


_UNITS = {"second": 1, "minute": 60, "hour": 3600, "day": 86400, "week": 7 * 86400, "month": 30 * 86400, "year": 365 * 86400}


def _started_from_status(status: str) -> float:
    """When a listed container started, from the list call's "Up 5 minutes" (the engine's
    rounding, at most a unit off): listings stay one engine call; a full inspect is exact."""
    match = re.match(r"Up (Less than a second|About an? (\w+)|(\d+) (\w+?)s?)(?: \(|$)", status)
    if not match:
        return 0.0
    if match.group(1) == "Less than a second":
        seconds = 0.0
    elif match.group(2):
        seconds = _UNITS.get(match.group(2), 0)
    else:
        seconds = int(match.group(3)) * _UNITS.get(match.group(4), 0)
    return time.time() - seconds


def _parse_time(value: str) -> float:
    """Docker's RFC 3339 timestamps (nanoseconds) to epoch seconds."""
    from datetime import datetime

    if not value:
        return 0.0
    main, _, frac = value.rstrip("Z").partition(".")
    try:
        stamp = datetime.fromisoformat(main + "+00:00").timestamp()
    except ValueError:
        return 0.0
    return stamp + (float("0." + frac[:6]) if frac[:6].isdigit() else 0.0)
