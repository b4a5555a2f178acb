"""The one small SQLite file that remembers sandboxes across processes.

Engines keep what they can (Docker labels are immutable, a removed container leaves
nothing behind), so a few facts live here instead: which engine object a sandbox id
last pointed at (to tell "created" from "recreated after it vanished"), and when a
sandbox was last used (for the lifecycle policies). Every process opens the file
itself; WAL mode and a busy timeout make concurrent kernels, CLI and server safe.
"""

from __future__ import annotations

import os
import random
import sqlite3
import time
from collections.abc import Callable
from contextlib import closing
from dataclasses import dataclass
from pathlib import Path

from .config import SandboxConfig, setting_names
from .errors import SandboxError

_SCHEMA = """
CREATE TABLE IF NOT EXISTS sandboxes (
    id TEXT NOT NULL,
    backend TEXT NOT NULL,
    user TEXT NOT NULL,
    engine_id TEXT NOT NULL DEFAULT '',
    created REAL NOT NULL,
    last_activity REAL NOT NULL,
    spec TEXT NOT NULL DEFAULT '',
    PRIMARY KEY (backend, id)
);
CREATE TABLE IF NOT EXISTS kernels (
    kernel_id TEXT PRIMARY KEY,
    backend TEXT NOT NULL,
    sandbox_id TEXT NOT NULL,
    last_seen REAL NOT NULL,
    busy INTEGER NOT NULL DEFAULT 0,
    progress TEXT NOT NULL DEFAULT '',
    progress_at REAL NOT NULL DEFAULT 0
);
CREATE TABLE IF NOT EXISTS reservations (
    backend TEXT NOT NULL,
    sandbox_id TEXT NOT NULL,
    memory INTEGER NOT NULL,
    new INTEGER NOT NULL,
    expires REAL NOT NULL,
    PRIMARY KEY (backend, sandbox_id)
);
CREATE TABLE IF NOT EXISTS counters (
    name TEXT NOT NULL,
    labels TEXT NOT NULL,
    value REAL NOT NULL,
    PRIMARY KEY (name, labels)
);
CREATE TABLE IF NOT EXISTS lab_roots (
    user_id TEXT PRIMARY KEY,
    folder TEXT NOT NULL,
    at REAL NOT NULL
);
CREATE TABLE IF NOT EXISTS events (
    backend TEXT NOT NULL,
    sandbox_id TEXT NOT NULL,
    at REAL NOT NULL,
    line TEXT NOT NULL
);
CREATE INDEX IF NOT EXISTS events_of ON events (backend, sandbox_id, at)
"""
# Lines of a sandbox's log kept in the state file (``sandbox-kernel logs ID``), and for
# how long (days).
EVENTS_KEPT = 500
EVENTS_DAYS = 30
# A kernel beats every HEARTBEAT seconds; one silent for STALE_AFTER is taken as dead.
HEARTBEAT = 30.0
STALE_AFTER = 3 * HEARTBEAT
SETUP_WAIT = 30.0  # seconds a new state file may take to set up while others do the same


KERNEL = "kernel"  # a notebook's kernel holds the sandbox
AGENT = "agent"  # an agent's named interpreter (MCP) holds it


@dataclass(frozen=True)
class LiveSession:
    """Something that uses a sandbox now: a kernel, or an agent's named interpreter."""

    id: str
    busy: bool
    kind: str = KERNEL
    label: str = ""  # an agent session's name


@dataclass
class Reservation:
    """A sandbox another process is making or starting: it counts against the quotas."""

    sandbox_id: str
    memory: int
    new: bool


@dataclass
class Record:
    id: str
    backend: str
    user: str
    engine_id: str
    created: float
    last_activity: float
    spec: str = ""  # fingerprint of what it was made from
    flavor: str = ""  # its flavor now (a resize changes it; engine labels cannot follow)


class Store:
    """Records of sandboxes, keyed by (backend, sandbox id)."""

    def __init__(self, config: SandboxConfig) -> None:
        self.path = Path(config.state_dir) / "state.sqlite"
        self._checked = False

    def _connect(self) -> sqlite3.Connection:
        if not self._checked:
            self._prepare_folder()
        try:
            conn = sqlite3.connect(self.path, timeout=30, isolation_level=None)
            if not self._checked:  # WAL mode and the schema persist in the file: set them up once
                try:
                    self._set_up(conn)
                except sqlite3.Error:
                    conn.close()
                    raise
                self._checked = True
        except sqlite3.Error as exc:
            raise SandboxError(
                f"cannot use the state file {self.path} ({exc}); check {setting_names('state_dir')}"
            ) from None
        return conn

    def _set_up(self, conn: sqlite3.Connection) -> None:
        """WAL mode, the schema and its upgrades, retried while other processes do the same.

        Kernels starting together all set up a new file at once; SQLite's switch to WAL
        answers "locked" at once instead of waiting like a query, so we wait here.
        """
        deadline = time.monotonic() + SETUP_WAIT
        while True:
            try:
                self._set_up_once(conn)
                return
            except sqlite3.OperationalError as exc:
                if "locked" not in str(exc) or time.monotonic() > deadline:
                    raise
                time.sleep(random.uniform(0.01, 0.05))

    @staticmethod
    def _set_up_once(conn: sqlite3.Connection) -> None:
        if conn.execute("PRAGMA journal_mode").fetchone()[0] != "wal":
            # SQLite may answer with the old mode instead of an error: that is "locked" too.
            if conn.execute("PRAGMA journal_mode=WAL").fetchone()[0] != "wal":
                raise sqlite3.OperationalError("database is locked (switching to WAL)")
        conn.executescript(_SCHEMA)
        # State files from before owner specs were kept, and before flavors could
        # change in place. Several processes may upgrade at once: one wins.
        for table, column, kind in (
            ("sandboxes", "spec", "TEXT NOT NULL DEFAULT ''"),
            ("sandboxes", "flavor", "TEXT NOT NULL DEFAULT ''"),
            ("kernels", "progress", "TEXT NOT NULL DEFAULT ''"),
            ("kernels", "progress_at", "REAL NOT NULL DEFAULT 0"),
            ("kernels", "host", "TEXT NOT NULL DEFAULT ''"),
            ("kernels", "host_pid", "INTEGER NOT NULL DEFAULT 0"),
            # What holds the sandbox: a notebook's kernel, or an agent's interpreter
            # (MCP, see agent_sessions.py) and the session name it goes by.
            ("kernels", "kind", "TEXT NOT NULL DEFAULT 'kernel'"),
            ("kernels", "label", "TEXT NOT NULL DEFAULT ''"),
        ):
            try:
                conn.execute(f"ALTER TABLE {table} ADD COLUMN {column} {kind}")
            except sqlite3.OperationalError as exc:
                if "duplicate column" not in str(exc):
                    raise

    def _prepare_folder(self) -> None:
        """The state folder 0700 and the state file 0600: they say who owns which sandbox
        for this user's eyes only."""
        folder = self.path.parent
        try:
            folder.mkdir(parents=True, exist_ok=True, mode=0o700)
            if folder.stat().st_uid == os.geteuid() and folder.stat().st_mode & 0o077:
                folder.chmod(0o700)
            fd = os.open(self.path, os.O_RDWR | os.O_CREAT | os.O_NOFOLLOW | os.O_CLOEXEC, 0o600)
            try:
                if os.fstat(fd).st_mode & 0o077:
                    os.fchmod(fd, 0o600)
            finally:
                os.close(fd)
        except OSError as exc:
            raise SandboxError(
                f"cannot create the state folder {folder} ({exc.strerror}); set {setting_names('state_dir')} "
                "to a folder this user can write"
            ) from None

    def get(self, backend: str, sandbox_id: str) -> Record | None:
        with closing(self._connect()) as conn:
            row = conn.execute(
                "SELECT id, backend, user, engine_id, created, last_activity, spec, flavor"
                " FROM sandboxes WHERE backend = ? AND id = ?",
                (backend, sandbox_id),
            ).fetchone()
        return Record(*row) if row else None

    def all(self, backend: str) -> list[Record]:
        with closing(self._connect()) as conn:
            rows = conn.execute(
                "SELECT id, backend, user, engine_id, created, last_activity, spec, flavor"
                " FROM sandboxes WHERE backend = ?",
                (backend,),
            ).fetchall()
        return [Record(*row) for row in rows]

    def put(
        self,
        backend: str,
        sandbox_id: str,
        user: str,
        engine_id: str,
        spec: str = "",
        flavor: str = "",
    ) -> None:
        """Record (or re-point) a sandbox; keeps its activity time when it already exists."""
        now = time.time()
        with closing(self._connect()) as conn:
            conn.execute(
                "INSERT INTO sandboxes (id, backend, user, engine_id, created, last_activity, spec, flavor)"
                " VALUES (?, ?, ?, ?, ?, ?, ?, ?)"
                " ON CONFLICT (backend, id) DO UPDATE SET engine_id = excluded.engine_id,"
                " user = excluded.user, spec = excluded.spec, flavor = excluded.flavor,"
                " last_activity = MAX(last_activity, excluded.last_activity)",
                (sandbox_id, backend, user, engine_id, now, now, spec, flavor),
            )

    def touch(self, backend: str, sandbox_id: str, when: float | None = None) -> None:
        """Mark activity (a cell, a file transfer, an API call)."""
        with closing(self._connect()) as conn:
            _touch(conn, backend, sandbox_id, when or time.time())

    def delete(self, backend: str, sandbox_id: str) -> None:
        with closing(self._connect()) as conn:
            conn.execute(
                "DELETE FROM sandboxes WHERE backend = ? AND id = ?", (backend, sandbox_id)
            )

    def kernel_heartbeat(
        self,
        kernel_id: str,
        backend: str,
        sandbox_id: str,
        busy: bool,
        kind: str = KERNEL,
        label: str = "",
    ) -> None:
        """A kernel (or an agent session, ``kind`` AGENT named ``label``) says it is alive
        and whether code runs; a busy one is activity too."""
        now = time.time()
        with closing(self._connect()) as conn:
            conn.execute(
                "INSERT INTO kernels (kernel_id, backend, sandbox_id, last_seen, busy, kind, label)"
                " VALUES (?, ?, ?, ?, ?, ?, ?)"
                " ON CONFLICT (kernel_id) DO UPDATE SET backend = excluded.backend,"
                " sandbox_id = excluded.sandbox_id, last_seen = excluded.last_seen, busy = excluded.busy,"
                " kind = excluded.kind, label = excluded.label",
                (kernel_id, backend, sandbox_id, now, int(busy), kind, label),
            )
            if busy:
                _touch(conn, backend, sandbox_id, now)

    def kernel_progress(
        self,
        kernel_id: str,
        backend: str,
        sandbox_id: str,
        message: str,
        kind: str = KERNEL,
        label: str = "",
    ) -> None:
        """What a kernel is waiting for (making or starting its sandbox), or what changed:
        shown by the status bar and the server log, never stored in a notebook."""
        now = time.time()
        with closing(self._connect()) as conn:
            conn.execute(
                "INSERT INTO kernels (kernel_id, backend, sandbox_id, last_seen, busy, progress, progress_at, kind, label)"
                " VALUES (?, ?, ?, ?, 0, ?, ?, ?, ?) ON CONFLICT (kernel_id) DO UPDATE SET backend = excluded.backend,"
                " sandbox_id = excluded.sandbox_id, last_seen = excluded.last_seen,"
                " progress = excluded.progress, progress_at = excluded.progress_at,"
                " kind = excluded.kind, label = excluded.label",
                (kernel_id, backend, sandbox_id, now, message, now, kind, label),
            )

    def kernel_host(self, kernel_id: str, host: str, host_pid: int) -> None:
        """Where a kernel runs (this host's name, its pid): the reaper forgets it at once
        when that process is gone, rather than when its heartbeats go stale."""
        with closing(self._connect()) as conn:
            conn.execute(
                "UPDATE kernels SET host = ?, host_pid = ? WHERE kernel_id = ?",
                (host, host_pid, kernel_id),
            )

    def kernels_of_host(self, backend: str, host: str) -> list[tuple[str, int]]:
        """(kernel id, host pid) of the kernels recorded on ``host``."""
        with closing(self._connect()) as conn:
            return conn.execute(
                "SELECT kernel_id, host_pid FROM kernels WHERE backend = ? AND host = ? AND host_pid > 0",
                (backend, host),
            ).fetchall()

    def progress(self, backend: str, since: float) -> list[dict[str, object]]:
        """Kernels' progress messages newer than ``since`` (epoch seconds)."""
        with closing(self._connect()) as conn:
            rows = conn.execute(
                "SELECT kernel_id, sandbox_id, progress, progress_at FROM kernels"
                " WHERE backend = ? AND progress != '' AND progress_at >= ?",
                (backend, since),
            ).fetchall()
        return [{"kernel_id": k, "sandbox_id": s, "message": m, "at": at} for k, s, m, at in rows]

    def add_event(self, backend: str, sandbox_id: str, line: str) -> None:
        """One line of what happened to a sandbox (made, started, resized, lost, stopped
        by the lifecycle), for ``sandbox-kernel logs``; the newest EVENTS_KEPT are kept."""
        now = time.time()
        with closing(self._connect()) as conn:
            conn.execute(
                "INSERT INTO events (backend, sandbox_id, at, line) VALUES (?, ?, ?, ?)",
                (backend, sandbox_id, now, line[:2000]),
            )
            conn.execute(
                "DELETE FROM events WHERE backend = ? AND sandbox_id = ? AND at < ("
                " SELECT at FROM events WHERE backend = ? AND sandbox_id = ?"
                " ORDER BY at DESC LIMIT 1 OFFSET ?)",
                (backend, sandbox_id, backend, sandbox_id, EVENTS_KEPT - 1),
            )

    def forget_events(self, before: float) -> None:
        """Drop log lines older than ``before`` (epoch seconds): those of sandboxes long
        gone would otherwise stay (the lifecycle's run calls it)."""
        with closing(self._connect()) as conn:
            conn.execute("DELETE FROM events WHERE at < ?", (before,))

    def events(self, backend: str, sandbox_id: str) -> list[tuple[float, str]]:
        """(time, line) of a sandbox's log, oldest first."""
        with closing(self._connect()) as conn:
            return conn.execute(
                "SELECT at, line FROM events WHERE backend = ? AND sandbox_id = ? ORDER BY at",
                (backend, sandbox_id),
            ).fetchall()

    def put_lab_root(self, user_id: str, folder: str) -> None:
        """The root folder of the Jupyter server ``user_id`` ran last (see service.py)."""
        with closing(self._connect()) as conn:
            conn.execute(
                "INSERT INTO lab_roots (user_id, folder, at) VALUES (?, ?, ?)"
                " ON CONFLICT (user_id) DO UPDATE SET folder = excluded.folder, at = excluded.at",
                (user_id, folder, time.time()),
            )

    def lab_root(self, user_id: str) -> str:
        """What :meth:`put_lab_root` recorded for ``user_id`` ("" when nothing)."""
        with closing(self._connect()) as conn:
            row = conn.execute(
                "SELECT folder FROM lab_roots WHERE user_id = ?", (user_id,)
            ).fetchone()
        return str(row[0]) if row else ""

    def kernel_gone(self, kernel_id: str) -> None:
        with closing(self._connect()) as conn:
            conn.execute("DELETE FROM kernels WHERE kernel_id = ?", (kernel_id,))

    def live_kernels(
        self, backend: str, stale_after: float = STALE_AFTER
    ) -> dict[str, list[tuple[str, bool]]]:
        """Sandbox id -> [(id, busy)] of what holds each sandbox in use: kernels and agent
        sessions alike (the lifecycle treats both as users of the sandbox)."""
        return {
            sandbox_id: [(h.id, h.busy) for h in holders]
            for sandbox_id, holders in self.live_sessions(backend, stale_after).items()
        }

    def live_sessions(
        self, backend: str, stale_after: float = STALE_AFTER
    ) -> dict[str, list[LiveSession]]:
        """Sandbox id -> the kernels and agent sessions heard from recently (silent ones
        are dropped)."""
        cutoff = time.time() - stale_after
        with closing(self._connect()) as conn:
            conn.execute("DELETE FROM kernels WHERE last_seen < ?", (cutoff,))
            rows = conn.execute(
                "SELECT sandbox_id, kernel_id, busy, kind, label FROM kernels"
                " WHERE backend = ? AND last_seen >= ?",
                (backend, cutoff),
            ).fetchall()
        live: dict[str, list[LiveSession]] = {}
        for sandbox_id, kernel_id, busy, kind, label in rows:
            live.setdefault(sandbox_id, []).append(
                LiveSession(kernel_id, bool(busy), kind or KERNEL, label or "")
            )
        return live

    # -- quota reservations --------------------------------------------------------------
    def reserve(
        self,
        backend: str,
        sandbox_id: str,
        memory: int,
        new: bool,
        check: Callable[[list[Reservation]], None],
        ttl: float = 600.0,
    ) -> None:
        """Hold a place for a sandbox being made or started, if ``check`` allows it.

        ``check`` sees the other live reservations and raises to refuse; it runs while
        this process holds the state file's write lock, so of many processes at a
        quota's edge exactly the allowed number get through. A reservation ends with
        :meth:`release`, or by itself after ``ttl`` seconds (a crashed process).
        """
        with closing(self._connect()) as conn:
            conn.execute("BEGIN IMMEDIATE")
            try:
                conn.execute("DELETE FROM reservations WHERE expires < ?", (time.time(),))
                rows = conn.execute(
                    "SELECT sandbox_id, memory, new FROM reservations WHERE backend = ? AND sandbox_id != ?",
                    (backend, sandbox_id),
                ).fetchall()
                check([Reservation(r[0], r[1], bool(r[2])) for r in rows])
                conn.execute(
                    "INSERT OR REPLACE INTO reservations (backend, sandbox_id, memory, new, expires)"
                    " VALUES (?, ?, ?, ?, ?)",
                    (backend, sandbox_id, memory, int(new), time.time() + ttl),
                )
                conn.execute("COMMIT")
            except BaseException:
                conn.execute("ROLLBACK")
                raise

    def release(self, backend: str, sandbox_id: str) -> None:
        with closing(self._connect()) as conn:
            conn.execute(
                "DELETE FROM reservations WHERE backend = ? AND sandbox_id = ?",
                (backend, sandbox_id),
            )

    # -- counters: what happened, in any process, for the server's /metrics (events.py) --
    def add(self, rows: list[tuple[str, str, float]]) -> None:
        """Add ``value`` to each counter ``(name, labels, value)`` (labels as JSON), in one
        transaction."""
        with closing(self._connect()) as conn:
            conn.execute("BEGIN IMMEDIATE")
            try:
                conn.executemany(
                    "INSERT INTO counters (name, labels, value) VALUES (?, ?, ?)"
                    " ON CONFLICT (name, labels) DO UPDATE SET value = value + excluded.value",
                    rows,
                )
                conn.execute("COMMIT")
            except BaseException:
                conn.execute("ROLLBACK")
                raise

    def counters(self) -> list[tuple[str, str, float]]:
        """Every counter: (name, labels as JSON, value)."""
        with closing(self._connect()) as conn:
            return [
                (str(n), str(labels), float(v))
                for n, labels, v in conn.execute("SELECT name, labels, value FROM counters")
            ]


def _touch(conn: sqlite3.Connection, backend: str, sandbox_id: str, when: float) -> None:
    """Activity at ``when``; never moves a sandbox's last activity back."""
    conn.execute(
        "UPDATE sandboxes SET last_activity = MAX(last_activity, ?) WHERE backend = ? AND id = ?",
        (when, backend, sandbox_id),
    )
