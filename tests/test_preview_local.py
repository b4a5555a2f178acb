"""Preview URLs of local sandboxes, on a real Jupyter server: a real HTTP app
(``python3 -m http.server``) and a stdlib WebSocket app (tests/preview_app.py) in a
local sandbox's own network namespace, reached through sandbox-kernel/proxy/..., and
the doors an attacker tries: above all, the host's own loopback and other sandboxes,
which a proxy on the host could reach if it connected from the host's network.

The server runs in this process (a root server's sandboxes when the tests run as
root); an ordinary user's sandboxes are reached by the same code in a driver process
of an ordinary account (``tests/local_host.py``).
"""

from __future__ import annotations

import json
import shutil
import socket
import threading
import time
import urllib.parse
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from tornado.httpclient import AsyncHTTPClient, HTTPClientError, HTTPRequest
from tornado.websocket import websocket_connect

from sandbox_kernel.backends import Channel, NotSupported
from sandbox_kernel.backends.local import bwrap_works
from sandbox_kernel.config import load_config
from sandbox_kernel.identity import ScopeKey
from sandbox_kernel.service import SandboxService

from .conftest import require_bwrap
from .local_host import LocalHost
from .test_preview import APP, APP_PORT, HTTP_PORT, proxied, status_of
from .test_rest_api import fetch, server_url

LOOPBACK_PORT = 8002  # an app of the sandbox's that listens on its loopback only


class CountingListener:
    """A service of the host on its loopback that counts the connections it gets."""

    def __init__(self) -> None:
        self.sock = socket.socket()
        self.sock.bind(("127.0.0.1", 0))
        self.sock.listen(16)
        self.sock.settimeout(0.2)
        self.port = self.sock.getsockname()[1]
        self.connections = 0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._serve, daemon=True)
        self._thread.start()

    def _serve(self) -> None:
        while not self._stop.is_set():
            try:
                conn, _ = self.sock.accept()
            except OSError:
                continue
            self.connections += 1
            conn.sendall(b"HTTP/1.0 200 OK\r\nContent-Length: 9\r\n\r\nthe host!")
            conn.close()

    def close(self) -> None:
        self._stop.set()
        self._thread.join(5)
        self.sock.close()


@pytest.fixture
def local_env(tmp_path: Path, test_user: str, monkeypatch: pytest.MonkeyPatch) -> dict[str, str]:
    env = {
        "SANDBOX_KERNEL_BACKEND": "local",
        "SANDBOX_KERNEL_WORKSPACE_ROOT": str(tmp_path / "ws"),
        "SANDBOX_KERNEL_STATE_DIR": str(tmp_path / "state"),
        "SANDBOX_KERNEL_USER": test_user,
        "SANDBOX_KERNEL_WORK_ROOT": "none",
    }
    for name, value in env.items():
        monkeypatch.setenv(name, value)
    return env


@pytest.fixture
def jp_server_config(local_env: dict[str, str]) -> dict[str, Any]:
    return {
        "ServerApp": {"jpserver_extensions": {"jupyter_ext": True}},
        "SandboxExtension": {"gc_interval": 0},
    }


def _service(env: dict[str, str]) -> SandboxService:
    return SandboxService(
        load_config(
            environ={},
            backend="local",
            workspace_root=env["SANDBOX_KERNEL_WORKSPACE_ROOT"],
            state_dir=env["SANDBOX_KERNEL_STATE_DIR"],
            work_root="none",
        )
    )


@pytest.fixture
def sandbox(local_env: dict[str, str], test_user: str) -> dict[str, str]:
    require_bwrap()
    info = _service(local_env).ensure(ScopeKey(test_user)).info
    return {"id": info.id, "workspace": info.workspace}


def _serve(service: SandboxService, sandbox_id: str, *cmd: str) -> Channel:
    """``cmd`` running in the sandbox for as long as the channel is open."""
    return service.backend.open_channel(sandbox_id, list(cmd), cwd="/workspace")


def _until_listening(service: SandboxService, sandbox_id: str, ports: set[int]) -> None:
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        found = {p["port"] for p in service.ports(None, sandbox_id)["ports"]}
        if ports <= found:
            return
        time.sleep(0.1)
    raise AssertionError(f"the apps did not listen on {ports}")


@pytest.fixture
def apps(local_env: dict[str, str], sandbox: dict[str, str]) -> Iterator[SandboxService]:
    """http.server, the test app, and an app on the sandbox's loopback only, running."""
    shutil.copy(APP, Path(sandbox["workspace"]) / "preview_app.py")
    (Path(sandbox["workspace"]) / "index.html").write_text("<h1>hello from the sandbox</h1>")
    service = _service(local_env)
    sid = sandbox["id"]
    channels = [
        _serve(service, sid, "python3", "-m", "http.server", str(HTTP_PORT)),
        _serve(service, sid, "python3", "/workspace/preview_app.py", str(APP_PORT)),
        _serve(
            service,
            sid,
            "python3",
            "-m",
            "http.server",
            "--bind",
            "127.0.0.1",
            str(LOOPBACK_PORT),
        ),
    ]
    try:
        _until_listening(service, sid, {HTTP_PORT, APP_PORT, LOOPBACK_PORT})
        yield service
    finally:
        for channel in channels:
            channel.close()


async def test_http_and_websocket_apps(
    jp_fetch: Any, jp_ws_fetch: Any, jp_serverapp: Any, sandbox: dict[str, str], apps: Any
) -> None:
    sid = sandbox["id"]
    listed = await fetch(jp_fetch, "api", "sandboxes", sid, "ports")
    assert listed["preview"] is True and listed["preview_note"] == ""
    by_port = {p["port"]: p for p in listed["ports"]}
    assert by_port[HTTP_PORT]["reachable"] is True
    assert by_port[LOOPBACK_PORT]["reachable"] is False
    assert by_port[APP_PORT]["url"].endswith(f"sandbox-kernel/proxy/{sid}/{APP_PORT}/")

    page = await proxied(jp_fetch, sid, HTTP_PORT, "index.html")
    assert page.code == 200 and b"hello from the sandbox" in page.body
    assert "sandbox" in page.headers["Content-Security-Policy"]

    seen = await proxied(
        jp_fetch,
        sid,
        APP_PORT,
        "headers",
        params={"token": jp_serverapp.identity_provider.token, "q": "1"},
        headers={
            "Authorization": f"token {jp_serverapp.identity_provider.token}",
            "Cookie": "_xsrf=x; username-127-0-0-1=secret; mine=kept",
        },
    )
    got = json.loads(seen.body)
    assert got["path"] == "/headers?q=1" and got["headers"]["cookie"] == "mine=kept"
    assert "authorization" not in got["headers"]

    body = b"0123456789" * 100_000
    echoed = await proxied(jp_fetch, sid, APP_PORT, "echo", method="POST", body=body)
    assert echoed.body == body
    streamed = await proxied(jp_fetch, sid, APP_PORT, "stream", params={"n": str(3 << 20)})
    assert len(streamed.body) == 3 << 20

    ws = await jp_ws_fetch("sandbox-kernel", "proxy", sid, str(APP_PORT), "ws")
    await ws.write_message("hi")
    assert await ws.read_message() == "echo:hi"
    await ws.write_message(b"\x01\x02\x03", binary=True)
    assert await ws.read_message() == b"\x03\x02\x01"
    ws.close()

    # A browser's navigation: the signed preview path, no cookie needed.
    with pytest.raises(HTTPClientError) as moved:
        await proxied(
            jp_fetch,
            sid,
            APP_PORT,
            "headers",
            headers={"Sec-Fetch-Dest": "document"},
            follow_redirects=False,
        )
    assert moved.value.code == 303
    where = moved.value.response.headers["Location"]
    granted = await AsyncHTTPClient().fetch(f"http://127.0.0.1:{jp_serverapp.port}{where}")
    assert json.loads(granted.body)["path"] == "/headers"


async def test_refusals_and_a_stopped_sandbox(
    jp_fetch: Any, sandbox: dict[str, str], apps: Any
) -> None:
    sid = sandbox["id"]
    for port in ("0", "65536", "80a", "-1"):
        code, body = await status_of(jp_fetch, "sandbox-kernel", "proxy", sid, port, "x")
        assert code == 400 and "port" in body["message"], (port, code, body)
    code, body = await status_of(jp_fetch, "sandbox-kernel", "proxy", "sk-nobody-here", "80", "x")
    assert code == 404
    code, body = await status_of(jp_fetch, "sandbox-kernel", "proxy", sid, "8999", "x")
    assert code == 502 and "nothing listens on port 8999 in the sandbox" in body["message"]
    # An app on the sandbox's loopback only: not reached, as on Docker, and told why.
    code, body = await status_of(jp_fetch, "sandbox-kernel", "proxy", sid, str(LOOPBACK_PORT), "x")
    assert code == 502 and "listens on 127.0.0.1 only" in body["message"], body
    await fetch(jp_fetch, "api", "sandboxes", sid, "stop", method="POST", body="")
    code, body = await status_of(jp_fetch, "sandbox-kernel", "proxy", sid, str(HTTP_PORT), "x")
    assert code == 409 and f"sandbox-kernel start {sid}" in body["message"]
    listed = await fetch(jp_fetch, "api", "sandboxes", sid, "ports")
    assert listed == {
        "sandbox_id": sid,
        "state": "stopped",
        "ports": [],
        "preview": True,
        "preview_note": "",
    }
    assert (await fetch(jp_fetch, "api", "sandboxes", sid))["state"] == "stopped"  # not woken


async def test_attacks_reach_only_the_sandboxs_own_port(
    jp_fetch: Any,
    jp_serverapp: Any,
    sandbox: dict[str, str],
    apps: Any,
    local_env: dict[str, str],
    test_user: str,
) -> None:
    """Path tricks, a crafted Host and a redirect land on the app or nowhere; a port of
    the host's own loopback, and a port where another sandbox (another user's) listens,
    are never reached through this sandbox's preview; another user's sandbox is 403."""
    sid = sandbox["id"]
    base = f"{server_url(jp_serverapp)}/sandbox-kernel/proxy/{sid}/{APP_PORT}"
    token = jp_serverapp.identity_provider.token
    client = AsyncHTTPClient()
    for tail in (
        "/../../../api/contents/headers",
        "/%2e%2e/%2e%2e/api/headers",
        f"/http://127.0.0.1:{jp_serverapp.port}/api/headers",
        "/@127.0.0.1:22/headers",
    ):
        request = HTTPRequest(
            base + tail,
            headers={"Authorization": f"token {token}", "Host": f"127.0.0.1:{jp_serverapp.port}"},
        )
        try:
            answer = await client.fetch(request)
        except HTTPClientError as err:
            assert err.code in (400, 404), (tail, err.code)
            continue
        got = json.loads(answer.body)
        assert got["path"].endswith("/headers") and "headers" in got, tail
    target = f"http://127.0.0.1:{jp_serverapp.port}{jp_serverapp.base_url}api/sandboxes"
    request = HTTPRequest(
        base + "/redirect?" + urllib.parse.urlencode({"to": target}),
        headers={"Authorization": f"token {token}"},
        follow_redirects=False,
    )
    with pytest.raises(HTTPClientError) as moved:
        await client.fetch(request)
    assert moved.value.code == 302 and moved.value.response.headers["Location"] == target

    # The host's own loopback: a service there, and the Jupyter server itself.
    host = CountingListener()
    try:
        for port in (host.port, jp_serverapp.port):
            code, body = await status_of(jp_fetch, "sandbox-kernel", "proxy", sid, str(port), "x")
            assert code == 502 and f"nothing listens on port {port}" in body["message"], body
        assert host.connections == 0
    finally:
        host.close()

    # Another user's sandbox, with an app on a port this sandbox has nothing on.
    other_user = test_user + "-other"
    other_service = _service(local_env)
    other = other_service.ensure(ScopeKey(other_user)).info
    channel = _serve(other_service, other.id, "python3", "-m", "http.server", "8003")
    try:
        _until_listening(other_service, other.id, {8003})
        code, body = await status_of(jp_fetch, "sandbox-kernel", "proxy", sid, "8003", "x")
        assert code == 502 and "nothing listens on port 8003" in body["message"]
        code, body = await status_of(jp_fetch, "sandbox-kernel", "proxy", other.id, "8003", "x")
        assert code == 403 and "another user" in body["message"]
    finally:
        channel.close()


async def test_websocket_needs_the_user(
    jp_fetch: Any, jp_serverapp: Any, sandbox: dict[str, str], apps: Any
) -> None:
    url = (
        f"ws://127.0.0.1:{jp_serverapp.port}{jp_serverapp.base_url}"
        f"sandbox-kernel/proxy/{sandbox['id']}/{APP_PORT}/ws"
    )
    with pytest.raises(HTTPClientError) as refused:
        await websocket_connect(url)
    assert refused.value.code == 403


# Run in a sandbox: listen on an address it does not own (IP_FREEBIND needs no
# privilege), as an app could to steer a connection made for a preview elsewhere.
_FREEBIND = r"""
import socket, sys
s = socket.socket()
s.setsockopt(socket.SOL_IP, 15, 1)  # IP_FREEBIND
s.bind(("192.0.2.1", 8002))
s.listen(4)
sys.stdin.read()
"""

_DRIVE = r"""
import socket
svc = service()
info = svc.ensure(ScopeKey("previewer")).info
apps = [
    svc.backend.open_channel(info.id, ["python3", "-m", "http.server", "8000"], cwd="/tmp"),
    svc.backend.open_channel(info.id, ["python3", "-m", "http.server", "--bind", "127.0.0.1", "8001"], cwd="/tmp"),
    svc.backend.open_channel(info.id, ["python3", "-c", ARGS["freebind"]], cwd="/tmp"),
]
deadline = time.monotonic() + 60
while time.monotonic() < deadline:
    if {8000, 8001, 8002} <= {p["port"] for p in svc.ports(None, info.id)["ports"]}:
        break
    time.sleep(0.1)

def get(port):
    target = svc.port_target(None, info.id, port)
    try:
        sock, at = target.opener()
        sock.settimeout(20)
        sock.connect(at)
        sock.sendall(b"GET / HTTP/1.0\r\n\r\n")
        return "answered: " + sock.recv(64).decode(errors="replace").split("\r\n")[0]
    except OSError as exc:
        return "refused: " + str(exc)

RESULT["app"] = get(8000)
RESULT["loopback_only"] = get(8001)
RESULT["freebind"] = get(8002)
RESULT["host"] = get(ARGS["host_port"])
RESULT["preview"] = svc.ports(None, info.id)["preview"]
for channel in apps:
    channel.close()
svc.backend.end_all()  # no process of it runs: nothing to reach
RESULT["ended"] = get(8000)
"""


def test_previews_of_a_root_servers_and_a_users_sandboxes(local_host: LocalHost) -> None:
    """The same connections from a driver of each kind of server: the app answers; an
    app on the sandbox's loopback only, one on an address the sandbox bound without
    owning it, and a service on the host's loopback do not, nor anything once no
    process of the sandbox runs."""
    host = CountingListener()
    try:
        result = local_host.run(_DRIVE, host_port=host.port, freebind=_FREEBIND)
    finally:
        host.close()
    assert result["preview"] is True
    assert result["app"] == "answered: HTTP/1.0 200 OK", result
    assert result["loopback_only"].startswith(
        "refused: port 8001 of the sandbox listens on 127.0.0.1"
    )
    assert result["host"].startswith(f"refused: nothing listens on port {host.port}")
    # An address the sandbox does not own (bound with IP_FREEBIND) names no target.
    assert result["freebind"].startswith("refused: port 8002 of the sandbox listens on 192.0.2.1")
    assert result["ended"].startswith("refused: no process of sandbox")
    assert host.connections == 0


@pytest.fixture
def plain(monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    """Plain processes (no bubblewrap), from before the server starts."""
    monkeypatch.setenv("SANDBOX_KERNEL_LOCAL_NO_BWRAP", "1")
    bwrap_works.cache_clear()
    yield
    bwrap_works.cache_clear()


async def test_without_bubblewrap_there_are_no_previews(
    plain: None, jp_fetch: Any, local_env: dict[str, str], test_user: str
) -> None:
    """Plain processes share the host's network: their ports are the host's own, which
    a preview must never reach; the listing says so and the proxy answers 501."""
    service = _service(local_env)
    sid = service.ensure(ScopeKey(test_user)).info.id
    listed = await fetch(jp_fetch, "api", "sandboxes", sid, "ports")
    assert listed["state"] == "running" and listed["preview"] is False
    assert "its ports are the host's" in listed["preview_note"]
    code, body = await status_of(jp_fetch, "sandbox-kernel", "proxy", sid, "8000", "x")
    assert code == 501 and "its ports are the host's" in body["message"]
    with pytest.raises(NotSupported, match="its ports are the host's"):
        service.port_target(None, sid, 8000)
