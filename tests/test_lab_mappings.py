"""A sandbox's card shows the administrator's folders mapped into it, each read whole at
JupyterLab's default sidebar width (a real JupyterLab, Docker sandbox and chromium)."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path

import pytest

from . import lab_browser
from .conftest import remove_user_containers
from .lab_browser import (
    CHROMIUM,
    CHROMIUM_ARGS,
    Lab,
    _agent_call,
    _assert_default_sidebar,
    _assert_readable,
    _open_lab,
)

pytestmark = pytest.mark.docker

browser_ready = lab_browser.browser_ready
OUTPUT = Path(__file__).resolve().parent / "output" / "lab-ui"


@pytest.fixture
def long_folders(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> list[Path]:
    """A data set and a team cache with long host paths, mapped for the lab's sandboxes."""
    data = tmp_path / "shared-datasets" / "natural-language-corpora-2026" / "english-news"
    cache = tmp_path / "team-caches" / "nlp-research-group" / "huggingface-hub"
    for folder in (data, cache):
        folder.mkdir(parents=True)
    volumes = [f"{data}:/data/corpora", f"{cache}:/cache/huggingface:rw"]
    monkeypatch.setenv("SANDBOX_KERNEL_VOLUMES", json.dumps(volumes))
    return [data, cache]


@pytest.fixture
def lab(
    long_folders: list[Path], browser_ready: None, tmp_path: Path, test_user: str
) -> Iterator[Lab]:
    """A JupyterLab of the test's own, started with the mappings in its environment."""
    server = Lab(tmp_path, test_user)
    try:
        server.start()
        yield server
    finally:
        server.stop()
        remove_user_containers(test_user)


def test_a_card_shows_its_mapped_folders_whole(lab: Lab, long_folders: list[Path]) -> None:
    from playwright.sync_api import expect, sync_playwright

    OUTPUT.mkdir(parents=True, exist_ok=True)
    _agent_call(lab, "execute_command", command="ls /data/corpora /cache/huggingface")
    (sid,) = [s["id"] for s in lab.api("sandboxes")]
    data, cache = long_folders
    with sync_playwright() as pw:
        browser = pw.chromium.launch(executable_path=CHROMIUM, args=CHROMIUM_ARGS, headless=True)
        context = browser.new_context(viewport={"width": 1000, "height": 700})
        page = context.new_page()
        errors: list[str] = []
        try:
            _open_lab(page, f"{lab.url}/lab?token={lab.token}", errors)
            page.locator(".jp-SideBar [data-id='sandbox-kernel-panel']").click()
            card = page.locator(f".jp-SandboxPanel-card[data-sandbox-id='{sid}']")
            expect(card).to_be_visible(timeout=30_000)
            mapped = card.locator(".jp-SandboxPanel-mapping")
            expect(mapped).to_have_count(2, timeout=30_000)
            _assert_default_sidebar(page)
            _assert_readable(
                card,
                ".jp-SandboxPanel-mapping[data-mode='ro']",
                f"/data/corpora ← {data} · read-only",
            )
            _assert_readable(
                card,
                ".jp-SandboxPanel-mapping[data-mode='rw']",
                f"/cache/huggingface ← {cache} · writable",
            )
            card.locator(".jp-SandboxPanel-mapped").scroll_into_view_if_needed()
            page.locator(".jp-SandboxPanel").screenshot(path=str(OUTPUT / "mapped-folders.png"))
        except Exception:
            page.screenshot(path=str(OUTPUT / "failure-mapped-folders.png"))
            raise
        finally:
            context.close()
            browser.close()
