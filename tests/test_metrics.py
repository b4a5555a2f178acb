"""/metrics through a real Jupyter server: our families are there with help text, and
their values move with real actions (REST stop and start, a kernel-like start in
another service object, file bytes, a quota refusal, a preview request)."""

from __future__ import annotations

import asyncio
import re
import time
from collections.abc import Callable
from typing import Any

import pytest

from sandbox_kernel.config import SandboxConfig
from sandbox_kernel.errors import QuotaExceeded
from sandbox_kernel.identity import ScopeKey
from sandbox_kernel.service import SandboxService

from .test_rest_api import fetch

pytestmark = pytest.mark.docker


@pytest.fixture
def jp_server_config(rest_env: dict[str, str]) -> dict[str, Any]:
    return {
        "ServerApp": {"jpserver_extensions": {"jupyter_ext": True}},
        "SandboxExtension": {"gc_interval": 0, "metrics_interval": 0.2},
    }


async def scrape(jp_fetch: Any) -> str:
    return (await jp_fetch("metrics")).body.decode()


def value(text: str, name: str, **labels: str) -> float:
    """The sample ``name`` whose labels include ``labels`` (0 when absent)."""
    total = 0.0
    for line in text.splitlines():
        if not line.startswith(name + "{") and not line.startswith(name + " "):
            continue
        found = dict(re.findall(r'(\w+)="([^"]*)"', line.split("}")[0]))
        if all(found.get(k) == v for k, v in labels.items()):
            total += float(line.rsplit(" ", 1)[1])
    return total


async def until(jp_fetch: Any, check: Callable[[str], bool]) -> str:
    """Scrape until ``check`` holds (the gauge's listing is refreshed in the background)."""
    deadline = time.monotonic() + 30
    while True:
        text = await scrape(jp_fetch)
        if check(text) or time.monotonic() > deadline:
            return text
        await asyncio.sleep(0.2)


async def test_metrics_move_with_real_actions(
    jp_fetch: Any,
    rest_env: dict[str, str],
    make_config: Callable[..., SandboxConfig],
    test_user: str,
) -> None:
    before = await scrape(jp_fetch)
    for family in (
        "sandbox_kernel_sandboxes",
        "sandbox_kernel_starts_total",
        "sandbox_kernel_start_seconds",
        "sandbox_kernel_stops_total",
        "sandbox_kernel_quota_refusals_total",
        "sandbox_kernel_file_bytes_total",
        "sandbox_kernel_engine_errors_total",
        "sandbox_kernel_agent_sessions_total",
        "sandbox_kernel_engine_up",
    ):
        assert f"# HELP {family}" in before, family

    # A start in another process's way (a kernel makes its own service object).
    cfg = make_config(
        workspace_root=rest_env["SANDBOX_KERNEL_WORKSPACE_ROOT"],
        state_dir=rest_env["SANDBOX_KERNEL_STATE_DIR"],
    )
    info = await asyncio.to_thread(lambda: SandboxService(cfg).ensure(ScopeKey(test_user)).info)
    text = await until(
        jp_fetch,
        lambda t: value(t, "sandbox_kernel_sandboxes", state="running", backend="docker") >= 1,
    )
    assert value(text, "sandbox_kernel_starts_total", outcome="created") == (
        value(before, "sandbox_kernel_starts_total", outcome="created") + 1
    )
    assert value(text, "sandbox_kernel_start_seconds_count", backend="docker") >= 1
    assert value(text, "sandbox_kernel_sandboxes", state="running", flavor="small") == 1

    await fetch(jp_fetch, "api", "sandboxes", info.id, "stop", method="POST", body="")
    text = await until(
        jp_fetch, lambda t: value(t, "sandbox_kernel_sandboxes", state="stopped") == 1
    )
    assert value(text, "sandbox_kernel_stops_total", action="stop", reason="user") == 1
    await fetch(jp_fetch, "api", "sandboxes", info.id, "start", method="POST", body="")
    text = await scrape(jp_fetch)
    assert value(text, "sandbox_kernel_starts_total", outcome="started") == 1

    uploaded = value(text, "sandbox_kernel_file_bytes_total", door="rest", direction="upload")
    await fetch(
        jp_fetch,
        "api",
        "sandboxes",
        info.id,
        "files",
        "m.bin",
        method="PUT",
        body=b"x" * 1000,
        expect=201,
    )
    text = await scrape(jp_fetch)
    assert (
        value(text, "sandbox_kernel_file_bytes_total", door="rest", direction="upload")
        == uploaded + 1000
    )

    # A quota refusal, counted by the process that refused (here: this one).
    strict = make_config(
        workspace_root=rest_env["SANDBOX_KERNEL_WORKSPACE_ROOT"],
        state_dir=rest_env["SANDBOX_KERNEL_STATE_DIR"],
        max_sandboxes=1,
        scope="thread",
    )
    with pytest.raises(QuotaExceeded):
        await asyncio.to_thread(
            SandboxService(strict).ensure, ScopeKey(test_user, scope="thread", thread="other")
        )
    text = await scrape(jp_fetch)
    assert value(text, "sandbox_kernel_quota_refusals_total", quota="max_sandboxes") == 1
    assert value(text, "sandbox_kernel_starts_total", outcome="quota") == 1
