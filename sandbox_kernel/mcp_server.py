"""The MCP tools for agents, over stdio (``sandbox-kernel mcp``) or HTTP (the server
extension, :mod:`jupyter_ext.mcp`), built with the official ``mcp`` SDK.

Both transports serve the same :func:`build_server`; they differ only in who the
caller is: the stdio server acts for the user who started it, the HTTP one for each
request's Jupyter user (``owner_of`` reads it from the request). The work itself is
:mod:`.agent_sessions`'; here are the tools' names, their JSON-schema'd arguments,
the shape of their results as MCP content, and errors as MCP error results with a
message that says what was wrong and what to do (never a traceback).
"""

from __future__ import annotations

import asyncio
import base64
import binascii
import contextlib
import logging
import os
import signal
from collections.abc import Awaitable, Callable
from typing import Annotated, Any, Literal

from mcp.server.mcpserver import Context, MCPServer
from mcp.types import CallToolResult, ContentBlock, ImageContent, TextContent, ToolAnnotations
from pydantic import Field

from . import __version__
from .agent_sessions import DEFAULT_SESSION, AgentSessions, CommandResult, Outcome
from .errors import (
    BadRequest,
    SandboxError,
    TooLarge,
    error_label,
    shorten,
)
from .mcp_overview import cleanup_orphans, owns_state_folder, resource_stats, volume_mappings
from .mcp_results import (
    Cut,
    cut_command,
    cut_outcome,
    fit,
    fitting_prefix,
    keep_whole_output,
    result_size,
    whole_code_output,
    whole_command_output,
)
from .preview import proxy_path
from .service import SandboxService

log = logging.getLogger("sandbox_kernel")

OwnerOf = Callable[[Context], str]
# Whether the caller administers this installation (see cleanup_orphan_sandboxes).
AdminOf = Callable[[Context], bool]
# The URL of the Jupyter server that serves previews, ending in "/" ("" when none runs).
ServerUrlOf = Callable[[Context], str]
READ_DEFAULT = 1 << 20  # bytes read_file returns unless asked for more
READ_MAX = 8 << 20
WRITE_MAX = 8 << 20  # bytes write_file accepts (the HTTP body limit is above this)
MESSAGE_LIMIT = 2000
READ_OVERHEAD = 1000  # bytes of a read_file result besides the file's own

INSTRUCTIONS = """\
Tools for the user's persistent sandbox: the same machine their Jupyter notebooks run on.
Files live in /workspace (relative paths in the file tools are relative to it); what you
write there, and packages you pip install, are the notebook's too. execute_code runs
Python in a named, persistent interpreter (variables survive between calls of one
session); execute_command runs a shell command. Both have a timeout: code past it is
interrupted (its session survives), a command is killed with everything it started.
Output is limited like a notebook cell's; a result too long for one message keeps its
head and tail and names the file in /workspace that holds the whole output."""

SandboxArg = Annotated[
    str,
    Field(
        description="Id of another sandbox of yours (see list_sandboxes); empty: your own sandbox, the one your notebooks use."
    ),
]
TimeoutArg = Annotated[
    float,
    Field(
        gt=0,
        le=3600,
        description="Seconds before the run is stopped (code: interrupted with KeyboardInterrupt; command: killed).",
    ),
]


def error_result(message: str) -> CallToolResult:
    return CallToolResult(
        content=[TextContent(type="text", text=shorten(message, MESSAGE_LIMIT))], is_error=True
    )


def describe_error(exc: SandboxError) -> str:
    return f"{error_label(exc)}: {exc}"


async def guarded(work: Callable[[], Awaitable[CallToolResult]], limit: int = 0) -> CallToolResult:
    """Run a tool; domain errors become MCP error results, anything else one line (the
    details go to the log, on stderr: never to the protocol, never to the caller). A
    result over ``limit`` bytes (which no tool should make) is refused in one line
    rather than sent: the client would drop it, and the whole call with it."""
    try:
        result = await work()
        size = result_size(result) if limit else 0
        if size > limit:
            log.warning("an MCP result of %d bytes was held back (mcp_result_limit)", size)
            return error_result(
                f"the result was {size} bytes, more than one result may be (mcp_result_limit "
                f"{limit}); ask for less at a time"
            )
        return result
    except SandboxError as exc:
        return error_result(describe_error(exc))
    except asyncio.CancelledError:
        raise
    except Exception:
        log.exception("MCP tool failed")
        return error_result("internal error in the sandbox tools; the server's log has the details")


def text(value: str) -> TextContent:
    return TextContent(type="text", text=value)


def code_result(outcome: Outcome, cut: Cut | None = None) -> CallToolResult:
    """An execute_code outcome as MCP content: stdout, stderr, rich results (text or
    image), the error, what was cut to fit (``cut``), then one line on the session and
    duration."""
    content: list[ContentBlock] = []
    for notice in outcome.notices[:-1] if outcome.truncated else outcome.notices:
        content.append(text(f"[{notice}]"))
    if outcome.stdout:
        content.append(text(outcome.stdout))
    if outcome.stderr:
        content.append(text("[stderr]\n" + outcome.stderr))
    for item in outcome.outputs:
        if item["kind"] == "image":
            content.append(ImageContent(type="image", data=item["data"], mime_type=item["mime"]))
        else:
            content.append(text(item["data"]))
    if outcome.error:
        err = outcome.error
        lines = [f"{err['ename']}: {err['evalue']}".rstrip(": ")]
        traceback = [line for line in err.get("traceback", []) if line.strip()]
        if traceback:
            lines.append("\n".join(traceback))
        content.append(text("\n".join(lines)))
    if outcome.truncated:
        content.append(text(f"[{outcome.notices[-1]}]"))
    if cut is not None:
        content.append(text(f"[{cut.notice()}]"))
    where = f" in {outcome.sandbox_id}" if outcome.sandbox_id else ""
    content.append(text(f"[session {outcome.session!r}{where}, {outcome.duration:.2f} s]"))
    structured = outcome.to_dict()
    if cut is not None:
        structured["cut"] = cut.to_dict()
    structured["outputs"] = [
        item if item["kind"] == "text" else {"kind": "image", "mime": item["mime"]}
        for item in outcome.outputs
    ]
    return CallToolResult(
        content=content, structured_content=structured, is_error=outcome.error is not None
    )


def command_result(result: CommandResult, cut: Cut | None = None) -> CallToolResult:
    """An execute_command result as MCP content: stdout, stderr (apart), then one line
    on its exit, duration, folder and what was cut (``cut``)."""
    content: list[ContentBlock] = []
    if result.stdout:
        content.append(text(result.stdout))
    if result.stderr:
        content.append(text("[stderr]\n" + result.stderr))
    notes = [f"exit code {result.exit_code}", f"{result.duration:.2f} s", f"in {result.cwd}"]
    if result.timed_out:
        notes.insert(0, "timed out: the command and every process it started were killed")
    if result.truncated:
        notes.append("output truncated: only the first part was kept (the output limit)")
    if result.error:
        notes.insert(0, result.error)
    if cut is not None:
        notes.append(cut.notice())
    content.append(text("[" + "; ".join(notes) + "]"))
    structured = result.to_dict()
    if cut is not None:
        structured["cut"] = cut.to_dict()
    return CallToolResult(
        content=content,
        structured_content=structured,
        is_error=result.timed_out or bool(result.error),
    )


def decode_text(data: bytes, at_end: bool) -> str | None:
    """UTF-8 text of a slice of a file, or None when it is not text. A character cut by
    the slice's end is left for the next read."""
    if b"\0" in data:
        return None
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError as exc:
        if not at_end and exc.start >= len(data) - 3 and exc.reason == "unexpected end of data":
            return data[: exc.start].decode("utf-8", "strict")
        return None


def running_server_url(_ctx: Context | None = None) -> str:
    """The URL of a Jupyter server running on this host for this user (its base URL
    included), for preview URLs offered over stdio; "" when none runs."""
    try:
        from jupyter_server.serverapp import list_running_servers

        for info in list_running_servers():
            url = str(info.get("url") or "")
            if url:
                return url if url.endswith("/") else url + "/"
    except Exception as exc:  # no server, unreadable runtime files: say there is none
        log.debug("no running Jupyter server found: %s", exc)
    return ""


def build_server(
    sessions: AgentSessions,
    owner_of: OwnerOf,
    server_url_of: ServerUrlOf = running_server_url,
    admin_of: AdminOf = lambda _ctx: False,
) -> MCPServer:
    """The MCP server with every tool, acting for ``owner_of(ctx)`` on each call;
    ``server_url_of`` says where previews are served, ``admin_of`` whether the caller
    administers this installation."""
    server: MCPServer = MCPServer(
        "sandbox-kernel",
        instructions=INSTRUCTIONS,
        version=__version__,
        log_level="WARNING",
        warn_on_duplicate_tools=False,
    )
    service: SandboxService = sessions.service
    result_limit = service.config.mcp_result_limit

    async def whole_output(
        tool: str, owner: str, sandbox_id: str, text: str, images: list[tuple[str, bytes]]
    ) -> Cut:
        """The whole output of a run too long for one result, written to the workspace."""
        cut = Cut(result_limit)

        def keep() -> str:
            return keep_whole_output(sessions.workspace(owner, sandbox_id), tool, text, images)

        try:
            cut.saved = await asyncio.to_thread(keep)
        except SandboxError as exc:
            cut.unsaved = str(exc)
        return cut

    async def bounded_code(outcome: Outcome, owner: str, sandbox_id: str) -> CallToolResult:
        result = code_result(outcome)
        if result_size(result) <= result_limit:
            return result
        whole, images = whole_code_output(outcome)
        cut = await whole_output("execute_code", owner, sandbox_id, whole, images)
        fitted = fit(
            lambda share: (code_result(cut_outcome(outcome, share, cut), cut), cut), result_limit
        )
        return fitted or error_result(f"the output does not fit in one result; {cut.notice()}")

    async def bounded_command(result: CommandResult, owner: str, sandbox_id: str) -> CallToolResult:
        answer = command_result(result)
        if result_size(answer) <= result_limit:
            return answer
        cut = await whole_output(
            "execute_command", owner, sandbox_id, whole_command_output(result), []
        )
        fitted = fit(
            lambda share: (command_result(cut_command(result, share, cut), cut), cut), result_limit
        )
        return fitted or error_result(f"the output does not fit in one result; {cut.notice()}")

    def tool(
        description: str, read_only: bool = False, destructive: bool = False
    ) -> Callable[[Callable[..., Any]], Callable[..., Any]]:
        return server.tool(
            description=description,
            structured_output=False,
            annotations=ToolAnnotations(
                read_only_hint=read_only, destructive_hint=destructive, open_world_hint=False
            ),
        )

    @tool(
        "Run Python in a persistent interpreter in your sandbox (IPython when the image has it). "
        "Variables, imports and the working folder (/workspace at first) persist between calls of "
        "one session; sessions are separate interpreters. Returns stdout, stderr, rich results "
        "(plots as images, tables and reprs as text), the error if one was raised, and the duration."
    )
    async def execute_code(
        ctx: Context,
        code: Annotated[str, Field(description="Python source, run as one notebook cell.")],
        session: Annotated[
            str,
            Field(description="Name of the interpreter to use; made on first use."),
        ] = DEFAULT_SESSION,
        timeout: TimeoutArg = 60.0,
        sandbox_id: SandboxArg = "",
    ) -> CallToolResult:
        owner = owner_of(ctx)

        async def work() -> CallToolResult:
            outcome = await sessions.execute(owner, code, session, timeout, sandbox_id)
            return await bounded_code(outcome, owner, sandbox_id)

        return await guarded(work, result_limit)

    @tool(
        "Run a shell command (sh -c) in your sandbox. Returns stdout and stderr separately, the "
        "exit code and the duration. Past the timeout the command and every process it started "
        "are killed. Processes left in the background keep running (redirect their output)."
    )
    async def execute_command(
        ctx: Context,
        command: Annotated[str, Field(description="Shell command line, e.g. 'pip install rich'.")],
        timeout: TimeoutArg = 60.0,
        cwd: Annotated[
            str,
            Field(
                description="Folder to run in: relative to /workspace, or an absolute path beneath it."
            ),
        ] = "",
        sandbox_id: SandboxArg = "",
    ) -> CallToolResult:
        owner = owner_of(ctx)

        async def work() -> CallToolResult:
            result = await asyncio.to_thread(
                sessions.run_command, owner, command, timeout, cwd, sandbox_id
            )
            return await bounded_command(result, owner, sandbox_id)

        return await guarded(work, result_limit)

    @tool("List your execute_code sessions (interpreters) and whether each is busy.", True)
    async def get_sessions(ctx: Context) -> CallToolResult:
        found = sessions.list(owner_of(ctx))
        lines = [
            f"{s['name']}: {'busy' if s['busy'] else 'idle'}, "
            f"{'running' if s['interpreter'] else 'not started'} in {s['sandbox_id'] or '(your sandbox)'}, "
            f"{s['executions']} executions"
            for s in found
        ]
        return CallToolResult(
            content=[text("\n".join(lines) or "no sessions; execute_code starts one")],
            structured_content={"sessions": found},
        )

    @tool(
        "End an execute_code session: its interpreter and variables go (files stay).",
        destructive=True,
    )
    async def stop_session(
        ctx: Context,
        session: Annotated[str, Field(description="Name of the session to end.")],
    ) -> CallToolResult:
        owner = owner_of(ctx)

        async def work() -> CallToolResult:
            if await sessions.stop(owner, session):
                return CallToolResult(content=[text(f"session {session!r} stopped")])
            names = ", ".join(s["name"] for s in sessions.list(owner)) or "none"
            return error_result(f"no session named {session!r} (yours: {names})")

        return await guarded(work, result_limit)

    @tool("List a folder of the workspace (/workspace) without following links.", True)
    async def list_files(
        ctx: Context,
        path: Annotated[
            str, Field(description="Folder relative to /workspace; empty for /workspace.")
        ] = "",
        sandbox_id: SandboxArg = "",
    ) -> CallToolResult:
        owner = owner_of(ctx)

        async def work() -> CallToolResult:
            def listing() -> tuple[list[Any], bool]:
                return sessions.workspace(owner, sandbox_id).list(path)

            entries, truncated = await asyncio.to_thread(listing)

            def listed(count: int) -> CallToolResult:
                shown = entries[:count]
                lines = [
                    f"{e.name}{'/' if e.type == 'directory' else ''}\t{e.type}\t{e.size}"
                    for e in shown
                ]
                if truncated or count < len(entries):
                    lines.append(
                        f"[only the first {len(shown)} entries are listed: list a subfolder, "
                        "or use execute_command (ls, find) for the rest]"
                    )
                return CallToolResult(
                    content=[text("\n".join(lines) or "(empty folder)")],
                    structured_content={
                        "path": path,
                        "entries": [e.to_dict() for e in shown],
                        "truncated": truncated or count < len(entries),
                    },
                )

            count = len(entries)
            result = listed(count)
            while count and result_size(result) > result_limit:  # as many as one result holds
                count = min(count - 1, count * result_limit // result_size(result) * 9 // 10)
                result = listed(count)
            return result

        return await guarded(work, result_limit)

    @tool(
        "Read a file of the workspace: UTF-8 text, or base64 with encoding='base64' for binary "
        "files. Large files are read in parts with offset and limit.",
        True,
    )
    async def read_file(
        ctx: Context,
        path: Annotated[str, Field(description="File path relative to /workspace.")],
        offset: Annotated[int, Field(ge=0, description="Byte to start at.")] = 0,
        limit: Annotated[
            int,
            Field(
                gt=0,
                le=READ_MAX,
                description="Most bytes to return (a result holds at most mcp_result_limit, 100 KB by default: read on with offset).",
            ),
        ] = READ_DEFAULT,
        encoding: Annotated[
            Literal["text", "base64"],
            Field(description="text (UTF-8) or base64 (any bytes)."),
        ] = "text",
        sandbox_id: SandboxArg = "",
    ) -> CallToolResult:
        owner = owner_of(ctx)

        async def work() -> CallToolResult:
            def read() -> tuple[int, bytes]:
                reader = sessions.workspace(owner, sandbox_id).open_file(path)
                try:
                    size = reader.seek(0, os.SEEK_END)
                    reader.seek(min(offset, size))
                    return size, reader.read(limit)
                finally:
                    reader.close()

            size, data = await asyncio.to_thread(read)
            # One result holds mcp_result_limit bytes: a larger read comes in parts.
            room = result_limit - READ_OVERHEAD
            data = data[: room * 3 // 4 if encoding == "base64" else room]
            end = min(offset, size) + len(data)
            if encoding == "base64":
                body = base64.b64encode(data).decode("ascii")
            else:
                decoded = decode_text(data, at_end=end >= size)
                if decoded is None:
                    return error_result(
                        f"{path} is not UTF-8 text (a binary file?): read it with encoding='base64'"
                    )
                body = fitting_prefix(decoded, room)  # escapes count: quotes, controls
                end = min(offset, size) + len(body.encode("utf-8", "surrogatepass"))
            content: list[ContentBlock] = [text(body)]
            if end < size:
                content.append(text(f"[bytes {offset}-{end} of {size}; read on with offset={end}]"))
            return CallToolResult(
                content=content,
                structured_content={
                    "path": path,
                    "size": size,
                    "offset": offset,
                    "end": end,
                    "encoding": encoding,
                },
            )

        return await guarded(work, result_limit)

    @tool(
        "Write a file of the workspace (parents are made): the whole file at once, replacing "
        "it; never a partial file. Text as UTF-8, or bytes given as base64.",
        destructive=True,
    )
    async def write_file(
        ctx: Context,
        path: Annotated[str, Field(description="File path relative to /workspace.")],
        content: Annotated[str, Field(description="The file's content.")],
        encoding: Annotated[
            Literal["text", "base64"],
            Field(description="text: content is written as UTF-8; base64: content is decoded."),
        ] = "text",
        sandbox_id: SandboxArg = "",
    ) -> CallToolResult:
        owner = owner_of(ctx)

        async def work() -> CallToolResult:
            if encoding == "base64":
                try:
                    data = base64.b64decode(content, validate=True)
                except (binascii.Error, ValueError):
                    raise BadRequest("content is not valid base64") from None
            else:
                data = content.encode("utf-8", "surrogatepass")
            if len(data) > WRITE_MAX:
                raise TooLarge(
                    f"the file would be {len(data)} bytes; write_file takes at most {WRITE_MAX} "
                    "(copy larger files with execute_command, or upload them through Jupyter)"
                )

            def write() -> int:
                upload = sessions.workspace(owner, sandbox_id).start_upload(path)
                try:
                    upload.write(data)
                    return upload.commit()
                finally:
                    upload.abort()  # after a commit: nothing; after a failure: no temporary left

            size = await asyncio.to_thread(write)
            return CallToolResult(
                content=[text(f"wrote {size} bytes to /workspace/{path.lstrip('/')}")],
                structured_content={"path": path, "size": size},
            )

        return await guarded(work, result_limit)

    @tool("List your sandboxes: ids, state, agent sessions and kernels using each.", True)
    async def list_sandboxes(ctx: Context) -> CallToolResult:
        owner = owner_of(ctx)

        async def work() -> CallToolResult:
            items = await asyncio.to_thread(service.list, owner)
            lines = [
                f"{i['id']}: {i['state']}, {i['kernels']} kernels, "
                f"{len(i.get('agent_sessions', []))} agent sessions, image {i['image']}"
                for i in items
            ]
            keep = ("id", "state", "image", "flavor", "kernels", "agent_sessions", "scope")
            return CallToolResult(
                content=[text("\n".join(lines) or "no sandboxes yet: execute_code makes yours")],
                structured_content={"sandboxes": [{k: i.get(k) for k in keep} for i in items]},
            )

        return await guarded(work, result_limit)

    @tool(
        "The URL at which you (in a browser, logged in to Jupyter) open a web app listening on "
        "a port of your sandbox: Streamlit, Dash, Gradio, FastAPI, `python -m http.server`... "
        "The app must listen on 0.0.0.0 (not 127.0.0.1). Says whether something listens there now.",
        True,
    )
    async def get_preview_url(
        ctx: Context,
        port: Annotated[int, Field(ge=1, le=65535, description="The TCP port the app listens on.")],
        sandbox_id: SandboxArg = "",
    ) -> CallToolResult:
        owner = owner_of(ctx)

        async def work() -> CallToolResult:
            base = server_url_of(ctx)
            if not base:
                raise BadRequest(
                    "no Jupyter server is running for you on this host, and previews are "
                    "served by one: start `jupyter lab` (with sandbox-kernel installed) and ask again"
                )
            sid = sandbox_id or sessions.own_sandbox_id(owner)
            found = await asyncio.to_thread(service.ports, owner, sid)
            url = proxy_path(base, found["sandbox_id"], port)
            listening = [p for p in found["ports"] if p["port"] == port]
            if not found["preview"]:
                note = found["preview_note"]
            elif found["state"] != "running":
                note = f"sandbox {sid} is {found['state']}: start it (`sandbox-kernel start {sid}`) and the app first"
            elif not listening:
                note = f"nothing listens on port {port} in the sandbox yet"
            elif not listening[0]["reachable"]:
                note = (
                    f"the app listens on {listening[0]['address']} only: make it listen on 0.0.0.0"
                )
            else:
                note = "the app is listening"
            return CallToolResult(
                content=[text(f"{url}\n({note})")],
                structured_content={
                    "url": url,
                    "sandbox_id": found["sandbox_id"],
                    "port": port,
                    "listening": bool(found["preview"] and listening and listening[0]["reachable"]),
                },
            )

        return await guarded(work, result_limit)

    @tool("List your snapshots (saved sandbox filesystems a new sandbox can start from).", True)
    async def list_snapshots(ctx: Context) -> CallToolResult:
        owner = owner_of(ctx)

        async def work() -> CallToolResult:
            snaps = await asyncio.to_thread(service.snapshots, owner)
            lines = [f"{s['name']}: from {s['source']}, {s['size']} bytes" for s in snaps]
            return CallToolResult(
                content=[text("\n".join(lines) or "no snapshots")],
                structured_content={"snapshots": snaps},
            )

        return await guarded(work, result_limit)

    @tool(
        "Save a snapshot of a sandbox's filesystem (installed packages, files outside /workspace; "
        "never the workspace itself). Notebooks can start from it with SANDBOX_KERNEL_SNAPSHOT."
    )
    async def create_snapshot(
        ctx: Context,
        name: Annotated[str, Field(description="Snapshot name, e.g. 'with-torch'.")],
        sandbox_id: SandboxArg = "",
    ) -> CallToolResult:
        owner = owner_of(ctx)

        async def work() -> CallToolResult:
            target = sandbox_id or await asyncio.to_thread(sessions.own_sandbox_id, owner)
            snap = await asyncio.to_thread(service.create_snapshot, owner, target, name)
            return CallToolResult(
                content=[text(f"snapshot {snap['name']} of {snap['source']} saved")],
                structured_content=snap,
            )

        return await guarded(work, result_limit)

    @tool("Delete one of your snapshots.", destructive=True)
    async def delete_snapshot(
        ctx: Context, name: Annotated[str, Field(description="Snapshot name.")]
    ) -> CallToolResult:
        owner = owner_of(ctx)

        async def work() -> CallToolResult:
            if await asyncio.to_thread(service.delete_snapshot, owner, name):
                return CallToolResult(content=[text(f"snapshot {name} deleted")])
            return error_result(f"no snapshot named {name!r}; list_snapshots shows yours")

        return await guarded(work, result_limit)

    @tool(
        "The folders the administrator maps into your sandboxes (data sets, model weights, "
        "tools, caches): where each appears, which host folder or volume it shows, and whether "
        "it is read-only (ro) or writable (rw); also the mappings of the settings now, which a "
        "sandbox made before gets at its next start.",
        True,
    )
    async def get_volume_mappings(
        ctx: Context,
        sandbox_id: Annotated[
            str,
            Field(
                description="Id of one of your sandboxes (see list_sandboxes); empty: all of them."
            ),
        ] = "",
    ) -> CallToolResult:
        owner = owner_of(ctx)

        async def work() -> CallToolResult:
            said, data = await asyncio.to_thread(volume_mappings, service, owner, sandbox_id)
            return CallToolResult(content=[text(said)], structured_content=data)

        return await guarded(work, result_limit)

    @tool(
        "Your sandboxes' resources: each one's CPUs, memory and disk (its own files and the "
        "workspace) in use against its limits, your totals, and how far this installation's "
        "quotas (number of sandboxes, total memory) are from full.",
        True,
    )
    async def get_resource_stats(ctx: Context) -> CallToolResult:
        owner = owner_of(ctx)

        async def work() -> CallToolResult:
            said, data = await asyncio.to_thread(resource_stats, service, owner)
            return CallToolResult(content=[text(said)], structured_content=data)

        return await guarded(work, result_limit)

    @tool(
        "For administrators of this installation: remove its orphan sandboxes (no owner "
        "record, an older sandbox of a reused id, one left half-made) once their grace period "
        "is over; workspaces are kept. Anyone else is told it is not theirs to run.",
        destructive=True,
    )
    async def cleanup_orphan_sandboxes(
        ctx: Context,
        dry_run: Annotated[bool, Field(description="Only list what would be removed.")] = False,
    ) -> CallToolResult:
        admin = admin_of(ctx)

        async def work() -> CallToolResult:
            said, data = await asyncio.to_thread(cleanup_orphans, service, admin, dry_run)
            return CallToolResult(content=[text(said)], structured_content=data)

        return await guarded(work, result_limit)

    return server


async def serve_stdio(service: SandboxService, owner: str, home: str) -> None:
    """``sandbox-kernel mcp``: the tools over stdin/stdout for ``owner``, until the
    client closes the pipe; every interpreter is ended on the way out."""
    sessions = AgentSessions(service, home)
    # The user who runs it administers the installation whose state folder is theirs.
    admin = owns_state_folder(service.config)
    server = build_server(sessions, lambda _ctx: owner, admin_of=lambda _ctx: admin)
    loop = asyncio.get_running_loop()
    main = asyncio.current_task()
    if main is not None:  # a client ending us with SIGTERM still gets interpreters ended
        # No signal handlers on Windows' loops (NotImplementedError) or off the main
        # thread (RuntimeError): there the finally below still ends them on EOF.
        with contextlib.suppress(NotImplementedError, RuntimeError):
            loop.add_signal_handler(signal.SIGTERM, main.cancel)
    idle_reaper = asyncio.ensure_future(sessions.end_idle_forever())
    try:
        await server.run_stdio_async()
    except asyncio.CancelledError:
        pass
    finally:
        idle_reaper.cancel()
        with contextlib.suppress(NotImplementedError, RuntimeError):
            loop.remove_signal_handler(signal.SIGTERM)
        closing = asyncio.ensure_future(sessions.close())
        while not closing.done():
            try:
                await asyncio.shield(closing)
            except asyncio.CancelledError:
                continue
