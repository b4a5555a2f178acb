"""The MCP tools about a user's sandboxes as a whole, through the official client over
stdio and HTTP, against real Docker: the mapped folders (get_volume_mappings), the
resources against the quotas (get_resource_stats), and the orphan clean-up that only an
administrator may run (cleanup_orphan_sandboxes)."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from jupyter_server.auth.identity import IdentityProvider, User

from sandbox_kernel.backends.base import sandbox_labels
from sandbox_kernel.identity import ScopeKey
from sandbox_kernel.service import SandboxService

from .conftest import remove_user_containers
from .kernel_env import KernelEnv, make_kernel_env
from .test_mcp import call, http_session, mcp_url, server_env, stdio, texts

pytestmark = pytest.mark.docker

NEW_TOOLS = {"get_volume_mappings", "get_resource_stats", "cleanup_orphan_sandboxes"}


@pytest.fixture(scope="module")
def folders(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    root = tmp_path_factory.mktemp("mapped")
    (root / "data").mkdir()
    (root / "data" / "readme.txt").write_text("a data set\n")
    (root / "cache").mkdir()
    return {"data": root / "data", "cache": root / "cache"}


@pytest.fixture(scope="module")
def kenv(tmp_path_factory: pytest.TempPathFactory, folders: dict[str, Path]) -> Iterator[KernelEnv]:
    volumes = [f"{folders['data']}:/data", f"{folders['cache']}:/cache:rw"]
    env = make_kernel_env(
        tmp_path_factory.mktemp("mcp-overview"),
        SANDBOX_KERNEL_VOLUMES=json.dumps(volumes),
        SANDBOX_KERNEL_MAX_SANDBOXES="50",
        SANDBOX_KERNEL_ORPHAN_GRACE="0",
    )
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("JUPYTER_PATH", env.jupyter_path)
        yield env
    remove_user_containers(env.user)


def make_orphan(kenv: KernelEnv, thread: str) -> str:
    """A sandbox of this installation that no one owns: made by the engine, never
    recorded (a process that died between the two); its id."""
    service = SandboxService(kenv.config())
    key = ScopeKey(kenv.user, "thread", thread)
    spec = service.spec(kenv.user)
    labels = sandbox_labels(key, spec, service.installation, "")
    return service.backend.create(key.name, key, spec, labels, lambda _m: None).id


async def test_stdio_schemas_mappings_stats_and_the_clean_up(
    kenv: KernelEnv, folders: dict[str, Path]
) -> None:
    async with stdio(kenv) as session:
        listed = {t.name: t for t in (await session.list_tools()).tools}
        assert NEW_TOOLS <= set(listed)
        mappings = listed["get_volume_mappings"]
        assert set(mappings.input_schema["properties"]) == {"sandbox_id"}
        assert mappings.input_schema.get("required", []) == []
        assert mappings.annotations and mappings.annotations.read_only_hint
        stats = listed["get_resource_stats"]
        assert stats.input_schema["properties"] == {}
        assert stats.annotations and stats.annotations.read_only_hint
        cleanup = listed["cleanup_orphan_sandboxes"]
        assert cleanup.input_schema["properties"]["dry_run"]["type"] == "boolean"
        assert cleanup.annotations and cleanup.annotations.destructive_hint

        made = await call(session, "execute_command", command="cat /data/readme.txt")
        assert not made.is_error and made.structured_content
        assert made.structured_content["stdout"] == "a data set\n"

        found = await call(session, "get_volume_mappings")
        assert not found.is_error, texts(found)
        data = found.structured_content or {}
        expected = [
            {
                "source": str(folders["data"]),
                "target": "/data",
                "mode": "ro",
                "kind": "host folder",
            },
            {
                "source": str(folders["cache"]),
                "target": "/cache",
                "mode": "rw",
                "kind": "host folder",
            },
        ]
        assert data["configured"] == expected
        (mine,) = data["sandboxes"]
        assert mine["id"] == f"sk-{kenv.user}" and mine["volumes"] == expected
        assert mine["outdated"] == ""
        said = texts(found)
        assert f"/data <- {folders['data']} (ro)" in said and "/cache" in said
        assert "writable (/cache)" in said
        one = await call(session, "get_volume_mappings", sandbox_id=f"sk-{kenv.user}")
        assert one.structured_content and len(one.structured_content["sandboxes"]) == 1
        unknown = await call(session, "get_volume_mappings", sandbox_id="sk-nobody-here")
        assert unknown.is_error and "not found" in texts(unknown)

        resources = await call(session, "get_resource_stats")
        assert not resources.is_error, texts(resources)
        stats_data = resources.structured_content or {}
        (usage,) = stats_data["sandboxes"]
        assert usage["id"] == f"sk-{kenv.user}" and usage["state"] == "running"
        assert usage["memory"] == 1 << 30 and usage["cpus"] == 1.0
        assert usage["memory_used"] is not None and usage["memory_used"] > 0
        assert stats_data["yours"]["sandboxes"] == 1 and stats_data["yours"]["running"] == 1
        quota = stats_data["quota"]
        assert quota["max_sandboxes"] == 50
        assert quota["sandboxes_left"] == 50 - stats_data["installation"]["sandboxes"]
        said = texts(resources)
        assert f"sk-{kenv.user}: running, flavor small (1 CPU)" in said
        assert "more sandboxes of 50" in said and "no limit on memory" in said

        # The one who runs the stdio server owns the state folder: an administrator.
        orphan = make_orphan(kenv, "left-behind")
        listing = await call(session, "cleanup_orphan_sandboxes", dry_run=True)
        assert not listing.is_error, texts(listing)
        planned = (listing.structured_content or {})["orphans"]
        assert [o["sandbox_id"] for o in planned] == [orphan]
        assert "would remove" in texts(listing) and "no owner record" in texts(listing)
        assert SandboxService(kenv.config()).backend.find(orphan) is not None
        done = await call(session, "cleanup_orphan_sandboxes")
        assert not done.is_error, texts(done)
        assert [o["done"] for o in (done.structured_content or {})["orphans"]] == [True]
        assert SandboxService(kenv.config()).backend.find(orphan) is None
        # The user's own sandbox is nobody's orphan.
        assert SandboxService(kenv.config()).backend.find(f"sk-{kenv.user}") is not None
        nothing = await call(session, "cleanup_orphan_sandboxes")
        assert "no orphans to remove now" in texts(nothing)


class HeaderIdentity(IdentityProvider):
    """Who is asking, from a test header (servers with several users)."""

    def get_user(self, handler: Any) -> User | None:
        name = handler.request.headers.get("X-Test-User")
        return User(username=name) if name else None


@pytest.fixture
def jp_server_config(
    request: pytest.FixtureRequest, kenv: KernelEnv, monkeypatch: pytest.MonkeyPatch
) -> dict[str, Any]:
    for name, value in server_env(kenv).items():
        if name.startswith("SANDBOX_KERNEL_"):
            monkeypatch.setenv(name, value)
    config: dict[str, Any] = {
        "ServerApp": {"jpserver_extensions": {"jupyter_ext": True}},
        "SandboxExtension": {"gc_interval": 0},
    }
    if "several_users" in request.node.name:
        monkeypatch.delenv("SANDBOX_KERNEL_USER")
        config["ServerApp"]["identity_provider_class"] = HeaderIdentity
        config["ServerApp"]["disable_check_xsrf"] = True
        config["SandboxExtension"]["owner_from"] = "request"
        config["SandboxExtension"]["admin_users"] = [f"{kenv.user}-admin"]
    return config


async def test_http_several_users_each_see_their_own_and_only_admins_clean_up(
    jp_fetch: Any, jp_serverapp: Any, kenv: KernelEnv
) -> None:
    url = mcp_url(jp_serverapp)
    alice, admin = f"{kenv.user}-alice", f"{kenv.user}-admin"
    try:
        async with http_session(url, {"X-Test-User": alice}) as a:
            assert NEW_TOOLS <= {t.name for t in (await a.list_tools()).tools}
            made = await call(a, "execute_command", command="ls /data /cache")
            assert not made.is_error, texts(made)
            found = await call(a, "get_volume_mappings")
            sandboxes = (found.structured_content or {})["sandboxes"]
            assert [s["id"] for s in sandboxes] == [f"sk-{alice}"]
            assert [v["mode"] for v in sandboxes[0]["volumes"]] == ["ro", "rw"]
            refused = await call(a, "cleanup_orphan_sandboxes", dry_run=True)
            assert refused.is_error
            message = texts(refused)
            assert "not yours to run" in message and len(message.splitlines()) == 1
            assert "Traceback" not in message
            async with http_session(url, {"X-Test-User": admin}) as b:
                theirs = await call(b, "get_volume_mappings", sandbox_id=f"sk-{alice}")
                assert theirs.is_error and "not allowed" in texts(theirs)
                stats = await call(b, "get_resource_stats")
                assert not stats.is_error, texts(stats)
                data = stats.structured_content or {}
                assert data["sandboxes"] == [] and f"sk-{alice}" not in texts(stats)
                assert f"sk-{alice}" not in json.dumps(data)
                allowed = await call(b, "cleanup_orphan_sandboxes", dry_run=True)
                assert not allowed.is_error, texts(allowed)
                assert (allowed.structured_content or {})["dry_run"] is True
    finally:
        remove_user_containers(alice)
        remove_user_containers(admin)


async def test_http_a_single_user_servers_owner_administers_it(
    jp_fetch: Any, jp_serverapp: Any, jp_auth_header: dict[str, str], kenv: KernelEnv
) -> None:
    async with http_session(mcp_url(jp_serverapp), jp_auth_header) as session:
        allowed = await call(session, "cleanup_orphan_sandboxes", dry_run=True)
        assert not allowed.is_error, texts(allowed)
        found = await call(session, "get_volume_mappings")
        assert [v["target"] for v in (found.structured_content or {})["configured"]] == [
            "/data",
            "/cache",
        ]
