"""The host's ends of a local sandbox's processes: pipes, a terminal, and ending them."""

from __future__ import annotations

import fcntl
import os
import signal
import struct
import subprocess
import termios
import threading
import time
from pathlib import Path

from ..base import Channel, Pty, SandboxError
from .holder import start_time


def kill_spawn(pid: int, wait: float = 5.0) -> None:
    """End one started process of a sandbox and everything it started.

    Under bubblewrap ``pid`` is bubblewrap's, whose child is the init of the process's
    own pid namespace: killing that init makes the kernel kill every process of the
    namespace (daemons and double forks included), which a process group could not
    reach (the command runs in a session of its own). Then the process group itself
    (plain processes, or bubblewrap before its child exists)."""
    try:
        children = Path(f"/proc/{pid}/task/{pid}/children").read_text().split()
    except OSError:
        children = []
    for child in children:
        try:
            os.kill(int(child), signal.SIGKILL)
        except (OSError, ValueError):
            pass
    try:
        os.killpg(pid, signal.SIGKILL)
    except (ProcessLookupError, PermissionError):
        pass
    # An init ends only once every process of its namespace has: wait for that, so that
    # whoever asked (a stop) finds nothing left.
    deadline = time.monotonic() + wait
    for child in children:
        while child.isdigit() and start_time(int(child)) and time.monotonic() < deadline:
            time.sleep(0.01)


class LocalChannel(Channel):
    """stdin/stdout pipes of a child process; closing ends it and all it started."""

    def __init__(self, proc: subprocess.Popen[bytes], marker: Path) -> None:
        self.proc = proc
        self._marker = marker
        self._lock = threading.Lock()

    def write(self, data: bytes) -> None:
        assert self.proc.stdin is not None
        with self._lock:
            try:
                self.proc.stdin.write(data)
                self.proc.stdin.flush()
            except (OSError, ValueError) as exc:
                raise SandboxError(f"the sandbox process is gone ({exc})") from exc

    def read(self, size: int = 65536) -> bytes:
        assert self.proc.stdout is not None
        try:
            return os.read(self.proc.stdout.fileno(), size)
        except (OSError, ValueError):
            return b""

    def exit_status(self) -> int | None:
        code = self.proc.poll()
        return None if code is None else (128 - code if code < 0 else code)

    def close(self) -> None:
        # A write takes the lock for moments; one still holding it now is stuck, and the
        # process is to end anyway.
        locked = self._lock.acquire(timeout=0.1)
        if not locked:
            # A write is blocked on a process that does not read (one a cell froze, with
            # the agent's source bigger than a pipe holds): ending the process ends that
            # write, which holds stdin until then (unless a process outside the group
            # holds the pipe too: then stdin is left to the writer).
            kill_spawn(self.proc.pid)
            locked = self._lock.acquire(timeout=5)
        if locked:
            try:
                if self.proc.stdin:
                    self.proc.stdin.close()
            except OSError:
                pass
            finally:
                self._lock.release()
        try:
            self.proc.wait(timeout=1)
        except subprocess.TimeoutExpired:
            kill_spawn(self.proc.pid)
            self.proc.wait()
        if self.proc.stdout is not None:
            self.proc.stdout.close()
        self._marker.unlink(missing_ok=True)


class LocalPty(Pty):
    """The master side of the pseudo-terminal of a (bubblewrap'd) child process.

    Closing it hangs the terminal up (SIGHUP to the shell's session), then ends the
    child and all it started if it has not gone within a second."""

    def __init__(self, proc: subprocess.Popen[bytes], marker: Path, master: int) -> None:
        self.proc = proc
        self._marker = marker
        self._master = master
        self._closed = False

    def write(self, data: bytes) -> None:
        view = memoryview(data)
        while view:
            try:
                view = view[os.write(self._master, view) :]
            except OSError as exc:
                raise SandboxError(f"the sandbox's terminal is gone ({exc})") from exc

    def read(self, size: int = 65536) -> bytes:
        try:
            return os.read(self._master, size)
        except OSError:  # EIO: every process holding the terminal has gone
            return b""

    def resize(self, rows: int, cols: int) -> None:
        try:
            fcntl.ioctl(self._master, termios.TIOCSWINSZ, struct.pack("HHHH", rows, cols, 0, 0))
        except OSError:
            pass

    def exit_status(self) -> int | None:
        try:
            code = self.proc.wait(timeout=5)
        except subprocess.TimeoutExpired:
            return None
        return 128 - code if code < 0 else code

    def close(self) -> None:
        if self._closed:
            return
        self._closed = True
        os.close(self._master)
        try:
            self.proc.wait(timeout=1)
        except subprocess.TimeoutExpired:
            kill_spawn(self.proc.pid)
            self.proc.wait()
        self._marker.unlink(missing_ok=True)
