"""An administrator's volumes on Daytona (the real SDK against the fake Daytona, whose
sandboxes are Docker containers): a volume mapped by name into every user's sandbox,
the lines for what Daytona cannot mount, and a changed mapping at the next start (its
own files are not kept there: Daytona cannot add a volume to a sandbox)."""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
from daytona import Daytona, DaytonaConfig

from sandbox_kernel.config import SandboxConfig
from sandbox_kernel.errors import NotSupported, SandboxFailed
from sandbox_kernel.identity import ScopeKey
from sandbox_kernel.service import SandboxService

from .fake_daytona import API_KEY, FakeDaytona
from .test_daytona import SNAPSHOT, start_fake

pytestmark = pytest.mark.docker


@pytest.fixture(scope="module")
def fake(tmp_path_factory: pytest.TempPathFactory) -> Iterator[FakeDaytona]:
    server = start_fake(tmp_path_factory.mktemp("fake-daytona-volumes"))
    yield server
    server.close()


@pytest.fixture(autouse=True)
def _daytona_env(fake: FakeDaytona, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("DAYTONA_API_KEY", API_KEY)
    monkeypatch.setenv("DAYTONA_API_URL", fake.url)
    monkeypatch.setenv("DAYTONA_TARGET", "us")


@pytest.fixture
def team_volume(fake: FakeDaytona) -> str:
    """A volume the administrator made for a team, ready."""
    client = Daytona(DaytonaConfig(api_key=API_KEY, api_url=fake.url, target="us"))
    volume = client.volume.get("team-data", create=True)
    deadline = time.monotonic() + 30
    while str(getattr(volume.state, "value", volume.state)) != "ready":
        assert time.monotonic() < deadline, "the volume never became ready"
        time.sleep(0.2)
        volume = client.volume.get("team-data")
    return "team-data"


@pytest.fixture
def service_for(
    make_config: Callable[..., SandboxConfig], test_user: str
) -> Iterator[Callable[..., SandboxService]]:
    made: list[SandboxService] = []

    def make(volumes: list[str]) -> SandboxService:
        service = SandboxService(
            make_config(backend="daytona", image=SNAPSHOT, volumes=volumes, user=test_user)
        )
        made.append(service)
        return service

    yield make
    for service in made[-1:]:
        for item in service.backend.list():
            service.backend.destroy(item.id)


def sh(service: SandboxService, sandbox_id: str, script: str) -> str:
    result = service.backend.exec(sandbox_id, ["sh", "-c", script])
    assert result.exit_code == 0, result.output
    return result.output.decode()


def test_a_volume_by_name_in_every_users_sandbox(
    service_for: Callable[..., SandboxService], team_volume: str, test_user: str
) -> None:
    service = service_for([f"{team_volume}:/team:rw"])
    mine = service.ensure(ScopeKey(test_user)).info
    assert mine.volumes == [
        {"source": "team-data", "target": "/team", "mode": "rw", "kind": "volume"}
    ]
    sh(service, mine.id, "echo shared > /team/note.txt")
    other = service.ensure(ScopeKey(f"{test_user}-2")).info
    assert sh(service, other.id, "cat /team/note.txt") == "shared\n"


def test_what_daytona_cannot_mount_is_said_in_one_line(
    service_for: Callable[..., SandboxService], team_volume: str, test_user: str, tmp_path: Path
) -> None:
    (tmp_path / "data").mkdir()
    cases: list[tuple[str, type[Exception], str]] = [
        (f"{tmp_path}/data:/data:rw", NotSupported, "Daytona cannot mount this host's folders"),
        (f"{team_volume}:/team:ro", NotSupported, "writable only"),
        ("no-such-volume:/m:rw", SandboxFailed, "Daytona has no volume named 'no-such-volume'"),
    ]
    for mapping, kind, said in cases:
        service = service_for([mapping])
        with pytest.raises(kind) as caught:
            service.ensure(ScopeKey(test_user))
        message = str(caught.value)
        assert said in message and message.startswith("mapping '") and "\n" not in message
        assert service.list(test_user) == []


def test_a_changed_mapping_makes_it_anew_at_the_next_start(
    service_for: Callable[..., SandboxService], team_volume: str, test_user: str
) -> None:
    first = service_for([])
    info = first.ensure(ScopeKey(test_user)).info
    sh(first, info.id, "echo kept > /workspace/mine.txt")
    second = service_for([f"{team_volume}:/team:rw"])
    (item,) = second.list(test_user)
    assert item["remake"] == (
        "made anew with them at its next start: its own files (installed packages) are not "
        "kept: the daytona backend cannot add folders to a sandbox; /workspace is kept"
    )
    second.stop(None, info.id)
    again: Any = second.ensure(ScopeKey(test_user))
    assert again.info.engine_id != info.engine_id
    assert sh(second, info.id, "cat /workspace/mine.txt; ls -d /team") == "kept\n/team\n"
    assert second.list(test_user)[0]["outdated"] == ""
