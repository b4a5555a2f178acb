"""The engine calls of a kernel's start, spoken straight to the engine's Unix socket.

A kernel that starts in a sandbox that already runs makes three engine calls: look
the container up, create a process in it, attach to that process. Through the docker
SDK they cost the kernel its import (``requests``, ``urllib3``: about 60 ms of CPU,
taken while the same process answers Jupyter's first request) and a version
round trip, for requests that are each a few lines of HTTP. So :class:`EngineWire`
makes exactly those calls with the standard library, and the SDK is loaded only when
something else is needed (creating a sandbox, listing, stopping).

It speaks to a local engine only (``unix://``, Docker's default); an engine reached
over TCP, TLS or SSH goes through the SDK for everything. Its refusals carry the
engine's status and message, which :mod:`.docker_errors` turns into ours exactly as it
does the SDK's.
"""

from __future__ import annotations

import http.client
import json
import os
import socket
from typing import Any
from urllib.parse import quote

DEFAULT_SOCKET = "/var/run/docker.sock"
HEADER_LIMIT = 1 << 16  # bytes of an attach response's headers before we call it garbled


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


class EngineWire:
    """A few engine API calls over its Unix socket, one connection per call (as cheap
    as a local socket gets, and safe from any thread)."""

    def __init__(self, path: str) -> None:
        self.path = path

    @classmethod
    def from_env(cls) -> EngineWire | None:
        """The local engine ``DOCKER_HOST`` names (or Docker's default socket), or None
        when it names one reached otherwise (the SDK handles those)."""
        host = os.environ.get("DOCKER_HOST", "")
        if not host:
            return cls(DEFAULT_SOCKET)
        if host.startswith("unix://"):
            return cls(host.removeprefix("unix://"))
        return None

    # -- calls -----------------------------------------------------------------
    def inspect_container(self, name: str, timeout: float) -> dict[str, Any]:
        """``GET /containers/{name}/json``: the same attributes the SDK's model holds."""
        return self._json("GET", f"/containers/{quote(name, safe='')}/json", None, timeout)

    def exec_create(self, container_id: str, config: dict[str, Any], timeout: float) -> str:
        """``POST /containers/{id}/exec``: the new process's exec id (not started yet)."""
        path = f"/containers/{quote(container_id, safe='')}/exec"
        return str(self._json("POST", path, config, timeout)["Id"])

    def exec_inspect(self, exec_id: str, timeout: float = 60.0) -> dict[str, Any]:
        """``GET /exec/{id}/json``: running, exit code, host pid."""
        return self._json("GET", f"/exec/{quote(exec_id, safe='')}/json", None, timeout)

    def exec_start(self, exec_id: str, tty: bool, timeout: float) -> socket.socket:
        """``POST /exec/{id}/start``, upgraded: the process's stdio as a raw socket
        (framed by stream when ``tty`` is false, see :class:`.DockerChannel`).

        The response's headers are read exactly, never past their end: the process's
        first output may follow them in the same packet, and it belongs to the channel.
        """
        body = json.dumps({"Detach": False, "Tty": tty}).encode()
        request = (
            f"POST /exec/{quote(exec_id, safe='')}/start HTTP/1.1\r\n"
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
        status, _, rest = head.partition(b"\r\n")
        code = _status_code(status)
        if code not in (101, 200):
            # An error's JSON body follows; the engine closes the connection after it.
            text = b"".join(iter(lambda: _recv(sock), b"")) if code else b""
            sock.close()
            raise EngineRefused(code, _message(text) or status.decode(errors="replace"))
        return sock

    # -- plumbing --------------------------------------------------------------
    def _json(self, method: str, path: str, body: Any, timeout: float) -> Any:
        conn = _UnixConnection(self.path, timeout)
        try:
            payload = None if body is None else json.dumps(body).encode()
            headers = {"Content-Type": "application/json"} if payload is not None else {}
            conn.request(method, path, body=payload, headers=headers)
            response = conn.getresponse()
            data = response.read()
        except (OSError, http.client.HTTPException) as exc:
            raise EngineSilent(exc) from None
        finally:
            conn.close()
        if response.status >= 400:
            raise EngineRefused(response.status, _message(data) or response.reason)
        return json.loads(data) if data else {}


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
