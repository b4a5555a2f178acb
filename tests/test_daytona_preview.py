"""Preview URLs of Daytona sandboxes through a real Jupyter server: the Daytona backend
asks Daytona (the real SDK, the fake server of tests/fake_daytona.py) for a port's
preview link and our proxy relays to it with the sandbox's token, which Daytona's proxy
(tests/fake_daytona_preview.py) requires. A real HTTP app (``python3 -m http.server``)
and the stdlib WebSocket app of tests/preview_app.py run in the sandbox."""

from __future__ import annotations

import asyncio
import json
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from tornado.httpclient import AsyncHTTPClient, HTTPClientError

from sandbox_kernel.config import SandboxConfig
from sandbox_kernel.service import SandboxService

from . import test_daytona as daytona_tests
from .fake_daytona import FakeDaytona
from .fake_daytona_preview import WARNING_PAGE
from .fake_daytona_toolbox import SANDBOX_UID
from .test_daytona import SNAPSHOT, box_named, user_key
from .test_rest_api import fetch

pytestmark = pytest.mark.docker

# test_daytona's fixtures (the fake server, its environment, the REST server's settings).
fake = daytona_tests.fake
daytona_rest = daytona_tests.daytona_rest
jp_server_config = daytona_tests.jp_server_config
_daytona_env = daytona_tests._daytona_env

APP = Path(__file__).with_name("preview_app.py")
HTTP_PORT = 8000
APP_PORT = 8001


def service_of(make_config: Callable[..., SandboxConfig], rest: dict[str, str]) -> SandboxService:
    """The orchestrator the test server uses (same backend, same state folder)."""
    return SandboxService(
        make_config(backend="daytona", image=SNAPSHOT, state_dir=rest["SANDBOX_KERNEL_STATE_DIR"])
    )


async def start_apps(jp_fetch: Any, fake: FakeDaytona, service: SandboxService, sid: str) -> None:
    """http.server and the test app running in the sandbox, listening (bounded wait)."""
    backend = service.backend
    backend.put_file(sid, "preview_app.py", APP.read_bytes())
    backend.put_file(sid, "index.html", b"<h1>hello from daytona</h1>")
    container = fake.docker.containers.get(box_named(fake, sid).container_id)
    for argv in (
        ["python3", "-m", "http.server", str(HTTP_PORT)],
        ["python3", "/workspace/preview_app.py", str(APP_PORT)],
    ):
        container.exec_run(argv, workdir="/workspace", user=SANDBOX_UID, detach=True)
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        listed = await fetch(jp_fetch, "api", "sandboxes", sid, "ports")
        if {HTTP_PORT, APP_PORT} <= {p["port"] for p in listed["ports"]}:
            return
        await asyncio.sleep(0.3)
    raise AssertionError(f"the apps did not listen: {listed}")


def link_requests(fake: FakeDaytona, box_id: str, port: int) -> int:
    """How often Daytona's API was asked for that port's preview link."""
    return fake.requests.count(("GET", f"/api/sandbox/{box_id}/ports/{port}/preview-url"))


async def test_http_and_websocket_through_daytona_preview_links(
    jp_fetch: Any,
    jp_ws_fetch: Any,
    jp_serverapp: Any,
    fake: FakeDaytona,
    daytona_rest: dict[str, str],
    make_config: Callable[..., SandboxConfig],
    test_user: str,
) -> None:
    service = service_of(make_config, daytona_rest)
    sid = service.ensure(user_key(test_user)).info.id
    box = box_named(fake, sid)
    await start_apps(jp_fetch, fake, service, sid)
    seen_before = len(fake.preview.requests)

    page = await jp_fetch("sandbox-kernel", "proxy", sid, str(HTTP_PORT), "index.html")
    assert page.code == 200 and page.body == b"<h1>hello from daytona</h1>"
    assert "sandbox" in page.headers["Content-Security-Policy"]

    token = jp_serverapp.identity_provider.token
    seen = await jp_fetch(
        "sandbox-kernel",
        "proxy",
        sid,
        str(APP_PORT),
        "headers",
        params={"token": token, "q": "1"},
        headers={"Authorization": f"token {token}", "Cookie": "_xsrf=x; mine=kept"},
    )
    got = json.loads(seen.body)
    assert got["path"] == "/headers?q=1"
    assert got["headers"]["cookie"] == "mine=kept" and "authorization" not in got["headers"]
    # Daytona's token went to Daytona only: never back to the client.
    assert not any(box.auth_token in value for _, value in seen.headers.get_all())

    body = b"0123456789" * 100_000
    echoed = await jp_fetch(
        "sandbox-kernel", "proxy", sid, str(APP_PORT), "echo", method="POST", body=body
    )
    assert echoed.body == body
    ws = await jp_ws_fetch("sandbox-kernel", "proxy", sid, str(APP_PORT), "ws")
    await ws.write_message("hi")
    assert await ws.read_message() == "echo:hi"
    await ws.write_message(b"\x01\x02\x03", binary=True)
    assert await ws.read_message() == b"\x03\x02\x01"
    ws.close()

    # Every request went to that sandbox's own link, named by its Daytona id, and each
    # port's link was asked for once however many requests used it.
    assert {(s, p) for s, p, _, _ in fake.preview.requests[seen_before:]} == {
        (box.id, HTTP_PORT),
        (box.id, APP_PORT),
    }
    assert link_requests(fake, box.id, APP_PORT) == 1
    assert link_requests(fake, box.id, HTTP_PORT) == 1

    # A browser's navigation: sent to the signed preview path, where the app's page (not
    # Daytona's warning page for browsers) is served, with no cookie or token.
    with pytest.raises(HTTPClientError) as moved:
        await jp_fetch(
            "sandbox-kernel",
            "proxy",
            sid,
            str(HTTP_PORT),
            "index.html",
            headers={"Sec-Fetch-Dest": "document", "Accept": "text/html,*/*;q=0.8"},
            follow_redirects=False,
        )
    assert moved.value.code == 303
    where = moved.value.response.headers["Location"]
    shown = await AsyncHTTPClient().fetch(
        f"http://127.0.0.1:{jp_serverapp.port}{where}",
        headers={"Accept": "text/html,*/*;q=0.8", "Sec-Fetch-Dest": "document"},
    )
    assert shown.body == b"<h1>hello from daytona</h1>" and shown.body != WARNING_PAGE

    # Nothing listens on another port: the proxy says so, Daytona's proxy is reached.
    with pytest.raises(HTTPClientError) as missing:
        await jp_fetch("sandbox-kernel", "proxy", sid, str(APP_PORT + 1), "x")
    assert missing.value.code == 502


async def test_stopped_restarted_and_another_users_sandbox(
    jp_fetch: Any,
    fake: FakeDaytona,
    daytona_rest: dict[str, str],
    make_config: Callable[..., SandboxConfig],
    test_user: str,
) -> None:
    """A stopped sandbox is 409 and stays stopped; after a start its link is asked for
    again; another user's sandbox is 403 and Daytona is never asked for its link."""
    service = service_of(make_config, daytona_rest)
    sid = service.ensure(user_key(test_user)).info.id
    box = box_named(fake, sid)
    await start_apps(jp_fetch, fake, service, sid)
    await jp_fetch("sandbox-kernel", "proxy", sid, str(HTTP_PORT), "index.html")
    assert link_requests(fake, box.id, HTTP_PORT) == 1

    await fetch(jp_fetch, "api", "sandboxes", sid, "stop", method="POST", body="")
    starts = fake.requests.count(("POST", f"/api/sandbox/{box.id}/start"))
    with pytest.raises(HTTPClientError) as stopped:
        await jp_fetch("sandbox-kernel", "proxy", sid, str(HTTP_PORT), "index.html")
    assert stopped.value.code == 409
    assert f"sandbox-kernel start {sid}" in json.loads(stopped.value.response.body)["message"]
    assert fake.requests.count(("POST", f"/api/sandbox/{box.id}/start")) == starts
    assert fake.docker.containers.get(box.container_id).status == "exited"

    await fetch(jp_fetch, "api", "sandboxes", sid, "start", method="POST", body="")
    await start_apps(jp_fetch, fake, service, sid)
    page = await jp_fetch("sandbox-kernel", "proxy", sid, str(HTTP_PORT), "index.html")
    assert page.body == b"<h1>hello from daytona</h1>"
    assert link_requests(fake, box.id, HTTP_PORT) == 2  # another start, another link

    other = service.ensure(user_key(test_user + "-other")).info
    other_box = box_named(fake, other.id)
    try:
        for headers in ({}, {"Sec-Fetch-Dest": "document"}):
            with pytest.raises(HTTPClientError) as refused:
                await jp_fetch(
                    "sandbox-kernel",
                    "proxy",
                    other.id,
                    str(HTTP_PORT),
                    "x",
                    headers=headers,
                    follow_redirects=False,
                )
            assert refused.value.code == 403
        await fetch(jp_fetch, "api", "sandboxes", other.id, "ports", expect=403)
        assert link_requests(fake, other_box.id, HTTP_PORT) == 0
    finally:
        service.backend.destroy(other.id)
