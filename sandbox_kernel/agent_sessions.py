"""What an agent does in a user's sandbox (the MCP tools, :mod:`.mcp_server`).

An agent gets named, persistent Python interpreters (*sessions*) in the very sandbox a
notebook of the same user works in, so a file the agent writes is there for the next
cell and a package it installs is importable after a kernel restart. Each session is
what a kernel is, minus Jupyter: a :class:`~.session.SandboxSession` (find or make the
sandbox, start the in-sandbox agent, phrase a loss) and an
:class:`~.connection.AgentConnection` (the bounded, hostile-safe channel); code runs
with the kernel's own ``execute`` request, so outputs, the output limit and interrupts
behave as in a cell. Sessions beat in the state store like kernels (kind ``agent``,
labelled with their name): listings show them, the lifecycle counts them as use, and
the reaper ends their interpreters should this process die.

Shell commands and files go through the orchestrator as every other door does
(ownership, activity, the hardened file layer); a command runs under a small
in-sandbox runner (:mod:`.agent.command`) that keeps stdout and stderr apart and bounded
and kills everything the command started when its time is up.

Calls to one session run one at a time; different sessions run side by side; nothing
here blocks the event loop (engine calls go to threads).
"""

from __future__ import annotations

import asyncio
import base64
import binascii
import builtins
import json
import logging
import re
import time
import uuid
from dataclasses import asdict, dataclass, field
from pathlib import PurePosixPath
from typing import Any

from . import events
from .agent import program
from .backends.base import WORKSPACE, SandboxInfo
from .connection import OVERFLOW, AgentConnection, AgentGone
from .errors import BadRequest, Conflict, SandboxError, SandboxNotFound
from .files import RemoteWorkspace, Workspace
from .housekeeping import Housekeeping
from .identity import ScopeKey
from .service import SandboxService
from .session import SandboxSession, one_line
from .store import AGENT

log = logging.getLogger("sandbox_kernel")

DEFAULT_SESSION = "default"
SESSION_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.-]{0,63}")
MAX_SESSIONS = 16  # interpreters one owner may keep at once
INTERRUPT_GRACE = 5.0  # seconds code has to stop after KeyboardInterrupt before it is ended
COMMAND_GRACE = 30.0  # seconds past a command's own limit before the backend kills its runner
MAX_TIMEOUT = 3600.0
ANSI = re.compile(r"\x1b\[[0-9;?]*[ -/]*[@-~]|\x1b\][^\x07\x1b]*(?:\x07|\x1b\\)")
TEXT_TYPES = ("text/plain", "text/markdown", "text/html", "text/latex", "application/json")
IMAGE_TYPES = ("image/png", "image/jpeg", "image/gif", "image/webp")
PLACEHOLDER = re.compile(r"<[^\n]*(?: object| at 0x[0-9a-f]+|Figure size [^\n]*)>")


def strip_ansi(text: str) -> str:
    """Terminal colour codes out: tracebacks are read by a model, not a terminal."""
    return ANSI.sub("", text)


def check_timeout(value: Any) -> float:
    if (
        not isinstance(value, int | float)
        or isinstance(value, bool)
        or not 0 < value <= MAX_TIMEOUT
    ):
        raise BadRequest(f"timeout must be a number of seconds above 0 and at most {MAX_TIMEOUT:g}")
    return float(value)


def check_session_name(name: Any) -> str:
    if not isinstance(name, str) or not SESSION_NAME.fullmatch(name):
        raise BadRequest(
            "a session name is 1-64 letters, digits, '.', '_' or '-', starting with a letter "
            f"or digit (e.g. {DEFAULT_SESSION!r})"
        )
    return name


def workspace_cwd(cwd: str) -> str:
    """``cwd`` as a path relative to /workspace ("" for /workspace itself); refuses
    anything that leads out (``..``, absolute paths elsewhere)."""
    if not isinstance(cwd, str) or "\0" in cwd:
        raise BadRequest("cwd must be a folder path")
    path = PurePosixPath(cwd.strip() or ".")
    if path.is_absolute():
        try:
            path = path.relative_to(WORKSPACE)
        except ValueError:
            raise BadRequest(
                f"cwd {cwd!r} is outside the workspace: give a folder in {WORKSPACE} "
                "(relative to it, or an absolute path beneath it)"
            ) from None
    if ".." in path.parts:
        raise BadRequest(
            f"cwd {cwd!r} leads out of the workspace ('..'): give a folder in {WORKSPACE}"
        )
    rel = str(path)
    return "" if rel == "." else rel


# -- results ------------------------------------------------------------------------
@dataclass
class Outcome:
    """What one execute_code call produced, in the order an agent reads it."""

    session: str
    sandbox_id: str = ""
    stdout: str = ""
    stderr: str = ""
    outputs: list[dict[str, str]] = field(default_factory=list)  # {"kind", "mime", "data"}
    error: dict[str, Any] | None = None  # ename, evalue, traceback
    duration: float = 0.0
    notices: list[str] = field(default_factory=list)
    truncated: bool = False
    timed_out: bool = False
    ended: bool = False  # the interpreter is gone: the next call starts a new one

    def to_dict(self) -> dict[str, Any]:
        data = asdict(self)
        data["duration"] = round(self.duration, 3)
        return data


class Collector:
    """The events of one execute request, rebuilt from the fields Jupyter defines and held
    to the output ceiling (events may come from the code rather than the agent)."""

    def __init__(self, outcome: Outcome, ceiling: int, limit: int) -> None:
        self.outcome = outcome
        self.ceiling = ceiling
        self.limit = limit
        self.used = 0

    def on_event(self, msg: dict[str, Any], size: int) -> None:
        kind = msg.get("ev")
        self.used += size
        if kind == OVERFLOW or self.used > self.ceiling:
            self.outcome.truncated = True
            return
        out = self.outcome
        if kind == "stream":
            name, text = msg.get("name"), msg.get("text")
            if name in ("stdout", "stderr") and isinstance(text, str):
                setattr(out, name, getattr(out, name) + text)
        elif kind in ("display", "result"):
            data = msg.get("data")
            if not isinstance(data, dict):
                return
            if msg.get("update"):
                return  # an update of an earlier display: the agent saw the first one
            out.outputs.extend(bundle_items(data))
        elif kind == "clear":
            out.stdout = out.stderr = ""  # as the notebook shows it: cleared
            out.outputs.clear()
        elif kind == "error":
            traceback = msg.get("traceback")
            out.error = {
                "ename": str(msg.get("ename", "")),
                "evalue": str(msg.get("evalue", "")),
                "traceback": [
                    strip_ansi(str(line))
                    for line in (traceback if isinstance(traceback, list) else [])
                ],
            }


def bundle_items(data: dict[str, Any]) -> list[dict[str, str]]:
    """A mime bundle as what an agent can read: an image (base64) and/or one text form."""
    items: list[dict[str, str]] = []
    for mime in IMAGE_TYPES:
        value = data.get(mime)
        if isinstance(value, str):
            compact = "".join(value.split())
            try:
                base64.b64decode(compact, validate=True)
            except (binascii.Error, ValueError):
                continue
            items.append({"kind": "image", "mime": mime, "data": compact})
            break
    plain = data.get("text/plain")
    # "<Figure size 640x480 with 1 Axes>" beside its image, "<IPython.core.display.HTML
    # object>" beside its HTML: a placeholder says nothing when a richer form is there.
    placeholder = isinstance(plain, str) and bool(PLACEHOLDER.match(plain.strip()))
    for mime in TEXT_TYPES:
        value = data.get(mime)
        if mime == "application/json" and value is not None:
            value = json.dumps(value, indent=1)
        if not isinstance(value, str) or not value:
            continue
        if mime == "text/plain" and placeholder and (items or len(data) > 1):
            continue
        items.append({"kind": "text", "mime": mime, "data": strip_ansi(value)})
        break
    return items


@dataclass
class CommandResult:
    """One execute_command: the streams apart, the exit status, what was cut."""

    exit_code: int
    stdout: str
    stderr: str
    timed_out: bool = False
    truncated: bool = False
    duration: float = 0.0
    sandbox_id: str = ""
    cwd: str = WORKSPACE
    error: str = ""

    def to_dict(self) -> dict[str, Any]:
        data = asdict(self)
        data["duration"] = round(self.duration, 3)
        return data


# -- one interpreter ------------------------------------------------------------------
class AgentSandbox(SandboxSession):
    """A :class:`SandboxSession` for an agent: the service is shared, it never copies a
    folder in, code starts in /workspace (where the file tools look), and it may be
    pinned to one sandbox the owner names instead of their own."""

    def __init__(
        self,
        service: SandboxService,
        owner: str,
        kernel_id: str,
        label: str,
        home: str,
        sandbox_id: str = "",
    ) -> None:
        super().__init__(service.config, ScopeKey(owner), kernel_id)
        self._service = service
        self._housekeeping = Housekeeping(service, kernel_id, AGENT, label)
        self.owner = owner
        self.home = home
        self.pinned = sandbox_id

    def home_folder(self) -> str:
        return self.home

    def _wants_folder_copy(self) -> bool:
        return False

    def cell_cwd(self) -> str:
        return WORKSPACE

    def _ensure_sandbox(self) -> SandboxInfo:
        if not self.pinned:
            return super()._ensure_sandbox()
        info = self.service.owned(self.owner, self.pinned)
        notice = ""
        if info.state != "running":
            self.service.start(
                self.owner, info.id, progress=lambda line: self.housekeeping.report(info.id, line)
            )
            info = self.backend.get(info.id)
            if self.lost or self.engine_id:
                notice = f"sandbox {info.id} had stopped and was started again: variables were lost, files in /workspace were kept"
        elif self.engine_id and info.engine_id != self.engine_id:
            notice = f"sandbox {info.id} had been recreated: variables were lost, files in /workspace were kept"
        elif self.lost:
            notice = f"interpreter restarted ({self.lost}): variables were lost, files in /workspace were kept"
        if notice:
            self.notices.put(notice)
        return self._hold(info)


class AgentSession:
    """One named interpreter of one owner: calls run one at a time, in order."""

    def __init__(
        self, service: SandboxService, owner: str, name: str, home: str, sandbox_id: str = ""
    ) -> None:
        self.name = name
        self.owner = owner
        self.id = f"agent-{uuid.uuid4().hex[:12]}"
        self.sandbox = AgentSandbox(service, owner, self.id, name, home, sandbox_id)
        self.agent: AgentConnection | None = None
        self.lock = asyncio.Lock()
        self.busy = False
        self.closed = False
        self.created = time.time()
        self.last_used = self.created
        self.runs = 0
        self._first = True

    @property
    def target(self) -> str:
        """The sandbox id it is pinned to ("" for the owner's own)."""
        return self.sandbox.pinned

    def describe(self) -> dict[str, Any]:
        return {
            "name": self.name,
            "id": self.id,
            "sandbox_id": self.sandbox.sandbox_id or self.target,
            "busy": self.busy,
            "interpreter": bool(self.agent is not None and self.agent.alive),
            "created": self.created,
            "last_used": self.last_used,
            "executions": self.runs,
        }

    async def execute(self, code: str, timeout: float) -> Outcome:
        """Run ``code``; past ``timeout`` it is interrupted (and ended if it will not stop).

        The work runs in a task of its own: should the caller be cancelled (the client
        gave up), the code is interrupted and the task still finishes its bookkeeping,
        so the next call finds the session in order.
        """
        task = asyncio.ensure_future(self._execute(code, timeout))
        try:
            return await asyncio.shield(task)
        except asyncio.CancelledError:
            self._interrupt()
            raise

    def _interrupt(self) -> None:
        agent = self.agent
        if self.busy and agent is not None and agent.alive:
            try:
                agent.send(op="interrupt")
            except SandboxError:
                pass

    async def _execute(self, code: str, timeout: float) -> Outcome:
        async with self.lock:
            outcome = Outcome(session=self.name)
            started = time.monotonic()
            try:
                await self._run(code, timeout, outcome)
            finally:
                outcome.duration = time.monotonic() - started
                outcome.sandbox_id = self.sandbox.sandbox_id
                self.last_used = time.time()
                self.runs += 1
            return outcome

    async def _ensure_agent(self) -> AgentConnection:
        if self.closed:
            raise SandboxError(f"session {self.name!r} was stopped")
        if self.agent is not None and not self.agent.alive:  # it died between calls
            self.agent.close()
            self.agent = None
            self.sandbox.lost = "the interpreter had ended"
        if self.agent is None:
            agent = await asyncio.to_thread(self.sandbox.open)
            if self.closed:  # stopped while it started
                await asyncio.to_thread(self._end, agent)
                raise SandboxError(f"session {self.name!r} was stopped")
            agent.attach(asyncio.get_running_loop())
            self.agent = agent
            self._first = True
            service = self.sandbox.service
            await asyncio.to_thread(
                events.count, service.store, events.AGENT_SESSIONS, backend=service.backend.name
            )
        return self.agent

    async def _run(self, code: str, timeout: float, outcome: Outcome) -> None:
        try:
            agent = await self._ensure_agent()
        except Exception as exc:
            outcome.error = _error("SandboxUnavailable", one_line(exc))
            outcome.ended = True
            return
        outcome.notices.extend(self.sandbox.take_notices())
        cfg = self.sandbox.cfg
        collector = Collector(outcome, self.sandbox.output_ceiling, cfg.output_limit)
        fields: dict[str, Any] = {
            "msg_id": uuid.uuid4().hex,
            "code": code,
            "silent": False,
            "store_history": True,
            "user_expressions": {},
            "allow_stdin": False,
        }
        if self._first:
            fields["cwd"] = self.sandbox.cell_cwd()
            self._first = False
        housekeeping = self.sandbox.housekeeping
        self.busy = True
        housekeeping.set_busy(True)
        try:
            request = agent.request("execute", collector.on_event, **fields)
            # Its outcome is read below, or not at all once the interpreter was ended.
            request.reply.add_done_callback(lambda f: f.cancelled() or f.exception())
            try:
                await asyncio.wait_for(asyncio.shield(request.reply), timeout)
            except asyncio.TimeoutError:
                outcome.timed_out = True
                await self._stop_running(agent, request.reply, timeout, outcome)
        except (AgentGone, SandboxError):
            why = await asyncio.to_thread(self._why_lost)
            outcome.error = _error("SandboxLost", why)
            outcome.ended = True
        finally:
            self.busy = False
            housekeeping.set_busy(False)
        if outcome.error is not None and not outcome.ended:
            full = await asyncio.to_thread(
                self.sandbox.disk_full, outcome.error["ename"], outcome.error["evalue"]
            )
            if full:  # a full disk: which bound, and what to do
                outcome.notices.append(full)
        if outcome.truncated:
            outcome.notices.append(
                f"output truncated: this call sent more than {cfg.output_limit / 1e6:.0f} MB "
                "of output; the rest was discarded"
            )

    async def _stop_running(
        self,
        agent: AgentConnection,
        reply: asyncio.Future[dict[str, Any]],
        timeout: float,
        outcome: Outcome,
    ) -> None:
        """Past its time: KeyboardInterrupt, as a kernel's interrupt; code that will not
        stop within INTERRUPT_GRACE has its interpreter ended (nothing keeps running)."""
        try:
            agent.send(op="interrupt")
            await asyncio.wait_for(asyncio.shield(reply), INTERRUPT_GRACE)
        except asyncio.TimeoutError:
            self.agent = None
            await asyncio.to_thread(self._end, agent)
            outcome.ended = True
            outcome.error = _error(
                "Timeout",
                f"the code ran past its timeout of {timeout:g} s and did not stop when "
                f"interrupted, so the interpreter of session {self.name!r} was ended: its "
                "variables are lost, files in /workspace are kept; the next call starts a "
                "new interpreter",
                (outcome.error or {}).get("traceback", []),
            )
            return
        outcome.error = _error(
            "Timeout",
            f"the code ran past its timeout of {timeout:g} s and was interrupted "
            f"(KeyboardInterrupt); session {self.name!r} and its variables are kept",
            (outcome.error or {}).get("traceback", []),
        )

    def _why_lost(self) -> str:
        """One line on what happened (worker thread), as the kernel says it to a cell."""
        status = None
        if self.agent is not None:
            self.agent.close()
            status = self.agent.channel.exit_status()
        self.agent = None
        self._first = True
        return (
            self.sandbox.why_lost(status)
            .replace("the next cell", "the next call")
            .replace("next cell", "next call")
        )

    def _end(self, agent: AgentConnection) -> None:
        """End an interpreter for good (worker thread): ask it to leave and close its
        channel; its watcher in the sandbox then ends it, and everything its code
        started, even code that would not let it leave."""
        try:
            agent.send(op="shutdown")
        except SandboxError:
            pass
        agent.close()

    async def close(self) -> None:
        """End the interpreter and the session's records; a call in progress is ended."""
        self.closed = True
        agent, self.agent = self.agent, None
        self.sandbox.forget_kernel()
        if agent is not None:
            await asyncio.to_thread(self._end, agent)


def _error(ename: str, evalue: str, traceback: list[str] | None = None) -> dict[str, Any]:
    return {"ename": ename, "evalue": evalue, "traceback": list(traceback or [])}


# -- everything an agent does, for any owner ------------------------------------------------
class AgentSessions:
    """The sessions of every owner this process serves, and the other agent tools.

    ``home`` is the host folder the agent works from, as a notebook's folder picks a
    kernel's sandbox (the Jupyter server's root: the user's sandbox ``sk-<user>``).
    """

    def __init__(
        self, service: SandboxService, home: str, max_sessions: int = MAX_SESSIONS
    ) -> None:
        self.service = service
        self.home = home
        self.max_sessions = max_sessions
        self._sessions: dict[tuple[str, str], AgentSession] = {}
        # Sessions ended for being idle, and why: the next call by that name says so.
        self._ended: dict[tuple[str, str], str] = {}

    # -- sessions ------------------------------------------------------------------
    def session(self, owner: str, name: str, sandbox_id: str = "") -> AgentSession:
        """``owner``'s session ``name``, made on first use (pinned to ``sandbox_id``,
        whose ownership the caller checked). Called on the event loop only: nothing here
        blocks, and two calls cannot make one name twice."""
        check_session_name(name)
        found = self._sessions.get((owner, name))
        if found is not None:
            if sandbox_id and found.target != sandbox_id:
                where = found.target or "your own sandbox"
                raise Conflict(
                    f"session {name!r} runs in {where}: stop it first (stop_session) or "
                    "use another session name for another sandbox"
                )
            return found
        if sum(1 for o, _ in self._sessions if o == owner) >= self.max_sessions:
            raise Conflict(
                f"you have {self.max_sessions} sessions already: stop one (stop_session) first"
            )
        made = AgentSession(self.service, owner, name, self.home, sandbox_id)
        why = self._ended.pop((owner, name), "")
        if why:
            made.sandbox.notices.put(why)
        self._sessions[(owner, name)] = made
        return made

    async def execute(
        self, owner: str, code: str, name: str, timeout: float, sandbox_id: str = ""
    ) -> Outcome:
        if not isinstance(code, str):
            raise BadRequest("code must be a string of Python")
        seconds = check_timeout(timeout)
        check_session_name(name)
        if sandbox_id:  # 404/403 now, before anything starts
            await asyncio.to_thread(self.service.owned, owner, sandbox_id)
        return await self.session(owner, name, sandbox_id).execute(code, seconds)

    def list(self, owner: str) -> list[dict[str, Any]]:
        return [
            s.describe()
            for (o, _), s in sorted(self._sessions.items(), key=lambda kv: kv[0])
            if o == owner
        ]

    async def stop(self, owner: str, name: str) -> bool:
        """End ``owner``'s session ``name``; False when there was none."""
        check_session_name(name)
        session = self._sessions.pop((owner, name), None)
        if session is None:
            return False
        await session.close()
        return True

    # -- idle sessions ------------------------------------------------------------------
    @property
    def idle_limit(self) -> float:
        """Seconds a session may go unused before it is ended (0: never)."""
        return self.service.config.agent_idle_stop * 60.0

    async def end_idle(self, now: float | None = None) -> builtins.list[str]:
        """End the sessions unused for longer than :attr:`idle_limit`: a forgotten
        interpreter would otherwise hold its sandbox in use (no idle stop) for as long
        as this process lives. Returns the names ended."""
        limit = self.idle_limit
        if limit <= 0:
            return []
        now = time.time() if now is None else now
        idle = [
            key
            for key, s in self._sessions.items()
            if not s.busy and not s.lock.locked() and now - s.last_used > limit
        ]
        for key in idle:
            session = self._sessions.pop(key)
            minutes = self.service.config.agent_idle_stop
            self._ended[key] = (
                f"session {key[1]!r} was ended after {minutes:g} min unused (agent_idle_stop): "
                "its variables are gone, files in /workspace are kept"
            )
            while len(self._ended) > 4 * self.max_sessions:  # oldest first
                self._ended.pop(next(iter(self._ended)))
            await session.close()
        return [name for _, name in idle]

    async def end_idle_forever(self) -> None:
        """:meth:`end_idle` every little while, for as long as this process serves."""
        while True:
            limit = self.idle_limit
            await asyncio.sleep(min(60.0, max(0.5, limit / 4)) if limit > 0 else 60.0)
            try:
                for name in await self.end_idle():
                    log.info("agent session %s ended: unused for too long", name)
            except Exception as exc:  # never let the reaper end
                log.warning("ending idle agent sessions failed: %s", exc)

    async def close(self) -> None:
        """End every interpreter (the server or the MCP process is stopping)."""
        sessions, self._sessions = list(self._sessions.values()), {}
        await asyncio.gather(*(s.close() for s in sessions), return_exceptions=True)

    def close_now(self) -> None:
        """Like :meth:`close`, without an event loop (a process exiting)."""
        sessions, self._sessions = list(self._sessions.values()), {}
        for session in sessions:
            session.closed = True
            agent, session.agent = session.agent, None
            session.sandbox.forget_kernel()
            if agent is not None:
                session._end(agent)

    # -- the owner's sandbox -------------------------------------------------------
    def own_sandbox_id(self, owner: str) -> str:
        key = ScopeKey(owner)
        return self.service.sandbox_id(
            key, work_folder=self.service.work_folder(self.home, user=owner)
        )

    def running(self, owner: str, sandbox_id: str = "") -> SandboxInfo:
        """The sandbox a command runs in, running: the one named, or the owner's own
        (made or started as a kernel would)."""
        if sandbox_id:
            info = self.service.owned(owner, sandbox_id)
            if info.state != "running":
                self.service.start(owner, sandbox_id)
                info = self.service.backend.get(sandbox_id)
            return info
        work = self.service.work_folder(self.home, user=owner)
        return self.service.ensure(ScopeKey(owner), work_folder=work).info

    def workspace(self, owner: str, sandbox_id: str = "") -> Workspace | RemoteWorkspace:
        """The workspace of the sandbox named, or of the owner's own one (made when it does
        not exist yet; a stopped one stays stopped: files never wake it)."""
        if sandbox_id:
            return self.service.workspace(owner, sandbox_id)
        own = self.own_sandbox_id(owner)
        try:
            return self.service.workspace(owner, own)
        except SandboxNotFound:
            self.running(owner)
            return self.service.workspace(owner, own)

    # -- shell commands ----------------------------------------------------------------
    def run_command(
        self, owner: str, command: str, timeout: float, cwd: str = "", sandbox_id: str = ""
    ) -> CommandResult:
        """``sh -c command`` in the sandbox (worker thread): stdout and stderr apart, both
        within the output limit, killed with everything it started after ``timeout``."""
        if not isinstance(command, str) or not command.strip():
            raise BadRequest("give a shell command to run, e.g. 'ls -la'")
        seconds = check_timeout(timeout)
        rel = workspace_cwd(cwd)
        info = self.running(owner, sandbox_id)
        limit = self.service.config.output_limit
        runner = program(
            "command",
            str(limit),
            repr(seconds),
            rel,
            "--",
            *self.service.as_user(info, ["/bin/sh", "-c", command]),
        )
        started = time.monotonic()
        raw = self.service.exec(info, runner, timeout=seconds + COMMAND_GRACE, cwd=WORKSPACE)
        duration = time.monotonic() - started
        where = str(PurePosixPath(WORKSPACE, rel)) if rel else WORKSPACE
        parsed = _runner_answer(raw.output, limit)
        if parsed is None:
            text = raw.output[-2000:].decode("utf-8", "replace")
            return CommandResult(
                exit_code=raw.exit_code,
                stdout="",
                stderr=text,
                duration=duration,
                sandbox_id=info.id,
                cwd=where,
                error="the command's runner gave no readable answer (is python3 in the image?)",
                timed_out=raw.exit_code == 124,
            )
        stdout, stderr, dropped, result = parsed
        if result.get("error"):
            return CommandResult(
                exit_code=int(result.get("exit_code") or 1),
                stdout="",
                stderr="",
                duration=duration,
                sandbox_id=info.id,
                cwd=where,
                error=str(result["error"])[:500],
            )
        return CommandResult(
            exit_code=int(result.get("exit_code") or 0),
            stdout=stdout,
            stderr=stderr,
            timed_out=bool(result.get("timed_out")),
            truncated=dropped > 0,
            duration=duration,
            sandbox_id=info.id,
            cwd=where,
        )


def _runner_answer(output: bytes, limit: int) -> tuple[str, str, int, dict[str, Any]] | None:
    """The runner's JSON line (its last line), checked field by field; None if unusable.

    Whatever the command printed is untrusted here: a process of the command can write
    to the runner's own stdout, so sizes are checked before anything is decoded.
    """
    line = output.rstrip(b"\n").rpartition(b"\n")[2]
    if len(line) > 2 * limit + (1 << 20):
        return None
    try:
        result = json.loads(line)
    except (ValueError, RecursionError):
        return None
    if not isinstance(result, dict):
        return None
    texts = []
    for name in ("stdout", "stderr"):
        value = result.get(name, "")
        try:
            raw = base64.b64decode(value, validate=True) if isinstance(value, str) else b""
        except (binascii.Error, ValueError):
            return None
        texts.append(raw[:limit].decode("utf-8", "replace"))
    dropped = 0
    for name in ("stdout_dropped", "stderr_dropped"):
        value = result.get(name, 0)
        dropped += value if isinstance(value, int) and value > 0 else 0
    code = result.get("exit_code")
    if code is not None and not isinstance(code, int):
        return None
    return texts[0], texts[1], dropped, result
