"""An administrator's folders in local sandboxes (bubblewrap): read-only and writable
mappings, a hostile command in a writable one, a changed mapping applied at the next
start with everything of the sandbox kept; and the one line where local sandboxes are
plain host processes, which cannot show a folder elsewhere."""

from __future__ import annotations

import os
from collections.abc import Iterator
from pathlib import Path

import pytest

from sandbox_kernel.backends.base import SandboxInfo
from sandbox_kernel.backends.local import bwrap_works
from sandbox_kernel.config import SandboxConfig, load_config
from sandbox_kernel.errors import NotSupported
from sandbox_kernel.identity import ScopeKey
from sandbox_kernel.service import SandboxService

from .conftest import require_bwrap


@pytest.fixture
def folders(tmp_path: Path) -> dict[str, Path]:
    data, cache = tmp_path / "data", tmp_path / "cache"
    data.mkdir()
    (data / "words.txt").write_text("alpha beta\n")
    (cache / "repo" / ".git").mkdir(parents=True)
    (cache / "repo" / ".git" / "config").write_text("[core]\n")
    return {"data": data, "cache": cache}


def settings(tmp_path: Path, volumes: list[str]) -> SandboxConfig:
    return load_config(
        environ={},
        backend="local",
        workspace_root=str(tmp_path / "ws"),
        state_dir=str(tmp_path / "st"),
        volumes=volumes,
    )


@pytest.fixture
def bwrap() -> Iterator[None]:
    bwrap_works.cache_clear()
    require_bwrap()
    yield
    bwrap_works.cache_clear()


def sh(service: SandboxService, info: SandboxInfo, script: str) -> tuple[int, str]:
    done = service.exec(info, service.as_user(info, ["sh", "-c", script]))
    return done.exit_code, done.output.decode(errors="replace")


def test_mapped_folders_in_a_local_sandbox(
    bwrap: None, tmp_path: Path, folders: dict[str, Path]
) -> None:
    service = SandboxService(
        settings(tmp_path, [f"{folders['data']}:/data", f"{folders['cache']}:/cache:rw"])
    )
    info = service.ensure(ScopeKey("ann")).info
    assert [(v["target"], v["mode"]) for v in info.volumes] == [("/data", "ro"), ("/cache", "rw")]
    code, out = sh(service, info, "cat /data/words.txt; echo x > /data/new.txt")
    assert code != 0 and out.startswith("alpha beta\n") and "Read-only file system" in out
    assert not (folders["data"] / "new.txt").exists()
    code, out = sh(service, info, "echo from-local > /cache/out.txt")
    assert code == 0, out
    written = folders["cache"] / "out.txt"
    assert written.read_text() == "from-local\n" and written.stat().st_uid == os.getuid()
    for attempt in (
        "ln -s /etc/passwd /cache/link",
        "mkfifo /cache/fifo",
        "echo '[core] fsmonitor = x' >> /cache/repo/.git/config",
        "mv /cache/repo/.git /cache/repo/git-old",
    ):
        code, out = sh(service, info, attempt)
        assert code != 0, (attempt, out)
    for planted in ("link", "fifo"):
        assert not os.path.lexists(folders["cache"] / planted)
    assert (folders["cache"] / "repo" / ".git" / "config").read_text() == "[core]\n"


def test_a_changed_mapping_is_applied_at_the_next_start(
    bwrap: None, tmp_path: Path, folders: dict[str, Path]
) -> None:
    first = SandboxService(settings(tmp_path, [f"{folders['data']}:/data"]))
    info = first.ensure(ScopeKey("ann")).info
    assert sh(first, info, "echo kept > ~/notes.txt")[0] == 0
    second = SandboxService(
        settings(tmp_path, [f"{folders['data']}:/data", f"{folders['cache']}:/cache:rw"])
    )
    (item,) = second.list("ann")
    assert "/cache (rw)" in item["outdated"]
    assert item["remake"] == (
        "made anew with them at its next start: its files and installed packages are kept"
    )
    second.stop(None, info.id)
    again = second.ensure(ScopeKey("ann"))
    assert again.event == "started"
    code, out = sh(second, again.info, "cat ~/notes.txt; echo hi > /cache/again.txt")
    assert code == 0 and out.strip() == "kept", out
    assert (folders["cache"] / "again.txt").read_text() == "hi\n"
    assert second.list("ann")[0]["outdated"] == ""


def test_plain_local_processes_say_they_cannot_map(
    tmp_path: Path, folders: dict[str, Path], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("SANDBOX_KERNEL_LOCAL_NO_BWRAP", "1")
    bwrap_works.cache_clear()
    try:
        service = SandboxService(settings(tmp_path, [f"{folders['data']}:/data"]))
        with pytest.raises(NotSupported) as caught:
            service.ensure(ScopeKey("ann"))
        message = str(caught.value)
        assert message.startswith(f"mapping '{folders['data']}:/data:ro'")
        assert "install bubblewrap" in message and "\n" not in message
        assert service.list("ann") == []
    finally:
        bwrap_works.cache_clear()
