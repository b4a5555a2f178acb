"""Files where you work (``test_work_folders.py``) with kernels on the local backend.

The same tests, collected here with the kernelspec pointed at the local backend: a CI
checkout run by ``jupyter execute --inplace`` and papermill, the work folder as hostile
ground for the host's tools (no links, FIFOs, sockets or setuid files; the checkout's
``.git`` read-only), code left for the next kernel, one user's two folders.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from sandbox_kernel.config import SandboxConfig, load_config

from .conftest import require_bwrap
from .kernel_env import KernelEnv, make_kernel_env
from .test_work_folders import (  # noqa: F401 (collected here)
    test_ci_checkout_with_jupyter_execute_inplace,
    test_code_left_for_the_next_kernel_runs_only_restricted,
    test_host_folder_is_hostile_ground,
    test_one_user_two_folders,
    test_papermill_with_parameters_in_a_checkout,
)


class LocalKernelEnv(KernelEnv):
    """The test kernelspec's settings, on the local backend."""

    def config(self, **overrides: Any) -> SandboxConfig:
        values: dict[str, Any] = {
            "backend": "local",
            "workspace_root": str(self.root / "workspaces"),
            "state_dir": str(self.root / "state"),
            "user": self.user,
        }
        return load_config(environ={}, **{**values, **overrides})


@pytest.fixture
def kenv(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[KernelEnv]:
    """The test kernelspec on the local backend, with the default work folder choice."""
    require_bwrap()
    made = make_kernel_env(
        tmp_path / "k", SANDBOX_KERNEL_WORK_ROOT="auto", SANDBOX_KERNEL_BACKEND="local"
    )
    env = LocalKernelEnv(root=made.root, user=made.user, kernel_name=made.kernel_name)
    monkeypatch.setenv("JUPYTER_PATH", env.jupyter_path)
    yield env
