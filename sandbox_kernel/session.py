"""One kernel's hold on its sandbox: find or make it, start an interpreter in it, and say
in one line what happened when it is lost.

Everything here may block on the engine (creating a sandbox pulls an image, a lost
one is looked up), so the kernel calls it from worker threads and keeps its event loop
for Jupyter's messages. What the user must learn from a connection made in the
background (the sandbox was recreated, variables are gone) waits in ``notices`` for
the next cell, which prints it.
"""

from __future__ import annotations

import json
import logging
import queue
import threading
import time
from pathlib import Path, PurePosixPath
from typing import TYPE_CHECKING

from . import sync
from .agent import bootstrap_command, bundle
from .backends import Backend, Channel, SandboxError, SandboxNotFound
from .backends.base import LOST_NOTICE, WORKSPACE, SandboxInfo, writable_host_folders
from .backends.docker.sockets import SocketChannel
from .config import MIN_PIDS, SandboxConfig
from .folders import notebook_folder, usable
from .housekeeping import Housekeeping
from .identity import ScopeKey
from .service import SandboxService, workspace_dir
from .units import format_size

if TYPE_CHECKING:
    from .connection import AgentConnection

log = logging.getLogger(__name__)
# Seconds an interpreter that said it connected to its socket has to show up there.
CONNECT_WAIT = 10.0


class SandboxSession:
    """The sandbox of one kernel, and the interpreter the kernel talks to in it."""

    def __init__(self, cfg: SandboxConfig, key: ScopeKey, kernel_id: str) -> None:
        self.cfg = cfg
        self.key = key
        self.kernel_id = kernel_id
        self.sandbox_id = ""
        self.engine_id = ""
        self.work_folder = ""
        self.folder_copy: sync.FolderCopy | None = None  # the notebook's folder, copied in
        self.lost = ""  # why the previous interpreter went, to phrase the next notice
        self.notices: queue.SimpleQueue[str] = queue.SimpleQueue()  # for the next cell
        self._service: SandboxService | None = None
        self._housekeeping: Housekeeping | None = None
        self._lock = threading.Lock()
        # Progress lines said since the sandbox was last reached: an attempt that fails
        # as the one before did (an image that cannot be pulled, at every cell) says
        # nothing new, so its "creating ... pulling" is not said again.
        self._said: set[str] = set()
        self._told_fallback = False

    @property
    def service(self) -> SandboxService:
        """The orchestrator, made on first use in a worker thread (it sets SQLite up)."""
        with self._lock:
            if self._service is None:
                self._service = SandboxService(self.cfg)
                self._housekeeping = Housekeeping(self._service, self.kernel_id)
            return self._service

    @property
    def housekeeping(self) -> Housekeeping:
        self.service  # noqa: B018 - makes both
        assert self._housekeeping is not None
        return self._housekeeping

    @property
    def backend(self) -> Backend:
        return self.service.backend

    @property
    def output_ceiling(self) -> int:
        """Bytes of output events one cell may send on the wire, whatever the agent says.

        The agent enforces the exact limit; this ceiling (the limit plus room for the
        protocol's own bytes) holds against a cell that writes to the agent's channel
        directly.
        """
        return self.cfg.output_limit + max(self.cfg.output_limit // 8, 64 << 10)

    def take_notices(self) -> list[str]:
        """What the user must read before the next cell's output (and only once)."""
        taken = []
        while True:
            try:
                taken.append(self.notices.get_nowait())
            except queue.Empty:
                return taken

    # -- connecting ----------------------------------------------------------------------
    def open(self) -> AgentConnection:
        """Find or create the sandbox and start an interpreter in it."""
        agent = self.connect()
        self.keep_books(agent)
        return agent

    def connect(self) -> AgentConnection:
        """:meth:`open` but for the books: a kernel's start hands the interpreter over
        first and keeps the books after (:meth:`keep_books`)."""
        info = self._ensure_sandbox()
        if self.folder_copy is None and self._wants_folder_copy():
            here = Path(notebook_folder()).resolve()
            self.housekeeping.report(
                info.id, f"copying {here} into the sandbox (it has no host folders)"
            )
            self.folder_copy = sync.push(self.backend, info.id, here)
            for name in self.folder_copy.skipped[:5]:
                self.housekeeping.report(
                    info.id, f"not copied (too large, or not a regular file): {name}"
                )
        return self._start_agent(info)

    def keep_books(self, agent: AgentConnection) -> None:
        """Record this kernel as its sandbox's user and beat from now on.

        Two SQLite writes and two threads started: about 10 ms in a kernel's start,
        which its first reply (and so the client's first cell) need not wait for. An
        interpreter that died meanwhile is not recorded: a newer one may be, already.
        """
        if not agent.alive:
            return
        self.housekeeping.record_host(self.sandbox_id)
        self.housekeeping.start(self.sandbox_id, self.engine_id)

    def home_folder(self) -> str:
        """The host folder this session works from, as a notebook's kernel works from the
        notebook's folder; it picks the work folder, hence the sandbox."""
        return notebook_folder()

    def _ensure_sandbox(self) -> SandboxInfo:
        """The sandbox, running; a loss the user must hear of becomes a notice."""
        work = self.service.work_folder(self.home_folder(), user=self.key.user)
        target = self.service.sandbox_id(self.key, work_folder=work)

        def say(line: str) -> None:
            if line not in self._said:
                self._said.add(line)
                self.housekeeping.report(target, line)

        ensured = self.service.ensure(self.key, progress=say, work_folder=work)
        self._said.clear()
        info = ensured.info
        notice = ensured.notice
        if not notice and self.engine_id and info.engine_id != self.engine_id:
            notice = f"sandbox restarted: {LOST_NOTICE} ({info.id} had been recreated)"
        elif not notice and self.lost:
            why = f"{info.id} had been stopped" if ensured.event == "started" else self.lost
            notice = f"sandbox restarted: {LOST_NOTICE} ({why})"
        if notice:  # the next cell says it: the user lost variables and must know
            self.notices.put(notice)
        for note in ensured.notes:  # a change without loss: log and status bar, not the notebook
            self.housekeeping.report(info.id, note)
        self._tell_fallback(info)
        return self._hold(info)

    def _tell_fallback(self, info: SandboxInfo) -> None:
        """No Docker engine answered, so backend ``auto`` took the weaker local one: say
        so once per kernel where the kernel's own messages go (the job's or the server's
        log, and JupyterLab's status bar), never in the notebook (a CI run stores what
        ipykernel stores)."""
        reason = self.backend.fallback
        if not reason or self._told_fallback:
            return
        self._told_fallback = True
        self.housekeeping.report(
            info.id,
            f"{reason}, so {info.id} runs on the local backend "
            f"({info.isolation or 'weaker isolation than a container'}); start Docker for "
            "container isolation, or set SANDBOX_KERNEL_BACKEND=local to choose this on purpose",
        )

    def _hold(self, info: SandboxInfo) -> SandboxInfo:
        """``info`` is this session's sandbox from now on (a loss has been told)."""
        self.lost = ""
        self.sandbox_id, self.engine_id, self.work_folder = (
            info.id,
            info.engine_id,
            info.work_folder,
        )
        return info

    def _start_agent(self, info: SandboxInfo) -> AgentConnection:
        """An interpreter in the sandbox (the sandbox's warm spare forks one when one
        waits there, see agent/spare.py); then it speaks over its socket to this kernel,
        when the sandbox has one (see backends/docker/sockets.py)."""
        env = {
            "SANDBOX_AGENT_OUTPUT_LIMIT": str(self.cfg.output_limit),
            "SANDBOX_AGENT_CELL_TIMEOUT": str(self.cfg.cell_timeout),
            # Host folders in the sandbox: its processes may not plant links or FIFOs there.
            "SANDBOX_AGENT_NO_SPECIAL_FILES": json.dumps(writable_host_folders(info)),
        }
        # Imported here, not at the top: a kernel's start seeks its sandbox before it
        # has imported asyncio (see early_start), and the connection needs it.
        from .connection import START_TIMEOUT

        listener = self.backend.agent_listener(info)
        offer = b""
        try:
            if listener is not None:
                # Only a flag in the environment: the path and token follow the source.
                env["SANDBOX_AGENT_CHANNEL"] = "1"
                where = {"op": "channel", "path": listener.inside, "token": listener.token}
                offer = json.dumps(where).encode() + b"\n"
            channel = self.backend.open_channel(
                info.id, bootstrap_command(), cwd=self.cell_cwd(), env=env
            )
            agent = self._started_agent(info, channel, bundle("start") + offer, START_TIMEOUT)
            if listener is not None and agent.ready.get("channel") is True:
                try:
                    agent.move_to(SocketChannel(listener.accept(CONNECT_WAIT), channel))
                except BaseException:
                    agent.close()
                    raise
            return agent
        finally:
            if listener is not None:
                listener.close()

    def _started_agent(
        self, info: SandboxInfo, channel: Channel, source: bytes, within: float
    ) -> AgentConnection:
        """The agent on ``channel``, once it said ready; what went wrong, said in a line."""
        from .connection import AgentConnection  # (see _start_agent)

        agent = AgentConnection(channel, max_line=self.output_ceiling)
        try:
            agent.start(source, within=within)
        except SandboxError as exc:
            agent.close()
            self.backend.unwedge(info.id)  # a start the sandbox froze holds the engine
            hint = too_few_pids(info)
            if hint:
                raise SandboxError(f"{exc}; {hint}") from None
            raise
        except BaseException:
            agent.close()
            raise
        return agent

    def _wants_folder_copy(self) -> bool:
        """A sandbox without host folders (Daytona) gets a copy of the notebook's folder,
        unless that is nothing of the user's (the home itself, a system folder)."""
        if not sync.wanted(self.cfg, self.backend):
            return False
        here = Path(notebook_folder()).resolve()
        return usable(here) and here != Path.home().resolve()

    def cell_cwd(self) -> str:
        """Where cells start: the notebook's own folder when the sandbox has it (the work
        folder is mounted at its own path, or copied in), /workspace/<folder> when the
        notebook lies in the workspace, else /workspace."""
        if self.folder_copy is not None:
            return self.folder_copy.remote
        here = Path(notebook_folder()).resolve()
        if self.work_folder and (
            here == Path(self.work_folder) or Path(self.work_folder) in here.parents
        ):
            return str(here)
        try:
            rel = here.relative_to(workspace_dir(self.cfg, self.key).resolve())
        except (ValueError, OSError):
            return WORKSPACE
        return str(PurePosixPath(WORKSPACE, *rel.parts))

    # -- losing it ---------------------------------------------------------------------------
    def why_lost(self, exit_status: int | None) -> str:
        """One line on what happened to the sandbox, for the cell that lost its interpreter
        (which ended with ``exit_status``), and what the next cell will do about it; the
        sandbox's log (``sandbox-kernel logs``) keeps it too."""
        line = self._why_lost(exit_status)
        if self.sandbox_id:
            self.service.record(self.sandbox_id, f"kernel {self.kernel_id}: {line}")
        return line

    def _why_lost(self, exit_status: int | None) -> str:
        sandbox = self.sandbox_id or "the sandbox"
        try:
            # The interpreter dies a moment before its container does (a forced removal
            # kills processes first): give the engine a second before judging.
            time.sleep(1.0)
            info = self.backend.get(self.sandbox_id)
            deadline = time.monotonic() + 3
            while info.state != "running" and time.monotonic() < deadline:
                time.sleep(0.2)  # a forced removal kills first: let the engine settle
                info = self.backend.get(self.sandbox_id)
            if info.engine_id != self.engine_id:  # replaced, e.g. by another kernel of this user
                raise SandboxNotFound(sandbox)
            if info.state == "running":
                self.lost = "the interpreter had ended"
                return self._why_interpreter_ended(info, exit_status)
            reason = f" ({info.exit_reason})" if info.exit_reason else ""
            self.lost = f"{sandbox} had stopped{reason}"
            return f"sandbox {sandbox} stopped{reason}: {LOST_NOTICE}; the next cell restarts it"
        except SandboxNotFound:
            self.lost = f"{sandbox} had been removed"
            return f"sandbox {sandbox} was removed: {LOST_NOTICE}; the next cell recreates it"
        except SandboxError as exc:
            self.lost = "the engine had lost it"
            return f"lost the sandbox {sandbox}: {one_line(exc)}"

    @staticmethod
    def _why_interpreter_ended(info: SandboxInfo, exit_status: int | None) -> str:
        if exit_status in (137, -9):
            memory = info.limits.get("memory") or 0
            limit = f"the memory limit of {format_size(memory)}" if memory else "a limit"
            return (
                f"the interpreter in {info.id} was killed, most likely by {limit} "
                f"(flavor {info.flavor or '?'}; SANDBOX_KERNEL_FLAVOR picks a larger one): {LOST_NOTICE}"
            )
        hint = too_few_pids(info)
        if hint:
            return f"the interpreter in {info.id} ended: {hint}"
        return f"the interpreter in {info.id} ended: {LOST_NOTICE}; the next cell starts a new one"

    def disk_full(self, ename: str, evalue: str) -> str:
        """One line for a cell whose error says the disk is full (ENOSPC, EDQUOT): which
        bound it hit (the flavor's), how full each is, and what to do; "" for any other
        error. Asks the engine, so a worker thread calls it."""
        if not is_disk_full(ename, evalue) or not self.sandbox_id:
            return ""
        try:
            info = self.backend.get(self.sandbox_id)
            used = self.backend.disk_usage([info]).get(info.id, {})
        except SandboxError:
            return ""
        return disk_full_line(info, used, self.cfg)

    # -- ending ------------------------------------------------------------------------------
    def forget_kernel(self) -> None:
        """The kernel shuts down: its records go (if it ever made any: a kernel that never
        reached its sandbox must not set the state file up now, on the event loop)."""
        if self._housekeeping is not None:
            self._housekeeping.gone()

    def copy_back(self) -> list[str]:
        """What the cells wrote beside the notebook goes back beside it (copied sandboxes)."""
        if self.folder_copy is None or not self.sandbox_id:
            return []
        return sync.pull(self.backend, self.sandbox_id, self.folder_copy)


# How an error says the disk is full: ENOSPC (a file system's end) or EDQUOT (a quota).
DISK_FULL = ("[Errno 28]", "No space left on device", "[Errno 122]", "Disk quota exceeded")


def is_disk_full(ename: str, evalue: str) -> bool:
    """Whether a cell's error (its name and value) is a full disk."""
    return any(sign in f"{ename}: {evalue}" for sign in DISK_FULL)


def disk_full_line(info: SandboxInfo, used: dict[str, int], cfg: SandboxConfig) -> str:
    """The line a cell gets when it filled a disk: the sandbox's flavor and its bounds,
    how full each is, and what to do (delete files, or a flavor with more disk)."""
    bounds = []
    for key, what in (("workspace_disk", "/workspace"), ("disk", "its own files (home, /tmp)")):
        limit = int(info.limits.get(key) or 0)
        if limit:
            use = f"{format_size(used[key])} used of " if key in used else ""
            bounds.append(f"{what} {use}{format_size(limit)}")
    if not bounds:
        note = f": {info.disk_note}" if info.disk_note else ""
        return (
            f"disk full: the disk of sandbox {info.id} is the host's, and it is full{note}; "
            "delete files, or ask the administrator for room"
        )
    disk = int(info.limits.get("disk") or info.limits.get("workspace_disk") or 0)
    allowed = [n for n in cfg.flavors if not cfg.allowed_flavors or n in cfg.allowed_flavors]
    larger = sorted(
        (int(cfg.flavors[n]["disk"]), n) for n in allowed if int(cfg.flavors[n]["disk"]) > disk
    )
    more = (
        f", or pick a flavor with more disk (SANDBOX_KERNEL_FLAVOR={larger[0][1]}: "
        f"{format_size(larger[0][0])})"
        if larger
        else ""
    )
    return (
        f"disk full: sandbox {info.id} has flavor {info.flavor or '?'}, whose disk bounds "
        f"{' and '.join(bounds)}; delete files{more}"
    )


def too_few_pids(info: SandboxInfo) -> str:
    """How to recover from a sandbox whose process limit cannot hold an interpreter (made
    before the setting was checked, or by hand), or "" when that is not the trouble."""
    pids = int(info.limits.get("pids") or 0)
    if not 0 < pids < MIN_PIDS:
        return ""
    return (
        f"the sandbox {info.id} allows only {pids} processes, too few for an interpreter: destroy it "
        f"(`sandbox-kernel destroy {info.id}`, your workspace is kept) and set SANDBOX_KERNEL_PIDS_LIMIT "
        f"to {MIN_PIDS} or more"
    )


def one_line(exc: BaseException) -> str:
    """The first line of an error, for a cell or a log line that must stay one line."""
    text = str(exc).strip() or type(exc).__name__
    return text.splitlines()[0]
