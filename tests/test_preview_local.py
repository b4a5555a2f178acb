"""Previews on the local backend, through a real Jupyter server: the host has no way yet
to reach a local sandbox's ports and nothing else, so it serves no previews, and says
so (the ports listing, and the proxy's 501 in one line)."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from tornado.httpclient import HTTPClientError

from sandbox_kernel.config import load_config
from sandbox_kernel.identity import ScopeKey
from sandbox_kernel.service import SandboxService

from .test_rest_api import fetch


@pytest.fixture
def local_env(
    tmp_path: Path, test_user: str, monkeypatch: pytest.MonkeyPatch
) -> Iterator[dict[str, str]]:
    env = {
        "SANDBOX_KERNEL_BACKEND": "local",
        "SANDBOX_KERNEL_LOCAL_NO_BWRAP": "1",  # plain processes: the answer is the same
        "SANDBOX_KERNEL_WORKSPACE_ROOT": str(tmp_path / "ws"),
        "SANDBOX_KERNEL_STATE_DIR": str(tmp_path / "state"),
        "SANDBOX_KERNEL_USER": test_user,
    }
    for name, value in env.items():
        monkeypatch.setenv(name, value)
    yield env
    service = SandboxService(load_config())
    for info in service.backend.list(test_user):
        service.backend.destroy(info.id)


@pytest.fixture
def jp_server_config(local_env: dict[str, str]) -> dict[str, Any]:
    return {
        "ServerApp": {"jpserver_extensions": {"jupyter_ext": True}},
        "SandboxExtension": {"gc_interval": 0},
    }


async def test_local_sandboxes_say_they_serve_no_previews(
    jp_fetch: Any, local_env: dict[str, str], test_user: str
) -> None:
    service = SandboxService(load_config())
    sid = service.ensure(ScopeKey(test_user)).info.id
    listed = await fetch(jp_fetch, "api", "sandboxes", sid, "ports")
    assert listed["state"] == "running" and listed["preview"] is False
    assert "local backend cannot reach a sandbox's ports" in listed["preview_note"]
    with pytest.raises(HTTPClientError) as refused:
        await jp_fetch("sandbox-kernel", "proxy", sid, "8000", "x")
    assert refused.value.code == 501
    message = json.loads(refused.value.response.body)["message"]
    assert "local backend" in message and "Traceback" not in message
