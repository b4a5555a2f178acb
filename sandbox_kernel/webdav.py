"""WebDAV over a sandbox's workspace: a WsgiDAV provider on the confined file layer.

WsgiDAV speaks the protocol (PROPFIND XML, ranges, locks, If headers, Overwrite and
Depth rules); every byte it reads or writes goes through the same
:class:`~sandbox_kernel.files.Workspace` (or ``RemoteWorkspace``) as the REST routes,
so the boundary is the one already hardened: descriptor-relative, no link followed,
FIFOs refused, uploads through exclusive temporaries renamed into place.

WebDAV has no notion of a symbolic link or a FIFO, so those are left out of listings
and answer 404; a PUT onto one is refused by the file layer. The caller (the server
extension) decides who may reach which sandbox and puts the workspace it resolved
into the WSGI environ; this module never looks up owners itself.
"""

from __future__ import annotations

import functools
import hashlib
import mimetypes
from collections.abc import Callable
from typing import Any, BinaryIO, TypeVar

from wsgidav.dav_error import (
    HTTP_FORBIDDEN,
    DAVError,
    PRECONDITION_CODE_PropfindFiniteDepth,
)
from wsgidav.dav_provider import DAVCollection, DAVNonCollection, DAVProvider
from wsgidav.error_printer import ErrorPrinter
from wsgidav.request_resolver import RequestResolver
from wsgidav.wsgidav_app import WsgiDAVApp

from .errors import BadRequest, FileMissing, SandboxError, http_status
from .files import Entry, RemoteWorkspace, Workspace
from .safefs import TEMP_PREFIX

ENV_WORKSPACE = "sandbox_kernel.workspace"  # the Workspace of the request's sandbox
ENV_SANDBOX = "sandbox_kernel.sandbox_id"  # its id: the first path component
BLOCK_SIZE = 1 << 20  # bytes per read and per response chunk

AnyWorkspace = Workspace | RemoteWorkspace
T = TypeVar("T")

# How the file layer's refusals read to a WebDAV client. Requests that reach here are
# well-formed; a refusal (a link on the way, a folder in the way) is a 403, not a 400.
# A path WsgiDAV may not touch is 403 for WebDAV clients (REST says 400).
_OVERRIDES: dict[type[SandboxError], int] = {BadRequest: HTTP_FORBIDDEN}


def as_dav_error(exc: SandboxError) -> DAVError:
    return DAVError(http_status(exc, _OVERRIDES), context_info=str(exc))


def _mapped(fn: Callable[..., T]) -> Callable[..., T]:
    """Turn the file layer's errors into DAVErrors WsgiDAV answers with (never a 500)."""

    @functools.wraps(fn)
    def call(*args: Any, **kwargs: Any) -> T:
        try:
            return fn(*args, **kwargs)
        except SandboxError as exc:
            raise as_dav_error(exc) from None

    return call


def _shown(entry: Entry) -> bool:
    """What a WebDAV listing shows: files and folders, not links, FIFOs or our temporaries."""
    return entry.type in ("file", "directory") and not entry.name.startswith(TEMP_PREFIX)


class _Resource:
    """What files and folders share: where they are and how they were found."""

    path: str
    environ: dict[str, Any]

    def _setup(self, rel: str, entry: Entry | None) -> None:
        self.rel = rel
        self.entry = entry  # None: a file being created by this request

    @property
    def workspace(self) -> AnyWorkspace:
        return self.environ[ENV_WORKSPACE]

    def _target(self, dest_path: str) -> str:
        rel = _relative(dest_path, self.environ)
        if rel is None:
            raise DAVError(HTTP_FORBIDDEN, context_info="the destination is not in the sandbox")
        return rel

    def get_last_modified(self) -> float | None:
        return self.entry.modified if self.entry else None

    def get_creation_date(self) -> float | None:
        return self.get_last_modified()

    def support_recursive_move(self, dest_path: str) -> bool:
        return True  # one rename, whatever the size of the tree

    @_mapped
    def move_recursive(self, dest_path: str) -> list[Any]:
        self.workspace.move(self.rel, self._target(dest_path))
        self._forget()
        return []

    def _forget(self) -> None:
        """Drop the locks and dead properties WsgiDAV kept for what was removed."""
        self.remove_all_locks(recursive=True)  # type: ignore[attr-defined]
        self.remove_all_properties(recursive=True)  # type: ignore[attr-defined]


class FileResource(_Resource, DAVNonCollection):
    def __init__(self, path: str, environ: dict[str, Any], rel: str, entry: Entry | None):
        super().__init__(path, environ)
        self._setup(rel, entry)
        self._upload: Any = None

    def get_content_length(self) -> int:
        return self.entry.size if self.entry else 0

    def get_content_type(self) -> str:
        return mimetypes.guess_type(self.name)[0] or "application/octet-stream"

    def get_etag(self) -> str | None:
        if self.entry is None:
            return None
        stamp = f"{self.rel}\0{self.entry.size}\0{self.entry.modified!r}"
        return hashlib.sha1(stamp.encode("utf-8", "surrogateescape")).hexdigest()[:24]

    def support_etag(self) -> bool:
        return True

    def support_ranges(self) -> bool:
        return True

    @_mapped
    def get_content(self) -> BinaryIO:
        return self.workspace.open_file(self.rel)

    @_mapped
    def begin_write(self, *, content_type: str | None = None) -> Any:
        self._upload = self.workspace.start_upload(self.rel)
        return _Writer(self._upload)

    @_mapped
    def end_write(self, *, with_errors: bool) -> None:
        upload, self._upload = self._upload, None
        if upload is None:
            return
        try:
            if not with_errors:
                upload.commit()
        finally:
            upload.abort()  # a no-op after a commit
        if not with_errors:
            self.entry = self.workspace.stat(self.rel)

    @_mapped
    def delete(self) -> None:
        self.workspace.remove(self.rel)
        self._forget()

    @_mapped
    def copy_move_single(self, dest_path: str, *, is_move: bool) -> None:
        if is_move:
            self.workspace.move(self.rel, self._target(dest_path))
        else:
            self.workspace.copy_file(self.rel, self._target(dest_path))


class FolderResource(_Resource, DAVCollection):
    def __init__(self, path: str, environ: dict[str, Any], rel: str, entry: Entry | None):
        super().__init__(path, environ)
        self._setup(rel, entry)

    def get_display_info(self) -> dict[str, str]:
        return {"type": "Directory"}

    def _child(self, name: str) -> str:
        return f"{self.rel}/{name}" if self.rel else name

    def _child_path(self, name: str) -> str:
        return self.path.rstrip("/") + "/" + name

    @_mapped
    def get_member_list(self) -> list[Any]:
        """One folder read for a whole PROPFIND depth 1, not one lookup per member."""
        entries, _ = self.workspace.list(self.rel)
        members: list[Any] = []
        for entry in filter(_shown, entries):
            kind = FolderResource if entry.type == "directory" else FileResource
            members.append(
                kind(self._child_path(entry.name), self.environ, self._child(entry.name), entry)
            )
        return members

    def get_member_names(self) -> list[str]:
        return [member.name for member in self.get_member_list()]

    def get_member(self, name: str) -> Any:
        return self.provider.get_resource_inst(self._child_path(name), self.environ)

    @_mapped
    def create_empty_resource(self, name: str) -> FileResource:
        """A new file. For a PUT nothing is written until its body has fully arrived (no
        empty file left by a broken upload); a LOCK of a new name makes an empty file."""
        rel = self._child(name)
        if self.environ.get("REQUEST_METHOD") != "PUT":
            upload = self.workspace.start_upload(rel)
            try:
                upload.commit()
            finally:
                upload.abort()
            return FileResource(self._child_path(name), self.environ, rel, self.workspace.stat(rel))
        return FileResource(self._child_path(name), self.environ, rel, None)

    @_mapped
    def create_collection(self, name: str) -> None:
        self.workspace.make_folder(self._child(name))

    def support_recursive_delete(self) -> bool:
        return True

    @_mapped
    def delete(self) -> None:
        self.workspace.remove(self.rel)  # refuses the workspace itself
        self._forget()

    @_mapped
    def copy_move_single(self, dest_path: str, *, is_move: bool) -> None:
        # Collections are copied one level at a time by WsgiDAV: make the folder only.
        self.workspace.make_folder(self._target(dest_path))


class _Writer:
    """What WsgiDAV writes a PUT body into; committing is ``end_write``'s decision."""

    def __init__(self, upload: Any) -> None:
        self._upload = upload

    @_mapped
    def write(self, chunk: bytes) -> None:
        self._upload.write(chunk)

    def close(self) -> None:
        pass


def _relative(path: str, environ: dict[str, Any]) -> str | None:
    """The workspace-relative path of ``/<sandbox id>/<path>``; None for another sandbox."""
    sandbox, _, rest = path.lstrip("/").partition("/")
    if not sandbox:
        return None  # the root above the sandboxes (a parent WsgiDAV asks about)
    if sandbox != environ.get(ENV_SANDBOX):
        # Only a Destination header can name another sandbox.
        raise DAVError(HTTP_FORBIDDEN, context_info="copy and move stay within one sandbox")
    return rest.strip("/")


class WorkspaceProvider(DAVProvider):
    """Maps ``/<sandbox id>/<path>`` to the request's workspace (put in the environ)."""

    def is_readonly(self) -> bool:
        return False

    def custom_request_handler(
        self, environ: dict[str, Any], start_response: Any, default_handler: Any
    ) -> Any:
        """Refuse PROPFIND of a whole tree (RFC 4918 9.1 lets a server): the sandbox can
        fill its workspace with millions of files, and the answer is built in memory.
        (Of a file, Depth: infinity means the file alone, and is served.)"""
        depth = environ.get("HTTP_DEPTH", "infinity").strip().lower()
        if (
            environ.get("REQUEST_METHOD") == "PROPFIND"
            and depth == "infinity"
            and self._folder(environ["PATH_INFO"], environ)
        ):
            raise DAVError(
                HTTP_FORBIDDEN,
                context_info="PROPFIND of a whole tree (Depth: infinity, or no Depth) is not "
                "served; ask for one level at a time with Depth: 1",
                err_condition=PRECONDITION_CODE_PropfindFiniteDepth,
            )
        return default_handler(environ, start_response)

    def _folder(self, path: str, environ: dict[str, Any]) -> bool:
        found = self.get_resource_inst(path, environ)
        return found is not None and found.is_collection

    @_mapped
    def get_resource_inst(self, path: str, environ: dict[str, Any]) -> Any:
        rel = _relative(path, environ)
        if rel is None:
            return None
        try:
            entry = environ[ENV_WORKSPACE].stat(rel)
        except FileMissing:
            return None
        if entry.type == "directory":
            return FolderResource(path, environ, rel, entry)
        if entry.type == "file" and not entry.name.startswith(TEMP_PREFIX):
            return FileResource(path, environ, rel, entry)
        return None  # links, FIFOs, sockets, devices: not part of the drive


def make_app(mount_path: str) -> WsgiDAVApp:
    """The WsgiDAV application serving every sandbox below ``mount_path``.

    Authentication and ownership are the server's (Jupyter's); WsgiDAV's own
    authenticator, directory browser and CORS middleware are left out.
    """
    config = {
        "mount_path": mount_path.rstrip("/"),
        "provider_mapping": {"/": WorkspaceProvider()},
        "middleware_stack": [ErrorPrinter, RequestResolver],
        "http_authenticator": {"domain_controller": None},
        "simple_dc": {"user_mapping": {"*": True}},
        "lock_storage": True,
        "property_manager": None,
        "block_size": BLOCK_SIZE,
        "hotfixes": {"emulate_win32_lastmod": True, "re_encode_path_info": True},
        "verbose": 1,
        "logging": {"enable": False},
        "suppress_version_info": True,
        "dir_browser": {"enable": False},
    }
    return WsgiDAVApp(config)
