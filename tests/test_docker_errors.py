"""What the Docker engine says goes wrong reaches users as our error classes, in one line.

Each test makes the real engine fail the way it does in use: a container removed with
``docker rm -f`` while the backend works on it, a snapshot image removed or held by a
container that is not ours, a limit Docker refuses, a name that is no image reference,
an engine that stops answering. Nothing is mocked; where a failure must happen at a
chosen moment, the test plants a container the backend takes for one of its own (our
name and labels) in the state the moment needs.

The mapping itself lives in ``sandbox_kernel/backends/docker_errors.py``.
"""

from __future__ import annotations

import json
import socket
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import docker
import pytest
from tornado.httpclient import HTTPClientError

from sandbox_kernel.backends.base import (
    LABEL_INSTALLATION,
    LABEL_MANAGED,
    LABEL_USER,
    LABEL_USER_ID,
    BadRequest,
    Conflict,
    EngineUnavailable,
    SandboxFailed,
    SandboxNotFound,
    Spec,
    engine_name,
)
from sandbox_kernel.backends.docker import DockerBackend
from sandbox_kernel.backends.docker.errors import engine_errors
from sandbox_kernel.backends.docker.wire import EngineWire
from sandbox_kernel.config import SandboxConfig
from sandbox_kernel.identity import ScopeKey
from sandbox_kernel.service import SandboxService

from .conftest import TEST_IMAGE, remove_user_snapshots

pytestmark = [pytest.mark.docker, pytest.mark.usefixtures("docker_cleanup")]

IDLE = ["python3", "-c", "import signal; signal.pause()"]
CHILD_REPO = "sandbox-kernel-test-child"


@pytest.fixture
def service(make_config: Callable[..., SandboxConfig]) -> SandboxService:
    return SandboxService(make_config())


@pytest.fixture
def backend(service: SandboxService) -> DockerBackend:
    return service.backend  # type: ignore[return-value]


def one_line(error: BaseException) -> str:
    """The error's message, checked to be what a user may be shown: one line, no traceback."""
    text = str(error)
    assert text and "\n" not in text and "Traceback" not in text, text
    return text


def plant(
    service: SandboxService, user: str, sandbox_id: str, command: list[str], start: bool = True
) -> Any:
    """A container the backend takes for sandbox ``sandbox_id`` of ``user``."""
    labels = {
        LABEL_MANAGED: "1",
        LABEL_INSTALLATION: service.installation,
        LABEL_USER: user,
        LABEL_USER_ID: ScopeKey(user).user_id,
    }
    container = docker.from_env().containers.create(
        TEST_IMAGE, command, name=engine_name(service.installation, sandbox_id), labels=labels
    )
    if start:
        container.start()
    return container


def test_every_operation_on_a_removed_sandbox_says_which(
    backend: DockerBackend, service: SandboxService, test_user: str
) -> None:
    info = service.ensure(ScopeKey(test_user)).info
    docker.from_env().containers.get(info.engine_id).remove(force=True)
    operations: dict[str, Callable[[], object]] = {
        "stop": lambda: backend.stop(info.id),
        "start": lambda: backend.start(info.id),
        "resize": lambda: backend.resize(info.id, Spec()),
        "exec": lambda: backend.exec(info.id, ["true"]),
        "put_file": lambda: backend.put_file(info.id, "a.txt", b"a"),
        "get_file": lambda: list(backend.get_file(info.id, "a.txt")),
        "create_snapshot": lambda: backend.create_snapshot(info.id, f"{test_user}--x", {}),
    }
    for what, operation in operations.items():
        with pytest.raises(SandboxNotFound) as err:
            operation()
        assert info.id in one_line(err.value), what
    assert backend.destroy(info.id) is False


def test_removed_while_being_started(
    backend: DockerBackend, service: SandboxService, test_user: str
) -> None:
    """`docker rm -f` of a half-made sandbox (created, never started) while the backend
    waits for its maker to start it: the engine's 404 comes back as SandboxNotFound
    naming the sandbox, not as docker's NotFound."""
    sandbox_id = ScopeKey(test_user).name
    container = plant(service, test_user, sandbox_id, IDLE, start=False)
    errors: list[BaseException] = []

    def start() -> None:
        try:
            backend.start(sandbox_id)
        except BaseException as exc:
            errors.append(exc)

    starter = threading.Thread(target=start)
    starter.start()
    # The backend waits up to 10 s for a created container's maker. Removed within that
    # wait, its next look fails; removed before its first, the lookup does: either way
    # the answer is the same class and names the sandbox.
    time.sleep(2)
    container.remove(force=True)
    starter.join(120)
    assert not starter.is_alive()
    [error] = errors
    assert isinstance(error, SandboxNotFound), repr(error)
    assert sandbox_id in one_line(error)


def test_a_refused_resize_is_a_bad_request(
    backend: DockerBackend, service: SandboxService, test_user: str
) -> None:
    info = service.ensure(ScopeKey(test_user)).info
    with pytest.raises(BadRequest) as err:
        backend.resize(info.id, Spec(memory=1 << 20))  # Docker's floor is 6 MB
    message = one_line(err.value)
    assert (
        message.startswith(f"Docker refused to resize {info.id}: ") and "memory" in message.lower()
    )
    assert backend.get(info.id).limits["memory"] == info.limits["memory"]


def test_exec_failures_read_as_a_shell_says_them(
    backend: DockerBackend, service: SandboxService, test_user: str
) -> None:
    """With or without a time limit (the in-sandbox runner), a command that cannot run
    is said as a shell says it; a missing folder is not a missing command."""
    info = service.ensure(ScopeKey(test_user)).info
    folder = backend.exec(info.id, ["ls"], cwd="/nonexistent")
    assert folder.output == b"ls: cannot run it in /nonexistent: no such file or directory\n"
    assert folder.exit_code != 0
    for timeout in (None, 30.0):
        missing = backend.exec(info.id, ["nosuchcmd", "-x"], timeout=timeout)
        assert (missing.exit_code, missing.output) == (
            127,
            b"nosuchcmd: command not found in the sandbox\n",
        ), timeout
        not_runnable = backend.exec(info.id, ["/etc/passwd"], timeout=timeout)
        assert not_runnable.exit_code == 126 and b"permission denied" in not_runnable.output, (
            timeout
        )
        killed = backend.exec(
            info.id,
            ["python3", "-c", "import os, signal; os.kill(os.getpid(), signal.SIGKILL)"],
            timeout=timeout,
        )
        assert killed.exit_code == 137, (timeout, killed)


def test_an_invalid_image_reference(
    make_config: Callable[..., SandboxConfig], test_user: str
) -> None:
    service = SandboxService(make_config(image="Not An/Image Name"))
    with pytest.raises(SandboxFailed) as err:
        service.ensure(ScopeKey(test_user))
    message = one_line(err.value)
    assert (
        message.startswith("bad image name 'Not An/Image Name': ")
        and "invalid reference format" in message
    )
    assert "SANDBOX_KERNEL_IMAGE" in message
    assert service.backend.list(test_user) == []


def test_snapshot_image_removed_behind_our_back(
    backend: DockerBackend, service: SandboxService, test_user: str
) -> None:
    info = service.ensure(ScopeKey(test_user)).info
    try:
        snap = service.create_snapshot(test_user, info.id, "gone")
        docker.from_env().images.remove(snap["id"], force=True)
        assert "gone" not in [s["name"] for s in service.snapshots(test_user)]
        assert backend.delete_snapshot(snap["ref"]) is False
        with pytest.raises(SandboxFailed) as err:
            service.ensure(
                ScopeKey(test_user, "thread", "from-gone"),
                config=service.config_with(snapshot="gone"),
            )
        assert "no snapshot named 'gone'" in one_line(err.value)
    finally:
        remove_user_snapshots(test_user)


def child_image(snapshot_id: str, tag: str) -> str:
    """An image built from a snapshot, as `docker build` FROM it would make (it inherits
    the snapshot's labels); Docker then refuses to remove the snapshot (409)."""
    client = docker.from_env()
    container = client.containers.create(snapshot_id, ["true"])
    try:
        container.commit(repository=CHILD_REPO, tag=tag)
    finally:
        container.remove(force=True)
    return f"{CHILD_REPO}:{tag}"


def test_snapshot_held_by_what_is_not_ours(
    backend: DockerBackend, service: SandboxService, test_user: str
) -> None:
    """A snapshot in use cannot be deleted: a container made from it outside
    sandbox-kernel is named in our refusal; an image built from it makes Docker refuse
    (409), which is a Conflict too, never a 500. Neither is listed as a snapshot."""
    info = service.ensure(ScopeKey(test_user)).info
    client = docker.from_env()
    child = ""
    try:
        snap = service.create_snapshot(test_user, info.id, "held")
        foreign = client.containers.create(snap["id"], ["true"])
        try:
            with pytest.raises(Conflict) as err:
                service.delete_snapshot(test_user, "held")
            assert (
                one_line(err.value)
                == f"snapshot 'held' is used by {foreign.name}; destroy those sandboxes first"
            )
        finally:
            foreign.remove(force=True)
        child = child_image(snap["id"], test_user)
        with pytest.raises(Conflict) as err:
            service.delete_snapshot(test_user, "held")
        message = one_line(err.value)
        assert (
            message.startswith("Docker could not delete snapshot 'held': ") and "child" in message
        )
        assert [s["id"] for s in service.snapshots(test_user)] == [snap["id"]]
        with pytest.raises(Conflict, match="you already have a snapshot named 'held'"):
            service.create_snapshot(test_user, info.id, "held")
        client.images.remove(child)
        child = ""
        assert service.delete_snapshot(test_user, "held") is True
    finally:
        if child:
            client.images.remove(child, force=True)
        remove_user_snapshots(test_user)


def test_engine_that_stops_answering(backend: DockerBackend, tmp_path: Path) -> None:
    """An engine that takes the connection and never answers, then one that is gone:
    both are EngineUnavailable saying what happened, never a requests exception."""
    version = docker.from_env().version()["ApiVersion"]
    path = tmp_path / "silent.sock"
    with socket.socket(socket.AF_UNIX) as listener:
        listener.bind(str(path))
        listener.listen()
        # The backend's own client waits 60 s per call; this one gives up after 1.
        backend._client = docker.DockerClient(base_url=f"unix://{path}", version=version, timeout=1)
        backend._wire = None  # as for an engine reached over TCP: the SDK carries every call
        with pytest.raises(EngineUnavailable) as err:
            backend.list()
        assert "did not answer in time when we tried to list sandboxes" in one_line(err.value)
        # A local engine's socket, spoken to without the SDK: the same words.
        backend._wire = EngineWire(str(path))
        for call in (
            lambda wire: wire.inspect_container("sk-anything", 1),
            lambda wire: wire.exec_start("0" * 64, False, 1),
        ):
            with pytest.raises(EngineUnavailable) as err, engine_errors("look up", "sk-anything"):
                call(backend._wire)
            assert "did not answer in time when we tried to look up sk-anything" in str(err.value)
    path.unlink()
    with pytest.raises(EngineUnavailable) as err:
        backend.stop("sk-anything")
    assert "cannot reach the Docker engine" in one_line(err.value)
    health = backend.health()
    assert not health.ok and "cannot reach the Docker engine" in health.message


# -- through the REST API: our classes become statuses with a JSON message ---------------


@pytest.fixture
def jp_server_config(rest_env: dict[str, str]) -> dict[str, Any]:
    return {
        "ServerApp": {"jpserver_extensions": {"jupyter_ext": True}},
        "SandboxExtension": {"gc_interval": 0},
    }


async def test_rest_snapshot_with_a_child_image_is_409(
    jp_fetch: Any, sandbox: dict[str, str], test_user: str
) -> None:
    client = docker.from_env()
    child = ""
    try:
        made = await jp_fetch(
            "api",
            "sandboxes",
            sandbox["id"],
            "snapshots",
            method="POST",
            body=json.dumps({"name": "held"}),
        )
        child = child_image(json.loads(made.body)["id"], test_user)
        with pytest.raises(HTTPClientError) as err:
            await jp_fetch("api", "snapshots", "held", method="DELETE")
        assert err.value.code == 409
        message = json.loads(err.value.response.body)["message"]
        assert (
            message.startswith("Docker could not delete snapshot 'held': ") and "\n" not in message
        )
        client.images.remove(child)
        child = ""
        deleted = await jp_fetch("api", "snapshots", "held", method="DELETE")
        assert deleted.code == 204
    finally:
        if child:
            client.images.remove(child, force=True)
        remove_user_snapshots(test_user)
