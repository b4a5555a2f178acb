"""Sandboxes as Docker containers, one per scope key.

A container is found again by its deterministic name (``sk-<user>[--t<thread>]``) and
our labels, so the kernel, the CLI and the server agree without sharing a process;
a name conflict on create means another process won the race, and we use its
container. Containers run hardened by default: a non-root user, every capability
dropped, no-new-privileges, pids/memory/CPU limits from the flavor, no published
ports, optionally no network. The user's workspace is a host folder bind-mounted at
/workspace, so it outlives the container.

The container's main process only waits (``signal.pause()`` under docker-init); the
interpreters are ``docker exec`` processes whose stdin/stdout form a :class:`Channel`.
"""

from __future__ import annotations

import io
import os
import re
import socket
import struct
import tarfile
import threading
import time
from collections import deque
from collections.abc import Iterator
from pathlib import Path, PurePosixPath
from typing import IO, Any

from ..config import SandboxConfig
from ..identity import ScopeKey
from ..lifecycle import check_quota
from ..store import Store
from .base import (
    LABEL_FLAVOR,
    LABEL_INSTALLATION,
    LABEL_MANAGED,
    LABEL_PREFIX,
    LABEL_SCOPE,
    LABEL_SPEC,
    LABEL_THREAD,
    LABEL_USER,
    LABEL_USER_ID,
    LABEL_WORKSPACE,
    LOST_NOTICE,
    SHARED,
    WORKSPACE,
    Backend,
    BadRequest,
    Channel,
    EngineUnavailable,
    Ensured,
    ExecResult,
    Health,
    Progress,
    SandboxError,
    SandboxFailed,
    SandboxInfo,
    SandboxNotFound,
    SnapshotInfo,
    check_snapshot_name,
    not_found,
    sandbox_labels,
    spec_hash,
    workspace_dir,
)

HOME = "/home/sandbox"
SNAPSHOT_REPO = "sandbox-kernel-snapshot"
LABEL_SNAPSHOT = LABEL_PREFIX + "snapshot"
LABEL_SNAPSHOT_OF = LABEL_PREFIX + "from-snapshot"
LABEL_CPUS = LABEL_PREFIX + "cpus"
LABEL_MEMORY = LABEL_PREFIX + "memory"
LABEL_PIDS = LABEL_PREFIX + "pids"
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


def _human_bytes(n: int) -> str:
    for unit in ("B", "KiB", "MiB", "GiB"):
        if n < 1024 or unit == "GiB":
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.1f} {unit}".replace(".0 ", " ")
        n /= 1024
    return f"{n} B"


class DockerChannel(Channel):
    """The attach socket of a ``docker exec`` with stdin, demultiplexed.

    Without a TTY the engine frames output as ``[stream, 0, 0, 0, size(4)] payload``;
    stdout payloads are the channel, stderr payloads are kept (last 8 KiB) to explain
    a process that died at once (a missing python3, say).
    """

    def __init__(
        self, sock: socket.socket, exec_id: str, merge_stderr: bool = False, api: Any = None
    ) -> None:
        self._sock = sock
        self._api = api
        self._merge_stderr = merge_stderr
        self.exec_id = exec_id
        self._pending = b""  # stdout bytes of a frame not yet returned
        self._remaining = 0  # bytes of the current stdout frame still on the socket
        self._stderr: deque[bytes] = deque(maxlen=64)
        self._write_lock = threading.Lock()
        self._closed = False
        self.keep_alive: Any = None  # the SDK object that must outlive the socket

    @property
    def stderr_tail(self) -> str:
        return b"".join(self._stderr).decode("utf-8", "replace")[-8192:]

    def exit_status(self) -> int | None:
        if self._api is None:
            return None
        try:
            state = self._api.exec_inspect(self.exec_id)
        except Exception:
            return None
        return None if state.get("Running") else state.get("ExitCode")

    def write(self, data: bytes) -> None:
        with self._write_lock:
            try:
                self._sock.sendall(data)
            except OSError as exc:
                raise SandboxError(f"the sandbox process is gone ({exc})") from exc

    def _recv_exact(self, size: int) -> bytes:
        buf = bytearray()
        while len(buf) < size:
            try:
                chunk = self._sock.recv(size - len(buf))
            except OSError:
                chunk = b""
            if not chunk:
                return b""
            buf += chunk
        return bytes(buf)

    def read(self, size: int = 65536) -> bytes:
        while True:
            if self._remaining:
                try:
                    chunk = self._sock.recv(min(size, self._remaining))
                except OSError:
                    chunk = b""
                self._remaining -= len(chunk)
                if not chunk:
                    self._remaining = 0
                return chunk
            header = self._recv_exact(8)
            if len(header) < 8:
                return b""
            stream, length = header[0], struct.unpack(">I", header[4:])[0]
            if stream == 2 and not self._merge_stderr:
                self._stderr.append(self._recv_exact(length))
                continue
            self._remaining = length

    def close(self) -> None:
        if self._closed:
            return
        self._closed = True
        for op in (lambda: self._sock.shutdown(socket.SHUT_RDWR), self._sock.close):
            try:
                op()
            except OSError:
                pass


class DockerBackend(Backend):
    """The default engine: local Docker through the ``docker`` SDK."""

    name = "docker"

    def __init__(self, config: SandboxConfig) -> None:
        super().__init__(config)
        self._client: Any = None
        self.store = Store(config)

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
    def _container(self, sandbox_id: str) -> Any:
        """Our container by name or engine id, or None; foreign containers are never ours."""
        import docker.errors

        try:
            container = self._call(self.client.containers.get, sandbox_id)
        except docker.errors.NotFound:
            return None
        except docker.errors.APIError as exc:
            raise SandboxError(f"Docker refused to look up {sandbox_id!r}: {exc.explanation}") from None
        if container.labels.get(LABEL_MANAGED) != "1":
            return None
        return container

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
        info.exit_reason = exit_reason
        if state.get("Status") != "running":
            info.finished = _parse_time(state.get("FinishedAt", ""))
        else:
            info.started = _parse_time(state.get("StartedAt", ""))
        return info

    def _summary_info(self, summary: dict[str, Any]) -> SandboxInfo:
        """A listing entry: built from one list call, with limits read from our labels."""
        labels = summary.get("Labels") or {}
        return SandboxInfo(
            id=(summary.get("Names") or ["/?"])[0].lstrip("/"),
            backend=self.name,
            scope=labels.get(LABEL_SCOPE, "user"),
            user=labels.get(LABEL_USER, ""),
            thread=labels.get(LABEL_THREAD, ""),
            state=_STATES.get(summary.get("State", ""), "error"),
            image=labels.get("sandbox-kernel.image") or summary.get("Image", ""),
            created=float(summary.get("Created") or 0),
            engine_id=summary.get("Id", ""),
            flavor=labels.get(LABEL_FLAVOR, ""),
            isolation="container (non-root, no capabilities, pids/memory/CPU limits)",
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
        )

    def get(self, sandbox_id: str) -> SandboxInfo:
        return self._info(self._require(sandbox_id))

    def list(self, user: str | None = None) -> list[SandboxInfo]:
        filters = [f"{LABEL_MANAGED}=1"]
        if user is not None:
            filters.append(f"{LABEL_USER_ID}={ScopeKey(user).user_id}")
        # One round trip for the whole list (the SDK's containers.list inspects each one).
        summaries = self._call(self.client.api.containers, all=True, filters={"label": filters})
        return sorted((self._summary_info(s) for s in summaries), key=lambda i: i.id)

    # -- create / find -------------------------------------------------------
    def ensure(self, key: ScopeKey, progress: Progress | None = None) -> Ensured:
        import docker.errors

        say = progress or (lambda _msg: None)
        container = self._call_lookup(key.name)
        if container is not None:
            return self._revive(container, key, say)
        record = self.store.get(self.name, key.name)
        check_quota(self, self.config, self.config.memory)
        image = self._snapshot_image() if self.config.snapshot else self._ensure_image(say)
        workspace = self._ensure_workspace(key)
        say(f"creating sandbox {key.name} from {self.config.image} ({self.config.flavor})")
        try:
            container = self._call(
                self.client.containers.create, **self._create_args(key, image, workspace)
            )
        except docker.errors.APIError as exc:
            if exc.status_code != 409:  # 409: another process created it first
                raise SandboxFailed(f"Docker could not create {key.name}: {exc.explanation}") from None
            return self._revive(self._wait_created(key.name), key, say)
        self._prepare(container, image)
        self._start(container)
        self.store.put(self.name, key.name, key.user, container.id, spec_hash(self.config))
        info = self._info(self._reload(container))
        if record is not None and record.engine_id and record.engine_id != container.id:
            return Ensured(info, "recreated", f"sandbox restarted: {LOST_NOTICE} ({key.name} had been removed)")
        return Ensured(info, "created")

    def _call_lookup(self, name: str) -> Any:
        import docker.errors

        try:
            container = self._call(self.client.containers.get, name)
        except docker.errors.NotFound:
            return None
        if container.labels.get(LABEL_MANAGED) != "1":
            raise SandboxFailed(
                f"a container named {name} exists but was not made by sandbox-kernel; "
                "rename or remove it (we never touch containers that are not ours)"
            )
        return container

    def _wait_created(self, name: str) -> Any:
        """After losing a create race, wait for the winner's container to show up."""
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline:
            container = self._call_lookup(name)
            if container is not None:
                return container
            time.sleep(0.1)
        raise SandboxFailed(f"{name} was being created by another process and did not appear")

    def _revive(self, container: Any, key: ScopeKey, say: Progress) -> Ensured:
        """Bring an existing container to running; say what the user lost, if anything."""
        status = container.status
        if status == "running":
            self._remember(key, container)
            return Ensured(self._info(container), "existing")
        if status == "created":
            # Either another process is between create and start (give it a moment), or
            # a create crashed half-way; preparing and starting is idempotent either way.
            deadline = time.monotonic() + 10
            while container.status == "created" and time.monotonic() < deadline:
                time.sleep(0.1)
                container = self._reload(container)
            if container.status == "created":
                self._prepare(container, self._image_of(container))
        if container.status in ("dead", "removing"):
            say(f"sandbox {key.name} is {container.status}; recreating it")
            self.destroy(container.name, forget=False)
            return self.ensure(key, say)
        previous = self._info(container)
        if container.status == "paused":
            self._call(container.unpause)
        elif container.status != "running":
            say(f"starting sandbox {key.name}")
            self._start(container)
        self._remember(key, container)
        info = self._info(self._reload(container))
        notice = ""
        if previous.exit_reason.startswith("out of memory"):
            notice = f"sandbox restarted: {LOST_NOTICE} ({key.name} had stopped: {previous.exit_reason})"
        return Ensured(info, "started" if status != "running" else "existing", notice)

    def _remember(self, key: ScopeKey, container: Any) -> None:
        record = self.store.get(self.name, key.name)
        spec = spec_hash(self.config)
        if record is None or record.engine_id != container.id or record.spec != spec:
            self.store.put(self.name, key.name, key.user, container.id, spec)

    def _reload(self, container: Any) -> Any:
        self._call(container.reload)
        return container

    def _image_of(self, container: Any) -> Any:
        return self._call(self.client.images.get, container.attrs["Image"])

    def _ensure_image(self, say: Progress) -> Any:
        import docker.errors

        name = self.config.image
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

    def _sandbox_user(self, image: Any) -> tuple[int, int, str]:
        """uid, gid and --user value: the image's non-root user, the host user, or 1000."""
        configured = (image.attrs.get("Config", {}) or {}).get("User") or ""
        if configured and configured.split(":")[0] not in ("root", "0"):
            parts = configured.split(":")
            uid = int(parts[0]) if parts[0].isdigit() else DEFAULT_UID
            gid = int(parts[1]) if len(parts) > 1 and parts[1].isdigit() else uid
            return uid, gid, configured
        uid = os.getuid() if os.getuid() != 0 else DEFAULT_UID
        gid = os.getgid() if os.getuid() != 0 else DEFAULT_UID
        return uid, gid, f"{uid}:{gid}"

    def _ensure_workspace(self, key: ScopeKey) -> Path:
        path = workspace_dir(self.config, key)
        path.mkdir(parents=True, exist_ok=True)
        return path

    def _create_args(self, key: ScopeKey, image: Any, workspace: Path) -> dict[str, Any]:
        from docker.types import Mount

        uid, gid, user = self._sandbox_user(image)
        if os.getuid() == 0 and workspace.stat().st_uid != uid:
            os.chown(workspace, uid, gid)  # the non-root sandbox user must own its workspace
        image_env = dict(
            item.split("=", 1) for item in (image.attrs.get("Config", {}).get("Env") or []) if "=" in item
        )
        path = image_env.get("PATH", "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin")
        mounts = [Mount(WORKSPACE, str(workspace), type="bind", read_only=False)]
        if self.config.shared_folder:
            mounts.append(Mount(SHARED, self.config.shared_folder, type="bind", read_only=True))
        cfg = self.config
        # Docker refuses more CPUs than the engine's machine has: a large flavor on a
        # small host gets all of its CPUs rather than an error.
        cpus = min(cfg.cpus, self._engine_cpus())
        return {
            "image": image.id,
            "name": key.name,
            "command": IDLE_COMMAND,
            "entrypoint": [],
            "init": True,
            "user": user,
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
                **sandbox_labels(key, cfg, str(workspace)),
                "sandbox-kernel.image": f"snapshot {cfg.snapshot}" if cfg.snapshot else cfg.image,
                LABEL_SNAPSHOT_OF: cfg.snapshot,
                LABEL_CPUS: f"{cpus:g}",
                LABEL_MEMORY: str(cfg.memory),
                LABEL_PIDS: str(cfg.pids_limit),
            },
            "mounts": mounts,
            "cap_drop": ["ALL"],
            "security_opt": ["no-new-privileges"],
            "pids_limit": cfg.pids_limit,
            "mem_limit": cfg.memory,
            "memswap_limit": cfg.memory,
            "nano_cpus": int(cpus * 1e9),
            "network_mode": "bridge" if cfg.network else "none",
            "detach": True,
        }

    def _prepare(self, container: Any, image: Any) -> None:
        """Create the sandbox user's HOME before start (the image may not have it)."""
        uid, gid, _ = self._sandbox_user(image)
        buf = io.BytesIO()
        with tarfile.open(fileobj=buf, mode="w") as tar:
            for name in ("home", "home/sandbox"):
                entry = tarfile.TarInfo(name)
                entry.type = tarfile.DIRTYPE
                entry.mode = 0o755
                entry.uid, entry.gid = (0, 0) if name == "home" else (uid, gid)
                entry.mtime = int(time.time())
                tar.addfile(entry)
        self._call(container.put_archive, "/", buf.getvalue())

    def _start(self, container: Any) -> None:
        import docker.errors

        try:
            self._call(container.start)
        except docker.errors.APIError as exc:
            raise SandboxFailed(f"Docker could not start {container.name}: {exc.explanation}") from None
        self._reload(container)
        if container.status != "running":
            logs = self._call(container.logs, tail=5).decode("utf-8", "replace").strip()
            hint = " (does the image have python3 on its PATH?)" if "python3" in logs or not logs else ""
            raise SandboxFailed(f"sandbox {container.name} stopped right after start{hint}: {logs[-300:]}")

    # -- life ------------------------------------------------------------------
    def stop(self, sandbox_id: str) -> SandboxInfo:
        container = self._require(sandbox_id)
        self._call(container.stop, timeout=5)
        return self._info(self._reload(container))

    def start(self, sandbox_id: str) -> SandboxInfo:
        container = self._require(sandbox_id)
        if container.status == "paused":
            self._call(container.unpause)
        elif container.status != "running":
            if container.status == "created":
                self._prepare(container, self._image_of(container))
            self._start(container)
        return self._info(self._reload(container))

    def destroy(self, sandbox_id: str, forget: bool = True) -> bool:
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
        if forget:
            self.store.delete(self.name, container.name)
        return True

    # -- processes -------------------------------------------------------------
    def _running(self, sandbox_id: str) -> Any:
        container = self._require(sandbox_id)
        if container.status != "running":
            raise SandboxError(
                f"sandbox {container.name} is {_STATES.get(container.status, container.status)}; "
                f"start it with `sandbox-kernel start {container.name}`"
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
            raise SandboxError(f"cannot run a process in {container.name}: {exc.explanation}") from None

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
            channel._sock.shutdown(socket.SHUT_WR)
            while True:
                chunk = channel.read()
                if not chunk:
                    break
                out += chunk
        finally:
            channel.close()
        code = self._call(self.client.api.exec_inspect, channel.exec_id).get("ExitCode")
        return ExecResult(code if code is not None else -1, bytes(out))

    # -- usage -----------------------------------------------------------------------
    def usage(self, infos: list[SandboxInfo]) -> dict[str, dict[str, float]]:
        """Memory in use per running sandbox.

        Read from the engine host's cgroup files when they are here (no engine round
        trip, so listing 100 sandboxes stays fast); else one one-shot stats call each.
        """
        found: dict[str, dict[str, float]] = {}
        for info in infos:
            local = _cgroup_usage(info.engine_id)
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
    def _snapshot_ref(self, name: str) -> str:
        return f"{SNAPSHOT_REPO}:{check_snapshot_name(name)}"

    def _snapshot_image(self) -> Any:
        import docker.errors

        try:
            image = self._call(self.client.images.get, self._snapshot_ref(self.config.snapshot))
        except docker.errors.ImageNotFound:
            raise SandboxFailed(
                f"no snapshot named {self.config.snapshot!r}; `sandbox-kernel snapshot list` shows yours"
            ) from None
        return image

    def _snapshot_info(self, image: Any) -> SnapshotInfo:
        labels = image.labels or {}
        return SnapshotInfo(
            name=labels.get(LABEL_SNAPSHOT, ""),
            backend=self.name,
            user=labels.get(LABEL_USER, ""),
            source=labels.get(LABEL_PREFIX + "source", ""),
            size=int(image.attrs.get("Size") or 0),
            created=_parse_time(image.attrs.get("Created", "")),
            id=image.id,
        )

    def create_snapshot(self, sandbox_id: str, name: str) -> SnapshotInfo:
        """Commit the sandbox's filesystem (never the workspace: it is a bind mount)."""
        import docker.errors

        container = self._require(sandbox_id)
        ref = self._snapshot_ref(name)
        try:
            self._call(self.client.images.get, ref)
            raise BadRequest(f"a snapshot named {name!r} exists; delete it first or pick another name")
        except docker.errors.ImageNotFound:
            pass
        labels = {
            LABEL_SNAPSHOT: name,
            LABEL_USER: container.labels.get(LABEL_USER, ""),
            LABEL_USER_ID: container.labels.get(LABEL_USER_ID, ""),
            LABEL_PREFIX + "source": container.name,
        }
        try:
            image = self._call(
                container.commit, repository=SNAPSHOT_REPO, tag=name, conf={"Labels": labels}, pause=True
            )
        except docker.errors.APIError as exc:
            raise SandboxError(f"Docker could not snapshot {container.name}: {exc.explanation}") from None
        return self._snapshot_info(self._call(self.client.images.get, image.id))

    def list_snapshots(self, user: str | None = None) -> list[SnapshotInfo]:
        filters = [f"{LABEL_SNAPSHOT}"]
        if user is not None:
            filters.append(f"{LABEL_USER_ID}={ScopeKey(user).user_id}")
        images = self._call(self.client.images.list, filters={"label": filters})
        return sorted((self._snapshot_info(i) for i in images), key=lambda s: s.created)

    def get_snapshot(self, name: str) -> SnapshotInfo:
        import docker.errors

        try:
            image = self._call(self.client.images.get, self._snapshot_ref(name))
        except docker.errors.ImageNotFound:
            raise SandboxNotFound(f"no snapshot named {name!r}; `sandbox-kernel snapshot list` shows yours") from None
        if LABEL_SNAPSHOT not in (image.labels or {}):
            raise SandboxNotFound(f"no snapshot named {name!r}")
        return self._snapshot_info(image)

    def delete_snapshot(self, name: str) -> bool:
        """Remove a snapshot no sandbox uses; refuse (naming them) while some do."""
        import docker.errors

        try:
            snap = self.get_snapshot(name)
        except SandboxNotFound:
            return False
        users = self._call(
            self.client.containers.list, all=True, filters={"label": f"{LABEL_SNAPSHOT_OF}={name}"}
        )
        if users:
            raise BadRequest(
                f"snapshot {name!r} is used by {', '.join(c.name for c in users)}; destroy those sandboxes first"
            )
        try:
            self._call(self.client.images.remove, snap.id)
        except docker.errors.ImageNotFound:
            return False
        except docker.errors.APIError as exc:
            raise SandboxError(f"Docker could not delete snapshot {name!r}: {exc.explanation}") from None
        return True

    # -- files -------------------------------------------------------------------
    @staticmethod
    def _sandbox_path(path: str) -> PurePosixPath:
        p = PurePosixPath(path)
        return p if p.is_absolute() else PurePosixPath(WORKSPACE) / p

    def put_file(self, sandbox_id: str, path: str, data: bytes | IO[bytes]) -> None:
        container = self._require(sandbox_id)
        target = self._sandbox_path(path)
        # The container already records the user it runs as: no image lookup needed.
        user = (container.attrs.get("Config", {}).get("User") or f"{DEFAULT_UID}").split(":")
        uid = int(user[0]) if user[0].isdigit() else DEFAULT_UID
        gid = int(user[1]) if len(user) > 1 and user[1].isdigit() else uid
        if isinstance(data, bytes | bytearray):
            data = io.BytesIO(data)
        size = _size_of(data)
        now = int(time.time())
        header = b""
        for parent in target.parents:
            if str(parent) in ("/", WORKSPACE, "/home", "/tmp"):
                continue
            header = _tar_header(str(parent), tarfile.DIRTYPE, 0, 0o755, uid, gid, now) + header
        header += _tar_header(str(target), tarfile.REGTYPE, size, 0o644, uid, gid, now)
        self._call(container.put_archive, "/", _tar_stream(header, data, size))

    def get_file(self, sandbox_id: str, path: str) -> Iterator[bytes]:
        import docker.errors

        container = self._require(sandbox_id)
        target = self._sandbox_path(path)
        try:
            stream, stat = self._call(container.get_archive, str(target), chunk_size=1 << 20)
        except docker.errors.NotFound:
            raise SandboxError(f"no file {path!r} in sandbox {container.name}") from None
        if stat.get("mode", 0) & (1 << 31):
            raise SandboxError(f"{path!r} is a folder, not a file")
        with tarfile.open(fileobj=_IterReader(stream), mode="r|") as tar:
            for member in tar:
                extracted = tar.extractfile(member)
                if extracted is None:
                    continue
                while chunk := extracted.read(1 << 20):
                    yield chunk
                return


# Runs a command with a time limit inside the sandbox (images may lack `timeout`).
_TIMEOUT_RUNNER = (
    "import os,signal,subprocess,sys\n"
    "p=subprocess.Popen(sys.argv[2:],start_new_session=True)\n"
    "try:\n sys.exit(p.wait(float(sys.argv[1])))\n"
    "except subprocess.TimeoutExpired:\n"
    " os.killpg(p.pid,signal.SIGKILL);print('timed out after',sys.argv[1],'s',file=sys.stderr);sys.exit(124)\n"
)


def _cgroup_usage(container_id: str) -> dict[str, float] | None:
    """Memory use and CPU seconds of a container from this host's cgroup files, if visible."""
    memory = _cgroup_memory(container_id)
    if memory is None:
        return None
    found: dict[str, float] = {"memory": memory}
    for path, scale in (
        (f"/sys/fs/cgroup/cpuacct/docker/{container_id}/cpuacct.usage", 1e-9),
        (f"/sys/fs/cgroup/cpu,cpuacct/docker/{container_id}/cpuacct.usage", 1e-9),
    ):
        try:
            found["cpu_seconds"] = int(Path(path).read_text()) * scale
            return found
        except (OSError, ValueError):
            continue
    for base in (f"/sys/fs/cgroup/system.slice/docker-{container_id}.scope", f"/sys/fs/cgroup/docker/{container_id}"):
        try:
            for line in Path(base, "cpu.stat").read_text().splitlines():
                if line.startswith("usage_usec "):
                    found["cpu_seconds"] = int(line.split()[1]) * 1e-6
                    return found
        except (OSError, ValueError):
            continue
    return found


def _cgroup_memory(container_id: str) -> int | None:
    """Memory use of a container from cgroup v1 or v2 files on this host, if visible."""
    candidates = [
        (f"/sys/fs/cgroup/memory/docker/{container_id}/memory.usage_in_bytes", "total_inactive_file"),
        (f"/sys/fs/cgroup/memory/system.slice/docker-{container_id}.scope/memory.usage_in_bytes", "total_inactive_file"),
        (f"/sys/fs/cgroup/system.slice/docker-{container_id}.scope/memory.current", "inactive_file"),
        (f"/sys/fs/cgroup/docker/{container_id}/memory.current", "inactive_file"),
    ]
    for usage_file, inactive_key in candidates:
        try:
            usage = int(Path(usage_file).read_text())
        except (OSError, ValueError):
            continue
        inactive = 0
        try:
            for line in Path(usage_file).with_name("memory.stat").read_text().splitlines():
                key, _, value = line.partition(" ")
                if key == inactive_key:
                    inactive = int(value)
        except (OSError, ValueError):
            pass
        return max(0, usage - inactive)
    return None


def _size_of(data: IO[bytes]) -> int:
    try:
        here = data.tell()
        end = data.seek(0, os.SEEK_END)
        data.seek(here)
        return end - here
    except (OSError, AttributeError, ValueError):
        raise SandboxError("uploads need a sized, seekable source") from None


def _tar_header(path: str, kind: bytes, size: int, mode: int, uid: int, gid: int, mtime: int) -> bytes:
    entry = tarfile.TarInfo(path.lstrip("/"))
    entry.type, entry.size, entry.mode, entry.uid, entry.gid, entry.mtime = kind, size, mode, uid, gid, mtime
    return entry.tobuf(tarfile.PAX_FORMAT, "utf-8", "surrogateescape")


def _tar_stream(header: bytes, data: IO[bytes], size: int) -> Iterator[bytes]:
    """One-member tar archive streamed from ``data`` without holding it in memory."""
    yield header
    left = size
    while left > 0:
        chunk = data.read(min(1 << 20, left))
        if not chunk:
            raise SandboxError("the upload ended early")
        left -= len(chunk)
        yield chunk
    pad = (-size) % 512
    yield b"\0" * pad + b"\0" * 1024


class _IterReader(io.RawIOBase):
    """A file-like view of an iterator of bytes, for tarfile's streaming mode."""

    def __init__(self, chunks: Iterator[bytes]) -> None:
        self._chunks = iter(chunks)
        self._buf = b""

    def readable(self) -> bool:
        return True

    def readinto(self, b: Any) -> int:
        while not self._buf:
            try:
                self._buf = next(self._chunks)
            except StopIteration:
                return 0
        n = min(len(b), len(self._buf))
        b[:n] = self._buf[:n]
        self._buf = self._buf[n:]
        return n


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
