"""Build hook that runs before the lab extension's build (see pyproject.toml).

Building from source compiles the JupyterLab panel with Node.js. Without it, the
extension builder fails deep inside yarn with a long traceback that never says
"install Node.js"; this hook says so in one line first. A tree whose panel is already
built (an sdist made by us, a second build) needs no Node.js and passes.
"""

from __future__ import annotations

import re
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any

from hatchling.builders.hooks.plugin.interface import BuildHookInterface

MIN_NODE = 18
BUILT = "jupyter_ext/labextension/static/style.js"
STALE_INSTALL_JSON = "jupyter_ext/labextension/install.json"


def node_problem(root: Path) -> str | None:
    """Why the lab extension cannot be built here, or None when it can (or need not be)."""
    if (root / BUILT).exists():
        return None
    node = shutil.which("node")
    if node is None:
        return (
            f"building sandbox-kernel from source needs Node.js {MIN_NODE} or newer for its JupyterLab panel, "
            "and `node` is not on PATH: install it (Debian/Ubuntu: apt-get install nodejs; conda: conda install nodejs), "
            "or install a built wheel"
        )
    try:
        found = subprocess.run(
            [node, "--version"], capture_output=True, text=True, timeout=30
        ).stdout.strip()
    except (OSError, subprocess.SubprocessError):
        found = ""
    match = re.match(r"v?(\d+)\.", found)
    if match is None or int(match.group(1)) < MIN_NODE:
        return (
            f"building sandbox-kernel from source needs Node.js {MIN_NODE} or newer for its JupyterLab panel; "
            f"{node} is {found or 'not runnable'}: install a newer one, or install a built wheel"
        )
    return None


class NodeCheckHook(BuildHookInterface):  # type: ignore[misc]
    """Stops the build with one clear line when Node.js is missing or too old."""

    PLUGIN_NAME = "custom"

    def initialize(self, version: str, build_data: dict[str, Any]) -> None:
        # An editable install leaves a copy of install.json in the built extension; the
        # wheel maps labextension/install.json to the same place, and a second
        # `pip install` in this checkout failed on the duplicate. It is rebuilt anyway.
        Path(self.root, STALE_INSTALL_JSON).unlink(missing_ok=True)
        problem = node_problem(Path(self.root))
        if problem:
            sys.stderr.write(f"\nerror: {problem}\n\n")
            raise SystemExit(1)
