"""The attacker and the server's side of the file-route attack tests: an attack loop
inside a Docker sandbox (:class:`Attacker`), host secrets outside the workspace, and
raw requests to the server. ``test_hostile_files.py`` holds the attacks;
``test_hostile_files_local.py`` runs them again against a local sandbox by replacing
:class:`Attacker` and :func:`sandbox_run`.
"""

from __future__ import annotations

import asyncio
import errno
import json
import os
import socket
import stat
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import docker
import pytest
from tornado.httpclient import HTTPClientError

SECRET = b"HOST-SECRET"
MAX_UPLOAD = 1 << 20  # the server's max_upload_size in this module
ATTACK_SECONDS = 30  # no attack loop outlives this, whatever the test does
PHASE_SECONDS = 20  # and no race phase of a test lasts longer than this
REQUEST_SECONDS = 10  # one request (5 s where the contract says "quickly")


# -- fixtures -------------------------------------------------------------------------


@dataclass
class FifoRescue:
    """FIFOs the server might still be blocked on, held by O_PATH descriptors.

    An ``open(O_RDONLY)`` of a FIFO blocks until a writer comes; a server thread stuck
    there keeps the Python process from exiting. The rescue can always reach the FIFO
    (even once renamed or replaced) through ``/proc/self/fd``.
    """

    fds: list[int] = field(default_factory=list)

    def watch(self, path: Path) -> int:
        fd = os.open(path, os.O_PATH | os.O_NOFOLLOW)
        self.fds.append(fd)
        return fd

    def release(self, seconds: float = 3.0) -> int:
        """Give every blocked reader a writer (then EOF); how many times one was there."""
        return sum(release_fifo_readers(fd, seconds) for fd in self.fds)


@pytest.fixture
def fifo_rescue() -> Iterator[FifoRescue]:
    """Set up before the server, so its teardown runs after the server's shutdown.

    Any reader still blocked then is a server thread the shutdown left behind: the
    test errors at teardown (and the reader is released so pytest can exit).
    """
    rescue = FifoRescue()
    yield rescue
    try:
        left = rescue.release()
    finally:
        for fd in rescue.fds:
            os.close(fd)
    if left:
        pytest.fail(
            f"after the Jupyter server shut down, server threads were still blocked opening a FIFO "
            f"of the workspace (a writer had to release them {left} time(s)); they would have kept the process from exiting",
            pytrace=False,
        )


@pytest.fixture
def jp_server_config(rest_env: dict[str, str], fifo_rescue: FifoRescue) -> dict[str, Any]:
    return {
        "ServerApp": {"jpserver_extensions": {"jupyter_ext": True}},
        "SandboxExtension": {"gc_interval": 0, "max_upload_size": MAX_UPLOAD},
    }


@dataclass
class HostSecrets:
    """Host files the sandbox must never reach, and a check that they are intact."""

    file: Path  # 0600, SECRET
    folder: Path  # f = SECRET, host-only.txt
    mode: int
    uid: int
    gid: int

    NAMES = frozenset({"f", "host-only.txt"})

    def problems(self) -> list[str]:
        found = []
        st = os.lstat(self.file)
        if not stat.S_ISREG(st.st_mode):
            found.append(f"the host secret file is no longer a regular file (mode {st.st_mode:o})")
        else:
            if stat.S_IMODE(st.st_mode) != self.mode:
                found.append(
                    f"the host secret's mode changed: {stat.S_IMODE(st.st_mode):o} (was {self.mode:o})"
                )
            if (st.st_uid, st.st_gid) != (self.uid, self.gid):
                found.append(
                    f"the host secret's owner changed: {st.st_uid}:{st.st_gid} (was {self.uid}:{self.gid})"
                )
            if self.file.read_bytes() != SECRET:
                found.append("the host secret's content changed")
        names = set(os.listdir(self.folder))
        if names != self.NAMES:
            found.append(f"the host folder changed: {sorted(names)} (was {sorted(self.NAMES)})")
        if "f" in names and (self.folder / "f").read_bytes() != SECRET:
            found.append("the host folder's f changed")
        return found

    def restore(self) -> None:
        """Put things back after a violation, so the next try is measured afresh."""
        if os.path.islink(self.file) or not self.file.is_file():
            self.file.unlink(missing_ok=True)
        self.file.write_bytes(SECRET)
        os.chmod(self.file, self.mode)
        os.chown(self.file, self.uid, self.gid)
        for name in set(os.listdir(self.folder)) - self.NAMES:
            extra = self.folder / name
            if extra.is_dir() and not extra.is_symlink():
                for sub in extra.iterdir():
                    sub.unlink()
                extra.rmdir()
            else:
                extra.unlink()
        (self.folder / "f").write_bytes(SECRET)
        (self.folder / "host-only.txt").write_bytes(b"only on the host")


def make_host_folder(path: Path, first: str = "f") -> Path:
    path.mkdir()
    (path / first).write_bytes(SECRET)
    (path / "host-only.txt").write_bytes(b"only on the host")
    return path


@pytest.fixture
def secrets(tmp_path: Path) -> HostSecrets:
    """The host secrets, outside the workspace (tmp_path/ws is the workspace root)."""
    file = tmp_path / "host-secret.txt"
    file.write_bytes(SECRET)
    os.chmod(file, 0o600)
    folder = make_host_folder(tmp_path / "host-folder")
    st = file.stat()
    return HostSecrets(file, folder, 0o600, st.st_uid, st.st_gid)


# -- the attacker ---------------------------------------------------------------------

# Runs inside the sandbox as the sandbox user, cwd /workspace. It execs the attack body
# with: running() (False once the host closes our stdin or ATTACK_SECONDS passed),
# ready() (tells the host the setup is done), stats (a dict reported at the end) and
# ARGS (JSON from the host). The last line it prints is "STATS {json}".
_WRAPPER = r"""
import json, os, sys, threading, time
stop = threading.Event()
def _watch():
    try:
        while sys.stdin.buffer.read1(65536):
            pass
    except Exception:
        pass
    stop.set()
threading.Thread(target=_watch, daemon=True).start()
deadline = time.monotonic() + float(sys.argv[2])
stats = {"loops": 0}
def running():
    return not stop.is_set() and time.monotonic() < deadline
def ready():
    sys.stdout.write("READY\n")
    sys.stdout.flush()
os.chdir("/workspace")
try:
    exec(sys.argv[1], {"running": running, "ready": ready, "stats": stats, "ARGS": json.loads(sys.argv[3])})
except BaseException as exc:
    stats["crash"] = repr(exc)
stats["ended"] = "stopped" if stop.is_set() else "deadline"
sys.stdout.write("STATS " + json.dumps(stats) + "\n")
sys.stdout.flush()
"""


class Attacker:
    """One attack loop running inside the sandbox (a ``docker exec`` with stdin)."""

    def __init__(self, container: str, body: str, args: dict[str, Any], seconds: float) -> None:
        self.api = docker.from_env().api
        cmd = ["python3", "-c", _WRAPPER, body, str(seconds), json.dumps(args)]
        self.exec_id = self.api.exec_create(
            container, cmd, stdin=True, stdout=True, stderr=True, workdir="/workspace"
        )["Id"]
        self._keep = self.api.exec_start(
            self.exec_id, socket=True
        )  # the SDK object owns the socket
        self._sock = getattr(self._keep, "_sock", self._keep)
        self._sock.settimeout(None)
        self.output = bytearray()
        self.ready = threading.Event()
        self.done = threading.Event()
        self.stats: dict[str, Any] | None = None
        threading.Thread(target=self._read, daemon=True).start()

    def _read(self) -> None:
        from docker.utils.socket import frames_iter

        try:
            for _stream, data in frames_iter(self._sock, tty=False):
                self.output += data
                if b"READY\n" in self.output:
                    self.ready.set()
        except (OSError, ValueError):
            pass
        finally:
            self.done.set()

    def stop(self, timeout: float = 15.0) -> dict[str, Any]:
        if self.stats is not None:
            return self.stats
        try:
            self._sock.shutdown(socket.SHUT_WR)  # stdin EOF: the loop ends
        except OSError:
            pass
        finished = self.done.wait(timeout)
        try:
            self._sock.close()
        except OSError:
            pass
        text = self.output.decode("utf-8", "replace")
        line = next((ln for ln in reversed(text.splitlines()) if ln.startswith("STATS ")), None)
        assert finished and line, f"the attack loop did not report (test bug): {text[-2000:]!r}"
        self.stats = json.loads(line[6:])
        return self.stats


_ATTACKERS: list[Attacker] = []


@pytest.fixture(autouse=True)
def _stop_attackers() -> Iterator[None]:
    yield
    while _ATTACKERS:
        attacker = _ATTACKERS.pop()
        try:
            attacker.stop(timeout=5)
        except AssertionError:
            pass


def start_attack(
    container: str, body: str, seconds: float = ATTACK_SECONDS, **args: Any
) -> Attacker:
    """Start ``body`` as a bounded attack loop inside the sandbox; return once it is set up."""
    attacker = Attacker(container, body, args, seconds)
    _ATTACKERS.append(attacker)
    deadline = time.monotonic() + 20
    while not attacker.ready.wait(0.05):
        if attacker.done.is_set() or time.monotonic() > deadline:
            raise AssertionError(
                f"the attack loop did not start (test bug): {bytes(attacker.output)[-2000:]!r}"
            )
    return attacker


def finish_attack(attacker: Attacker, **minimum: int) -> dict[str, Any]:
    """Stop the loop and wait for it; check it really ran for the whole phase.

    ``minimum`` gives counters of its report that must have reached a value (the proof
    that it attacked). A loop that crashed or ran out of time before the phase ended
    is a bug of this test, not a pass.
    """
    stats = attacker.stop()
    assert "crash" not in stats, f"the attack loop crashed (test bug): {stats}"
    assert stats["ended"] == "stopped", (
        f"the attack loop ended before the phase did (test bug): {stats}"
    )
    for key, least in minimum.items():
        assert stats.get(key, 0) >= least, (
            f"the attack did not happen ({key} < {least}; test bug): {stats}"
        )
    return stats


def sandbox_run(container: str, code: str, **args: Any) -> bytes:
    """Run a short python3 setup script in the sandbox as the sandbox user (cwd /workspace)."""
    result = (
        docker.from_env()
        .containers.get(container)
        .exec_run(["python3", "-c", code, json.dumps(args)], workdir="/workspace")
    )
    assert result.exit_code == 0, (
        f"setup in the sandbox failed (test bug): {result.output[-2000:]!r}"
    )
    return result.output


# renameat2(RENAME_EXCHANGE): swaps two names atomically, so at every instant each of
# the two names exists and is either the real folder or the link out.
EXCHANGE = r"""
import ctypes, platform
libc = ctypes.CDLL(None, use_errno=True)
NR = {"x86_64": 316, "aarch64": 276}[platform.machine()]
a, b = ARGS["a"].encode(), ARGS["b"].encode()
stats["swaps"] = stats["failed"] = 0
ready()
while running():
    stats["loops"] += 1
    if libc.syscall(NR, -100, a, -100, b, 2) == 0:
        stats["swaps"] += 1
    else:
        stats["failed"] += 1
"""


def saw_both(path: Path, seconds: float = 3.0) -> None:
    """Host-side proof that the exchange runs: ``path`` is seen as a folder and as a link."""
    kinds: set[str] = set()
    deadline = time.monotonic() + seconds
    while kinds != {"dir", "link"} and time.monotonic() < deadline:
        mode = os.lstat(path).st_mode
        kinds.add("link" if stat.S_ISLNK(mode) else "dir" if stat.S_ISDIR(mode) else "other")
    assert kinds == {"dir", "link"}, f"the host never saw {path.name} swapped (test bug): {kinds}"


def release_fifo_readers(opath_fd: int, seconds: float = 3.0) -> int:
    """Open the FIFO for writing while a reader waits (then close: EOF); count the times."""
    released = 0
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        try:
            fd = os.open(f"/proc/self/fd/{opath_fd}", os.O_WRONLY | os.O_NONBLOCK)
        except OSError as exc:
            if exc.errno == errno.ENXIO:  # no reader left
                return released
            raise
        released += 1
        time.sleep(0.05)
        os.close(fd)
        time.sleep(0.05)
    return released


# -- talking to the server ------------------------------------------------------------


@dataclass
class Reply:
    code: int  # 599: no HTTP answer (connection closed, timeout)
    body: bytes
    headers: dict[str, str]
    error: str = ""

    def message(self) -> str:
        """The JSON message of an error answer; fails unless the body is one, without traceback."""
        try:
            data = json.loads(self.body)
        except ValueError:
            raise AssertionError(
                f"{self.code} with a body that is not JSON: {self.body[:300]!r}"
            ) from None
        assert isinstance(data, dict) and isinstance(data.get("message"), str), data
        assert "Traceback" not in data["message"], data["message"]
        return data["message"]

    def is_json_4xx(self, *codes: int) -> bool:
        if self.code not in codes:
            return False
        try:
            self.message()
        except AssertionError:
            return False
        return True

    def __repr__(self) -> str:
        return f"<{self.code} {self.error or self.body[:160]!r}>"


async def answer(pending: Any, timeout: float) -> Reply:
    """Await a tornado fetch; HTTP errors, resets and no answer within ``timeout`` become a Reply."""
    try:
        response = await asyncio.wait_for(pending, timeout)
    except HTTPClientError as err:
        if err.response is None:
            return Reply(599, b"", {}, f"{type(err).__name__}: {err}")
        return Reply(err.code, err.response.body or b"", dict(err.response.headers))
    except asyncio.TimeoutError:
        return Reply(599, b"", {}, f"no answer within {timeout} s")
    except Exception as exc:  # a reset connection, a closed stream
        return Reply(599, b"", {}, f"{type(exc).__name__}: {exc}")
    return Reply(response.code, response.body or b"", dict(response.headers))


async def call(jp_fetch: Any, *parts: str, timeout: float = REQUEST_SECONDS, **kw: Any) -> Reply:
    """One request through jp_fetch; never raises (see :func:`answer`)."""
    kw.setdefault("request_timeout", timeout + 5)
    return await answer(jp_fetch(*parts, **kw), timeout)


def files(sid: str, path: str = "") -> tuple[str, ...]:
    return ("api", "sandboxes", sid, "files", *([path] if path else []))


def raw_http(
    app: Any,
    request: bytes,
    body_parts: tuple[bytes, ...] = (),
    abort: bool = False,
    timeout: float = REQUEST_SECONDS,
) -> Reply:
    """Send bytes as they are (headers tornado's client would fix) and read to EOF.

    ``abort``: close the connection after sending ``body_parts`` without reading.
    """
    with socket.create_connection(("127.0.0.1", app.port), timeout=timeout) as sock:
        sock.sendall(request)
        for part in body_parts:
            sock.sendall(part)
            time.sleep(0.2)
        if abort:
            return Reply(0, b"", {}, "aborted by the client")
        data = bytearray()
        try:
            while chunk := sock.recv(1 << 20):
                data += chunk
        except TimeoutError:
            if not data:
                return Reply(599, b"", {}, f"no answer within {timeout} s")
        except ConnectionResetError:
            if not data:
                return Reply(599, b"", {}, "connection reset")
    head, _, body = bytes(data).partition(b"\r\n\r\n")
    lines = head.decode("latin-1").split("\r\n")
    try:
        code = int(lines[0].split()[1])
    except (IndexError, ValueError):
        return Reply(599, bytes(data[:300]), {}, "not an HTTP answer")
    headers = {}
    for line in lines[1:]:
        name, _, value = line.partition(":")
        headers[name.strip().lower()] = value.strip()
    return Reply(code, body, headers)


def request_head(app: Any, method: str, path: str, *extra: str) -> bytes:
    token = app.identity_provider.token
    lines = [
        f"{method} {app.base_url}{path} HTTP/1.1",
        f"Host: 127.0.0.1:{app.port}",
        f"Authorization: token {token}",
        "Connection: close",
        *extra,
    ]
    return ("\r\n".join(lines) + "\r\n\r\n").encode()


def read_nofollow(path: Path) -> tuple[str, bytes]:
    """(kind, content) of a workspace file read from the host without following a link."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK)
    except OSError as exc:
        return ("link" if exc.errno == errno.ELOOP else os.strerror(exc.errno)), b""
    with os.fdopen(fd, "rb") as fh:
        if not stat.S_ISREG(os.fstat(fh.fileno()).st_mode):
            return "not a regular file", b""
        return "file", fh.read()


def workspace_leftovers(workspace: Path) -> list[str]:
    """Everything under the workspace, walked on the host (os.walk)."""
    found = []
    for folder, dirs, names in os.walk(workspace):
        for name in dirs + names:
            found.append(os.path.relpath(os.path.join(folder, name), workspace))
    return sorted(found)


def summary(problems: list[str], limit: int = 12) -> str:
    counted: dict[str, int] = {}
    for item in problems:
        counted[item] = counted.get(item, 0) + 1
    lines = [f"{n}x {text}" for text, n in list(counted.items())[:limit]]
    return f"{len(problems)} violation(s):\n  " + "\n  ".join(lines)
