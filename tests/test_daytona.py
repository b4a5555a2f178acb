"""The Daytona backend, driven through the real ``daytona`` SDK against a fake Daytona.

The fake (tests/fake_daytona.py) speaks Daytona's wire format and runs sandboxes as
local Docker containers, so nothing in the SDK is mocked: what is replaced is the
service on the other end of the wire, because a real one cannot be reached from CI.
``test_real_daytona`` runs against the real service when ``DAYTONA_API_KEY`` is set.
"""

from __future__ import annotations

import json
import os
import threading
import time
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
from jupyter_client.manager import start_new_kernel

from sandbox_kernel.backends.base import (
    EngineUnavailable,
    SandboxError,
    SandboxNotFound,
    engine_name,
)
from sandbox_kernel.config import SandboxConfig
from sandbox_kernel.identity import ScopeKey
from sandbox_kernel.service import SandboxService

from .conftest import TEST_IMAGE
from .fake_daytona import API_KEY, FakeDaytona
from .kernel_env import ConformanceSuite, KernelEnv, make_kernel_env
from .test_kernel import run, text_of

pytestmark = pytest.mark.docker

SNAPSHOT = "sandbox-kernel-test"  # the fake's general snapshot, made of the Docker test image
# A real Daytona, when the developer's environment names one (read before any fixture
# points DAYTONA_* at the fake).
REAL = {
    name: os.environ.get(name, "")
    for name in ("DAYTONA_API_KEY", "DAYTONA_API_URL", "DAYTONA_TARGET")
}


def start_fake(root: Path) -> FakeDaytona:
    fake = FakeDaytona(root, {SNAPSHOT: TEST_IMAGE})
    fake.start()
    return fake


def daytona_settings(fake: FakeDaytona, **extra: str) -> dict[str, str]:
    return {
        "SANDBOX_KERNEL_BACKEND": "daytona",
        "SANDBOX_KERNEL_IMAGE": SNAPSHOT,
        "DAYTONA_API_KEY": API_KEY,
        "DAYTONA_API_URL": fake.url,
        "DAYTONA_TARGET": "us",
        **extra,
    }


@pytest.fixture(scope="module")
def fake(tmp_path_factory: pytest.TempPathFactory) -> Iterator[FakeDaytona]:
    server = start_fake(tmp_path_factory.mktemp("fake-daytona"))
    yield server
    server.close()


@pytest.fixture(autouse=True)
def _daytona_env(fake: FakeDaytona, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("DAYTONA_API_KEY", API_KEY)
    monkeypatch.setenv("DAYTONA_API_URL", fake.url)
    monkeypatch.setenv("DAYTONA_TARGET", "us")
    fake.creating_delay = 0.0
    fake.seconds_per_minute = 60.0
    fake.clear_faults()  # what an earlier test injected and did not use up


@pytest.fixture
def service_for(make_config: Callable[..., SandboxConfig]) -> Callable[..., SandboxService]:
    """The orchestrator over the Daytona backend (the real SDK, the fake server)."""

    def make(**overrides: Any) -> SandboxService:
        return SandboxService(make_config(backend="daytona", image=SNAPSHOT, **overrides))

    return make


def box_named(fake: FakeDaytona, sandbox_id: str) -> Any:
    """The fake's sandbox for one of our ids (Daytona's name adds the installation's tag)."""
    return next(
        b
        for b in fake.sandboxes.values()
        if b.name.split("--i")[0] == sandbox_id and b.state != "destroyed"
    )


def user_key(user: str, thread: str = "") -> ScopeKey:
    return ScopeKey(user=user, scope="thread" if thread else "user", thread=thread)


def sh(backend: Any, sandbox_id: str, script: str) -> str:
    result = backend.exec(sandbox_id, ["sh", "-c", script])
    assert result.exit_code == 0, result.output
    return result.output.decode()


# -- the kernel -------------------------------------------------------------------------------
class TestDaytonaConformance(ConformanceSuite):
    """The official kernel conformance suite, with the kernel on a (fake) Daytona sandbox."""

    __test__ = True

    @classmethod
    def settings(cls, root: Path) -> dict[str, str]:
        cls.fake = start_fake(root / "fake")
        return daytona_settings(cls.fake)

    @classmethod
    def clean_up(cls) -> None:
        cls.fake.close()

    def test_runs_in_a_daytona_sandbox(self) -> None:
        self.flush_channels()
        reply, outputs = run(
            self.kc, "import socket, os; print(socket.gethostname(), os.getuid(), os.getcwd())"
        )
        assert reply["status"] == "ok"
        assert text_of(outputs).split() == ["daytona", "1000", "/workspace"]
        (box,) = self.fake.sandboxes.values()
        assert box.name.split("--i")[0] == f"sk-{self.kenv.user}"


@pytest.fixture
def dkenv(fake: FakeDaytona, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> KernelEnv:
    env = make_kernel_env(tmp_path, **daytona_settings(fake))
    monkeypatch.setenv("JUPYTER_PATH", env.jupyter_path)
    return env


def test_kernel_restart_keeps_files_and_packages_not_variables(
    fake: FakeDaytona, dkenv: KernelEnv
) -> None:
    km, kc = start_new_kernel(kernel_name="sandbox", startup_timeout=120)
    try:
        reply, _ = run(
            kc,
            "x = 41\n"
            "open('/workspace/kept.txt', 'w').write('workspace')\n"
            "import os; os.makedirs(os.path.expanduser('~/.local/lib'), exist_ok=True)\n"
            "open(os.path.expanduser('~/.local/lib/pkg.txt'), 'w').write('installed')",
        )
        assert reply["status"] == "ok", reply
        engine_id = box_named(fake, f"sk-{dkenv.user}").id
        km.restart_kernel(now=True)
        kc.wait_for_ready(timeout=120)
        reply, outputs = run(
            kc,
            "import os\n"
            "print(open('/workspace/kept.txt').read(), open(os.path.expanduser('~/.local/lib/pkg.txt')).read())\n"
            "print('x' in globals())",
        )
        assert reply["status"] == "ok", reply
        assert text_of(outputs).split() == ["workspace", "installed", "False"]
        assert box_named(fake, f"sk-{dkenv.user}").id == engine_id
    finally:
        kc.stop_channels()
        km.shutdown_kernel(now=True)


def test_interrupt_keeps_variables(dkenv: KernelEnv) -> None:
    km, kc = start_new_kernel(kernel_name="sandbox", startup_timeout=120)
    try:
        assert run(kc, "y = 'still here'")[0]["status"] == "ok"
        msg_id = kc.execute("import time; time.sleep(60)")
        time.sleep(2)
        km.interrupt_kernel()
        while True:
            reply = kc.get_shell_msg(timeout=30)
            if reply["parent_header"].get("msg_id") == msg_id:
                break
        assert reply["content"]["ename"] == "KeyboardInterrupt"
        reply, outputs = run(kc, "print(y)")
        assert (reply["status"], text_of(outputs)) == ("ok", "still here\n"), (reply, outputs)
    finally:
        kc.stop_channels()
        km.shutdown_kernel(now=True)


def test_sandbox_stopped_mid_cell_gives_one_line_and_next_cell_runs(
    fake: FakeDaytona, dkenv: KernelEnv
) -> None:
    """Daytona auto-stops the sandbox while a cell runs: the PTY drops, the kernel asks
    Daytona what happened, says it in one line, and the next cell starts it again."""
    km, kc = start_new_kernel(kernel_name="sandbox", startup_timeout=120)
    try:
        assert run(kc, "z = 1")[0]["status"] == "ok"
        box = box_named(fake, f"sk-{dkenv.user}")
        threading.Timer(2.0, fake.auto_stop, args=(box.id,)).start()
        reply, outputs = run(kc, "import time; time.sleep(30)")
        assert (reply["status"], reply["ename"]) == ("error", "SandboxLost")
        lost = reply["evalue"]
        assert f"sandbox sk-{dkenv.user} stopped" in lost and "variables were lost" in lost
        assert [o["msg_type"] for o in outputs] == ["error"]  # one line, no traceback
        reply, outputs = run(kc, "print('z' in globals(), open('/etc/hostname').read().strip())")
        assert reply["status"] == "ok", reply
        assert text_of(outputs).split() == ["False", "daytona"]
        assert "sandbox restarted: variables were lost, files in /workspace were kept" in text_of(
            outputs, "stderr"
        )
    finally:
        kc.stop_channels()
        km.shutdown_kernel(now=True)


def test_bad_gateway_mid_session_is_retried_by_the_next_cell(
    fake: FakeDaytona, dkenv: KernelEnv
) -> None:
    """A 502 while the kernel looks the sandbox up is a clear one-line error, not a hang;
    once Daytona answers again, cells run."""
    km, kc = start_new_kernel(kernel_name="sandbox", startup_timeout=120)
    try:
        assert run(kc, "1")[0]["status"] == "ok"
        box = box_named(fake, f"sk-{dkenv.user}")
        fake.fail(r"GET /api/sandbox/", 502, times=20)
        fake.auto_stop(box.id)
        reply, outputs = run(kc, "print('after')")
        assert reply["status"] == "error"
        assert "502" in reply["evalue"] and "Traceback" not in reply["evalue"]
        fake.clear_faults()
        reply, outputs = run(kc, "print('after')")
        assert reply["status"] == "ok", reply
        assert "after" in text_of(outputs)
    finally:
        kc.stop_channels()
        km.shutdown_kernel(now=True)


def test_a_dropped_pty_handshake_is_tried_again(
    fake: FakeDaytona, service_for: Callable[..., SandboxService], test_user: str
) -> None:
    """A daemon that only just started can drop a PTY session's handshake (the SDK says
    "Failed to create PTY session"): the backend tries again under a new session id, so
    an interpreter starts instead of the first cell failing. One drop, so the backend's
    third try stays a margin for a slow machine rather than the test's last chance."""
    from sandbox_kernel.agent import bootstrap_command, bundle

    service = service_for()
    info = service.ensure(user_key(test_user)).info
    fake.fail(r"GET .*/process/pty/create-connect", 502, times=1)
    try:
        channel = service.backend.open_channel(info.id, bootstrap_command())
        channel.write(bundle("start"))
        assert b"python_version" in channel.read()
        channel.close()
    finally:
        fake.clear_faults()
    tried = [p for m, p in fake.requests if p.endswith("/process/pty/create-connect")]
    assert len(tried) >= 2, tried


def test_long_silent_cell_is_not_auto_stopped(
    fake: FakeDaytona, fake_minute: None, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Daytona counts only API use as activity; the kernel refreshes it while a cell runs.
    The control half: once idle, the same sandbox is auto-stopped by the same timer."""
    env = make_kernel_env(tmp_path, **daytona_settings(fake, SANDBOX_KERNEL_IDLE_STOP="0.05"))
    monkeypatch.setenv("JUPYTER_PATH", env.jupyter_path)
    km, kc = start_new_kernel(kernel_name="sandbox", startup_timeout=120)
    try:
        reply, outputs = run(kc, "import time; time.sleep(10); print('survived')", timeout=60)
        assert reply["status"] == "ok", (reply, text_of(outputs, "stderr"))
        assert text_of(outputs) == "survived\n"
        box = box_named(fake, f"sk-{env.user}")
        assert box.auto_stop == 1  # 0.05 min rounds up to Daytona's smallest interval
        deadline = time.monotonic() + 20
        while box.state != "stopped" and time.monotonic() < deadline:
            time.sleep(0.5)
        assert box.state == "stopped"
    finally:
        kc.stop_channels()
        km.shutdown_kernel(now=True)


@pytest.fixture
def fake_minute(fake: FakeDaytona) -> Iterator[None]:
    fake.seconds_per_minute = 3.0
    yield
    fake.seconds_per_minute = 60.0


# -- the backend through the SDK -------------------------------------------------------------------
def test_sandbox_made_with_volume_labels_and_lifecycle(
    fake: FakeDaytona, service_for: Callable[..., SandboxService]
) -> None:
    user = f"u{uuid.uuid4().hex[:6]}"
    service = service_for(idle_stop=20, idle_delete=90, network=False)
    backend = service.backend
    ensured = service.ensure(user_key(user))
    assert ensured.event == "created" and ensured.info.state == "running"
    box = box_named(fake, f"sk-{user}")
    assert (box.auto_stop, box.auto_delete, box.network_block_all) == (20, 90, True)
    assert box.labels["sandbox-kernel.user"] == user and box.labels["sandbox-kernel.managed"] == "1"
    (mount,) = box.volumes
    assert mount["mountPath"] == "/workspace"
    assert fake.volumes[mount["volumeId"]]["name"] == f"sk-ws-{user}"
    assert service.ensure(user_key(user)).event == "existing"
    assert [i.id for i in backend.list(user)] == [f"sk-{user}"]
    backend.stop(f"sk-{user}")
    assert backend.get(f"sk-{user}").state == "stopped"
    assert service.ensure(user_key(user)).event == "started"


def test_thread_sandboxes_share_the_users_volume(
    fake: FakeDaytona, service_for: Callable[..., SandboxService]
) -> None:
    user = f"u{uuid.uuid4().hex[:6]}"
    service = service_for(scope="thread")
    backend = service.backend
    one = service.ensure(user_key(user, "nb-one.ipynb")).info
    two = service.ensure(user_key(user, "nb-two.ipynb")).info
    assert one.id != two.id and one.engine_id != two.engine_id
    sh(backend, one.id, "echo from-one > /workspace/shared.txt")
    assert sh(backend, two.id, "cat /workspace/shared.txt") == "from-one\n"
    assert (
        len(
            {
                m["volumeId"]
                for b in fake.sandboxes.values()
                if b.name.split("--i")[0] in (one.id, two.id)
                for m in b.volumes
            }
        )
        == 1
    )
    assert sorted(i.id for i in backend.list(user)) == sorted(
        [one.id, two.id]
    )  # two pages in the fake


def test_destroy_keeps_the_workspace_and_the_next_start_says_so(
    service_for: Callable[..., SandboxService],
) -> None:
    user = f"u{uuid.uuid4().hex[:6]}"
    service = service_for()
    backend = service.backend
    info = service.ensure(user_key(user)).info
    sh(backend, info.id, "echo precious > /workspace/data.txt; echo gone > ~/outside.txt")
    assert backend.destroy(info.id) is True
    assert backend.destroy(info.id) is False
    with pytest.raises(SandboxNotFound):
        backend.get(info.id)
    again = service.ensure(user_key(user))
    assert again.event == "recreated" and "variables were lost" in again.notice
    assert (
        sh(
            backend,
            again.info.id,
            "cat /workspace/data.txt; ls ~/outside.txt 2>/dev/null || echo none",
        )
        == "precious\nnone\n"
    )


def test_files_through_the_sdk(service_for: Callable[..., SandboxService]) -> None:
    user = f"u{uuid.uuid4().hex[:6]}"
    service = service_for()
    backend = service.backend
    info = service.ensure(user_key(user)).info
    blob = os.urandom(3 << 20)
    backend.put_file(info.id, "deep/folder/blob.bin", blob)
    assert b"".join(backend.get_file(info.id, "deep/folder/blob.bin")) == blob
    assert sh(backend, info.id, "stat -c %u /workspace/deep/folder/blob.bin") == "1000\n"
    with pytest.raises(SandboxError):
        b"".join(backend.get_file(info.id, "missing.bin"))


def test_snapshots_create_list_start_from_delete(
    fake: FakeDaytona, service_for: Callable[..., SandboxService]
) -> None:
    user = f"u{uuid.uuid4().hex[:6]}"
    service = service_for()
    backend = service.backend
    info = service.ensure(user_key(user)).info
    sh(backend, info.id, "echo baked > ~/baked.txt")
    snap = service.create_snapshot(user, info.id, "baked")
    assert (snap["name"], snap["user"], snap["source"]) == ("baked", user, info.id)
    assert [s["name"] for s in service.snapshots(user)] == ["baked"]
    assert service.snapshots("someone-else") == []
    assert f"sk-{user}--baked" in fake.snapshots  # organization-wide name carries the owner
    with pytest.raises(SandboxError, match="you already have a snapshot named 'baked'"):
        service.create_snapshot(user, info.id, "baked")
    thread_service = service_for(scope="thread", snapshot="baked", user=user)
    thread_backend = thread_service.backend
    other = thread_service.ensure(user_key(user, "from-snapshot.ipynb")).info
    assert sh(thread_backend, other.id, "cat ~/baked.txt") == "baked\n"
    assert service.delete_snapshot(user, "baked") is True
    assert service.snapshots(user) == []


def test_archived_sandbox_is_restored_on_attach_with_progress(
    fake: FakeDaytona, service_for: Callable[..., SandboxService]
) -> None:
    user = f"u{uuid.uuid4().hex[:6]}"
    service = service_for()
    backend = service.backend
    info = service.ensure(user_key(user)).info
    sh(backend, info.id, "echo kept > ~/fs.txt")
    fake.archive(info.engine_id)
    assert backend.get(info.id).state == "stopped"
    said: list[str] = []
    ensured = service.ensure(user_key(user), progress=said.append)
    assert ensured.event == "started" and ensured.info.engine_id == info.engine_id
    assert any("archived" in line and "can take a minute" in line for line in said)
    assert sh(backend, info.id, "cat ~/fs.txt") == "kept\n"


def test_slow_creation_shows_progress_and_waits(
    fake: FakeDaytona, service_for: Callable[..., SandboxService]
) -> None:
    fake.creating_delay = 2.0
    said: list[str] = []
    ensured = service_for().ensure(user_key(f"u{uuid.uuid4().hex[:6]}"), progress=said.append)
    assert ensured.info.state == "running"
    assert any("creating Daytona sandbox" in line for line in said)


def test_rate_limit_is_retried_then_reported(
    fake: FakeDaytona, service_for: Callable[..., SandboxService], monkeypatch: pytest.MonkeyPatch
) -> None:
    from sandbox_kernel.backends.daytona import errors as daytona_errors

    monkeypatch.setattr(daytona_errors, "RETRY_DELAYS", (0.05, 0.1, 0.2))
    service = service_for()
    backend = service.backend
    info = service.ensure(user_key(f"u{uuid.uuid4().hex[:6]}")).info
    fake.fail(r"GET /api/sandbox/", 429, times=2)
    assert backend.get(info.id).state == "running"
    fake.fail(r"GET /api/sandbox/", 429, times=10)
    with pytest.raises(EngineUnavailable, match="429"):
        backend.get(info.id)
    fake.clear_faults()


def test_bad_key_forbidden_and_unknown_ids(
    fake: FakeDaytona, service_for: Callable[..., SandboxService], monkeypatch: pytest.MonkeyPatch
) -> None:
    service = service_for()
    backend = service.backend
    with pytest.raises(SandboxNotFound, match="sandbox-kernel list"):
        backend.get("sk-nobody-here")
    fake.fail(r"GET /api/sandbox", 403, times=1, message="API key lacks the read:sandboxes scope")
    with pytest.raises(SandboxError, match="403.*read:sandboxes"):
        backend.list()
    monkeypatch.setenv("DAYTONA_API_KEY", "wrong")
    bad = service_for()
    health = bad.backend.health()
    assert not health.ok and "401" in health.message and "DAYTONA_API_KEY" in health.message
    with pytest.raises(EngineUnavailable, match="DAYTONA_API_KEY"):
        bad.ensure(user_key("mallory"))
    monkeypatch.delenv("DAYTONA_API_KEY")
    assert "DAYTONA_API_KEY" in service_for().backend.health().message


def test_not_ours_is_never_touched(
    fake: FakeDaytona, service_for: Callable[..., SandboxService]
) -> None:
    from daytona import CreateSandboxFromSnapshotParams, Daytona

    user = f"u{uuid.uuid4().hex[:6]}"
    service = service_for()
    backend = service.backend
    name = engine_name(service.installation, f"sk-{user}")
    Daytona().create(CreateSandboxFromSnapshotParams(name=name, snapshot=SNAPSHOT))
    with pytest.raises(SandboxError, match="not made by this sandbox-kernel installation"):
        service.ensure(user_key(user))
    assert all(i.id != f"sk-{user}" for i in backend.list())


@pytest.mark.skipif(
    not REAL["DAYTONA_API_KEY"],
    reason="set DAYTONA_API_KEY (and DAYTONA_API_URL) to test a real Daytona",
)
def test_real_daytona(
    make_config: Callable[..., SandboxConfig], monkeypatch: pytest.MonkeyPatch
) -> None:
    """Opt-in: the same backend against the real service (creates and deletes one sandbox;
    SANDBOX_KERNEL_TEST_DAYTONA_SNAPSHOT picks the snapshot, else Daytona's default)."""
    for name, value in REAL.items():
        if value:
            monkeypatch.setenv(name, value)
        else:
            monkeypatch.delenv(name, raising=False)
    snapshot = os.environ.get("SANDBOX_KERNEL_TEST_DAYTONA_SNAPSHOT", "")
    service = SandboxService(make_config(backend="daytona", image=snapshot))
    backend = service.backend
    assert backend.health().ok
    info = service.ensure(user_key(f"sk-test-{uuid.uuid4().hex[:6]}")).info
    try:
        from sandbox_kernel.agent import bootstrap_command, bundle

        channel = backend.open_channel(info.id, bootstrap_command())
        channel.write(bundle("start"))
        assert b"python_version" in channel.read()
        channel.close()
    finally:
        backend.destroy(info.id)


# -- the REST API over Daytona sandboxes ----------------------------------------------------------
@pytest.fixture
def daytona_rest(
    fake: FakeDaytona, tmp_path: Path, test_user: str, monkeypatch: pytest.MonkeyPatch
) -> dict[str, str]:
    env = {
        "SANDBOX_KERNEL_BACKEND": "daytona",
        "SANDBOX_KERNEL_IMAGE": SNAPSHOT,
        "SANDBOX_KERNEL_STATE_DIR": str(tmp_path / "state"),
        "SANDBOX_KERNEL_USER": test_user,
    }
    for k, v in env.items():
        monkeypatch.setenv(k, v)
    return env


@pytest.fixture
def jp_server_config(daytona_rest: dict[str, str]) -> dict[str, Any]:
    return {
        "ServerApp": {"jpserver_extensions": {"jupyter_ext": True}},
        "SandboxExtension": {"gc_interval": 0},
    }


async def test_rest_over_daytona(
    jp_fetch: Any,
    fake: FakeDaytona,
    daytona_rest: dict[str, str],
    make_config: Callable[..., SandboxConfig],
    test_user: str,
) -> None:
    from .test_rest_api import fetch

    service = SandboxService(
        make_config(
            backend="daytona", image=SNAPSHOT, state_dir=daytona_rest["SANDBOX_KERNEL_STATE_DIR"]
        )
    )
    backend = service.backend
    sid = service.ensure(user_key(test_user)).info.id
    (item,) = await fetch(jp_fetch, "api", "sandboxes")
    assert (item["id"], item["backend"], item["state"], item["user"]) == (
        sid,
        "daytona",
        "running",
        test_user,
    )
    assert item["limits"]["memory"] == 1 << 30
    assert (
        0 < item["usage"]["memory"] < 1 << 30 and item["usage"]["cpu"] >= 0
    )  # from the sandbox's daemon

    # Files go through the sandbox (the volume is not on this host), confined the same way.
    made = await fetch(
        jp_fetch,
        "api",
        "sandboxes",
        sid,
        "files",
        "deep",
        "note.txt",
        method="PUT",
        body=b"hello",
        expect=201,
    )
    assert made == {"path": "deep/note.txt", "size": 5}
    listing = await fetch(jp_fetch, "api", "sandboxes", sid, "files", params={"path": "deep"})
    assert [(e["name"], e["type"], e["size"]) for e in listing["entries"]] == [
        ("note.txt", "file", 5)
    ]
    response = await jp_fetch("api", "sandboxes", sid, "files", "deep", "note.txt")
    assert (response.body, response.headers["Content-Length"]) == (b"hello", "5")
    assert (
        sh(backend, sid, "cat /workspace/deep/note.txt; stat -c %u /workspace/deep/note.txt")
        == "hello1000\n"
    )
    sh(backend, sid, "ln -s /etc /workspace/etc-link")
    body = await fetch(jp_fetch, "api", "sandboxes", sid, "files", "etc-link", "passwd", expect=400)
    assert "outside the workspace" in body["message"]
    await fetch(
        jp_fetch,
        "api",
        "sandboxes",
        sid,
        "files",
        "etc-link",
        "evil.txt",
        method="PUT",
        body=b"x",
        expect=400,
    )
    await fetch(jp_fetch, "api", "sandboxes", sid, "files", "deep", method="DELETE", expect=400)
    await fetch(
        jp_fetch, "api", "sandboxes", sid, "files", "deep", "note.txt", method="DELETE", expect=204
    )
    await fetch(jp_fetch, "api", "sandboxes", sid, "files", "deep", "note.txt", expect=404)

    # Snapshots, then stop (files leave it stopped), start, destroy.
    snap = await fetch(
        jp_fetch,
        "api",
        "sandboxes",
        sid,
        "snapshots",
        method="POST",
        body=json.dumps({"name": "rest-snap"}),
        expect=201,
    )
    assert (snap["name"], snap["source"], snap["backend"]) == ("rest-snap", sid, "daytona")
    await fetch(
        jp_fetch,
        "api",
        "sandboxes",
        sid,
        "snapshots",
        method="POST",
        body=json.dumps({"name": "rest-snap"}),
        expect=409,
    )
    assert [s["name"] for s in await fetch(jp_fetch, "api", "snapshots")] == ["rest-snap"]
    started = await fetch(
        jp_fetch,
        "api",
        "sandboxes",
        method="POST",
        body=json.dumps({"snapshot": "rest-snap"}),
        expect=201,
    )
    assert (started["scope"], started["state"], started["backend"]) == (
        "thread",
        "running",
        "daytona",
    )
    assert box_named(fake, started["id"]).snapshot == f"sk-{test_user}--rest-snap"
    await fetch(jp_fetch, "api", "sandboxes", started["id"], method="DELETE", expect=204)
    await fetch(jp_fetch, "api", "snapshots", "rest-snap", method="DELETE", expect=204)
    stopped = await fetch(jp_fetch, "api", "sandboxes", sid, "stop", method="POST", body="")
    assert stopped["state"] == "stopped"
    # The files of a stopped sandbox: its owner's files sandbox serves them; it sleeps on.
    listing = await fetch(jp_fetch, "api", "sandboxes", sid, "files")
    assert "deep" in [e["name"] for e in listing["entries"]]
    assert (await fetch(jp_fetch, "api", "sandboxes", sid))["state"] == "stopped"
    assert (await fetch(jp_fetch, "api", "sandboxes", sid, "start", method="POST", body=""))[
        "state"
    ] == "running"
    await fetch(jp_fetch, "api", "sandboxes", sid, method="DELETE", expect=204)
    await fetch(jp_fetch, "api", "sandboxes", sid, expect=404)


@pytest.mark.parametrize("copy_back_delay", [0, 4], ids=["prompt", "slow engine"])
def test_notebook_folder_is_copied_in_and_changes_come_back(
    fake: FakeDaytona, tmp_path: Path, copy_back_delay: float
) -> None:
    """Daytona has no host folders: `jupyter execute` of a notebook in a checkout still reads
    the data beside it (copied in at start) and leaves its result beside it (copied back
    at shutdown), through the hardened file layer on the host side. An engine slow to
    hand the result back (4 s, past the 2.5 s a client's default shutdown wait leaves
    before it stops the kernel) still gets it there: the kernel is given the time."""
    import subprocess
    import sys

    import nbformat

    if copy_back_delay:
        fake.slow(r"POST /toolbox/[^/]+/files/bulk-download", copy_back_delay)
    env = make_kernel_env(tmp_path / "k", **daytona_settings(fake, SANDBOX_KERNEL_WORK_ROOT="auto"))
    folder = tmp_path / "checkout" / "nb"
    folder.mkdir(parents=True)
    (folder / "data.csv").write_text("a,1\nb,2\n")
    (folder / ".secret").write_text("never copied")
    nb = nbformat.v4.new_notebook()
    nb.cells = [
        nbformat.v4.new_code_cell(
            "import os\nrows = open('data.csv').read().splitlines()\n"
            "open('out.csv', 'w').write(str(len(rows)))\nprint(sorted(os.listdir('.')))"
        )
    ]
    nbformat.write(nb, folder / "report.ipynb")
    done = subprocess.run(
        [
            sys.executable,
            "-m",
            "jupyter",
            "execute",
            "--inplace",
            "--kernel_name=sandbox",
            "report.ipynb",
        ],
        cwd=folder,
        env={**env.environ(), "JUPYTER_PATH": env.jupyter_path},
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert done.returncode == 0, done.stderr[-2000:]
    (out,) = [
        o
        for o in nbformat.read(folder / "report.ipynb", as_version=4).cells[0].outputs
        if o.get("name") == "stdout"
    ]
    assert out["text"] == "['data.csv', 'out.csv', 'report.ipynb']\n"  # no dot-entry went in
    assert (folder / "out.csv").read_text() == "2"  # the result came back beside the notebook


def test_an_egress_allowlist_goes_to_daytonas_own(
    fake: FakeDaytona, service_for: Callable[..., SandboxService]
) -> None:
    """Names and IPv4 networks become Daytona's domain and network allowlists; what it
    cannot hold (ports, IPv6 networks) the listing says."""
    user = f"u{uuid.uuid4().hex[:6]}"
    service = service_for(
        egress_allow=["pypi.org", "*.pythonhosted.org", "10.20.0.0/16", "2001:db8::/32"]
    )
    info = service.ensure(user_key(user)).info
    box = box_named(fake, f"sk-{user}")
    assert box.domain_allow_list == "pypi.org,*.pythonhosted.org"
    assert box.network_allow_list == "10.20.0.0/16"
    assert box.network_block_all is False
    assert "egress_allow through Daytona's own allowlists" in info.isolation
    assert "2001:db8::/32: Daytona takes IPv4 networks only (not allowed)" in info.isolation
