"""WebDAV on a real Jupyter server and real Docker, through real clients: webdav4 (every
method), rclone (lsf, copyto, cat, sync both ways), plain HTTP for the protocol's
corners, and a davfs2 mount where FUSE works."""

from __future__ import annotations

import asyncio
import hashlib
import os
from collections.abc import Callable
from pathlib import Path
from typing import Any

import httpx
import pytest
from webdav4.client import Client, ResourceAlreadyExists, ResourceNotFound

from .conftest import sandbox_container
from .test_rest_api import server_url

pytestmark = pytest.mark.docker


@pytest.fixture
def jp_server_config(rest_env: dict[str, str]) -> dict[str, Any]:
    return {
        "ServerApp": {"jpserver_extensions": {"jupyter_ext": True}},
        "SandboxExtension": {"gc_interval": 0, "max_upload_size": 200 << 20},
    }


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


def _bytes(data: bytes = b"") -> Any:
    import io

    return io.BytesIO(data)
