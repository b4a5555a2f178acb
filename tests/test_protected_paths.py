"""What host tools run or trust in a folder the sandbox writes stays out of its reach
(``protected_paths``), at any depth, and a read-only mount for code you do not trust.

The attacker is code in the sandbox; the victim is the host user's own `git`, run in
the folder afterwards: a ``core.fsmonitor`` the sandbox managed to write would run as
the host user at their next ``git status``. Real Docker, real git.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import textwrap
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from .conftest import TEST_IMAGE, remove_user_containers, sandbox_container

pytestmark = pytest.mark.docker

GIT = shutil.which("git")


def cli() -> str:
    command = shutil.which("sandbox-kernel", path=os.path.dirname(sys.executable))
    assert command, "the sandbox-kernel command is not installed beside this Python"
    return command


@pytest.fixture
def project(tmp_path: Path) -> Iterator[dict[str, Any]]:
    """A checkout (real git) with a checkout nested in it, and the CLI's environment."""
    if GIT is None:
        pytest.skip("git is not installed")
    user = f"test-p{uuid.uuid4().hex[:8]}"
    root = tmp_path / "checkout"
    nested = root / "vendor" / "lib"
    nested.mkdir(parents=True)
    for repo in (root, nested):
        subprocess.run([GIT, "init", "-q", str(repo)], check=True)
        (repo / "README").write_text("hello\n")
    marker = tmp_path / "fsmonitor-ran"
    env = {
        **{k: v for k, v in os.environ.items() if not k.startswith("SANDBOX_KERNEL_")},
        "SANDBOX_KERNEL_BACKEND": "docker",
        "SANDBOX_KERNEL_IMAGE": TEST_IMAGE,
        "SANDBOX_KERNEL_WORKSPACE_ROOT": str(tmp_path / "ws"),
        "SANDBOX_KERNEL_STATE_DIR": str(tmp_path / "state"),
        "SANDBOX_KERNEL_USER": user,
        "SANDBOX_KERNEL_WORK_ROOT": str(root),
        "PYTHONPATH": str(Path(__file__).resolve().parent.parent),
    }
    yield {"root": root, "nested": nested, "marker": marker, "env": env, "user": user}
    remove_user_containers(user)


def in_sandbox(project: dict[str, Any], script: str, **env: str) -> str:
    """A shell script run in the sandbox, in the checkout; its output."""
    done = subprocess.run(
        [cli(), "exec", "--", "sh", "-c", script],
        cwd=project["root"],
        env={**project["env"], **env},
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert done.returncode == 0, done.stdout + done.stderr
    return done.stdout


def host_git_runs_nothing(project: dict[str, Any], *repos: Path) -> None:
    """The host user's `git status` in each repository: whatever the sandbox tried, no
    command of its choosing runs."""
    for repo in repos:
        subprocess.run(
            [GIT, "-C", str(repo), "status", "--short"],
            capture_output=True,
            timeout=60,
            env={**os.environ, "HOME": str(project["root"].parent)},
        )
    assert not project["marker"].exists(), "the host's git ran a command the sandbox planted"


ATTACK = textwrap.dedent(
    """
    evil='!sh -c "touch {marker}"'
    for repo in . vendor/lib; do
      printf '[core]\\n\\tfsmonitor = %s\\n' "$evil" >> $repo/.git/config 2>/dev/null && echo "$repo config written"
      printf '#!/bin/sh\\ntouch {marker}\\n' > $repo/.git/hooks/pre-commit 2>/dev/null && echo "$repo hook written"
      mv $repo/.git $repo/.git-old 2>/dev/null && echo "$repo .git moved"
      mv $repo/.git/config $repo/.git/config-old 2>/dev/null && echo "$repo config moved"
      ln -f $repo/README $repo/.git/config 2>/dev/null && echo "$repo config linked"
      python3 -c "
    import ctypes, os, sys
    libc = ctypes.CDLL(None, use_errno=True)
    open(sys.argv[1] + '/swap', 'w').write('[core]\\\\n')
    # renameat2(RENAME_EXCHANGE) of the config with a file of ours
    r = libc.syscall(316, -100, (sys.argv[1] + '/swap').encode(), -100, (sys.argv[1] + '/.git/config').encode(), 2)
    print(sys.argv[1], 'exchanged' if r == 0 else 'exchange refused')
    " $repo
    done
    mv vendor/lib vendor/lib-old 2>/dev/null && echo "nested checkout moved"
    mv vendor vendor-old 2>/dev/null && echo "vendor moved"
    git --version >/dev/null 2>&1 || true
    echo done
    """
)


def test_a_cell_cannot_make_the_hosts_git_run_its_command(project: dict[str, Any]) -> None:
    said = in_sandbox(project, ATTACK.format(marker=project["marker"]))
    assert said.strip().endswith("done"), said
    for word in ("written", "moved", "linked", " exchanged"):
        assert word not in said, said
    assert "exchange refused" in said
    for repo in (project["root"], project["nested"]):
        assert "fsmonitor" not in (repo / ".git" / "config").read_text()
        assert not (repo / ".git" / "hooks" / "pre-commit").exists()
    host_git_runs_nothing(project, project["root"], project["nested"])
    # Work goes on: files beside them, and git's own data (objects, index) are writable.
    said = in_sandbox(
        project,
        "echo data > vendor/lib/new.txt && echo x > .git/sandbox-notes && echo ok",
    )
    assert said.strip() == "ok"


def test_a_repository_made_after_the_start_is_protected_from_the_next_start(
    project: dict[str, Any],
) -> None:
    """A repository the host user makes while the sandbox runs (the sandbox itself may
    not make one where the kernel's guard holds, see test_lsm_guard.py) is protected
    from the sandbox's next start on."""
    in_sandbox(project, "true")
    later = project["root"] / "later"
    subprocess.run([GIT, "init", "-q", str(later)], check=True)
    container: Any = sandbox_container(f"sk-{project['user']}")
    container.stop(timeout=1)
    said = in_sandbox(
        project,
        f"printf '\\tfsmonitor = !touch {project['marker']}\\n' >> later/.git/config 2>&1"
        " || echo refused",
    )
    assert "refused" in said or "Read-only" in said, said
    assert "fsmonitor" not in (later / ".git" / "config").read_text()


def test_a_read_only_mount_for_code_you_do_not_trust(project: dict[str, Any]) -> None:
    """``work_mount = ro``: cells read the folder and cannot write it; it is another
    sandbox than the writable one (no sandbox made writable serves it)."""
    in_sandbox(project, "echo rw > made-writable.txt")
    said = in_sandbox(
        project,
        "cat README; (echo x > new.txt) 2>/dev/null && echo wrote || echo refused",
        SANDBOX_KERNEL_WORK_MOUNT="ro",
    )
    assert said.split() == ["hello", "refused"], said
    assert not (project["root"] / "new.txt").exists()
    listed = subprocess.run(
        [cli(), "list", "--json"],
        cwd=project["root"],
        env=project["env"],
        capture_output=True,
        text=True,
        timeout=60,
    )
    import json

    ids = [s["id"] for s in json.loads(listed.stdout)]
    assert len(ids) == 2 and f"sk-{project['user']}" in ids, ids
