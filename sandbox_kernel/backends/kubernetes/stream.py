"""Processes in a pod through the API server's exec subresource, over a WebSocket.

The stream protocol ``v5.channel.k8s.io`` (Kubernetes 1.30 and later; ``v4`` is the
fallback) multiplexes the process's stdin (channel 0), stdout (1), stderr (2), its end
status (3, JSON) and terminal resizes (4) over one connection, one byte of channel in
front of each message; v5 adds "close this channel" (255), which is how stdin reaches
EOF while stdout still flows. Over v4 stdin ends only with the connection.

:class:`ExecChannel` is a kernel's interpreter channel (stdin and stdout, stderr kept
apart for diagnosis); :class:`ExecPty` a terminal (``tty=true``: one byte stream,
resized through channel 4).
"""

from __future__ import annotations

import json
import threading
from typing import Any

from ..base import Channel, Pty, SandboxError
from .client import Api, q
from .websocket import OP_CLOSE, HandshakeRefused, WebSocket

STDIN, STDOUT, STDERR, STATUS, RESIZE, CLOSE = 0, 1, 2, 3, 4, 255
PROTOCOLS = ["v5.channel.k8s.io", "v4.channel.k8s.io"]
STDERR_KEPT = 64 << 10  # bytes of a channel's stderr kept for diagnosis


class ExecStream:
    """One exec: messages in, messages out, and its end status."""

    def __init__(self, ws: WebSocket) -> None:
        self.ws = ws
        self.status: dict[str, Any] | None = None

    @classmethod
    def open(
        cls,
        api: Api,
        namespace: str,
        pod: str,
        container: str,
        cmd: list[str],
        *,
        stdin: bool,
        tty: bool = False,
        timeout: float = 30.0,
    ) -> ExecStream:
        params: dict[str, Any] = {
            "container": container,
            "command": cmd,
            "stdin": "true" if stdin else "false",
            "stdout": "true",
            "stderr": "false" if tty else "true",
            "tty": "true" if tty else "false",
        }
        url = api.url(f"/api/v1/namespaces/{q(namespace)}/pods/{q(pod)}/exec", params)
        try:
            ws = WebSocket.connect(
                url,
                headers=api.headers(),
                protocols=PROTOCOLS,
                context=api.context,
                timeout=timeout,
            )
        except HandshakeRefused as exc:
            from .client import error_of

            raise error_of(exc.status, exc.body, f"run a process in pod {pod}") from None
        except OSError as exc:
            raise SandboxError(f"cannot open a process stream to pod {pod}: {exc}") from None
        return cls(ws)

    @property
    def closes_stdin(self) -> bool:
        """Whether stdin can end on its own (v5), before the connection does."""
        return self.ws.protocol.startswith("v5")

    def send(self, channel: int, data: bytes) -> None:
        self.ws.send(bytes([channel]) + data)

    def close_stdin(self) -> None:
        if self.closes_stdin:
            try:
                self.ws.send(bytes([CLOSE, STDIN]))
            except OSError:
                pass

    def recv(self) -> tuple[int, bytes]:
        """(channel, data) of the next message with data; (-1, b"") at the end."""
        while True:
            opcode, payload = self.ws.recv()
            if opcode == OP_CLOSE:
                return -1, b""
            if not payload:
                continue
            channel, data = payload[0], payload[1:]
            if channel == STATUS:
                try:
                    self.status = json.loads(data)
                except ValueError:
                    self.status = {"status": "Failure", "message": data.decode("utf-8", "replace")}
                continue
            if data:
                return channel, data

    def exit_code(self) -> int | None:
        """The process's exit code from its end status (None before it came)."""
        status = self.status
        if status is None:
            return None
        if status.get("status") == "Success":
            return 0
        for cause in (status.get("details") or {}).get("causes") or []:
            if cause.get("reason") == "ExitCode":
                try:
                    return int(cause.get("message"))
                except (TypeError, ValueError):
                    break
        return -1

    def failure(self) -> str:
        """The end status's message when the exec itself failed (no such program...)."""
        status = self.status or {}
        if status.get("status") == "Failure" and status.get("reason") != "NonZeroExitCode":
            return str(status.get("message") or "")
        return ""

    def close(self) -> None:
        self.ws.close()


class ExecChannel(Channel):
    """A process's stdin and stdout as a :class:`~..base.Channel`; stderr is kept aside
    (its last bytes, in :attr:`stderr_tail`) so it never mixes into the protocol."""

    def __init__(self, stream: ExecStream, merge_stderr: bool = False) -> None:
        self._stream = stream
        self._merge = merge_stderr
        self._pending = b""
        self._stderr = bytearray()
        self._closed = False
        self._lock = threading.Lock()

    @property
    def stderr_tail(self) -> str:
        return bytes(self._stderr[-2000:]).decode("utf-8", "replace")

    def write(self, data: bytes) -> None:
        try:
            # Messages of at most 1 MiB: the API server relays each one whole.
            for at in range(0, len(data), 1 << 20):
                self._stream.send(STDIN, data[at : at + (1 << 20)])
        except OSError as exc:
            raise SandboxError(f"the sandbox process is gone ({exc})") from None

    def close_input(self) -> None:
        self._stream.close_stdin()

    def read(self, size: int = 65536) -> bytes:
        while not self._pending:
            channel, data = self._stream.recv()
            if channel < 0:
                return b""
            if channel == STDERR and not self._merge:
                self._stderr += data
                del self._stderr[:-STDERR_KEPT]
                continue
            self._pending = data
        chunk, self._pending = self._pending[:size], self._pending[size:]
        return chunk

    def exit_status(self) -> int | None:
        return self._stream.exit_code()

    def close(self) -> None:
        with self._lock:
            if self._closed:
                return
            self._closed = True
        self._stream.close_stdin()
        self._stream.close()


class ExecPty(ExecChannel, Pty):
    """A terminal: ``tty=true`` exec, its bytes as they are, resized through channel 4.

    Closing the connection does not end a process on a terminal (the runtime keeps it),
    so :meth:`close` hangs the shell's session up inside the sandbox (``hangup``, one
    short exec), as closing a real terminal would; the shell's pid comes first on the
    stream. A relay killed outright leaves its shell running until the sandbox stops."""

    def __init__(self, stream: ExecStream, hang_up: Any) -> None:
        super().__init__(stream, merge_stderr=True)
        self._hang_up = hang_up
        self.session = 0

    def start_with(self, pending: bytes, session: int) -> None:
        self._pending = pending
        self.session = session

    def resize(self, rows: int, cols: int) -> None:
        try:
            self._stream.send(RESIZE, json.dumps({"Width": cols, "Height": rows}).encode())
        except OSError:
            pass  # it has ended: the next read says so

    def close(self) -> None:
        with self._lock:
            if self._closed:
                return
            self._closed = True
        self._stream.close()
        if self.session and self._stream.status is None:
            self._hang_up(self.session)  # before returning: a CLI exits right after
