"""The engine's socket as docker_wire speaks it, against a fake engine on a Unix socket:
the answers a real engine gives on its error paths, which a test engine rarely shows.

The fake engine is a socket that answers one request with fixed bytes; nothing else
about Docker is imitated (the real engine's paths are tested in test_docker_backend).
"""

from __future__ import annotations

import socket
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from sandbox_kernel.backends.docker.errors import engine_errors
from sandbox_kernel.backends.docker.wire import EngineRefused, EngineWire
from sandbox_kernel.errors import Conflict, SandboxError

pytestmark = pytest.mark.fast


@pytest.fixture
def engine_answering(tmp_path: Path) -> Iterator[list[bytes]]:
    """A socket that answers each connection with the next of the given answers and
    then keeps it open (as dockerd does), until the test ends."""
    answers: list[bytes] = []
    path = tmp_path / "engine.sock"
    listener = socket.socket(socket.AF_UNIX)
    listener.bind(str(path))
    listener.listen()
    held: list[socket.socket] = []

    def serve() -> None:
        while True:
            try:
                conn, _ = listener.accept()
            except OSError:
                return
            conn.recv(65536)  # the request
            conn.sendall(answers.pop(0))
            held.append(conn)

    threading.Thread(target=serve, daemon=True).start()
    yield answers
    listener.close()
    for conn in held:
        conn.close()


def wire_for(tmp_path: Path) -> EngineWire:
    return EngineWire(str(tmp_path / "engine.sock"))


def test_a_refused_attach_fails_at_once_though_the_engine_keeps_the_connection(
    tmp_path: Path, engine_answering: list[bytes]
) -> None:
    """The engine refuses an attach (the container stopped after the process was
    created) with a JSON body and keeps the connection open: the refusal is read by its
    length, not by waiting for an end that never comes."""
    body = b'{"message":"Container abc is not running"}'
    engine_answering.append(
        b"HTTP/1.1 409 Conflict\r\nContent-Type: application/json\r\n"
        b"Content-Length: " + str(len(body)).encode() + b"\r\n\r\n" + body
    )
    started = time.monotonic()
    with pytest.raises(EngineRefused) as refused:
        wire_for(tmp_path).exec_start("e" * 64, False, 30)
    assert time.monotonic() - started < 10  # not the call's 30 s patience
    assert refused.value.status_code == 409
    assert refused.value.explanation == "Container abc is not running"
    with pytest.raises(Conflict, match="not running"):
        with engine_errors("run a process in", "sk-a"):
            raise refused.value


def test_a_redirect_is_a_refusal_not_a_crash(tmp_path: Path, engine_answering: list[bytes]) -> None:
    """The engine answers 301 for a path it cleans (``..`` in a name): an error the
    user reads, never an answer taken for empty."""
    engine_answering.append(
        b"HTTP/1.1 301 Moved Permanently\r\nLocation: /images/b/json\r\nContent-Length: 0\r\n\r\n"
    )
    with pytest.raises(SandboxError, match="301"):
        with engine_errors("use image 'a/../b'"):
            wire_for(tmp_path).inspect_image("a/../b")


def test_an_already_started_container_is_no_error(
    tmp_path: Path, engine_answering: list[bytes]
) -> None:
    """304 is the engine's "it was already running": nothing to do."""
    engine_answering.append(b"HTTP/1.1 304 Not Modified\r\n\r\n")
    assert wire_for(tmp_path).start_container("c" * 64) is None
