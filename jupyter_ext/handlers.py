"""REST handlers: parse, authorize, call the service off the event loop, map errors.

Every verb is ``@authenticated`` and ``@authorized`` against the resource
``sandboxes``, so a deployment restricts this API like any other Jupyter API. Domain
errors become statuses with a JSON ``{"message": ...}`` body and never a traceback.
"""

from __future__ import annotations

import asyncio
import errno
import json
import urllib.parse
from collections.abc import Callable
from typing import Any

from jupyter_server.auth.decorator import authorized
from jupyter_server.base.handlers import APIHandler, JupyterHandler
from tornado import web
from tornado.http1connection import HTTP1Connection

from sandbox_kernel.errors import SandboxError, http_status, shorten
from sandbox_kernel.files import RemoteUpload, Upload
from sandbox_kernel.preview import proxy_path
from sandbox_kernel.service import SandboxService

from .metrics import FILE_BYTES

AUTH_RESOURCE = "sandboxes"
DISCARD_SLACK = 64 << 20  # bytes past the upload limit read and dropped to answer 413 cleanly
MESSAGE_LIMIT = 400  # characters of an error message (names in it can be huge)


class BaseHandler(APIHandler):
    """Shared plumbing: the owner of the request, the service, error mapping."""

    auth_resource = AUTH_RESOURCE

    @property
    def service(self) -> SandboxService:
        return self.settings["sandbox_service"]

    @property
    def owner(self) -> str:
        """The sandbox owner this request acts for (see SandboxExtension.owner_from)."""
        return request_owner(self)

    async def call(self, fn: Callable[..., Any], *args: Any) -> Any:
        """Run a service call in a thread (the docker SDK blocks) and map its errors."""
        try:
            return await asyncio.to_thread(fn, *args)
        except SandboxError as exc:
            raise http_error(exc) from None

    def write_error(self, status_code: int, **kwargs: Any) -> None:
        """Always JSON with a message; never a traceback."""
        self.set_header("Content-Type", "application/json")
        message = self._reason or "error"
        exc_info = kwargs.get("exc_info")
        if exc_info and isinstance(exc_info[1], web.HTTPError) and exc_info[1].log_message:
            message = (
                exc_info[1].log_message % exc_info[1].args
                if exc_info[1].args
                else exc_info[1].log_message
            )
        elif exc_info and not isinstance(exc_info[1], web.HTTPError):
            message = "internal error in the sandbox API; the server log has details"
        self.finish(json.dumps({"message": shorten(message, MESSAGE_LIMIT)}))

    def json_body(self) -> dict[str, Any]:
        try:
            body = json.loads(self.request.body or b"{}")
        except (ValueError, UnicodeDecodeError, RecursionError):
            raise web.HTTPError(
                400, log_message="the body is not valid JSON (or is nested too deeply)"
            ) from None
        if not isinstance(body, dict):
            raise web.HTTPError(400, log_message="the body must be a JSON object")
        return body

    def reply(self, data: Any, status: int = 200) -> None:
        self.set_status(status)
        self.set_header("Content-Type", "application/json")
        self.finish(json.dumps(data))


def request_owner(handler: JupyterHandler) -> str:
    """The sandbox owner a request acts for (see SandboxExtension.owner_from)."""
    return handler.settings.get("sandbox_owner") or handler.current_user.username


def request_is_admin(handler: JupyterHandler) -> bool:
    """Whether a request is an administrator's: a user ``SandboxExtension.admin_users``
    names or, when it names none, the owner of a single-user server (owner_from =
    "server": every request acts for that user)."""
    admins = handler.settings.get("sandbox_admin_users") or ()
    if admins:
        return handler.current_user.username in admins
    return bool(handler.settings.get("sandbox_owner"))


def http_error(exc: SandboxError) -> web.HTTPError:
    """The HTTP error of a domain error: its status, its message, never a traceback."""
    status = http_status(exc)
    # log_message is %-formatted by tornado's logger: keep the text out of the format.
    return web.HTTPError(status, "%s", shorten(str(exc), MESSAGE_LIMIT), reason=_reason(exc))


def _reason(exc: Exception) -> str:
    """An HTTP reason phrase: one line, latin-1, short."""
    text = (str(exc).splitlines() or [type(exc).__name__])[0]
    return shorten(text, 120).encode("latin-1", "replace").decode("latin-1")


class SandboxesHandler(BaseHandler):
    @web.authenticated
    @authorized
    async def get(self) -> None:
        self.reply(await self.call(self.service.list, self.owner))

    @web.authenticated
    @authorized
    async def post(self) -> None:
        snapshot = self.json_body().get("snapshot")
        self.reply(
            await self.call(self.service.create_from_snapshot, self.owner, snapshot), status=201
        )


class SandboxHandler(BaseHandler):
    @web.authenticated
    @authorized
    async def get(self, sandbox_id: str) -> None:
        self.reply(await self.call(self.service.get, self.owner, sandbox_id))

    @web.authenticated
    @authorized
    async def delete(self, sandbox_id: str) -> None:
        await self.call(self.service.destroy, self.owner, sandbox_id)
        self.set_status(204)
        self.finish()


class SandboxActionHandler(BaseHandler):
    @web.authenticated
    @authorized
    async def post(self, sandbox_id: str, action: str) -> None:
        fn = self.service.stop if action == "stop" else self.service.start
        self.reply(await self.call(fn, self.owner, sandbox_id))


class FolderHandler(BaseHandler):
    @web.authenticated
    @authorized
    async def get(self, sandbox_id: str) -> None:
        path = self.get_argument("path", "")
        workspace = await self.call(self.service.workspace, self.owner, sandbox_id)
        entries, truncated = await self.call(workspace.list, path)
        self.reply(
            {"path": path, "entries": [e.to_dict() for e in entries], "truncated": truncated}
        )


@web.stream_request_body
class FileHandler(BaseHandler):
    """Download, upload (raw body, streamed to a temporary file), delete.

    An upload's bytes go to disk as they arrive (never whole in memory); past the size
    limit the rest of the body is read and dropped, so the client gets its 413 instead
    of a reset connection, and the temporary file is removed at once.
    """

    _upload: Upload | RemoteUpload | None = None
    _refused: web.HTTPError | None = None

    async def prepare(self) -> None:  # type: ignore[override]  # APIHandler's takes no arguments
        # With a streamed body, put() runs only after the body arrived: check who is
        # asking and how much before a byte is written.
        await super().prepare()
        if self.request.method != "PUT":
            return
        if not self.current_user:
            raise web.HTTPError(403, log_message="authentication required")
        if not self.authorizer.is_authorized(self, self.current_user, "write", AUTH_RESOURCE):
            raise web.HTTPError(403, log_message="not allowed to write sandbox files")
        limit = self.settings["sandbox_max_upload"]
        declared = self.request.headers.get("Content-Length")
        if declared is not None and not declared.strip().isdigit():
            raise web.HTTPError(
                400, log_message="the Content-Length header is not a number of bytes"
            )
        length = int(declared or 0)
        if length > limit:
            raise web.HTTPError(
                413, log_message=f"the file is {length} bytes; the limit is {limit} bytes"
            )
        # Bodies of unknown length (chunked) are checked as they come; a body far past
        # the limit is cut off rather than read forever.
        if isinstance(self.request.connection, HTTP1Connection):
            self.request.connection.set_max_body_size(2 * limit + DISCARD_SLACK)
        workspace = await self.call(
            self.service.workspace, self.owner, self.path_kwargs["sandbox_id"]
        )
        self._upload = await self.call(workspace.start_upload, self.path_kwargs["path"])

    def data_received(self, chunk: bytes) -> None:
        if self._upload is None:
            return
        if self._upload.size + len(chunk) > self.settings["sandbox_max_upload"]:
            self._drop_upload()
            limit = self.settings["sandbox_max_upload"]
            self._refused = web.HTTPError(
                413, log_message=f"the upload passed the size limit of {limit} bytes"
            )
            return
        try:
            self._upload.write(chunk)
        except SandboxError as exc:  # the disk is full (507)
            self._drop_upload()
            self._refused = http_error(exc)
        except OSError as exc:
            self._drop_upload()
            self._refused = web.HTTPError(
                507 if exc.errno in (errno.ENOSPC, errno.EDQUOT) else 500,
                "%s",
                f"could not write the upload: {exc.strerror}",
            )

    def _drop_upload(self) -> None:
        if self._upload is not None:
            upload, self._upload = self._upload, None
            upload.abort()

    def on_connection_close(self) -> None:
        self._drop_upload()

    def on_finish(self) -> None:
        self._drop_upload()  # a request that ended in an error never leaves a temporary

    @web.authenticated
    @authorized
    async def put(self, sandbox_id: str, path: str) -> None:
        if self._refused is not None:
            raise self._refused
        if self._upload is None:
            raise web.HTTPError(400, log_message="the upload was not received")
        upload, self._upload = self._upload, None
        try:
            size = await self.call(upload.commit)
        finally:
            upload.abort()  # no-op after a commit; removes the temporary after a failure
        FILE_BYTES.labels(door="rest", direction="upload").inc(size)
        self.reply({"path": path, "size": size}, status=201)

    @web.authenticated
    @authorized
    async def get(self, sandbox_id: str, path: str) -> None:
        workspace = await self.call(self.service.workspace, self.owner, sandbox_id)
        size, chunks = await self.call(workspace.open_read, path)
        name = path.rsplit("/", 1)[-1]
        self.set_header("Content-Type", "application/octet-stream")
        self.set_header("Content-Length", str(size))
        self.set_header(
            "Content-Disposition", f"attachment; filename*=UTF-8''{urllib.parse.quote(name)}"
        )
        try:
            while True:
                # Reads happen off the event loop: a slow disk never stalls other requests.
                chunk = await asyncio.to_thread(next, chunks, None)
                if chunk is None:
                    break
                FILE_BYTES.labels(door="rest", direction="download").inc(len(chunk))
                self.write(chunk)
                await self.flush()
        except SandboxError as exc:
            # Headers (and the length) are sent: the only honest end is a cut connection.
            self.log.warning("download of %s cut short: %s", shorten(path), exc)
            if isinstance(self.request.connection, HTTP1Connection):
                self.request.connection.close()
            return
        finally:
            chunks.close()  # the file's descriptor, also when the client went away
        self.finish()

    @web.authenticated
    @authorized
    async def delete(self, sandbox_id: str, path: str) -> None:
        workspace = await self.call(self.service.workspace, self.owner, sandbox_id)
        await self.call(workspace.delete, path)
        self.set_status(204)
        self.finish()


class SnapshotsHandler(BaseHandler):
    @web.authenticated
    @authorized
    async def get(self) -> None:
        self.reply(await self.call(self.service.snapshots, self.owner))


class SandboxSnapshotsHandler(BaseHandler):
    @web.authenticated
    @authorized
    async def post(self, sandbox_id: str) -> None:
        name = self.json_body().get("name")
        self.reply(
            await self.call(self.service.create_snapshot, self.owner, sandbox_id, name), status=201
        )


class SnapshotHandler(BaseHandler):
    @web.authenticated
    @authorized
    async def delete(self, name: str) -> None:
        await self.call(self.service.delete_snapshot, self.owner, name)
        self.set_status(204)
        self.finish()


class PortsHandler(BaseHandler):
    """The ports listening in a sandbox, each with its preview URL (never wakes it)."""

    @web.authenticated
    @authorized
    async def get(self, sandbox_id: str) -> None:
        found = await self.call(self.service.ports, self.owner, sandbox_id)
        for entry in found["ports"]:
            entry["url"] = proxy_path(self.base_url, found["sandbox_id"], entry["port"])
        self.reply(found)


class StatsHandler(BaseHandler):
    @web.authenticated
    @authorized
    async def get(self) -> None:
        self.reply(await self.call(self.service.stats, self.owner))


_ID = r"(?P<sandbox_id>[^/]+)"


def handlers() -> list[tuple[str, type[BaseHandler]]]:
    """Routes relative to the server's base_url (ExtensionApp adds it)."""
    return [
        (r"/api/sandboxes", SandboxesHandler),
        (r"/api/sandboxes-stats", StatsHandler),
        (rf"/api/sandboxes/{_ID}", SandboxHandler),
        (rf"/api/sandboxes/{_ID}/(?P<action>stop|start)", SandboxActionHandler),
        (rf"/api/sandboxes/{_ID}/files", FolderHandler),
        (rf"/api/sandboxes/{_ID}/files/(?P<path>.+)", FileHandler),
        (rf"/api/sandboxes/{_ID}/snapshots", SandboxSnapshotsHandler),
        (rf"/api/sandboxes/{_ID}/ports", PortsHandler),
        (r"/api/snapshots", SnapshotsHandler),
        (r"/api/snapshots/(?P<name>[^/]+)", SnapshotHandler),
    ]
