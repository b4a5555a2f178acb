"""MCP over streamable HTTP at ``{base_url}sandbox-kernel/mcp``, inside Jupyter's server.

The tools are :mod:`sandbox_kernel.mcp_server`'s, served by the ``mcp`` SDK's own
session manager (an ASGI application). This handler is the bridge: Jupyter
authenticates and authorizes the request as every other route (an unauthenticated
API request gets 403 before its body is read), then the request goes to the SDK as an
ASGI call and its response, SSE streams included, comes back chunk by chunk.

* **Whose sandbox.** Each request carries its user (``request_owner``) into the ASGI
  scope; every tool call reads the owner from the request that carried it.
* **Whose MCP session.** An MCP session id is bound to the Jupyter user who opened it:
  the SDK compares the principal we hand it (as an authenticated ASGI user), and this
  handler checks its own record too, so a session id seen by another user answers 404
  exactly like an unknown one.
* **Bodies** are bounded (MCP messages are small; write_file's content is the largest)
  and refused with 413 from their declared length before they are read.

The session manager runs in a task of the server's event loop, started on the first
request; :meth:`McpService.close` ends it and every agent interpreter with the server.
"""

from __future__ import annotations

import asyncio
import os
from collections.abc import MutableMapping
from pathlib import Path
from typing import TYPE_CHECKING, Any

from jupyter_server.auth.decorator import authorized
from jupyter_server.base.handlers import APIHandler
from tornado import web
from tornado.http1connection import HTTP1Connection
from tornado.iostream import StreamClosedError

from sandbox_kernel.agent_sessions import AgentSessions
from sandbox_kernel.service import SandboxService

from .handlers import AUTH_RESOURCE, request_is_admin, request_owner

if TYPE_CHECKING:  # the SDK is imported with the first MCP request (it takes a second)
    from mcp.server.mcpserver import Context, MCPServer
    from mcp.server.streamable_http_manager import StreamableHTTPSessionManager

MOUNT = "sandbox-kernel/mcp"
BODY_LIMIT = 16 << 20  # bytes of one MCP request (write_file takes up to 8 MiB, base64'd)
SESSION_IDLE = 4 * 3600.0  # seconds an MCP session may go unused before the SDK ends it
MAX_MCP_SESSIONS = 1000
OWNER_KEY = "sandbox_kernel.owner"
ADMIN_KEY = "sandbox_kernel.admin"
SERVER_URL_KEY = "sandbox_kernel.server_url"
HOP_BY_HOP = {"connection", "keep-alive", "transfer-encoding", "te", "trailer", "upgrade"}
HIDDEN_HEADERS = {"authorization", "cookie"}  # never handed on to the SDK or the tools
MCP_SESSION_ID_HEADER = "mcp-session-id"  # the transport's session header (MCP's spec)


def owner_of(ctx: Context) -> str:
    """The owner a tool call acts for: set by :class:`McpHandler` on the request that
    carried the call (never taken from anything the client says)."""
    request = ctx.request_context.request
    owner = getattr(request, "scope", {}).get(OWNER_KEY) if request is not None else None
    if not isinstance(owner, str) or not owner:
        raise RuntimeError("an MCP call reached the tools without an authenticated owner")
    return owner


def admin_of(ctx: Context) -> bool:
    """Whether the request that carried the call is an administrator's (see
    ``SandboxExtension.admin_users``)."""
    request = ctx.request_context.request
    return bool(getattr(request, "scope", {}).get(ADMIN_KEY)) if request is not None else False


def server_url_of(ctx: Context) -> str:
    """This server's URL as the request that carried the call reached it."""
    request = ctx.request_context.request
    url = getattr(request, "scope", {}).get(SERVER_URL_KEY) if request is not None else None
    return url if isinstance(url, str) else ""


def _import_sdk() -> None:
    """Import the MCP SDK and the tools (pydantic, starlette: about 1.2 s, once), off the
    event loop: the first MCP request must not stall every other request to the server."""
    import mcp.server.transport_security  # noqa: F401

    import sandbox_kernel.mcp_server  # noqa: F401


class McpService:
    """The MCP server of this Jupyter server: the tools, the SDK's session manager, and
    which Jupyter user opened which MCP session."""

    def __init__(self, service: SandboxService, home: str | None = None) -> None:
        root = home or os.environ.get("SANDBOX_KERNEL_SERVER_ROOT") or os.getcwd()
        self.sessions = AgentSessions(service, str(Path(root).resolve()))
        # The SDK's server and session manager, made by the first request (started()):
        # a Jupyter server that never serves MCP never imports the SDK.
        self.server: MCPServer | None = None
        self.manager: StreamableHTTPSessionManager | None = None
        self.session_users: dict[str, str] = {}  # MCP session id -> Jupyter user who opened it
        self._runner: asyncio.Task[None] | None = None
        self._ready: asyncio.Event | None = None
        self._stop: asyncio.Event | None = None
        self._idle_reaper: asyncio.Task[None] | None = None

    def remember(self, session_id: str, user: str) -> None:
        """Record who opened an MCP session; forget sessions the SDK has ended (idle
        expiry ends them without telling us) once the record outgrows what can live."""
        users = self.session_users
        users.setdefault(session_id, user)
        if len(users) > 2 * MAX_MCP_SESSIONS:
            live = getattr(self.manager, "_server_instances", None)
            if isinstance(live, dict):
                for gone in [sid for sid in users if sid not in live and sid != session_id]:
                    del users[gone]

    def _build(self) -> StreamableHTTPSessionManager:
        """The tools' server and the SDK's session manager, made once."""
        if self.manager is None:
            from mcp.server.transport_security import TransportSecuritySettings

            from sandbox_kernel.mcp_server import build_server

            self.server = build_server(self.sessions, owner_of, server_url_of, admin_of)
            self.server.streamable_http_app(
                streamable_http_path="/" + MOUNT,
                max_request_body_size=BODY_LIMIT,
                session_idle_timeout=SESSION_IDLE,
                max_sessions=MAX_MCP_SESSIONS,
                # Jupyter checks hosts and origins (allow_remote_access, allow_origin) and
                # requires its token or cookie; the SDK's localhost-only default would
                # refuse a server reached by its real name.
                transport_security=TransportSecuritySettings(enable_dns_rebinding_protection=False),
            )
            self.manager = self.server.session_manager
        return self.manager

    async def started(self) -> StreamableHTTPSessionManager:
        """The session manager, made and running (by the first request)."""
        if self.manager is None:
            await asyncio.to_thread(_import_sdk)  # the server goes on serving meanwhile
        manager = self._build()
        if self._runner is None:
            self._ready, self._stop = asyncio.Event(), asyncio.Event()
            self._runner = asyncio.ensure_future(self._run(self._ready, self._stop))
            self._idle_reaper = asyncio.ensure_future(self.sessions.end_idle_forever())
        assert self._ready is not None
        ready = asyncio.ensure_future(self._ready.wait())
        await asyncio.wait([ready, self._runner], return_when=asyncio.FIRST_COMPLETED)
        if not ready.done():
            ready.cancel()
            self._runner.result()  # raises why it could not start
        return manager

    async def _run(self, ready: asyncio.Event, stop: asyncio.Event) -> None:
        assert self.manager is not None
        async with self.manager.run():
            ready.set()
            await stop.wait()

    async def close(self) -> None:
        """End MCP sessions and every agent interpreter (the extension stops)."""
        if self._idle_reaper is not None:
            self._idle_reaper.cancel()
        if self._runner is not None and self._stop is not None:
            self._stop.set()
            try:
                await asyncio.wait_for(self._runner, 10)
            except Exception:  # already ended, or slow to: interpreters still go below
                pass
        await self.sessions.close()


@web.stream_request_body
class McpHandler(APIHandler):
    """POST (messages), GET (the server's event stream), DELETE (end the session)."""

    SUPPORTED_METHODS = ("GET", "POST", "DELETE")
    auth_resource = AUTH_RESOURCE

    _body: bytearray
    _too_large = False
    _gone: asyncio.Event
    _status = 0
    _finished_asgi = False
    _body_sent = False

    @property
    def mcp(self) -> McpService:
        return self.settings["sandbox_mcp"]

    async def prepare(self) -> None:  # type: ignore[override]
        # The body streams in after this: who is asking, and how much, is settled first.
        self._body = bytearray()
        self._gone = asyncio.Event()
        await super().prepare()
        if not self.current_user:
            raise web.HTTPError(403, log_message="authentication required")
        declared = self.request.headers.get("Content-Length")
        if declared is not None and (not declared.strip().isdigit() or int(declared) > BODY_LIMIT):
            raise web.HTTPError(
                413, log_message=f"an MCP request may hold at most {BODY_LIMIT} bytes"
            )
        if isinstance(self.request.connection, HTTP1Connection):
            self.request.connection.set_max_body_size(BODY_LIMIT)

    def data_received(self, chunk: bytes) -> None:
        if len(self._body) + len(chunk) > BODY_LIMIT:
            self._too_large = True
            return
        if not self._too_large:
            self._body += chunk

    def on_connection_close(self) -> None:
        self._ended()
        super().on_connection_close()

    def on_finish(self) -> None:
        self._ended()

    def _ended(self) -> None:
        gone = getattr(self, "_gone", None)  # absent when prepare failed early
        if gone is not None:
            gone.set()

    @web.authenticated
    @authorized
    async def post(self) -> None:
        await self._serve()

    @web.authenticated
    @authorized
    async def get(self) -> None:
        await self._serve()

    @web.authenticated
    @authorized
    async def delete(self) -> None:
        await self._serve()

    async def _serve(self) -> None:
        if self._too_large:
            raise web.HTTPError(
                413, log_message=f"an MCP request may hold at most {BODY_LIMIT} bytes"
            )
        user = self.current_user.username
        session_id = self.request.headers.get(MCP_SESSION_ID_HEADER)
        if session_id is not None and self.mcp.session_users.get(session_id, user) != user:
            # Someone else's session: answered as an unknown one, never served.
            self.set_status(404)
            self.finish(
                {
                    "jsonrpc": "2.0",
                    "id": None,
                    "error": {"code": -32600, "message": "Session not found"},
                }
            )
            return
        manager = await self.mcp.started()
        await manager.handle_request(self._scope(user), self._receive, self._send)
        if not self._finished_asgi and not self._finished:
            self.finish()
        if self.request.method == "DELETE" and session_id and self._status < 400:
            self.mcp.session_users.pop(session_id, None)

    def _scope(self, user: str) -> dict[str, Any]:
        from mcp.server.auth.middleware.bearer_auth import AuthenticatedUser
        from mcp.server.auth.provider import AccessToken

        request = self.request
        host, _, port = (
            request.host.rpartition(":") if ":" in request.host else (request.host, "", "")
        )
        headers = [
            (name.lower().encode("latin-1"), value.encode("latin-1"))
            for name, value in request.headers.get_all()
            if name.lower() not in HIDDEN_HEADERS
        ]
        return {
            "type": "http",
            "asgi": {"version": "3.0", "spec_version": "2.3"},
            "http_version": request.version.partition("/")[2] or "1.1",
            "method": request.method,
            "scheme": request.protocol,
            "path": request.path,
            "raw_path": request.path.encode("latin-1"),
            "query_string": request.query.encode("latin-1"),
            "root_path": "",
            "headers": headers,
            "client": (request.remote_ip or "", 0),
            "server": (host or "localhost", int(port) if port.isdigit() else 80),
            # The SDK binds each MCP session to this principal and refuses it to others.
            "user": AuthenticatedUser(
                AccessToken(token="", client_id=f"jupyter:{user}", scopes=[], subject=user)
            ),
            OWNER_KEY: request_owner(self),
            ADMIN_KEY: request_is_admin(self),
            SERVER_URL_KEY: f"{request.protocol}://{request.host}{self.base_url}",
        }

    async def _receive(self) -> dict[str, Any]:
        body, self._body = bytes(self._body), bytearray()
        if body or not self._body_sent:
            self._body_sent = True
            return {"type": "http.request", "body": body, "more_body": False}
        await self._gone.wait()
        return {"type": "http.disconnect"}

    async def _send(self, message: MutableMapping[str, Any]) -> None:
        if self._finished_asgi or self._gone.is_set() and message["type"] != "http.response.start":
            return
        if message["type"] == "http.response.start":
            self._status = int(message["status"])
            self.set_status(self._status)
            self.clear_header("Content-Type")
            for raw_name, raw_value in message.get("headers", []):
                name = raw_name.decode("latin-1")
                value = raw_value.decode("latin-1")
                low = name.lower()
                if low in HOP_BY_HOP or low == "content-length":
                    continue
                if low == MCP_SESSION_ID_HEADER and self._status < 400:
                    self.mcp.remember(value, self.current_user.username)
                self.add_header(name, value)
            return
        if message["type"] != "http.response.body":
            return
        chunk = message.get("body", b"")
        try:
            if chunk:
                self.write(chunk)
            if message.get("more_body"):
                await self.flush()
            else:
                self._finished_asgi = True
                await self.finish(
                    set_content_type=self._headers.get("Content-Type", "application/json")
                )
        except StreamClosedError:
            self._gone.set()


def mcp_handlers() -> list[tuple[str, type[McpHandler]]]:
    return [(rf"/{MOUNT}", McpHandler)]
