"""Protected paths and the read-only work folder (``test_protected_paths.py``) on local
sandboxes: the same attacks on the host user's git, from bubblewrap'd processes, where
every process of a sandbox gets the protected paths read-only and their folders pinned
(found when the sandbox starts)."""

from __future__ import annotations

import os
import subprocess
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from .conftest import require_bwrap
from .test_protected_paths import (  # noqa: F401 (collected here)
    GIT,
    cli,
    in_sandbox,
    test_a_cell_cannot_make_the_hosts_git_run_its_command,
    test_a_read_only_mount_for_code_you_do_not_trust,
)


@pytest.fixture
def project(tmp_path: Path) -> Iterator[dict[str, Any]]:
    """The Docker tests' checkout (real git, a checkout nested in it), with the CLI
    pointed at the local backend."""
    require_bwrap()
    if GIT is None:
        pytest.skip("git is not installed")
    user = f"test-p{uuid.uuid4().hex[:8]}"
    root = tmp_path / "checkout"
    nested = root / "vendor" / "lib"
    nested.mkdir(parents=True)
    for repo in (root, nested):
        subprocess.run([GIT, "init", "-q", str(repo)], check=True)
        (repo / "README").write_text("hello\n")
    env = {
        **{k: v for k, v in os.environ.items() if not k.startswith("SANDBOX_KERNEL_")},
        "SANDBOX_KERNEL_BACKEND": "local",
        "SANDBOX_KERNEL_WORKSPACE_ROOT": str(tmp_path / "ws"),
        "SANDBOX_KERNEL_STATE_DIR": str(tmp_path / "state"),
        "SANDBOX_KERNEL_USER": user,
        "SANDBOX_KERNEL_WORK_ROOT": str(root),
        "PYTHONPATH": str(Path(__file__).resolve().parent.parent),
    }
    marker = tmp_path / "fsmonitor-ran"
    yield {"root": root, "nested": nested, "marker": marker, "env": env, "user": user}


def test_a_repository_made_after_the_start_is_protected_from_the_next_start(
    project: dict[str, Any],
) -> None:
    """A `.git` the sandbox makes later is protected from its next start on."""
    in_sandbox(project, "mkdir -p later/.git/hooks && printf '[core]\\n' > later/.git/config")
    stopped = subprocess.run(
        [cli(), "stop", f"sk-{project['user']}"],
        cwd=project["root"],
        env=project["env"],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert stopped.returncode == 0, stopped.stderr
    said = in_sandbox(
        project,
        f"printf '\\tfsmonitor = !touch {project['marker']}\\n' >> later/.git/config 2>&1"
        " || echo refused",
    )
    assert "refused" in said or "Read-only" in said, said
    assert "fsmonitor" not in (project["root"] / "later" / ".git" / "config").read_text()
    assert os.path.isdir(project["root"] / "later" / ".git")
