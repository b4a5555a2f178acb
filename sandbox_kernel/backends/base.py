"""The one interface every sandbox engine implements: a pure engine adapter.

A backend makes, finds, starts, stops and removes sandboxes, runs processes in them
and moves bytes; it decides nothing. Who owns what, which spec a sandbox gets, quotas,
variants, snapshot owners and the records that outlive processes belong to the
orchestrator (:mod:`sandbox_kernel.service`), which hands a backend a small
:class:`EngineSettings` at construction and a :class:`Spec` and labels per sandbox.
Nothing here imports Jupyter, the store or the lifecycle policies.

Sandbox ids are the deterministic names from :class:`~sandbox_kernel.identity.ScopeKey`
(``sk-alice``), so an id stays the same when a sandbox is recreated; ``engine_id``
tells two incarnations apart.
"""

from __future__ import annotations

import abc
import builtins
import hashlib
import json
import re
import socket
import time
from collections.abc import Callable, Iterator
from dataclasses import asdict, dataclass, field
from datetime import datetime
from typing import IO, Any, Protocol

from ..errors import (  # noqa: F401  (re-exported: backends raise them)
    AlreadyExists,
    BadRequest,
    Conflict,
    EngineUnavailable,
    FileMissing,
    NotSupported,
    QuotaExceeded,
    SandboxError,
    SandboxFailed,
    SandboxNotFound,
)
from ..identity import ScopeKey
from ..volumes import Volume, from_label, to_label

Progress = Callable[[str], None]

# Labels every engine stores on our sandboxes, so any process can find them again.
LABEL_PREFIX = "sandbox-kernel."
LABEL_MANAGED = LABEL_PREFIX + "managed"
LABEL_USER = LABEL_PREFIX + "user"
LABEL_USER_ID = LABEL_PREFIX + "user-id"
LABEL_SCOPE = LABEL_PREFIX + "scope"
LABEL_THREAD = LABEL_PREFIX + "thread"
LABEL_FLAVOR = LABEL_PREFIX + "flavor"
LABEL_SPEC = LABEL_PREFIX + "spec"
LABEL_WORKSPACE = LABEL_PREFIX + "workspace"
LABEL_INSTALLATION = LABEL_PREFIX + "installation"
LABEL_IMAGE = LABEL_PREFIX + "image"  # what it was made from, as shown to users
LABEL_SNAPSHOT_OF = LABEL_PREFIX + "from-snapshot"  # the user's snapshot it started from
LABEL_WORK_FOLDER = LABEL_PREFIX + "work-folder"  # host folder mounted at the same path
LABEL_WORK_MODE = LABEL_PREFIX + "work-mode"  # "ro" when it is mounted read-only
# Its egress allowlist as JSON ("" or absent: none beyond the network switch).
LABEL_EGRESS = LABEL_PREFIX + "egress-allow"
# The administrator's folders mapped into it when it was made (a JSON list, see volumes.py).
LABEL_VOLUMES = LABEL_PREFIX + "volumes"
# Host folder mounted read-only where its interpreters reach their kernels (agent_sockets).
LABEL_AGENT_SOCKETS = LABEL_PREFIX + "agent-sockets"
# "files" on a user's files sandbox (see Backend.files_sandbox); code sandboxes have none.
LABEL_ROLE = LABEL_PREFIX + "role"
ROLE_FILES = "files"
FILES_SUFFIX = "--files"

WORKSPACE = "/workspace"
# What every "sandbox restarted" notice says the user lost and kept (kernel and engines).
LOST_NOTICE = "variables were lost, files in /workspace were kept"
SHARED = "/shared"


@dataclass(frozen=True)
class Spec:
    """What one sandbox is made from: decided by the orchestrator, made by a backend.

    The resources (flavor, CPUs, memory, disk, processes) can change in place where the
    engine allows it; everything in :meth:`fingerprint` needs a new sandbox.
    """

    image: str = ""  # Docker image, or Daytona snapshot name ("" there: Daytona's default)
    snapshot: str = ""  # the user's snapshot (short name), "" for none
    snapshot_ref: str = ""  # the engine's reference to it (owner-qualified)
    flavor: str = "small"
    cpus: float = 1.0
    memory: int = 1 << 30
    disk: int = 0  # bytes of the workspace, and apart of the sandbox's own files (0: unbounded)
    pids: int = 512
    network: bool = True
    shared_folder: str = ""
    runtime: str = ""
    work_folder: str = ""  # host folder mounted at the same path ("": none)
    work_read_only: bool = False  # mounted read-only (work_mount = "ro")
    masks: tuple[tuple[str, str], ...] = ()  # (path, "hide") inside it
    egress: tuple[str, ...] = ()  # where it may connect (egress_allow); (): anywhere network allows
    volumes: tuple[Volume, ...] = ()  # the administrator's mapped folders (c.SandboxConfig.volumes)

    def fingerprint(self, work: bool = True) -> str:
        """A short hash of what cannot change without making the sandbox anew (``work``:
        counting the work folder, which a caller without one does not care about)."""
        fixed = {
            "image": "" if self.snapshot_ref else self.image,
            "snapshot": self.snapshot_ref,
            "network": self.network,
            "shared": self.shared_folder,
            "runtime": self.runtime,
        }
        if self.egress:  # absent otherwise: sandboxes made before it keep their fingerprint
            fixed["egress"] = sorted(self.egress)
        if work and self.work_folder:
            fixed["work"] = self.work_folder
            if self.work_read_only:
                fixed["work_mode"] = "ro"
        if self.volumes:  # (absent when none: sandboxes made before mappings keep their hash)
            fixed["volumes"] = [str(v) for v in self.volumes]
        return hashlib.sha256(json.dumps(fixed, sort_keys=True).encode()).hexdigest()[:12]

    @property
    def source(self) -> str:
        """What it is made from, as a user would say it."""
        return f"snapshot {self.snapshot}" if self.snapshot else (self.image or "the default image")


class AgentListener(Protocol):
    """A socket on this host by which an interpreter in a sandbox reaches its kernel
    past the engine's exec stream (see the Docker backend's sockets module)."""

    inside: str  # its path as the sandbox sees it
    token: str  # what the interpreter sends first

    def accept(self, within: float) -> socket.socket: ...

    def close(self) -> None: ...


@dataclass(frozen=True)
class EngineSettings:
    """The little of an installation's settings an engine adapter needs."""

    installation: str  # this installation's id: engine names and labels carry it
    workspace_root: str  # host folder of the users' workspaces (Docker, local)
    state_dir: str  # for engine leftovers the host must keep (local records)
    start_timeout: float = 300.0
    idle_stop: float = 15.0  # minutes: Daytona applies them natively
    idle_delete: float = 120.0
    files_idle_stop: float = 60.0  # minutes: a files sandbox's own auto-stop
    # What a sandbox may not change in a writable work folder (policy, found at each start:
    # see folders.protect)
    protected_paths: tuple[str, ...] = ()
    kubernetes_namespace: str = ""  # "": the kubeconfig context's (or the pod's own)
    kubernetes_storage_class: str = ""  # "": the cluster's default
    kubernetes_workspace_size: int = 10 << 30
    ca_bundle: str = ""  # what sandboxes trust (see trust.py): "", a PEM file, or "none"
    # Variables every process started in a sandbox inherits (trust.passed_env).
    env: tuple[tuple[str, str], ...] = ()


def installation_id(state_dir: str) -> str:
    """Which installation (state folder) owns a sandbox: the reaper only touches its own."""
    return hashlib.sha256(str(state_dir).encode()).hexdigest()[:12]


ENGINE_SUFFIX = "--i"


def engine_name(installation: str, sandbox_id: str) -> str:
    """The engine's name for a sandbox: its id plus this installation's tag.

    Ids (``sk-alice``) are what users see and type; two installations on one engine
    (another state folder, another server) have the same ids for the same user, so
    the engine's names carry the installation and never collide: neither can find,
    stop or reap the other's sandboxes by name.
    """
    return f"{sandbox_id}{ENGINE_SUFFIX}{installation[:8]}"


def sandbox_id_of(installation: str, name: str) -> str:
    """The sandbox id of an engine name made by :func:`engine_name` (else the name)."""
    suffix = f"{ENGINE_SUFFIX}{installation[:8]}"
    return name[: -len(suffix)] if name.endswith(suffix) else name


def sandbox_labels(key: ScopeKey, spec: Spec, installation: str, workspace: str) -> dict[str, str]:
    """The labels that make a sandbox ours and let any process find it by its key."""
    return {
        LABEL_MANAGED: "1",
        LABEL_USER: key.user,
        LABEL_USER_ID: key.user_id,
        LABEL_SCOPE: key.scope,
        LABEL_THREAD: key.thread,
        LABEL_FLAVOR: spec.flavor,
        LABEL_SPEC: spec.fingerprint(),
        LABEL_WORKSPACE: workspace,
        LABEL_INSTALLATION: installation,
        LABEL_IMAGE: spec.source,
        LABEL_SNAPSHOT_OF: spec.snapshot,
        LABEL_WORK_FOLDER: spec.work_folder,
        LABEL_WORK_MODE: "ro" if spec.work_read_only else "",
        LABEL_EGRESS: egress_label(spec.egress),
        LABEL_VOLUMES: to_label(spec.volumes),
    }


def egress_label(entries: tuple[str, ...]) -> str:
    """The egress allowlist as a label's value ("" for none)."""
    return json.dumps(sorted(entries), separators=(",", ":")) if entries else ""


def egress_of(labels: dict[str, str]) -> list[str]:
    """The egress allowlist a sandbox's labels record ([] for none)."""
    try:
        found = json.loads(labels.get(LABEL_EGRESS) or "[]")
    except ValueError:
        return []
    return [str(e) for e in found] if isinstance(found, list) else []


def volumes_of(labels: dict[str, str]) -> tuple[Volume, ...]:
    """The mapped folders a sandbox was made with, from its labels."""
    return from_label(labels.get(LABEL_VOLUMES, ""))


def mapped_volumes(info: SandboxInfo) -> tuple[Volume, ...]:
    """The mapped folders sandbox ``info`` was made with."""
    return tuple(Volume(v["source"], v["target"], v["mode"]) for v in info.volumes)


def writable_host_folders(info: SandboxInfo) -> builtins.list[str]:
    """Where host folders the sandbox writes appear in it (its work folder, its writable
    mappings): beneath them no process of the sandbox may make links, FIFOs, sockets or
    devices (see agent/restrict.py)."""
    folders = [info.work_folder] if info.work_folder else []
    return folders + [v["target"] for v in info.volumes if v.get("mode") == "rw"]


def files_sandbox_id(user: str) -> str:
    """The id of ``user``'s files sandbox: their own sandbox's id plus ``--files``.

    No code sandbox's id can end so (a safe user id holds ``--`` only before a digest of
    hex digits, and thread, variant and work-folder ids end in ``--t``, ``--v`` or
    ``--w`` and hex digits), so the id alone tells the two kinds apart everywhere.
    """
    return f"{ScopeKey(user).name}{FILES_SUFFIX}"


def is_files_sandbox(sandbox_id: str) -> bool:
    """Whether ``sandbox_id`` names a files sandbox (see :func:`files_sandbox_id`)."""
    return sandbox_id.endswith(FILES_SUFFIX)


def epoch_of(stamp: str | None) -> float:
    """An engine's RFC 3339 time (``2026-11-26T12:00:00.123456789Z``, any fraction, ``Z``
    or an offset) as epoch seconds; 0.0 for none or anything else."""
    if not stamp:
        return 0.0
    match = re.fullmatch(r"([^.]+?)(?:\.(\d+))?(Z|[+-]\d\d:\d\d)?", stamp.strip())
    if not match:
        return 0.0
    main, fraction, zone = match.groups()
    try:
        when = datetime.fromisoformat(main + (zone or "Z").replace("Z", "+00:00"))
    except ValueError:
        return 0.0
    return when.timestamp() + (float("0." + fraction[:6]) if fraction else 0.0)


def not_found(sandbox_id: str) -> SandboxNotFound:
    """The one wording for unknown ids, so CLI and REST say the same thing."""
    return SandboxNotFound(
        f"no sandbox with id {sandbox_id!r}; `sandbox-kernel list` shows the ids you have"
    )


@dataclass
class SandboxInfo:
    """What every listing shows about one sandbox."""

    id: str
    backend: str
    scope: str
    user: str
    thread: str
    state: str  # creating | running | stopped | error
    image: str
    created: float
    engine_id: str = ""
    flavor: str = ""
    isolation: str = ""  # what actually separates it from the host
    workspace: str = ""  # host folder mounted at /workspace
    # cpus, memory, pids, disk (bytes of its own files), workspace_disk (its workspace's)
    limits: dict[str, Any] = field(default_factory=dict)
    # cpu (fraction), memory, disk and workspace_disk (bytes used)
    usage: dict[str, Any] = field(default_factory=dict)
    disk_note: str = ""  # what of its disk is not bounded (or not yet grown), and why
    exit_reason: str = ""  # why it is not running, when known (OOM, exit code)
    finished: float = 0.0  # when it last stopped (epoch seconds; 0 if never)
    started: float = 0.0  # while running: when it last started (epoch seconds; 0 if unknown)
    snapshot: str = ""  # the snapshot it was created from, if any
    spec: str = ""  # Spec.fingerprint() of what it was made from
    installation: str = ""  # installation_id of the state file that owns it
    file_owner: str = ""  # "uid:gid" the server gives new workspace files, when not its own
    work_folder: str = ""  # host folder mounted at the same path inside, if any
    agent_sockets: str = ""  # host folder its interpreters reach their kernels by, if any
    # The administrator's folders mapped into it: source, target, mode, kind (volumes.py)
    volumes: list[dict[str, str]] = field(default_factory=list)
    # Filled in by the orchestrator for listings:
    outdated: str = ""  # why it differs from what its owner's settings make now, if it does
    remake: str = ""  # when outdated: what its next start does about it ("": nothing)
    kernels: int = 0
    kernel_ids: list[str] = field(default_factory=list)
    busy_kernel_ids: list[str] = field(default_factory=list)
    last_activity: float = 0.0

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


@dataclass
class SnapshotInfo:
    """A saved sandbox filesystem (never the workspace) that new sandboxes can start from."""

    name: str
    backend: str
    user: str
    source: str  # the sandbox it was taken from
    size: int
    created: float
    id: str = ""
    ref: str = ""  # the engine's name for it (owner-qualified)

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


SNAPSHOT_NAME = re.compile(r"[a-z0-9][a-z0-9_.-]{0,62}")
LABEL_SNAPSHOT = LABEL_PREFIX + "snapshot"  # on a snapshot: its short name
LABEL_SOURCE = LABEL_PREFIX + "source"  # on a snapshot: the sandbox it was taken from


def snapshot_ref(user: str, name: str) -> str:
    """The engine's name of ``user``'s snapshot ``name``: owner first, so names are per user."""
    return f"{ScopeKey(user).user_id}--{check_snapshot_name(name)}"


def check_snapshot_name(name: str) -> str:
    """Snapshot names become engine tags: refuse anything else with a clear message."""
    if not isinstance(name, str) or not SNAPSHOT_NAME.fullmatch(name):
        raise BadRequest(
            f"bad snapshot name {name!r}: use 1-63 lowercase letters, digits, '.', '_' or '-', "
            "starting with a letter or digit"
        )
    return name


@dataclass(frozen=True)
class EgressCount:
    """Refusals of one egress proxy of one kind (its allowlist named by a digest)."""

    allowlist: str
    reason: str  # name | port | address | sni | request
    count: int


@dataclass(frozen=True)
class PortTarget:
    """Where this host reaches one port of a sandbox (see :meth:`Backend.port_target`).

    ``url`` is ``http://HOST:PORT`` (or an engine's own https preview origin) with no
    path; ``headers`` go with every request to it (an engine's preview token), and never
    back to the client. ``opener``, for an engine whose sandboxes' ports have no address
    on this host (the local backend's network namespaces), makes each connection's
    socket instead: an unconnected socket where the port is reached, and the address to
    connect it to (``url`` then names that address for the app's redirects); it raises
    OSError, saying why, where nothing can be reached.
    """

    url: str
    headers: dict[str, str] = field(default_factory=dict)
    opener: Callable[[], tuple[socket.socket, tuple[str, int]]] | None = field(
        default=None, compare=False
    )


MIN_PORT = 1
MAX_PORT = 65535


@dataclass
class Ensured:
    """The answer of the orchestrator's ``ensure``: the sandbox and what had to happen to it."""

    info: SandboxInfo
    event: str  # "existing" | "created" | "started" | "recreated"
    notice: str = ""  # one line for the user when something was lost (variables, a process)
    notes: list[str] = field(default_factory=list)  # what changed without loss (resized, outdated)


@dataclass
class ExecResult:
    exit_code: int
    output: bytes


@dataclass
class Health:
    ok: bool
    backend: str
    message: str


class Channel(abc.ABC):
    """A bidirectional byte stream to one process inside a sandbox.

    ``read`` returns b"" once the process has gone (EOF); the kernel treats that as
    "the interpreter died" and checks the sandbox to say why.
    """

    @abc.abstractmethod
    def write(self, data: bytes) -> None: ...

    @abc.abstractmethod
    def read(self, size: int = 65536) -> bytes: ...

    @abc.abstractmethod
    def close(self) -> None: ...

    def exit_status(self) -> int | None:
        """The process's exit status once it has ended, when the engine can tell."""
        return None

    def read_exactly(self, size: int) -> bytes:
        buf = bytearray()
        while len(buf) < size:
            chunk = self.read(size - len(buf))
            if not chunk:
                break
            buf += chunk
        return bytes(buf)


class Pty(Channel):
    """A terminal in a sandbox: a :class:`Channel` to a process whose stdin, stdout and
    stderr are the slave side of a pseudo-terminal inside the sandbox.

    Bytes pass as a terminal sends them (Ctrl-C is ``\\x03``, turned into SIGINT by the
    sandbox's own line discipline), so a relay needs no knowledge of signals; ``read``
    returns b"" once the process has gone, and :meth:`exit_status` then says how.
    """

    @abc.abstractmethod
    def resize(self, rows: int, cols: int) -> None:
        """Give the terminal a new size (the foreground program gets SIGWINCH)."""


class Backend(abc.ABC):
    """A sandbox engine. Methods are synchronous; async callers use a thread."""

    name: str = "base"
    # Whether SandboxInfo.workspace is a folder on this host (Docker, local); when not
    # (Daytona's volumes), file routes go through the sandbox itself.
    workspace_on_host: bool = True
    # Whether a warm spare interpreter can wait in a sandbox for the next kernel.
    keeps_spares: bool = False
    # Whether get/destroy also accept an engine id (to reach an older incarnation of an id).
    finds_engine_ids: bool = False
    # Whether resize() changes a sandbox's CPUs, memory and processes in place.
    resizes: bool = False
    # Whether port_target() reaches a sandbox's ports (preview URLs).
    previews: bool = False
    # Whether sandboxes are made from the image or snapshot of the Spec (not so for the
    # local backend: the host's own Python).
    uses_images: bool = True
    # Whether remake() keeps a sandbox's own files (its installed packages, its home).
    keeps_files_on_remake: bool = False

    def __init__(self, settings: EngineSettings) -> None:
        self.settings = settings
        # Why backend "auto" took this engine rather than Docker ("" when it was chosen).
        self.fallback = ""

    # -- engine --------------------------------------------------------------
    @abc.abstractmethod
    def health(self) -> Health:
        """Whether the engine answers, and if not what the user should do."""

    # -- sandboxes -----------------------------------------------------------
    @abc.abstractmethod
    def find(self, sandbox_id: str) -> SandboxInfo | None:
        """One sandbox of this installation, or None."""

    def get(self, sandbox_id: str) -> SandboxInfo:
        """One sandbox of ours, or :class:`SandboxNotFound`."""
        info = self.find(sandbox_id)
        if info is None:
            raise not_found(sandbox_id)
        return info

    @abc.abstractmethod
    def list(self, user: str | None = None) -> list[SandboxInfo]:
        """This installation's sandboxes, all or those of one user (the name, not the id)."""

    @abc.abstractmethod
    def create(
        self, sandbox_id: str, key: ScopeKey, spec: Spec, labels: dict[str, str], progress: Progress
    ) -> SandboxInfo:
        """Make and start sandbox ``sandbox_id`` of ``key`` from ``spec``, carrying ``labels``.

        Raises :class:`AlreadyExists` when another process made it first (the caller
        then takes that one), :class:`SandboxFailed` when the engine refuses.
        """

    @abc.abstractmethod
    def start(self, sandbox_id: str, progress: Progress | None = None) -> SandboxInfo:
        """Bring a stopped (or half-made) sandbox to running; returns when it runs."""

    @abc.abstractmethod
    def stop(self, sandbox_id: str) -> SandboxInfo:
        """Stop processes; the sandbox filesystem is kept."""

    @abc.abstractmethod
    def destroy(self, sandbox_id: str) -> bool:
        """Remove the sandbox (the workspace is kept). False if it was already gone."""

    def refresh_trust(self) -> None:
        """Bring the certificates running sandboxes trust up to date with the settings
        (see trust.py); engines that give sandboxes none of the host's need nothing."""
        return None

    def resize(self, sandbox_id: str, spec: Spec) -> bool:
        """Give a sandbox the resources of ``spec`` in place; False when the engine cannot."""
        return False

    def remake(
        self, sandbox_id: str, key: ScopeKey, spec: Spec, labels: dict[str, str], progress: Progress
    ) -> SandboxInfo:
        """Make the stopped sandbox ``sandbox_id`` anew from ``spec``, whose mapped folders
        differ from its own (no engine adds mounts to a sandbox), keeping what the engine
        can of its own files (:attr:`keeps_files_on_remake`); running when it returns.

        Here: removed and made again, so only its workspace is kept. Raises as
        :meth:`create` does."""
        self.destroy(sandbox_id)
        return self.create(sandbox_id, key, spec, labels, progress)

    def check_volumes(self, volumes: tuple[Volume, ...]) -> None:
        """Refuse, in one line naming it, a mapping this engine cannot mount. Host folders
        here; an engine with volumes of its own (Daytona) says otherwise."""
        for volume in volumes:
            if not volume.on_host:
                raise NotSupported(
                    f"mapping '{volume}': the {self.name} backend mounts host folders, not "
                    f"volumes by name; give {volume.target} a host folder (an absolute path)"
                )

    # -- processes -----------------------------------------------------------
    @abc.abstractmethod
    def exec(
        self,
        sandbox_id: str,
        cmd: builtins.list[str],
        *,
        cwd: str = WORKSPACE,
        env: dict[str, str] | None = None,
        timeout: float | None = None,
    ) -> ExecResult:
        """Run a command to completion; stdout and stderr merged."""

    @abc.abstractmethod
    def open_channel(
        self,
        sandbox_id: str,
        cmd: builtins.list[str],
        *,
        cwd: str = WORKSPACE,
        env: dict[str, str] | None = None,
    ) -> Channel:
        """Start ``cmd`` with its stdin and stdout joined to a :class:`Channel`.

        The process ends when the channel closes (it reads EOF on stdin), so an
        interpreter never outlives the kernel that owns it.
        """

    def agent_listener(self, info: SandboxInfo) -> AgentListener | None:
        """A socket by which an interpreter in the sandbox reaches its kernel past the
        engine (see agent_sockets); None: the process channel is the only way."""
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
    ) -> Pty:
        """Start ``cmd`` on a new pseudo-terminal of ``rows`` x ``cols`` inside the sandbox,
        as its session leader with that terminal as its controlling one (job control and
        Ctrl-C work); closing the :class:`Pty` hangs the terminal up."""
        raise NotSupported(f"the {self.name} backend cannot open a terminal")

    # -- ports: optional ------------------------------------------------------------------
    def port_target(self, info: SandboxInfo, port: int) -> PortTarget:
        """Where this host reaches TCP port ``port`` of the running sandbox ``info``, for
        the preview proxy: an address only that sandbox holds (never this host's own
        loopback, never another sandbox's), or :class:`NotSupported`. The port is
        checked by the caller; this only says where it is."""
        raise NotSupported(self.no_previews())

    def no_previews(self) -> str:
        """Why this engine serves no previews ("" when it does: :attr:`previews`)."""
        if self.previews:
            return ""
        return f"the {self.name} backend cannot reach a sandbox's ports, so it serves no previews"

    # -- files (paths relative to the workspace, or absolute inside the sandbox) --
    @abc.abstractmethod
    def put_file(self, sandbox_id: str, path: str, data: bytes | IO[bytes]) -> None:
        """Write a file inside the sandbox, creating parent folders."""

    @abc.abstractmethod
    def get_file(self, sandbox_id: str, path: str) -> Iterator[bytes]:
        """Read a file from the sandbox in chunks."""

    # -- a files sandbox per user: optional ------------------------------------------------
    def files_sandbox(self, user: str, image: str, progress: Progress | None = None) -> SandboxInfo:
        """``user``'s files sandbox, running: made on first use, started when stopped.

        Engines whose workspaces are not on this host (Daytona's volumes) reach a
        user's files through a sandbox of its own that mounts the same workspace and
        never runs user code, so file use never wakes (or keeps awake) a sandbox that
        runs code. It is not one of the user's sandboxes: :meth:`list` leaves it out
        (and so listings and quotas do), :meth:`files_sandboxes` lists it for the
        reaper, and :meth:`get`, :meth:`stop`, :meth:`destroy` and :meth:`exec` take
        its id (:func:`files_sandbox_id`). ``image`` is what it is made from.
        """
        raise NotSupported(f"the {self.name} backend reads workspaces on this host directly")

    def files_sandboxes(self) -> builtins.list[SandboxInfo]:
        """This installation's files sandboxes (none where workspaces are on this host)."""
        return []

    def workspace_ready(self, info: SandboxInfo) -> None:
        """Before the host reads or writes ``info``'s workspace folder itself (file
        routes): whatever bounds it is in place (a disk the host mounts over it, gone
        after a reboot), so no file lands in the folder beneath. Nothing by default."""
        return None

    def sweep(self) -> None:
        """Remove host-side leftovers of sandboxes that vanished behind our back (the
        reaper calls it); engines with nothing on the host need nothing."""
        return None

    def unwedge(self, sandbox_id: str) -> None:
        """Free the engine from a start that a process of the sandbox stopped half-way
        (see the Docker backend); called before stopping or removing a sandbox and when
        a process did not start in time. Engines that cannot wedge so need nothing."""
        return None

    # -- a warm spare: optional ---------------------------------------------------------
    def start_spare(self, sandbox_id: str) -> None:
        """Start the sandbox's warm interpreter for its next kernels (see agent/spare.py),
        where the engine lets a process outlive the call that started it; one that
        finds a spare waiting ends at once."""
        return None

    # -- activity, usage and snapshots: optional ------------------------------------------
    @property
    def keep_alive_interval(self) -> float:
        """Seconds between keep_alive calls while a cell runs; 0: never (an engine may
        work it out from its settings, hence a property)."""
        return 0.0

    def keep_alive(self, sandbox_id: str) -> None:
        """Tell an engine with its own idle timer that a cell is running (Daytona counts
        only API use as activity, so a long silent cell would otherwise be stopped)."""
        return None  # engines that see processes run (Docker, local) need nothing

    def usage(self, infos: builtins.list[SandboxInfo]) -> dict[str, dict[str, float]]:
        """Live use per sandbox id ({"memory": bytes, ...}); empty when the engine can't tell."""
        return {}

    def disk_bound(self) -> str:
        """Why new sandboxes' disks are not bounded here, in one line ("" when they are)."""
        return f"the {self.name} backend does not bound disks"

    def disk_usage(self, infos: builtins.list[SandboxInfo]) -> dict[str, dict[str, int]]:
        """Bytes used per sandbox id, running or not: ``disk`` (its own files) and
        ``workspace_disk``, each where a bound makes it measurable; empty otherwise."""
        return {}

    def egress_denied(self) -> builtins.list[EgressCount]:
        """Connections the egress proxies of this installation refused, per allowlist
        and reason, counted since each proxy started (empty where there are none)."""
        return []

    # Snapshots are named by the orchestrator: ``ref`` is owner-qualified (see
    # :func:`snapshot_ref`), so two users can each have a snapshot called "base".
    def create_snapshot(self, sandbox_id: str, ref: str, labels: dict[str, str]) -> SnapshotInfo:
        """Save the sandbox's filesystem (never the workspace) as snapshot ``ref``."""
        raise NotSupported(f"the {self.name} backend cannot take snapshots")

    def list_snapshots(self) -> builtins.list[SnapshotInfo]:
        """Every snapshot of this installation, each with its owner and ref."""
        raise NotSupported(f"the {self.name} backend has no snapshots")

    def delete_snapshot(self, ref: str) -> bool:
        """Remove snapshot ``ref``; False when it was not there. Refuses while in use."""
        raise NotSupported(f"the {self.name} backend has no snapshots")

    # -- helpers shared by all engines ------------------------------------------
    def wait_until(self, predicate: Callable[[], bool], timeout: float, what: str) -> None:
        deadline = time.monotonic() + timeout
        while not predicate():
            if time.monotonic() > deadline:
                raise SandboxFailed(f"timed out after {timeout:.0f} s waiting for {what}")
            time.sleep(0.1)
