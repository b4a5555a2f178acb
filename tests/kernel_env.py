"""A `sandbox` kernelspec pointed at the Docker test image, for kernel-level tests.

The spec's ``env`` carries the settings (backend, image, workspace, user), so every
kernel started from it, by jupyter_client, nbclient or ``jupyter execute``, lands in
the same test sandbox, exactly as a user's kernelspec variant would.
"""

from __future__ import annotations

import json
import os
import sys
import tempfile
import uuid
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import jupyter_kernel_test
import pytest

from sandbox_kernel.config import SandboxConfig, load_config
from sandbox_kernel.kernelspec import kernelspec

from .conftest import TEST_IMAGE, release_disks

REPO = Path(__file__).resolve().parent.parent


@dataclass
class KernelEnv:
    root: Path
    user: str
    kernel_name: str = "sandbox"

    @property
    def jupyter_path(self) -> str:
        return str(self.root / "share")

    @property
    def workspace(self) -> Path:
        return self.root / "workspaces" / self.user

    def config(self, **overrides: Any) -> SandboxConfig:
        """The settings this kernelspec's kernels run with, for the same sandboxes from
        the test (a service, the reaper), with ``overrides``."""
        values: dict[str, Any] = {
            "backend": "docker",
            "image": TEST_IMAGE,
            "workspace_root": str(self.root / "workspaces"),
            "state_dir": str(self.root / "state"),
            "user": self.user,
        }
        return load_config(environ={}, **{**values, **overrides})

    def environ(self) -> dict[str, str]:
        """Environment for a process (jupyter execute) that should find the test kernelspec."""
        env = dict(os.environ)
        # A tool the test starts itself is no door of the test's in-process Jupyter server
        # (whose extension put its root folder in this process's environment).
        env.pop("SANDBOX_KERNEL_SERVER_ROOT", None)
        env["JUPYTER_PATH"] = self.jupyter_path
        env["PYTHONPATH"] = str(REPO)
        return env


def make_kernel_env(root: Path, **settings: str) -> KernelEnv:
    """Write kernelspec ``sandbox`` under root/share/kernels with the test settings."""
    kenv = KernelEnv(root=root, user=f"test-k{uuid.uuid4().hex[:8]}")
    spec_dir = root / "share" / "kernels" / kenv.kernel_name
    spec_dir.mkdir(parents=True, exist_ok=True)
    env = {
        "PYTHONPATH": str(REPO),
        "SANDBOX_KERNEL_BACKEND": "docker",
        "SANDBOX_KERNEL_IMAGE": TEST_IMAGE,
        "SANDBOX_KERNEL_WORKSPACE_ROOT": str(root / "workspaces"),
        "SANDBOX_KERNEL_STATE_DIR": str(root / "state"),
        "SANDBOX_KERNEL_USER": kenv.user,
        # Tests start kernels from the repository: no host folder unless a test asks.
        "SANDBOX_KERNEL_WORK_ROOT": "none",
        **settings,
    }
    spec = kernelspec("Python 3 (sandbox, tests)", env, python=sys.executable)
    (spec_dir / "kernel.json").write_text(json.dumps(spec, indent=1))
    kenv.workspace.mkdir(parents=True, exist_ok=True)
    return kenv


class ConformanceSuite(jupyter_kernel_test.KernelTests):
    """jupyter_kernel_test's suite with our samples, run against one backend per subclass.

    A subclass says how its sandboxes are reached (:meth:`settings`) and cleaned up
    (:meth:`clean_up`); the kernelspec, JUPYTER_PATH and temporary folder are handled here.
    """

    __test__ = False  # collected through the backends' subclasses only

    kernel_name = "sandbox"
    language_name = "python"
    file_extension = ".py"
    code_hello_world = "print('hello, world')"
    code_stderr = "import sys; print('test', file=sys.stderr)"
    completion_samples = [{"text": "zi", "matches": {"zip"}}]
    complete_code_samples = ["1", "print('hello, world')", "def f(x):\n  return x*2\n\n\n"]
    incomplete_code_samples = ["print('''hello", "def f(x):\n  x*2"]
    invalid_code_samples = ["import = 7q"]
    code_page_something = "zip?"
    code_generate_error = "raise ValueError('oops')"
    code_execute_result = [
        {"code": "1+2+3", "result": "6"},
        {"code": "[n*n for n in range(1, 4)]", "result": "[1, 4, 9]"},
    ]
    code_display_data = [
        {
            "code": "from IPython.display import HTML, display; display(HTML('<b>test</b>'))",
            "mime": "text/html",
        },
        {
            "code": "from IPython.display import Math, display; display(Math('\\\\frac{1}{2}'))",
            "mime": "text/latex",
        },
        {
            "code": "from IPython.display import JSON, display; display(JSON({'a': 1}))",
            "mime": "application/json",
        },
    ]
    code_history_pattern = "1?2*"
    supported_history_operations = ("tail", "search", "range")
    code_inspect_sample = "zip"
    code_clear_output = "from IPython.display import clear_output; clear_output()"

    @classmethod
    def settings(cls, root: Path) -> dict[str, str]:
        """Extra kernelspec environment for this backend (root: a temporary folder)."""
        return {}

    @classmethod
    def clean_up(cls) -> None:
        """Remove what the suite's kernels made."""

    @classmethod
    def setUpClass(cls) -> None:
        cls._tmp = tempfile.TemporaryDirectory()
        root = Path(cls._tmp.name)
        cls.kenv = make_kernel_env(root, **cls.settings(root))
        cls._env = pytest.MonkeyPatch()
        cls._env.setenv("JUPYTER_PATH", cls.kenv.jupyter_path)
        super().setUpClass()

    @classmethod
    def tearDownClass(cls) -> None:
        super().tearDownClass()
        cls._env.undo()
        cls.clean_up()
        release_disks(Path(cls._tmp.name))  # the workspace's disk, mounted over its folder
        cls._tmp.cleanup()
