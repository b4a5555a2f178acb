"""The doors on the kubernetes backend, on the real test cluster: the REST API and WebDAV
of a real Jupyter server (files through the user's files pod, never waking a stopped
sandbox), the CLI's shell and JupyterLab's terminals (a PTY over exec, resized), and the
MCP tools over stdio. The same helpers as the Docker tests drive them."""

from __future__ import annotations

import asyncio
import io
import json
import os
import shutil
import sys
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import httpx
import pytest
from mcp.client.session import ClientSession
from mcp.client.stdio import StdioServerParameters, stdio_client
from webdav4.client import Client

from sandbox_kernel.config import load_config
from sandbox_kernel.identity import ScopeKey
from sandbox_kernel.service import SandboxService

from .conftest import TEST_IMAGE
from .test_kubernetes import kube_settings, sh
from .test_mcp import call, texts
from .test_rest_api import fetch, server_url
from .test_terminal import CURSES_APP, Term, open_terminal

pytestmark = pytest.mark.kubernetes


@pytest.fixture
def kube_rest(
    tmp_path: Path, test_user: str, kube_namespace: str, monkeypatch: pytest.MonkeyPatch
) -> dict[str, str]:
    env = {
        **kube_settings(kube_namespace),
        "SANDBOX_KERNEL_STATE_DIR": str(tmp_path / "state"),
        "SANDBOX_KERNEL_USER": test_user,
        "SANDBOX_KERNEL_WORK_ROOT": "none",
    }
    for k, v in env.items():
        monkeypatch.setenv(k, v)
    return env


@pytest.fixture
def jp_server_config(kube_rest: dict[str, str]) -> dict[str, Any]:
    return {
        "ServerApp": {
            "jpserver_extensions": {"jupyter_ext": True, "jupyter_server_terminals": True}
        },
        "SandboxExtension": {"gc_interval": 0, "max_upload_size": 200 << 20},
    }


@pytest.fixture
def jp_base_url() -> str:
    return "/user/kube-test/"


def service_of(env: dict[str, str]) -> SandboxService:
    return SandboxService(
        load_config(
            environ={},
            backend="kubernetes",
            image=TEST_IMAGE,
            kubernetes_namespace=env["SANDBOX_KERNEL_KUBERNETES_NAMESPACE"],
            state_dir=env["SANDBOX_KERNEL_STATE_DIR"],
        )
    )


async def test_rest_over_the_cluster(
    jp_fetch: Any, kube_rest: dict[str, str], test_user: str
) -> None:
    service = service_of(kube_rest)
    sid = service.ensure(ScopeKey(test_user)).info.id
    (item,) = await fetch(jp_fetch, "api", "sandboxes")
    assert (item["id"], item["backend"], item["state"], item["user"]) == (
        sid,
        "kubernetes",
        "running",
        test_user,
    )
    assert item["limits"]["memory"] == 1 << 30
    assert 0 < item["usage"]["memory"] < 1 << 30
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
    assert response.body == b"hello"
    assert (
        sh(service, sid, "cat /workspace/deep/note.txt; stat -c %u /workspace/deep/note.txt")
        == "hello1000\n"
    )
    # A link planted by the sandbox leads nowhere outside the workspace.
    sh(service, sid, "ln -s /etc /workspace/etc-link")
    body = await fetch(jp_fetch, "api", "sandboxes", sid, "files", "etc-link", "passwd", expect=400)
    assert "outside the workspace" in body["message"]
    await fetch(
        jp_fetch,
        "api",
        "sandboxes",
        sid,
        "files",
        "etc-link",
        "x.txt",
        method="PUT",
        body=b"x",
        expect=400,
    )
    # 20 MB up and down, whole.
    blob = os.urandom(20 << 20)
    await fetch(
        jp_fetch, "api", "sandboxes", sid, "files", "big.bin", method="PUT", body=blob, expect=201
    )
    assert (await jp_fetch("api", "sandboxes", sid, "files", "big.bin")).body == blob
    await fetch(
        jp_fetch, "api", "sandboxes", sid, "files", "deep", "note.txt", method="DELETE", expect=204
    )
    await fetch(jp_fetch, "api", "sandboxes", sid, "files", "deep", "note.txt", expect=404)
    # Snapshots: one clear line.
    refused = await fetch(
        jp_fetch,
        "api",
        "sandboxes",
        sid,
        "snapshots",
        method="POST",
        body=json.dumps({"name": "s"}),
        expect=501,
    )
    assert "VolumeSnapshot" in refused["message"]
    # Stopped: files are still served, by the files pod, and it stays stopped.
    stopped = await fetch(jp_fetch, "api", "sandboxes", sid, "stop", method="POST", body="")
    assert stopped["state"] == "stopped"
    listing = await fetch(jp_fetch, "api", "sandboxes", sid, "files")
    assert "big.bin" in [e["name"] for e in listing["entries"]]
    await fetch(
        jp_fetch,
        "api",
        "sandboxes",
        sid,
        "files",
        "while-stopped.txt",
        method="PUT",
        body=b"s",
        expect=201,
    )
    assert (await fetch(jp_fetch, "api", "sandboxes", sid))["state"] == "stopped"
    started = await fetch(jp_fetch, "api", "sandboxes", sid, "start", method="POST", body="")
    assert started["state"] == "running"
    assert sh(service, sid, "cat /workspace/while-stopped.txt") == "s"
    stats = await fetch(jp_fetch, "api", "sandboxes-stats")
    assert stats["by_state"]["running"] >= 1
    await fetch(jp_fetch, "api", "sandboxes", sid, method="DELETE", expect=204)
    await fetch(jp_fetch, "api", "sandboxes", sid, expect=404)


async def test_webdav_over_the_cluster(
    jp_fetch: Any, jp_serverapp: Any, kube_rest: dict[str, str], test_user: str
) -> None:
    """webdav4 against the server (in a thread: the server runs on this test's loop)."""
    service = service_of(kube_rest)
    sid = service.ensure(ScopeKey(test_user)).info.id
    await fetch(jp_fetch, "api", "sandboxes")  # starts the listener
    token = jp_serverapp.identity_provider.token
    url = f"{server_url(jp_serverapp)}/sandbox-kernel/dav/{sid}/"
    dav = Client(url, auth=("anyone", token), timeout=120)
    await asyncio.to_thread(dav.mkdir, "dav-folder")
    await asyncio.to_thread(dav.upload_fileobj, io.BytesIO(b"through webdav"), "dav-folder/a.txt")
    assert sh(service, sid, "cat /workspace/dav-folder/a.txt") == "through webdav"
    sh(service, sid, "echo from-cell > /workspace/dav-folder/b.txt")
    listed = await asyncio.to_thread(dav.ls, "dav-folder")
    assert sorted(Path(e["name"]).name for e in listed) == ["a.txt", "b.txt"]
    service.backend.stop(sid)
    out = io.BytesIO()
    await asyncio.to_thread(dav.download_fileobj, "dav-folder/b.txt", out)
    assert out.getvalue() == b"from-cell\n"
    assert service.backend.get(sid).state == "stopped"  # WebDAV never wakes it
    anonymous = await asyncio.to_thread(
        httpx.request, "PROPFIND", url, headers={"Depth": "1"}, timeout=30
    )
    assert anonymous.status_code == 401


async def test_jupyterlab_terminal_in_a_pod(
    jp_fetch: Any, jp_ws_fetch: Any, kube_rest: dict[str, str], test_user: str
) -> None:
    name, term = await open_terminal(jp_fetch, jp_ws_fetch)
    term.ws.write_message(json.dumps(["set_size", 27, 91, 600, 800]))
    assert await term.run("hostname") == "sandbox"
    assert await term.run("pwd") == "/workspace"
    assert await term.run("id -u") == "1000"
    for _ in range(100):
        if await term.run("stty size") == "27 91":
            break
    assert await term.run("stty size") == "27 91"
    term.send("sh -c 'echo SLEEP\"\"ING; exec sleep 100'\r")
    await term.expect("SLEEPING\r\n")
    term.send("\x03")
    term.send("echo AFTER-$?\r")
    await term.expect("AFTER-130\r\n")
    term.send(f"python3 -c {CURSES_APP}\r")
    await term.expect("FULLSCREEN 27x91")
    term.send("q")
    await term.expect("CURSES-DONE")
    # Closing the terminal ends what runs on it (the runtime would keep it).
    term.send("sleep 987\r")
    await asyncio.sleep(1)
    service = service_of(kube_rest)
    sid = service.owned(test_user, ScopeKey(test_user).name).id
    assert _sleeping(service, sid) == 1
    await jp_fetch("api", "terminals", name, method="DELETE")
    for _ in range(50):
        if _sleeping(service, sid) == 0:
            break
        await asyncio.sleep(0.2)
    assert _sleeping(service, sid) == 0


SLEEPING = (
    "import os\nn = 0\nfor p in os.listdir('/proc'):\n    try:\n"
    "        n += open('/proc/%s/cmdline' % p, 'rb').read() == b'sleep\\x00987\\x00'\n"
    "    except OSError:\n        pass\nprint(n)"
)


def _sleeping(service: SandboxService, sid: str) -> int:
    """How many `sleep 987` run in the sandbox."""
    return int(service.backend.exec(sid, ["python3", "-c", SLEEPING]).output)


def test_cli_shell_in_a_pod(tmp_path: Path, kube_namespace: str, test_user: str) -> None:
    env = {
        **{k: v for k, v in os.environ.items() if not k.startswith("SANDBOX_KERNEL_")},
        **kube_settings(kube_namespace),
        "SANDBOX_KERNEL_STATE_DIR": str(tmp_path / "state"),
        "SANDBOX_KERNEL_USER": test_user,
        "SANDBOX_KERNEL_WORK_ROOT": "none",
        "TERM": "xterm-256color",
    }
    term = Term([], env, "/", rows=30)
    try:
        assert term.run("hostname") == "sandbox"
        term.resize(40, 120)
        for _ in range(50):
            if term.run("stty size") == "40 120":
                break
        assert term.run("stty size") == "40 120"
        term.send(b"sh -c 'echo SLEEP\"\"ING; exec sleep 100'\r")
        term.expect("SLEEPING\r\n")
        term.send(b"\x03")
        term.send(b"echo AFTER-$?\r")
        term.expect("AFTER-130\r\n")
        term.send(b"exit 3\r")
        assert term.wait() == 3
    finally:
        term.close()


@asynccontextmanager
async def mcp_stdio(env: dict[str, str]) -> AsyncIterator[ClientSession]:
    command = shutil.which("sandbox-kernel", path=os.path.dirname(sys.executable))
    assert command, "the sandbox-kernel command is not installed beside this Python"
    params = StdioServerParameters(command=command, args=["mcp"], env=env)
    async with stdio_client(params) as (read, write), ClientSession(read, write) as session:
        await session.initialize()
        yield session


async def test_mcp_tools_in_a_pod(tmp_path: Path, kube_namespace: str, test_user: str) -> None:
    env = {
        **{k: v for k, v in os.environ.items() if not k.startswith("SANDBOX_KERNEL_")},
        **kube_settings(kube_namespace),
        "SANDBOX_KERNEL_STATE_DIR": str(tmp_path / "state"),
        "SANDBOX_KERNEL_USER": test_user,
    }
    async with mcp_stdio(env) as session:
        first = await call(session, "execute_code", code="x = 41\nprint('hello')\nx + 1")
        assert not first.is_error, texts(first)
        assert "hello" in texts(first) and "42" in texts(first)
        assert texts(await call(session, "execute_code", code="x")).startswith("41")
        command = await call(session, "execute_command", command="echo out; echo err >&2; exit 4")
        assert command.structured_content is not None
        assert (command.structured_content["stdout"], command.structured_content["stderr"]) == (
            "out\n",
            "err\n",
        )
        assert command.structured_content["exit_code"] == 4
        wrote = await call(session, "write_file", path="agent/note.md", content="# hi\n")
        assert not wrote.is_error, texts(wrote)
        read = await call(session, "read_file", path="agent/note.md")
        assert "# hi" in texts(read)
        listed = await call(session, "list_files", path="agent")
        assert "note.md" in texts(listed)
