"""Two users on one server (owner_from=request): neither sees nor touches the other's."""

from __future__ import annotations

import json
import sys
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
from jupyter_server.auth.identity import IdentityProvider, User
from tornado.httpclient import HTTPClientError

from sandbox_kernel.config import SandboxConfig
from sandbox_kernel.identity import ScopeKey
from sandbox_kernel.kernelspec import kernelspec
from sandbox_kernel.service import SandboxService

from .conftest import TEST_IMAGE, remove_user_containers
from .helpers import run_over_websocket

pytestmark = pytest.mark.docker


class HeaderIdentity(IdentityProvider):
    """Test identity: the user named in X-Test-User; no header means not logged in."""

    def get_user(self, handler: Any) -> User | None:
        name = handler.request.headers.get("X-Test-User")
        return User(username=name) if name else None


@pytest.fixture
def users(test_user: str) -> Iterator[tuple[str, str]]:
    pair = (f"{test_user}-alice", f"{test_user}-bob")
    yield pair
    remove_user_containers(test_user)


@pytest.fixture
def jp_server_config(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> dict[str, Any]:
    monkeypatch.setenv("SANDBOX_KERNEL_BACKEND", "docker")
    monkeypatch.setenv("SANDBOX_KERNEL_IMAGE", TEST_IMAGE)
    monkeypatch.setenv("SANDBOX_KERNEL_WORKSPACE_ROOT", str(tmp_path / "ws"))
    monkeypatch.setenv("SANDBOX_KERNEL_STATE_DIR", str(tmp_path / "st"))
    return {
        "ServerApp": {
            "jpserver_extensions": {"jupyter_ext": True},
            "identity_provider_class": HeaderIdentity,
            "disable_check_xsrf": True,
        },
        "SandboxExtension": {"owner_from": "request", "gc_interval": 0},
    }


async def call(jp_fetch: Any, user: str, *parts: str, **kw: Any) -> tuple[int, Any]:
    try:
        response = await jp_fetch(*parts, headers={"X-Test-User": user, "Authorization": ""}, **kw)
    except HTTPClientError as err:
        return err.code, json.loads(err.response.body)
    return response.code, json.loads(response.body) if response.body else None


async def test_users_are_separate(
    jp_fetch: Any, users: tuple[str, str], make_config: Callable[..., SandboxConfig], tmp_path: Path
) -> None:
    alice, bob = users
    cfg = make_config(workspace_root=str(tmp_path / "ws"), state_dir=str(tmp_path / "st"))
    service = SandboxService(cfg)
    backend = service.backend
    a = service.ensure(ScopeKey(alice)).info
    b = service.ensure(ScopeKey(bob)).info
    code, listed = await call(jp_fetch, alice, "api", "sandboxes")
    assert code == 200 and [s["id"] for s in listed] == [a.id]
    code, listed = await call(jp_fetch, bob, "api", "sandboxes")
    assert code == 200 and [s["id"] for s in listed] == [b.id]
    for method, parts in (
        ("GET", ("api", "sandboxes", b.id)),
        ("DELETE", ("api", "sandboxes", b.id)),
        ("GET", ("api", "sandboxes", b.id, "files")),
        ("PUT", ("api", "sandboxes", b.id, "files", "planted.txt")),
    ):
        kw: dict[str, Any] = {"method": method}
        if method == "PUT":
            kw["body"] = b"x"
        code, body = await call(jp_fetch, alice, *parts, **kw)
        assert code == 403, (method, parts, code, body)
    assert not (Path(b.workspace) / "planted.txt").exists()
    assert backend.get(b.id).state == "running"
    code, body = await call(jp_fetch, "", "api", "sandboxes")
    assert code == 403


async def test_webdav_keeps_users_apart(
    jp_fetch: Any,
    jp_base_url: str,
    users: tuple[str, str],
    make_config: Callable[..., SandboxConfig],
    tmp_path: Path,
) -> None:
    """WebDAV follows the REST owner rules: another user's sandbox is 403 for every method,
    nothing lands in it, and a request without a user gets the 401 Basic challenge."""
    alice, bob = users
    cfg = make_config(workspace_root=str(tmp_path / "ws"), state_dir=str(tmp_path / "st"))
    service = SandboxService(cfg)
    a = service.ensure(ScopeKey(alice)).info
    b = service.ensure(ScopeKey(bob)).info
    (Path(b.workspace) / "bobs.txt").write_text("bob's")
    (Path(a.workspace) / "alices.txt").write_text("alice's")

    async def dav(user: str, method: str, path: str, **kw: Any) -> tuple[int, bytes]:
        headers = {"Authorization": "", **({"X-Test-User": user} if user else {})}
        headers.update(kw.pop("headers", {}))
        try:
            response = await jp_fetch(
                "sandbox-kernel",
                "dav",
                *path.split("/"),
                method=method,
                headers=headers,
                allow_nonstandard_methods=True,
                **kw,
            )
        except HTTPClientError as err:
            assert err.response is not None
            return err.code, err.response.body or b""
        return response.code, response.body or b""

    code, _ = await dav(alice, "PROPFIND", f"{a.id}/", body=b"", headers={"Depth": "1"})
    assert code == 207
    for method, path, kw in (
        ("PROPFIND", f"{b.id}/", {"body": b"", "headers": {"Depth": "1"}}),
        ("GET", f"{b.id}/bobs.txt", {}),
        ("PUT", f"{b.id}/planted.txt", {"body": b"x"}),
        ("DELETE", f"{b.id}/bobs.txt", {}),
        ("MKCOL", f"{b.id}/made", {"body": b""}),
        ("LOCK", f"{b.id}/bobs.txt", {"body": b""}),
    ):
        code, body = await dav(alice, method, path, **kw)
        assert code == 403 and b"another user" in body and b"bob's" not in body, (
            method,
            code,
            body,
        )
    code, _ = await dav(
        alice,
        "COPY",
        f"{a.id}/x",
        body=b"",
        headers={"Destination": f"/sandbox-kernel/dav/{b.id}/stolen"},
    )
    assert code in (403, 404)
    assert sorted(p.name for p in Path(b.workspace).iterdir()) == ["bobs.txt"]
    code, _ = await dav("", "PROPFIND", f"{b.id}/", body=b"")
    assert code == 401


async def test_kernels_use_the_request_users_sandbox(
    jp_fetch: Any,
    jp_ws_fetch: Any,
    jp_data_dir: Path,
    users: tuple[str, str],
    make_config: Callable[..., SandboxConfig],
    tmp_path: Path,
) -> None:
    """A kernel started through the server runs in the requesting user's sandbox, whatever
    its kernelspec's env says, and keeps that owner when another user restarts it."""
    alice, bob = users
    spec_dir = jp_data_dir / "kernels" / "sandbox"
    spec_dir.mkdir(parents=True)
    # A kernelspec naming bob every way a kernel could learn a user from its environment.
    env = {
        "SANDBOX_KERNEL_USER": bob,
        "KERNEL_USERNAME": bob,
        "JUPYTERHUB_USER": bob,
        "SANDBOX_KERNEL_WORK_ROOT": "none",
    }
    (spec_dir / "kernel.json").write_text(json.dumps(kernelspec("sandbox", env, sys.executable)))
    service = SandboxService(
        make_config(workspace_root=str(tmp_path / "ws"), state_dir=str(tmp_path / "st"))
    )
    code, session = await call(
        jp_fetch,
        alice,
        "api",
        "sessions",
        method="POST",
        body=json.dumps({"path": "a.ipynb", "type": "notebook", "kernel": {"name": "sandbox"}}),
    )
    assert code == 201, session
    kid = session["kernel"]["id"]
    headers = {"X-Test-User": alice, "Authorization": ""}
    ws = await jp_ws_fetch("api", "kernels", kid, "channels", headers=headers)
    try:
        out, reply = await run_over_websocket(
            ws, "print(open('/workspace/mark.txt', 'a').write('written by the first kernel'))"
        )
    finally:
        ws.close()
    assert reply["status"] == "ok", (out, reply)
    mine = service.backend.list(alice)
    assert [s.id for s in mine] == [ScopeKey(alice).name] and service.backend.list(bob) == []
    assert (Path(mine[0].workspace) / "mark.txt").read_text() == "written by the first kernel"
    code, listed = await call(jp_fetch, alice, "api", "sandboxes")
    assert [s["id"] for s in listed] == [mine[0].id]

    # bob restarts alice's kernel (Jupyter lets any user with the kernels permission):
    # the notebook stays in alice's sandbox.
    code, _ = await call(jp_fetch, bob, "api", "kernels", kid, "restart", method="POST", body="")
    assert code == 200
    ws = await jp_ws_fetch("api", "kernels", kid, "channels", headers=headers)
    try:
        out, reply = await run_over_websocket(ws, "print(open('/workspace/mark.txt').read())")
    finally:
        ws.close()
    assert reply["status"] == "ok" and out.strip() == "written by the first kernel", out
    assert service.backend.list(bob) == []
    await call(jp_fetch, alice, "api", "sessions", session["id"], method="DELETE")


async def test_previews_keep_users_apart(
    jp_fetch: Any, users: tuple[str, str], make_config: Callable[..., SandboxConfig], tmp_path: Path
) -> None:
    """Alice cannot open, list or be granted a preview of Bob's sandbox; Bob can."""
    alice, bob = users
    cfg = make_config(workspace_root=str(tmp_path / "ws"), state_dir=str(tmp_path / "st"))
    service = SandboxService(cfg)
    b = service.ensure(ScopeKey(bob)).info
    for parts, headers in (
        (("sandbox-kernel", "proxy", b.id, "8000", "x"), {}),
        (("sandbox-kernel", "proxy", b.id, "8000", "x"), {"Sec-Fetch-Dest": "document"}),
        (("api", "sandboxes", b.id, "ports"), {}),
    ):
        try:
            await jp_fetch(
                *parts,
                headers={"X-Test-User": alice, "Authorization": "", **headers},
                follow_redirects=False,
            )
            raise AssertionError(f"{parts} answered alice")
        except HTTPClientError as err:
            assert err.code == 403, (parts, err.code)
    code, listed = await call(jp_fetch, bob, "api", "sandboxes", b.id, "ports")
    assert code == 200 and listed["state"] == "running"
