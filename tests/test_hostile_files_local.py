"""The REST file routes' attacks (``test_hostile_files.py``) against a local sandbox.

The same tests, collected here with the server's sandboxes on the local backend: the
attack loops run inside a bubblewrap'd sandbox (a channel of the backend, stdin closed
to stop them) while the test drives the server from outside. With a root server the
sandbox writes the workspace through an idmapped mount, so every link, FIFO and swap
it makes is root's on disk, as the server's own files are.
"""

from __future__ import annotations

import json
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from sandbox_kernel.backends.local import LocalBackend
from sandbox_kernel.config import SandboxConfig, load_config
from sandbox_kernel.identity import ScopeKey
from sandbox_kernel.service import SandboxService

from . import file_attacks
from . import test_hostile_files as remote
from .conftest import require_bwrap
from .file_attacks import _WRAPPER
from .file_attacks import _stop_attackers as _stop_attackers  # noqa: F401 (autouse)
from .test_hostile_files import *  # noqa: F403 (the tests and their fixtures)

pytestmark: list[pytest.MarkDecorator] = []  # no engine needed: bubblewrap is


def _local_config(env: dict[str, str]) -> SandboxConfig:
    return load_config(
        environ={},
        backend="local",
        workspace_root=env["SANDBOX_KERNEL_WORKSPACE_ROOT"],
        state_dir=env["SANDBOX_KERNEL_STATE_DIR"],
        work_root="none",
    )


_BACKENDS: dict[str, LocalBackend] = {}


@pytest.fixture
def rest_env(
    tmp_path: Path, test_user: str, monkeypatch: pytest.MonkeyPatch
) -> Iterator[dict[str, str]]:
    """The server's settings: the local backend, folders under tmp_path, the test's user."""
    require_bwrap()
    env = {
        "SANDBOX_KERNEL_BACKEND": "local",
        "SANDBOX_KERNEL_WORKSPACE_ROOT": str(tmp_path / "ws"),
        "SANDBOX_KERNEL_STATE_DIR": str(tmp_path / "state"),
        "SANDBOX_KERNEL_USER": test_user,
        "SANDBOX_KERNEL_WORK_ROOT": "none",
    }
    for key, value in env.items():
        monkeypatch.setenv(key, value)
    yield env


@pytest.fixture
def sandbox(rest_env: dict[str, str], test_user: str) -> dict[str, str]:
    """The server's user's local sandbox; ``engine_id`` names it for the attack helpers."""
    service = SandboxService(_local_config(rest_env))
    info = service.ensure(ScopeKey(test_user)).info
    _BACKENDS[info.id] = service.backend  # type: ignore[assignment]
    return {"id": info.id, "workspace": info.workspace, "engine_id": info.id}


class LocalAttacker:
    """One attack loop inside a local sandbox: a channel of the backend, as the Docker
    tests' :class:`~tests.file_attacks.Attacker` is an exec with stdin."""

    def __init__(self, sandbox_id: str, body: str, args: dict[str, Any], seconds: float) -> None:
        backend = _BACKENDS[sandbox_id]
        cmd = ["python3", "-c", _WRAPPER, body, str(seconds), json.dumps(args)]
        self.channel = backend.open_channel(sandbox_id, cmd)
        self.output = bytearray()
        self.ready = threading.Event()
        self.done = threading.Event()
        self.stats: dict[str, Any] | None = None
        threading.Thread(target=self._read, daemon=True).start()

    def _read(self) -> None:
        try:
            while chunk := self.channel.read():
                self.output += chunk
                if b"READY\n" in self.output:
                    self.ready.set()
        finally:
            self.done.set()

    def stop(self, timeout: float = 15.0) -> dict[str, Any]:
        if self.stats is not None:
            return self.stats
        stdin = self.channel.proc.stdin
        if stdin is not None:
            stdin.close()  # EOF: the loop ends
        finished = self.done.wait(timeout)
        self.channel.close()
        text = self.output.decode("utf-8", "replace")
        line = next((ln for ln in reversed(text.splitlines()) if ln.startswith("STATS ")), None)
        assert finished and line, f"the attack loop did not report (test bug): {text[-2000:]!r}"
        self.stats = json.loads(line[6:])
        return self.stats


def local_sandbox_run(sandbox_id: str, code: str, **args: Any) -> bytes:
    """Run a short setup script in the local sandbox as its user (cwd /workspace)."""
    result = _BACKENDS[sandbox_id].exec(sandbox_id, ["python3", "-c", code, json.dumps(args)])
    assert result.exit_code == 0, (
        f"setup in the sandbox failed (test bug): {result.output[-2000:]!r}"
    )
    return result.output


@pytest.fixture(autouse=True)
def _local_attacks(monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    """The tests' attack helpers reach the local sandbox instead of a container."""
    monkeypatch.setattr(file_attacks, "Attacker", LocalAttacker)  # what start_attack makes
    monkeypatch.setattr(remote, "sandbox_run", local_sandbox_run)  # the tests' own calls
    yield
    _BACKENDS.clear()
