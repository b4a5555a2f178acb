"""The REST API of the server extension, on a real Jupyter server and real Docker."""

from __future__ import annotations

import asyncio
import json
import os
import re
import subprocess
import tracemalloc
from collections.abc import Callable
from pathlib import Path
from typing import Any

import docker
import pytest
import yaml
from tornado.httpclient import HTTPClientError

from sandbox_kernel.config import SandboxConfig
from sandbox_kernel.identity import ScopeKey
from sandbox_kernel.service import SandboxService

from .conftest import remove_user_containers, remove_user_snapshots, sandbox_container

pytestmark = pytest.mark.docker


@pytest.fixture
def jp_server_config(rest_env: dict[str, str]) -> dict[str, Any]:
    return {
        "ServerApp": {"jpserver_extensions": {"jupyter_ext": True}},
        "SandboxExtension": {"gc_interval": 0, "max_upload_size": 200 << 20},
    }


def server_url(app: Any) -> str:
    """Where curl reaches the test server (pytest-jupyter uses an unusual base_url on purpose).

    Tests that use it also ask for jp_fetch: that fixture is what starts the listener.
    """
    return f"http://127.0.0.1:{app.port}{app.base_url.rstrip('/')}"


async def fetch(jp_fetch: Any, *parts: str, expect: int = 200, **kw: Any) -> Any:
    """Call the API; return parsed JSON (or raw bytes) and check the status."""
    try:
        response = await jp_fetch(*parts, **kw)
    except HTTPClientError as err:
        assert err.code == expect, (err.code, err.response.body if err.response else None)
        body = json.loads(err.response.body) if err.response and err.response.body else {}
        assert "message" in body and "Traceback" not in body["message"]
        return body
    assert response.code == expect, response.code
    if response.headers.get("Content-Type", "").startswith("application/json"):
        return json.loads(response.body)
    return response.body


async def test_list_get_stop_start_destroy(
    jp_fetch: Any, sandbox: dict[str, str], test_user: str
) -> None:
    listed = await fetch(jp_fetch, "api", "sandboxes")
    assert [s["id"] for s in listed] == [sandbox["id"]]
    item = listed[0]
    assert (item["user"], item["state"], item["backend"], item["scope"]) == (
        test_user,
        "running",
        "docker",
        "user",
    )
    assert item["limits"]["memory"] == 1 << 30 and "kernels" in item and "last_activity" in item
    assert item["kernel_ids"] == [] and item["kernels"] == 0
    assert item["usage"].get("memory", 0) > 0
    again = await fetch(jp_fetch, "api", "sandboxes")
    assert again[0]["usage"]["cpu"] >= 0  # a rate needs two samples: the second listing has it
    one = await fetch(jp_fetch, "api", "sandboxes", sandbox["id"])
    assert one["id"] == sandbox["id"]
    stopped = await fetch(
        jp_fetch, "api", "sandboxes", sandbox["id"], "stop", method="POST", body=""
    )
    assert stopped["state"] == "stopped"
    started = await fetch(
        jp_fetch, "api", "sandboxes", sandbox["id"], "start", method="POST", body=""
    )
    assert started["state"] == "running"
    await fetch(jp_fetch, "api", "sandboxes", sandbox["id"], method="DELETE", expect=204)
    await fetch(jp_fetch, "api", "sandboxes", sandbox["id"], expect=404)
    await fetch(jp_fetch, "api", "sandboxes", sandbox["id"], method="DELETE", expect=404)
    assert Path(sandbox["workspace"]).is_dir()


async def test_listing_names_live_kernels(
    jp_fetch: Any,
    sandbox: dict[str, str],
    make_config: Callable[..., SandboxConfig],
    rest_env: dict[str, str],
) -> None:
    from sandbox_kernel.store import Store

    cfg = make_config(
        workspace_root=rest_env["SANDBOX_KERNEL_WORKSPACE_ROOT"],
        state_dir=rest_env["SANDBOX_KERNEL_STATE_DIR"],
    )
    Store(cfg).kernel_heartbeat("kernel-b", "docker", sandbox["id"], busy=False)
    Store(cfg).kernel_heartbeat("kernel-a", "docker", sandbox["id"], busy=True)
    item = (await fetch(jp_fetch, "api", "sandboxes"))[0]
    assert (item["kernels"], item["kernel_ids"]) == (2, ["kernel-a", "kernel-b"])
    Store(cfg).kernel_gone("kernel-a")
    item = await fetch(jp_fetch, "api", "sandboxes", sandbox["id"])
    assert item["kernel_ids"] == ["kernel-b"]


async def test_bad_ids(jp_fetch: Any, sandbox: dict[str, str]) -> None:
    body = await fetch(jp_fetch, "api", "sandboxes", "x" * 10_000, expect=400)
    assert "bad sandbox id" in body["message"]
    await fetch(jp_fetch, "api", "sandboxes", "sk-nobody-here", expect=404)
    await fetch(jp_fetch, "api", "sandboxes", "bad id!", expect=400)


async def test_other_users_sandbox_is_forbidden(
    jp_fetch: Any,
    sandbox: dict[str, str],
    make_config: Callable[..., SandboxConfig],
    rest_env: dict[str, str],
    test_user: str,
) -> None:
    cfg = make_config(
        workspace_root=rest_env["SANDBOX_KERNEL_WORKSPACE_ROOT"],
        state_dir=rest_env["SANDBOX_KERNEL_STATE_DIR"],
    )
    other = SandboxService(cfg).ensure(ScopeKey(test_user + "-other")).info
    try:
        for method, parts in (
            ("GET", ("api", "sandboxes", other.id)),
            ("DELETE", ("api", "sandboxes", other.id)),
            ("POST", ("api", "sandboxes", other.id, "stop")),
            ("GET", ("api", "sandboxes", other.id, "files")),
            ("GET", ("api", "sandboxes", other.id, "files", "x.txt")),
        ):
            kw: dict[str, Any] = {"method": method}
            if method == "POST":
                kw["body"] = ""
            await fetch(jp_fetch, *parts, expect=403, **kw)
        assert docker.from_env().containers.get(other.engine_id).status == "running"
        assert other.id not in [s["id"] for s in await fetch(jp_fetch, "api", "sandboxes")]
    finally:
        remove_user_containers(test_user + "-other")


async def test_files_round_trip(jp_fetch: Any, sandbox: dict[str, str]) -> None:
    sid = sandbox["id"]
    made = await fetch(
        jp_fetch,
        "api",
        "sandboxes",
        sid,
        "files",
        "deep",
        "er",
        "note.txt",
        method="PUT",
        body=b"hello",
        expect=201,
    )
    assert made == {"path": "deep/er/note.txt", "size": 5}
    listing = await fetch(jp_fetch, "api", "sandboxes", sid, "files", params={"path": "deep/er"})
    assert [(e["name"], e["type"], e["size"]) for e in listing["entries"]] == [
        ("note.txt", "file", 5)
    ]
    root = await fetch(jp_fetch, "api", "sandboxes", sid, "files")
    assert [e["name"] for e in root["entries"]] == ["deep"]
    response = await jp_fetch("api", "sandboxes", sid, "files", "deep", "er", "note.txt")
    assert response.body == b"hello"
    assert response.headers["Content-Length"] == "5"
    assert "note.txt" in response.headers["Content-Disposition"]
    # The sandbox sees it, owned by the sandbox user, and can change it.
    backend_out = subprocess.run(
        [
            "docker",
            "exec",
            sandbox["engine_id"],
            "sh",
            "-c",
            "cat deep/er/note.txt && echo && echo more >> deep/er/note.txt && stat -c %u deep/er/note.txt",
        ],
        capture_output=True,
        text=True,
    )
    # Owned by the sandbox user inside; on the host by the server's user (idmapped when root).
    assert backend_out.stdout.split() == ["hello", "1000" if os.getuid() == 0 else str(os.getuid())]
    assert (Path(sandbox["workspace"]) / "deep" / "er" / "note.txt").stat().st_uid == os.getuid()
    await fetch(
        jp_fetch,
        "api",
        "sandboxes",
        sid,
        "files",
        "deep",
        "er",
        "note.txt",
        method="DELETE",
        expect=204,
    )
    await fetch(jp_fetch, "api", "sandboxes", sid, "files", "deep", "er", "note.txt", expect=404)
    await fetch(
        jp_fetch,
        "api",
        "sandboxes",
        sid,
        "files",
        "deep",
        "er",
        "note.txt",
        method="DELETE",
        expect=404,
    )
    await fetch(jp_fetch, "api", "sandboxes", sid, "files", "deep", method="DELETE", expect=400)
    await fetch(jp_fetch, "api", "sandboxes", sid, "files", params={"path": "missing"}, expect=404)


async def test_files_of_a_stopped_sandbox_leave_it_stopped(
    jp_fetch: Any,
    sandbox: dict[str, str],
    make_config: Callable[..., SandboxConfig],
    rest_env: dict[str, str],
) -> None:
    """The file routes read and write the host workspace: a stopped sandbox stays stopped
    (as the engine says) and file use is not its activity."""
    from sandbox_kernel.store import Store

    sid = sandbox["id"]
    store = Store(
        make_config(
            workspace_root=rest_env["SANDBOX_KERNEL_WORKSPACE_ROOT"],
            state_dir=rest_env["SANDBOX_KERNEL_STATE_DIR"],
        )
    )
    await fetch(jp_fetch, "api", "sandboxes", sid, "stop", method="POST", body="")
    container = sandbox_container(sid)
    assert container.status == "exited"
    record = store.get("docker", sid)
    assert record is not None
    for _ in range(2):
        await fetch(
            jp_fetch,
            "api",
            "sandboxes",
            sid,
            "files",
            "asleep.txt",
            method="PUT",
            body=b"zz",
            expect=201,
        )
        listing = await fetch(jp_fetch, "api", "sandboxes", sid, "files")
        assert [e["name"] for e in listing["entries"]] == ["asleep.txt"]
        assert (await jp_fetch("api", "sandboxes", sid, "files", "asleep.txt")).body == b"zz"
    container.reload()
    assert container.status == "exited"
    assert (await fetch(jp_fetch, "api", "sandboxes", sid))["state"] == "stopped"
    after = store.get("docker", sid)
    assert after is not None and after.last_activity == record.last_activity


async def test_traversal_refused_and_host_untouched(
    jp_fetch: Any, sandbox: dict[str, str], tmp_path: Path, jp_serverapp: Any
) -> None:
    sid = sandbox["id"]
    workspace = Path(sandbox["workspace"])
    outside = tmp_path / "outside"
    outside.mkdir()
    (outside / "secret.txt").write_text("host secret")
    os.symlink("/etc", workspace / "etc-link")
    os.symlink(str(outside), workspace / "out-link")
    before = sorted(p.name for p in outside.iterdir()), (outside / "secret.txt").read_text()
    base = f"{server_url(jp_serverapp)}/api/sandboxes/{sid}/files"
    token = jp_serverapp.identity_provider.token
    attacks = [
        "../../etc/passwd",
        "%2e%2e/%2e%2e/etc/passwd",
        "..%2f..%2fetc%2fpasswd",
        "%2Fetc%2Fpasswd",
        "etc-link/passwd",
        "out-link/secret.txt",
        "out-link/new.txt",
        "a/%00b",
    ]
    for attack in attacks:
        for method in ("GET", "PUT", "DELETE"):
            done = await asyncio.to_thread(
                subprocess.run,
                [
                    "curl",
                    "-s",
                    "--path-as-is",
                    "-o",
                    "/dev/stdout",
                    "-w",
                    "\n%{http_code}",
                    "-X",
                    method,
                    "-H",
                    f"Authorization: token {token}",
                    "--data-binary",
                    "x" if method == "PUT" else "",
                    f"{base}/{attack}",
                ],
                capture_output=True,
                text=True,
            )
            body, _, code = done.stdout.rpartition("\n")
            assert code in ("400", "404"), (attack, method, code, body)
            assert code == "400" or "etc" not in attack, (attack, method, code, body)
            assert "Traceback" not in body
    listing = await fetch(
        jp_fetch, "api", "sandboxes", sid, "files", params={"path": "../"}, expect=400
    )
    assert "outside" in listing["message"]
    await fetch(jp_fetch, "api", "sandboxes", sid, "files", params={"path": "/etc"}, expect=400)
    await fetch(jp_fetch, "api", "sandboxes", sid, "files", params={"path": "out-link"}, expect=400)
    assert (
        sorted(p.name for p in outside.iterdir()),
        (outside / "secret.txt").read_text(),
    ) == before
    assert Path("/etc/passwd").read_text().startswith("root:")
    assert sorted(p.name for p in workspace.iterdir()) == [
        "etc-link",
        "out-link",
    ]  # no partial uploads


async def test_upload_limit(
    jp_fetch: Any, sandbox: dict[str, str], jp_serverapp: Any, tmp_path: Path
) -> None:
    jp_serverapp.web_app.settings["sandbox_max_upload"] = 1000
    body = await fetch(
        jp_fetch,
        "api",
        "sandboxes",
        sandbox["id"],
        "files",
        "big.bin",
        method="PUT",
        body=b"x" * 2000,
        expect=413,
    )
    assert "limit" in body["message"]
    assert not (Path(sandbox["workspace"]) / "big.bin").exists()
    assert [p.name for p in Path(sandbox["workspace"]).iterdir()] == []


async def test_large_file_streams_without_memory(
    jp_fetch: Any, sandbox: dict[str, str], jp_serverapp: Any, tmp_path: Path
) -> None:
    src = tmp_path / "big.bin"
    with src.open("wb") as fh:
        for _ in range(100):
            fh.write(os.urandom(1 << 16) * 16)  # 100 MiB
    token = jp_serverapp.identity_provider.token
    url = f"{server_url(jp_serverapp)}/api/sandboxes/{sandbox['id']}/files/data/big.bin"
    auth = ["-H", f"Authorization: token {token}"]
    tracemalloc.start()
    try:
        up = await asyncio.to_thread(
            subprocess.run, ["curl", "-sf", "-T", str(src), *auth, url], capture_output=True
        )
        assert up.returncode == 0, up.stderr
        got = tmp_path / "back.bin"
        down = await asyncio.to_thread(
            subprocess.run, ["curl", "-sf", "-o", str(got), *auth, url], capture_output=True
        )
        assert down.returncode == 0, down.stderr
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert peak < 30 << 20, f"the server held {peak >> 20} MiB at once"
    assert subprocess.run(["cmp", str(src), str(got)]).returncode == 0
    assert (
        subprocess.run(
            ["cmp", str(src), str(Path(sandbox["workspace"]) / "data" / "big.bin")]
        ).returncode
        == 0
    )


async def test_snapshots_routes(jp_fetch: Any, sandbox: dict[str, str], test_user: str) -> None:
    name = f"{test_user}-rest"
    try:
        body = await fetch(
            jp_fetch,
            "api",
            "sandboxes",
            sandbox["id"],
            "snapshots",
            method="POST",
            body="not json",
            expect=400,
        )
        assert "JSON" in body["message"]
        await fetch(
            jp_fetch,
            "api",
            "sandboxes",
            sandbox["id"],
            "snapshots",
            method="POST",
            body=json.dumps({"name": 7}),
            expect=400,
        )
        await fetch(
            jp_fetch,
            "api",
            "sandboxes",
            sandbox["id"],
            "snapshots",
            method="POST",
            body="[]",
            expect=400,
        )
        await fetch(
            jp_fetch,
            "api",
            "sandboxes",
            sandbox["id"],
            "snapshots",
            method="POST",
            body=json.dumps({"name": "Bad Name"}),
            expect=400,
        )
        snap = await fetch(
            jp_fetch,
            "api",
            "sandboxes",
            sandbox["id"],
            "snapshots",
            method="POST",
            body=json.dumps({"name": name}),
            expect=201,
        )
        assert (snap["name"], snap["source"]) == (name, sandbox["id"])
        taken = await fetch(
            jp_fetch,
            "api",
            "sandboxes",
            sandbox["id"],
            "snapshots",
            method="POST",
            body=json.dumps({"name": name}),
            expect=409,
        )
        assert (
            taken["message"]
            == f"you already have a snapshot named {name!r}; delete it first or pick another name"
        )
        assert name in [s["name"] for s in await fetch(jp_fetch, "api", "snapshots")]
        await fetch(jp_fetch, "api", "snapshots", name, method="DELETE", expect=204)
        await fetch(jp_fetch, "api", "snapshots", name, method="DELETE", expect=404)
    finally:
        remove_user_snapshots(test_user)


async def test_start_sandbox_from_snapshot(
    jp_fetch: Any, sandbox: dict[str, str], test_user: str
) -> None:
    name = f"{test_user}-start"
    sid = sandbox["id"]
    try:
        subprocess.run(
            [
                "docker",
                "exec",
                sandbox["engine_id"],
                "sh",
                "-c",
                "echo baked > /home/sandbox/baked.txt",
            ],
            check=True,
        )
        await fetch(
            jp_fetch,
            "api",
            "sandboxes",
            sid,
            "snapshots",
            method="POST",
            body=json.dumps({"name": name}),
            expect=201,
        )
        await fetch(jp_fetch, "api", "sandboxes", method="POST", body=json.dumps({}), expect=400)
        await fetch(
            jp_fetch,
            "api",
            "sandboxes",
            method="POST",
            body=json.dumps({"snapshot": "Bad Name"}),
            expect=400,
        )
        missing = await fetch(
            jp_fetch,
            "api",
            "sandboxes",
            method="POST",
            body=json.dumps({"snapshot": f"{name}-nope"}),
            expect=404,
        )
        assert "no snapshot" in missing["message"]
        made = await fetch(
            jp_fetch,
            "api",
            "sandboxes",
            method="POST",
            body=json.dumps({"snapshot": name}),
            expect=201,
        )
        assert (made["user"], made["scope"], made["state"], made["snapshot"]) == (
            test_user,
            "thread",
            "running",
            name,
        )
        assert made["id"] != sid and made["thread"].startswith(f"snapshot:{name}:")
        assert made["kernel_ids"] == []
        in_use = await fetch(jp_fetch, "api", "snapshots", name, method="DELETE", expect=409)
        assert (
            made["id"] in in_use["message"] and "destroy those sandboxes first" in in_use["message"]
        )
        # It really runs the snapshot's filesystem, and shares the user's workspace.
        baked = subprocess.run(
            ["docker", "exec", made["engine_id"], "cat", "/home/sandbox/baked.txt"],
            capture_output=True,
            text=True,
        )
        assert baked.stdout.strip() == "baked"
        assert made["workspace"] == sandbox["workspace"]
        listed = {s["id"] for s in await fetch(jp_fetch, "api", "sandboxes")}
        assert listed == {sid, made["id"]}
        # A second start makes another sandbox, not the same one again.
        again = await fetch(
            jp_fetch,
            "api",
            "sandboxes",
            method="POST",
            body=json.dumps({"snapshot": name}),
            expect=201,
        )
        assert again["id"] not in (sid, made["id"])
        # Another user's snapshot is not theirs to start from.
        installation = (
            docker.from_env()
            .containers.get(sandbox["engine_id"])
            .labels["sandbox-kernel.installation"]
        )
        subprocess.run(
            [
                "docker",
                "commit",
                "-c",
                f"LABEL sandbox-kernel.snapshot={name}-x sandbox-kernel.user=someone-else sandbox-kernel.installation={installation}",
                sandbox["engine_id"],
                f"sandbox-kernel-snapshot:{name}-x",
            ],
            check=True,
            capture_output=True,
        )
        # Another user's snapshot of the same name is not this user's: not found, not theirs to use.
        body = await fetch(
            jp_fetch,
            "api",
            "sandboxes",
            method="POST",
            body=json.dumps({"snapshot": f"{name}-x"}),
            expect=404,
        )
        assert "no snapshot named" in body["message"]
    finally:
        remove_user_containers(test_user)
        remove_user_snapshots(test_user)
        subprocess.run(
            ["docker", "rmi", "-f", f"sandbox-kernel-snapshot:{name}-x"], capture_output=True
        )


async def test_not_supported_is_501(
    jp_fetch: Any,
    jp_serverapp: Any,
    rest_env: dict[str, str],
    monkeypatch: pytest.MonkeyPatch,
    tmp_path: Path,
) -> None:
    from sandbox_kernel.config import load_config
    from sandbox_kernel.service import SandboxService

    cfg = load_config(
        environ={},
        backend="local",
        workspace_root=str(tmp_path / "lw"),
        state_dir=str(tmp_path / "ls"),
        user=rest_env["SANDBOX_KERNEL_USER"],
    )
    local = SandboxService(cfg)
    info = local.ensure(ScopeKey(rest_env["SANDBOX_KERNEL_USER"])).info
    jp_serverapp.web_app.settings["sandbox_service"] = local
    body = await fetch(jp_fetch, "api", "snapshots", expect=501)
    assert "cannot" in body["message"] or "no snapshots" in body["message"]
    await fetch(
        jp_fetch,
        "api",
        "sandboxes",
        info.id,
        "snapshots",
        method="POST",
        body=json.dumps({"name": "s1"}),
        expect=501,
    )
    assert [s["id"] for s in await fetch(jp_fetch, "api", "sandboxes")] == [info.id]


async def test_stats(jp_fetch: Any, sandbox: dict[str, str]) -> None:
    totals = await fetch(jp_fetch, "api", "sandboxes-stats")
    assert totals["yours"] == 1 and totals["sandboxes"] >= 1
    assert sum(totals["by_state"].values()) == totals["sandboxes"]
    assert "quota" in totals and "memory" in totals


def served_routes() -> set[tuple[str, str]]:
    """(path with {id}-style parameters, method) of every route the extension serves."""
    from jupyter_ext.handlers import handlers
    from jupyter_ext.mcp import mcp_handlers
    from jupyter_ext.proxy import proxy_handlers

    served = set()
    for pattern, handler in [*handlers(), *mcp_handlers(), *proxy_handlers()]:
        path = re.sub(
            r"\(\?P<(\w+)>[^)]*\)",
            lambda m: "{id}" if m.group(1) in ("sandbox_id", "name") else f"{{{m.group(1)}}}",
            pattern,
        )
        if "{action}" in path:
            for action in ("stop", "start"):
                served |= {(path.replace("{action}", action), "POST")}
            continue
        ours = [k for k in handler.__mro__ if k.__module__.startswith("jupyter_ext.")]
        for method in ("GET", "POST", "PUT", "DELETE"):
            if any(method.lower() in k.__dict__ for k in ours):
                served.add((path, method))
    return served


def test_openapi_matches_handlers() -> None:
    spec = yaml.safe_load(
        (Path(__file__).resolve().parent.parent / "jupyter_ext" / "openapi.yaml").read_text()
    )
    documented = {
        (path, m.upper()) for path, ops in spec["paths"].items() for m in ops if m != "parameters"
    }
    assert documented == served_routes()


async def test_every_route_refuses_a_request_without_login(
    jp_fetch: Any, jp_serverapp: Any, sandbox: dict[str, str]
) -> None:
    """Every route the extension serves, tried without a token against a real sandbox's
    names: 401/403, and nothing happened to the sandbox or its workspace."""
    routes = served_routes()
    assert len(routes) >= 10
    for path, method in sorted(routes):
        url = (
            path.replace("{id}", sandbox["id"])
            .replace("{path}", "x.txt")
            .replace("{port}", "8000")
            .replace("{grant}", "e30.00")
        )
        done = await asyncio.to_thread(
            subprocess.run,
            [
                "curl",
                "-s",
                "-o",
                "/dev/null",
                "-w",
                "%{http_code}",
                "-X",
                method,
                "--data-binary",
                "x" if method in ("PUT", "POST") else "",
                f"{server_url(jp_serverapp)}{url}",
            ],
            capture_output=True,
            text=True,
        )
        assert done.stdout in ("401", "403"), (method, url, done.stdout)
    assert not (Path(sandbox["workspace"]) / "x.txt").exists()
    assert sandbox_container(sandbox["id"]).status == "running"
