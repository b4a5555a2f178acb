"""The engine calls the Docker backend makes on a kernel's path, as plain HTTP.

A kernel's start makes a few engine calls: look the container up, start a process
in it and attach to it, and when there is no sandbox yet, inspect the image, create
the container, copy its home folder in, start it. Through the docker SDK they cost the
kernel the SDK's import (``requests``, ``urllib3``: about 60 ms of CPU, taken while the
same process imports and starts Jupyter's side) and a version round trip, for requests
of a few lines each. So :class:`EngineCalls` states each of those calls once, as a
request, and two transports carry them:

* :class:`EngineWire`: the standard library over a local engine's Unix socket
  (``unix://``, Docker's default), so the kernel's path never loads the SDK;
* :class:`SdkCalls`: the SDK's own HTTP session, for an engine reached over TCP, TLS
  or SSH.

Everything else (pulling, snapshots, stats, stopping) stays with the SDK. Refusals
carry the engine's status and message (the SDK's own errors, through the SDK), which
:mod:`.errors` turns into ours alike.
"""

from __future__ import annotations

import http.client
import json
import os
import re
import socket
from abc import ABC, abstractmethod
from typing import Any
from urllib.parse import quote, urlencode

DEFAULT_SOCKET = "/var/run/docker.sock"
ENGINE_TIMEOUT = 60  # seconds an engine call may take unless its caller says otherwise
HEADER_LIMIT = 1 << 16  # bytes of an attach response's headers before we call it garbled
ERROR_BODY_LIMIT = 1 << 16  # bytes of a refused attach's explanation read


class EngineRefused(Exception):
    """The engine answered with an error status (the SDK's ``APIError``, in our terms)."""

    def __init__(self, status: int, explanation: str) -> None:
        super().__init__(f"{status}: {explanation}")
        self.status_code = status
        self.explanation = explanation


class EngineSilent(OSError):
    """The engine's socket did not answer: absent, refused, or no reply in time."""

    def __init__(self, why: BaseException | str) -> None:
        super().__init__(str(why) or type(why).__name__)
        self.timed_out = isinstance(why, TimeoutError)


class _UnixConnection(http.client.HTTPConnection):
    def __init__(self, path: str, timeout: float) -> None:
        super().__init__("localhost", timeout=timeout)
        self._path = path

    def connect(self) -> None:
        sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        sock.settimeout(self.timeout)
        try:
            sock.connect(self._path)
        except OSError:
            sock.close()
            raise
        self.sock = sock


def _q(part: str) -> str:
    return quote(part, safe="")


class EngineCalls(ABC):
    """The engine API calls of the backend's own paths, each stated once as a request
    (method, path, query, body); a transport supplies :meth:`_send` and
    :meth:`exec_start`."""

    def request(
        self,
        method: str,
        path: str,
        *,
        params: dict[str, str] | None = None,
        body: Any = None,
        tar: bytes | None = None,
        timeout: float = ENGINE_TIMEOUT,
    ) -> Any:
        """One call (a JSON ``body`` or a ``tar`` stream); its decoded JSON answer (None
        when it has none)."""
        headers: dict[str, str] = {}
        payload: bytes | None = None
        if tar is not None:
            payload, headers["Content-Type"] = tar, "application/x-tar"
        elif body is not None:
            payload, headers["Content-Type"] = json.dumps(body).encode(), "application/json"
        content_type, data = self._send(method, path, params or {}, payload, headers, timeout)
        if not data or "json" not in content_type:
            return None
        return json.loads(data)

    @abstractmethod
    def _send(
        self,
        method: str,
        path: str,
        params: dict[str, str],
        payload: bytes | None,
        headers: dict[str, str],
        timeout: float,
        limit: int = 0,
    ) -> tuple[str, bytes]:
        """Send one request; (the answer's content type, its body, or its first ``limit``
        bytes when that is not 0); a refusal raises."""

    @abstractmethod
    def exec_start(self, exec_id: str, tty: bool, timeout: float) -> tuple[socket.socket, Any]:
        """``POST /exec/{id}/start``, upgraded: (the process's stdio as a raw socket,
        framed by stream when ``tty`` is false; what must stay referenced while it is
        used)."""

    # -- containers ------------------------------------------------------------
    def inspect_container(self, name: str, timeout: float = ENGINE_TIMEOUT) -> dict[str, Any]:
        """The same attributes the SDK's container model holds."""
        return dict(self.request("GET", f"/containers/{_q(name)}/json", timeout=timeout))

    def list_containers(self, filters: dict[str, list[str]]) -> list[dict[str, Any]]:
        """Summaries of every container (running or not) that matches ``filters``."""
        params = {"all": "1", "filters": json.dumps(filters)}
        return list(self.request("GET", "/containers/json", params=params))

    def create_container(self, name: str, config: dict[str, Any]) -> str:
        """A new container (not started); its engine id."""
        return str(
            self.request("POST", "/containers/create", params={"name": name}, body=config)["Id"]
        )

    def put_archive(self, container_id: str, path: str, tar: bytes) -> None:
        """Unpack ``tar`` at ``path`` in the container (running or not)."""
        self.request(
            "PUT", f"/containers/{_q(container_id)}/archive", params={"path": path}, tar=tar
        )

    def get_archive(self, container_id: str, path: str, limit: int) -> bytes:
        """The first ``limit`` bytes (at most) of the tar the engine makes of ``path`` in
        the container; the rest is never read (a folder's tar holds all beneath it)."""
        return self._send(
            "GET",
            f"/containers/{_q(container_id)}/archive",
            {"path": path},
            None,
            {},
            ENGINE_TIMEOUT,
            limit,
        )[1]

    def start_container(self, container_id: str) -> None:
        self.request("POST", f"/containers/{_q(container_id)}/start")

    def unpause_container(self, container_id: str) -> None:
        self.request("POST", f"/containers/{_q(container_id)}/unpause")

    # -- processes -------------------------------------------------------------
    def exec_create(
        self, container_id: str, config: dict[str, Any], timeout: float = ENGINE_TIMEOUT
    ) -> str:
        """A new process in the container (not started yet); its exec id."""
        path = f"/containers/{_q(container_id)}/exec"
        return str(self.request("POST", path, body=config, timeout=timeout)["Id"])

    def exec_inspect(self, exec_id: str, timeout: float = ENGINE_TIMEOUT) -> dict[str, Any]:
        """Running, exit code, host pid."""
        return dict(self.request("GET", f"/exec/{_q(exec_id)}/json", timeout=timeout))

    # -- the engine ------------------------------------------------------------
    def inspect_image(self, name: str) -> dict[str, Any]:
        return dict(self.request("GET", f"/images/{_q(name)}/json"))

    def inspect_network(self, name: str) -> dict[str, Any]:
        return dict(self.request("GET", f"/networks/{_q(name)}"))

    def create_network(self, config: dict[str, Any]) -> None:
        self.request("POST", "/networks/create", body=config)

    def info(self) -> dict[str, Any]:
        return dict(self.request("GET", "/info"))


class EngineWire(EngineCalls):
    """The calls over a local engine's Unix socket, one connection per call (as cheap
    as a local socket gets, and safe from any thread)."""

    def __init__(self, path: str) -> None:
        self.path = path

    @classmethod
    def from_env(cls) -> EngineWire | None:
        """The local engine ``DOCKER_HOST`` names (or Docker's default socket), or None
        when it names one reached otherwise (the SDK carries those calls)."""
        host = os.environ.get("DOCKER_HOST", "")
        if not host:
            return cls(DEFAULT_SOCKET)
        if host.startswith("unix://"):
            return cls(host.removeprefix("unix://"))
        return None

    def _send(
        self,
        method: str,
        path: str,
        params: dict[str, str],
        payload: bytes | None,
        headers: dict[str, str],
        timeout: float,
        limit: int = 0,
    ) -> tuple[str, bytes]:
        if params:
            path = f"{path}?{urlencode(params)}"
        conn = _UnixConnection(self.path, timeout)
        try:
            conn.request(method, path, body=payload, headers=headers)
            response = conn.getresponse()
            ok = 200 <= response.status < 300
            data = _read_up_to(response, limit) if limit and ok else response.read()
            response.close()
        except (OSError, http.client.HTTPException) as exc:
            raise EngineSilent(exc) from None
        finally:
            conn.close()
        if not (200 <= response.status < 300 or response.status == 304):  # 304: nothing to do
            raise EngineRefused(response.status, _message(data) or response.reason)
        return response.getheader("Content-Type") or "", data

    def exec_start(self, exec_id: str, tty: bool, timeout: float) -> tuple[socket.socket, Any]:
        """Reads the answer's headers exactly, never past their end: the process's first
        output may follow them in the same packet, and it belongs to the channel."""
        body = json.dumps({"Detach": False, "Tty": tty}).encode()
        request = (
            f"POST /exec/{_q(exec_id)}/start HTTP/1.1\r\n"
            "Host: localhost\r\nContent-Type: application/json\r\n"
            f"Content-Length: {len(body)}\r\nConnection: Upgrade\r\nUpgrade: tcp\r\n\r\n"
        ).encode() + body
        sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        sock.settimeout(timeout)
        try:
            sock.connect(self.path)
            sock.sendall(request)
            head = _read_head(sock)
        except OSError as exc:
            sock.close()
            raise EngineSilent(exc) from None
        status, _, _ = head.partition(b"\r\n")
        code = _status_code(status)
        if code not in (101, 200):
            text = _error_body(sock, head)
            sock.close()
            raise EngineRefused(code, _message(text) or status.decode(errors="replace"))
        return sock, None


class SdkCalls(EngineCalls):
    """The calls through the docker SDK's HTTP session (its errors are its own, which
    :mod:`.errors` knows), for engines the wire cannot reach."""

    def __init__(self, api: Any) -> None:
        self.api = api

    def _send(
        self,
        method: str,
        path: str,
        params: dict[str, str],
        payload: bytes | None,
        headers: dict[str, str],
        timeout: float,
        limit: int = 0,
    ) -> tuple[str, bytes]:
        api = self.api
        url = f"{api.base_url}/v{api.api_version}{path}"
        # The client's own patience bounds every call too (an administrator's, or a test's).
        patience = min(timeout, api.timeout) if api.timeout else timeout
        response = api.request(
            method,
            url,
            params=params,
            data=payload,
            headers=headers,
            timeout=patience,
            stream=bool(limit),
        )
        try:
            api._raise_for_status(response)
            data = (
                _read_up_to(response.raw, limit, decode_content=True) if limit else response.content
            )
        finally:
            response.close()
        return response.headers.get("Content-Type", ""), data

    def exec_start(self, exec_id: str, tty: bool, timeout: float) -> tuple[socket.socket, Any]:
        # The SDK's wrapper holds the HTTP response; once that is garbage-collected it
        # closes the connection under us (an EOF mid-session, at a random moment).
        wrapper = self.api.exec_start(exec_id, socket=True, tty=tty, demux=False)
        return getattr(wrapper, "_sock", wrapper), wrapper


def _recv(sock: socket.socket) -> bytes:
    try:
        return sock.recv(65536)
    except OSError:
        return b""


def _read_head(sock: socket.socket) -> bytes:
    """An HTTP response's status line and headers, consumed up to their blank line only."""
    head = b""
    while True:
        peeked = sock.recv(HEADER_LIMIT, socket.MSG_PEEK)
        if not peeked:
            raise EngineSilent("the engine closed the connection before answering")
        end = (head[-3:] + peeked).find(b"\r\n\r\n")
        if end >= 0:
            take = end + 4 - len(head[-3:])
            head += _recv_exactly(sock, take)
            return head
        if len(head) + len(peeked) > HEADER_LIMIT:
            raise EngineSilent("the engine's answer has no end of headers")
        head += _recv_exactly(sock, len(peeked))


def _error_body(sock: socket.socket, head: bytes) -> bytes:
    """The body of a refused attach, which the engine sends before it would have taken
    the connection over, and keeps the connection open after: read what its length
    says (a chunked one, whatever comes within a second), never until the end."""
    length = re.search(rb"\r\ncontent-length:\s*(\d+)", head, re.IGNORECASE)
    try:
        if length:
            return _recv_exactly(sock, min(int(length.group(1)), ERROR_BODY_LIMIT))
        sock.settimeout(1.0)
        return sock.recv(ERROR_BODY_LIMIT)
    except OSError:
        return b""


def _read_up_to(stream: Any, limit: int, **how: Any) -> bytes:
    """At most ``limit`` bytes of an answer's body: fewer only at its end."""
    data = bytearray()
    while len(data) < limit:
        chunk = stream.read(min(limit - len(data), 1 << 20), **how)
        if not chunk:
            break
        data += chunk
    return bytes(data)


def _recv_exactly(sock: socket.socket, size: int) -> bytes:
    data = bytearray()
    while len(data) < size:
        chunk = sock.recv(size - len(data))
        if not chunk:
            raise EngineSilent("the engine closed the connection mid-answer")
        data += chunk
    return bytes(data)


def _status_code(line: bytes) -> int:
    parts = line.split(None, 2)
    try:
        return int(parts[1])
    except (IndexError, ValueError):
        return 0


def _message(data: bytes) -> str:
    """The engine's ``{"message": ...}``, or its body as text."""
    try:
        decoded = json.loads(data)
    except ValueError:
        return data.decode(errors="replace").strip()
    if isinstance(decoded, dict) and isinstance(decoded.get("message"), str):
        return str(decoded["message"])
    return data.decode(errors="replace").strip()
