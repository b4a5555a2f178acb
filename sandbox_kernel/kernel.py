"""The Jupyter kernel: a thin relay between Jupyter and the agent inside the sandbox.

Each cell goes to the agent (:mod:`sandbox_kernel.agent`) over the backend's byte
channel, and what the agent sends back is published on IOPub as it arrives. The
kernel process itself holds no user state: restarting it starts a new interpreter in
the same sandbox, so files and installed packages stay.

Three paths matter:

* connect: started in the background when the kernel starts, so the first cell rarely
  waits; a cell that does wait shows the backend's progress (creating, pulling).
* stream: a reader thread turns channel bytes into messages on an asyncio queue; the
  cell that is running drains the queue and publishes.
* interrupt: ``interrupt_mode`` is ``message``, so Jupyter's interrupt arrives on the
  control channel and becomes an ``interrupt`` message to the agent, which raises
  KeyboardInterrupt in the cell; the interpreter and its variables survive.
"""

from __future__ import annotations

import asyncio
import base64
import binascii
import concurrent.futures
import json
import logging
import os
import platform
import re
import socket
import sys
import threading
import time
from collections.abc import Callable
from pathlib import Path, PurePosixPath
from typing import Any

from ipykernel.kernelbase import Kernel

from . import __version__, sync
from .agent import SPARE_SOCKET, agent_source, bootstrap_command
from .backends import Backend, SandboxError, SandboxNotFound
from .backends.base import LOST_NOTICE, WORKSPACE, SandboxInfo
from .config import MIN_PIDS, ConfigError, SandboxConfig, load_config
from .connection import OVERFLOW, AgentConnection, AgentGone
from .folders import usable
from .identity import ScopeKey, notebook_metadata, scope_key
from .lifecycle import gc
from .service import SandboxService, workspace_dir
from .store import HEARTBEAT, Store

log = logging.getLogger("sandbox_kernel")

GC_DELAY = 2.0  # seconds after the start before the kernel applies the lifecycle policies
CONNECT_WAIT_FOR_INFO = 5.0  # seconds kernel_info waits for the sandbox's Python version


class SandboxKernel(Kernel):
    """Python 3 in a persistent sandbox."""

    implementation = "sandbox"
    implementation_version = __version__
    language = "python"
    banner = "Python 3 running in a persistent sandbox (sandbox-kernel)"
    help_links = [{"text": "sandbox-kernel", "url": "https://pypi.org/project/sandbox-kernel/"}]

    def __init__(self, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        for msg_type in ("comm_open", "comm_msg", "comm_close"):
            self.shell_handlers[msg_type] = getattr(self, msg_type)
        self._python_version = platform.python_version()
        self._agent: AgentConnection | None = None
        self._connecting: asyncio.Task[None] | None = None
        self._notices: list[str] = []  # filled by the connecting thread, read by the loop
        self._notices_lock = threading.Lock()
        self._setup_error = ""
        self._sandbox_id = ""
        self._engine_id = ""
        self._work_folder = ""
        self._folder_copy: sync.FolderCopy | None = None  # the notebook's folder, copied in
        self._lost: str = ""  # what the previous cell's failure said, to phrase the next notice
        self._first_cell = True
        self._busy = False
        self._heart: threading.Thread | None = None
        self._wake = threading.Event()
        self._service: SandboxService | None = None
        self._early: concurrent.futures.Future[AgentConnection] | None = None
        try:
            self.cfg: SandboxConfig | None = load_config(**notebook_choices())
            self.key: ScopeKey | None = scope_key(self.cfg, self._kernel_id())
            self.backend: Backend | None = None
        except (ConfigError, SandboxError) as exc:
            self.cfg = self.key = self.backend = None
            self._setup_error = str(exc)
        # Start reaching the sandbox now, while the rest of the kernel starts: starting an
        # interpreter in it takes about as long as starting this process.
        self._early = concurrent.futures.Future()
        threading.Thread(target=self._connect_early, args=(self._early,), daemon=True).start()

    def _connect_early(self, future: concurrent.futures.Future[AgentConnection]) -> None:
        try:
            future.set_result(self._open_agent())
        except BaseException as exc:
            future.set_exception(exc)

    # -- kernel_info ------------------------------------------------------------
    @property
    def language_info(self) -> dict[str, Any]:  # type: ignore[override]
        return {
            "name": "python",
            "version": self._python_version,
            "mimetype": "text/x-python",
            "file_extension": ".py",
            "pygments_lexer": "ipython3",
            "codemirror_mode": {"name": "ipython", "version": 3},
            "nbconvert_exporter": "python",
        }

    @property
    def kernel_info(self) -> dict[str, Any]:
        info = super().kernel_info
        info["supported_features"] = []  # no debugger, no subshells
        return info

    async def kernel_info_request(self, stream: Any, ident: Any, parent: Any) -> None:
        task = self._start_connect()
        if task is not None:
            try:
                await asyncio.wait_for(asyncio.shield(task), CONNECT_WAIT_FOR_INFO)
            except (asyncio.TimeoutError, Exception):
                pass  # the first cell reports any problem
        await super().kernel_info_request(stream, ident, parent)

    # -- connecting to the sandbox ----------------------------------------------------
    def _kernel_id(self) -> str | None:
        connection_file = getattr(self.parent, "connection_file", "") or ""
        match = re.search(r"kernel-(.+)\.json$", os.path.basename(connection_file))
        return match.group(1) if match else None

    def _start_connect(self) -> asyncio.Task[None] | None:
        if self._agent is not None and self._agent.alive:
            return None
        if self._agent is not None:  # it died between cells
            self._agent.close()
            self._agent = None
            self._first_cell = True
            self._lost = "the interpreter had ended"
        if self._connecting is None or self._connecting.done():
            self._connecting = asyncio.ensure_future(self._connect())
        return self._connecting

    async def _connect(self) -> None:
        early, self._early = self._early, None
        if early is not None:
            agent = await asyncio.wrap_future(early)
        else:
            agent = await asyncio.to_thread(self._open_agent)
        agent.attach(asyncio.get_running_loop())
        self._agent = agent
        self._python_version = agent.ready.get("python_version", self._python_version)

    def _open_agent(self) -> AgentConnection:
        """Find or create the sandbox, start an agent in it (worker thread)."""
        if self.cfg is None or self.key is None:
            raise SandboxError(self._setup_error)
        if self.backend is None:
            self.backend = self.service.backend
        work = self.service.work_folder(os.getcwd())
        target = self.service.sandbox_id(self.key, work_folder=work)
        ensured = self.service.ensure(self.key, progress=lambda line: self._report(target, line), work_folder=work)
        info = ensured.info
        notice = ensured.notice
        if not notice and self._engine_id and info.engine_id != self._engine_id:
            notice = f"sandbox restarted: {LOST_NOTICE} ({info.id} had been recreated)"
        elif not notice and self._lost:
            why = f"{info.id} had been stopped" if ensured.event == "started" else self._lost
            notice = f"sandbox restarted: {LOST_NOTICE} ({why})"
        if notice:  # the next cell says it: the user lost variables and must know
            with self._notices_lock:
                self._notices.append(notice)
        for note in ensured.notes:  # a change without loss: log and status bar, not the notebook
            self._report(info.id, note)
        self._lost = ""
        self._sandbox_id, self._engine_id, self._work_folder = info.id, info.engine_id, info.work_folder
        if self._folder_copy is None and self._wants_folder_copy():
            here = Path(os.getcwd()).resolve()
            self._report(info.id, f"copying {here} into the sandbox (it has no host folders)")
            self._folder_copy = sync.push(self.backend, info.id, here)
            for name in self._folder_copy.skipped[:5]:
                self._report(info.id, f"not copied (too large, or not a regular file): {name}")
        env = {
            "SANDBOX_AGENT_OUTPUT_LIMIT": str(self.cfg.output_limit),
            "SANDBOX_AGENT_CELL_TIMEOUT": str(self.cfg.cell_timeout),
            # Host folders in the sandbox: its processes may not plant links or FIFOs there.
            "SANDBOX_AGENT_NO_SPECIAL_FILES": json.dumps([info.work_folder] if info.work_folder else []),
        }
        spare, payload = None, agent_source()
        if self.backend.keeps_spares:
            record = self._store.take_spare(self.backend.name, info.id, info.engine_id)
            if record is not None and record.secret:
                spare = (SPARE_SOCKET, record.pid, record.start_time)
                payload += record.secret.encode() + b"\n"  # on stdin, never in argv
        channel = self.backend.open_channel(info.id, bootstrap_command(spare=spare), cwd=self._cell_cwd(), env=env)
        agent = AgentConnection(channel, max_line=self._output_ceiling())
        try:
            agent.start(payload)
        except SandboxError as exc:
            agent.close()
            hint = _too_few_pids(info)
            if hint:
                raise SandboxError(f"{exc}; {hint}") from None
            raise
        except BaseException:
            agent.close()
            raise
        self._record_processes(info.id, agent.ready.get("procs"))
        if self._heart is None:
            self._heart = threading.Thread(target=self._heartbeat_loop, daemon=True)
            self._heart.start()
            threading.Thread(target=self._housekeeping, daemon=True).start()
        self._wake.set()
        return agent

    def _record_processes(self, sandbox_id: str, procs: Any) -> None:
        """Tell the reaper which sandbox processes carry this kernel: should this process
        be killed and they not end by themselves, it ends them (see lifecycle)."""
        if not isinstance(procs, list) or self.backend is None:
            return
        try:
            self._store.kernel_heartbeat(self._heartbeat_id, self.backend.name, sandbox_id, False)
            self._store.kernel_processes(self._heartbeat_id, socket.gethostname(), os.getpid(), json.dumps(procs))
        except Exception as exc:  # bookkeeping: never a failure for the user
            self.log.debug("could not record the kernel's processes: %s", exc)

    def _output_ceiling(self) -> int:
        """Bytes of output events one cell may send on the wire, whatever the agent says.

        The agent enforces the exact limit; this ceiling (the limit plus room for the
        protocol's own bytes) holds against a cell that writes to the agent's channel
        directly.
        """
        assert self.cfg is not None
        return self.cfg.output_limit + max(self.cfg.output_limit // 8, 64 << 10)

    def _heartbeat_loop(self) -> None:
        """Tell every process (the reaper above all) that this kernel lives, and if it is busy.

        Beats come every HEARTBEAT seconds, and at once when a cell starts (the cell only
        sets an event: the SQLite write stays off the cell's path).
        """
        while True:
            interval = HEARTBEAT
            if self._busy and self.backend is not None and self.backend.keep_alive_interval:
                interval = min(HEARTBEAT, self.backend.keep_alive_interval)
            self._wake.wait(interval)
            self._wake.clear()
            self._beat()

    def _beat(self) -> None:
        if self.cfg is None or self.backend is None or not self._sandbox_id:
            return
        try:
            self._store.kernel_heartbeat(self._heartbeat_id, self.backend.name, self._sandbox_id, self._busy)
            if self._busy:
                self.backend.keep_alive(self._sandbox_id)
        except Exception as exc:  # best effort: a cell never fails for bookkeeping
            self.log.debug("heartbeat failed: %s", exc)

    @property
    def service(self) -> SandboxService:
        """The orchestrator, one per kernel (its store sets SQLite up once, not every beat)."""
        if self._service is None:
            assert self.cfg is not None
            self._service = SandboxService(self.cfg)
        return self._service

    @property
    def _store(self) -> Store:
        return self.service.store

    @property
    def _heartbeat_id(self) -> str:
        return self._kernel_id() or f"pid{os.getpid()}"

    def _housekeeping(self) -> None:
        """Once per kernel start, a moment after it (listing every sandbox must not compete
        with the kernel's first reply and first cell): apply the lifecycle policies (hosts
        without a server need it), then leave a warm spare for the next kernel."""
        time.sleep(GC_DELAY)
        assert self.backend is not None and self.cfg is not None
        try:
            for action in gc(self.backend, self.cfg):
                log.info("lifecycle: %s %s (%s)", action.action, action.sandbox_id, action.reason)
        except Exception as exc:
            self.log.warning("lifecycle check failed: %s", exc)
        if self.backend.keeps_spares and self._sandbox_id:
            try:
                recorded = self._store.spare(self.backend.name, self._sandbox_id)
                if recorded is None or not self.backend.spare_alive(recorded):
                    spare = self.backend.start_spare(self._sandbox_id)
                    if spare is not None:
                        self._store.put_spare(self.backend.name, self._sandbox_id, spare)
            except Exception as exc:  # a spare only saves time: never an error for the user
                self.log.debug("no warm spare: %s", exc)

    def _wants_folder_copy(self) -> bool:
        """A sandbox without host folders (Daytona) gets a copy of the notebook's folder,
        unless that is nothing of the user's (the home itself, a system folder)."""
        assert self.cfg is not None and self.backend is not None
        if self.backend.workspace_on_host or self.cfg.work_root == "none":
            return False
        here = Path(os.getcwd()).resolve()
        return usable(here) and here != Path.home().resolve()

    def _cell_cwd(self) -> str:
        """Where cells start: the notebook's own folder when the sandbox has it (the work
        folder is mounted at its own path, or copied in), /workspace/<folder> when the
        notebook lies in the workspace, else /workspace."""
        assert self.cfg is not None and self.key is not None
        if self._folder_copy is not None:
            return self._folder_copy.remote
        here = Path(os.getcwd()).resolve()
        if self._work_folder and (here == Path(self._work_folder) or Path(self._work_folder) in here.parents):
            return str(here)
        try:
            rel = here.relative_to(workspace_dir(self.cfg, self.key).resolve())
        except (ValueError, OSError):
            return WORKSPACE
        return str(PurePosixPath(WORKSPACE, *rel.parts))

    async def _ensure_agent(self) -> AgentConnection:
        """The live agent; waits for the connection (its progress goes to _report)."""
        task = self._start_connect() or self._connecting
        if task is not None:
            await asyncio.wait([task])
            task.result()  # raises what went wrong
        assert self._agent is not None
        return self._agent

    def _report(self, sandbox_id: str, line: str) -> None:
        """Progress and notes of the kernel's own (making a sandbox, resizing it): they
        are not a cell's output, so a batch run stores exactly what ipykernel would. The
        server log has them, and the status bar shows them (through the state file)."""
        log.info("%s", line)
        if self.cfg is None or self.backend is None:
            return
        try:
            self._store.kernel_progress(self._heartbeat_id, self.backend.name, sandbox_id, line)
        except Exception as exc:  # the status bar is a nicety: never a failure
            self.log.debug("could not record progress: %s", exc)

    # -- execute ---------------------------------------------------------------------
    async def do_execute(  # type: ignore[override]
        self,
        code: str,
        silent: bool,
        store_history: bool = True,
        user_expressions: dict[str, str] | None = None,
        allow_stdin: bool = False,
        *,
        cell_meta: Any = None,
        cell_id: Any = None,
    ) -> dict[str, Any]:
        parent = self.get_parent("shell")
        try:
            agent = await self._ensure_agent()
        except Exception as exc:
            return self._fail("SandboxUnavailable", _one_line(exc), parent)
        with self._notices_lock:
            notices, self._notices = self._notices, []
        for notice in notices:
            self._send(parent, "stream", {"name": "stderr", "text": notice + "\n"})
        fields: dict[str, Any] = {
            "msg_id": (parent.get("header") or {}).get("msg_id", ""),
            "code": code,
            "silent": silent,
            "store_history": store_history,
            "user_expressions": user_expressions or {},
            "allow_stdin": allow_stdin,
        }
        if self._first_cell:
            fields["cwd"] = self._cell_cwd()
            self._first_cell = False
        self._busy = True
        self._wake.set()
        stdin_parent = (self._parent_ident.get("shell"), parent) if allow_stdin else None
        try:
            request = agent.request("execute", self._publisher(agent, parent, silent, stdin_parent), **fields)
            return await request.reply
        except (AgentGone, SandboxError):
            return self._fail("SandboxLost", await asyncio.to_thread(self._why_lost), parent)
        finally:
            self._busy = False
            self._wake.set()  # idle from now: the reaper's clock starts here

    def _publisher(self, agent: AgentConnection, parent: dict[str, Any], silent: bool, stdin_parent: Any) -> Callable[[dict[str, Any], int], None]:
        """What to do with the events of one request: publish them as replies to ``parent``.

        Everything here may come from a cell rather than the agent (see
        :mod:`.connection`): events are rebuilt from known fields, and their bytes are
        counted against the output ceiling, past which they are dropped with a notice.
        """
        budget = self._output_ceiling()
        state = {"used": 0, "cut": False}

        def on_event(msg: dict[str, Any], size: int) -> None:
            kind = msg.get("ev")
            if kind == "input_request":
                asyncio.ensure_future(self._answer_input(agent, msg, stdin_parent))
                return
            if silent:
                return
            state["used"] += size
            if kind == OVERFLOW or state["used"] > budget:
                if not state["cut"]:
                    state["cut"] = True
                    limit = self.cfg.output_limit if self.cfg else 0
                    text = f"\n[output truncated: this cell sent more than {limit / 1e6:.0f} MB of output; the rest was discarded]\n"
                    self._send(parent, "stream", {"name": "stderr", "text": text})
                return
            if kind == "comm":
                self._publish_comm(parent, msg)
                return
            content = _event_content(kind, msg)
            if content is not None:
                self._send(parent, *content)

        return on_event

    def _send(self, parent: dict[str, Any], msg_type: str, content: dict[str, Any], **kwargs: Any) -> None:
        """Publish on IOPub as a reply to ``parent`` (not to whatever ipykernel handles now:
        it hands over comm messages while a cell runs)."""
        self.session.send(self.iopub_socket, msg_type, content, parent=parent, ident=self._topic(msg_type), **kwargs)

    def _publish_comm(self, parent: dict[str, Any], msg: dict[str, Any]) -> None:
        """A comm message from the sandbox (a widget's state, a custom message), with its buffers."""
        msg_type, content, metadata = msg.get("msg_type"), msg.get("content"), msg.get("metadata")
        if msg_type not in ("comm_open", "comm_msg", "comm_close") or not isinstance(content, dict):
            return
        try:
            buffers = [base64.b64decode(b) for b in msg.get("buffers") or []]
        except (TypeError, ValueError, binascii.Error):
            return
        self._send(parent, msg_type, content, buffers=buffers, metadata=metadata if isinstance(metadata, dict) else {})

    # -- comms from the frontend: forwarded to the sandbox's comm manager ---------------------
    async def _forward_comm(self, stream: Any, ident: Any, parent: dict[str, Any]) -> None:
        """A widget's message from the frontend. It may come while a cell runs (ipykernel
        hands comms over at once): the agent takes it after the cell, and what its
        handlers publish replies to this message."""
        try:
            agent = await self._ensure_agent()
        except Exception:
            return
        buffers = [base64.b64encode(bytes(b)).decode("ascii") for b in parent.get("buffers") or []]
        agent.request(
            "comm", self._publisher(agent, parent, silent=False, stdin_parent=None),
            msg_type=parent["header"]["msg_type"], content=parent.get("content") or {},
            metadata=parent.get("metadata") or {}, buffers=buffers,
        )

    comm_open = comm_msg = comm_close = _forward_comm

    async def comm_info_request(self, stream: Any, ident: Any, parent: Any) -> None:
        reply = await self._ask("comm_info", target_name=(parent.get("content") or {}).get("target_name"))
        content = {"status": "ok", "comms": reply.get("comms", {}) if reply.get("status") == "ok" else {}}
        self.session.send(stream, "comm_info_reply", content, parent, ident)

    async def _answer_input(self, agent: AgentConnection, msg: dict[str, Any], stdin_parent: Any) -> None:
        if stdin_parent is None:
            agent.send(op="input_reply", value="\x04")
            return
        ident, parent = stdin_parent
        try:
            value = await asyncio.to_thread(
                self._input_request, msg.get("prompt", ""), ident, parent, msg.get("password", False)
            )
        except EOFError:
            value = "\x04"
        except Exception:
            value = "\x04"
        agent.send(op="input_reply", value=value)

    def _why_lost(self) -> str:
        """One line on what happened to the sandbox, for the cell that lost it."""
        status = None
        if self._agent is not None:
            self._agent.close()
            status = self._agent.channel.exit_status()
        self._agent = None
        self._first_cell = True
        sandbox = self._sandbox_id or "the sandbox"
        try:
            assert self.backend is not None
            # The interpreter dies a moment before its container does (a forced removal
            # kills processes first): give the engine a second before judging.
            time.sleep(1.0)
            info = self.backend.get(self._sandbox_id)
            deadline = time.monotonic() + 3
            while info.state != "running" and time.monotonic() < deadline:
                time.sleep(0.2)  # a forced removal kills first: let the engine settle
                info = self.backend.get(self._sandbox_id)
            if info.engine_id != self._engine_id:  # replaced, e.g. by another kernel of this user
                raise SandboxNotFound(sandbox)
            if info.state == "running":
                self._lost = "the interpreter had ended"
                if status in (137, -9):
                    memory = info.limits.get("memory") or 0
                    limit = f"the memory limit of {memory / 2**30:g} GiB" if memory else "a limit"
                    return (
                        f"the interpreter in {sandbox} was killed, most likely by {limit} "
                        f"(flavor {info.flavor or '?'}; SANDBOX_KERNEL_FLAVOR picks a larger one): {LOST_NOTICE}"
                    )
                hint = _too_few_pids(info)
                if hint:
                    return f"the interpreter in {sandbox} ended: {hint}"
                return f"the interpreter in {sandbox} ended: {LOST_NOTICE}; the next cell starts a new one"
            reason = f" ({info.exit_reason})" if info.exit_reason else ""
            self._lost = f"{sandbox} had stopped{reason}"
            return f"sandbox {sandbox} stopped{reason}: {LOST_NOTICE}; the next cell restarts it"
        except SandboxNotFound:
            self._lost = f"{sandbox} had been removed"
            return f"sandbox {sandbox} was removed: {LOST_NOTICE}; the next cell recreates it"
        except SandboxError as exc:
            self._lost = "the engine had lost it"
            return f"lost the sandbox {sandbox}: {_one_line(exc)}"

    def _fail(self, ename: str, evalue: str, parent: dict[str, Any]) -> dict[str, Any]:
        """One clear error in the cell (what went wrong, what to do), never a traceback."""
        self._send(parent, "error", {"ename": ename, "evalue": evalue, "traceback": [f"{ename}: {evalue}"]})
        return {"status": "error", "execution_count": self.execution_count, "ename": ename, "evalue": evalue, "traceback": []}

    # -- the other shell requests: forwarded as they are --------------------------------
    async def _ask(self, op: str, **fields: Any) -> dict[str, Any]:
        """A request whose events are not output (completion, inspection, history)."""
        try:
            agent = await self._ensure_agent()
            return await agent.request(op, lambda _msg, _size: None, **fields).reply
        except Exception as exc:
            return {"status": "error", "ename": type(exc).__name__, "evalue": _one_line(exc), "traceback": []}

    async def do_complete(self, code: str, cursor_pos: int) -> dict[str, Any]:  # type: ignore[override]
        reply = await self._ask("complete", code=code, cursor_pos=cursor_pos)
        if reply.get("status") != "ok":
            return {"status": "ok", "matches": [], "cursor_start": cursor_pos, "cursor_end": cursor_pos, "metadata": {}}
        return reply

    async def do_inspect(self, code: str, cursor_pos: int, detail_level: int = 0, omit_sections: Any = ()) -> dict[str, Any]:  # type: ignore[override]
        reply = await self._ask("inspect", code=code, cursor_pos=cursor_pos, detail_level=detail_level)
        if reply.get("status") != "ok":
            return {"status": "ok", "found": False, "data": {}, "metadata": {}}
        return reply

    async def do_is_complete(self, code: str) -> dict[str, Any]:  # type: ignore[override]
        reply = await self._ask("is_complete", code=code)
        return reply if reply.get("status") in ("complete", "incomplete", "invalid") else {"status": "unknown"}

    async def do_history(  # type: ignore[override]
        self,
        hist_access_type: str,
        output: bool,
        raw: bool,
        session: int | None = None,
        start: int | None = None,
        stop: int | None = None,
        n: int | None = None,
        pattern: str | None = None,
        unique: bool = False,
    ) -> dict[str, Any]:
        reply = await self._ask(
            "history", hist_access_type=hist_access_type, output=output, raw=raw, session=session,
            start=start, stop=stop, n=n, pattern=pattern, unique=unique,
        )
        return reply if reply.get("status") == "ok" else {"status": "ok", "history": []}

    async def do_shutdown(self, restart: bool) -> dict[str, Any]:  # type: ignore[override]
        """End the interpreter; the sandbox stays for the next kernel."""
        agent, self._agent = self._agent, None
        if self.cfg is not None:
            try:
                self._store.kernel_gone(self._heartbeat_id)
            except Exception as exc:
                self.log.debug("could not record shutdown: %s", exc)
        if agent is not None and agent.alive:
            try:
                agent.send(op="shutdown")
            except SandboxError:
                pass
            agent.close()
        if self._folder_copy is not None and self.backend is not None and self._sandbox_id:
            try:  # what the cells wrote beside the notebook goes back beside it
                copied = await asyncio.to_thread(sync.pull, self.backend, self._sandbox_id, self._folder_copy)
                log.info("copied back from the sandbox: %s", ", ".join(copied) or "nothing changed")
            except Exception as exc:
                self.log.warning("could not copy the notebook's folder back: %s", exc)
        return {"status": "ok", "restart": restart}

    # -- interrupt (control channel) ---------------------------------------------------------
    async def interrupt_request(self, stream: Any, ident: Any, parent: Any) -> None:
        content: dict[str, Any] = {"status": "ok"}
        agent = self._agent
        if agent is not None and agent.alive:
            try:
                agent.send(op="interrupt")
            except SandboxError as exc:
                content = {"status": "error", "ename": "SandboxError", "evalue": str(exc), "traceback": []}
        self.session.send(stream, "interrupt_reply", content, parent, ident=ident)


def notebook_choices() -> dict[str, Any]:
    """flavor / snapshot from the notebook's ``metadata.sandbox``, unless the environment
    (a kernelspec variant, an admin) already fixes them: the environment wins."""
    meta = notebook_metadata(os.environ.get("JPY_SESSION_NAME"))
    return {
        name: meta[name]
        for name in ("flavor", "snapshot")
        if isinstance(meta.get(name), str) and not os.environ.get(f"SANDBOX_KERNEL_{name.upper()}")
    }


_DICT_FIELDS = ("data", "metadata", "transient")


def _event_content(kind: Any, msg: dict[str, Any]) -> tuple[str, dict[str, Any]] | None:
    """(message type, content) of an agent event, built only from the fields Jupyter
    defines for it, or None for anything malformed."""
    if kind == "stream":
        name, text = msg.get("name"), msg.get("text")
        if name in ("stdout", "stderr") and isinstance(text, str):
            return "stream", {"name": name, "text": text}
        return None
    if kind in ("display", "result"):
        content = {field: msg.get(field) or {} for field in _DICT_FIELDS}
        if not all(isinstance(content[field], dict) for field in _DICT_FIELDS):
            return None
        if kind == "result":
            del content["transient"]
            count = msg.get("execution_count")
            content["execution_count"] = count if isinstance(count, int) else None
            return "execute_result", content
        return ("update_display_data" if msg.get("update") else "display_data"), content
    if kind == "clear":
        return "clear_output", {"wait": bool(msg.get("wait"))}
    if kind == "error":
        traceback = msg.get("traceback")
        if not isinstance(traceback, list):
            traceback = []
        return "error", {"ename": str(msg.get("ename", "")), "evalue": str(msg.get("evalue", "")), "traceback": [str(line) for line in traceback]}
    return None


def _too_few_pids(info: SandboxInfo) -> str:
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


def _one_line(exc: BaseException) -> str:
    text = str(exc).strip() or type(exc).__name__
    return text.splitlines()[0]


def main() -> None:
    """``python -m sandbox_kernel -f CONNECTION_FILE``."""
    from ipykernel.kernelapp import IPKernelApp

    if sys.argv[1:2] == ["install"]:
        sys.exit("use `sandbox-kernel install` to install the kernelspec")
    _log_to_stderr()
    # Cells run in the sandbox: what this host process prints, warns or logs is never a
    # cell's output. ipykernel would turn its stdout/stderr (and fds 1/2) into streams of
    # whichever cell runs; they stay the process's real ones instead, so they reach the
    # CI job's log or the server's log.
    IPKernelApp.launch_instance(kernel_class=SandboxKernel, outstream_class=None, capture_fd_output=False)


def _log_to_stderr() -> None:
    """The ``sandbox_kernel`` logger (progress, settings ignored, lifecycle actions) at
    INFO on stderr, which `jupyter execute`, papermill and nbmake pass through to the
    job's log and a Jupyter server to its own log."""
    handler = logging.StreamHandler(sys.stderr)
    handler.setFormatter(logging.Formatter("[SandboxKernel] %(message)s"))
    log.addHandler(handler)
    log.setLevel(logging.INFO)
    log.propagate = False
