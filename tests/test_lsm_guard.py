"""The kernel refuses protected names a sandbox makes after it started (a BPF LSM
program, ``sandbox_kernel/backends/lsm_guard.py``), and says plainly where it cannot.

Three layers: the rules against ``fnmatch`` (fast); the program itself run by the
kernel on real mounts and dentries (root: a raw-tracepoint test run of the very same
instructions, so it runs even where the kernel will not attach LSM programs); and the
attacker's view, a cell making ``.git`` every way it can while the host's git watches
(real engine, real git), where the kernel accepts the program -- elsewhere, what the
listing, the log and the doctor say instead.
"""

from __future__ import annotations

import ctypes
import fnmatch
import json
import os
import shutil
import struct
import subprocess
import sys
import textwrap
import uuid
from pathlib import Path
from typing import Any

import pytest

from sandbox_kernel.backends import lsm_guard
from sandbox_kernel.config import PROTECTED_PATHS

from .conftest import sandbox_container
from .test_protected_paths import cli, host_git_runs_nothing, in_sandbox, project  # noqa: F401

PROBE = Path(__file__).resolve().parent / "lsm_guard_probe.py"


# -- the rules ------------------------------------------------------------------------
@pytest.mark.fast
def test_the_rules_refuse_exactly_the_protected_names() -> None:
    rules = lsm_guard.rules_of(list(PROTECTED_PATHS))
    firsts = {p.split("/")[0] for p in PROTECTED_PATHS}
    names = [
        *firsts,
        "jupyter_lab_config.py",
        "jupyter_" + "y" * 200 + "_config.json",
        "jupyter_config.py",  # too short for jupyter_*_config.py
        ".gitx",
        "x.git",
        ".GIT",
        "git",
        "README.md",
        "config",
        "x" * 255,
        ".bashrc~",
    ]
    for name in names:
        want = any(fnmatch.fnmatchcase(name, first) for first in firsts)
        assert lsm_guard.refused(name, "src", rules) is want, name
    # The second name of a protected path, only in a folder named as its first.
    assert lsm_guard.refused("config", ".git", rules)
    assert lsm_guard.refused("hooks", ".git", rules)
    assert lsm_guard.refused("commondir", ".git", rules)
    assert not lsm_guard.refused("objects", ".git", rules)
    assert not lsm_guard.refused("config", ".gitx", rules)


@pytest.mark.fast
def test_a_name_it_cannot_compare_whole_is_refused_rather_than_let_through() -> None:
    rules = lsm_guard.rules_of(["a*b*c", "[ab]x", "n" * 70])
    assert lsm_guard.refused("abbc", "", rules) and lsm_guard.refused("aXc", "", rules)
    assert lsm_guard.refused("ax", "", rules) and lsm_guard.refused("zx", "", rules)
    assert lsm_guard.refused("n" * 70, "", rules) and not lsm_guard.refused("n" * 69, "", rules)
    with pytest.raises(lsm_guard.GuardUnavailable, match="at most"):
        lsm_guard.rules_of([f"name{i}" for i in range(lsm_guard.MAX_RULES + 1)])


# -- the program, run by the kernel ------------------------------------------------------
def test_the_program_refuses_by_name_on_registered_mounts_only(tmp_path: Path) -> None:
    """The program answers -EPERM for a protected name (and a protected path's second
    name inside its first) on a registered mount, 0 for other names and for the same
    folder seen through another mount (the host's view)."""
    if os.geteuid() != 0 or shutil.which("unshare") is None:
        pytest.skip("needs root and unshare")
    why = lsm_guard.support()
    if why and "does not run the BPF security module" not in why:
        pytest.skip(why)
    host, seen = tmp_path / "host", tmp_path / "sandbox-view"
    long_pattern = "jupyter_" + "y" * 80 + "_config.py"
    folders = [".git", ".git/config", ".git/objects", "ok", "jupyter_lab_config.py"]
    folders += [".bashrc", ".gitx", "x" * 100, long_pattern, "deep/er/.vscode", "jupyter_config.py"]
    for folder in folders:
        (host / "a" / folder).mkdir(parents=True)
    seen.mkdir()
    asked = [str(seen / "a" / f) for f in folders] + [str(host / "a" / ".git")]
    script = f'mount --bind {host} {seen} && exec {sys.executable} -I {PROBE} "$@"'
    done = subprocess.run(
        ["unshare", "-m", "--propagation", "private", "--", "sh", "-c", script, "sh", *asked],
        env={
            **os.environ,
            "SK_PATTERNS": json.dumps(list(PROTECTED_PATHS)),
            "SK_REGISTER": json.dumps([str(seen)]),
        },
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == 0, done.stderr
    answers = json.loads(done.stdout)
    refused = {Path(p).relative_to(seen / "a").as_posix() for p, r in answers.items() if r}
    assert refused == {
        ".git",
        ".git/config",
        "jupyter_lab_config.py",
        ".bashrc",
        long_pattern,
        "deep/er/.vscode",
    }
    assert answers[str(host / "a" / ".git")] == 0, "the host's own view is never refused"
    assert all(r in (0, -1) for r in answers.values()), answers


# -- the attacker's view ------------------------------------------------------------
# Run in the sandbox, in a folder of the work folder that has no repository: every way
# to make a `.git` (and a `.bashrc`, a `.vscode`) there; each success prints "made:".
ATTACK = textwrap.dedent(
    """
    mkdir -p new && cd new && echo hello > README
    made() {{ echo "made: $*"; }}
    mkdir -p prepared/hooks && printf '[core]\\n\\tfsmonitor = touch {marker}\\n' > prepared/config
    mkdir .git 2>/dev/null && made mkdir
    mkdir -p a/b/.git 2>/dev/null && made mkdir -p
    git init -q c 2>/dev/null && made git init
    (printf 'gitdir: ../prepared\\n' > .git) 2>/dev/null && made gitfile
    (printf 'x' > .bashrc) 2>/dev/null && made bashrc
    mv prepared .git 2>/dev/null && made rename
    python3 -c "
    import ctypes, os
    libc = ctypes.CDLL(None, use_errno=True)
    os.mkdir('x')
    # renameat2(RENAME_EXCHANGE) of a folder of ours with the name; then NOREPLACE
    if libc.syscall(316, -100, b'x', -100, b'.git', 2) == 0: print('made: exchange')
    if libc.syscall(316, -100, b'x', -100, b'.vscode', 1) == 0: print('made: noreplace')
    "
    ln README .git 2>/dev/null && made link
    ln README .bashrc 2>/dev/null && made link bashrc
    ln -s ../prepared .git 2>/dev/null && made symlink
    end=$(( $(date +%s) + 3 ))
    while [ "$(date +%s)" -lt "$end" ]; do
      mkdir .git 2>/dev/null && made race mkdir
      mv prepared .git 2>/dev/null && made race rename
      ln README .git 2>/dev/null && made race link
    done
    mkdir -p ok/deeper && echo fine > ok/deeper/file && mv ok/deeper ok/moved && echo ordinary
    """
)


def test_a_cell_cannot_make_a_repository_in_the_work_folder(project: dict[str, Any]) -> None:  # noqa: F811
    """Every way to make `.git` (and `.bashrc`, `.vscode`) after the start is refused in
    the sandbox, at once and in a racing loop; ordinary files and folders are not; the
    host's git then runs nothing of the sandbox's, and the host itself can still make a
    repository in its own view of the folder."""
    in_sandbox(project, "true")  # the sandbox, started: its guard loaded if it can be
    why = lsm_guard.remembered(project["env"]["SANDBOX_KERNEL_STATE_DIR"])
    if why:
        pytest.skip(f"the kernel's guard does not hold here: {why}")
    said = in_sandbox(project, ATTACK.format(marker=project["marker"]))
    assert "made:" not in said, said
    assert said.strip().endswith("ordinary"), said
    new = project["root"] / "new"
    for place in (new, new / "a" / "b", new / "c"):
        assert not os.path.lexists(place / ".git"), place
    for name in (".bashrc", ".vscode"):
        assert not os.path.lexists(new / name), name
    host_git_runs_nothing(project, new, new / "a" / "b", new / "c", new / "ok")
    subprocess.run(["git", "init", "-q", str(new / "host-made")], check=True)
    assert (new / "host-made" / ".git" / "config").is_file()
    # The guard outlives this process and the container's restart: stopped and started
    # again (by a new CLI process), the same names are refused.
    container: Any = sandbox_container(f"sk-{project['user']}")
    container.stop(timeout=1)
    said = in_sandbox(project, "cd new && (mkdir .git 2>/dev/null && echo made) || echo refused")
    assert said.strip() == "refused", said


def test_where_the_guard_cannot_hold_the_listing_log_and_doctor_say_why(
    project: dict[str, Any],  # noqa: F811
) -> None:
    """Without the guard (this kernel, or a server that is not root), a start says why in
    the sandbox's log, `list` says it once, and doctor's guard line names the limit;
    nothing is left pinned. With it, none of them has a note."""
    in_sandbox(project, "true")
    state = project["env"]["SANDBOX_KERNEL_STATE_DIR"]
    why = lsm_guard.remembered(state)
    assert why is not None, "a start with a work folder records what it found"

    def run(*words: str) -> str:
        done = subprocess.run(
            [cli(), *words],
            cwd=project["root"],
            env=project["env"],
            capture_output=True,
            text=True,
            timeout=300,
        )
        return done.stdout + done.stderr

    listed, doctor = run("list"), run("doctor")
    logs = run("logs", f"sk-{project['user']}")
    guard_line = [line for line in doctor.splitlines() if line.startswith("guard")]
    installation = json.loads(run("list", "--json"))[0]["installation"]
    if why:
        assert listed.count("not refused by the kernel") == 1, listed
        assert why in listed and why in logs, logs
        assert guard_line and guard_line[0].split()[1] == "limited:", doctor
        assert not os.path.exists(lsm_guard.folder_of(installation)), "nothing pinned"
    else:
        assert "not refused" not in listed + logs
        assert guard_line and guard_line[0].split()[1] == "ok:", doctor
        assert lsm_guard.held(installation)


def test_a_start_registers_the_sandboxs_own_mounts_of_its_folders(
    project: dict[str, Any],  # noqa: F811
) -> None:
    """The protect helper, in the container's namespace, registers the mounts the
    sandbox sees its work folder through (the folder and the pinned folders in it),
    never the host's own view of it (runs where maps can be made, with or without the
    kernel accepting the program)."""
    if os.geteuid() != 0:
        pytest.skip("registering needs root")
    from sandbox_kernel.backends.docker.protect import apply

    in_sandbox(project, "true")
    container: Any = sandbox_container(f"sk-{project['user']}")
    pid = int(container.attrs["State"]["Pid"])
    installation = f"test-{uuid.uuid4().hex[:8]}"
    folder = lsm_guard.folder_of(installation)
    try:
        lsm_guard._bpffs()
        os.makedirs(folder)
        mounts = lsm_guard._create_map(lsm_guard._MAP_LRU_HASH, 8, 8, 64, b"t_mounts")
        lsm_guard._pin(mounts, f"{folder}/mounts")
        work = str(project["root"])
        skipped = apply(pid, [], {"installation": installation, "folders": [work]})
        assert skipped == [], skipped
        keys, key = [], b""
        while True:
            nxt = ctypes.create_string_buffer(8)
            cur = ctypes.create_string_buffer(key or bytes(8))
            attr = struct.pack(
                "<IIQQ", mounts, 0, lsm_guard._ptr(cur) if key else 0, lsm_guard._ptr(nxt)
            )
            try:
                lsm_guard._bpf(4, attr, "next key")
            except FileNotFoundError:
                break
            key = nxt.raw
            keys.append(struct.unpack("<Q", key)[0])
        os.close(mounts)
        # The work folder itself, and the pinned folders on the way to .git, vendor/lib/.git.
        assert len(keys) >= 3, keys
        host_view = os.open(work, os.O_PATH)
        try:
            assert lsm_guard.mount_id(host_view) not in keys
        finally:
            os.close(host_view)
    finally:
        if os.path.isdir(folder):
            lsm_guard.remove(installation)
