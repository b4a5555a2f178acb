"""What the browser tests share: Debian's chromium driven by Playwright against a real
JupyterLab (its own server, settings, state and Docker sandboxes of the test image) with
the extension installed, and checks of what the panel shows at the default sidebar width.

Skipped with a reason when chromium, Playwright or the built extension is missing; with
``SANDBOX_KERNEL_REQUIRE_BROWSER=1`` (set by .ci/run) that is a failure instead.
"""

from __future__ import annotations

import asyncio
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
        self.chose_port = port is None  # a port of our choosing may be chosen again
        self.port = port or _free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.notebooks = notebooks or root / "notebooks"
        self.workspace = root / "workspaces" / user
        self.log = root / "lab.log"
        self.proc: subprocess.Popen[bytes] | None = None

    def start(self, tries: int = 3) -> None:
        """Start the server and wait until it answers; a port of our choosing that
        another process took first is chosen again, ``tries`` times in all."""
        self.notebooks.mkdir(parents=True, exist_ok=True)
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
                said = self.log.read_text()
                if self.chose_port and tries > 1 and f"port {self.port} is not available" in said:
                    # Another process took the free port between our look and the
                    # server's bind (xdist workers start servers and kernels at once).
                    self._log.close()
                    self.port = _free_port()
                    self.url = f"http://127.0.0.1:{self.port}"
                    return self.start(tries - 1)
                raise RuntimeError(f"jupyter lab exited: {said[-3000:]}")
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


def _run_first_cell(page: Any, output: str) -> None:
    """Run the open notebook's first cell once its kernel is connected and idle, and wait
    for ``output``. The notebook's execution indicator says idle before any kernel exists
    (its first state): a cell run then makes JupyterLab open its Select Kernel dialog and
    the cell never runs. The status bar names the kernel only once it is connected."""
    from playwright.sync_api import expect

    page.locator(".jp-Notebook .jp-Cell .cm-content").first.click()
    expect(
        page.locator("#jp-main-statusbar").get_by_text(re.compile(r"\(sandbox\) \| Idle$"))
    ).to_be_visible(timeout=60_000)
    page.keyboard.press("Shift+Enter")
    expect(page.locator(".jp-OutputArea-output").filter(has_text=output)).to_be_visible(
        timeout=120_000
    )


def _click_in_view(locator: Any) -> None:
    """A real mouse click: Playwright scrolls the element into view and fails (by timing
    out) when another element, such as the next section's title, would receive it."""
    locator.click()


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


def _agent_call(lab: Lab, tool: str, **arguments: Any) -> Any:
    """One MCP tool call to the lab server, as an agent would make it (own thread: the
    browser's sync API owns this one's event loop); its result, which is not an error."""
    from mcp import ClientSession
    from mcp.client.streamable_http import streamable_http_client
    from mcp.shared._httpx_utils import create_mcp_http_client

    async def call() -> Any:
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
            return result

    with concurrent.futures.ThreadPoolExecutor(1) as pool:
        return pool.submit(asyncio.run, call()).result(timeout=180)


def lambda_class(name: str) -> Any:
    return re.compile(rf"(^|\s){re.escape(name)}(\s|$)")
