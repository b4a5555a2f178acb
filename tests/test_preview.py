"""Preview URLs on a real Jupyter server and real Docker: a real HTTP app
(``python3 -m http.server``) and a stdlib WebSocket app (tests/preview_app.py) in a
sandbox, reached through sandbox-kernel/proxy/..., and the doors an attacker tries."""

from __future__ import annotations

import asyncio
import base64
import json
import shutil
import time
import urllib.parse
from pathlib import Path
from typing import Any

import pytest
from tornado.httpclient import AsyncHTTPClient, HTTPClientError, HTTPRequest
from tornado.websocket import websocket_connect

from .conftest import sandbox_container
from .test_rest_api import fetch, jp_server_config, server_url  # noqa: F401  (the server's settings)

pytestmark = pytest.mark.docker

APP = Path(__file__).with_name("preview_app.py")
HTTP_PORT = 8000
APP_PORT = 8001


async def start_apps(jp_fetch: Any, sandbox: dict[str, str]) -> None:
    """http.server and the test app running in the sandbox, listening (bounded wait)."""
    shutil.copy(APP, Path(sandbox["workspace"]) / "preview_app.py")
    (Path(sandbox["workspace"]) / "index.html").write_text("<h1>hello from the sandbox</h1>")
    container = sandbox_container(sandbox["id"])
    container.exec_run(
        ["python3", "-m", "http.server", str(HTTP_PORT)], workdir="/workspace", detach=True
    )
    container.exec_run(["python3", "/workspace/preview_app.py", str(APP_PORT)], detach=True)
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        listed = await fetch(jp_fetch, "api", "sandboxes", sandbox["id"], "ports")
        if {HTTP_PORT, APP_PORT} <= {p["port"] for p in listed["ports"]}:
            return
        await asyncio.sleep(0.2)
    raise AssertionError(f"the apps did not listen: {listed}")


async def proxied(jp_fetch: Any, sid: str, port: int, path: str, **kw: Any) -> Any:
    return await jp_fetch("sandbox-kernel", "proxy", sid, str(port), path, **kw)


async def status_of(jp_fetch: Any, *parts: str, **kw: Any) -> tuple[int, dict[str, Any]]:
    try:
        response = await jp_fetch(*parts, **kw)
    except HTTPClientError as err:
        body = err.response.body if err.response is not None else b""
        return err.code, json.loads(body) if body.startswith(b"{") else {}
    return response.code, {}


async def test_http_and_websocket_apps(
    jp_fetch: Any, jp_ws_fetch: Any, jp_serverapp: Any, sandbox: dict[str, str]
) -> None:
    await start_apps(jp_fetch, sandbox)
    sid = sandbox["id"]
    listed = await fetch(jp_fetch, "api", "sandboxes", sid, "ports")
    by_port = {p["port"]: p for p in listed["ports"]}
    assert by_port[HTTP_PORT]["reachable"] is True
    assert by_port[APP_PORT]["url"].endswith(f"sandbox-kernel/proxy/{sid}/{APP_PORT}/")

    page = await proxied(jp_fetch, sid, HTTP_PORT, "index.html")
    assert page.code == 200 and b"hello from the sandbox" in page.body
    assert "sandbox" in page.headers["Content-Security-Policy"]

    # What the app receives: its own path, never Jupyter's credentials.
    seen = await proxied(
        jp_fetch,
        sid,
        APP_PORT,
        "headers",
        params={"token": jp_serverapp.identity_provider.token, "q": "1"},
        headers={
            "Authorization": f"token {jp_serverapp.identity_provider.token}",
            "Cookie": "_xsrf=x; username-127-0-0-1=secret; mine=kept",
            "X-XSRFToken": "x",
        },
    )
    got = json.loads(seen.body)
    assert got["path"] == "/headers?q=1"
    assert got["headers"]["cookie"] == "mine=kept"
    assert "authorization" not in got["headers"] and "x-xsrftoken" not in got["headers"]
    assert got["headers"]["x-forwarded-prefix"].endswith(f"/sandbox-kernel/proxy/{sid}/{APP_PORT}")
    cookies = seen.headers.get_list("Set-Cookie")  # (Jupyter's own login cookie aside)
    assert "app=1; Path=/" in cookies and not any("planted" in c for c in cookies)

    # A request body streamed to the app, a response streamed back.
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


async def test_refusals_and_a_stopped_sandbox(jp_fetch: Any, sandbox: dict[str, str]) -> None:
    sid = sandbox["id"]
    for port in ("0", "65536", "80a", "-1", "99999999"):
        code, body = await status_of(jp_fetch, "sandbox-kernel", "proxy", sid, port, "x")
        assert code == 400 and "port" in body["message"], (port, code, body)
    code, body = await status_of(jp_fetch, "sandbox-kernel", "proxy", "sk-nobody-here", "80", "x")
    assert code == 404
    code, body = await status_of(jp_fetch, "sandbox-kernel", "proxy", sid, "8999", "x")
    assert code == 502 and "8999" in body["message"]
    await fetch(jp_fetch, "api", "sandboxes", sid, "stop", method="POST", body="")
    code, body = await status_of(jp_fetch, "sandbox-kernel", "proxy", sid, "8000", "x")
    assert code == 409 and f"sandbox-kernel start {sid}" in body["message"]
    listed = await fetch(jp_fetch, "api", "sandboxes", sid, "ports")
    assert listed == {
        "sandbox_id": sid,
        "state": "stopped",
        "ports": [],
        "preview": True,
        "preview_note": "",
    }
    assert sandbox_container(sid).status == "exited"  # neither woke it


async def test_a_browser_gets_an_isolated_preview(
    jp_fetch: Any, jp_serverapp: Any, sandbox: dict[str, str]
) -> None:
    """A navigation is sent to a signed preview path that needs no cookie and is served
    with CSP sandbox; a forged or altered grant is refused; absolute/ needs isolation off."""
    await start_apps(jp_fetch, sandbox)
    sid = sandbox["id"]
    try:
        await proxied(
            jp_fetch,
            sid,
            APP_PORT,
            "headers",
            headers={
                "Sec-Fetch-Dest": "document",
                "Authorization": f"token {jp_serverapp.identity_provider.token}",
            },
            follow_redirects=False,
        )
        raise AssertionError("a navigation was not redirected")
    except HTTPClientError as err:
        assert err.code == 303
        where = err.response.headers["Location"]
    assert "/sandbox-kernel/preview/" in where and where.endswith("/headers")
    url = f"http://127.0.0.1:{jp_serverapp.port}{where}"
    client = AsyncHTTPClient()
    page = await client.fetch(url)  # no token, no cookie: the grant is the credential
    assert json.loads(page.body)["path"] == "/headers"
    assert "sandbox" in page.headers["Content-Security-Policy"]
    assert page.headers["Referrer-Policy"] == "no-referrer"
    grant = where.split("/sandbox-kernel/preview/")[1].split("/")[0]
    body, _, signature = grant.partition(".")
    claims = json.loads(base64.urlsafe_b64decode(body + "=" * (-len(body) % 4)))
    claims["p"] = HTTP_PORT  # another port with the same signature
    forged = base64.urlsafe_b64encode(json.dumps(claims).encode()).decode().rstrip("=")
    for bad in (f"{forged}.{signature}", f"{body}.{'0' * 32}", "e30.00"):
        bad_url = url.replace(grant, bad)
        with pytest.raises(HTTPClientError) as refused:
            await client.fetch(bad_url)
        assert refused.value.code == 403
    code, msg = await status_of(
        jp_fetch, "sandbox-kernel", "proxy", "absolute", sid, str(APP_PORT), "headers"
    )
    assert code == 403 and "preview_isolation" in msg["message"]


async def test_attacks_reach_only_the_sandboxs_own_port(
    jp_fetch: Any, jp_serverapp: Any, sandbox: dict[str, str]
) -> None:
    """Dots, an absolute URL in the path, a crafted Host, a redirect to the server: the
    request lands on the app's port of that sandbox, or nowhere."""
    await start_apps(jp_fetch, sandbox)
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
    # The app's redirect to the server's own API is handed back, never followed.
    target = f"http://127.0.0.1:{jp_serverapp.port}{jp_serverapp.base_url}api/sandboxes"
    request = HTTPRequest(
        base + "/redirect?" + urllib.parse.urlencode({"to": target}),
        headers={"Authorization": f"token {token}"},
        follow_redirects=False,
    )
    with pytest.raises(HTTPClientError) as moved:
        await client.fetch(request)
    assert moved.value.code == 302 and moved.value.response.headers["Location"] == target
    # The relative redirect stays under the prefix.
    request = HTTPRequest(
        base + "/redirect?to=/headers",
        headers={"Authorization": f"token {token}"},
        follow_redirects=False,
    )
    with pytest.raises(HTTPClientError) as moved:
        await client.fetch(request)
    assert moved.value.response.headers["Location"].endswith(
        f"/sandbox-kernel/proxy/{sid}/{APP_PORT}/headers"
    )
    # The sandbox itself: another container's address is not reachable from it.
    code, _ = await status_of(jp_fetch, "sandbox-kernel", "proxy", sid, str(APP_PORT + 1), "x")
    assert code == 502


async def test_websocket_needs_the_user(
    jp_fetch: Any, jp_serverapp: Any, sandbox: dict[str, str]
) -> None:
    await start_apps(jp_fetch, sandbox)
    url = (
        f"ws://127.0.0.1:{jp_serverapp.port}{jp_serverapp.base_url}"
        f"sandbox-kernel/proxy/{sandbox['id']}/{APP_PORT}/ws"
    )
    with pytest.raises(HTTPClientError) as refused:
        await websocket_connect(url)
    assert refused.value.code == 403


def test_ports_of_a_sandbox_stopped_while_they_are_read(
    make_config: Any, test_user: str, docker_cleanup: None, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The panel asks for a sandbox's ports just as its owner stops it (the read is cut
    short, or finds the container gone): the answer is a stopped sandbox without ports,
    not a server error; a read that fails while it runs is still an error."""
    from sandbox_kernel.errors import SandboxError
    from sandbox_kernel.identity import ScopeKey
    from sandbox_kernel.service import SandboxService

    service = SandboxService(make_config())
    info = service.ensure(ScopeKey(test_user)).info
    backend = service.backend
    real_exec = backend.exec

    def stopped_first(sandbox_id: str, cmd: list[str], **kw: Any) -> Any:
        backend.stop(sandbox_id)
        return real_exec(sandbox_id, cmd, **kw)

    monkeypatch.setattr(backend, "exec", stopped_first)
    answer = service.ports(None, info.id)
    assert (answer["state"], answer["ports"]) == ("stopped", [])

    service.ensure(ScopeKey(test_user))
    monkeypatch.setattr(backend, "exec", lambda *a, **kw: real_exec(info.id, ["false"]))
    with pytest.raises(SandboxError, match="could not read the listening ports"):
        service.ports(None, info.id)
