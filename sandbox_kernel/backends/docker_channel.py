"""The byte channel to one ``docker exec`` process: its attach socket, demultiplexed."""

from __future__ import annotations

import socket
import struct
import threading
from collections import deque
from typing import Any

from .base import Channel, SandboxError


class DockerChannel(Channel):
    """The attach socket of a ``docker exec`` with stdin, demultiplexed.

    Without a TTY the engine frames output as ``[stream, 0, 0, 0, size(4)] payload``;
    stdout payloads are the channel, stderr payloads are kept (last 8 KiB) to explain
    a process that died at once (a missing python3, say).
    """

    def __init__(
        self, sock: socket.socket, exec_id: str, merge_stderr: bool = False, api: Any = None
    ) -> None:
        self._sock = sock
        self._api = api
        self._merge_stderr = merge_stderr
        self.exec_id = exec_id
        self._pending = b""  # stdout bytes of a frame not yet returned
        self._remaining = 0  # bytes of the current stdout frame still on the socket
        self._stderr: deque[bytes] = deque(maxlen=64)
        self._write_lock = threading.Lock()
        self._closed = False
        self.keep_alive: Any = None  # the SDK object that must outlive the socket

    @property
    def stderr_tail(self) -> str:
        return b"".join(self._stderr).decode("utf-8", "replace")[-8192:]

    def exit_status(self) -> int | None:
        if self._api is None:
            return None
        try:
            state = self._api.exec_inspect(self.exec_id)
        except Exception:
            return None
        return None if state.get("Running") else state.get("ExitCode")

    def write(self, data: bytes) -> None:
        with self._write_lock:
            try:
                self._sock.sendall(data)
            except OSError as exc:
                raise SandboxError(f"the sandbox process is gone ({exc})") from exc

    def _recv_exact(self, size: int) -> bytes:
        buf = bytearray()
        while len(buf) < size:
            try:
                chunk = self._sock.recv(size - len(buf))
            except OSError:
                chunk = b""
            if not chunk:
                return b""
            buf += chunk
        return bytes(buf)

    def read(self, size: int = 65536) -> bytes:
        while True:
            if self._remaining:
                try:
                    chunk = self._sock.recv(min(size, self._remaining))
                except OSError:
                    chunk = b""
                self._remaining -= len(chunk)
                if not chunk:
                    self._remaining = 0
                return chunk
            header = self._recv_exact(8)
            if len(header) < 8:
                return b""
            stream, length = header[0], struct.unpack(">I", header[4:])[0]
            if stream == 2 and not self._merge_stderr:
                self._stderr.append(self._recv_exact(length))
                continue
            self._remaining = length

    def set_timeout(self, seconds: float | None) -> None:
        """Bound each read and write (None: wait for ever), so a silent process cannot hang us."""
        self._sock.settimeout(seconds)

    def close_input(self) -> None:
        """End the process's stdin (EOF) and keep reading its output."""
        try:
            self._sock.shutdown(socket.SHUT_WR)
        except OSError:
            pass

    def read_line(self, limit: int = 1 << 16) -> bytes:
        """One line of output (without its newline); b"" at EOF or past ``limit`` bytes."""
        line = bytearray()
        while len(line) < limit:
            chunk = self.read(1)
            if not chunk:
                return b""
            if chunk == b"\n":
                return bytes(line)
            line += chunk
        return b""

    def close(self) -> None:
        if self._closed:
            return
        self._closed = True
        for op in (lambda: self._sock.shutdown(socket.SHUT_RDWR), self._sock.close):
            try:
                op()
            except OSError:
                pass
