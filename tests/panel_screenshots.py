"""Make the panel's pictures in docs/images/ again: ``python -m tests.panel_screenshots``.

A real JupyterLab with the installed extension and one Docker sandbox of the test image
(user ``alice``, a notebook folder ``analysis``), Debian's chromium at the default sidebar
width, light theme. It writes:

- ``panel.png``: the Sandboxes section with the running sandbox;
- ``panel-files.png``: the Files section showing its workspace.

Everything it makes (server, sandbox, folders) is removed at the end; sandboxes are found
by this run's own installation id, never by user name, so nobody else's are touched.
"""

from __future__ import annotations

import argparse
import json
import shutil
import socket
import sys
import tempfile
import urllib.request
from pathlib import Path
from typing import Any

from .lab_browser import (
    CHROMIUM,
    CHROMIUM_ARGS,
    Lab,
    _browser_problem,
    _open_lab,
    _run_first_cell,
)

DOCS_IMAGES = Path(__file__).resolve().parent.parent / "docs" / "images"

# A few files of an analysis, so the Files section shows what a workspace holds.
CELL = """import os
os.makedirs('/workspace/data', exist_ok=True)
os.makedirs('/workspace/results', exist_ok=True)
open('/workspace/data/measurements.csv', 'w').write('t,value\\n' + '0,1\\n' * 20000)
open('/workspace/results/summary.md', 'w').write('# Summary\\n')
open('/workspace/README.md', 'w').write('Notes for this project\\n' * 40)
open('/workspace/train.py', 'w').write('print(42)\\n' * 100)
print('ready')"""


def _port() -> int | None:
    """Jupyter's usual port when it is free here, so the WebDAV URL reads as users see it."""
    with socket.socket() as sock:
        try:
            sock.bind(("127.0.0.1", 8888))
        except OSError:
            return None
    return 8888


def _write_notebook(path: Path) -> None:
    cell = {
        "cell_type": "code",
        "execution_count": None,
        "id": "c1",
        "metadata": {},
        "outputs": [],
        "source": CELL,
    }
    kernelspec = {"name": "sandbox", "display_name": "Python 3 (sandbox)", "language": "python"}
    path.write_text(
        json.dumps(
            {
                "cells": [cell],
                "metadata": {"kernelspec": kernelspec},
                "nbformat": 4,
                "nbformat_minor": 5,
            }
        )
    )


def _section(page: Any, title: str) -> Any:
    return page.locator(".jp-SandboxPanel .jp-AccordionPanel-title", has_text=title)


def _show_only(page: Any, keep: str) -> None:
    """Expand the section titled ``keep`` and collapse the others."""
    for title in ("Sandboxes", "Snapshots", "Files"):
        header = _section(page, title)
        expanded = "lm-mod-expanded" in (header.get_attribute("class") or "")
        if expanded != (title == keep):
            header.click()
    page.wait_for_timeout(300)


def _shot(page: Any, bottom_of: Any, path: Path) -> None:
    """The panel from its top down to a little below ``bottom_of``."""
    panel = page.locator(".jp-SandboxPanel").bounding_box()
    end = bottom_of.bounding_box()
    height = min(panel["height"], end["y"] + end["height"] + 12 - panel["y"])
    page.screenshot(
        path=str(path),
        clip={"x": panel["x"], "y": panel["y"], "width": panel["width"], "height": height},
    )
    print(f"{path} ({path.stat().st_size // 1024} KiB)")


def _delete(lab: Lab, path: str) -> None:
    request = urllib.request.Request(
        f"{lab.url}/api/{path}", method="DELETE", headers={"Authorization": f"token {lab.token}"}
    )
    with urllib.request.urlopen(request, timeout=120):
        pass


def _remove_own_sandboxes(lab: Lab) -> None:
    """Destroy what this run made: through the server, then any container still labelled
    with this run's installation id (never another's)."""
    try:
        for item in lab.api("sandboxes"):
            _delete(lab, f"sandboxes/{item['id']}")
    except OSError as exc:
        print(f"listing the sandboxes failed ({exc}); removing by installation id")
    import docker

    from sandbox_kernel.backends import disks, idmap
    from sandbox_kernel.backends.base import LABEL_INSTALLATION, installation_id
    from sandbox_kernel.backends.docker.mounts import remove_mount_folder

    # The id the server derived from its state folder (SANDBOX_KERNEL_STATE_DIR, resolved).
    mine = installation_id(str((lab.root / "state").resolve()))
    client = docker.from_env()
    for container in client.containers.list(
        ignore_removed=True, all=True, filters={"label": f"{LABEL_INSTALLATION}={mine}"}
    ):
        container.remove(force=True)
        mount = container.labels.get("sandbox-kernel.workspace-mount")
        if mount:  # removed behind the server's back: its idmapped mount too
            idmap.unmount(Path(mount))
            remove_mount_folder(Path(mount).parent)
    disks.release_beneath(lab.root)  # the workspaces' disks, kept in its state folder


def make(out: Path, scale: float) -> None:
    """Start a lab, make alice's sandbox, and write the pictures into ``out``."""
    from playwright.sync_api import expect, sync_playwright

    out.mkdir(parents=True, exist_ok=True)
    root = Path(tempfile.mkdtemp(prefix="sk-panel-shots-"))
    lab = Lab(root, "alice", notebooks=root / "alice" / "analysis", port=_port())
    try:
        lab.start()
        _write_notebook(lab.notebooks / "explore.ipynb")
        with sync_playwright() as pw:
            browser = pw.chromium.launch(
                executable_path=CHROMIUM, args=CHROMIUM_ARGS, headless=True
            )
            context = browser.new_context(
                viewport={"width": 1200, "height": 1000}, device_scale_factor=scale
            )
            page = context.new_page()
            _open_lab(page, f"{lab.url}/lab/tree/explore.ipynb?token={lab.token}", [])
            _run_first_cell(page, "ready")
            page.locator(".jp-SideBar [data-id='sandbox-kernel-panel']").click()
            card = page.locator(".jp-SandboxPanel-card[data-sandbox-id='sk-alice']")
            expect(card.locator(".jp-SandboxPanel-cpu")).to_contain_text("%", timeout=30_000)
            _show_only(page, "Sandboxes")
            _shot(page, card, out / "panel.png")

            card.get_by_role("button", name="Browse files of sk-alice", exact=True).click()
            _show_only(page, "Files")
            files = page.locator(".jp-SandboxPanel-files")
            expect(files.locator("[data-path='train.py']")).to_be_visible(timeout=30_000)
            _shot(page, files.locator(".jp-SandboxPanel-list"), out / "panel-files.png")
            context.close()
            browser.close()
    finally:
        try:
            _remove_own_sandboxes(lab)
        finally:
            lab.stop()
            shutil.rmtree(root, ignore_errors=True)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, default=DOCS_IMAGES, help="folder of the PNGs")
    parser.add_argument("--scale", type=float, default=1.5, help="device pixels per CSS pixel")
    args = parser.parse_args(argv)
    problem = _browser_problem()
    if problem:
        print(f"cannot make the pictures: {problem}", file=sys.stderr)
        return 1
    make(args.out, args.scale)
    return 0


if __name__ == "__main__":
    sys.exit(main())
