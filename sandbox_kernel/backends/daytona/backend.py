"""Daytona sandboxes through the ``daytona`` SDK: the path for users who outgrow one machine.

* One Daytona sandbox per scope key, named after it (``sk-alice``) and labelled like
  Docker containers, so every process finds it again by name; the Daytona UUID is the
  ``engine_id``.
* The workspace is a per-user Daytona volume (``sk-ws-<user>``) mounted at
  /workspace: it outlives every sandbox of that user, and thread sandboxes share it.
* Idle policy is Daytona's own: ``auto_stop_interval`` and ``auto_delete_interval``
  come from ``idle_stop`` / ``idle_delete``; the kernel refreshes activity while a
  cell runs (:meth:`DaytonaBackend.keep_alive`) because Daytona only counts API use.
* Cells keep full fidelity: our own agent runs in a **PTY session** (a websocket,
  bidirectional, streaming), switched to raw mode so the PTY passes bytes unchanged.
  Daytona's code interpreter returns only stdout/stderr, and session commands take
  stdin one HTTP request at a time; a raw PTY is one long-lived duplex stream, like
  ``docker exec``.
* Files never wake a code sandbox: the REST (and WebDAV) file routes reach a user's
  volume through that user's **files sandbox** (``sk-alice--files``, labelled
  ``sandbox-kernel.role=files``), which mounts the same volume, runs nothing but our
  file helper, blocks the network and auto-stops after ``files_idle_stop`` (60 min).
  It is left out of :meth:`DaytonaBackend.list` (listings, quotas); the reaper finds
  it through :meth:`DaytonaBackend.files_sandboxes`.
* Rate limits (429) are retried with backoff; other API errors become our error
  classes with the status and what to do.

The SDK is imported when this module is, and this module only when the daytona
backend is chosen.
"""

from __future__ import annotations

import builtins
import math
import re
import shlex
import threading
import time
import uuid
from collections.abc import Callable, Iterator
from typing import IO, Any, TypeVar

from daytona import (
    CreateSandboxFromSnapshotParams,
    Daytona,
    ListSandboxesQuery,
    VolumeMount,
)
from daytona.common.errors import (
    DaytonaConflictError,
    DaytonaError,
    DaytonaNotFoundError,
)

from ...errors import FileMissing
from ...identity import ScopeKey, safe_id
from ...volumes import Volume
from ..base import (
    LABEL_FLAVOR,
    LABEL_IMAGE,
    LABEL_INSTALLATION,
    LABEL_MANAGED,
    LABEL_ROLE,
    LABEL_SCOPE,
    LABEL_SNAPSHOT,
    LABEL_SNAPSHOT_OF,
    LABEL_SPEC,
    LABEL_THREAD,
    LABEL_USER,
    LABEL_USER_ID,
    LABEL_WORKSPACE,
    ROLE_FILES,
    WORKSPACE,
    AlreadyExists,
    Backend,
    Channel,
    Conflict,
    EngineSettings,
    EngineUnavailable,
    ExecResult,
    Health,
    PortTarget,
    Progress,
    SandboxError,
    SandboxFailed,
    SandboxInfo,
    SnapshotInfo,
    Spec,
    egress_of,
    engine_name,
    epoch_of,
    files_sandbox_id,
    is_files_sandbox,
    not_found,
    sandbox_id_of,
    volumes_of,
)
from .channel import DaytonaPty, PtyChannel, bash_word
from .egress import daytona_egress, egress_note
from .errors import call, message
from .mapped import check_mapped
from .preview import PreviewLinks, preview_target

T = TypeVar("T")

AGENT_LOG = "/tmp/.sandbox-agent.log"
READY = b"\x01SKREADY\n"
SHELL_READY = b"\x01SKSHELL\x01"  # a terminal's shell is ours from here (see open_pty)

_STATES = {
    "started": "running",
    "stopped": "stopped",
    "stopping": "stopped",
    "archived": "stopped",
    "archiving": "stopped",
    "paused": "stopped",
    "pausing": "stopped",
    "error": "error",
    "build_failed": "error",
}
_GONE = {"destroyed", "destroying"}


def _raw_state(item: Any) -> str:
    """Daytona's own state name of a sandbox or volume (the SDK gives an enum or a str)."""
    return getattr(item.state, "value", item.state) or "unknown"


def _state(sandbox: Any) -> str:
    raw = _raw_state(sandbox)
    return raw if raw in _GONE else _STATES.get(raw, "creating")


PTY_RETRY_DELAYS = (1.0, 3.0)  # seconds between tries of a PTY session's handshake


# Daytona sizes a sandbox made from a snapshot (as ours are) by that snapshot: the
# flavor's cpus, memory and disk are recorded, not applied; volumes have no size.
DISK_NOTE = (
    "Daytona gives a sandbox the disk of the snapshot it is made from, whatever its flavor; "
    "the workspace (a Daytona volume) is not bounded"
)


class DaytonaBackend(Backend):
    name = "daytona"
    workspace_on_host = False
    previews = True

    def __init__(self, settings: EngineSettings) -> None:
        super().__init__(settings)
        self._installation = settings.installation
        self._client: Daytona | None = None
        self._sandboxes: dict[str, Any] = {}  # per-process cache of SDK handles, by sandbox id
        # One maker of each files sandbox per process (other processes meet at its name).
        self._files_locks: dict[str, threading.Lock] = {}
        self._files_guard = threading.Lock()
        self._links = PreviewLinks()

    # -- client and errors ---------------------------------------------------------------
    @property
    def client(self) -> Daytona:
        if self._client is None:
            try:
                self._client = (
                    Daytona()
                )  # key, URL and target from DAYTONA_* like every Daytona tool
            except DaytonaError as exc:
                raise EngineUnavailable(
                    f"cannot reach Daytona: {exc}. Set DAYTONA_API_KEY (and DAYTONA_API_URL for a "
                    "self-hosted Daytona), or choose another backend with SANDBOX_KERNEL_BACKEND"
                ) from None
        return self._client

    def _call(self, fn: Callable[..., T], *args: Any, what: str = "", **kwargs: Any) -> T:
        return call(fn, *args, what=what, **kwargs)

    def health(self) -> Health:
        try:
            self._call(self.client.volume.list, what="list volumes")
        except SandboxError as exc:
            return Health(False, self.name, str(exc))
        return Health(True, self.name, "Daytona answers")

    # -- lookups -------------------------------------------------------------------------
    def _lookup(self, sandbox_id: str) -> Any | None:
        """The SDK handle of sandbox ``sandbox_id`` (fresh state), or None when there is none."""
        name = engine_name(self._installation, sandbox_id)
        try:
            sandbox = self._call(self.client.get, name, what=f"look up {sandbox_id}")
        except DaytonaNotFoundError:
            self._sandboxes.pop(sandbox_id, None)
            return None
        labels = sandbox.labels or {}
        if labels.get(LABEL_MANAGED) != "1" or labels.get(LABEL_INSTALLATION) != self._installation:
            raise SandboxFailed(
                f"a Daytona sandbox named {name} exists but was not made by this sandbox-kernel "
                "installation; rename or delete it (we never touch sandboxes that are not ours)"
            )
        if _state(sandbox) in _GONE:
            return None
        self._sandboxes[sandbox_id] = sandbox
        return sandbox

    def _sandbox(self, sandbox_id: str) -> Any:
        sandbox = self._lookup(sandbox_id)
        if sandbox is None:
            raise not_found(sandbox_id)
        return sandbox

    def _running(self, sandbox_id: str) -> Any:
        """The handle of a running sandbox, without a round trip when we know it runs."""
        sandbox = self._sandboxes.get(sandbox_id)
        if sandbox is None or _state(sandbox) != "running":
            sandbox = self._sandbox(sandbox_id)
        if _state(sandbox) != "running":
            raise SandboxError(f"sandbox {sandbox_id} is {_state(sandbox)}; start it first")
        return sandbox

    def _info(self, sandbox: Any) -> SandboxInfo:
        labels = sandbox.labels or {}
        return SandboxInfo(
            id=sandbox_id_of(self._installation, sandbox.name),
            backend=self.name,
            scope=labels.get(LABEL_SCOPE, "user"),
            user=labels.get(LABEL_USER, ""),
            thread=labels.get(LABEL_THREAD, ""),
            state=_state(sandbox),
            image=labels.get(LABEL_IMAGE) or sandbox.snapshot or "",
            created=epoch_of(sandbox.created_at),
            engine_id=sandbox.id,
            flavor=labels.get(LABEL_FLAVOR, ""),
            isolation="Daytona sandbox (remote, its own kernel)" + egress_note(egress_of(labels)),
            workspace=f"daytona volume {_volume_name(labels.get(LABEL_USER, ''))}",
            limits={
                "cpus": sandbox.cpu,
                "memory": int(sandbox.memory or 0) * 2**30,
                "disk": int(sandbox.disk or 0) * 2**30,
            },
            exit_reason=getattr(sandbox, "error_reason", None) or "",
            finished=epoch_of(sandbox.updated_at) if _state(sandbox) == "stopped" else 0.0,
            # Daytona stamps updatedAt at each state change: for a running one, its start.
            started=epoch_of(sandbox.updated_at) if _state(sandbox) == "running" else 0.0,
            snapshot=labels.get(LABEL_SNAPSHOT_OF, ""),
            spec=labels.get(LABEL_SPEC, ""),
            volumes=[v.to_dict() for v in volumes_of(labels)],
            installation=labels.get(LABEL_INSTALLATION, ""),
            disk_note=DISK_NOTE,
        )

    def find(self, sandbox_id: str) -> SandboxInfo | None:
        sandbox = self._lookup(sandbox_id)
        if sandbox is None or _is_files(sandbox) != is_files_sandbox(sandbox_id):
            return None  # a files sandbox is never taken for a code sandbox, nor the reverse
        return self._info(sandbox)

    # -- sandboxes -----------------------------------------------------------------------
    def create(
        self, sandbox_id: str, key: ScopeKey, spec: Spec, labels: dict[str, str], progress: Progress
    ) -> SandboxInfo:
        volume = self._ensure_volume(key.user, progress)
        snapshot = f"sk-{spec.snapshot_ref}" if spec.snapshot_ref else spec.image
        progress(f"creating Daytona sandbox {sandbox_id} from {snapshot or 'the default snapshot'}")
        params = CreateSandboxFromSnapshotParams(
            name=engine_name(self._installation, sandbox_id),
            snapshot=snapshot or None,
            labels={**labels, LABEL_WORKSPACE: f"daytona volume {volume.name}"},
            env_vars={"PIP_BREAK_SYSTEM_PACKAGES": "1", "PYTHONUNBUFFERED": "1"},
            volumes=[
                VolumeMount(volume_id=volume.id, mount_path=WORKSPACE),
                *self._mapped_volumes(spec, progress),
            ],
            auto_stop_interval=math.ceil(self.settings.idle_stop) if self.settings.idle_stop else 0,
            auto_delete_interval=math.ceil(self.settings.idle_delete)
            if self.settings.idle_delete
            else -1,
            network_block_all=not spec.network,
            **(daytona_egress(spec.egress)[0] if spec.network else {}),
        )
        try:
            sandbox = self._call(
                self.client.create,
                params,
                timeout=self.settings.start_timeout,
                what=f"create {sandbox_id}",
            )
        except DaytonaConflictError:
            raise AlreadyExists(f"{sandbox_id} was made by another process") from None
        except EngineUnavailable as exc:
            raise SandboxFailed(str(exc).replace("failed to", "could not")) from None
        self._sandboxes[sandbox_id] = sandbox
        return self._info(sandbox)

    def start(self, sandbox_id: str, progress: Progress | None = None) -> SandboxInfo:
        say = progress or (lambda _msg: None)
        sandbox = self._sandbox(sandbox_id)
        state = _state(sandbox)
        if state == "creating":
            say(f"waiting for Daytona sandbox {sandbox_id} ({_raw_state(sandbox)})")
            self._call(
                sandbox.wait_for_sandbox_start,
                timeout=self.settings.start_timeout,
                what=f"start {sandbox_id}",
            )
        elif state == "error":
            reason = getattr(sandbox, "error_reason", None) or "in error"
            raise SandboxFailed(f"Daytona sandbox {sandbox_id} failed ({reason})")
        elif state != "running":
            raw = _raw_state(sandbox)
            say(
                f"starting Daytona sandbox {sandbox_id} ({raw}"
                + (
                    "; restoring an archived sandbox can take a minute"
                    if raw in ("archived", "archiving")
                    else ""
                )
                + ")"
            )
            self._call(
                sandbox.start, timeout=self.settings.start_timeout, what=f"start {sandbox_id}"
            )
        return self._info(sandbox)

    def _ensure_volume(self, user: str, say: Progress) -> Any:
        """The user's workspace volume, created on first use and ready to mount."""
        return self._ready_volume(_volume_name(user), say, "workspace volume", create=True)

    def _ready_volume(self, name: str, say: Progress, what: str, create: bool = False) -> Any:
        """Volume ``name``, ready to mount (made first with ``create``)."""
        volume = self._call(self.client.volume.get, name, create=create, what=f"get volume {name}")
        deadline = time.monotonic() + self.settings.start_timeout
        while _raw_state(volume) != "ready":
            if _raw_state(volume) == "error":
                raise SandboxFailed(
                    f"Daytona volume {name} is in error: {volume.error_reason or 'no reason given'}"
                )
            if time.monotonic() > deadline:
                raise SandboxFailed(
                    f"Daytona volume {name} was not ready after {self.settings.start_timeout:.0f} s"
                )
            say(f"waiting for {what} {name}")
            time.sleep(0.5)
            volume = self._call(self.client.volume.get, name, what=f"get volume {name}")
        return volume

    def _mapped_volumes(self, spec: Spec, say: Progress) -> builtins.list[Any]:
        """The administrator's volumes of ``spec`` (by name), as mounts."""
        self.check_volumes(spec.volumes)
        mounts = []
        for mapped in spec.volumes:
            try:
                volume = self._ready_volume(mapped.source, say, "mapped volume")
            except DaytonaNotFoundError:
                raise SandboxFailed(
                    f"mapping '{mapped}': Daytona has no volume named {mapped.source!r}; create "
                    "it (`daytona volume create NAME`) or remove the mapping"
                ) from None
            mounts.append(VolumeMount(volume_id=volume.id, mount_path=mapped.target))
        return mounts

    def check_volumes(self, volumes: tuple[Volume, ...]) -> None:
        check_mapped(volumes)

    def list(self, user: str | None = None) -> list[SandboxInfo]:
        labels = {LABEL_MANAGED: "1", LABEL_INSTALLATION: self._installation}
        if user is not None:
            labels[LABEL_USER] = user
        found = self._call(
            lambda: list(self.client.list(ListSandboxesQuery(labels=labels))), what="list sandboxes"
        )
        return [self._info(s) for s in found if _state(s) not in _GONE and not _is_files(s)]

    # -- files sandboxes -----------------------------------------------------------------
    def files_sandbox(self, user: str, image: str, progress: Progress | None = None) -> SandboxInfo:
        say = progress or (lambda _msg: None)
        sandbox_id = files_sandbox_id(user)
        with self._files_lock(sandbox_id):
            sandbox = self._lookup(sandbox_id)
            if sandbox is not None and _state(sandbox) == "error":
                reason = getattr(sandbox, "error_reason", None) or "in error"
                say(f"files sandbox {sandbox_id} failed ({reason}): making a new one")
                self.destroy(sandbox_id)
                sandbox = None
            if sandbox is None:
                sandbox = self._create_files_sandbox(sandbox_id, user, image, say)
            if _state(sandbox) != "running":
                return self.start(sandbox_id, say)
            return self._info(sandbox)

    def _files_lock(self, sandbox_id: str) -> threading.Lock:
        with self._files_guard:
            return self._files_locks.setdefault(sandbox_id, threading.Lock())

    def _create_files_sandbox(self, sandbox_id: str, user: str, image: str, say: Progress) -> Any:
        """A sandbox that mounts ``user``'s volume and runs only our file helper: no
        network, its own (longer) auto-stop, labelled so that nothing takes it for one of
        the user's code sandboxes."""
        volume = self._ensure_volume(user, say)
        say(f"creating Daytona files sandbox {sandbox_id} for the workspace of {user}")
        settings = self.settings
        params = CreateSandboxFromSnapshotParams(
            name=engine_name(self._installation, sandbox_id),
            snapshot=image or None,
            labels={
                LABEL_MANAGED: "1",
                LABEL_INSTALLATION: self._installation,
                LABEL_USER: user,
                LABEL_USER_ID: safe_id(user),
                LABEL_SCOPE: "user",
                LABEL_ROLE: ROLE_FILES,
                LABEL_IMAGE: image or "the default snapshot",
                LABEL_WORKSPACE: f"daytona volume {volume.name}",
            },
            env_vars={},
            volumes=[VolumeMount(volume_id=volume.id, mount_path=WORKSPACE)],
            auto_stop_interval=math.ceil(settings.files_idle_stop)
            if settings.files_idle_stop
            else 0,
            auto_delete_interval=math.ceil(settings.idle_delete) if settings.idle_delete else -1,
            network_block_all=True,
        )
        try:
            sandbox = self._call(
                self.client.create,
                params,
                timeout=settings.start_timeout,
                what=f"create {sandbox_id}",
            )
        except DaytonaConflictError:
            # Another process made it first: take theirs (start() waits while it is made).
            self.wait_until(
                lambda: self._lookup(sandbox_id) is not None, 60, f"{sandbox_id} to appear"
            )
            return self._sandboxes[sandbox_id]
        except EngineUnavailable as exc:
            raise SandboxFailed(str(exc).replace("failed to", "could not")) from None
        self._sandboxes[sandbox_id] = sandbox
        return sandbox

    def files_sandboxes(self) -> builtins.list[SandboxInfo]:
        labels = {
            LABEL_MANAGED: "1",
            LABEL_INSTALLATION: self._installation,
            LABEL_ROLE: ROLE_FILES,
        }
        found = self._call(
            lambda: list(self.client.list(ListSandboxesQuery(labels=labels))),
            what="list files sandboxes",
        )
        return [self._info(s) for s in found if _state(s) not in _GONE and _is_files(s)]

    def stop(self, sandbox_id: str) -> SandboxInfo:
        sandbox = self._sandbox(sandbox_id)
        if _state(sandbox) == "running":
            self._call(sandbox.stop, timeout=self.settings.start_timeout, what=f"stop {sandbox_id}")
        return self._info(sandbox)

    def destroy(self, sandbox_id: str) -> bool:
        sandbox = self._lookup(sandbox_id)
        if sandbox is None:
            return False
        try:
            self._call(sandbox.delete, what=f"delete {sandbox_id}")
        except DaytonaNotFoundError:
            return False
        self._sandboxes.pop(sandbox_id, None)
        self.wait_until(lambda: self._lookup(sandbox_id) is None, 60, f"{sandbox_id} to be deleted")
        return True

    def keep_alive(self, sandbox_id: str) -> None:
        """Reset Daytona's idle timer: work inside a sandbox does not count as activity."""
        sandbox = self._sandboxes.get(sandbox_id)
        if sandbox is not None:
            self._call(sandbox.refresh_activity, what=f"refresh activity of {sandbox_id}")

    @property
    def keep_alive_interval(self) -> float:
        # Three refreshes per auto-stop interval, so one lost request never stops a cell.
        return max(1.0, self.settings.idle_stop * 60 / 3) if self.settings.idle_stop else 0.0

    def usage(self, infos: builtins.list[SandboxInfo]) -> dict[str, dict[str, float]]:
        """Live use per running sandbox, as its daemon reports it (one toolbox call each).

        ``cpu`` is in cores (the daemon's percentage of the sandbox's CPUs, times their
        number), like the Docker backend's rate; ``memory`` leaves out the page cache.
        """
        found: dict[str, dict[str, float]] = {}
        for info in infos:
            try:
                metrics = self._running(info.id).get_metrics_latest()
            except (SandboxError, DaytonaError):
                continue  # stopped meanwhile, or an old daemon: no figure rather than an error
            found[info.id] = {
                "memory": max(0, metrics.mem_used - metrics.mem_cache),
                "cpu": round(metrics.cpu_used_pct / 100 * metrics.cpu_count, 3),
            }
            if metrics.disk_used is not None:  # the sandbox's own disk (not the volume)
                found[info.id]["disk"] = metrics.disk_used
        return found

    def disk_bound(self) -> str:
        return DISK_NOTE

    # -- ports ---------------------------------------------------------------------------
    def port_target(self, info: SandboxInfo, port: int) -> PortTarget:
        """Daytona's preview link of ``port`` of that very sandbox (by its Daytona id): its
        proxy's URL, with the sandbox's preview token as a header (see :mod:`.preview`)."""
        sandbox = self._running(info.id)
        if info.engine_id and sandbox.id != info.engine_id:
            raise not_found(info.id)

        def fetch() -> PortTarget:
            link = self._call(
                sandbox.get_preview_link,
                port,
                what=f"give the preview link of port {port} of {info.id}",
            )
            return preview_target(str(link.url), str(link.token or ""))

        return self._links.get((sandbox.id, port, info.started), fetch)

    # -- processes -----------------------------------------------------------------------
    def exec(
        self,
        sandbox_id: str,
        cmd: builtins.list[str],
        *,
        cwd: str = WORKSPACE,
        env: dict[str, str] | None = None,
        timeout: float | None = None,
    ) -> ExecResult:
        sandbox = self._running(sandbox_id)
        try:
            response = self._call(
                sandbox.process.exec,
                shlex.join(cmd),
                cwd=cwd,
                env=env,
                timeout=int(math.ceil(timeout)) if timeout else None,
                what=f"run a command in {sandbox_id}",
            )
        except DaytonaNotFoundError:
            raise not_found(sandbox_id) from None
        return ExecResult(int(response.exit_code), (response.result or "").encode())

    def _new_pty(
        self, sandbox: Any, prefix: str, sandbox_id: str, **options: Any
    ) -> tuple[Any, str]:
        """(a PTY session of the sandbox's daemon, its id). A daemon that only just started
        (the sandbox was started a moment ago) can drop or time out the session's
        handshake: tried up to three times, each under a new id, before that is the error."""
        for delay in (*PTY_RETRY_DELAYS, None):
            pty_id = f"{prefix}-{uuid.uuid4().hex[:12]}"
            try:
                handle = self._call(
                    sandbox.process.create_pty_session,
                    pty_id,
                    what=f"open a terminal in {sandbox_id}",
                    **options,
                )
                return handle, pty_id
            except EngineUnavailable:
                if delay is None:
                    raise
                time.sleep(delay)
        raise AssertionError("unreachable")

    def open_channel(
        self,
        sandbox_id: str,
        cmd: builtins.list[str],
        *,
        cwd: str = WORKSPACE,
        env: dict[str, str] | None = None,
    ) -> Channel:
        from daytona.common.pty import PtySize

        sandbox = self._running(sandbox_id)
        handle, pty_id = self._new_pty(
            sandbox, "sk-agent", sandbox_id, cwd=cwd, pty_size=PtySize(rows=24, cols=200)
        )
        channel = PtyChannel(
            handle,
            kill=lambda: sandbox.process.kill_pty_session(pty_id),
            log=lambda: self.exec(
                sandbox_id, ["tail", "-c", "2000", AGENT_LOG], timeout=10
            ).output.decode("utf-8", "replace"),
        )
        assignments = " ".join(bash_word(f"{k}={v}") for k, v in (env or {}).items())
        # Raw mode makes the terminal a plain byte pipe (no echo, no line editing, no
        # CR/LF rewriting, no signals from ^C); the marker's printf format differs from
        # its echo, so the echo of this line can never be taken for it.
        line = (
            "stty raw -echo -iexten; printf '\\001SK%s\\n' READY; "
            f"exec env {assignments} {' '.join(bash_word(a) for a in cmd)} 2>>{AGENT_LOG}\n"
        )
        try:
            handle.send_input(line)
            channel.read_until(READY, timeout=min(60.0, self.settings.start_timeout))
        except BaseException:
            channel.close()
            raise
        return channel

    def open_pty(
        self,
        sandbox_id: str,
        cmd: builtins.list[str],
        *,
        cwd: str = WORKSPACE,
        env: dict[str, str] | None = None,
        rows: int = 24,
        cols: int = 80,
    ) -> DaytonaPty:
        """A Daytona PTY session (the daemon makes the terminal and its session), whose
        shell we replace with ``cmd`` (``exec``) before the user sees anything: the typed
        line and its echo come before a marker, and nothing before the marker is shown."""
        from daytona.common.pty import PtySize

        sandbox = self._running(sandbox_id)
        handle, pty_id = self._new_pty(
            sandbox,
            "sk-shell",
            sandbox_id,
            cwd=cwd,
            envs=env or None,
            pty_size=PtySize(rows=rows, cols=cols),
        )
        pty = DaytonaPty(
            handle,
            kill=lambda: sandbox.process.kill_pty_session(pty_id),
            log=lambda: "",
            resize=lambda r, c: self._call(
                sandbox.process.resize_pty_session,
                pty_id,
                PtySize(rows=r, cols=c),
                what=f"resize a terminal in {sandbox_id}",
            ),
        )
        # The marker ends in \001, not a newline the terminal would turn into \r\n, and
        # its printf format differs from its echo, so the echo is never taken for it.
        line = f"printf '\\001SK%s\\001' SHELL; exec {' '.join(bash_word(a) for a in cmd)}\n"
        try:
            handle.send_input(line)
            pty.read_until(SHELL_READY, timeout=min(60.0, self.settings.start_timeout))
        except BaseException:
            pty.close()
            raise
        return pty

    # -- files ---------------------------------------------------------------------------
    def put_file(self, sandbox_id: str, path: str, data: bytes | IO[bytes]) -> None:
        sandbox = self._running(sandbox_id)
        self._call(sandbox.fs.upload_file_stream, data, _in_workspace(path), what=f"upload {path}")

    def get_file(self, sandbox_id: str, path: str) -> Iterator[bytes]:
        sandbox = self._running(sandbox_id)
        stream = self._call(
            sandbox.fs.download_file_stream, _in_workspace(path), what=f"download {path}"
        )
        return self._chunks(stream, path)

    def _chunks(self, stream: Iterator[bytes], path: str) -> Iterator[bytes]:
        """The SDK's download stream, with its errors (raised while iterating) made ours."""
        try:
            yield from stream
        except DaytonaNotFoundError:
            raise FileMissing(f"no file {path!r} in the workspace") from None
        except DaytonaError as exc:
            raise SandboxError(f"download of {path!r} failed: {message(exc)}") from None

    # -- snapshots -----------------------------------------------------------------------
    # Daytona snapshot names are organization-wide: ours are "sk-" + the owner-qualified ref.
    def create_snapshot(self, sandbox_id: str, ref: str, labels: dict[str, str]) -> SnapshotInfo:
        sandbox = self._sandbox(sandbox_id)
        try:
            self._call(
                sandbox.create_snapshot,
                f"sk-{ref}",
                timeout=self.settings.start_timeout,
                what=f"snapshot {sandbox_id}",
            )
        except DaytonaConflictError:
            raise Conflict(
                f"you already have a snapshot named {labels.get(LABEL_SNAPSHOT, ref)!r}; delete it first or pick another name"
            ) from None
        for snap in self.list_snapshots():
            if snap.ref == ref:
                return snap
        raise SandboxFailed(f"Daytona accepted snapshot {ref!r} but does not list it")

    def _all_snapshots(self) -> builtins.list[Any]:
        """Every snapshot of the organization, page after page."""
        found: builtins.list[Any] = []
        page = 1
        while True:
            batch = self._call(
                self.client.snapshot.list, page=page, limit=100, what="list snapshots"
            )
            found.extend(batch.items)
            if page >= (batch.total_pages or 1) or not batch.items:
                return found
            page += 1

    def list_snapshots(self) -> builtins.list[SnapshotInfo]:
        ours = self.list()
        sources = {s.engine_id: s.id for s in ours}
        users = {safe_id(s.user): s.user for s in ours}
        out = []
        for snap in self._all_snapshots():
            owner, short = _split_snapshot_name(snap.name)
            if not short:
                continue
            out.append(
                SnapshotInfo(
                    name=short,
                    backend=self.name,
                    user=users.get(owner, owner),
                    source=sources.get(snap.source_sandbox_id or "", snap.source_sandbox_id or ""),
                    size=int((snap.size or 0) * 2**30),
                    created=epoch_of(str(snap.created_at) if snap.created_at else None),
                    id=snap.id,
                    ref=snap.name[3:],
                )
            )
        return out

    def delete_snapshot(self, ref: str) -> bool:
        for snap in self._all_snapshots():
            if snap.name == f"sk-{ref}":
                self._call(self.client.snapshot.delete, snap, what=f"delete snapshot {ref}")
                return True
        return False


def _is_files(sandbox: Any) -> bool:
    """Whether a Daytona sandbox of ours is a files sandbox (by its label)."""
    return (sandbox.labels or {}).get(LABEL_ROLE) == ROLE_FILES


def _volume_name(user: str) -> str:
    return f"sk-ws-{safe_id(user)}"


def _snapshot_name(user: str, name: str) -> str:
    """Daytona snapshot names are organization-wide: ours carry the owner in front."""
    return f"sk-{safe_id(user)}--{name}"


def _split_snapshot_name(full: str) -> tuple[str, str]:
    """(owner's safe id, our name) of a Daytona snapshot of ours; ("", "") for others.

    A safe id holds "--" only before its 12-hex-digit digest, which tells where it ends.
    """
    if not full.startswith("sk-"):
        return "", ""
    parts = full[3:].split("--")
    if len(parts) >= 3 and re.fullmatch(r"[0-9a-f]{12}", parts[1]):
        return f"{parts[0]}--{parts[1]}", "--".join(parts[2:])
    if len(parts) >= 2:
        return parts[0], "--".join(parts[1:])
    return "", ""


def _in_workspace(path: str) -> str:
    return path if path.startswith("/") else f"{WORKSPACE}/{path}"
