"""The lab extension's unit tests (vitest, labextension/test/), run by pytest: the data
layer in node, and each React component of the panel in jsdom (test/components/).

They need labextension/node_modules, which `pip install .` (the wheel build) installs.
Without it they are skipped with the reason, or fail with SANDBOX_KERNEL_REQUIRE_BROWSER=1.
"""

from __future__ import annotations

import os
import shutil
import subprocess
from pathlib import Path

import pytest

LABEXTENSION = Path(__file__).resolve().parent.parent / "labextension"


def test_labextension_vitest() -> None:
    jlpm = shutil.which("jlpm")
    problem = None
    if jlpm is None:
        problem = "jlpm is missing (pip install jupyterlab or jupyter-builder)"
    elif not (LABEXTENSION / "node_modules" / "vitest").is_dir():
        problem = "labextension/node_modules is missing: `pip install .` or `cd labextension && jlpm install`"
    if problem:
        if os.environ.get("SANDBOX_KERNEL_REQUIRE_BROWSER") == "1":
            pytest.fail(f"the lab extension unit tests are required here but cannot run: {problem}")
        pytest.skip(problem)
    done = subprocess.run(
        [jlpm, "test"], cwd=LABEXTENSION, capture_output=True, text=True, timeout=240
    )
    assert done.returncode == 0, done.stdout[-4000:] + done.stderr[-2000:]
    assert "passed" in done.stdout
