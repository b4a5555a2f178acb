"""What a kernel tells the rest of the installation about itself, off the cells' path.

Other processes decide things about this kernel's sandbox: the server's reaper stops
idle sandboxes and forgets kernels that died, the status bar shows what a starting
kernel is doing, the next kernel wants a warm interpreter. They
learn all of it from the state store (one SQLite file), which this module writes from
background threads, so a slow disk or a locked database never delays a cell, and a
failure here is logged, never shown in a notebook.
"""

from __future__ import annotations

import logging
import os
import socket
import threading
import time

from .lifecycle import gc
from .service import SandboxService
from .store import HEARTBEAT, KERNEL

log = logging.getLogger("sandbox_kernel")

GC_DELAY = 2.0  # seconds after the start before the kernel applies the lifecycle policies


class Housekeeping:
    """Heartbeats, progress lines, lifecycle and the warm spare of one kernel."""

    def __init__(
        self, service: SandboxService, kernel_id: str, kind: str = KERNEL, label: str = ""
    ) -> None:
        self.service = service
        self.kernel_id = kernel_id
        # A kernel, or an agent's interpreter (MCP) and its session name: listings tell
        # them apart, the lifecycle and the reaper treat both alike.
        self.kind = kind
        self.label = label
        self.sandbox_id = ""
        self.engine_id = ""
        self.busy = False
        self._wake = threading.Event()
        self._started = False
        self._gone = False
        self._start_lock = threading.Lock()
        # A record is written and forgotten under this lock: a beat that began before
        # gone() must not write the record back after gone() removed it (the listing
        # would show a kernel or agent session that ended, until it went stale).
        self._record_lock = threading.Lock()

    @property
    def _backend_name(self) -> str:
        return self.service.backend.name

    def start(self, sandbox_id: str, engine_id: str = "") -> None:
        """Beat for ``sandbox_id`` (the engine's ``engine_id``) from now on; the first call
        also starts the heartbeat and, a moment later, the once-per-kernel lifecycle
        check and the spare."""
        self.sandbox_id, self.engine_id = sandbox_id, engine_id
        with self._start_lock:
            first, self._started = not self._started, True
        if first:
            threading.Thread(
                target=self._heartbeat_loop, name="sandbox-heartbeat", daemon=True
            ).start()
            threading.Thread(
                target=self._after_start, name="sandbox-housekeeping", daemon=True
            ).start()
        self._wake.set()

    def set_busy(self, busy: bool) -> None:
        """A cell started or ended: beat now (the reaper's idle clock starts at the end)."""
        self.busy = busy
        self._wake.set()

    def report(self, sandbox_id: str, line: str) -> None:
        """A progress line of the kernel's own (making a sandbox, resizing it).

        Not a cell's output, so a batch run stores exactly what ipykernel would: the log
        has it, and the status bar shows it through the store.
        """
        log.info("%s", line)
        try:
            self.service.store.kernel_progress(
                self.kernel_id, self._backend_name, sandbox_id, line, self.kind, self.label
            )
        except Exception as exc:  # the status bar is a nicety: never a failure
            log.debug("could not record progress: %s", exc)

    def record_host(self, sandbox_id: str) -> None:
        """Record where this kernel runs (host name, pid), so the reaper forgets it at
        once should this process die without saying so (see lifecycle)."""
        with self._record_lock:
            if self._gone:
                return
            try:
                self.service.store.kernel_heartbeat(
                    self.kernel_id, self._backend_name, sandbox_id, False, self.kind, self.label
                )
                self.service.store.kernel_host(self.kernel_id, socket.gethostname(), os.getpid())
            except Exception as exc:  # bookkeeping: never a failure for the user
                log.debug("could not record the kernel's host: %s", exc)

    def gone(self) -> None:
        """The kernel shuts down: it no longer holds its sandbox busy or alive (and no
        later beat may say otherwise)."""
        with self._record_lock:
            self._gone = True
            try:
                self.service.store.kernel_gone(self.kernel_id)
            except Exception as exc:
                log.debug("could not record shutdown: %s", exc)

    def _heartbeat_loop(self) -> None:
        """Beats every HEARTBEAT seconds, and at once when a cell starts or ends (the cell
        only sets an event: the SQLite write stays off its path). While a cell runs, a
        backend that stops idle sandboxes by itself (Daytona) is told it is in use."""
        backend = self.service.backend
        while True:
            interval = HEARTBEAT
            if self.busy and backend.keep_alive_interval:
                interval = min(HEARTBEAT, backend.keep_alive_interval)
            self._wake.wait(interval)
            self._wake.clear()
            self._beat()

    def _beat(self) -> None:
        try:
            with self._record_lock:
                if not self.sandbox_id or self._gone:
                    return
                self.service.store.kernel_heartbeat(
                    self.kernel_id,
                    self._backend_name,
                    self.sandbox_id,
                    self.busy,
                    self.kind,
                    self.label,
                )
            if self.busy:
                self.service.backend.keep_alive(self.sandbox_id)
        except Exception as exc:  # best effort: a cell never fails for bookkeeping
            log.debug("heartbeat failed: %s", exc)

    def _after_start(self) -> None:
        """Once per kernel, a moment after its start (listing every sandbox must not
        compete with the kernel's first reply and first cell): apply the lifecycle
        policies (hosts without a server need it), then leave a warm spare in the sandbox
        for the next kernel (one per sandbox: a second one ends at once)."""
        time.sleep(GC_DELAY)
        backend = self.service.backend
        try:
            for action in gc(backend, self.service.config):
                log.info("lifecycle: %s %s (%s)", action.action, action.sandbox_id, action.reason)
        except Exception as exc:
            log.warning("lifecycle check failed: %s", exc)
        if not self.sandbox_id or not backend.keeps_spares:
            return
        try:
            backend.start_spare(self.sandbox_id)
        except Exception as exc:  # a spare only saves time: never an error for the user
            log.debug("no warm spare: %s", exc)
