"""Reaching the sandbox from the first moment of the kernel's process.

Making or starting a sandbox is mostly the engine's work (a container start takes a
few hundred milliseconds of its time, not ours), and so is starting an interpreter in
it. The kernel's own start is mostly importing ipykernel and zmq. The two overlap
only if the sandbox is asked for before those imports: so ``python -m sandbox_kernel``
starts an :class:`EarlyStart` first (this module imports no Jupyter), and the kernel,
once built, takes it over (:func:`take`) instead of starting its own.

The kernel id comes from the connection file's name, as the kernel reads it; when the
launcher named the file in a way this reading misses, the kernel's id differs and it
starts afresh, ending what was started here (see :meth:`EarlyStart.abandon`).
"""

from __future__ import annotations

import concurrent.futures
import logging
import os
import re
import sys
import threading
from typing import TYPE_CHECKING, Any

from .backends import SandboxError, load_adapter
from .config import ConfigError, load_config
from .identity import notebook_metadata, scope_key
from .session import SandboxSession

if TYPE_CHECKING:
    from .connection import AgentConnection  # (imports asyncio: not before the sandbox is sought)

log = logging.getLogger("sandbox_kernel")

_CONNECTION_FILE = re.compile(r"kernel-(.+)\.json$")


class EarlyStart:
    """One kernel's session and the interpreter being started for it, in a thread."""

    def __init__(self, kernel_id: str | None) -> None:
        self.kernel_id = kernel_id
        self.session: SandboxSession | None = None
        self.error = ""
        self.agent: concurrent.futures.Future[AgentConnection] = concurrent.futures.Future()
        try:
            cfg = load_config(**notebook_choices())
            self.session = SandboxSession(
                cfg, scope_key(cfg, kernel_id), kernel_id or f"pid{os.getpid()}"
            )
            load_adapter(cfg)
        except (ConfigError, SandboxError) as exc:
            self.error = str(exc)
        threading.Thread(target=self._open, name="sandbox-connect", daemon=True).start()

    def open_agent(self) -> AgentConnection:
        """Find or create the sandbox and start an interpreter in it (blocking); a
        configuration that could not be read fails here, where a cell reports it."""
        if self.session is None:
            raise SandboxError(self.error)
        return self.session.open()

    def _open(self) -> None:
        """The interpreter goes to the kernel as soon as it answers; the books after."""
        if self.session is None:
            self.agent.set_exception(SandboxError(self.error))
            return
        try:
            agent = self.session.connect()
        except BaseException as exc:
            self.agent.set_exception(exc)
            return
        self.agent.set_result(agent)
        self.session.keep_books(agent)

    def abandon(self) -> None:
        """Not this kernel's after all: its interpreter ends once started, and its
        records go, so nothing is left under a kernel id that does not exist."""

        def end(done: concurrent.futures.Future[AgentConnection]) -> None:
            if not done.cancelled() and done.exception() is None:
                done.result().close()
            if self.session is not None:
                self.session.forget_kernel()

        self.agent.add_done_callback(end)


_pending: list[EarlyStart] = []  # the one started by ``begin``, until the kernel takes it


def begin(argv: list[str]) -> None:
    """Start reaching the sandbox for the kernel ``argv`` launches (``-f FILE``); a
    command that launches no kernel starts nothing."""
    connection_file = connection_file_of(argv)
    if connection_file is None:
        return
    log_to_stderr()
    _pending.append(EarlyStart(kernel_id_of(connection_file)))


def take(kernel_id: str | None) -> EarlyStart:
    """The start begun for this kernel, or a new one (none was begun, or it was begun
    under another id)."""
    while _pending:
        early = _pending.pop()
        if early.kernel_id == kernel_id:
            return early
        early.abandon()
    return EarlyStart(kernel_id)


def connection_file_of(argv: list[str]) -> str | None:
    """The connection file in a kernel's command line (``-f FILE``, ``-f=FILE``,
    ``--f=FILE``), as the kernelspec and Jupyter's launchers write it; the last one
    given, as the kernel's own reading takes it."""
    found = None
    for i, arg in enumerate(argv):
        if arg in ("-f", "--f") and i + 1 < len(argv):
            found = argv[i + 1]
        for prefix in ("-f=", "--f="):
            if arg.startswith(prefix):
                found = arg[len(prefix) :]
    return found


def kernel_id_of(connection_file: str) -> str | None:
    """The kernel id Jupyter put in the connection file's name (``kernel-ID.json``)."""
    match = _CONNECTION_FILE.search(os.path.basename(connection_file))
    return match.group(1) if match else None


def notebook_choices() -> dict[str, Any]:
    """flavor / snapshot from the notebook's ``metadata.sandbox``, unless the environment
    (a kernelspec variant, an admin) already fixes them: the environment wins."""
    meta = notebook_metadata(os.environ.get("JPY_SESSION_NAME"))
    return {
        name: meta[name]
        for name in ("flavor", "snapshot")
        if isinstance(meta.get(name), str) and not os.environ.get(f"SANDBOX_KERNEL_{name.upper()}")
    }


def log_to_stderr() -> None:
    """The ``sandbox_kernel`` logger (progress, settings ignored, lifecycle actions) at
    INFO on stderr, which `jupyter execute`, papermill and nbmake pass through to the
    job's log and a Jupyter server to its own log (set once per process)."""
    if log.handlers:
        return
    handler = logging.StreamHandler(sys.stderr)
    handler.setFormatter(logging.Formatter("[SandboxKernel] %(message)s"))
    log.addHandler(handler)
    log.setLevel(logging.INFO)
    log.propagate = False
