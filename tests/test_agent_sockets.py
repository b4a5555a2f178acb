"""The interpreter's socket to its kernel, past the engine's exec stream
(backends/agent_sockets.py): the listener only takes the interpreter it started, the
sandbox can neither see nor touch the folder, and a sandbox without it still works."""

from __future__ import annotations

import os
import shutil
import socket
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from jupyter_client.manager import start_new_kernel

from sandbox_kernel.backends import SandboxError
from sandbox_kernel.backends.base import Channel
from sandbox_kernel.backends.docker import sockets
from sandbox_kernel.backends.docker.channel import close_socket
from sandbox_kernel.backends.docker.sockets import AgentListener, SocketChannel
from sandbox_kernel.service import SandboxService

from .conftest import remove_user_containers, sandbox_container
from .kernel_env import KernelEnv, make_kernel_env
from .test_kernel import run, text_of


def _connect(path: Path) -> socket.socket:
    """Connect by the folder's descriptor: the path is too long for a socket address."""
    folder = os.open(path.parent, os.O_PATH | os.O_DIRECTORY)
    try:
        sock = socket.socket(socket.AF_UNIX)
        sock.connect(f"/proc/self/fd/{folder}/{path.name}")
        return sock
    finally:
        os.close(folder)


@pytest.fixture
def deep_folder(tmp_path: Path) -> Path:
    """A folder whose path alone is longer than a socket address may be."""
    folder = tmp_path / ("d" * 60) / ("e" * 60)
    folder.mkdir(parents=True)
    return folder


@pytest.mark.fast
def test_the_listener_takes_only_the_connection_that_brings_its_token(
    deep_folder: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(sockets, "TOKEN_PATIENCE", 0.1)  # what the silent one costs
    listener = AgentListener(str(deep_folder))
    path = deep_folder / listener.name
    try:
        assert path.is_socket() and path.stat().st_mode & 0o777 == 0o666
        wrong = _connect(path)
        wrong.sendall(b"0" * len(listener.token) + b"\n")
        silent = _connect(path)  # says nothing: the listener must not wait on it for ever
        right = _connect(path)
        right.sendall(listener.token.encode() + b"\n" + b"after")
        got = listener.accept(within=10)
        assert got.recv(5) == b"after"  # the very connection, its bytes after the token kept
        wrong.settimeout(5)
        assert wrong.recv(1) == b""  # turned away without a byte
        for sock in (wrong, silent, right, got):
            sock.close()
    finally:
        listener.close()
    assert not path.exists()  # nothing more can connect once the start is over


@pytest.mark.fast
def test_the_listener_gives_up_in_its_time(deep_folder: Path) -> None:
    listener = AgentListener(str(deep_folder))
    started = time.monotonic()
    try:
        silent = _connect(deep_folder / listener.name)
        with pytest.raises(SandboxError, match="did not connect"):
            listener.accept(within=0.2)
        silent.close()
    finally:
        listener.close()
    assert time.monotonic() - started < 5


class _PipeChannel(Channel):
    """A process channel made of a socket pair: closing the far end is the process's end."""

    def __init__(self) -> None:
        self.near, self.far = socket.socketpair()

    def write(self, data: bytes) -> None:
        self.near.sendall(data)

    def read(self, size: int = 65536) -> bytes:
        try:
            return self.near.recv(size)
        except OSError:
            return b""

    def close(self) -> None:
        close_socket(self.near)

    def exit_status(self) -> int | None:
        return 3


@pytest.mark.fast
def test_the_socket_channel_ends_with_its_process_even_if_the_socket_lives_on() -> None:
    """A process a cell forked may hold the interpreter's socket after the interpreter
    died: the kernel must still hear of the end, as the exec stream tells it."""
    kernel_end, sandbox_end = socket.socketpair()
    process = _PipeChannel()
    channel = SocketChannel(kernel_end, process)
    sandbox_end.sendall(b"hello\n")
    assert channel.read() == b"hello\n"
    process.far.sendall(b"stray stdout\n")  # read and dropped: not the protocol any more
    process.far.close()  # the interpreter ended; sandbox_end (the child's copy) stays open
    done: list[bytes] = []
    reader = threading.Thread(target=lambda: done.append(channel.read()), daemon=True)
    reader.start()
    reader.join(10)
    assert done == [b""]
    assert channel.exit_status() == 3
    channel.close()
    sandbox_end.close()


@pytest.mark.fast
def test_the_socket_end_waits_for_the_process_end() -> None:
    """The interpreter's socket closes a moment before its exec ends (its watcher is
    still ending what the cells left): the kernel reads the end only when the exit
    status is known, so it can say why (an out-of-memory kill)."""
    kernel_end, sandbox_end = socket.socketpair()
    process = _PipeChannel()
    channel = SocketChannel(kernel_end, process)
    sandbox_end.close()
    threading.Timer(0.15, process.far.close).start()
    started = time.monotonic()
    assert channel.read() == b""
    assert time.monotonic() - started >= 0.1
    channel.close()


@pytest.mark.fast
def test_socket_folders_are_exact_unlistable_and_tidied(tmp_path: Path) -> None:
    from sandbox_kernel.backends.docker.sockets import FOLDER_MODE, AgentSocketFolders

    folders = AgentSocketFolders(str(tmp_path / "state"))
    old = os.umask(0o077)  # a strict umask must not take the sandbox's way in
    try:
        made = [folders.ensure(name) for name in ("live", "gone", "new")]
    finally:
        os.umask(old)
    assert all(f.stat().st_mode & 0o777 == FOLDER_MODE for f in made)
    assert folders.root.stat().st_mode & 0o777 == 0o711
    listener = AgentListener(str(made[1]))  # a socket left in it, as by a killed kernel
    for folder in made[:2]:
        os.utime(folder, (1, 1))  # long ago
    folders.sweep({"live"})
    assert [f.exists() for f in made] == [True, False, True]  # live, or made just now: kept
    folders.release("live")
    assert not made[0].exists()
    listener.close()


@pytest.mark.fast
def test_socket_folders_work_for_a_server_that_is_not_root(tmp_path: Path) -> None:
    """Its folders are its own but unreadable (0311), even to it: nothing may need to
    list or open one, except the removal, which makes it listable first. (As root, a
    child process that became another uid plays the server.)"""
    import tempfile

    from sandbox_kernel.backends.docker.sockets import AgentSocketFolders

    if os.geteuid() == 0:  # a place the other uid can reach (pytest's own is root's, 0700)
        tmp_path = Path(tempfile.mkdtemp(prefix="sk-not-root-"))
        tmp_path.chmod(0o777)
    folders = AgentSocketFolders(str(tmp_path / "state"))

    def serve() -> str:
        for _ in range(2):  # made, then kept: a start after a create
            folder = folders.ensure("c1")
        AgentListener(str(folder)).close()
        folders.release("c1")
        return f"{folder.exists()} {oct(folders.root.stat().st_mode & 0o777)}"

    if os.geteuid() != 0:
        assert serve() == "False 0o711"
        return
    read, write = os.pipe()
    pid = os.fork()
    if pid == 0:  # the child: never back into pytest
        try:
            os.setgid(65534)
            os.setuid(65534)
            result = serve()
        except BaseException as exc:
            result = repr(exc)
        os.write(write, result.encode())
        os._exit(0)
    os.close(write)
    os.waitpid(pid, 0)
    shutil.rmtree(tmp_path)
    with os.fdopen(read) as answer:
        assert answer.read() == "False 0o711"


# -- with Docker -------------------------------------------------------------------------

WHERE = """
import os, stat, sys
wire = sys.stdout.output.wire
print(stat.S_ISSOCK(os.fstat(wire.wfd).st_mode), stat.S_ISSOCK(os.fstat(wire.rfd).st_mode))
for attempt in (lambda: os.listdir('/run/kernel-sockets'),
                lambda: open('/run/kernel-sockets/planted', 'w'),
                lambda: os.symlink('/etc/passwd', '/run/kernel-sockets/link'),
                lambda: os.mkfifo('/run/kernel-sockets/fifo')):
    try:
        attempt()
        print('allowed')
    except OSError as exc:
        print(type(exc).__name__)
"""


@pytest.fixture
def kenv(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[KernelEnv]:
    env = make_kernel_env(tmp_path / "k")
    monkeypatch.setenv("JUPYTER_PATH", env.jupyter_path)
    yield env
    remove_user_containers(env.user)


def _kernel() -> tuple[Any, Any]:
    return start_new_kernel(kernel_name="sandbox", startup_timeout=120)


def _stop(kernel: tuple[Any, Any]) -> None:
    kernel[1].stop_channels()
    kernel[0].shutdown_kernel(now=True)


def _socket_folder(kenv: KernelEnv) -> Path:
    name = sandbox_container(f"sk-{kenv.user}").name
    return kenv.root / "state" / "sockets" / name


@pytest.mark.docker
def test_cells_reach_their_kernel_by_socket_and_cannot_touch_its_folder(kenv: KernelEnv) -> None:
    kernel = _kernel()
    try:
        reply, outputs = run(kernel[1], WHERE)
        assert reply["status"] == "ok", reply
        lines = text_of(outputs).split()
        assert lines[:2] == ["True", "True"]  # the protocol is on the socket both ways
        assert "allowed" not in lines[2:], lines  # not listed, nothing planted there
        # A large output comes whole and exact, and the limit still holds on this path.
        reply, outputs = run(kernel[1], "print('ab' * 3_000_000, end='')")
        assert text_of(outputs) == "ab" * 3_000_000
        reply, outputs = run(kernel[1], "print('x' * 60_000_000)")
        assert "output truncated" in text_of(outputs, "stderr")
    finally:
        _stop(kernel)
    folder = _socket_folder(kenv)
    assert folder.is_dir() and list(folder.iterdir()) == []  # each start's socket removed
    mount = next(
        m
        for m in sandbox_container(f"sk-{kenv.user}").attrs["Mounts"]
        if m["Destination"] == "/run/kernel-sockets"
    )
    assert mount["Source"] == str(folder) and mount["RW"] is False


@pytest.mark.docker
def test_a_sandbox_whose_socket_folder_went_still_works_and_gets_it_back(kenv: KernelEnv) -> None:
    _stop(_kernel())  # makes the sandbox
    folder = _socket_folder(kenv)
    shutil.rmtree(folder)
    kernel = _kernel()
    try:
        reply, outputs = run(kernel[1], WHERE)
        assert reply["status"] == "ok", reply
        assert text_of(outputs).split()[:2] == ["False", "False"]  # the exec stream, as before
        reply, outputs = run(kernel[1], "print(6 * 7)")
        assert text_of(outputs) == "42\n"
    finally:
        _stop(kernel)
    service = SandboxService(kenv.config())
    service.stop(kenv.user, f"sk-{kenv.user}")
    shutil.rmtree(kenv.root / "state" / "sockets")  # even the parent: a tidied state folder
    kernel = _kernel()  # the sandbox starts again: the engine needs the folder back
    try:
        reply, outputs = run(kernel[1], WHERE)
        assert text_of(outputs).split()[:2] == ["True", "True"]
    finally:
        _stop(kernel)
    service.destroy(kenv.user, f"sk-{kenv.user}")
    assert not folder.exists()


POSER = r"""
import glob, json, os, socket, threading, time
found, tried = [], set()
def candidates():
    # Everything another notebook's cell can read while a new interpreter starts: the
    # environment and command line of every process, the socket folder, its network
    # namespace's Unix sockets.
    for pid in os.listdir('/proc'):
        for what in ('environ', 'cmdline'):
            try:
                data = open(f'/proc/{pid}/{what}', 'rb').read()
            except OSError:
                continue
            for word in data.replace(b'=', b'\0').split(b'\0'):
                if b'kernel-sockets/' in word:
                    yield word.decode(errors='replace')
    try:
        yield from (f'/run/kernel-sockets/{n}' for n in os.listdir('/run/kernel-sockets'))
    except OSError:
        pass
    for line in open('/proc/net/unix').read().splitlines()[1:]:
        if 'kernel-sockets' in line:
            yield line.split()[-1]
def pose():
    # Connect first to any socket found, claiming to be the new interpreter with a forged
    # token and forged output.
    deadline = time.time() + 60
    while time.time() < deadline:
        for path in candidates():
            tried.add(path)
            try:
                s = socket.socket(socket.AF_UNIX)
                s.settimeout(0.2)
                s.connect(path)
                s.sendall(b'0' * 64 + b'\n' + json.dumps({'ev': 'stream', 'name': 'stdout', 'text': 'FORGED'}).encode() + b'\n')
                found.append(s)
            except OSError:
                pass
threading.Thread(target=pose, daemon=True).start()
"""


@pytest.mark.docker
def test_a_cell_cannot_pose_as_another_kernels_interpreter(kenv: KernelEnv) -> None:
    """A cell of one notebook hunts every new interpreter's socket in the same sandbox,
    to pose as it: the socket cannot be found (its name goes on stdin, its folder cannot
    be listed), and a poser that found it would still lack the token."""
    attacker = _kernel()
    try:
        reply, _ = run(attacker[1], POSER)
        assert reply["status"] == "ok", reply
        for _ in range(3):
            victim = _kernel()
            try:
                reply, outputs = run(victim[1], WHERE + "print('mine')")
                assert reply["status"] == "ok", reply
                text = text_of(outputs)
                assert "FORGED" not in text and text.split()[-1] == "mine"
                assert text.split()[:2] == ["True", "True"]
            finally:
                _stop(victim)
        reply, outputs = run(attacker[1], "print(len(found), sorted(tried))")
        assert text_of(outputs).split()[0] == "0", text_of(outputs)  # it found nothing
    finally:
        _stop(attacker)
