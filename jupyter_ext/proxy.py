"""Preview URLs: HTTP and WebSocket to a port of the user's sandbox, streamed both ways.

``{base_url}sandbox-kernel/proxy/{sandbox id}/{port}/{path}`` reaches ``/{path}`` of
the app listening on that port (the prefix is stripped), and
``{base_url}sandbox-kernel/proxy/absolute/{sandbox id}/{port}/{path}`` reaches the
whole path (for apps told their own prefix, as jupyter-server-proxy's ``absolute/``).

* **Who.** Every request is authenticated and authorized as every other route
  (resource ``sandboxes``) and owner-checked by the orchestrator: another user's
  sandbox is 403, an unknown one 404, a bad port 400, and a sandbox that is not running
  409, saying how to start it: a preview never wakes a sandbox.
* **Where.** The address comes from the engine, for that sandbox (its container's own
  address on our network for Docker; a socket made in its own network namespace for
  the local backend, see ``upstream``), never from the request: a path, ``Host``
  header or absolute URL cannot name another host. Redirects are handed to the
  browser, never followed here.
* **What the app gets.** Never the user's Jupyter credentials: Jupyter's cookies, its
  ``token`` query argument, ``token``/``Bearer`` authorization and the XSRF header are
  removed, hop-by-hop headers dropped; the app may not set Jupyter's cookies either.
* **What the app's pages may do.** A page the sandbox serves would, on the server's
  own origin, run its scripts with the user's Jupyter session (open a host kernel,
  write host files). So, unless an administrator turns it off
  (``SandboxExtension.preview_isolation``), a browser opening a preview is sent to
  ``{base_url}sandbox-kernel/preview/{grant}/{path}``: a path carrying a signed grant
  for that user, sandbox and port (it authenticates the page's own requests, which a
  browser sends without cookies), served with ``Content-Security-Policy: sandbox``, so
  the page runs in an origin of its own and never sees the server's cookies or API.
  Absolute previews keep the app's prefix, so they need the server's origin and are
  served only where isolation is off.
"""

from __future__ import annotations

import asyncio
import base64
import hashlib
import hmac
import json
import os
import time
import urllib.parse
from typing import Any

from jupyter_server.base.handlers import JupyterHandler
from jupyter_server.base.websocket import WebSocketMixin
from tornado import httpclient, httputil, web, websocket
from tornado.iostream import StreamClosedError

from sandbox_kernel.backends.base import PortTarget
from sandbox_kernel.errors import SandboxError, shorten
from sandbox_kernel.preview import PROXY_MOUNT, check_port
from sandbox_kernel.service import SandboxService

from .handlers import AUTH_RESOURCE, http_error, request_owner
from .metrics import PROXY_BYTES, PROXY_REQUESTS
from .upstream import http_client, websocket_connect

PREVIEW_MOUNT = "sandbox-kernel/preview"
GRANT_SECONDS = 12 * 3600  # how long a browser's preview grant lasts
CONNECT_TIMEOUT = 10.0  # seconds to reach the app
QUEUED_CHUNKS = 4  # request body chunks held while the app reads slower than the client sends
HOP_BY_HOP = {
    "connection",
    "keep-alive",
    "proxy-authenticate",
    "proxy-authorization",
    "proxy-connection",
    "te",
    "trailer",
    "transfer-encoding",
    "upgrade",
}
# Headers of a WebSocket handshake that tornado's client makes itself.
WS_OWN = {"sec-websocket-key", "sec-websocket-version", "sec-websocket-extensions", "host"}
SANDBOX_CSP = (
    "sandbox allow-scripts allow-forms allow-popups allow-modals allow-downloads "
    "allow-pointer-lock allow-presentation"
)
NAVIGATIONS = {"document", "iframe", "frame"}


def _jupyter_cookie(name: str, own: str) -> bool:
    """Whether a cookie is Jupyter's (its login, XSRF or JupyterHub's): never the app's."""
    return (
        name == own
        or name == "_xsrf"
        or name.startswith("username-")
        or name.startswith("jupyterhub-")
    )


class Grants:
    """Signed preview grants: who may open which port of which sandbox, until when."""

    def __init__(self, key: bytes | None = None) -> None:
        self._key = key or os.urandom(32)

    def _sign(self, body: str) -> str:
        return hmac.new(self._key, body.encode(), hashlib.sha256).hexdigest()[:32]

    def make(self, user: str, sandbox_id: str, port: int) -> str:
        claims = {"u": user, "s": sandbox_id, "p": port, "e": int(time.time()) + GRANT_SECONDS}
        body = base64.urlsafe_b64encode(json.dumps(claims).encode()).decode().rstrip("=")
        return f"{body}.{self._sign(body)}"

    def read(self, grant: str) -> tuple[str, str, int]:
        """(user, sandbox id, port) of a valid grant; 403 otherwise."""
        body, _, signature = grant.partition(".")
        if not body or not hmac.compare_digest(self._sign(body), signature):
            raise web.HTTPError(403, log_message="this preview link is not valid here")
        try:
            claims = json.loads(base64.urlsafe_b64decode(body + "=" * (-len(body) % 4)))
            user, sandbox_id, port, expires = claims["u"], claims["s"], claims["p"], claims["e"]
        except (ValueError, KeyError, TypeError):
            raise web.HTTPError(403, log_message="this preview link is not valid here") from None
        if expires < time.time():
            raise web.HTTPError(
                403,
                log_message="this preview link has expired; open the port's preview URL again",
            )
        return str(user), str(sandbox_id), int(port)


@web.stream_request_body
class ProxyHandler(WebSocketMixin, websocket.WebSocketHandler, JupyterHandler):
    """One proxied request or WebSocket to a sandbox's port (see the module's doc)."""

    absolute = False  # the absolute/ route: the app sees the whole path
    granted = False  # the preview/ route: a grant in the path, not Jupyter's session

    _target: PortTarget | None = None
    _prefix = ""
    _body: asyncio.Queue[bytes | None] | None = None
    _fetch: asyncio.Future[None] | None = None
    _upstream: websocket.WebSocketClientConnection | None = None
    _started = False

    @property
    def service(self) -> SandboxService:
        return self.settings["sandbox_service"]

    @property
    def isolated(self) -> bool:
        return bool(self.settings.get("sandbox_preview_isolation", True))

    # -- who, and where --------------------------------------------------------------
    async def prepare(self) -> None:  # type: ignore[override]
        if self.granted:
            user, sandbox_id, port = self.settings["sandbox_preview_grants"].read(
                self.path_kwargs["grant"]
            )
        else:
            await super().prepare()
            if not self.current_user:
                raise web.HTTPError(403, log_message="authentication required")
            action = "read" if self.request.method in ("GET", "HEAD", "OPTIONS") else "write"
            if not self.authorizer.is_authorized(self, self.current_user, action, AUTH_RESOURCE):
                raise web.HTTPError(403, log_message="not allowed to use sandbox previews")
            user = request_owner(self)
            sandbox_id = self.path_kwargs["sandbox_id"]
            try:
                port = check_port(self.path_kwargs["port"])
            except SandboxError as exc:
                raise http_error(exc) from None
        try:
            self._target = await asyncio.to_thread(self.service.port_target, user, sandbox_id, port)
        except SandboxError as exc:
            raise http_error(exc) from None
        base = self.base_url
        if self.granted:
            self._prefix = f"{base}{PREVIEW_MOUNT}/{self.path_kwargs['grant']}/"
        else:
            middle = "absolute/" if self.absolute else ""
            self._prefix = f"{base}{PROXY_MOUNT}/{middle}{sandbox_id}/{port}/"
        if self.absolute and self.isolated:
            raise web.HTTPError(
                403,
                log_message="absolute previews share the server's origin with the app, which "
                "this server does not allow (SandboxExtension.preview_isolation); use the "
                f"preview at {self._prefix.replace('absolute/', '')}",
            )
        if self._websocket():
            return
        if self._navigation() and self.isolated and not self.granted:
            grant = self.settings["sandbox_preview_grants"].make(user, sandbox_id, port)
            where = f"{base}{PREVIEW_MOUNT}/{grant}/{self.path_kwargs['path']}"
            query = self._query()
            self.redirect(where + (f"?{query}" if query else ""), status=303)
            return
        self._body = asyncio.Queue(QUEUED_CHUNKS)
        self._fetch = asyncio.ensure_future(self._forward())

    def _websocket(self) -> bool:
        return self.request.headers.get("Upgrade", "").lower() == "websocket"

    def _navigation(self) -> bool:
        return (
            self.request.method == "GET"
            and self.request.headers.get("Sec-Fetch-Dest", "").lower() in NAVIGATIONS
        )

    def _query(self) -> str:
        """The request's query without Jupyter's ``token`` (the app never sees it)."""
        pairs = urllib.parse.parse_qsl(self.request.query, keep_blank_values=True)
        return urllib.parse.urlencode([(k, v) for k, v in pairs if k != "token"])

    def _upstream_url(self, scheme: str = "http") -> str:
        """The app's URL for this request: the engine's address, the path after the
        prefix (or the whole path, absolute), and the query."""
        assert self._target is not None
        origin = self._target.url
        if scheme == "ws":
            origin = "ws" + origin[len("http") :]
        if self.absolute:
            path = urllib.parse.urlsplit(self.request.uri or "/").path
        else:
            path = "/" + urllib.parse.quote(self.path_kwargs["path"], safe="/:@!$&'()*+,;=-._~%")
        query = self._query()
        url = origin + path + (f"?{query}" if query else "")
        # The path can only ever be a path of that origin; say so rather than trust it.
        if urllib.parse.urlsplit(url).netloc != urllib.parse.urlsplit(origin).netloc:
            raise web.HTTPError(400, log_message="bad preview path")
        return url

    def _request_headers(self, websocket_request: bool = False) -> dict[str, str]:
        own_cookie = self.identity_provider.get_cookie_name(self)
        drop = HOP_BY_HOP | {"x-xsrftoken", "x-xsrf-token"}
        drop |= {
            part.strip().lower()
            for part in self.request.headers.get("Connection", "").split(",")
            if part.strip()
        }
        if websocket_request:
            drop |= WS_OWN
        headers: dict[str, str] = {}
        for name, value in self.request.headers.get_all():
            low = name.lower()
            if low in drop:
                continue
            if low == "cookie":
                kept = [
                    c.strip()
                    for c in value.split(";")
                    if c.strip() and not _jupyter_cookie(c.split("=", 1)[0].strip(), own_cookie)
                ]
                if not kept:
                    continue
                value = "; ".join(kept)
            if low == "authorization" and value.split(" ", 1)[0].lower() in ("token", "bearer"):
                continue
            headers[name] = f"{headers[name]}, {value}" if name in headers else value
        headers["X-Forwarded-Prefix"] = self._prefix.rstrip("/")
        headers["X-Forwarded-Proto"] = self.request.protocol
        headers["X-Forwarded-Host"] = self.request.host
        assert self._target is not None
        headers.update(self._target.headers)
        return headers

    def check_xsrf_cookie(self) -> None:
        """The app behind a preview keeps its own forms' protection; Jupyter's XSRF
        token is never handed to it (nor asked of it)."""

    # -- HTTP ------------------------------------------------------------------------
    async def data_received(self, chunk: bytes) -> None:
        if self._body is not None:
            PROXY_BYTES.labels(direction="to_sandbox").inc(len(chunk))
            await self._body.put(chunk)

    async def _produce(self, write: Any) -> None:
        assert self._body is not None
        while True:
            chunk = await self._body.get()
            if chunk is None:
                return
            await write(chunk)

    async def _forward(self) -> None:
        """The request to the app, its response streamed back as it comes."""
        head: list[str] = []
        method = self.request.method or "GET"
        has_body = method not in ("GET", "HEAD", "OPTIONS", "DELETE") or bool(
            self.request.headers.get("Content-Length")
            or self.request.headers.get("Transfer-Encoding")
        )
        request = httpclient.HTTPRequest(
            self._upstream_url(),
            method=method,
            headers=self._request_headers(),
            body_producer=self._produce if has_body else None,  # type: ignore[arg-type]
            allow_nonstandard_methods=True,
            follow_redirects=False,
            decompress_response=False,
            connect_timeout=CONNECT_TIMEOUT,
            request_timeout=0,
            header_callback=head.append,
            streaming_callback=lambda chunk: self._send_chunk(head, chunk),
        )
        assert self._target is not None
        client = http_client(self._target.opener, max_body_size=1 << 62)
        try:
            response = await client.fetch(request, raise_error=False)
            error: BaseException | None = response.error if response.code == 599 else None
        except (OSError, httpclient.HTTPClientError) as exc:  # refused, reset, timed out
            error = exc
        finally:
            client.close()
        if error is not None and not self._started:
            raise web.HTTPError(
                502,
                log_message=f"nothing answered on port {self.path_kwargs.get('port') or ''} of "
                f"the sandbox ({shorten(str(error) or type(error).__name__, 120)}); is the app "
                "running, and listening on 0.0.0.0 rather than 127.0.0.1?",
            )
        self._start_response(head)

    def _start_response(self, head: list[str]) -> None:
        """Status and headers of the app's response, once (before its first chunk)."""
        if self._started:
            return
        self._started = True
        lines = [line for line in head if line.strip()]
        # A 100 Continue may come first: the last status line is the response's.
        starts = [i for i, line in enumerate(lines) if line.startswith("HTTP/")]
        status_line = lines[starts[-1]] if starts else "HTTP/1.1 502 Bad Gateway"
        parsed = httputil.parse_response_start_line(status_line.strip())
        headers = httputil.HTTPHeaders.parse("".join(lines[starts[-1] + 1 :]) if starts else "")
        self.set_status(parsed.code, parsed.reason)
        self.clear_header("Content-Type")
        self.clear_header("Server")
        connection = {p.strip().lower() for p in headers.get("Connection", "").split(",")}
        for name, value in headers.get_all():
            low = name.lower()
            if low in HOP_BY_HOP or low in connection or low == "content-security-policy":
                continue
            if low == "set-cookie":
                cookie = value.split("=", 1)[0].strip()
                if _jupyter_cookie(cookie, self.identity_provider.get_cookie_name(self)):
                    continue
            if low == "location":
                value = self._location(value)
            self.add_header(name, value)
        if self.isolated:
            self.set_header("Content-Security-Policy", SANDBOX_CSP)
        if self.granted:
            self.set_header("Referrer-Policy", "no-referrer")

    def _location(self, value: str) -> str:
        """A redirect of the app, pointed back through the proxy when it names the app."""
        assert self._target is not None
        if value.startswith(self._target.url + "/") or value == self._target.url:
            value = value[len(self._target.url) :] or "/"
        if value.startswith("/") and not value.startswith("//") and not self.absolute:
            return self._prefix + value[1:]
        return value

    async def _send_chunk(self, head: list[str], chunk: bytes) -> None:
        self._start_response(head)
        PROXY_BYTES.labels(direction="from_sandbox").inc(len(chunk))
        self.write(chunk)
        await self.flush()

    async def _relay(self, *args: Any, **kwargs: Any) -> None:
        """Called once the client's body has come: end it, wait for the response."""
        if self._body is None or self._fetch is None:
            return
        await self._body.put(None)
        PROXY_REQUESTS.labels(kind="http").inc()
        try:
            await self._fetch
        except StreamClosedError:
            return  # the client went away mid-response
        if not self._finished:
            self.finish()

    post = put = patch = delete = head = options = _relay

    async def get(self, *args: Any, **kwargs: Any) -> None:
        if not self._websocket():
            return await self._relay()
        await self._open_upstream()
        PROXY_REQUESTS.labels(kind="websocket").inc()
        await websocket.WebSocketHandler.get(self, *args, **kwargs)

    def on_connection_close(self) -> None:
        if self._fetch is not None and not self._fetch.done():
            self._fetch.cancel()
        if self._upstream is not None:
            self._upstream.close()
        super().on_connection_close()

    # -- WebSocket -------------------------------------------------------------------
    def check_origin(self, origin: str | None = None) -> bool:
        # A granted preview's page has an origin of its own ("null"), and its grant,
        # not a cookie, is what lets it in: no other site can use the user's session.
        return True if self.granted else super().check_origin(origin)

    async def _open_upstream(self) -> None:
        protocols = [
            p.strip()
            for p in self.request.headers.get("Sec-WebSocket-Protocol", "").split(",")
            if p.strip()
        ]
        request = httpclient.HTTPRequest(
            self._upstream_url("ws"),
            headers=self._request_headers(websocket_request=True),
            connect_timeout=CONNECT_TIMEOUT,
            request_timeout=CONNECT_TIMEOUT,
        )
        assert self._target is not None
        try:
            self._upstream = await websocket_connect(
                self._target.opener,
                request,
                on_message_callback=self._from_app,
                subprotocols=protocols or None,
                max_message_size=64 << 20,
            )
        except (OSError, httpclient.HTTPClientError, websocket.WebSocketError) as exc:
            raise web.HTTPError(
                502,
                log_message=f"the app on port {self.path_kwargs.get('port') or ''} of the "
                f"sandbox refused the WebSocket ({shorten(str(exc), 120)})",
            ) from None

    def select_subprotocol(self, subprotocols: list[str]) -> str | None:
        return self._upstream.selected_subprotocol if self._upstream is not None else None

    def _from_app(self, message: str | bytes | None) -> None:
        if message is None:  # the app closed it
            if self.ws_connection is not None:
                self.close()
            return
        PROXY_BYTES.labels(direction="from_sandbox").inc(len(message))
        try:
            self.write_message(message, binary=isinstance(message, bytes))
        except websocket.WebSocketClosedError:
            if self._upstream is not None:
                self._upstream.close()

    async def on_message(self, message: str | bytes) -> None:
        if self._upstream is None:
            return
        PROXY_BYTES.labels(direction="to_sandbox").inc(len(message))
        try:
            await self._upstream.write_message(message, binary=isinstance(message, bytes))
        except websocket.WebSocketClosedError:
            self.close()

    def on_close(self) -> None:
        if self._upstream is not None:
            self._upstream.close()

    def write_error(self, status_code: int, **kwargs: Any) -> None:
        """JSON with a message, as the REST routes answer; never a traceback."""
        self.set_header("Content-Type", "application/json")
        self.clear_header("Content-Security-Policy")
        message = self._reason or "error"
        exc = (kwargs.get("exc_info") or (None, None))[1]
        if isinstance(exc, web.HTTPError) and exc.log_message:
            message = exc.log_message % exc.args if exc.args else exc.log_message
        elif exc is not None and not isinstance(exc, web.HTTPError):
            message = "internal error in the preview proxy; the server log has details"
        self.finish(json.dumps({"message": shorten(message, 400)}))


class AbsoluteProxyHandler(ProxyHandler):
    absolute = True


class GrantedProxyHandler(ProxyHandler):
    granted = True


_ID = r"(?P<sandbox_id>[^/]+)"
_PORT = r"(?P<port>[^/]+)"


class AddSlashHandler(JupyterHandler):
    """``.../{port}`` -> ``.../{port}/`` (relative links of the app need the slash)."""

    async def prepare(self) -> None:  # type: ignore[override]
        await super().prepare(_redirect_to_login=False)  # 403, as the proxy answers

    def get(self, *args: Any, **kwargs: Any) -> None:
        if not self.current_user:
            raise web.HTTPError(403, log_message="authentication required")
        uri = urllib.parse.urlsplit(self.request.uri or "")
        self.redirect(uri.path + "/" + (f"?{uri.query}" if uri.query else ""))


def proxy_handlers() -> list[tuple[str, type[JupyterHandler]]]:
    """Routes relative to the server's base_url (ExtensionApp adds it)."""
    return [
        (rf"/{PROXY_MOUNT}/absolute/{_ID}/{_PORT}/(?P<path>.*)", AbsoluteProxyHandler),
        (rf"/{PROXY_MOUNT}/absolute/{_ID}/{_PORT}", AddSlashHandler),
        (rf"/{PROXY_MOUNT}/{_ID}/{_PORT}/(?P<path>.*)", ProxyHandler),
        (rf"/{PROXY_MOUNT}/{_ID}/{_PORT}", AddSlashHandler),
        (
            rf"/{PREVIEW_MOUNT}/(?P<grant>[A-Za-z0-9_-]+\.[0-9a-f]+)/(?P<path>.*)",
            GrantedProxyHandler,
        ),
    ]
