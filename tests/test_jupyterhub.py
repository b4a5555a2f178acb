"""A real JupyterHub with two users: each one's notebooks land in their own sandbox.

The hub (``jupyterhub`` from PyPI) runs with configurable-http-proxy (npm), the
SimpleLocalProcessSpawner (every single-user server under this test's OS user, as a
hub on one machine without system accounts would) and the server extension enabled as
docs/operators/multi-user.md says: ``owner_from = "server"``, each single-user server
acting for its ``JUPYTERHUB_USER``. Everything goes through the proxy with the
users' own hub tokens, as a browser's requests would.
"""

from __future__ import annotations

import asyncio
import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import time
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
from tornado.httpclient import AsyncHTTPClient, HTTPClientError, HTTPRequest
from tornado.websocket import websocket_connect

from sandbox_kernel.config import load_config
from sandbox_kernel.identity import ScopeKey
from sandbox_kernel.kernelspec import kernelspec
from sandbox_kernel.service import SandboxService

from .conftest import TEST_IMAGE, remove_user_containers
from .helpers import run_over_websocket

pytestmark = [pytest.mark.docker, pytest.mark.timeout(400)]


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _hub_missing() -> str:
    if shutil.which("configurable-http-proxy") is None:
        return "configurable-http-proxy is not installed (npm install -g configurable-http-proxy)"
    if not Path(sys.executable).with_name("jupyterhub").exists():
        return "jupyterhub is not installed (pip install jupyterhub)"
    return ""


@dataclass
class Hub:
    url: str
    token: str  # the test service's: it manages users, servers and tokens
    root: Path

    async def api(self, method: str, path: str, token: str = "", body: Any = None) -> Any:
        response = await AsyncHTTPClient().fetch(
            HTTPRequest(
                f"{self.url}{path}",
                method=method,
                headers={"Authorization": f"token {token or self.token}"},
                body=None if body is None else json.dumps(body),
                allow_nonstandard_methods=True,
                request_timeout=120,
            )
        )
        return json.loads(response.body) if response.body else None

    async def websocket(self, path: str, token: str) -> Any:
        """A websocket through the proxy, signed in with ``token``."""
        return await websocket_connect(
            HTTPRequest(
                f"{self.url.replace('http', 'ws', 1)}{path}",
                headers={"Authorization": f"token {token}"},
            )
        )


@pytest.fixture
def hub(tmp_path: Path, test_user: str) -> Iterator[Hub]:
    missing = _hub_missing()
    if missing:
        if os.environ.get("SANDBOX_KERNEL_REQUIRE_HUB") == "1":
            pytest.fail(f"the JupyterHub test is required here but cannot run: {missing}")
        pytest.skip(missing)
    token = uuid.uuid4().hex
    port, api_port, hub_port = _free_port(), _free_port(), _free_port()
    kernels = tmp_path / "share" / "kernels" / "sandbox"
    kernels.mkdir(parents=True)
    (kernels / "kernel.json").write_text(json.dumps(kernelspec("sandbox", None, sys.executable)))
    # The single-user servers' Jupyter config: the extension on, the reaper off (tests).
    server_config = tmp_path / "server-config"
    server_config.mkdir()
    (server_config / "jupyter_server_config.json").write_text(
        json.dumps(
            {
                "ServerApp": {"jpserver_extensions": {"jupyter_ext": True}, "allow_root": True},
                "SandboxExtension": {"gc_interval": 0},
                # docs/operators/multi-user.md: no kernel runs user code on the host.
                "KernelSpecManager": {"allowed_kernelspecs": ["sandbox"]},
            }
        )
    )
    environment = {
        "SANDBOX_KERNEL_BACKEND": "docker",
        "SANDBOX_KERNEL_IMAGE": TEST_IMAGE,
        "SANDBOX_KERNEL_WORKSPACE_ROOT": str(tmp_path / "ws"),
        "SANDBOX_KERNEL_STATE_DIR": str(tmp_path / "st"),
        "SANDBOX_KERNEL_WORK_ROOT": "none",
        "JUPYTER_PATH": str(tmp_path / "share"),
        "JUPYTER_CONFIG_DIR": str(server_config),
        "PATH": os.environ["PATH"],
    }
    config = tmp_path / "jupyterhub_config.py"
    config.write_text(
        "\n".join(
            [
                f"c.JupyterHub.bind_url = 'http://127.0.0.1:{port}'",
                f"c.JupyterHub.hub_bind_url = 'http://127.0.0.1:{hub_port}'",
                f"c.ConfigurableHTTPProxy.api_url = 'http://127.0.0.1:{api_port}'",
                f"c.JupyterHub.db_url = 'sqlite:///{tmp_path / 'hub.sqlite'}'",
                f"c.JupyterHub.cookie_secret_file = '{tmp_path / 'cookie_secret'}'",
                f"c.ConfigurableHTTPProxy.pid_file = '{tmp_path / 'proxy.pid'}'",
                "c.JupyterHub.authenticator_class = 'dummy'",
                "c.Authenticator.allow_all = True",
                "c.JupyterHub.spawner_class = 'simple'",
                f"c.SimpleLocalProcessSpawner.home_dir_template = '{tmp_path / 'home'}/{{username}}'",
                f"c.Spawner.cmd = [{str(Path(sys.executable).with_name('jupyterhub-singleuser'))!r}]",
                f"c.Spawner.environment = {environment!r}",
                "c.Spawner.start_timeout = 120",
                "c.Spawner.http_timeout = 120",
                f"c.JupyterHub.services = [{{'name': 'sk-test', 'api_token': {token!r}}}]",
                "c.JupyterHub.load_roles = [{'name': 'sk-test', 'services': ['sk-test'],"
                " 'scopes': ['admin:users', 'admin:servers', 'tokens']}]",
            ]
        )
    )
    log = (tmp_path / "hub.log").open("wb")
    proc = subprocess.Popen(
        [str(Path(sys.executable).with_name("jupyterhub")), "-f", str(config)],
        cwd=tmp_path,
        stdout=log,
        stderr=subprocess.STDOUT,
        start_new_session=True,
    )
    url = f"http://127.0.0.1:{port}"
    deadline = time.monotonic() + 90
    while True:
        try:
            with socket.create_connection(("127.0.0.1", port), timeout=1):
                pass
            import urllib.request

            urllib.request.urlopen(f"{url}/hub/api/", timeout=5).read()
            break
        except OSError:
            if proc.poll() is not None or time.monotonic() > deadline:
                log.close()
                pytest.fail(
                    "JupyterHub did not start:\n" + (tmp_path / "hub.log").read_text()[-3000:]
                )
            time.sleep(0.5)
    try:
        yield Hub(url=url, token=token, root=tmp_path)
    finally:
        proc.send_signal(signal.SIGTERM)  # the hub stops the servers and the proxy it started
        try:
            proc.wait(60)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
        log.close()
        remove_user_containers(test_user)


async def _spawn(hub: Hub, name: str) -> str:
    """Create ``name`` with a running server; their own API token (as their browser's)."""
    await hub.api("POST", f"/hub/api/users/{name}")
    await hub.api("POST", f"/hub/api/users/{name}/server")
    deadline = time.monotonic() + 120
    while not ((await hub.api("GET", f"/hub/api/users/{name}"))["servers"].get("", {}) or {}).get(
        "ready"
    ):
        if time.monotonic() > deadline:
            pytest.fail(
                f"{name}'s server did not start:\n{(hub.root / 'hub.log').read_text()[-3000:]}"
            )
        time.sleep(0.5)
    made = await hub.api("POST", f"/hub/api/users/{name}/tokens", body={"note": "test"})
    return str(made["token"])


async def _get(hub: Hub, path: str, token: str) -> tuple[int, Any]:
    try:
        return 200, await hub.api("GET", path, token=token)
    except HTTPClientError as err:
        return err.code, None


async def _run_cell(hub: Hub, name: str, token: str, code: str) -> str:
    """A notebook session on ``name``'s server, one cell run over the kernel websocket."""
    session = await hub.api(
        "POST",
        f"/user/{name}/api/sessions",
        token=token,
        body={"path": "work.ipynb", "type": "notebook", "kernel": {"name": "sandbox"}},
    )
    ws = await hub.websocket(f"/user/{name}/api/kernels/{session['kernel']['id']}/channels", token)
    try:
        out, reply = await run_over_websocket(ws, code, timeout=180)
    finally:
        ws.close()
    assert reply["status"] == "ok", (out, reply)
    return out


async def _terminal_says(hub: Hub, name: str, token: str, command: str) -> str:
    """What ``command`` prints in a new JupyterLab terminal of ``name``'s server (the
    line between two markers, so the echo of the typed command never counts)."""
    made = await hub.api("POST", f"/user/{name}/api/terminals", token=token)
    ws = await hub.websocket(f"/user/{name}/terminals/websocket/{made['name']}", token)
    try:
        ws.write_message(
            json.dumps(["stdin", f"echo BEGIN-$(( 6 * 7 )); {command}; echo END-$(( 6 * 7 ))\r"])
        )
        seen = ""
        deadline = time.monotonic() + 120
        while "END-42" not in seen.partition("BEGIN-42")[2]:
            left = deadline - time.monotonic()
            assert left > 0, f"no answer from the terminal: {seen[-2000:]!r}"
            raw = await asyncio.wait_for(ws.read_message(), left)
            assert raw is not None, f"the terminal closed: {seen[-2000:]!r}"
            kind, *rest = json.loads(raw)
            if kind == "stdout":
                seen += rest[0]
        return seen.partition("BEGIN-42")[2].partition("END-42")[0].strip()
    finally:
        ws.close()
        await hub.api("DELETE", f"/user/{name}/api/terminals/{made['name']}", token=token)


async def test_each_hub_user_has_their_own_sandbox(hub: Hub, test_user: str) -> None:
    alice, bob = f"{test_user}-alice", f"{test_user}-bob"
    tokens = {alice: await _spawn(hub, alice), bob: await _spawn(hub, bob)}
    for name in (alice, bob):
        await _run_cell(
            hub, name, tokens[name], f"open('/workspace/mark.txt', 'w').write({name!r})"
        )
    service = SandboxService(
        load_config(
            environ={},
            backend="docker",
            image=TEST_IMAGE,
            workspace_root=str(hub.root / "ws"),
            state_dir=str(hub.root / "st"),
        )
    )
    for name in (alice, bob):
        mine = service.backend.list(name)
        assert [s.id for s in mine] == [ScopeKey(name).name]
        assert (Path(mine[0].workspace) / "mark.txt").read_text() == name
        # What their panel shows: only their own sandbox.
        code, listed = await _get(hub, f"/user/{name}/api/sandboxes", tokens[name])
        assert code == 200 and [s["id"] for s in listed] == [ScopeKey(name).name]
    specs = await hub.api("GET", f"/user/{alice}/api/kernelspecs", token=tokens[alice])
    assert list(specs["kernelspecs"]) == ["sandbox"]
    # Neither can reach the other's server, nor the other's sandbox through their own.
    code, _ = await _get(hub, f"/user/{alice}/api/sandboxes", tokens[bob])
    assert code == 403
    code, _ = await _get(hub, f"/user/{bob}/api/sandboxes/{ScopeKey(alice).name}", tokens[bob])
    assert code == 403
    # JupyterLab's terminal through the hub is a shell in the user's sandbox, not the host.
    assert await _terminal_says(hub, bob, tokens[bob], "cat /workspace/mark.txt") == bob
    # The same user's next notebook lands in the same sandbox.
    out = await _run_cell(hub, alice, tokens[alice], "print(open('/workspace/mark.txt').read())")
    assert out.strip() == alice
