"""Files never wake a Daytona code sandbox: each user's files sandbox serves them.

The real ``daytona`` SDK against the fake Daytona server (tests/fake_daytona.py): code
and files sandboxes are containers, the user's volume a host folder mounted in both.
What is checked is what a user and an administrator would see: a stopped code sandbox
stays stopped through any number of file requests, one files sandbox per user appears
and serves only that user's volume, it is in no listing or quota, the reaper stops and
removes it by its own rule, and every operation refuses a path through a link out of
the workspace, which the code sandbox may plant at any time.
"""

from __future__ import annotations

import io
import re
import threading
import time
from collections.abc import Callable
from typing import Any

import pytest

from sandbox_kernel.backends.base import files_sandbox_id
from sandbox_kernel.config import SandboxConfig
from sandbox_kernel.errors import (
    BadRequest,
    Conflict,
    FileMissing,
    Forbidden,
    QuotaExceeded,
    SandboxNotFound,
)
from sandbox_kernel.files import RemoteWorkspace
from sandbox_kernel.lifecycle import gc
from sandbox_kernel.service import SandboxService
from sandbox_kernel.store import Store

from . import test_daytona as daytona_tests
from .fake_daytona import FakeDaytona, FakeSandbox
from .test_daytona import SNAPSHOT, box_named, sh, user_key
from .test_rest_api import fetch

pytestmark = pytest.mark.docker

# test_daytona's fixtures (the fake server, its environment, the REST server's settings),
# made this module's: pytest finds fixtures among a module's attributes.
fake = daytona_tests.fake
fake_minute = daytona_tests.fake_minute
service_for = daytona_tests.service_for
daytona_rest = daytona_tests.daytona_rest
jp_server_config = daytona_tests.jp_server_config
_daytona_env = daytona_tests._daytona_env


def files_boxes(fake: FakeDaytona, user: str) -> list[FakeSandbox]:
    """The fake's live files sandboxes of ``user`` (by their labels, as Daytona keeps them)."""
    return [
        b
        for b in fake.sandboxes.values()
        if b.state != "destroyed"
        and b.labels.get("sandbox-kernel.role") == "files"
        and b.labels.get("sandbox-kernel.user") == user
    ]


def container_status(fake: FakeDaytona, box: FakeSandbox) -> str:
    """What the runner (Docker) says of a sandbox, not what the fake's records say."""
    return str(fake.docker.containers.get(box.container_id).status)


def in_files_sandbox(fake: FakeDaytona, box: FakeSandbox, script: str) -> str:
    """Run a check inside a files sandbox behind the API (as its runner would)."""
    res = fake.docker.containers.get(box.container_id).exec_run(["sh", "-c", script])
    return (res.output or b"").decode()


def code_activity(service: SandboxService, fake: FakeDaytona, sandbox_id: str) -> tuple[Any, ...]:
    """The activity of a code sandbox both ways: Daytona's and the state file's."""
    box = box_named(fake, sandbox_id)
    record = service.store.get("daytona", sandbox_id)
    return fake.last_activity.get(box.id), record.last_activity if record else None


def upload(workspace: Any, path: str, data: bytes) -> None:
    up = workspace.start_upload(path)
    try:
        up.write(data)
        up.commit()
    finally:
        up.abort()


# -- the REST routes on a stopped code sandbox ---------------------------------------------------
async def test_rest_files_leave_a_stopped_sandbox_asleep(
    jp_fetch: Any,
    fake: FakeDaytona,
    daytona_rest: dict[str, str],
    make_config: Callable[..., SandboxConfig],
    test_user: str,
) -> None:
    service = SandboxService(
        make_config(
            backend="daytona", image=SNAPSHOT, state_dir=daytona_rest["SANDBOX_KERNEL_STATE_DIR"]
        )
    )
    backend = service.backend
    sid = service.ensure(user_key(test_user)).info.id
    sh(backend, sid, "echo from-code > /workspace/from-code.txt")
    await fetch(jp_fetch, "api", "sandboxes", sid, "stop", method="POST", body="")
    code = box_named(fake, sid)
    assert container_status(fake, code) == "exited"
    before = code_activity(service, fake, sid)
    started = time.time()
    creates = sum(1 for r in fake.requests if r == ("POST", "/api/sandbox"))

    for _ in range(3):  # any number of requests
        listing = await fetch(jp_fetch, "api", "sandboxes", sid, "files")
        assert "from-code.txt" in [e["name"] for e in listing["entries"]]
        response = await jp_fetch("api", "sandboxes", sid, "files", "from-code.txt")
        assert response.body == b"from-code\n"
    made = await fetch(
        jp_fetch,
        "api",
        "sandboxes",
        sid,
        "files",
        "deep",
        "from-files.txt",
        method="PUT",
        body=b"from-files",
        expect=201,
    )
    assert made == {"path": "deep/from-files.txt", "size": 10}
    await fetch(jp_fetch, "api", "sandboxes", sid, "files", "deep", "from-files.txt")
    await fetch(jp_fetch, "api", "sandboxes", sid, "files", "nothing.txt", expect=404)

    # The code sandbox slept through it all, and none of it was its activity.
    assert (code.state, container_status(fake, code)) == ("stopped", "exited")
    assert (await fetch(jp_fetch, "api", "sandboxes", sid))["state"] == "stopped"
    assert code_activity(service, fake, sid) == before
    # One files sandbox, made once, running, with its own rules and the user's volume only.
    (box,) = files_boxes(fake, test_user)
    assert sum(1 for r in fake.requests if r == ("POST", "/api/sandbox")) == creates + 1
    assert container_status(fake, box) == "running"
    assert (box.auto_stop, box.network_block_all) == (60, True)
    assert box.name.split("--i")[0] == files_sandbox_id(test_user) == f"sk-{test_user}--files"
    (mount,) = box.volumes
    assert mount["mountPath"] == "/workspace"
    assert mount["volumeId"] == box_named(fake, sid).volumes[0]["volumeId"]
    # File use is the files sandbox's activity (the state file's record of it).
    record = service.store.get("daytona", files_sandbox_id(test_user))
    assert record is not None and record.last_activity >= started

    # It is not one of the user's sandboxes: not listed, not counted, not reachable by id.
    assert [s["id"] for s in await fetch(jp_fetch, "api", "sandboxes")] == [sid]
    assert (await fetch(jp_fetch, "api", "sandboxes-stats"))["sandboxes"] == 1
    for route in ((), ("files",)):
        body = await fetch(
            jp_fetch, "api", "sandboxes", files_sandbox_id(test_user), *route, expect=404
        )
        assert "files sandbox" in body["message"]

    # The code sandbox's next command sees what the files path wrote.
    await fetch(jp_fetch, "api", "sandboxes", sid, "start", method="POST", body="")
    assert sh(backend, sid, "cat /workspace/deep/from-files.txt") == "from-files"
    # An auto-stopped files sandbox is started again by the next file request; the code
    # sandbox, stopped again, stays stopped.
    await fetch(jp_fetch, "api", "sandboxes", sid, "stop", method="POST", body="")
    fake.auto_stop(box.id)
    assert container_status(fake, box) == "exited"
    response = await jp_fetch("api", "sandboxes", sid, "files", "deep", "from-files.txt")
    assert response.body == b"from-files"
    assert [b.id for b in files_boxes(fake, test_user)] == [box.id]
    assert container_status(fake, box) == "running"
    assert (code.state, container_status(fake, code)) == ("stopped", "exited")


async def test_webdav_on_a_stopped_daytona_sandbox(
    jp_fetch: Any,
    jp_serverapp: Any,
    fake: FakeDaytona,
    daytona_rest: dict[str, str],
    make_config: Callable[..., SandboxConfig],
    test_user: str,
) -> None:
    """WebDAV (every method a drive uses) on a stopped Daytona sandbox: served by the
    files sandbox, the code sandbox asleep throughout; what WebDAV wrote is the code's."""
    service = SandboxService(
        make_config(
            backend="daytona", image=SNAPSHOT, state_dir=daytona_rest["SANDBOX_KERNEL_STATE_DIR"]
        )
    )
    sid = service.ensure(user_key(test_user)).info.id
    await fetch(jp_fetch, "api", "sandboxes", sid, "stop", method="POST", body="")
    base = f"http://127.0.0.1:{jp_serverapp.port}{jp_serverapp.base_url}sandbox-kernel/dav/{sid}"

    async def dav(method: str, path: str, expect: int, **kw: Any) -> bytes:
        response = await jp_fetch(
            "sandbox-kernel",
            "dav",
            sid,
            *path.split("/"),
            method=method,
            allow_nonstandard_methods=True,
            raise_error=False,
            **kw,
        )
        # WsgiDAV's error page says why in its <p>: that, whole, rather than the page.
        said = re.search(rb"<p>(.*?)</p>", response.body or b"", re.S)
        assert response.code == expect, f"{method} {path}: {response.code}, " + (
            said.group(1).decode(errors="replace") if said else repr(response.body)
        )
        return response.body or b""

    await dav("MKCOL", "drive", 201, body=b"")
    await dav("PUT", "drive/a.txt", 201, body=b"0123456789")
    listing = await dav("PROPFIND", "drive/", 207, body=b"", headers={"Depth": "1"})
    assert b"a.txt" in listing
    assert await dav("GET", "drive/a.txt", 206, headers={"Range": "bytes=2-4"}) == b"234"
    await dav("COPY", "drive/a.txt", 201, body=b"", headers={"Destination": f"{base}/drive/b.txt"})
    await dav("MOVE", "drive/b.txt", 201, body=b"", headers={"Destination": f"{base}/c.txt"})
    await dav("DELETE", "drive/a.txt", 204)
    code = box_named(fake, sid)
    assert (code.state, container_status(fake, code)) == ("stopped", "exited")
    await fetch(jp_fetch, "api", "sandboxes", sid, "start", method="POST", body="")
    assert sh(service.backend, sid, "cat /workspace/c.txt; ls /workspace/drive") == "0123456789"
    await dav("DELETE", "drive", 204)
    assert "drive" not in sh(service.backend, sid, "ls /workspace")


# -- one files sandbox per user ------------------------------------------------------------------
def test_one_files_sandbox_per_user_with_only_their_volume(
    fake: FakeDaytona, service_for: Callable[..., SandboxService]
) -> None:
    service = service_for()
    ann, bob = f"ann{time.monotonic_ns() % 10**8}", f"bob{time.monotonic_ns() % 10**8}"
    ids = {}
    for user in (ann, bob):
        ids[user] = service.ensure(user_key(user)).info.id
        sh(service.backend, ids[user], f"echo {user} > /workspace/whose.txt")
        service.stop(user, ids[user])
    # Two processes' worth of first requests at once (two services: two backends, two
    # SDK clients) still make one files sandbox per user.
    other = service_for(state_dir=service.config.state_dir)
    errors: list[BaseException] = []

    def read(svc: SandboxService, user: str) -> None:
        try:
            ws = svc.workspace(user, ids[user])
            with ws.open_file("whose.txt") as fh:
                assert fh.read() == f"{user}\n".encode()
        except BaseException as exc:  # reported below, with the thread's own assertion
            errors.append(exc)

    threads = [
        threading.Thread(target=read, args=(svc, user))
        for user in (ann, bob)
        for svc in (service, other, service)
    ]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert errors == []
    volumes = {}
    for user in (ann, bob):
        (box,) = files_boxes(fake, user)
        (mount,) = box.volumes
        volumes[user] = mount["volumeId"]
        assert fake.volumes[mount["volumeId"]]["name"] == f"sk-ws-{user}"
        assert in_files_sandbox(fake, box, "cat /workspace/whose.txt") == f"{user}\n"
        assert box_named(fake, ids[user]).state == "stopped"
    assert volumes[ann] != volumes[bob]
    # Owner rules as before: someone else's sandbox is refused, an administrator reaches
    # it through its owner's files sandbox (no third one).
    with pytest.raises(Forbidden):
        service.workspace(bob, ids[ann])
    admin = service.workspace(None, ids[ann])
    assert isinstance(admin, RemoteWorkspace) and admin.sandbox_id == files_sandbox_id(ann)
    assert len(files_boxes(fake, ann)) == 1


# -- every operation, and the link out -----------------------------------------------------------
def test_every_operation_and_a_link_out(
    fake: FakeDaytona, service_for: Callable[..., SandboxService]
) -> None:
    service = service_for()
    user = f"ops{time.monotonic_ns() % 10**8}"
    sid = service.ensure(user_key(user)).info.id
    # What the code sandbox plants: a link out, a link within, and modules a helper
    # that imported from its working folder would run.
    sh(
        service.backend,
        sid,
        "cd /workspace && mkdir -p sub/inner && echo deep > sub/inner/deep.txt "
        "&& ln -s /etc out && ln -s sub within && ln -s /etc sub/inner/out-too "
        "&& for m in json stat os errno; do "
        "echo \"open('/workspace/PWNED', 'w').write('$m')\" > $m.py; done",
    )
    service.stop(user, sid)
    ws = service.workspace(user, sid)
    assert isinstance(ws, RemoteWorkspace)
    (box,) = files_boxes(fake, user)

    # stat
    root = ws.stat("")
    assert (root.name, root.path, root.type) == ("", "", "directory")
    assert (ws.stat("sub/inner/deep.txt").type, ws.stat("sub/inner/deep.txt").size) == ("file", 5)
    assert ws.stat("sub/inner/deep.txt").name == "deep.txt"
    assert ws.stat("out").type == "symlink"  # described, never followed
    with pytest.raises(FileMissing):
        ws.stat("nothing/here")

    # make_folder: exactly one
    ws.make_folder("made")
    assert ws.stat("made").type == "directory"
    with pytest.raises(Conflict, match="already exists"):
        ws.make_folder("made")
    with pytest.raises(FileMissing):
        ws.make_folder("no/parent")
    with pytest.raises(BadRequest):
        ws.make_folder("")

    # open_file: seekable, the bytes as they were, regular files only
    blob = bytes(range(256)) * 4096 + b"tail"
    upload(ws, "made/blob.bin", blob)
    with ws.open_file("made/blob.bin") as fh:
        assert fh.seekable() and fh.read() == blob
        fh.seek(-4, io.SEEK_END)
        assert fh.read() == b"tail"
    size, chunks = ws.open_read("made/blob.bin")
    assert size == len(blob) and b"".join(chunks) == blob
    for not_regular in ("made", "within", "out"):
        with pytest.raises(BadRequest):
            ws.open_file(not_regular)

    # copy_file: a regular file, replacing the destination whole
    upload(ws, "made/old.txt", b"old")
    ws.copy_file("made/blob.bin", "made/old.txt")
    with ws.open_file("made/old.txt") as fh:
        assert fh.read() == blob
    ws.copy_file("sub/inner/deep.txt", "copies/deep.txt")
    with pytest.raises(BadRequest, match="not a regular file"):
        ws.copy_file("sub", "copies/sub")
    with pytest.raises(BadRequest, match="uploads only replace regular files"):
        ws.copy_file("sub/inner/deep.txt", "made")

    # move: files (replacing one) and whole folders
    ws.move("copies/deep.txt", "made/old.txt")
    with ws.open_file("made/old.txt") as fh:
        assert fh.read() == b"deep\n"
    ws.move("copies", "moved")
    assert [e.name for e in ws.list("")[0]].count("moved") == 1
    with pytest.raises(FileMissing):
        ws.move("copies", "again")
    with pytest.raises(FileMissing):
        ws.move("moved", "no/parent/here")
    with pytest.raises(BadRequest, match="into itself"):
        ws.move("sub", "sub/inner/sub")
    with pytest.raises(Conflict, match="in the way"):
        ws.move("moved", "sub")

    # The link out: refused for every operation that goes through it; nothing of the
    # files sandbox's own system was read, made, moved or removed.
    through = "out/passwd"
    refused: list[Callable[[], Any]] = [
        lambda: ws.stat(through),
        lambda: ws.list("out"),
        lambda: ws.list("sub/inner/out-too"),
        lambda: ws.open_file(through),
        lambda: ws.open_read(through),
        lambda: ws.make_folder("out/made"),
        lambda: ws.remove(through),
        lambda: ws.delete(through),
        lambda: ws.move(through, "stolen"),
        lambda: ws.move("made/old.txt", "out/planted"),
        lambda: ws.copy_file(through, "stolen"),
        lambda: ws.copy_file("made/old.txt", "out/planted"),
        lambda: ws.copy_file("sub/inner/out-too/passwd", "stolen"),
        lambda: ws.start_upload("out/planted"),
    ]
    for op in refused:
        with pytest.raises(BadRequest, match="outside the workspace"):
            op()
    # A link that stays inside is not followed either (as on the host).
    with pytest.raises(BadRequest):
        ws.list("within")
    with pytest.raises(BadRequest):
        ws.open_file("within/inner/deep.txt")
    assert in_files_sandbox(
        fake, box, "ls /etc/passwd /etc/made /etc/planted 2>&1; ls /workspace"
    ) == (
        "ls: cannot access '/etc/made': No such file or directory\n"
        "ls: cannot access '/etc/planted': No such file or directory\n"
        "/etc/passwd\n"
        "errno.py\njson.py\nmade\nmoved\nos.py\nout\nstat.py\nsub\nwithin\n"
    )

    # remove: the link itself (never its target), a file, a whole tree with a link out
    # inside it (removed, its target untouched); never the workspace itself
    ws.remove("out")
    ws.remove("moved")
    ws.remove("sub")
    with pytest.raises(BadRequest):
        ws.remove("")
    with pytest.raises(FileMissing):
        ws.remove("sub")
    assert in_files_sandbox(fake, box, "ls /etc/passwd; ls /workspace") == (
        "/etc/passwd\nerrno.py\njson.py\nmade\nos.py\nstat.py\nwithin\n"
    )
    # No planted module ever ran, and the stage holds nothing once transfers ended.
    assert "PWNED" not in [e.name for e in ws.list("")[0]]
    assert in_files_sandbox(fake, box, "ls -A /tmp/.sk-files-stage") == ""
    assert box_named(fake, sid).state == "stopped"


def test_upload_never_lands_through_a_link_swapped_in(
    fake: FakeDaytona, service_for: Callable[..., SandboxService]
) -> None:
    """The code sandbox swaps the upload's folder for a link out between the check and
    the commit: the commit refuses, nothing lands in the files sandbox's own system."""
    service = service_for()
    user = f"swap{time.monotonic_ns() % 10**8}"
    sid = service.ensure(user_key(user)).info.id
    sh(service.backend, sid, "mkdir -p /workspace/docs")
    ws = service.workspace(user, sid)
    (box,) = files_boxes(fake, user)
    up = ws.start_upload("docs/report.txt")
    up.write(b"payload")
    # The files sandbox user's own home: a write there would have worked, had it been followed.
    sh(service.backend, sid, "cd /workspace && mv docs docs.real && ln -s /home/daytona docs")
    with pytest.raises(BadRequest, match="outside the workspace"):
        up.commit()
    assert in_files_sandbox(fake, box, "ls -A /home/daytona /tmp/.sk-files-stage") == (
        "/home/daytona:\n\n/tmp/.sk-files-stage:\n"
    )


# -- listings, quotas and the reaper ------------------------------------------------------------
def test_files_sandbox_counts_nowhere_and_the_reaper_has_its_rule(
    fake: FakeDaytona, service_for: Callable[..., SandboxService]
) -> None:
    service = service_for(max_sandboxes=2, files_idle_stop=0.05, idle_delete=0.05)  # 3 s
    user = f"gc{time.monotonic_ns() % 10**8}"
    sid = service.ensure(user_key(user)).info.id
    upload(service.workspace(user, sid), "kept.txt", b"kept")
    files_id = files_sandbox_id(user)
    (box,) = files_boxes(fake, user)
    first_engine_id = box.id

    assert [s["id"] for s in service.list(user)] == [sid]
    assert [s["id"] for s in service.list(None)] == [sid]
    assert service.stats(user)["sandboxes"] == 1
    with pytest.raises(SandboxNotFound, match="files sandbox"):
        service.owned(None, files_id)
    # A quota of two code sandboxes: the files sandbox takes no place in it.
    thread = service.ensure(user_key(user, "second.ipynb")).info.id
    with pytest.raises(QuotaExceeded):
        service.ensure(user_key(user, "third.ipynb"))

    # Stopped after files_idle_stop without file use (the code sandboxes run on: their
    # idle_stop has not passed) ...
    service.workspace(user, sid).list("")  # file use: its idle clock starts again
    assert [a.sandbox_id for a in gc(service.backend, service.config)] == []
    time.sleep(3.5)
    (stop,) = gc(service.backend, service.config)
    assert (stop.sandbox_id, stop.action, stop.done) == (files_id, "stop", True)
    assert "files sandbox" in stop.reason
    assert container_status(fake, box) == "exited"
    # ... removed after idle_delete stopped, with its record ...
    time.sleep(3.5)
    dry = gc(service.backend, service.config, dry_run=True)
    assert [(a.sandbox_id, a.action) for a in dry] == [(files_id, "destroy")]
    (gone,) = gc(service.backend, service.config)
    assert (gone.sandbox_id, gone.action, gone.done) == (files_id, "destroy", True)
    assert files_boxes(fake, user) == []
    assert Store(service.config).get("daytona", files_id) is None
    assert sorted(i.id for i in service.backend.list()) == sorted([sid, thread])
    # ... and made again by the next file use, with the workspace as it was.
    with service.workspace(user, sid).open_file("kept.txt") as fh:
        assert fh.read() == b"kept"
    (again,) = files_boxes(fake, user)
    assert again.id != first_engine_id


def test_daytona_auto_stops_an_idle_files_sandbox(
    fake: FakeDaytona, fake_minute: None, service_for: Callable[..., SandboxService]
) -> None:
    """Daytona's own timer, set to files_idle_stop, stops it; file use keeps it up."""
    service = service_for(files_idle_stop=1)  # one (fake) minute: 3 s
    user = f"auto{time.monotonic_ns() % 10**8}"
    sid = service.ensure(user_key(user)).info.id
    service.stop(user, sid)
    ws = service.workspace(user, sid)
    (box,) = files_boxes(fake, user)
    assert box.auto_stop == 1
    for _ in range(4):  # 6 s of use, past the interval: never stopped while in use
        ws.list("")
        time.sleep(1.5)
    assert container_status(fake, box) == "running"
    deadline = time.monotonic() + 20
    while box.state != "stopped" and time.monotonic() < deadline:
        time.sleep(0.5)
    assert box.state == "stopped"
    assert [e.name for e in service.workspace(user, sid).list("")[0]] == []
    assert container_status(fake, box) == "running"
    assert box_named(fake, sid).state == "stopped"


def test_snapshot_setting_does_not_reach_the_files_sandbox(
    fake: FakeDaytona, service_for: Callable[..., SandboxService]
) -> None:
    """A user's snapshot was taken of a sandbox that ran their code: the files sandbox is
    made from the configured image instead."""
    service = service_for()
    user = f"snap{time.monotonic_ns() % 10**8}"
    info = service.ensure(user_key(user)).info
    service.create_snapshot(user, info.id, "mine")
    try:
        snapped = service_for(snapshot="mine", user=user, state_dir=service.config.state_dir)
        snapped.workspace(user, info.id).list("")
        (box,) = files_boxes(fake, user)
        assert (box.snapshot, box.labels["sandbox-kernel.image"]) == (SNAPSHOT, SNAPSHOT)
    finally:
        service.delete_snapshot(user, "mine")
