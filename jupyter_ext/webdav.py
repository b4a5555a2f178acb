"""WebDAV at ``{base_url}sandbox-kernel/dav/{sandbox id}/``: Jupyter's authentication and
the sandbox owner rules in front of the WsgiDAV application (:mod:`sandbox_kernel.webdav`).

Tornado's own WSGI container reads a whole request body into memory and runs the
application on the event loop; neither is acceptable for uploads of gigabytes. So this
handler is a small streaming bridge: a PUT's body is handed to the application's thread
chunk by chunk as it arrives (with back-pressure: the client waits for the disk, memory
stays bounded), and the response goes back chunk by chunk, read off the event loop.

Desktop clients (Finder, Explorer, davfs2) only speak HTTP Basic: its password is taken
as the Jupyter token and checked by the server's identity provider, exactly as a bearer
token (rclone, scripts) is.
"""

from __future__ import annotations

import asyncio
import base64
import binascii
import collections
import io
import sys
import threading
import urllib.parse
from concurrent.futures import ThreadPoolExecutor
from typing import Any

from jupyter_server.auth.decorator import allow_unauthenticated
from jupyter_server.base.handlers import JupyterHandler
from jupyter_server.utils import url_path_join
from tornado import web
from tornado.http1connection import HTTP1Connection
from wsgidav.dav_error import DAVError

from sandbox_kernel.errors import SandboxError, shorten
from sandbox_kernel.webdav import ENV_SANDBOX, ENV_WORKSPACE, make_app

from .handlers import AUTH_RESOURCE, DISCARD_SLACK, http_error, request_owner
from .metrics import FILE_BYTES

MOUNT = "sandbox-kernel/dav"
METHODS = (
    "OPTIONS",
    "GET",
    "HEAD",
    "PUT",
    "DELETE",
    "PROPFIND",
    "PROPPATCH",
    "MKCOL",
    "COPY",
    "MOVE",
    "LOCK",
    "UNLOCK",
)
READ_METHODS = {"OPTIONS", "GET", "HEAD", "PROPFIND"}
SMALL_BODY = 1 << 20  # bytes of an XML body (PROPFIND, LOCK, PROPPATCH) read into memory
BODY_BUFFER = 8 << 20  # bytes of a PUT held between the network and the disk
THREADS = 16  # requests the WebDAV application serves at once
HOP_BY_HOP = {"connection", "keep-alive", "transfer-encoding", "te", "trailer", "upgrade"}
REALM = "sandbox-kernel"


class DavService:
    """The WsgiDAV application of this server and the threads it runs in."""

    def __init__(self, base_url: str) -> None:
        # As routed (percent-encoded, like the request's raw path) and as WSGI and
        # WsgiDAV see it (decoded, like the Destination paths it compares it with).
        self.route_prefix = url_path_join(base_url, MOUNT).rstrip("/")
        self.mount_path = urllib.parse.unquote(self.route_prefix)
        self.app = make_app(self.mount_path)
        self.executor = ThreadPoolExecutor(THREADS, thread_name_prefix="sandbox-dav")

    def close(self) -> None:
        self.executor.shutdown(wait=False, cancel_futures=True)


class ClientGone(Exception):
    """The client closed the connection before its upload was complete."""


class BodyStream(io.RawIOBase):
    """``wsgi.input`` of a streamed PUT: chunks from the event loop, read by the app's thread.

    At most ``BODY_BUFFER`` bytes wait here; past that the event loop stops reading the
    socket until the application caught up. ``fail`` makes the next read raise (a size
    limit passed, the client gone); ``discard`` drops what the application never read.
    """

    def __init__(self, loop: asyncio.AbstractEventLoop) -> None:
        super().__init__()
        self._loop = loop
        self._cond = threading.Condition()
        self._chunks: collections.deque[bytes] = collections.deque()
        self._held = 0
        self._ended = False
        self._failure: BaseException | None = None
        self._discarding = False
        self._room: asyncio.Future[None] | None = None

    # -- the event loop's side ---------------------------------------------------------
    def feed(self, chunk: bytes) -> asyncio.Future[None] | None:
        """Hand over a chunk; a future to await when the buffer is full, else None."""
        with self._cond:
            if self._discarding or self._ended:
                return None
            self._chunks.append(chunk)
            self._held += len(chunk)
            self._cond.notify_all()
            if self._held < BODY_BUFFER:
                return None
            self._room = self._loop.create_future()
            return self._room

    def end(self, failure: BaseException | None = None) -> None:
        with self._cond:
            self._ended = True
            if failure is not None and self._failure is None:
                self._failure = failure
            self._cond.notify_all()
        self._wake_feeder()

    def discard(self) -> None:
        with self._cond:
            self._discarding = True
            self._chunks.clear()
            self._held = 0
        self._wake_feeder()

    def _wake_feeder(self) -> None:
        def wake() -> None:
            room, self._room = self._room, None
            if room is not None and not room.done():
                room.set_result(None)

        self._loop.call_soon_threadsafe(wake)

    # -- the application's side ---------------------------------------------------------
    def readable(self) -> bool:
        return True

    def read(self, size: int | None = -1) -> bytes:
        with self._cond:
            self._cond.wait_for(lambda: self._chunks or self._ended or self._failure)
            if self._failure is not None:
                raise self._failure
            if not self._chunks:
                return b""
            if size is None or size < 0:
                data = b"".join(self._chunks)
                self._chunks.clear()
            else:
                data = self._chunks.popleft()
                if len(data) > size:
                    self._chunks.appendleft(data[size:])
                    data = data[:size]
            self._held -= len(data)
            room = self._held < BODY_BUFFER
        if room:
            self._wake_feeder()
        return data


def _run(app: Any, environ: dict[str, Any]) -> tuple[str, list[tuple[str, str]], bytes, Any]:
    """Call the WSGI application up to its first body chunk (so its status is known)."""
    started: dict[str, Any] = {}

    def start_response(status: str, headers: list[tuple[str, str]], exc_info: Any = None) -> Any:
        started["status"], started["headers"] = status, headers
        return None

    result = app(environ, start_response)
    chunks = iter(result)
    try:
        first = next(chunks, b"")
    except BaseException:
        _close(result)
        raise
    return started["status"], started["headers"], first, result if chunks is result else chunks


def _next(chunks: Any) -> bytes | None:
    return next(chunks, None)


def _close(result: Any) -> None:
    close = getattr(result, "close", None)
    if close is not None:
        close()


@web.stream_request_body
class DavHandler(JupyterHandler):
    """Every WebDAV method of one sandbox's workspace."""

    SUPPORTED_METHODS = METHODS
    auth_resource = AUTH_RESOURCE

    _body: BodyStream | None = None
    _small: list[bytes]
    _app: asyncio.Future[Any] | None = None
    _received = 0
    _too_large = False
    _refused: web.HTTPError | None = None

    @property
    def dav(self) -> DavService:
        return self.settings["sandbox_dav"]

    def check_xsrf_cookie(self) -> None:
        # An unauthenticated request gets its 401 (the Basic challenge clients wait for)
        # from prepare; cookie-authenticated writes still need the XSRF token.
        if getattr(self, "_jupyter_current_user", None) is None:
            return None
        return super().check_xsrf_cookie()

    def _basic_as_token(self) -> None:
        """HTTP Basic's password is the Jupyter token: hand it to the identity provider."""
        scheme, _, value = self.request.headers.get("Authorization", "").partition(" ")
        if scheme.lower() != "basic":
            return
        try:
            text = base64.b64decode(value.strip(), validate=True).decode("utf-8")
        except (binascii.Error, UnicodeDecodeError):
            text = ""
        password = text.partition(":")[2]
        if password:
            self.request.headers["Authorization"] = f"token {password}"
        else:
            del self.request.headers["Authorization"]

    async def prepare(self) -> None:  # type: ignore[override]
        self._basic_as_token()
        self._small = []
        try:
            await self._admit()
        except web.HTTPError as err:
            if err.status_code == 413:
                raise  # answered at once, and the connection closed: never read 10 GB
            # Answered once the (small) body is read, so the connection stays usable: a
            # desktop client's first request is unauthenticated, its retry reuses it.
            self._refused = err
            self._limit_body(SMALL_BODY)

    async def _admit(self) -> None:
        """Authenticate, authorize, find the workspace; for a PUT, start the application."""
        await super().prepare()
        if self.current_user is None:
            raise web.HTTPError(401, log_message="authentication required")
        method = self.request.method or ""
        action = "read" if method in READ_METHODS else "write"
        if not self.authorizer.is_authorized(self, self.current_user, action, AUTH_RESOURCE):
            raise web.HTTPError(403, log_message=f"not allowed to {action} sandbox files")
        sandbox_id = self.path_kwargs["sandbox_id"]
        try:
            workspace = await asyncio.to_thread(
                self.settings["sandbox_service"].workspace, request_owner(self), sandbox_id
            )
        except SandboxError as exc:
            raise http_error(exc) from None
        self._environ = self._wsgi_environ(sandbox_id, workspace)
        if method != "PUT":
            self._limit_body(SMALL_BODY)
            return
        limit = self.settings["sandbox_max_upload"]
        declared = self.request.headers.get("Content-Length", "0").strip()
        if not declared.isdigit():
            raise web.HTTPError(400, log_message="the Content-Length header is not a number")
        if int(declared) > limit:
            raise web.HTTPError(
                413, log_message=f"the file is {declared} bytes; the limit is {limit} bytes"
            )
        self._limit_body(2 * limit + DISCARD_SLACK)
        self._body = BodyStream(asyncio.get_running_loop())
        self._environ["wsgi.input"] = self._body
        self._app = self._start(self._environ)
        self._app.add_done_callback(self._discard_body)

    def _discard_body(self, _: Any) -> None:
        """The application answered: what it did not read of the body is dropped."""
        if self._body is not None:
            self._body.discard()

    def _limit_body(self, size: int) -> None:
        if isinstance(self.request.connection, HTTP1Connection):
            self.request.connection.set_max_body_size(size)

    def _start(self, environ: dict[str, Any]) -> asyncio.Future[Any]:
        loop = asyncio.get_running_loop()
        return loop.run_in_executor(self.dav.executor, _run, self.dav.app, environ)

    def _wsgi_environ(self, sandbox_id: str, workspace: Any) -> dict[str, Any]:
        request = self.request
        raw = request.path[len(self.dav.route_prefix) :] or "/"
        host, _, port = (
            request.host.rpartition(":") if ":" in request.host else (request.host, "", "")
        )
        environ: dict[str, Any] = {
            "REQUEST_METHOD": request.method,
            "SCRIPT_NAME": self.dav.mount_path,
            "PATH_INFO": urllib.parse.unquote_to_bytes(raw).decode("latin-1"),
            "QUERY_STRING": request.query,
            "SERVER_NAME": host or "localhost",
            "SERVER_PORT": port or ("443" if request.protocol == "https" else "80"),
            "SERVER_PROTOCOL": request.version,
            "REMOTE_ADDR": request.remote_ip or "",
            "wsgi.version": (1, 0),
            "wsgi.url_scheme": request.protocol,
            "wsgi.input": io.BytesIO(),
            "wsgi.errors": sys.stderr,
            "wsgi.multithread": True,
            "wsgi.multiprocess": False,
            "wsgi.run_once": False,
            "wsgidav.auth.user_name": request_owner(self),
            "wsgidav.auth.realm": REALM,
            "wsgidav.auth.roles": ["editor"],
            ENV_WORKSPACE: workspace,
            ENV_SANDBOX: sandbox_id,
        }
        for name, value in request.headers.get_all():
            key = name.upper().replace("-", "_")
            if key in ("CONTENT_TYPE", "CONTENT_LENGTH"):
                environ[key] = value
            elif key != "AUTHORIZATION" and key != "COOKIE":
                environ.setdefault("HTTP_" + key, value)
        return environ

    # -- the body ------------------------------------------------------------------
    async def data_received(self, chunk: bytes) -> None:
        self._received += len(chunk)
        if self._refused is not None:
            return
        if self._body is None:
            self._small.append(chunk)
            return
        if self._too_large:
            return
        if self._received > self.settings["sandbox_max_upload"]:
            self._too_large = True
            limit = self.settings["sandbox_max_upload"]
            self._body.end(DAVError(413, context_info=f"the upload passed {limit} bytes"))
            return
        FILE_BYTES.labels(door="webdav", direction="upload").inc(len(chunk))
        room = self._body.feed(chunk)
        if room is not None:
            await room

    def on_connection_close(self) -> None:
        if self._body is not None:
            self._body.end(ClientGone("the client closed the connection mid-upload"))
        super().on_connection_close()

    # -- the response ----------------------------------------------------------------
    async def _serve(self) -> None:
        if self._refused is not None:
            raise self._refused
        if self._body is not None:
            self._body.end()
        app = self._app
        if app is None:
            self._environ["wsgi.input"] = io.BytesIO(b"".join(self._small))
            self._environ["CONTENT_LENGTH"] = str(self._received)
            app = self._start(self._environ)
        try:
            status, headers, first, rest = await app
        except Exception:
            self.log.exception("WebDAV %s %s failed", self.request.method, self.request.path)
            raise web.HTTPError(
                500, log_message="internal error in WebDAV; see the server log"
            ) from None
        await self._send(status, headers, first, rest)

    async def _send(
        self, status: str, headers: list[tuple[str, str]], first: bytes, rest: Any
    ) -> None:
        loop = asyncio.get_running_loop()
        code, _, reason = status.partition(" ")
        self.set_status(int(code), reason or None)
        self.clear_header("Content-Type")
        seen: set[str] = set()
        declared: int | None = None
        for name, value in headers:
            low = name.lower()
            if low in HOP_BY_HOP:
                continue
            if low == "content-length":
                declared = int(value)
            if low in seen:
                self.add_header(name, value)
            else:
                self.set_header(name, value)
                seen.add(low)
        sent = 0
        try:
            chunk: bytes | None = first
            while chunk is not None:
                if chunk:
                    self.write(chunk)
                    sent += len(chunk)
                    FILE_BYTES.labels(door="webdav", direction="download").inc(len(chunk))
                    await self.flush()
                chunk = await loop.run_in_executor(self.dav.executor, _next, rest)
        except (SandboxError, OSError, DAVError) as exc:
            self.log.warning(
                "WebDAV response for %s cut short: %s", shorten(self.request.path), exc
            )
            sent = -1
        finally:
            await loop.run_in_executor(self.dav.executor, _close, rest)
        if declared is not None and sent != declared and self.request.method != "HEAD":
            # Headers are out: a file that shrank (or failed) mid-way can only end in a
            # cut connection, never in a short body a client would take as complete.
            if isinstance(self.request.connection, HTTP1Connection):
                self.request.connection.close()
            return
        self.finish()

    def write_error(self, status_code: int, **kwargs: Any) -> None:
        """A plain-text reason (no page, no traceback); 401 carries the Basic challenge."""
        if status_code == 401:
            self.set_header("WWW-Authenticate", f'Basic realm="{REALM}", charset="UTF-8"')
        message = self._reason
        exc = kwargs.get("exc_info", (None, None))[1]
        if isinstance(exc, web.HTTPError) and exc.log_message:
            message = exc.log_message % exc.args if exc.args else exc.log_message
        self.set_header("Content-Type", "text/plain; charset=utf-8")
        self.finish(shorten(str(message), 400) + "\n")

    @allow_unauthenticated
    async def options(self, sandbox_id: str, path: str | None = None) -> None:
        await self._serve()

    get = head = put = delete = propfind = proppatch = options
    mkcol = copy = move = lock = unlock = options


def dav_handlers() -> list[tuple[str, type[DavHandler]]]:
    return [(rf"/{MOUNT}/(?P<sandbox_id>[^/]+)(?P<path>/.*)?", DavHandler)]
