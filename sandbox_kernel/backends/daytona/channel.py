"""Processes in a Daytona sandbox over the daemon's PTY sessions: our agent's channel (a
raw terminal as a byte pipe) and a user's terminal."""

from __future__ import annotations

import re
import shlex
import threading
import time
from collections.abc import Callable
from typing import Any

from daytona.common.errors import DaytonaError

from ..base import Channel, Pty, SandboxError, SandboxFailed


def bash_word(arg: str) -> str:
    """Quote one word for a line typed into bash: ANSI-C quoting when it holds newlines,
    so the whole command stays on one terminal line."""
    if re.search(r"[\x00-\x1f]", arg):
        escaped = arg.replace("\\", "\\\\").replace("'", "\\'")
        escaped = re.sub(r"[\x00-\x1f]", lambda m: f"\\x{ord(m.group()):02x}", escaped)
        return f"$'{escaped}'"
    return shlex.quote(arg)


class PtyChannel(Channel):
    """Our agent's stdin/stdout over a Daytona PTY session in raw mode.

    The shell first echoes what we type; :meth:`DaytonaBackend.open_channel` discards
    everything up to a marker printed after ``stty raw -echo``, so the agent's first
    byte is the channel's first byte.
    """

    def __init__(self, handle: Any, kill: Callable[[], None], log: Callable[[], str]) -> None:
        self._handle = handle
        self._events = iter(handle)
        self._kill = kill
        self._log = log
        self._buf = bytearray()
        self._lock = threading.Lock()
        self._closed = False

    @property
    def stderr_tail(self) -> str:
        """What the agent wrote to stderr before it took over fd 2 (why it did not start)."""
        try:
            return self._log()
        except SandboxError:
            return ""

    def write(self, data: bytes) -> None:
        with self._lock:
            try:
                self._handle.send_input(data)
            except DaytonaError as exc:
                raise SandboxError(f"the sandbox process is gone ({exc})") from exc

    def read(self, size: int = 65536) -> bytes:
        if not self._buf:
            try:
                self._buf += next(self._events)
            except (StopIteration, DaytonaError):
                return b""
        chunk = bytes(self._buf[:size])
        del self._buf[:size]
        return chunk

    def read_until(self, marker: bytes, timeout: float) -> None:
        """Drop output until ``marker``; keep what follows it for :meth:`read`."""
        deadline = time.monotonic() + timeout
        seen = bytearray()
        for chunk in self._handle._handle_events(deadline):
            seen += chunk
            at = seen.find(marker)
            if at >= 0:
                self._buf += seen[at + len(marker) :]
                return
        raise SandboxFailed(
            "the sandbox's terminal did not start our agent"
            + (f": {self._handle.error}" if self._handle.error else "")
            + f" (output: {bytes(seen[-300:]).decode('utf-8', 'replace')!r})"
        )

    def exit_status(self) -> int | None:
        return self._handle.exit_code

    def close(self) -> None:
        if self._closed:
            return
        self._closed = True
        try:
            self._kill()
        except Exception:  # already gone with its sandbox: nothing left to end
            pass
        self._handle.disconnect()


class DaytonaPty(PtyChannel, Pty):
    """A user's terminal over a Daytona PTY session: its bytes as they are (no raw mode:
    the shell's terminal is the user's), resized through the toolbox API."""

    def __init__(
        self,
        handle: Any,
        kill: Callable[[], None],
        log: Callable[[], str],
        resize: Callable[[int, int], Any],
    ) -> None:
        super().__init__(handle, kill, log)
        self._resize = resize

    def resize(self, rows: int, cols: int) -> None:
        try:
            self._resize(rows, cols)
        except (SandboxError, DaytonaError):
            pass  # the session has ended: its end shows on the next read
