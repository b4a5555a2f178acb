"""The Jupyter kernel: a thin relay between Jupyter and the agent inside the sandbox.

Each cell goes to the agent (:mod:`sandbox_kernel.agent`) over the backend's byte
channel, and what the agent sends back is published on IOPub as it arrives. The
kernel process itself holds no user state: restarting it starts a new interpreter in
the same sandbox, so files and installed packages stay. Finding the sandbox and
explaining its loss is :mod:`.session`'s; telling the rest of the installation that
this kernel lives (heartbeats, progress, reaping, spares) is :mod:`.housekeeping`'s.

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
import inspect
import logging
import os
import platform
import sys
import threading
from collections.abc import Callable
from typing import Any

from ipykernel import kernel_protocol_version
from ipykernel.kernelbase import Kernel

from . import __version__, early_start
from .backends import SandboxError
from .connection import OVERFLOW, AgentConnection, AgentGone
from .early_start import kernel_id_of
from .session import SandboxSession, one_line

log = logging.getLogger("sandbox_kernel")

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
        self._tasks: set[asyncio.Future[Any]] = set()  # the loop keeps only weak references
        self._next_count = 1  # what the interpreter in the sandbox numbers the next stored cell
        self._first_cell = True
        # The sandbox has been sought since this process began (see early_start), while
        # the kernel imported and started: its first reply waits for less.
        early = early_start.take(kernel_id_of(getattr(self.parent, "connection_file", "") or ""))
        self.sandbox: SandboxSession | None = early.session
        self._early = early  # its interpreter serves the first connection; later ones start anew
        self._early_taken = False
        self._aborted_before_reply = False

    @property
    def execution_count(self) -> int:
        """The number the next stored cell gets: the sandbox interpreter's, as ipykernel
        reports its shell's, so execute_input, Out[n] and the reply agree. KernelBase's
        own increments are ignored. No live interpreter: the next one counts from 1."""
        if self._agent is None or not self._agent.alive:
            return 1
        return self._next_count

    @execution_count.setter
    def execution_count(self, value: int) -> None:
        pass

    def _spawn(self, coro: Any) -> None:
        """Run a coroutine beside the current request, holding it until it ends."""
        task = asyncio.ensure_future(coro)
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

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
        # Not KernelBase's: it imports ipykernel's debugger (and debugpy, 50 ms of the
        # first reply's path) only to list a feature this kernel lacks.
        return {
            "protocol_version": kernel_protocol_version,
            "implementation": self.implementation,
            "implementation_version": self.implementation_version,
            "language_info": self.language_info,
            "banner": self.banner,
            "help_links": self.help_links,
            "supported_features": [],  # no debugger, no subshells
        }

    async def kernel_info_request(self, stream: Any, ident: Any, parent: Any) -> None:
        """Reply once the sandbox's interpreter says its Python version (or after
        CONNECT_WAIT_FOR_INFO seconds; the first cell reports any problem).

        Jupyter asks on the shell and on the control channel, and ipykernel answers
        control on a thread of its own with its own event loop. The connection belongs
        to the shell's loop, where cells run: asked on control, the kernel only waits
        for the start already under way, never starts one (a connection made on that
        loop would deliver every cell's output to it, and the cell would wait for ever).
        """
        waiting: asyncio.Future[Any] | None
        if threading.current_thread() is not getattr(self, "control_thread", None):
            task = self._start_connect()
            waiting = asyncio.shield(task) if task is not None else None
        elif not self._early.agent.done():
            waiting = asyncio.shield(asyncio.wrap_future(self._early.agent))
        else:
            waiting = None
        if waiting is not None:
            try:
                await asyncio.wait_for(waiting, CONNECT_WAIT_FOR_INFO)
            except (asyncio.TimeoutError, Exception):
                pass  # the first cell reports any problem
        first = self._early.agent
        if first.done() and not first.cancelled() and first.exception() is None:
            self._learn_version(first.result())
        await super().kernel_info_request(stream, ident, parent)

    # -- connecting to the sandbox ----------------------------------------------------
    def _start_connect(self) -> asyncio.Task[None] | None:
        if self._agent is not None and self._agent.alive:
            return None
        if self._agent is not None:  # it died between cells
            self._agent.close()
            self._agent = None
            self._first_cell = True
            if self.sandbox is not None:
                self.sandbox.lost = "the interpreter had ended"
        if self._connecting is None or self._connecting.done():
            self._connecting = asyncio.ensure_future(self._connect())
        return self._connecting

    async def _connect(self) -> None:
        if not self._early_taken:
            self._early_taken = True
            agent = await asyncio.wrap_future(self._early.agent)
        else:
            agent = await asyncio.to_thread(self._early.open_agent)
        agent.attach(asyncio.get_running_loop())
        self._agent = agent
        self._next_count = 1  # a new interpreter counts from the start
        self._learn_version(agent)

    def _learn_version(self, agent: AgentConnection) -> None:
        """What kernel_info reports: the sandbox interpreter's Python, once it said."""
        self._python_version = agent.ready.get("python_version", self._python_version)

    async def _ensure_agent(self) -> AgentConnection:
        """The live agent; waits for the connection (its progress goes to the log)."""
        task = self._start_connect() or self._connecting
        if task is not None:
            await asyncio.wait([task])
            task.result()  # raises what went wrong
        assert self._agent is not None
        return self._agent

    # -- execute ---------------------------------------------------------------------
    async def do_execute(
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
        count = self.execution_count  # what execute_input said; a lost cell's reply says it too
        try:
            agent = await self._ensure_agent()
        except Exception as exc:
            return self._fail("SandboxUnavailable", one_line(exc), parent, count)
        assert self.sandbox is not None  # an agent means a session
        for notice in self.sandbox.take_notices():
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
            fields["cwd"] = self.sandbox.cell_cwd()
            self._first_cell = False
        housekeeping = self.sandbox.housekeeping
        housekeeping.set_busy(True)
        stdin_parent = (self._parent_ident.get("shell"), parent) if allow_stdin else None
        try:
            request = agent.request(
                "execute", self._publisher(agent, parent, silent, stdin_parent), **fields
            )
            reply = await request.reply
        except (AgentGone, SandboxError):
            return self._fail("SandboxLost", await asyncio.to_thread(self._why_lost), parent, count)
        finally:
            housekeeping.set_busy(False)  # idle from now: the reaper's clock starts here
        stored = reply.get("execution_count")
        if isinstance(stored, int):  # the last stored cell's number, whether or not this one was
            self._next_count = stored + 1
        if reply.get("status") == "error" and not silent:
            line = await asyncio.to_thread(
                self.sandbox.disk_full, str(reply.get("ename", "")), str(reply.get("evalue", ""))
            )
            if line:  # a full disk: which bound, and what to do
                self._send(parent, "stream", {"name": "stderr", "text": line + "\n"})
        return reply

    def finish_metadata(self, parent: Any, metadata: Any, reply_content: Any) -> Any:
        """The reply's metadata (KernelBase's), called just before an execute_reply goes
        out: a failed cell aborts the cells queued behind it from here, before its reply.

        KernelBase aborts only after sending the reply, so a client that answers the
        reply at once (``print(x)`` right after an interrupted cell) can have its new cell
        taken for a queued one and aborted when the kernel is preempted between the two
        on a loaded machine. Aborting first, only cells sent before the client saw the
        error are aborted, as the message spec means."""
        content = parent.get("content") or {}
        if (
            reply_content.get("status") == "error"
            and not content.get("silent", False)
            and content.get("stop_on_error", True)
        ):
            super()._abort_queues(*_subshell_of(parent))
            self._aborted_before_reply = True
        return super().finish_metadata(parent, metadata, reply_content)

    def _abort_queues(self, *subshell_id: Any) -> None:
        """KernelBase's, unless :meth:`finish_metadata` did it for this reply already
        (ipykernel 6 calls it from its deprecated abort_request too: that call goes on)."""
        if self._aborted_before_reply:
            self._aborted_before_reply = False
            return
        super()._abort_queues(*subshell_id)

    def _publisher(
        self, agent: AgentConnection, parent: dict[str, Any], silent: bool, stdin_parent: Any
    ) -> Callable[[dict[str, Any], int], None]:
        """What to do with the events of one request: publish them as replies to ``parent``.

        Everything here may come from a cell rather than the agent (see
        :mod:`.connection`): events are rebuilt from known fields, and their bytes are
        counted against the output ceiling, past which they are dropped with a notice.
        """
        budget = self.sandbox.output_ceiling if self.sandbox else 0
        state = {"used": 0, "cut": False}

        def on_event(msg: dict[str, Any], size: int) -> None:
            kind = msg.get("ev")
            if kind == "input_request":
                self._spawn(self._answer_input(agent, msg, stdin_parent))
                return
            if silent:
                return
            state["used"] += size
            if kind == OVERFLOW or state["used"] > budget:
                if not state["cut"]:
                    state["cut"] = True
                    limit = self.sandbox.cfg.output_limit if self.sandbox else 0
                    text = f"\n[output truncated: this cell sent more than {limit / 1e6:.0f} MB of output; the rest was discarded]\n"
                    self._send(parent, "stream", {"name": "stderr", "text": text})
                return
            if kind == "comm":
                self._publish_comm(parent, msg)
                return
            packed = msg.get("packed")
            if isinstance(packed, bytes):  # checked by the reader: forwarded as it is
                self._send(parent, msg["msg_type"], packed)
                return
            content = _event_content(kind, msg)
            if content is not None:
                self._send(parent, *content)

        return on_event

    def _send(
        self,
        parent: dict[str, Any],
        msg_type: str,
        content: dict[str, Any] | bytes,
        **kwargs: Any,
    ) -> None:
        """Publish on IOPub as a reply to ``parent`` (not to whatever ipykernel handles now:
        it hands over comm messages while a cell runs). Content may come packed already
        (jupyter_client's Session forwards bytes as they are, as for a relayed message)."""
        assert self.session is not None  # set by the kernel app before any request
        self.session.send(
            self.iopub_socket,
            msg_type,
            content,  # type: ignore[arg-type]  # Session.serialize takes packed bytes too
            parent=parent,
            ident=self._topic(msg_type),
            **kwargs,
        )

    def _publish_comm(self, parent: dict[str, Any], msg: dict[str, Any]) -> None:
        """A comm message from the sandbox (a widget's state, a custom message), with its buffers."""
        msg_type, content, metadata = msg.get("msg_type"), msg.get("content"), msg.get("metadata")
        if msg_type not in ("comm_open", "comm_msg", "comm_close") or not isinstance(content, dict):
            return
        try:
            buffers = [base64.b64decode(b) for b in msg.get("buffers") or []]
        except (TypeError, ValueError, binascii.Error):
            return
        self._send(
            parent,
            msg_type,
            content,
            buffers=buffers,
            metadata=metadata if isinstance(metadata, dict) else {},
        )

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
            "comm",
            self._publisher(agent, parent, silent=False, stdin_parent=None),
            msg_type=parent["header"]["msg_type"],
            content=parent.get("content") or {},
            metadata=parent.get("metadata") or {},
            buffers=buffers,
        )

    comm_open = comm_msg = comm_close = _forward_comm

    async def comm_info_request(self, stream: Any, ident: Any, parent: Any) -> None:
        reply = await self._ask(
            "comm_info", target_name=(parent.get("content") or {}).get("target_name")
        )
        content = {
            "status": "ok",
            "comms": reply.get("comms", {}) if reply.get("status") == "ok" else {},
        }
        assert self.session is not None
        self.session.send(stream, "comm_info_reply", content, parent, ident)

    async def _answer_input(
        self, agent: AgentConnection, msg: dict[str, Any], stdin_parent: Any
    ) -> None:
        """Ask the frontend for the line a cell's input() waits for (EOF when it cannot)."""
        value = "\x04"
        if stdin_parent is not None:
            ident, parent = stdin_parent
            try:
                value = await asyncio.to_thread(
                    self._input_request,
                    msg.get("prompt", ""),
                    ident,
                    parent,
                    msg.get("password", False),
                )
            except Exception:  # EOFError, a frontend gone: the cell sees end of input
                value = "\x04"
        try:
            agent.send(op="input_reply", value=value)
        except SandboxError:
            pass  # the interpreter is gone: the cell's reply says so

    def _why_lost(self) -> str:
        """One line on what happened to the sandbox, for the cell that lost it (worker thread)."""
        status = None
        if self._agent is not None:
            self._agent.close()
            status = self._agent.channel.exit_status()
        self._agent = None
        self._first_cell = True
        assert self.sandbox is not None
        return self.sandbox.why_lost(status)

    def _fail(self, ename: str, evalue: str, parent: dict[str, Any], count: int) -> dict[str, Any]:
        """One clear error in the cell (what went wrong, what to do), never a traceback.

        The reply carries the same one line as the iopub ``error``, as ipykernel's does:
        nbclient (``jupyter execute``, papermill, nbmake) builds the message it prints from
        the reply, and an empty traceback there hid the fix."""
        error = {"ename": ename, "evalue": evalue, "traceback": [f"{ename}: {evalue}"]}
        self._send(parent, "error", error)
        return {"status": "error", "execution_count": count, **error}

    # -- the other shell requests: forwarded as they are --------------------------------
    async def _ask(self, op: str, **fields: Any) -> dict[str, Any]:
        """A request whose events are not output (completion, inspection, history)."""
        try:
            agent = await self._ensure_agent()
            return await agent.request(op, lambda _msg, _size: None, **fields).reply
        except Exception as exc:
            return {
                "status": "error",
                "ename": type(exc).__name__,
                "evalue": one_line(exc),
                "traceback": [],
            }

    async def do_complete(self, code: str, cursor_pos: int) -> dict[str, Any]:
        reply = await self._ask("complete", code=code, cursor_pos=cursor_pos)
        if reply.get("status") != "ok":
            return {
                "status": "ok",
                "matches": [],
                "cursor_start": cursor_pos,
                "cursor_end": cursor_pos,
                "metadata": {},
            }
        return reply

    async def do_inspect(
        self, code: str, cursor_pos: int, detail_level: int = 0, omit_sections: Any = ()
    ) -> dict[str, Any]:
        reply = await self._ask(
            "inspect", code=code, cursor_pos=cursor_pos, detail_level=detail_level
        )
        if reply.get("status") != "ok":
            return {"status": "ok", "found": False, "data": {}, "metadata": {}}
        return reply

    async def do_is_complete(self, code: str) -> dict[str, Any]:
        reply = await self._ask("is_complete", code=code)
        return (
            reply
            if reply.get("status") in ("complete", "incomplete", "invalid")
            else {"status": "unknown"}
        )

    async def do_history(
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
            "history",
            hist_access_type=hist_access_type,
            output=output,
            raw=raw,
            session=session,
            start=start,
            stop=stop,
            n=n,
            pattern=pattern,
            unique=unique,
        )
        return reply if reply.get("status") == "ok" else {"status": "ok", "history": []}

    async def do_shutdown(self, restart: bool) -> dict[str, Any]:
        """End the interpreter; the sandbox stays for the next kernel."""
        agent, self._agent = self._agent, None
        if self.sandbox is not None:
            self.sandbox.forget_kernel()
        if agent is not None and agent.alive:
            try:
                agent.send(op="shutdown")
            except SandboxError:
                pass
            agent.close()
        if self.sandbox is not None and self.sandbox.folder_copy is not None:
            try:
                copied = await asyncio.to_thread(self.sandbox.copy_back)
                log.info("copied back from the sandbox: %s", ", ".join(copied) or "nothing changed")
            except Exception as exc:
                log.warning("could not copy the notebook's folder back: %s", exc)
        return {"status": "ok", "restart": restart}

    # -- interrupt (control channel) ---------------------------------------------------------
    async def interrupt_request(self, stream: Any, ident: Any, parent: Any) -> None:
        content: dict[str, Any] = {"status": "ok"}
        agent = self._agent
        if agent is not None and agent.alive:
            try:
                agent.send(op="interrupt")
            except SandboxError as exc:
                content = {
                    "status": "error",
                    "ename": "SandboxError",
                    "evalue": str(exc),
                    "traceback": [],
                }
        assert self.session is not None
        self.session.send(stream, "interrupt_reply", content, parent, ident=ident)


_DICT_FIELDS = ("data", "metadata", "transient")


# ipykernel 7's KernelBase._abort_queues takes the request's subshell; 6's takes nothing.
_ABORT_TAKES_SUBSHELL = "subshell_id" in inspect.signature(Kernel._abort_queues).parameters


def _subshell_of(parent: dict[str, Any]) -> tuple[Any, ...]:
    """KernelBase._abort_queues's arguments for ``parent`` (None: the main shell)."""
    if not _ABORT_TAKES_SUBSHELL:
        return ()
    return ((parent.get("header") or {}).get("subshell_id"),)


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
        return "error", {
            "ename": str(msg.get("ename", "")),
            "evalue": str(msg.get("evalue", "")),
            "traceback": [str(line) for line in traceback],
        }
    return None


def main() -> None:
    """``python -m sandbox_kernel -f CONNECTION_FILE``."""
    # ipykernel's app imports debugpy, whose check of Python's frozen modules prints four
    # lines of "Debugger warning" into every job log; this kernel has no debugger.
    os.environ.setdefault("PYDEVD_DISABLE_FILE_VALIDATION", "1")
    from ipykernel.kernelapp import IPKernelApp

    if sys.argv[1:2] == ["install"]:
        sys.exit("use `sandbox-kernel install` to install the kernelspec")
    early_start.log_to_stderr()
    if not getattr(sys.flags, "safe_path", False) and os.getcwd() != "/":
        # Started without the kernelspec's provisioner (which starts it in "/") by a
        # Python that has no PYTHONSAFEPATH: `-m` put this folder on its import path.
        log.warning(
            "Python %s put the notebook's folder %s on this kernel's import path, and code "
            "in the sandbox can write there: start the kernel through the sandbox "
            "kernelspec's provisioner, or with Python 3.11 or newer",
            platform.python_version(),
            os.getcwd(),
        )
    # Cells run in the sandbox: what this host process prints, warns or logs is never a
    # cell's output. ipykernel would turn its stdout/stderr (and fds 1/2) into streams of
    # whichever cell runs; they stay the process's real ones instead, so they reach the
    # CI job's log or the server's log.
    IPKernelApp.launch_instance(
        kernel_class=SandboxKernel, outstream_class=None, capture_fd_output=False
    )
