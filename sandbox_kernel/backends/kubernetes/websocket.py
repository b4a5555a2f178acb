"""A small WebSocket client (RFC 6455) for the API server's exec streams.

Only what the exec channel needs: one TLS (or plain) connection, the opening handshake
with subprotocols, binary frames both ways, pings answered, close. The standard library
carries it, so a kernel's start imports nothing more than it already has.
"""

from __future__ import annotations

import base64
import hashlib
import os
import socket
import ssl
import struct
import threading
from urllib.parse import urlsplit

from ..base import SandboxError

GUID = b"258EAFA5-E914-47DA-95CA-C5AB0DC85B11"
OP_CONT, OP_TEXT, OP_BINARY, OP_CLOSE, OP_PING, OP_PONG = 0, 1, 2, 8, 9, 10
MAX_HEAD = 64 << 10  # bytes of an HTTP answer's head we read at most


class HandshakeRefused(SandboxError):
    """The server answered the upgrade with an HTTP status instead of switching."""

    def __init__(self, status: int, body: bytes) -> None:
        super().__init__(f"{status}: {body[:500].decode('utf-8', 'replace')}")
        self.status = status
        self.body = body


class WebSocket:
    """One client connection; :meth:`recv` gives whole messages (opcode, payload)."""

    def __init__(self, sock: socket.socket, protocol: str) -> None:
        self.sock = sock
        self.protocol = protocol
        self._buf = bytearray()
        self._send_lock = threading.Lock()
        self.closed = False

    @classmethod
    def connect(
        cls,
        url: str,
        *,
        headers: dict[str, str],
        protocols: list[str],
        context: ssl.SSLContext | None,
        timeout: float,
    ) -> WebSocket:
        parts = urlsplit(url)
        secure = parts.scheme in ("https", "wss")
        host = parts.hostname or "localhost"
        port = parts.port or (443 if secure else 80)
        raw = socket.create_connection((host, port), timeout=timeout)
        try:
            raw.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            sock: socket.socket = raw
            if secure:
                sock = (context or ssl.create_default_context()).wrap_socket(
                    raw, server_hostname=host
                )
            key = base64.b64encode(os.urandom(16)).decode()
            target = parts.path + (f"?{parts.query}" if parts.query else "")
            lines = [
                f"GET {target} HTTP/1.1",
                f"Host: {parts.netloc}",
                "Upgrade: websocket",
                "Connection: Upgrade",
                f"Sec-WebSocket-Key: {key}",
                "Sec-WebSocket-Version: 13",
                f"Sec-WebSocket-Protocol: {', '.join(protocols)}",
                *(f"{k}: {v}" for k, v in headers.items()),
            ]
            sock.sendall(("\r\n".join(lines) + "\r\n\r\n").encode())
            ws = cls(sock, "")
            status, answer, rest = ws._read_head()
            if status != 101:
                body = rest + ws._read_body(answer)
                raise HandshakeRefused(status, body)
            accept = base64.b64encode(hashlib.sha1(key.encode() + GUID).digest()).decode()
            if answer.get("sec-websocket-accept") != accept:
                raise SandboxError("the API server's exec stream answered with a bad handshake")
            ws.protocol = answer.get("sec-websocket-protocol", "")
            ws._buf += rest
            sock.settimeout(None)
            return ws
        except BaseException:
            raw.close()
            raise

    def _read_head(self) -> tuple[int, dict[str, str], bytes]:
        data = bytearray()
        while b"\r\n\r\n" not in data:
            chunk = self.sock.recv(4096)
            if not chunk:
                raise SandboxError("the API server closed the exec stream during its handshake")
            data += chunk
            if len(data) > MAX_HEAD:
                raise SandboxError("the API server's exec answer has an oversized head")
        head, _, rest = bytes(data).partition(b"\r\n\r\n")
        first, *fields = head.decode("latin-1").split("\r\n")
        try:
            status = int(first.split()[1])
        except (IndexError, ValueError):
            raise SandboxError(
                f"the API server's exec answer is not HTTP: {first[:80]!r}"
            ) from None
        answer = {}
        for line in fields:
            name, _, value = line.partition(":")
            answer[name.strip().lower()] = value.strip()
        return status, answer, rest

    def _read_body(self, answer: dict[str, str]) -> bytes:
        """Some of a refusal's body (its reason), without waiting for more than is sent."""
        try:
            size = int(answer.get("content-length", "0"))
        except ValueError:
            size = 0
        body = bytearray()
        self.sock.settimeout(5)
        try:
            while len(body) < min(size, MAX_HEAD):
                chunk = self.sock.recv(min(size, MAX_HEAD) - len(body))
                if not chunk:
                    break
                body += chunk
        except OSError:
            pass
        return bytes(body)

    # -- frames ----------------------------------------------------------------------------
    def send(self, payload: bytes, opcode: int = OP_BINARY) -> None:
        """One whole message (masked, as a client must)."""
        head = bytearray([0x80 | opcode])
        size = len(payload)
        if size < 126:
            head.append(0x80 | size)
        elif size < 1 << 16:
            head.append(0x80 | 126)
            head += struct.pack("!H", size)
        else:
            head.append(0x80 | 127)
            head += struct.pack("!Q", size)
        mask = os.urandom(4)
        head += mask
        masked = _mask(payload, mask)
        with self._send_lock:
            if self.closed:
                raise OSError("the exec stream is closed")
            self.sock.sendall(bytes(head) + masked)

    def _need(self, size: int) -> bytes:
        while len(self._buf) < size:
            chunk = self.sock.recv(max(65536, size - len(self._buf)))
            if not chunk:
                raise EOFError
            self._buf += chunk
        out = bytes(self._buf[:size])
        del self._buf[:size]
        return out

    def recv(self) -> tuple[int, bytes]:
        """The next data message (OP_BINARY or OP_TEXT, payload); (OP_CLOSE, b"") at the end.

        Pings are answered on the way; fragments are joined."""
        message = bytearray()
        opcode_first = None
        while True:
            try:
                b1, b2 = self._need(2)
                size = b2 & 0x7F
                if size == 126:
                    size = struct.unpack("!H", self._need(2))[0]
                elif size == 127:
                    size = struct.unpack("!Q", self._need(8))[0]
                mask = self._need(4) if b2 & 0x80 else b""
                payload = self._need(size)
            except (EOFError, OSError):
                return OP_CLOSE, b""
            if mask:
                payload = _mask(payload, mask)
            opcode = b1 & 0x0F
            if opcode == OP_CLOSE:
                try:
                    self.send(payload[:2], OP_CLOSE)
                except OSError:
                    pass
                return OP_CLOSE, b""
            if opcode == OP_PING:
                try:
                    self.send(payload, OP_PONG)
                except OSError:
                    return OP_CLOSE, b""
                continue
            if opcode == OP_PONG:
                continue
            if opcode != OP_CONT:
                opcode_first = opcode
            message += payload
            if b1 & 0x80:
                return opcode_first or OP_BINARY, bytes(message)

    def close(self) -> None:
        if self.closed:
            return
        try:
            self.send(struct.pack("!H", 1000), OP_CLOSE)
        except OSError:
            pass
        self.closed = True
        try:
            self.sock.shutdown(socket.SHUT_RDWR)
        except OSError:
            pass
        self.sock.close()


def _mask(data: bytes, mask: bytes) -> bytes:
    """XOR ``data`` with the 4-byte ``mask`` (fast: through one big integer)."""
    if not data:
        return data
    n = len(data)
    key = int.from_bytes((mask * (n // 4 + 1))[:n], "little")
    return (int.from_bytes(data, "little") ^ key).to_bytes(n, "little")
