"""A socket from the sandbox's interpreter straight to its kernel, past the engine.

Every byte of an interpreter's ``docker exec`` stream is copied twice in the engine
(the runtime's shim, then the daemon's framing): about 350 MB/s here, most of what a
10 MB output costs beyond ipykernel. A local engine shares this host's filesystem, so a
sandbox gets one more mount: a folder of ours (``<state dir>/sockets/<name>``), read-only
at :data:`AGENT_SOCKETS`. A kernel listens there (:class:`AgentListener`), the
interpreter connects and sends a one-time token (its socket's random name and the token
reach it on its stdin), so a connection that is not the kernel's own interpreter is
turned away rather than taken for it. From then on the protocol runs over that socket
(:class:`SocketChannel`) and the exec only tells when the interpreter ends, as before.

The sandbox cannot write the folder, so nothing it plants there is ever met by the host,
and the host reads nothing from a connection but bounded protocol lines. Sandboxes made
before this existed, remote engines and other backends keep the exec stream.
"""

from __future__ import annotations

import contextlib
import hmac
import logging
import os
import secrets
import shutil
import socket
import stat
import threading
import time
from pathlib import Path

from ..base import Channel, SandboxError
from .channel import close_socket, send_or_gone
from .mounts import FRESH, folder_lock

log = logging.getLogger(__name__)

AGENT_SOCKETS = "/run/kernel-sockets"  # the folder as the sandbox sees it (read-only)
TOKEN_BYTES = 32
# Write and search for this host user (to bind and remove sockets), search for the
# sandbox: no one lists it, the sandbox's user not even when it is this very uid (a
# server that is not root), and the read-only mount keeps it from changing that.
FOLDER_MODE = 0o311
# Seconds a reader that saw the socket end waits for the exec to end as well: what it
# asks next (the exit status, an out-of-memory kill) is known only then.
PROCESS_END_WAIT = 3.0
# Seconds one connection has to bring the token. The interpreter sends it before it says
# ready, so it is there when the kernel accepts; anyone who connected first and stays
# silent costs the kernel this long, not the whole wait.
TOKEN_PATIENCE = 0.5


class AgentSocketFolders:
    """The host folders of one installation's sandboxes, one per container name."""

    def __init__(self, state_dir: str) -> None:
        self.root = Path(state_dir) / "sockets"

    def folder(self, name: str) -> Path:
        return self.root / name

    def ensure(self, name: str) -> Path:
        """The container's folder, made if missing and marked fresh: the engine refuses
        to start a container whose mount source is gone (the state folder tidied, say),
        and a sweep must not take it between this and the create or start."""
        with folder_lock(self.root):
            folder = self.folder(name)
            with contextlib.suppress(FileExistsError):
                folder.mkdir()
            # Only this host user writes the root folder: no link can be planted here.
            if not stat.S_ISDIR(folder.lstat().st_mode):
                raise SandboxError(f"{folder} is not a folder; remove it")
            os.chmod(self.root, 0o711)  # exact, whatever the umask
            os.chmod(folder, FOLDER_MODE)  # (not opened: without r even its owner cannot)
            os.utime(folder)
        return folder

    def release(self, name: str) -> None:
        """Remove the folder of a container that is gone (what a kernel left in it, too)."""
        if not self.root.is_dir():
            return  # never had one (a remote engine, a sandbox made before)
        with folder_lock(self.root):
            self._remove(self.folder(name))

    def sweep(self, live: set[str]) -> None:
        """Remove the folders of containers removed behind our back (``docker rm``)."""
        if not self.root.is_dir():
            return
        with folder_lock(self.root):
            for folder in self.root.iterdir():
                try:
                    fresh = time.time() - folder.lstat().st_mtime < FRESH
                except OSError:
                    continue
                if folder.is_dir() and folder.name not in live and not fresh:
                    self._remove(folder)

    @staticmethod
    def _remove(folder: Path) -> None:
        with contextlib.suppress(OSError):
            os.chmod(folder, 0o700)  # listable again, for the removal
        shutil.rmtree(folder, ignore_errors=True)


class AgentListener:
    """One kernel's socket in its sandbox's folder, waiting for its interpreter."""

    def __init__(self, folder: str) -> None:
        self.token = secrets.token_hex(TOKEN_BYTES)
        self.name = f"k-{secrets.token_hex(8)}"
        self.inside = f"{AGENT_SOCKETS}/{self.name}"
        self._folder = os.open(folder, os.O_PATH | os.O_DIRECTORY | os.O_NOFOLLOW)
        try:
            self._sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        except OSError:
            os.close(self._folder)
            raise
        try:
            # Through the folder's descriptor: a state folder's path may be longer than
            # a socket address can be (108 bytes).
            address = f"/proc/self/fd/{self._folder}/{self.name}"
            self._sock.bind(address)
            os.chmod(address, 0o666)  # whichever uid the sandbox's user is on this host
            self._sock.listen(8)
        except OSError:
            self.close()
            raise

    def accept(self, within: float) -> socket.socket:
        """The interpreter's connection: the first that sends the token within ``within``
        seconds. Anyone else who connects is closed without a byte."""
        deadline = time.monotonic() + within
        while True:
            left = deadline - time.monotonic()
            if left <= 0:
                raise SandboxError("the interpreter in the sandbox did not connect to its kernel")
            self._sock.settimeout(left)
            try:
                conn, _ = self._sock.accept()
            except TimeoutError:
                continue  # checked above
            except OSError:  # out of descriptors, a connection aborted: not in a spin
                time.sleep(0.05)
                continue
            if self._proves(conn, min(deadline, time.monotonic() + TOKEN_PATIENCE)):
                conn.settimeout(None)
                return conn
            conn.close()

    def _proves(self, conn: socket.socket, deadline: float) -> bool:
        expected = self.token.encode() + b"\n"
        got = b""
        try:
            while len(got) < len(expected):
                conn.settimeout(max(0.01, deadline - time.monotonic()))
                chunk = conn.recv(len(expected) - len(got))
                if not chunk:
                    return False
                got += chunk
        except OSError:
            return False
        return hmac.compare_digest(got, expected)

    def close(self) -> None:
        """Stop listening and remove the socket: nothing more may connect."""
        with contextlib.suppress(OSError):
            self._sock.close()
        with contextlib.suppress(OSError):
            os.unlink(self.name, dir_fd=self._folder)
        with contextlib.suppress(OSError):
            os.close(self._folder)


class SocketChannel(Channel):
    """The protocol over the interpreter's socket; the exec it was started by is kept
    open and read to its end (its stderr, its exit), which ends this channel too."""

    def __init__(self, sock: socket.socket, process: Channel) -> None:
        self._sock = sock
        self._process = process
        self._write_lock = threading.Lock()
        self._closed = False
        self._process_ended = threading.Event()
        threading.Thread(target=self._watch_process, name="agent-exec", daemon=True).start()

    @property
    def stderr_tail(self) -> str:
        return str(getattr(self._process, "stderr_tail", ""))

    def _watch_process(self) -> None:
        while self._process.read():
            pass
        self._process_ended.set()
        # The interpreter ended (or its exec did): what reads the socket hears so, even
        # when a process it left behind still holds the socket open.
        with contextlib.suppress(OSError):
            self._sock.shutdown(socket.SHUT_RDWR)

    def read(self, size: int = 1 << 20) -> bytes:
        try:
            data = self._sock.recv(size)
        except OSError:
            data = b""
        if not data:  # the interpreter closed it: its watcher is still ending the rest
            self._process_ended.wait(PROCESS_END_WAIT)
        return data

    def write(self, data: bytes) -> None:
        send_or_gone(self._sock, self._write_lock, data, "the sandbox process")

    def exit_status(self) -> int | None:
        return self._process.exit_status()

    def close(self) -> None:
        if self._closed:
            return
        self._closed = True
        close_socket(self._sock)
        self._process.close()
