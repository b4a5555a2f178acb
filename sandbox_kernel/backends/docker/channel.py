"""The byte channel to one ``docker exec`` process: its attach socket, demultiplexed;
and a terminal (:class:`DockerPty`), an exec with a TTY."""

from __future__ import annotations

import socket
import struct
import subprocess
import sys
import threading
import time
from collections import deque
from typing import Any

from ...agent import inline
from ...host_python import python_command
from ..base import Channel, Pty, SandboxError


def close_socket(sock: socket.socket) -> None:
    """Shut an exec's attach socket down both ways and close it (the process inside sees
    EOF); either step may fail on a socket the engine already closed."""
    for op in (lambda: sock.shutdown(socket.SHUT_RDWR), sock.close):
        try:
            op()
        except OSError:
            pass


def send_or_gone(sock: socket.socket, lock: threading.Lock, data: bytes, what: str) -> None:
    """Send all of ``data`` (one writer at a time); a socket that broke means ``what``
    is gone, which the kernel reports as such."""
    with lock:
        try:
            sock.sendall(data)
        except OSError as exc:
            raise SandboxError(f"{what} is gone ({exc})") from exc


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
        send_or_gone(self._sock, self._write_lock, data, "the sandbox process")

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

    def read_until(self, deadline: float | None, limit: int) -> bytes:
        """What the process writes until its output ends or ``deadline`` (monotonic)
        passes, the first ``limit`` bytes of it (the rest is read and dropped)."""
        out = bytearray()
        while deadline is None or time.monotonic() < deadline:
            if deadline is not None:
                self.set_timeout(max(0.01, deadline - time.monotonic()))
            chunk = self.read()  # b"" at the end of output, or at the deadline
            if not chunk:
                break
            if len(out) < limit:
                out += chunk[: limit - len(out)]
        return bytes(out)

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
        close_socket(self._sock)


# What the Docker backend's terminal command prints first: the shell's pid in the
# sandbox, so the host can hang its session up (see programs/hangup.py).
PTY_PID_PREFIX = b"\x1b]sk-pid;"
PTY_PID_END = b"\x07"


class DockerPty(Pty):
    """The attach socket of a ``docker exec`` with a TTY: one raw byte stream both ways
    (no framing), resized with ``exec_resize``.

    Docker keeps an exec's terminal open after its client has gone, so a shell would
    run on after its window closed. A small watcher process (:func:`hang_up_when_gone`,
    in a session of its own) waits for this process to close the terminal or to die,
    even by SIGKILL (a closed JupyterLab terminal ends its relay so), then hangs the
    shell's session up inside the sandbox; the shell's pid comes from the first bytes
    it wrote, before any user code ran.
    """

    def __init__(self, sock: socket.socket, exec_id: str, container_id: str, api: Any) -> None:
        self._sock = sock
        self._api = api
        self.exec_id = exec_id
        self.container_id = container_id
        self.session = 0  # the shell's pid in the sandbox, once read
        self._pending = b""
        self._write_lock = threading.Lock()
        self._closed = False
        self._watcher: subprocess.Popen[bytes] | None = None
        self.keep_alive: Any = None  # the SDK object that must outlive the socket

    def read_session(self, timeout: float) -> None:
        """Read the shell's pid announcement (anything else is kept for :meth:`read`) and
        start the watcher that hangs the session up once we are gone."""
        self._sock.settimeout(timeout)
        seen = b""
        try:
            while len(seen) < 64 and PTY_PID_END not in seen:
                chunk = self._sock.recv(64 - len(seen))
                if not chunk:
                    break
                seen += chunk
        except OSError:
            pass
        finally:
            self._sock.settimeout(None)
        head, end, rest = seen.partition(PTY_PID_END)
        if end and head.startswith(PTY_PID_PREFIX) and head[len(PTY_PID_PREFIX) :].isdigit():
            self.session = int(head[len(PTY_PID_PREFIX) :])
            self._pending = rest
            self._watcher = subprocess.Popen(
                python_command(
                    "from sandbox_kernel.backends.docker.channel import hang_up_when_gone as h; h()",
                    self.exec_id,
                    self.container_id,
                    str(self.session),
                ),
                stdin=subprocess.PIPE,
                stdout=subprocess.DEVNULL,
                stderr=subprocess.DEVNULL,
                start_new_session=True,  # a signal to our process group must not reach it
            )
            threading.Thread(target=self._watcher.wait, daemon=True).start()  # no zombie
        else:  # the command did not start (the engine's message says why): show it all
            self._pending = seen

    def read(self, size: int = 65536) -> bytes:
        if self._pending:
            chunk, self._pending = self._pending[:size], self._pending[size:]
            return chunk
        try:
            return self._sock.recv(size)
        except OSError:
            return b""

    def write(self, data: bytes) -> None:
        send_or_gone(self._sock, self._write_lock, data, "the sandbox's terminal")

    def resize(self, rows: int, cols: int) -> None:
        # Right after the start the engine may not know the process yet: try a few times.
        for _ in range(20):
            try:
                self._api.exec_resize(self.exec_id, height=rows, width=cols)
                return
            except Exception:
                if self._running() is False:
                    return
                time.sleep(0.05)

    def _running(self) -> bool | None:
        try:
            return bool(self._api.exec_inspect(self.exec_id).get("Running"))
        except Exception:
            return None

    def exit_status(self) -> int | None:
        # The engine notes the exit a moment after the stream ends.
        deadline = time.monotonic() + 5
        while True:
            try:
                state = self._api.exec_inspect(self.exec_id)
            except Exception:
                return None
            if not state.get("Running"):
                return state.get("ExitCode")
            if time.monotonic() > deadline:
                return None
            time.sleep(0.05)

    def close(self) -> None:
        if self._closed:
            return
        self._closed = True
        close_socket(self._sock)
        if self._watcher is not None and self._watcher.stdin is not None:
            self._watcher.stdin.close()  # the watcher's cue (as our death would be)


def open_docker_pty(
    api: Any,
    container_id: str,
    cmd: list[str],
    *,
    cwd: str,
    environment: dict[str, str],
    size: tuple[int, int],
    timeout: float,
) -> DockerPty:
    """A terminal in a container: ``docker exec`` with a TTY, as the container's user;
    the engine makes the terminal and its session. ``cmd`` is started by a two-line
    python3 prelude that first writes its pid (see :class:`DockerPty`), then becomes
    ``cmd``; the session is read (within ``timeout`` seconds) before it is handed over."""
    announce = (
        "import os, sys; os.write(1, b'\\x1b]sk-pid;%d\\x07' % os.getpid()); "
        "os.execvp(sys.argv[1], sys.argv[1:])"
    )
    exec_id = api.exec_create(
        container_id,
        inline(announce, *cmd),
        stdin=True,
        stdout=True,
        stderr=True,
        tty=True,
        workdir=cwd,
        environment=environment,
    )["Id"]
    sock = api.exec_start(exec_id, socket=True, tty=True)
    pty = DockerPty(getattr(sock, "_sock", sock), exec_id, container_id, api)
    pty.keep_alive = sock  # as for channels: the SDK's wrapper must outlive the socket
    pty.resize(*size)
    pty.read_session(timeout=timeout)
    return pty


def hang_up_when_gone() -> None:
    """The watcher of a :class:`DockerPty` (``argv``: exec id, container id, session):
    wait for EOF on stdin (the relay closed the terminal, or died), then, if the shell
    still runs, SIGHUP its session inside the sandbox as closing a real terminal would
    (see programs/hangup.py)."""
    import docker

    from ...agent import program
    from .env import exec_env

    exec_id, container_id, session = sys.argv[1:4]
    sys.stdin.buffer.read()
    client = docker.from_env(timeout=60)
    if client.api.exec_inspect(exec_id).get("Running"):
        container = client.containers.get(container_id)
        container.exec_run(
            program("hangup", session),
            stdin=False,
            environment=exec_env(container.attrs),
        )
