"""Egress allowlists on the local backend: it has no proxy that only the sandbox can
reach, so a sandbox with a list gets no network at all (closed, never open), and its
listing says so; without bubblewrap, which alone can take the network away, such a
sandbox is refused in one line."""

from __future__ import annotations

import json
import socket
from pathlib import Path

import pytest

from sandbox_kernel.backends.local import bwrap_works
from sandbox_kernel.config import load_config
from sandbox_kernel.errors import SandboxFailed
from sandbox_kernel.identity import ScopeKey
from sandbox_kernel.service import SandboxService

from .conftest import require_bwrap


def _service(tmp_path: Path) -> SandboxService:
    return SandboxService(
        load_config(
            environ={},
            backend="local",
            workspace_root=str(tmp_path / "ws"),
            state_dir=str(tmp_path / "st"),
            egress_allow=["pypi.org"],
        )
    )


def test_a_list_means_no_network_at_all_here(tmp_path: Path) -> None:
    require_bwrap()
    bwrap_works.cache_clear()
    service = _service(tmp_path)
    info = service.ensure(ScopeKey("ann")).info
    assert info.limits["network"] is False
    assert info.limits["egress_allow"] == ["pypi.org"]
    assert "egress_allow: no network at all" in info.isolation
    host = socket.socket()
    host.bind(("127.0.0.1", 0))
    host.listen(1)
    code = (
        "import json, socket, sys\n"
        "names = [n for _, n in socket.if_nameindex()]\n"
        "try:\n"
        "    socket.create_connection(('127.0.0.1', int(sys.argv[1])), timeout=20)\n"
        "    how = 'connected'\n"
        "except OSError as exc:\n"
        "    how = exc.errno\n"
        "print(json.dumps([names, how]))\n"
    )
    try:
        result = service.backend.exec(info.id, ["python3", "-c", code, str(host.getsockname()[1])])
    finally:
        host.close()
    names, how = json.loads(result.output.decode().strip().splitlines()[-1])
    assert names == ["lo"]  # no interface to send a packet anywhere else on
    assert how == 111  # its own loopback, not the host's: refused at once


def test_without_bubblewrap_a_list_is_refused(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("SANDBOX_KERNEL_LOCAL_NO_BWRAP", "1")
    bwrap_works.cache_clear()
    try:
        with pytest.raises(SandboxFailed) as refused:
            _service(tmp_path).ensure(ScopeKey("ann"))
        assert "\n" not in str(refused.value)
        assert "install bubblewrap, use Docker, or clear egress_allow" in str(refused.value)
    finally:
        bwrap_works.cache_clear()
