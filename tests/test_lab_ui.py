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
"""

from __future__ import annotations

import asyncio
import base64
import concurrent.futures
import json
import os
import re
import shutil
import socket
import subprocess
import sys
import time
import urllib.request
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from .conftest import TEST_IMAGE, remove_user_containers, remove_user_snapshots

pytestmark = pytest.mark.docker

OUTPUT = Path(__file__).resolve().parent / "output" / "lab-ui"
CHROMIUM = (
    os.environ.get("SANDBOX_KERNEL_CHROMIUM") or shutil.which("chromium") or "/usr/bin/chromium"
)
EXTENSION = "sandbox-kernel-labextension"
CHROMIUM_ARGS = [
    "--no-sandbox",
    "--disable-gpu",
    "--disable-background-networking",
    "--disable-component-update",
]


def _browser_problem() -> str | None:
    if not Path(CHROMIUM).exists():
        return f"no chromium at {CHROMIUM} (apt-get install chromium)"
    try:
        import playwright.sync_api  # noqa: F401
    except ImportError:
        return "the Python playwright package is missing (pip install playwright)"
    from jupyter_core.paths import jupyter_path

    if not any(
        (Path(p) / EXTENSION / "package.json").is_file() for p in jupyter_path("labextensions")
    ):
        return f"the lab extension {EXTENSION} is not installed (pip install . builds it)"
    return None


@pytest.fixture(scope="module")
def browser_ready() -> None:
    problem = _browser_problem()
    if problem is None:
        return
    if os.environ.get("SANDBOX_KERNEL_REQUIRE_BROWSER") == "1":
        pytest.fail(f"the browser test is required here but cannot run: {problem}")
    pytest.skip(problem)


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


class Lab:
    """A JupyterLab server of its own for one user, on Docker sandboxes of the test image,
    with its settings, state and workspaces under ``root`` and its notebooks in
    ``notebooks`` (default ``root/notebooks``)."""

    def __init__(
        self, root: Path, user: str, notebooks: Path | None = None, port: int | None = None
    ) -> None:
        self.root = root
        self.user = user
        self.token = uuid.uuid4().hex
        self.port = port or _free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.notebooks = notebooks or root / "notebooks"
        self.workspace = root / "workspaces" / user
        self.log = root / "lab.log"
        self.proc: subprocess.Popen[bytes] | None = None

    def start(self) -> None:
        self.notebooks.mkdir(parents=True)
        env = {
            **os.environ,
            "SANDBOX_KERNEL_BACKEND": "docker",
            "SANDBOX_KERNEL_IMAGE": TEST_IMAGE,
            "SANDBOX_KERNEL_WORKSPACE_ROOT": str(self.root / "workspaces"),
            "SANDBOX_KERNEL_STATE_DIR": str(self.root / "state"),
            "SANDBOX_KERNEL_USER": self.user,
            "JUPYTERLAB_SETTINGS_DIR": str(self.root / "lab-settings"),
            "JUPYTERLAB_WORKSPACES_DIR": str(self.root / "lab-workspaces"),
            "JUPYTER_RUNTIME_DIR": str(self.root / "runtime"),
        }
        cmd = [
            sys.executable,
            "-m",
            "jupyterlab",
            "--no-browser",
            "--ServerApp.allow_root=True",
            f"--ServerApp.token={self.token}",
            f"--ServerApp.port={self.port}",
            "--ServerApp.port_retries=0",
            "--ServerApp.ip=127.0.0.1",
            f"--ServerApp.root_dir={self.notebooks}",
            "--SandboxExtension.gc_interval=0",
            "--LabApp.news_url=",
            "--LabApp.check_for_updates_class=jupyterlab.NeverCheckForUpdate",
        ]
        self._log = self.log.open("wb")
        self.proc = subprocess.Popen(
            cmd, env=env, stdout=self._log, stderr=subprocess.STDOUT, cwd=self.root
        )
        deadline = time.monotonic() + 90
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise RuntimeError(f"jupyter lab exited: {self.log.read_text()[-3000:]}")
            try:
                with urllib.request.urlopen(f"{self.url}/api/status?token={self.token}", timeout=2):
                    return
            except OSError:
                time.sleep(0.5)
        raise RuntimeError(f"jupyter lab did not answer: {self.log.read_text()[-3000:]}")

    def api(self, path: str) -> Any:
        with urllib.request.urlopen(
            f"{self.url}/api/{path}?token={self.token}", timeout=30
        ) as response:
            return json.loads(response.read() or b"null")

    def stop(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(20)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(10)
        self._log.close()


@pytest.fixture
def lab(browser_ready: None, tmp_path: Path, test_user: str) -> Iterator[Lab]:
    server = Lab(tmp_path, test_user)
    try:
        server.start()
        yield server
    finally:
        server.stop()
        remove_user_containers(test_user)
        remove_user_snapshots(test_user)


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


def _open_lab(page: Any, url: str, errors: list[str]) -> None:
    """Open JupyterLab and wait for its theme. On a loaded machine JupyterLab itself now
    and then fails to load its theme stylesheet ("Error Loading Theme" dialog, before any
    of our code runs; seen with the panel untouched too): load the page again then, and
    drop the console errors of that failed load."""
    from playwright.sync_api import expect

    for attempt in range(3):
        page.goto(url)
        themed = page.locator("body[data-jp-theme-name]")
        theme_error = page.locator(".jp-Dialog", has_text="Error Loading Theme")
        expect(themed.or_(theme_error).first).to_be_attached(timeout=90_000)
        page.wait_for_timeout(500)  # a failed theme load shows its dialog on the themed page
        if theme_error.count() == 0:
            return
        print(
            f"JupyterLab failed to load its theme (attempt {attempt + 1}); loading the page again"
        )
        errors.clear()
    raise AssertionError("JupyterLab failed to load its theme three times")


def _click_in_view(locator: Any) -> None:
    """A real mouse click: Playwright scrolls the element into view and fails (by timing
    out) when another element, such as the next section's title, would receive it."""
    locator.click()


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
            # Run the cell: its kernel makes the sandbox.
            page.locator(".jp-Notebook .jp-Cell .cm-content").first.click()
            expect(
                page.locator(".jp-Notebook-ExecutionIndicator[data-status='idle']")
            ).to_be_visible(timeout=60_000)
            page.keyboard.press("Shift+Enter")
            expect(
                page.locator(".jp-OutputArea-output").filter(has_text="made hello.txt")
            ).to_be_visible(timeout=120_000)
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
            unexpected = [e for e in errors if "a snapshot named" not in e]
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


def _assert_default_sidebar(page: Any) -> int:
    """The panel is at JupyterLab's default sidebar width (nothing in the test resizes
    it): the width a new user sees. Returns it in CSS pixels."""
    found = page.locator(".jp-SandboxPanel").evaluate("""panel => ({
        width: panel.getBoundingClientRect().width,
        min: parseFloat(getComputedStyle(document.body).getPropertyValue('--jp-sidebar-min-width')),
    })""")
    print(f"panel width {found['width']}px (--jp-sidebar-min-width {found['min']}px)")
    assert found["min"] > 0 and abs(found["width"] - found["min"]) <= 1, found
    return round(found["width"])


# What a text element shows and where: its whole text, whether its box cuts it (an
# ellipsis or hidden overflow shows as scrollWidth > clientWidth), and the left and
# right edges of its lines against its card's (or section's) box.
_SHOWN = """e => {
    const box = (e.closest('.jp-SandboxPanel-card') || e.closest('.jp-SandboxPanel-body'))
        .getBoundingClientRect();
    const range = document.createRange();
    range.selectNodeContents(e);
    const lines = Array.from(range.getClientRects()).filter(r => r.width > 0);
    const style = getComputedStyle(e);
    return {
        text: e.textContent,
        scrollWidth: e.scrollWidth, clientWidth: e.clientWidth,
        scrollHeight: e.scrollHeight, clientHeight: e.clientHeight,
        left: Math.min(...lines.map(r => r.left)), right: Math.max(...lines.map(r => r.right)),
        boxLeft: box.left, boxRight: box.right,
        lines: new Set(lines.map(r => Math.round(r.top))).size,
        textOverflow: style.textOverflow, visible: lines.length > 0,
    };
}"""


def _assert_readable(scope: Any, selector: str, expected: str, exact: bool = True) -> None:
    """The one element ``selector`` in ``scope`` shows ``expected`` whole (or, not
    ``exact``, a text containing it): no part cut by an ellipsis or its box, every line
    inside its card, so it is read without a tooltip at the width the panel has."""
    element = scope.locator(selector)
    shown = element.evaluate(_SHOWN)
    text = shown["text"]
    assert (text == expected) if exact else (expected in text), (selector, shown)
    assert shown["visible"], (selector, shown)
    assert shown["scrollWidth"] <= shown["clientWidth"], f"{selector} is cut: {shown}"
    assert shown["scrollHeight"] <= shown["clientHeight"] + 1, f"{selector} is cut: {shown}"
    assert shown["left"] >= shown["boxLeft"] - 0.5, f"{selector} sticks out left: {shown}"
    assert shown["right"] <= shown["boxRight"] + 0.5, f"{selector} sticks out right: {shown}"
    print(f"{selector}: {text!r} on {shown['lines']} line(s), {shown['clientWidth']}px wide")


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


def _agent_call(lab: Lab, tool: str, **arguments: Any) -> None:
    """One MCP tool call to the lab server, as an agent would make it (own thread: the
    browser's sync API owns this one's event loop)."""
    from mcp import ClientSession
    from mcp.client.streamable_http import streamable_http_client
    from mcp.shared._httpx_utils import create_mcp_http_client

    async def call() -> None:
        headers = {"Authorization": f"token {lab.token}"}
        async with (
            create_mcp_http_client(headers=headers) as http,
            streamable_http_client(f"{lab.url}/sandbox-kernel/mcp", http_client=http) as (
                read,
                write,
            ),
            ClientSession(read, write) as session,
        ):
            await session.initialize()
            result = await session.call_tool(tool, arguments)
            assert not result.is_error, result.content

    with concurrent.futures.ThreadPoolExecutor(1) as pool:
        pool.submit(asyncio.run, call()).result(timeout=180)


def _propfind_ok(url: str, token: str) -> None:
    basic = base64.b64encode(f"anyone:{token}".encode()).decode()
    request = urllib.request.Request(
        url, method="PROPFIND", headers={"Depth": "1", "Authorization": f"Basic {basic}"}
    )
    with urllib.request.urlopen(request, timeout=30) as response:
        assert response.status == 207 and b"multistatus" in response.read()


def lambda_class(name: str) -> Any:
    return re.compile(rf"(^|\s){re.escape(name)}(\s|$)")


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
