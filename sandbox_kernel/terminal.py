"""``sandbox-kernel shell``: the user's terminal joined to a login shell in their sandbox.

One relay serves every engine: the backend opens a pseudo-terminal *inside* the
sandbox (:meth:`~.backends.base.Backend.open_pty`: a ``docker exec`` with a TTY, a
Daytona PTY session, or a new pty pair for a bubblewrap'd process) and this module
joins it to the terminal the command runs in (a terminal window, an ssh session,
JupyterLab's Terminal through terminado):

* our terminal goes to raw mode, so every key (Ctrl-C, Ctrl-Z, arrows) travels as a
  byte and the sandbox's own line discipline turns it into a signal there; it is
  restored on every way out (the shell exits, the connection drops, SIGHUP, SIGTERM,
  an error);
* a window size change (SIGWINCH) resizes the sandbox's terminal;
* output is copied in bounded chunks by one thread that blocks while our terminal is
  slow, so a sandbox flooding its terminal only waits: the relay's memory stays flat;
* the remote shell's exit status becomes ours;
* bytes flowing count as the sandbox's activity (throttled), so the idle reaper does
  not stop a sandbox under a user who is typing or watching output.
"""

from __future__ import annotations

import errno
import os
import signal
import sys
import termios
import threading
import time
import tty
from collections.abc import Callable
from typing import Any

from .backends.base import WORKSPACE, Pty, SandboxInfo
from .errors import SandboxError

# bash as a login shell when the image has it (profiles read, colours, completion),
# else the POSIX shell: images need not have bash.
LOGIN_SHELL = [
    "/bin/sh",
    "-c",
    "if command -v bash >/dev/null 2>&1; then exec bash -l; fi; exec sh -l",
]
DEFAULT_TERM = "xterm-256color"
# Seconds between two activity records while bytes flow (the reaper counts minutes).
ACTIVITY_EVERY = 30.0
CHUNK = 65536


def terminal_env(environ: dict[str, str] | None = None) -> dict[str, str]:
    """What the sandbox's shell learns of our terminal: its type (and colour support),
    nothing else of the host's environment."""
    environ = dict(os.environ if environ is None else environ)
    env = {"TERM": environ.get("TERM") or DEFAULT_TERM}
    if environ.get("TERM") == "dumb":
        env["TERM"] = DEFAULT_TERM  # some launchers say dumb; the relay is a full terminal
    if environ.get("COLORTERM"):
        env["COLORTERM"] = environ["COLORTERM"]
    return env


def window_size(fd: int) -> tuple[int, int]:
    """(rows, cols) of the terminal on ``fd`` (24 x 80 when it cannot say)."""
    try:
        size = os.get_terminal_size(fd)
    except OSError:
        return 24, 80
    return (size.lines or 24), (size.columns or 80)


def open_shell(
    service: Any, info: SandboxInfo, cwd: str = "", rows: int = 24, cols: int = 80
) -> Pty:
    """A login shell on a new terminal in sandbox ``info``, run as cells and
    ``service.exec`` are (the sandbox's user; beneath a host work folder no links,
    FIFOs, sockets or devices may be made), starting in ``cwd`` (default /workspace)."""
    service.store.touch(service.backend.name, info.id)
    return service.backend.open_pty(
        info.id,
        service.as_user(info, LOGIN_SHELL),
        cwd=cwd or WORKSPACE,
        env=terminal_env(),
        rows=rows,
        cols=cols,
    )


class Activity:
    """Records that the sandbox is in use at most every ``every`` seconds, off the relay's
    threads (a slow store or engine never stalls typing)."""

    def __init__(self, record: Callable[[], None], every: float = ACTIVITY_EVERY) -> None:
        self._record = record
        self._every = every
        self._last = time.monotonic()
        self._lock = threading.Lock()
        self._busy = False

    def __call__(self) -> None:
        now = time.monotonic()
        with self._lock:
            if self._busy or now - self._last < self._every:
                return
            self._last, self._busy = now, True
        threading.Thread(target=self._run, daemon=True).start()

    def _run(self) -> None:
        try:
            self._record()
        except Exception:  # activity is advice to the reaper: never the user's problem
            pass
        finally:
            with self._lock:
                self._busy = False


def sandbox_activity(service: Any, sandbox_id: str) -> Callable[[], None]:
    """What one activity record does: our store's last activity, and the engine's own
    idle timer where it has one (Daytona counts only API use, not bytes in a PTY)."""
    backend = service.backend
    last_keep = [0.0]

    def record() -> None:
        service.store.touch(backend.name, sandbox_id)
        every = backend.keep_alive_interval
        if every and time.monotonic() - last_keep[0] >= every:
            last_keep[0] = time.monotonic()
            backend.keep_alive(sandbox_id)

    return record


def _write_all(fd: int, data: bytes) -> None:
    view = memoryview(data)
    while view:
        try:
            view = view[os.write(fd, view) :]
        except InterruptedError:
            continue
        except BlockingIOError:
            import select

            select.select([], [fd], [])


class Relay:
    """Joins our terminal (``in_fd``/``out_fd``) to ``pty`` until either side ends."""

    def __init__(
        self,
        pty: Pty,
        in_fd: int = 0,
        out_fd: int = 1,
        activity: Callable[[], None] | None = None,
    ) -> None:
        self.pty = pty
        self.in_fd = in_fd
        self.out_fd = out_fd
        self.activity = activity or (lambda: None)
        self.remote_ended = False
        self.output_failed = False
        self.signal_received = 0
        self._wake_r, self._wake_w = os.pipe()
        os.set_blocking(self._wake_w, False)

    def _wake(self, why: bytes) -> None:
        try:
            os.write(self._wake_w, why)
        except OSError:  # the pipe is full: a wake-up is already waiting
            pass

    def _pump_output(self) -> None:
        """Sandbox -> our terminal, one bounded chunk at a time: while our terminal does
        not take the bytes, this thread waits and so does the sandbox's writer."""
        try:
            while True:
                data = self.pty.read(CHUNK)
                if not data:
                    break
                try:
                    _write_all(self.out_fd, data)
                except OSError:
                    self.output_failed = True  # our terminal is gone (EIO, EPIPE)
                    break
                self.activity()
        finally:
            self.remote_ended = True
            self._wake(b"e")

    def _on_signal(self, signum: int, _frame: Any) -> None:
        if signum == signal.SIGWINCH:
            self._wake(b"w")
        else:
            self.signal_received = signum
            self._wake(b"t")

    def run(self) -> int:
        """Relay until the shell ends (its exit status) or our side does (128 + the
        signal that ended it, or 1 if our terminal went away)."""
        import select

        is_tty = os.isatty(self.in_fd)
        saved = termios.tcgetattr(self.in_fd) if is_tty else None
        handlers: dict[int, Any] = {}
        in_main = threading.current_thread() is threading.main_thread()
        for signum in (signal.SIGWINCH, signal.SIGHUP, signal.SIGTERM) if in_main else ():
            handlers[signum] = signal.signal(signum, self._on_signal)
        pump = threading.Thread(target=self._pump_output, name="terminal-output", daemon=True)
        user_ended = False
        try:
            if saved is not None:
                tty.setraw(self.in_fd, termios.TCSANOW)
            pump.start()
            while not user_ended:
                try:
                    ready, _, _ = select.select([self.in_fd, self._wake_r], [], [])
                except InterruptedError:
                    continue
                if self._wake_r in ready:
                    why = os.read(self._wake_r, 64)
                    if b"w" in why and is_tty:
                        self.pty.resize(*window_size(self.in_fd))
                    if b"t" in why or b"e" in why:
                        break
                if self.in_fd in ready:
                    try:
                        data = os.read(self.in_fd, CHUNK)
                    except OSError as exc:  # EIO: our terminal hung up
                        if exc.errno not in (errno.EIO, errno.EBADF):
                            raise
                        data = b""
                    if not data:
                        user_ended = True
                        break
                    try:
                        self.pty.write(data)
                    except SandboxError:
                        break  # the shell is gone: its end arrives through the output
                    self.activity()
        finally:
            if saved is not None:
                try:
                    termios.tcsetattr(self.in_fd, termios.TCSADRAIN, saved)
                except termios.error:
                    pass  # our terminal is gone: nothing left to restore
            for number, handler in handlers.items():
                signal.signal(number, handler)
            if not self.remote_ended:
                self.pty.close()  # we leave first: hang the sandbox's terminal up
        pump.join(timeout=10)
        ours = bool(self.signal_received) or user_ended or self.output_failed
        status = None if ours else self.pty.exit_status()
        self.pty.close()
        for fd in (self._wake_r, self._wake_w):
            os.close(fd)
        if self.signal_received:
            return 128 + self.signal_received
        if ours:
            return 1  # our terminal went away: there is no one to tell
        if status is None:
            raise SandboxError(
                "the connection to the sandbox's terminal was lost; "
                "`sandbox-kernel list` shows whether the sandbox still runs"
            )
        return status


def run_shell(service: Any, info: SandboxInfo, cwd: str = "") -> int:
    """The whole command on an open sandbox: open its shell at our window's size, relay
    our standard input and output to it, return its exit status."""
    rows, cols = window_size(0)
    pty = open_shell(service, info, cwd=cwd, rows=rows, cols=cols)
    relay = Relay(pty, 0, 1, Activity(sandbox_activity(service, info.id)))
    sys.stdout.flush()
    return relay.run()
