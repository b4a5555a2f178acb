"""WebDAV on a real Jupyter server and real Docker, through real clients: webdav4 (every
method), rclone (lsf, copyto, cat, sync both ways), plain HTTP for the protocol's
corners, and a davfs2 mount where FUSE works."""

from __future__ import annotations

import asyncio
import hashlib
import io
import os
import shutil
import subprocess
import sys
import time
import tracemalloc
from collections.abc import Callable
from pathlib import Path
from typing import Any

import docker
import httpx
import nbformat
import pytest
from webdav4.client import Client, ResourceAlreadyExists, ResourceNotFound

from jupyter_ext.webdav import METHODS

from .conftest import sandbox_container
from .kernel_env import KernelEnv, make_kernel_env
from .test_rest_api import jp_server_config, server_url

__all__ = ["jp_server_config"]  # the REST tests' server: extension on, 200 MB uploads

pytestmark = pytest.mark.docker


@pytest.fixture
def jp_base_url() -> str:
    # pytest-jupyter's default ("/a%40b/") is spelt "/a@b/" by httpx and rclone, which
    # tornado's routes (Jupyter's, not ours) do not match; a prefix is still tested.
    return "/user/dav-test/"


@pytest.fixture
def token(jp_serverapp: Any) -> str:
    return jp_serverapp.identity_provider.token


@pytest.fixture
def dav_url(jp_serverapp: Any, jp_fetch: Any, sandbox: dict[str, str]) -> str:
    """The sandbox's WebDAV URL (jp_fetch is what starts the server's listener)."""
    return f"{server_url(jp_serverapp)}/sandbox-kernel/dav/{sandbox['id']}/"


def client(dav_url: str, token: str, basic: bool = True) -> Client:
    if basic:
        return Client(dav_url, auth=("anyone", token), timeout=60)
    return Client(dav_url, headers={"Authorization": f"Bearer {token}"}, timeout=60)


def run(fn: Callable[..., Any], *args: Any) -> Any:
    """Sync clients run in a thread: the server under test shares this event loop."""
    return asyncio.to_thread(fn, *args)


def in_sandbox(sandbox: dict[str, str], command: str) -> tuple[int, str]:
    container = sandbox_container(sandbox["id"])
    code, out = container.exec_run(["sh", "-c", command], user="1000", workdir="/workspace")
    return code, out.decode()


async def test_every_method_through_webdav4(
    dav_url: str, token: str, sandbox: dict[str, str]
) -> None:
    dav = client(dav_url, token)
    ws = Path(sandbox["workspace"])

    def scenario() -> None:
        dav.mkdir("notes")
        with pytest.raises(ResourceAlreadyExists):
            dav.mkdir("notes")
        dav.upload_fileobj(_bytes(b"hello from dav\n"), "notes/a.txt")
        assert (ws / "notes" / "a.txt").read_bytes() == b"hello from dav\n"
        names = {item["name"] for item in dav.ls("notes")}
        assert names == {"notes/a.txt"}
        info = dav.info("notes/a.txt")
        assert info["content_length"] == 15 and info["type"] == "file"
        assert dav.info("")["type"] == "directory"
        dav.copy("notes/a.txt", "notes/b.txt")
        dav.move("notes/b.txt", "c.txt")
        assert (ws / "c.txt").read_bytes() == b"hello from dav\n"
        assert not (ws / "notes" / "b.txt").exists()
        dav.copy("notes", "notes-copy")  # a folder, Depth infinity
        assert (ws / "notes-copy" / "a.txt").read_bytes() == b"hello from dav\n"
        dav.move("notes-copy", "moved")
        assert (ws / "moved" / "a.txt").exists() and not (ws / "notes-copy").exists()
        dav.remove("moved")  # a whole tree
        assert not (ws / "moved").exists()
        dav.remove("c.txt")
        with pytest.raises(ResourceNotFound):
            dav.info("c.txt")
        out = _bytes()
        dav.download_fileobj("notes/a.txt", out)
        assert out.getvalue() == b"hello from dav\n"

    await run(scenario)


async def test_ranges_locks_and_options(dav_url: str, token: str, sandbox: dict[str, str]) -> None:
    data = os.urandom(3 << 20)
    Path(sandbox["workspace"], "big.bin").write_bytes(data)
    os.chown(Path(sandbox["workspace"], "big.bin"), 1000, 1000)
    auth = {"Authorization": f"Bearer {token}"}

    def scenario() -> None:
        with httpx.Client(headers=auth, timeout=60) as http:
            r = http.request("OPTIONS", dav_url)
            assert r.status_code == 200 and "1" in r.headers["DAV"] and "2" in r.headers["DAV"]
            assert "PROPFIND" in r.headers["Allow"] and "LOCK" in r.headers["Allow"]
            r = http.get(dav_url + "big.bin", headers={"Range": "bytes=1048576-1048585"})
            assert r.status_code == 206 and r.content == data[1 << 20 : (1 << 20) + 10]
            assert r.headers["Content-Range"] == f"bytes 1048576-1048585/{len(data)}"
            r = http.get(dav_url + "big.bin")
            assert (
                r.status_code == 200
                and hashlib.sha256(r.content).digest() == hashlib.sha256(data).digest()
            )
            r = http.request("PROPFIND", dav_url, headers={"Depth": "0"})
            assert r.status_code == 207 and b"collection" in r.content
            lock_body = (
                '<?xml version="1.0"?><D:lockinfo xmlns:D="DAV:"><D:lockscope><D:exclusive/>'
                "</D:lockscope><D:locktype><D:write/></D:locktype>"
                "<D:owner>finder</D:owner></D:lockinfo>"
            )
            r = http.request(
                "LOCK", dav_url + "locked.txt", content=lock_body, headers={"Timeout": "Second-60"}
            )
            assert r.status_code in (200, 201), r.text
            lock_token = r.headers["Lock-Token"]
            assert Path(sandbox["workspace"], "locked.txt").read_bytes() == b""
            r = http.put(dav_url + "locked.txt", content=b"no token")
            assert r.status_code == 423
            r = http.put(
                dav_url + "locked.txt", content=b"with token", headers={"If": f"({lock_token})"}
            )
            assert r.status_code in (200, 204), r.text
            r = http.request("UNLOCK", dav_url + "locked.txt", headers={"Lock-Token": lock_token})
            assert r.status_code == 204
            assert Path(sandbox["workspace"], "locked.txt").read_bytes() == b"with token"

    await run(scenario)


def _bytes(data: bytes = b"") -> io.BytesIO:
    return io.BytesIO(data)


async def test_authentication_and_ids(dav_url: str, token: str) -> None:
    """401 with a Basic challenge without (or with wrong) credentials; the token works as
    Basic's password, as a bearer token and as Jupyter's ``token`` scheme."""
    base = dav_url.rsplit("/", 2)[0] + "/"
    basic = httpx.BasicAuth("anyone", token)

    def scenario() -> None:
        with httpx.Client(timeout=30) as http:
            for auth in (None, httpx.BasicAuth("anyone", "wrong"), httpx.BasicAuth("x", "")):
                r = http.request("PROPFIND", dav_url, auth=auth, headers={"Depth": "0"})
                assert r.status_code == 401, (auth, r.status_code, r.text)
                assert r.headers["WWW-Authenticate"].startswith('Basic realm="sandbox-kernel"')
                assert "Traceback" not in r.text
            for method in METHODS:  # every method the route serves, without a login
                r = http.request(method, dav_url + "x.txt", content=b"x")
                assert r.status_code == 401, (method, r.status_code)
            r = http.request("PROPFIND", dav_url, headers={"Authorization": "Bearer nope"})
            assert r.status_code == 401
            r = http.put(dav_url + "x.txt", content=b"x", headers={"Authorization": "Basic !!"})
            assert r.status_code == 401
            for headers in (
                {"Authorization": f"Bearer {token}"},
                {"Authorization": f"token {token}"},
            ):
                r = http.request("PROPFIND", dav_url, headers={"Depth": "0", **headers})
                assert r.status_code == 207, r.text
            r = http.request("PROPFIND", dav_url, auth=basic, headers={"Depth": "0"})
            assert r.status_code == 207
            r = http.request("PROPFIND", base + "sk-nobody-here/", auth=basic)
            assert r.status_code == 404 and "Traceback" not in r.text
            r = http.request("PROPFIND", base + "bad%20id!/", auth=basic)
            assert r.status_code == 400 and "bad sandbox id" in r.text

    await run(scenario)


async def test_refusals_are_clear_and_lose_nothing(
    dav_url: str, token: str, sandbox: dict[str, str]
) -> None:
    ws = Path(sandbox["workspace"])
    (ws / "keep.txt").write_bytes(b"keep")
    os.symlink("/etc", ws / "link")
    auth = httpx.BasicAuth("anyone", token)

    def scenario() -> None:
        with httpx.Client(auth=auth, timeout=60) as http:
            r = http.request("PROPFIND", dav_url, headers={"Depth": "1"})
            assert r.status_code == 207 and b"keep.txt" in r.content and b"link" not in r.content
            r = http.get(dav_url + "link/passwd")
            assert r.status_code == 403 and "link" in r.text, r.text
            r = http.put(dav_url + "link", content=b"over the link")
            assert r.status_code == 403 and "symlink" in r.text, r.text
            assert os.readlink(ws / "link") == "/etc"
            for depth in ({"Depth": "infinity"}, {}):
                r = http.request("PROPFIND", dav_url, headers=depth)
                assert r.status_code == 403 and b"propfind-finite-depth" in r.content, r.text
            r = http.request("MKCOL", dav_url + "no/such/parent")
            assert r.status_code == 409
            r = http.delete(dav_url)
            assert r.status_code == 403 and "workspace itself" in r.text
            r = http.put(dav_url + "big.bin", content=b"x" * ((200 << 20) + 1))
            assert r.status_code == 413
            r = http.put(dav_url + "chunked.bin", content=iter([b"x" * (1 << 20)] * 201))
            assert r.status_code == 413
            r = http.request(
                "MOVE",
                dav_url + "keep.txt",
                headers={"Destination": dav_url.replace(dav_url.rsplit("/", 2)[1], "sk-other")},
            )
            assert r.status_code == 403 and "within one sandbox" in r.text, r.text
            assert (ws / "keep.txt").read_bytes() == b"keep"
        left = sorted(p.name for p in ws.iterdir())
        assert left == ["keep.txt", "link"], left  # no temporaries, no partial files

    await run(scenario)


async def test_rclone_lsf_copyto_cat_sync(
    dav_url: str, token: str, sandbox: dict[str, str], tmp_path: Path
) -> None:
    """rclone as the manual (docs/users/webdav.md) configures it: a webdav remote with the token as bearer token."""
    ws = Path(sandbox["workspace"])
    env = {
        **os.environ,
        "RCLONE_CONFIG": str(tmp_path / "rclone.conf"),
        "RCLONE_CONFIG_SK_TYPE": "webdav",
        "RCLONE_CONFIG_SK_URL": dav_url,
        "RCLONE_CONFIG_SK_VENDOR": "other",
        "RCLONE_CONFIG_SK_BEARER_TOKEN": token,
    }

    async def rclone(*args: str) -> str:
        proc = await asyncio.create_subprocess_exec(
            "rclone", *args, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE
        )
        out, err = await asyncio.wait_for(proc.communicate(), 120)
        assert proc.returncode == 0, (args, err.decode()[-2000:])
        return out.decode()

    local = tmp_path / "local"
    (local / "sub").mkdir(parents=True)
    (local / "a.txt").write_text("alpha\n")
    (local / "sub" / "b.bin").write_bytes(os.urandom(5 << 20))
    (local / "report.txt").write_text("to copy\n")
    await rclone("copyto", str(local / "report.txt"), "sk:docs/report.txt")
    assert (ws / "docs" / "report.txt").read_text() == "to copy\n"
    assert await rclone("cat", "sk:docs/report.txt") == "to copy\n"
    assert "docs/" in (await rclone("lsf", "sk:")).split()
    await rclone("sync", str(local), "sk:mirror")
    assert (ws / "mirror" / "sub" / "b.bin").read_bytes() == (local / "sub" / "b.bin").read_bytes()
    (ws / "mirror" / "made-in-sandbox.txt").write_text("from the sandbox\n")
    (ws / "mirror" / "a.txt").unlink()
    back = tmp_path / "back"
    await rclone("sync", "sk:mirror", str(back))
    assert sorted(p.relative_to(back).as_posix() for p in back.rglob("*")) == [
        "made-in-sandbox.txt",
        "report.txt",
        "sub",
        "sub/b.bin",
    ]
    assert (back / "sub" / "b.bin").read_bytes() == (local / "sub" / "b.bin").read_bytes()
    assert (
        await rclone("lsf", "-R", "sk:mirror")
        == "made-in-sandbox.txt\nreport.txt\nsub/\nsub/b.bin\n"
    )


async def test_stopped_sandbox_stays_stopped(
    dav_url: str, token: str, sandbox: dict[str, str], jp_fetch: Any
) -> None:
    """Docker: the workspace is read on the host; no WebDAV request starts the sandbox."""
    await jp_fetch("api", "sandboxes", sandbox["id"], "stop", method="POST", body="")
    dav = client(dav_url, token)

    def scenario() -> None:
        dav.mkdir("offline")
        dav.upload_fileobj(_bytes(b"written while stopped"), "offline/n.txt")
        assert {i["name"] for i in dav.ls("offline")} == {"offline/n.txt"}
        out = _bytes()
        dav.download_fileobj("offline/n.txt", out)
        assert out.getvalue() == b"written while stopped"
        dav.move("offline/n.txt", "offline/m.txt")
        dav.remove("offline")

    await run(scenario)
    container = docker.from_env().containers.get(sandbox["engine_id"])
    assert container.status == "exited", container.status


@pytest.fixture
def kernel_env(tmp_path: Path, rest_env: dict[str, str]) -> KernelEnv:
    """A sandbox kernelspec of the server's user: its kernels land in the server's sandbox."""
    return make_kernel_env(
        tmp_path / "k",
        SANDBOX_KERNEL_WORKSPACE_ROOT=rest_env["SANDBOX_KERNEL_WORKSPACE_ROOT"],
        SANDBOX_KERNEL_STATE_DIR=rest_env["SANDBOX_KERNEL_STATE_DIR"],
        SANDBOX_KERNEL_USER=rest_env["SANDBOX_KERNEL_USER"],
    )


async def test_a_cell_and_webdav_see_each_others_files(
    dav_url: str, token: str, sandbox: dict[str, str], kernel_env: KernelEnv, tmp_path: Path
) -> None:
    """A file put through WebDAV is read by the next cell, and a cell's file is fetched
    through WebDAV (the cells run by ``jupyter execute``, as in a CI job)."""
    dav = client(dav_url, token)
    await run(dav.mkdir, "handoff")
    await run(dav.upload_fileobj, _bytes(b"from webdav"), "handoff/in.txt")
    notebook = tmp_path / "handoff.ipynb"
    nbformat.write(
        nbformat.v4.new_notebook(
            cells=[
                nbformat.v4.new_code_cell("print(open('/workspace/handoff/in.txt').read())"),
                nbformat.v4.new_code_cell(
                    "open('/workspace/handoff/out.txt', 'w').write('from the cell')"
                ),
            ],
            metadata={"kernelspec": {"name": kernel_env.kernel_name, "display_name": "sandbox"}},
        ),
        notebook,
    )
    proc = await asyncio.create_subprocess_exec(
        sys.executable,
        "-m",
        "jupyter",
        "execute",
        "--inplace",
        str(notebook),
        env={**kernel_env.environ(), "JUPYTER_PATH": kernel_env.jupyter_path},
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
    )
    _, err = await asyncio.wait_for(proc.communicate(), 300)
    assert proc.returncode == 0, err.decode()[-3000:]
    first = nbformat.read(notebook, as_version=4).cells[0].outputs
    assert [o.get("text") for o in first] == ["from webdav\n"]
    out = _bytes()
    await run(dav.download_fileobj, "handoff/out.txt", out)
    assert out.getvalue() == b"from the cell"


@pytest.mark.skipif(shutil.which("mount.davfs") is None, reason="davfs2 is not installed")
async def test_davfs2_mount(
    dav_url: str, token: str, sandbox: dict[str, str], tmp_path: Path
) -> None:
    """The workspace as a mounted drive: ls, cat, write, rename, remove through the kernel's
    file system. Skipped, with the reason, where this machine cannot mount FUSE."""
    if os.geteuid() != 0:
        pytest.skip("mounting davfs2 needs root here (or an fstab entry for the user)")
    if not os.path.exists("/dev/fuse"):
        pytest.skip("no /dev/fuse on this machine: davfs2 cannot mount")
    ws = Path(sandbox["workspace"])
    (ws / "seen.txt").write_text("on the drive\n")
    secrets = tmp_path / "davfs2.secrets"
    secrets.write_text(f"{dav_url} anyone {token}\n")
    secrets.chmod(0o600)
    conf = tmp_path / "davfs2.conf"
    # buf_size 64: davfs2 <= 1.7.1 cannot list folders on Linux >= 6.16 with the default
    # (davfs2 issue #22); docs/users/webdav.md gives the same line.
    conf.write_text(f"secrets {secrets}\nuse_locks 1\ndelay_upload 0\nbuf_size 64\n")
    mnt = tmp_path / "mnt"
    mnt.mkdir()
    proc = await asyncio.create_subprocess_exec(
        "mount.davfs",
        dav_url,
        str(mnt),
        "-o",
        f"conf={conf}",
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
    )
    out, _ = await asyncio.wait_for(proc.communicate(), 60)
    if proc.returncode != 0:
        pytest.skip(f"davfs2 could not mount on this machine: {out.decode()[-300:]}")
    try:

        def scenario() -> None:
            assert (mnt / "seen.txt").read_text() == "on the drive\n"
            (mnt / "drive").mkdir()
            (mnt / "drive" / "w.txt").write_text("written on the drive\n")
            os.rename(mnt / "drive" / "w.txt", mnt / "drive" / "r.txt")
            os.sync()
            deadline = time.monotonic() + 30
            while not (ws / "drive" / "r.txt").exists() and time.monotonic() < deadline:
                time.sleep(0.2)
            assert (ws / "drive" / "r.txt").read_text() == "written on the drive\n"
            assert "drive" in os.listdir(mnt)

        await run(scenario)
    finally:
        umount = await asyncio.create_subprocess_exec("umount", str(mnt))
        await asyncio.wait_for(umount.wait(), 60)


async def test_large_files_stream_both_ways(
    dav_url: str, token: str, sandbox: dict[str, str], tmp_path: Path
) -> None:
    """100 MiB up and down with curl: the server never holds more than a few chunks (the
    PUT body waits in a bounded buffer between the socket and the disk)."""
    src = tmp_path / "big.bin"
    with src.open("wb") as fh:
        for _ in range(100):
            fh.write(os.urandom(1 << 20))
    auth = ["-H", f"Authorization: Bearer {token}"]
    back = tmp_path / "back.bin"
    tracemalloc.start()
    try:
        for cmd in (
            ["curl", "-sf", "-T", str(src), *auth, dav_url + "big.bin"],
            ["curl", "-sf", "-o", str(back), *auth, dav_url + "big.bin"],
        ):
            done = await asyncio.to_thread(subprocess.run, cmd, capture_output=True)
            assert done.returncode == 0, done.stderr
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert peak < 30 << 20, f"the server held {peak >> 20} MiB at once"
    digest = hashlib.sha256(src.read_bytes()).digest()
    assert hashlib.sha256(back.read_bytes()).digest() == digest
    assert hashlib.sha256((Path(sandbox["workspace"]) / "big.bin").read_bytes()).digest() == digest
