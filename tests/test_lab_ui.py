"""The JupyterLab panel end to end: a real JupyterLab with the extension installed from
the wheel, a real Docker sandbox, Debian's chromium driven by Playwright.

Skipped with a reason when chromium, Playwright or the built extension is missing;
with ``SANDBOX_KERNEL_REQUIRE_BROWSER=1`` (set by .ci/run) that is a failure instead.
Runs at two window sizes (1000x700 and 1600x1000), clicking every action of the panel
with real mouse clicks at each. The panel keeps JupyterLab's default sidebar width
throughout, and at it the facts a user must read (the folder cells run in, the image,
the sandbox id, the Next line, the WebDAV URL) are checked to show whole: no ellipsis,
nothing clipped by its box, every line inside its card. Screenshots of the panel
(light, dark, files, WebDAV URL copied, server gone; one set per size) go to
tests/output/lab-ui/; the pictures of the docs are made by tests/panel_screenshots.py.
A second test opens the previews of a sandbox's ports from its card (an HTTP app and a
WebSocket app), in new tabs.
"""

from __future__ import annotations

import base64
import json
import os
import re
import time
import urllib.request
from pathlib import Path
from typing import Any

import pytest

from . import lab_browser
from .conftest import TEST_IMAGE
from .lab_browser import (
    CHROMIUM,
    CHROMIUM_ARGS,
    Lab,
    _agent_call,
    _assert_default_sidebar,
    _assert_readable,
    _click_in_view,
    _open_lab,
    _run_first_cell,
    lambda_class,
)

pytestmark = pytest.mark.docker

# The shared fixtures (a browser that works, a JupyterLab of the test's own), made this
# module's: pytest finds fixtures among a module's attributes.
browser_ready = lab_browser.browser_ready
lab = lab_browser.lab

OUTPUT = Path(__file__).resolve().parent / "output" / "lab-ui"
# Two folders deep with long names: the Files breadcrumb must stay on one line.
DEEP = (
    "a-folder-whose-name-is-rather-long-for-a-side-panel",
    "and-a-second-level-with-another-long-name",
)

# The browser window sizes the panel is driven at: a small laptop's and a large screen's.
VIEWPORTS = [pytest.param((1000, 700), id="1000x700"), pytest.param((1600, 1000), id="1600x1000")]


def _notebook(path: Path) -> None:
    # Files in the workspace (the panel's Files section: one to list, a deep folder for the
    # breadcrumb, a checkpoints folder and a dot-file it hides), one beside the notebook (JupyterLab's
    # own file browser: cells run in the notebook's folder).
    cell = (
        "import os\n"
        "open('/workspace/hello.txt', 'w').write('hi from the sandbox')\n"
        f"os.makedirs('/workspace/{DEEP[0]}/{DEEP[1]}', exist_ok=True)\n"
        "os.makedirs('/workspace/.ipynb_checkpoints', exist_ok=True)\n"
        "open('/workspace/.ipynb_checkpoints/hello-checkpoint.txt', 'w').write('old')\n"
        "open('/workspace/.notes', 'w').write('a dot-file')\n"
        "open('beside.txt', 'w').write('next to the notebook')\nprint('made', 'hello.txt')"
    )
    path.write_text(
        json.dumps(
            {
                "cells": [
                    {
                        "cell_type": "code",
                        "execution_count": None,
                        "id": "c1",
                        "metadata": {},
                        "outputs": [],
                        "source": cell,
                    }
                ],
                "metadata": {
                    "kernelspec": {
                        "name": "sandbox",
                        "display_name": "Python 3 (sandbox)",
                        "language": "python",
                    }
                },
                "nbformat": 4,
                "nbformat_minor": 5,
            }
        )
    )


# Figures that must not wrap inside: a number and its unit joined by a no-break space,
# and the text of each element on one line (a Range over it has one rectangle per line).
_ONE_LINE = """els => els.map(e => {
    const range = document.createRange();
    range.selectNodeContents(e);
    const lines = new Set(Array.from(range.getClientRects()).filter(r => r.width > 0).map(r => Math.round(r.top)));
    return { text: e.textContent, lines: lines.size };
})"""


def the_pages_own(errors: list[str], *expected: str) -> list[str]:
    """The console errors that are the page's, less those ``expected`` by the test.

    Chromium drops requests in flight when the host's network interfaces change, as they
    do whenever a container starts on this shared engine (``net::ERR_NETWORK_CHANGED``):
    the host's doing, not the page's, and JupyterLab asks again."""
    skip = ("net::ERR_NETWORK_CHANGED", *expected)
    return [e for e in errors if not any(word in e for word in skip)]


def _assert_sizes_unbroken(scope: Any) -> None:
    sizes = scope.locator(
        ".jp-SandboxPanel-size, .jp-SandboxPanel-memory, .jp-SandboxPanel-disk, .jp-SandboxPanel-snapshot .jp-SandboxPanel-sub"
    )
    found = sizes.evaluate_all(_ONE_LINE)
    assert found, "no sizes shown"
    for item in found:
        text = item["text"]
        assert not re.search(r"\d[ \t\n][KMGT]?i?B\b", text), (
            f"a breakable space inside a size: {text!r}"
        )
    for item in scope.locator(".jp-SandboxPanel-size").evaluate_all(_ONE_LINE):
        assert re.fullmatch(r"[\d.]+\u00a0[KMGT]?i?B", item["text"]), item
        assert item["lines"] == 1, f"a file size wraps: {item}"


@pytest.mark.parametrize("viewport", VIEWPORTS)
def test_panel_end_to_end(lab: Lab, tmp_path: Path, viewport: tuple[int, int]) -> None:
    from playwright.sync_api import expect, sync_playwright

    width, height = viewport
    size = f"{width}x{height}"
    OUTPUT.mkdir(parents=True, exist_ok=True)
    _notebook(lab.notebooks / "analysis.ipynb")
    sid = f"sk-{lab.user}"
    snap = f"{lab.user}-e2e"
    errors: list[str] = []
    big = tmp_path / "big.bin"
    big.write_bytes(os.urandom(1 << 20) * 24)  # 24 MiB: the upload shows progress
    with sync_playwright() as pw:
        browser = pw.chromium.launch(executable_path=CHROMIUM, args=CHROMIUM_ARGS, headless=True)
        context = browser.new_context(
            viewport={"width": width, "height": height},
            accept_downloads=True,
            permissions=["clipboard-read", "clipboard-write"],
        )
        page = context.new_page()
        page.on(
            "console", lambda m: errors.append(f"console: {m.text}") if m.type == "error" else None
        )
        page.on("pageerror", lambda e: errors.append(f"pageerror: {e}"))
        try:
            _open_lab(page, f"{lab.url}/lab/tree/analysis.ipynb?token={lab.token}", errors)
            # The notebook's kernel made the sandbox; run the cell in it.
            _run_first_cell(page, "made hello.txt")
            # What the cell wrote beside the notebook is in JupyterLab's file browser.
            expect(
                page.locator(
                    ".jp-DirListing-item[title*='beside.txt'], .jp-DirListing-itemText:has-text('beside.txt')"
                ).first
            ).to_be_visible(timeout=30_000)
            assert (lab.notebooks / "beside.txt").read_text() == "next to the notebook"

            # The status bar names the notebook's sandbox; clicking it reveals it in the panel.
            status = page.locator(".jp-SandboxStatus-label")
            expect(status).to_have_text(sid, timeout=30_000)
            status.click()
            panel = page.locator(".jp-SandboxPanel")
            card = page.locator(f".jp-SandboxPanel-card[data-sandbox-id='{sid}']")
            expect(card).to_be_visible(timeout=15_000)
            expect(card).to_have_class(lambda_class("jp-SandboxPanel-revealed"))
            expect(card.locator(".jp-SandboxPanel-dot-running")).to_be_visible()
            expect(card.locator(".jp-SandboxPanel-kernels")).to_have_text("1 kernel")
            # An agent's interpreter (MCP over HTTP) shows beside the kernel, and goes.
            expect(card.locator(".jp-SandboxPanel-agents")).to_have_count(0)
            _agent_call(lab, "execute_code", code="x = 1", session="ui-agent")
            agents = card.locator(".jp-SandboxPanel-agents")
            expect(agents).to_have_text("ui-agent", timeout=20_000)
            expect(card.locator(".jp-SandboxPanel-kernels")).to_have_text("1 kernel")
            _agent_call(lab, "stop_session", session="ui-agent")
            expect(agents).to_have_count(0, timeout=20_000)
            expect(card.locator(".jp-SandboxPanel-scope")).to_have_text("user")
            # At the default sidebar width every fact a user must read is there whole:
            # the folder the cells run in, the image, the WebDAV URL, the id, the CPUs.
            default_width = _assert_default_sidebar(page)
            listed = lab.api(f"sandboxes/{sid}")
            assert listed["work_folder"], listed  # the notebook's folder is mounted
            _assert_readable(card, ".jp-SandboxPanel-folder", listed["work_folder"])
            _assert_readable(card, ".jp-SandboxPanel-origin", TEST_IMAGE)
            _assert_readable(
                card, ".jp-SandboxPanel-davUrl", f"{lab.url}/sandbox-kernel/dav/{sid}/"
            )
            _assert_readable(card, ".jp-SandboxPanel-name", sid)
            _assert_readable(card, ".jp-SandboxPanel-cpu", "of 1 CPU", exact=False)
            _assert_disk_line(card, listed)
            expect(card.locator(".jp-SandboxPanel-memory")).to_contain_text(
                "/ 1.00 GiB", timeout=20_000
            )
            _check_webdav(
                page,
                card,
                f"{lab.url}/sandbox-kernel/dav/{sid}/",
                sid,
                OUTPUT / f"webdav-copied-{size}.png",
            )
            # The URL shown is a working share: the token as Basic password lists it.
            _propfind_ok(f"{lab.url}/sandbox-kernel/dav/{sid}/", lab.token)
            # The refresh button says how often the panel refreshes by itself (the setting).
            refresh = panel.locator("[data-command='sandbox-kernel:refresh']")
            expect(refresh).to_have_attribute("title", re.compile(r"every 5 s"))

            # One upload control, disabled and saying why until a sandbox's files are shown.
            upload = panel.locator("[data-command='sandbox-kernel:upload']")
            expect(panel.get_by_role("button", name=re.compile("upload", re.I))).to_have_count(1)
            # (a jp-button: the native button inside it is what is disabled)
            expect(upload.locator("button")).to_be_disabled()
            expect(upload).to_have_attribute("aria-disabled", "true")
            expect(upload).to_have_attribute(
                "title", re.compile("Browse files.* on a sandbox first")
            )

            # Files: the cell's file is listed and downloads; the checkpoints folder is not.
            _click_in_view(card.get_by_role("button", name=f"Browse files of {sid}", exact=True))
            files = page.locator(".jp-SandboxPanel-files")
            expect(files.locator("[data-path='hello.txt']")).to_be_visible(timeout=15_000)
            expect(files.locator("[data-path='.ipynb_checkpoints']")).to_have_count(0)
            expect(files.locator("[data-path='.notes']")).to_have_count(0)
            expect(files.locator(".jp-SandboxPanel-hiddenNote")).to_have_text("2 hidden items")
            expect(upload.locator("button")).to_be_enabled()
            expect(upload).to_have_attribute("aria-disabled", "false")
            expect(upload).to_have_attribute(
                "title", re.compile(f"Upload files into {re.escape(sid)}:/workspace")
            )
            expect(panel.get_by_role("button", name=re.compile("upload", re.I))).to_have_count(1)
            with page.expect_download() as download_info:
                _click_in_view(files.get_by_label("Download hello.txt"))
            assert Path(download_info.value.path()).read_text() == "hi from the sandbox"

            # Two long folder names deep, the breadcrumb stays one line, the folder shown at its end.
            _click_in_view(files.locator(f"[data-path='{DEEP[0]}'] button"))
            _click_in_view(files.locator(f"[data-path='{DEEP[0]}/{DEEP[1]}'] button"))
            crumbs = files.locator(".jp-SandboxPanel-crumbs")
            expect(crumbs.locator(".jp-SandboxPanel-crumb")).to_have_count(3)
            expect(files.locator(".jp-SandboxPanel-empty")).to_contain_text("Empty folder")
            line = crumbs.evaluate("""nav => {
                const box = nav.getBoundingClientRect();
                const parts = Array.from(nav.children).map(e => e.getBoundingClientRect());
                return {
                    tops: parts.map(r => Math.round(r.top)),
                    navHeight: box.height,
                    partHeight: Math.max(...parts.map(r => r.height)),
                    lastRight: parts[parts.length - 1].right,
                    lastWidth: parts[parts.length - 1].width,
                    navRight: box.right,
                };
            }""")
            assert len(set(line["tops"])) == 1, f"the breadcrumb wraps: {line}"
            assert line["navHeight"] < 2 * line["partHeight"], line
            assert line["lastRight"] <= line["navRight"] + 1 and line["lastWidth"] > 20, line
            files.screenshot(path=str(OUTPUT / f"files-deep-{size}.png"))
            _click_in_view(crumbs.locator(".jp-SandboxPanel-crumb").first)
            expect(files.locator("[data-path='hello.txt']")).to_be_visible(timeout=15_000)

            # Uploads by the button (with progress) and by drop.
            # A slow link (Chrome's throttling) so the large upload's progress bar can be seen.
            cdp = context.new_cdp_session(page)
            cdp.send("Network.enable")
            cdp.send(
                "Network.emulateNetworkConditions",
                {
                    "offline": False,
                    "latency": 0,
                    "downloadThroughput": -1,
                    "uploadThroughput": 8 << 20,
                },
            )
            with page.expect_file_chooser() as chooser_info:
                _click_in_view(upload)
            chooser_info.value.set_files(str(big))
            progress = files.get_by_role("progressbar", name="Uploading big.bin")
            expect(progress).to_be_visible(timeout=10_000)
            expect(progress).not_to_have_attribute("aria-valuenow", "0", timeout=10_000)
            expect(files.locator("[data-path='big.bin']")).to_be_visible(timeout=60_000)
            expect(progress).to_have_count(0)
            cdp.send(
                "Network.emulateNetworkConditions",
                {
                    "offline": False,
                    "latency": 0,
                    "downloadThroughput": -1,
                    "uploadThroughput": -1,
                },
            )
            assert (lab.workspace / "big.bin").read_bytes() == big.read_bytes()
            _drop_file(
                page, files.locator(".jp-SandboxPanel-dropzone"), "dropped.txt", "dropped in"
            )
            expect(files.locator("[data-path='dropped.txt']")).to_be_visible(timeout=30_000)
            assert (lab.workspace / "dropped.txt").read_text() == "dropped in"
            expect(files.locator("[data-path='big.bin'] .jp-SandboxPanel-size")).to_have_text(
                "24.0\u00a0MiB"
            )
            _click_in_view(files.get_by_role("button", name="Delete dropped.txt", exact=True))
            expect(page.locator(".jp-Dialog")).to_contain_text("Delete dropped.txt?")
            page.locator(".jp-Dialog-button.jp-mod-accept").click()
            expect(files.locator("[data-path='dropped.txt']")).to_have_count(0, timeout=30_000)
            assert not (lab.workspace / "dropped.txt").exists()

            page.locator(".jp-SandboxPanel").screenshot(
                path=str(OUTPUT / f"panel-light-{size}.png")
            )

            # Snapshot it (asks for a name); a second one with the same name shows the server's message.
            for attempt in range(2):
                _click_in_view(card.get_by_role("button", name=f"Snapshot {sid}", exact=True))
                dialog = page.locator(".jp-Dialog")
                dialog.locator("input").fill(snap)
                dialog.locator(".jp-Dialog-button.jp-mod-accept").click()
                if attempt == 0:
                    expect(
                        page.locator(f".jp-SandboxPanel-snapshot[data-snapshot='{snap}']")
                    ).to_be_visible(timeout=120_000)
                    expect(card.locator(".jp-SandboxPanel-state")).to_have_text(
                        "running", timeout=30_000
                    )
            expect(
                page.locator(".Toastify__toast").filter(has_text="already have a snapshot named")
            ).to_be_visible(timeout=30_000)

            # Start a new sandbox from the snapshot.
            _click_in_view(
                page.get_by_role("button", name=f"Start a new sandbox from {snap}", exact=True)
            )
            fresh = page.locator(".jp-SandboxPanel-card").filter(has_text=f"from snapshot {snap}")
            expect(fresh).to_be_visible(timeout=60_000)
            expect(page.locator(".jp-SandboxPanel-card")).to_have_count(2)
            expect(fresh.locator(".jp-SandboxPanel-dot-running")).to_be_visible(timeout=30_000)

            # Stop it from the keyboard (Tab from the card reaches its buttons), then start
            # and stop it again with the mouse.
            fresh_id = fresh.get_attribute("data-sandbox-id")
            fresh.focus()
            page.keyboard.press("Tab")
            expect(fresh.get_by_role("button", name=f"Stop {fresh_id}", exact=True)).to_be_focused()
            page.keyboard.press("Enter")
            expect(fresh.locator(".jp-SandboxPanel-dot-stopped")).to_be_visible(timeout=60_000)
            _click_in_view(fresh.get_by_role("button", name=f"Start {fresh_id}", exact=True))
            expect(fresh.locator(".jp-SandboxPanel-dot-running")).to_be_visible(timeout=60_000)
            _click_in_view(fresh.get_by_role("button", name=f"Stop {fresh_id}", exact=True))
            expect(fresh.locator(".jp-SandboxPanel-dot-stopped")).to_be_visible(timeout=60_000)
            # Stopped, it is removed after a while: the Next line (the longest fact) reads
            # whole at the default width, and so does its folder (none mounted: /workspace).
            assert _assert_default_sidebar(page) == default_width
            expect(fresh.locator(".jp-SandboxPanel-next")).to_contain_text(
                "removed (workspace kept) in", timeout=30_000
            )
            _assert_readable(
                fresh, ".jp-SandboxPanel-next", "removed (workspace kept) in", exact=False
            )
            fresh_listed = lab.api(f"sandboxes/{fresh_id}")
            _assert_readable(
                fresh, ".jp-SandboxPanel-folder", fresh_listed.get("work_folder") or "/workspace"
            )
            _assert_readable(fresh, ".jp-SandboxPanel-origin", f"snapshot {snap}")
            _assert_readable(fresh, ".jp-SandboxPanel-name", fresh_id)
            _assert_readable(
                fresh, ".jp-SandboxPanel-davUrl", f"{lab.url}/sandbox-kernel/dav/{fresh_id}/"
            )
            expect(fresh.locator(".jp-SandboxPanel-kernels")).to_have_text("0 kernels")
            # Sizes read whole, with both cards and the snapshot listed.
            _assert_sizes_unbroken(panel)
            page.locator(".jp-SandboxPanel").screenshot(
                path=str(OUTPUT / f"panel-two-cards-{size}.png")
            )

            # Settings (Settings Editor > Sandboxes) apply at once: hidden files shown,
            # the refresh interval changed.
            page.keyboard.press("Control+Comma")
            page.locator(".jp-PluginList-entry", has_text="Sandboxes").first.click()
            page.locator("input[id$='plugin_showHiddenFiles']").check()
            interval = page.locator("input[id$='plugin_refreshInterval']")
            interval.fill("2")
            interval.press("Tab")
            expect(files.locator("[data-path='.notes']")).to_be_visible(timeout=30_000)
            expect(files.locator("[data-path='.ipynb_checkpoints']")).to_have_count(
                0
            )  # a hidden pattern
            expect(files.locator(".jp-SandboxPanel-hiddenNote")).to_have_text("1 hidden item")
            expect(refresh).to_have_attribute("title", re.compile(r"every 2 s"), timeout=30_000)
            page.locator(
                ".lm-DockPanel-tabBar .lm-TabBar-tab.lm-mod-current .lm-TabBar-tabCloseIcon"
            ).click()

            # Dark theme: same panel, theme colours.
            page.locator(".lm-MenuBar-itemLabel", has_text="Settings").click()
            page.locator(".lm-Menu-itemLabel", has_text="Theme").first.hover()
            page.locator(".lm-Menu-itemLabel").get_by_text("JupyterLab Dark", exact=True).click()
            expect(page.locator("body[data-jp-theme-light='false']")).to_be_attached(timeout=30_000)
            page.wait_for_timeout(500)
            page.locator(".jp-SandboxPanel").screenshot(path=str(OUTPUT / f"panel-dark-{size}.png"))
            background = page.locator(".jp-SandboxPanel-card").first.evaluate(
                "e => getComputedStyle(e).backgroundColor"
            )
            assert _luminance(background) < 0.3, background

            # Destroy both sandboxes (the dialog says the workspace is kept), then the snapshot:
            # the notebook's own through the palette command, the other by its button.
            for target in (sid, fresh_id):
                if target == sid:
                    page.keyboard.press("Control+Shift+C")
                    page.locator(".lm-CommandPalette input").fill("Destroy Current Notebook")
                    page.keyboard.press("Enter")
                else:
                    _click_in_view(page.get_by_role("button", name=f"Destroy {target}", exact=True))
                expect(page.locator(".jp-Dialog")).to_contain_text(f"Destroy {target}?")
                expect(page.locator(".jp-Dialog")).to_contain_text("/workspace are kept")
                page.locator(".jp-Dialog-button.jp-mod-accept").click()
                expect(
                    page.locator(f".jp-SandboxPanel-card[data-sandbox-id='{target}']")
                ).to_have_count(0, timeout=60_000)
            expect(page.locator(".jp-SandboxPanel-sandboxes")).to_contain_text("No sandboxes")
            expect(status).to_have_text("sandbox: not started")
            assert lab.api("sandboxes") == []
            assert (lab.workspace / "hello.txt").exists()  # destroy keeps the workspace
            # With the sandbox gone, so are its files, and upload is disabled again.
            expect(upload.locator("button")).to_be_disabled()
            _click_in_view(page.get_by_role("button", name=f"Delete snapshot {snap}", exact=True))
            page.locator(".jp-Dialog-button.jp-mod-accept").click()
            expect(
                page.locator(f".jp-SandboxPanel-snapshot[data-snapshot='{snap}']")
            ).to_have_count(0, timeout=30_000)

            # Commands are in the palette.
            page.keyboard.press("Control+Shift+C")
            palette = page.locator(".lm-CommandPalette")
            palette.locator("input").fill("Sandbox")
            for label in (
                "Refresh Sandboxes",
                "Destroy Current Notebook’s Sandbox…",
                "Snapshot Current Notebook’s Sandbox…",
            ):
                expect(
                    palette.locator(".lm-CommandPalette-itemLabel", has_text=label)
                ).to_be_visible()
            page.keyboard.press("Escape")
            page.locator(".lm-MenuBar-itemLabel", has_text="Settings").click()
            page.locator(".lm-Menu-itemLabel", has_text="Theme").first.hover()
            page.locator(".lm-Menu-itemLabel").get_by_text("JupyterLab Light", exact=True).click()
            expect(page.locator("body[data-jp-theme-light='true']")).to_be_attached(timeout=30_000)

            # No console errors, but the 400 of the deliberate duplicate snapshot above.
            unexpected = the_pages_own(errors, "a snapshot named")
            assert not unexpected, unexpected

            # The server goes away: the panel says so instead of showing stale data.
            lab.stop()
            expect(page.locator(".jp-SandboxPanel-error")).to_contain_text(
                "Server unreachable", timeout=30_000
            )
            page.locator(".jp-SandboxPanel").screenshot(
                path=str(OUTPUT / f"panel-unreachable-{size}.png")
            )
        except Exception:
            page.screenshot(path=str(OUTPUT / f"failure-{size}.png"))
            raise
        finally:
            context.close()
            browser.close()
    print(f"\nscreenshots in {OUTPUT}; console errors seen: {errors}")


PREVIEW_APP = Path(__file__).with_name("preview_app.py")
LOOPBACK_NOTE = "listens on 127.0.0.1 only: start it on 0.0.0.0 to preview it"


def _wait_for_ports(lab: Lab, sid: str, ports: set[int]) -> None:
    """Until the server lists ``ports`` as listening in the sandbox (bounded)."""
    deadline = time.monotonic() + 60
    while True:
        listed = {p["port"] for p in lab.api(f"sandboxes/{sid}/ports")["ports"]}
        if ports <= listed:
            return
        assert time.monotonic() < deadline, f"{ports} do not listen in {sid}: {listed}"
        time.sleep(0.3)


def test_previews_in_the_browser(lab: Lab) -> None:
    """A running sandbox's card lists its listening ports; each link opens the port's
    preview in a new tab, through the signed preview path, isolated from Jupyter's
    origin: ``python3 -m http.server``'s page, and a page of tests/preview_app.py that
    exchanges a message with its app over a WebSocket. A port on loopback only has a
    note instead of a link, read whole at the default sidebar width."""
    from playwright.sync_api import expect, sync_playwright

    OUTPUT.mkdir(parents=True, exist_ok=True)
    # An agent (MCP over HTTP) starts the apps in the user's sandbox, as it would.
    _agent_call(lab, "write_file", path="index.html", content="<h1>hello from the sandbox</h1>")
    _agent_call(lab, "write_file", path="preview_app.py", content=PREVIEW_APP.read_text())
    _agent_call(
        lab,
        "execute_command",
        command="cd /workspace && (nohup python3 -m http.server 8000 >/dev/null 2>&1 &) "
        "&& (nohup python3 preview_app.py 8001 >/dev/null 2>&1 &)",
    )
    (sid,) = [s["id"] for s in lab.api("sandboxes")]
    _wait_for_ports(lab, sid, {8000, 8001})
    errors: list[str] = []
    with sync_playwright() as pw:
        browser = pw.chromium.launch(executable_path=CHROMIUM, args=CHROMIUM_ARGS, headless=True)
        context = browser.new_context(viewport={"width": 1000, "height": 700})
        page = context.new_page()
        page.on(
            "console", lambda m: errors.append(f"console: {m.text}") if m.type == "error" else None
        )
        page.on("pageerror", lambda e: errors.append(f"pageerror: {e}"))
        try:
            _open_lab(page, f"{lab.url}/lab?token={lab.token}", errors)
            page.locator(".jp-SideBar [data-id='sandbox-kernel-panel']").click()
            card = page.locator(f".jp-SandboxPanel-card[data-sandbox-id='{sid}']")
            expect(card).to_be_visible(timeout=30_000)
            web = card.get_by_role("link", name=f"Open port 8000 of {sid} in a new tab")
            app = card.get_by_role("link", name=f"Open port 8001 of {sid} in a new tab")
            expect(web).to_be_visible(timeout=30_000)
            expect(app).to_be_visible()
            assert web.get_attribute("href") == f"{lab.url}/sandbox-kernel/proxy/{sid}/8000/"
            assert web.get_attribute("target") == "_blank"
            assert set((web.get_attribute("rel") or "").split()) == {"noopener", "noreferrer"}

            # An app on loopback only, started now: the refresh button reads it, with a note.
            _agent_call(
                lab,
                "execute_command",
                command="(nohup python3 -m http.server 8002 --bind 127.0.0.1 >/dev/null 2>&1 &)",
            )
            _wait_for_ports(lab, sid, {8002})
            _click_in_view(
                card.get_by_role("button", name=f"Read the listening ports of {sid} again")
            )
            loopback = card.locator("[data-port='8002'] .jp-SandboxPanel-portLoopback")
            expect(loopback).to_have_text(LOOPBACK_NOTE, timeout=30_000)
            expect(card.locator("[data-port='8002'] a")).to_have_count(0)
            _assert_default_sidebar(page)
            _assert_readable(
                card, "[data-port='8002'] .jp-SandboxPanel-portLoopback", LOOPBACK_NOTE
            )
            _assert_readable(card, "[data-port='8000'] .jp-SandboxPanel-portLink", "8000")
            _assert_readable(card, ".jp-SandboxPanel-portsLabel", "Ports")
            card.locator(".jp-SandboxPanel-ports").scroll_into_view_if_needed()
            page.locator(".jp-SandboxPanel").screenshot(path=str(OUTPUT / "ports-panel.png"))

            # http.server's page, in a new tab: the signed preview path, no token in it,
            # an origin of its own (no cookies of Jupyter's), no way back to the opener.
            with context.expect_page() as opened:
                _click_in_view(web)
            tab = opened.value
            expect(tab.locator("h1")).to_have_text("hello from the sandbox", timeout=30_000)
            assert "/sandbox-kernel/preview/" in tab.url and "token" not in tab.url, tab.url
            assert tab.evaluate("() => window.opener") is None
            cookies = tab.evaluate(
                "() => { try { return document.cookie; } catch (e) { return e.name; } }"
            )
            assert cookies == "SecurityError", cookies
            tab.screenshot(path=str(OUTPUT / "preview-http-server.png"))

            # The WebSocket app's page: its script talks to the app through the proxy.
            with context.expect_page() as opened:
                _click_in_view(app)
            ws_tab = opened.value
            expect(ws_tab.locator("#answer")).to_have_text(
                "echo:hello from the page", timeout=30_000
            )
            assert "/sandbox-kernel/preview/" in ws_tab.url, ws_tab.url
            ws_tab.screenshot(path=str(OUTPUT / "preview-websocket.png"))
            unexpected = the_pages_own(errors)
            assert not unexpected, unexpected
        except Exception:
            page.screenshot(path=str(OUTPUT / "failure-previews.png"))
            raise
        finally:
            context.close()
            browser.close()


def _assert_disk_line(card: Any, listed: dict[str, Any]) -> None:
    """A Disk line where the server gives disk use or size, with the figures it gives,
    and none where it gives neither."""
    from playwright.sync_api import expect

    disk = card.locator(".jp-SandboxPanel-disk")
    limit = (listed.get("limits") or {}).get("disk")
    used = (listed.get("usage") or {}).get("disk")
    if limit is None and used is None:
        expect(disk).to_have_count(0)
        return
    expect(disk).to_have_count(1)
    if limit:
        expect(disk).to_contain_text(" / ")
    _assert_readable(card, ".jp-SandboxPanel-disk", "B", exact=False)


def _check_webdav(page: Any, card: Any, expected: str, sid: str, shot: Path) -> None:
    """The card shows the workspace's WebDAV URL (absolute, whole, inside the card), a
    copy button that says "Copied" (the Clipboard API, then the `copy` command when the
    API refuses) and the mount hint."""
    from playwright.sync_api import expect

    url = card.locator(".jp-SandboxPanel-davUrl")
    status = card.locator(".jp-SandboxPanel-davStatus")
    expect(url).to_have_text(expected)
    expect(url).to_have_attribute("title", expected)
    expect(card.locator(".jp-SandboxPanel-mountHint")).to_contain_text(
        "your Jupyter token as password"
    )
    # The long URL wraps in its own box: nothing sticks out of the card, no sideways scroll.
    box = card.evaluate("""card => {
        const own = card.getBoundingClientRect();
        const right = sel => card.querySelector(sel).getBoundingClientRect().right;
        const body = card.closest('.jp-SandboxPanel-body');
        return { url: right('.jp-SandboxPanel-davUrl'), copy: right('.jp-SandboxPanel-copy'),
                 card: own.right, scroll: body.scrollWidth - body.clientWidth };
    }""")
    assert max(box["url"], box["copy"]) <= box["card"], box
    assert box["scroll"] <= 0, f"the sandboxes list scrolls sideways: {box}"
    copy = card.get_by_role("button", name=f"Copy the WebDAV URL of {sid}", exact=True)
    page.evaluate("navigator.clipboard.writeText('')")
    _click_in_view(copy)
    expect(status).to_have_text("Copied")
    card.locator(".jp-SandboxPanel-dav").scroll_into_view_if_needed()
    page.locator(".jp-SandboxPanel-sandboxes").screenshot(path=str(shot))
    assert page.evaluate("navigator.clipboard.readText()") == expected
    expect(status).to_have_text("", timeout=10_000)  # the confirmation goes away
    # A Clipboard API that refuses (as without permission): the copy command does it.
    page.evaluate("""async () => {
        await navigator.clipboard.writeText('');
        navigator.clipboard.writeText = () => Promise.reject(new DOMException('no', 'NotAllowedError'));
    }""")
    _click_in_view(copy)
    expect(status).to_have_text("Copied")
    assert page.evaluate("navigator.clipboard.readText()") == expected
    # Neither works: the panel says so and selects the URL for the keyboard's copy.
    page.evaluate("document.execCommand = () => false")
    _click_in_view(copy)
    expect(status).to_contain_text("copy the selected URL by hand")
    assert page.evaluate("window.getSelection().toString()") == expected


def _propfind_ok(url: str, token: str) -> None:
    basic = base64.b64encode(f"anyone:{token}".encode()).decode()
    request = urllib.request.Request(
        url, method="PROPFIND", headers={"Depth": "1", "Authorization": f"Basic {basic}"}
    )
    with urllib.request.urlopen(request, timeout=30) as response:
        assert response.status == 207 and b"multistatus" in response.read()


def _drop_file(page: Any, target: Any, name: str, text: str) -> None:
    """Drag-and-drop a file onto ``target`` the way a browser does it (a DataTransfer)."""
    transfer = page.evaluate_handle(
        """([name, text]) => {
            const dt = new DataTransfer();
            dt.items.add(new File([text], name, { type: 'text/plain' }));
            return dt;
        }""",
        [name, text],
    )
    target.dispatch_event("dragover", {"dataTransfer": transfer})
    target.dispatch_event("drop", {"dataTransfer": transfer})


def _luminance(css_color: str) -> float:
    parts = [
        float(p) for p in css_color[css_color.index("(") + 1 : css_color.index(")")].split(",")[:3]
    ]
    return sum(w * c / 255 for w, c in zip((0.2126, 0.7152, 0.0722), parts, strict=True))
