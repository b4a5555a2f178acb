"""Sandboxes without an engine: the workspace folder plus processes started in it.

This is the embedded default when no container engine answers (``backend=auto``).
When bubblewrap (``bwrap``) works, each process gets its own namespaces and sees only
the system folders (read-only), its workspace at /workspace, a private HOME at
/home/sandbox and an empty /tmp; otherwise the processes are plain children of the
host with the workspace as working folder. Either way the isolation is weaker than a
container's (no memory/CPU cgroup limits), and ``SandboxInfo.isolation`` says so.

Everything that must outlive a process is on disk under ``<state_dir>/local/``:
``<id>.json`` (the record), ``<id>/home`` (tier-2 files: ``pip install`` lands here),
``<id>/procs/<pgid>`` (live process groups, so stop and destroy can end them from any
process). ``SANDBOX_KERNEL_LOCAL_NO_BWRAP=1`` forces plain processes.
"""

from __future__ import annotations

import builtins
import fcntl
import json
import os
import resource
import shutil
import signal
import struct
import subprocess
import sys
import tempfile
import termios
import threading
import time
import uuid
from collections.abc import Iterator
from functools import lru_cache
from pathlib import Path, PurePosixPath
from typing import IO, Any

from ..errors import FileMissing
from ..identity import ScopeKey
from ..safefs import Beneath, make_folder
from .base import (
    LABEL_INSTALLATION,
    LABEL_SPEC,
    LABEL_WORKSPACE,
    SHARED,
    WORKSPACE,
    AlreadyExists,
    Backend,
    Channel,
    EngineSettings,
    ExecResult,
    Health,
    Progress,
    Pty,
    SandboxError,
    SandboxFailed,
    SandboxInfo,
    Spec,
    not_found,
)

HOME = "/home/sandbox"
BWRAP_ISOLATION = (
    "bubblewrap (own namespaces, read-only system; no memory/CPU limits: weaker than a container)"
)
PLAIN_ISOLATION = "none: plain host processes in the workspace folder, no isolation"
# An egress allowlist needs a proxy outside the sandbox that only it can reach; this
# backend has none yet, so a sandbox with a list gets no network at all (closed, never
# open) and says so.
EGRESS_CLOSED = "; egress_allow: no network at all (this backend cannot enforce an allowlist)"


@lru_cache(maxsize=1)
def bwrap_works() -> bool:
    """Whether bubblewrap can create namespaces here (it can't in some containers)."""
    if os.environ.get("SANDBOX_KERNEL_LOCAL_NO_BWRAP") == "1" or not shutil.which("bwrap"):
        return False
    try:
        probe = subprocess.run(
            ["bwrap", "--ro-bind", "/", "/", "--unshare-all", "--die-with-parent", "true"],
            capture_output=True,
            timeout=10,
        )
    except (OSError, subprocess.TimeoutExpired):
        return False
    return probe.returncode == 0


class LocalChannel(Channel):
    """stdin/stdout pipes of a child process; closing ends its whole process group."""

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
        locked = self._lock.acquire(timeout=0.5)
        if not locked:
            # A write is blocked on a process that does not read (one a cell froze, with
            # the agent's source bigger than a pipe holds): ending the process ends that
            # write, which holds stdin until then (unless a process outside the group
            # holds the pipe too: then stdin is left to the writer).
            _kill_group(self.proc.pid)
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
            _kill_group(self.proc.pid)
            self.proc.wait()
        self._marker.unlink(missing_ok=True)


class LocalPty(Pty):
    """The master side of the pseudo-terminal of a (bubblewrap'd) child process.

    Closing it hangs the terminal up (SIGHUP to the shell's session), then ends the
    child's process group if it has not gone within a second."""

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
            _kill_group(self.proc.pid)
            self.proc.wait()
        self._marker.unlink(missing_ok=True)


def _kill_group(pgid: int) -> None:
    try:
        os.killpg(pgid, signal.SIGKILL)
    except (ProcessLookupError, PermissionError):
        pass


class LocalBackend(Backend):
    """Sandboxes as workspace folders and (bubblewrap'd) child processes."""

    # Each channel is its own bubblewrap with its own /tmp: a spare could never be reached.
    keeps_spares = False
    uses_images = False

    name = "local"
    resizes = True

    def __init__(self, settings: EngineSettings) -> None:
        super().__init__(settings)
        self.root = Path(settings.state_dir) / "local"

    # -- records ----------------------------------------------------------------
    def _record_path(self, sandbox_id: str) -> Path:
        if "/" in sandbox_id or sandbox_id.startswith("."):
            raise not_found(sandbox_id)
        return self.root / f"{sandbox_id}.json"

    def _load(self, sandbox_id: str) -> dict[str, Any] | None:
        try:
            return json.loads(self._record_path(sandbox_id).read_text())
        except (OSError, ValueError):
            return None

    def _save(self, record: dict[str, Any]) -> None:
        path = self._record_path(record["id"])
        fd, tmp = tempfile.mkstemp(dir=self.root, prefix=".rec-")
        with os.fdopen(fd, "w") as fh:
            json.dump(record, fh)
        os.replace(tmp, path)

    def _info(self, record: dict[str, Any]) -> SandboxInfo:
        isolation = BWRAP_ISOLATION if bwrap_works() else PLAIN_ISOLATION
        if record.get("egress_allow"):
            isolation += EGRESS_CLOSED
        labels = record.get("labels", {})
        return SandboxInfo(
            id=record["id"],
            backend=self.name,
            scope=record["scope"],
            user=record["user"],
            thread=record["thread"],
            state=record["state"],
            image=f"host python {'.'.join(map(str, sys.version_info[:3]))}",
            created=record["created"],
            engine_id=record["engine_id"],
            flavor=record["flavor"],
            isolation=isolation,
            workspace=record["workspace"],
            limits={
                "memory": record.get("memory", 0),
                "cpus": 0,
                "pids": 0,
                "network": record.get("network", True),
                **({"egress_allow": record["egress_allow"]} if record.get("egress_allow") else {}),
            },
            finished=record.get("stopped_at", 0.0) if record["state"] == "stopped" else 0.0,
            started=record.get("started_at", record["created"])
            if record["state"] == "running"
            else 0.0,
            spec=labels.get(LABEL_SPEC, ""),
            installation=labels.get(LABEL_INSTALLATION, ""),
            work_folder=record.get("work_folder", ""),
        )

    # -- engine -------------------------------------------------------------------
    def health(self) -> Health:
        how = "bubblewrap works" if bwrap_works() else "bubblewrap unavailable: plain processes"
        return Health(True, self.name, f"local sandboxes ({how})")

    # -- sandboxes ------------------------------------------------------------------
    def find(self, sandbox_id: str) -> SandboxInfo | None:
        record = self._load(sandbox_id)
        return None if record is None else self._info(record)

    def create(
        self, sandbox_id: str, key: ScopeKey, spec: Spec, labels: dict[str, str], progress: Progress
    ) -> SandboxInfo:
        if spec.egress and spec.network and not bwrap_works():
            raise SandboxFailed(
                "egress_allow is set, and the local backend cannot hold a sandbox to it (nor "
                "keep it off the network) without bubblewrap: install bubblewrap, use Docker, "
                "or clear egress_allow"
            )
        self.root.mkdir(parents=True, exist_ok=True)
        workspace = make_folder(Path(self.settings.workspace_root), key.user_id)
        progress(f"creating local sandbox {sandbox_id} in {workspace}")
        record = {
            "id": sandbox_id,
            "user": key.user,
            "scope": key.scope,
            "thread": key.thread,
            "state": "running",
            "created": time.time(),
            "engine_id": uuid.uuid4().hex,
            "flavor": spec.flavor,
            "memory": spec.memory,
            "network": spec.network and not spec.egress,
            "egress_allow": list(spec.egress) if spec.network else [],
            "shared_folder": spec.shared_folder,
            "work_folder": spec.work_folder,
            "masks": [list(m) for m in spec.masks],
            "workspace": str(workspace),
            "labels": {**labels, LABEL_WORKSPACE: str(workspace)},
        }
        (self.root / sandbox_id / "home").mkdir(parents=True, exist_ok=True)
        (self.root / sandbox_id / "procs").mkdir(parents=True, exist_ok=True)
        try:  # O_EXCL: of many processes creating at once, exactly one writes the record
            fd = os.open(self._record_path(sandbox_id), os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
        except FileExistsError:
            deadline = time.monotonic() + 5
            while self._load(sandbox_id) is None and time.monotonic() < deadline:
                time.sleep(0.02)  # the winner is still writing it
            raise AlreadyExists(f"{sandbox_id} was made by another process") from None
        with os.fdopen(fd, "w") as fh:
            json.dump(record, fh)
        return self._info(record)

    def resize(self, sandbox_id: str, spec: Spec) -> bool:
        """Local processes get their memory limit at start: the record is all there is."""
        record = self._load(sandbox_id)
        if record is None:
            raise not_found(sandbox_id)
        record["flavor"], record["memory"] = spec.flavor, spec.memory
        self._save(record)
        return True

    def get(self, sandbox_id: str) -> SandboxInfo:
        record = self._load(sandbox_id)
        if record is None:
            raise not_found(sandbox_id)
        return self._info(record)

    def list(self, user: str | None = None) -> list[SandboxInfo]:
        if not self.root.is_dir():
            return []
        records = (self._load(p.stem) for p in self.root.glob("*.json"))
        return sorted(
            (self._info(r) for r in records if r and (user is None or r["user"] == user)),
            key=lambda i: i.id,
        )

    def _end_processes(self, sandbox_id: str) -> None:
        procs = self.root / sandbox_id / "procs"
        for marker in procs.glob("*") if procs.is_dir() else []:
            if marker.name.isdigit():
                _kill_group(int(marker.name))
            marker.unlink(missing_ok=True)

    def stop(self, sandbox_id: str) -> SandboxInfo:
        record = self._load(sandbox_id)
        if record is None:
            raise not_found(sandbox_id)
        self._end_processes(sandbox_id)
        record["state"] = "stopped"
        record["stopped_at"] = time.time()
        self._save(record)
        return self._info(record)

    def start(self, sandbox_id: str, progress: Progress | None = None) -> SandboxInfo:
        record = self._load(sandbox_id)
        if record is None:
            raise not_found(sandbox_id)
        if record["state"] != "running":
            record["state"] = "running"
            record["started_at"] = time.time()
            self._save(record)
        return self._info(record)

    def destroy(self, sandbox_id: str) -> bool:
        if self._load(sandbox_id) is None:
            return False
        self._end_processes(sandbox_id)
        try:
            self._record_path(sandbox_id).unlink()
        except FileNotFoundError:
            return False  # another process destroyed it first
        shutil.rmtree(
            self.root / sandbox_id, ignore_errors=True
        )  # HOME: tier 2 goes; workspace stays
        return True

    # -- processes -------------------------------------------------------------------
    def host_path(self, sandbox_id: str, sandbox_path: str) -> Path:
        """The host file behind a sandbox path under /workspace (or /shared)."""
        record = self._running(sandbox_id)
        path = PurePosixPath(sandbox_path)
        for mount, host in (
            (WORKSPACE, record["workspace"]),
            (SHARED, record.get("shared_folder", "")),
        ):
            if host and (path == PurePosixPath(mount) or PurePosixPath(mount) in path.parents):
                return Path(host, *path.relative_to(mount).parts)
        raise SandboxError(f"{sandbox_path} is not under {WORKSPACE}")

    def _running(self, sandbox_id: str) -> dict[str, Any]:
        record = self._load(sandbox_id)
        if record is None:
            raise not_found(sandbox_id)
        if record["state"] != "running":
            raise SandboxError(
                f"sandbox {sandbox_id} is {record['state']}; start it with `sandbox-kernel start {sandbox_id}`"
            )
        return record

    def _command(
        self,
        record: dict[str, Any],
        cmd: builtins.list[str],
        cwd: str,
        env: dict[str, str] | None,
        new_session: bool = True,
    ) -> tuple[builtins.list[str], dict[str, str], str]:
        """argv, environment and host cwd for a process of this sandbox.

        ``new_session=False`` (a terminal of ours, see :meth:`open_pty`): bubblewrap does
        not call setsid, since the process already leads a session whose controlling
        terminal is a new pseudo-terminal, never the host's."""
        if cmd and cmd[0] in ("python3", "python"):
            cmd = [
                sys.executable,
                *cmd[1:],
            ]  # the interpreter running sandbox-kernel: it has IPython
        home = self.root / record["id"] / "home"
        home.mkdir(parents=True, exist_ok=True)
        base_env = {
            # No ~/.local/bin: the host's programs must not find a planted python3 (the
            # agent puts it first for cells, agent.as_user for the user's commands).
            "PATH": f"{os.path.dirname(sys.executable)}:/usr/local/bin:/usr/bin:/bin",
            "LANG": os.environ.get("LANG", "C.UTF-8"),
            "USER": "sandbox",
            "LOGNAME": "sandbox",
            "PYTHONUNBUFFERED": "1",
            "PIP_BREAK_SYSTEM_PACKAGES": "1",
            "PIP_USER": "1",  # the interpreter's site-packages are the host's: never write there
        }
        if not bwrap_works():
            work = record.get("work_folder") or ""
            if cwd.startswith(WORKSPACE):
                host_cwd = str(self.host_path(record["id"], cwd))
            elif work and (cwd == work or cwd.startswith(work + "/")):
                host_cwd = cwd  # the work folder is at its own path
            else:
                host_cwd = record["workspace"]
            return cmd, {**base_env, "HOME": str(home), **(env or {})}, host_cwd
        # No --die-with-parent: it fires when the *thread* that started the child ends,
        # and connections are made from worker threads. Processes end on EOF of stdin
        # (the channel's close or the kernel's death) or with their process group.
        argv = ["bwrap", "--unshare-all"] + (["--new-session"] if new_session else [])
        if record.get("network", True):
            argv.append("--share-net")
        if os.getuid() == 0:
            argv += ["--uid", "1000", "--gid", "1000"]
        for top in ("/usr", "/bin", "/lib", "/lib64", "/sbin", "/etc"):
            if os.path.islink(top):
                argv += ["--symlink", os.readlink(top), top]
            elif os.path.isdir(top):
                argv += ["--ro-bind", top, top]
        argv += ["--proc", "/proc", "--dev", "/dev", "--tmpfs", "/tmp"]
        for prefix in {sys.prefix, sys.base_prefix}:
            if not prefix.startswith("/usr/"):
                argv += ["--ro-bind", prefix, prefix]
        argv += ["--bind", record["workspace"], WORKSPACE, "--bind", str(home), HOME]
        if record.get("shared_folder"):
            argv += ["--ro-bind", record["shared_folder"], SHARED]
        work = record.get("work_folder") or ""
        if work and os.path.isdir(work):
            argv += ["--bind", work, work]
            for path, kind in record.get("masks") or []:
                if kind == "read-only":
                    argv += ["--ro-bind", path, path]
                elif os.path.isdir(path):
                    argv += ["--tmpfs", path]
                else:
                    argv += ["--ro-bind", "/dev/null", path]
        argv += ["--chdir", cwd, "--clearenv"]
        for name, value in {**base_env, "HOME": HOME, **(env or {})}.items():
            argv += ["--setenv", name, value]
        return argv + ["--", *cmd], {}, record["workspace"]

    def _spawn(
        self,
        sandbox_id: str,
        cmd: builtins.list[str],
        cwd: str,
        env: dict[str, str] | None,
        terminal: bool = False,
        **kw: Any,
    ) -> tuple[subprocess.Popen[bytes], Path]:
        record = self._running(sandbox_id)
        argv, child_env, host_cwd = self._command(record, cmd, cwd, env, new_session=not terminal)
        memory = int(record.get("memory") or 1 << 30)

        def limits() -> None:  # runs in the child before exec
            try:
                resource.setrlimit(resource.RLIMIT_DATA, (memory, memory))
            except (ValueError, OSError):
                pass
            if terminal:  # new session (start_new_session): stdin, a new pty, becomes its tty
                fcntl.ioctl(0, termios.TIOCSCTTY, 0)

        try:
            proc = subprocess.Popen(
                argv,
                cwd=host_cwd,
                env=child_env or None,
                start_new_session=True,
                preexec_fn=limits,
                **kw,
            )
        except OSError as exc:
            raise SandboxError(f"cannot start {cmd[0]} in {sandbox_id}: {exc}") from None
        marker = self.root / sandbox_id / "procs" / str(proc.pid)
        marker.parent.mkdir(parents=True, exist_ok=True)
        marker.touch()
        return proc, marker

    def open_channel(
        self,
        sandbox_id: str,
        cmd: builtins.list[str],
        *,
        cwd: str = WORKSPACE,
        env: dict[str, str] | None = None,
    ) -> LocalChannel:
        log = (self.root / sandbox_id / "stderr.log").open("ab")
        try:
            proc, marker = self._spawn(
                sandbox_id, cmd, cwd, env, stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=log
            )
        finally:
            log.close()
        return LocalChannel(proc, marker)

    def open_pty(
        self,
        sandbox_id: str,
        cmd: builtins.list[str],
        *,
        cwd: str = WORKSPACE,
        env: dict[str, str] | None = None,
        rows: int = 24,
        cols: int = 80,
    ) -> LocalPty:
        """``cmd`` in the sandbox's isolation on a pseudo-terminal made for it.

        Never the host's own terminal: a sandboxed process holding the user's terminal
        could push keystrokes into it (TIOCSTI) or rewrite its console (TIOCLINUX), and
        they would run on the host. It gets the slave of a new pair as stdin, stdout,
        stderr and controlling terminal of a session of its own (so Ctrl-C and job
        control work); the host keeps the master and relays it.
        """
        master, slave = os.openpty()  # both close-on-exec: only fds 0-2 reach the child
        try:
            fcntl.ioctl(slave, termios.TIOCSWINSZ, struct.pack("HHHH", rows, cols, 0, 0))
            proc, marker = self._spawn(
                sandbox_id,
                cmd,
                cwd,
                env,
                terminal=True,
                stdin=slave,
                stdout=slave,
                stderr=slave,
            )
        except BaseException:
            os.close(master)
            raise
        finally:
            os.close(slave)
        return LocalPty(proc, marker, master)

    def exec(
        self,
        sandbox_id: str,
        cmd: builtins.list[str],
        *,
        cwd: str = WORKSPACE,
        env: dict[str, str] | None = None,
        timeout: float | None = None,
    ) -> ExecResult:
        proc, marker = self._spawn(
            sandbox_id,
            cmd,
            cwd,
            env,
            stdin=subprocess.DEVNULL,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
        )
        try:
            out, _ = proc.communicate(timeout=timeout)
            code = proc.returncode
        except subprocess.TimeoutExpired:
            _kill_group(proc.pid)
            out, _ = proc.communicate()
            out += f"timed out after {timeout} s\n".encode()
            code = 124
        finally:
            marker.unlink(missing_ok=True)
        return ExecResult(code if code >= 0 else 128 - code, out)

    # -- files ------------------------------------------------------------------------
    def _files(self, sandbox_id: str, path: str) -> tuple[Beneath, str]:
        """The workspace (as a :class:`Beneath`) and the path in it, for a workspace path.

        The workspace is as hostile here as under Docker (a bubblewrap'd cell can plant
        links and FIFOs in it), so files are reached through descriptors only.
        """
        record = self._load(sandbox_id)
        if record is None:
            raise not_found(sandbox_id)
        pure = PurePosixPath(path)
        if pure.is_absolute():
            if not (pure == PurePosixPath(WORKSPACE) or PurePosixPath(WORKSPACE) in pure.parents):
                raise SandboxError(f"{path!r} is outside {WORKSPACE}")
            pure = pure.relative_to(WORKSPACE)
        return Beneath(record["workspace"]), str(pure)

    def put_file(self, sandbox_id: str, path: str, data: bytes | IO[bytes]) -> None:
        files, rel = self._files(sandbox_id, path)
        upload = files.start_write(rel)
        try:
            if isinstance(data, bytes | bytearray):
                upload.write(bytes(data))
            else:
                while chunk := data.read(1 << 20):
                    upload.write(chunk)
            upload.commit()
        finally:
            upload.abort()  # no-op after a commit

    def get_file(self, sandbox_id: str, path: str) -> Iterator[bytes]:
        files, rel = self._files(sandbox_id, path)
        try:
            _, chunks = files.read_chunks(rel)
        except FileMissing:
            raise SandboxError(f"no file {path!r} in sandbox {sandbox_id}") from None
        yield from chunks
