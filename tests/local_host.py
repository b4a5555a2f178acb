"""Who makes local sandboxes in a test: a root server, or an ordinary user's.

A test of the local backend's boundary runs each attack twice: with the sandboxes a
root server makes (a uid of their own, idmapped folders) and with those of an ordinary
account (bubblewrap maps the sandbox onto that account). The ordinary account is one
this module creates with ``useradd`` (when the tests run as root; otherwise the tests'
own account is the ordinary one and the root case is skipped), and everything on its
side (making sandboxes, running code in them) runs in a driver process as that account,
which prints what it saw as JSON.
"""

from __future__ import annotations

import contextlib
import json
import os
import pwd
import shutil
import signal
import site
import subprocess
import sys
import tempfile
import time
import uuid
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest

REPO = Path(__file__).resolve().parent.parent
V1_CONTROLLERS = ("memory", "pids", "cpu", "cpuacct")

# Runs as the account: the package, a service for the test's folders, and helpers.
_PRELUDE = r"""
import json, os, sys, time
from sandbox_kernel.config import load_config
from sandbox_kernel.identity import ScopeKey
from sandbox_kernel.service import SandboxService

ARGS = json.loads(os.environ["SK_TEST_ARGS"])
RESULT = {}

def service(**settings):
    values = dict(backend="local", workspace_root=os.environ["SK_TEST_WS"],
                  state_dir=os.environ["SK_TEST_STATE"], work_root="none")
    values.update(settings)
    return SandboxService(load_config(environ={}, **values))

def run(svc, sid, code, *args, timeout=120):
    done = svc.backend.exec(sid, ["python3", "-c", code, *args], timeout=timeout)
    return done.exit_code, done.output.decode(errors="replace")

def last_json(text):
    return json.loads(text.strip().splitlines()[-1])

try:
"""
_EPILOGUE = r"""
finally:
    try:
        service().backend.end_all()
    except Exception as exc:
        RESULT.setdefault("cleanup", repr(exc))
print("RESULT " + json.dumps(RESULT))
"""


@dataclass
class LocalHost:
    """Where a test's local sandboxes are made, and as whom."""

    mode: str  # "root", "user" or "user-cgroup" (an ordinary user given a cgroup)
    uid: int
    gid: int
    folder: Path  # state and workspaces, the account's own
    python: str  # an interpreter the account can run, with this package importable
    path: list[str]  # what it needs on sys.path
    cgroups: list[Path] = field(default_factory=list)  # delegated ones the driver joins

    @property
    def root(self) -> bool:
        return self.mode == "root"

    def run(
        self, script: str, /, driver_timeout: float = 300, hosts: str = "", **args: Any
    ) -> dict[str, Any]:
        """Run ``script`` (the body of a try block, after the prelude) as the account,
        with ``args`` as ARGS; the RESULT dict it filled. With ``hosts``, the driver
        (and what it starts: sandboxes' helpers, egress proxies) sees that text as
        /etc/hosts, in a mount namespace of its own: names of a test's servers, which
        this machine's resolver cannot be told (root only)."""
        body = "\n".join("    " + line for line in script.strip("\n").splitlines())
        program = f"import sys\nsys.path[:0] = {self.path!r}\n" + _PRELUDE + body + "\n" + _EPILOGUE
        env = {
            "PATH": "/usr/local/bin:/usr/bin:/bin",
            "HOME": str(self.folder),
            "LANG": "C.UTF-8",
            "SK_TEST_ARGS": json.dumps(args),
            "SK_TEST_WS": str(self.folder / "ws"),
            "SK_TEST_STATE": str(self.folder / "st"),
            "JUPYTER_CONFIG_DIR": str(self.folder / "jupyter-config"),
            "JUPYTER_DATA_DIR": str(self.folder / "jupyter-data"),
            "JUPYTER_RUNTIME_DIR": str(self.folder / "jupyter-runtime"),
        }
        cgroup_files = [str(c / "cgroup.procs") for c in self.cgroups]
        hosts_file = ""
        if hosts and os.geteuid() != 0:
            pytest.skip("naming a test's servers in /etc/hosts needs root (a mount namespace)")
        if hosts:
            hosts_file = str(self.folder / "hosts")
            Path(hosts_file).write_text(hosts)
            os.chmod(hosts_file, 0o644)
        become = os.geteuid() != self.uid

        def prepare() -> None:  # in the driver, before it runs anything
            if hosts_file:
                with_hosts(hosts_file)
            if become and hosts_file:  # (else subprocess does it, before this)
                os.setgroups([])
                os.setresgid(self.gid, self.gid, self.gid)
                os.setresuid(self.uid, self.uid, self.uid)
            for path in cgroup_files:  # as the account: into the cgroups given to it
                with open(path, "w") as fh:
                    fh.write("0")

        as_account = (
            {"user": self.uid, "group": self.gid, "extra_groups": []}
            if become and not hosts_file
            else {}
        )
        done = subprocess.run(
            [self.python, "-I", "-c", program],
            env=env,
            cwd=str(self.folder),
            capture_output=True,
            text=True,
            timeout=driver_timeout,
            preexec_fn=prepare if cgroup_files or hosts_file else None,
            **as_account,  # type: ignore[arg-type]
        )
        line = next(
            (ln for ln in reversed(done.stdout.splitlines()) if ln.startswith("RESULT ")), ""
        )
        assert done.returncode == 0 and line, (
            f"the driver as {self.mode} failed (test bug?): {done.stdout[-3000:]}\n{done.stderr[-3000:]}"
        )
        result: dict[str, Any] = json.loads(line[7:])
        assert "cleanup" not in result, f"ending the sandboxes failed: {result['cleanup']}"
        return result


def with_hosts(hosts_file: str) -> None:
    """In a child about to run a test's program (root): a mount namespace of its own in
    which /etc/hosts is ``hosts_file`` (the host's own stays as it is)."""
    import ctypes

    libc = ctypes.CDLL(None, use_errno=True)
    ms_rec, ms_private, ms_bind, clone_newns = 0x4000, 1 << 18, 0x1000, 0x00020000
    if libc.unshare(clone_newns) != 0:
        raise OSError(ctypes.get_errno(), "unshare(CLONE_NEWNS)")
    if libc.mount(None, b"/", None, ms_rec | ms_private, None) != 0:
        raise OSError(ctypes.get_errno(), "mount --make-rprivate /")
    if libc.mount(hosts_file.encode(), b"/etc/hosts", None, ms_bind, None) != 0:
        raise OSError(ctypes.get_errno(), "mount --bind hosts /etc/hosts")


def _runnable_python(uid: int, gid: int, path: list[str]) -> str:
    """An interpreter the account can run that imports this package and its
    dependencies from ``path`` ("" when there is none)."""
    candidates = [
        os.path.realpath(sys.executable),
        f"/usr/bin/python{sys.version_info[0]}.{sys.version_info[1]}",
    ]
    as_account = {} if os.geteuid() == uid else {"user": uid, "group": gid, "extra_groups": []}
    for python in dict.fromkeys(candidates):
        probe = [
            python,
            "-I",
            "-c",
            f"import sys; sys.path[:0] = {path!r}; import sandbox_kernel.service, traitlets",
        ]
        try:
            done = subprocess.run(probe, capture_output=True, timeout=60, cwd="/", **as_account)  # type: ignore[arg-type]
        except OSError:
            continue
        if done.returncode == 0:
            return python
    return ""


def _problem(reason: str) -> None:
    if os.environ.get("SANDBOX_KERNEL_REQUIRE_BWRAP") == "1":
        pytest.fail(f"local backend tests are required here but cannot run: {reason}")
    pytest.skip(reason)


@pytest.fixture(scope="session")
def ordinary_account() -> Iterator[tuple[int, int]]:
    """(uid, gid) of an ordinary account: one made for the session when we are root."""
    if os.geteuid() != 0:
        yield os.getuid(), os.getgid()
        return
    name = f"sk-t{uuid.uuid4().hex[:8]}"
    for _ in range(20):  # another test worker's useradd may hold /etc/passwd's lock
        made = subprocess.run(
            [
                "useradd",
                "--no-create-home",
                "--home-dir",
                "/nonexistent",
                "--shell",
                "/usr/sbin/nologin",
                "--user-group",
                name,
            ],
            capture_output=True,
            text=True,
        )
        if made.returncode not in (1, 10):  # 1, 10: the account files are locked
            break
        time.sleep(0.5)
    if made.returncode != 0:
        _problem(f"cannot make an ordinary account ({made.stderr.strip()})")
    entry = pwd.getpwnam(name)
    try:
        yield entry.pw_uid, entry.pw_gid
    finally:
        _end_processes_of(entry.pw_uid)
        for _ in range(20):
            if subprocess.run(["userdel", name], capture_output=True).returncode not in (1, 10):
                break
            time.sleep(0.5)


def _end_processes_of(uid: int) -> None:
    """SIGKILL what the session's account still runs (only that account's processes)."""
    for entry in os.scandir("/proc"):
        if entry.name.isdigit():
            with contextlib.suppress(OSError):
                if entry.stat().st_uid == uid:
                    os.kill(int(entry.name), signal.SIGKILL)


def _delegated_cgroups(uid: int, gid: int) -> list[Path]:
    """A cgroup of each v1 controller given to the account, as an administrator would
    (its folder and process list chowned to it); [] where the host has no v1 layout."""
    made = []
    tag = f"sk-test-{uuid.uuid4().hex[:8]}"
    for ctrl in V1_CONTROLLERS:
        mount = Path("/sys/fs/cgroup") / ctrl
        if not (mount / "cgroup.procs").exists() or not (mount / "tasks").exists():
            continue
        folder = mount / tag
        folder.mkdir()
        for path in (folder, folder / "cgroup.procs", folder / "tasks"):
            os.chown(path, uid, gid)
        made.append(folder)
    return made


def _remove_cgroup(folder: Path) -> None:
    for child in sorted((p for p in folder.rglob("*") if p.is_dir()), key=lambda p: -len(p.parts)):
        with contextlib.suppress(OSError):
            child.rmdir()
    with contextlib.suppress(OSError):
        folder.rmdir()


@pytest.fixture(params=["root", "user"])
def local_host(
    request: pytest.FixtureRequest, ordinary_account: tuple[int, int]
) -> Iterator[LocalHost]:
    """Each local sandbox test as a root server makes sandboxes and as an ordinary user's."""
    yield from _local_host(request.param, ordinary_account)


@pytest.fixture(params=["root", "user", "user-cgroup"])
def limited_host(
    request: pytest.FixtureRequest, ordinary_account: tuple[int, int]
) -> Iterator[LocalHost]:
    """As :func:`local_host`, and an ordinary user an administrator gave a cgroup to."""
    yield from _local_host(request.param, ordinary_account)


def _local_host(mode: str, account: tuple[int, int]) -> Iterator[LocalHost]:
    from tests.conftest import require_bwrap

    require_bwrap()
    if mode == "root" and os.geteuid() != 0:
        pytest.skip("the root server's case needs the tests to run as root")
    uid, gid = (0, 0) if mode == "root" else account
    path = [str(REPO), *site.getsitepackages()]
    python = _runnable_python(uid, gid, path)
    if not python:
        _problem(
            f"no Python that uid {uid} can run imports this package (the tests' interpreter "
            f"{sys.executable} lies where the account cannot reach, and /usr/bin has no "
            f"python{sys.version_info[0]}.{sys.version_info[1]}): run the tests from a venv of /usr/bin/python3"
        )
    folder = Path(tempfile.mkdtemp(prefix=f"sk-local-{mode}-", dir="/tmp"))
    os.chown(folder, uid, gid)
    cgroups = _delegated_cgroups(uid, gid) if mode == "user-cgroup" else []
    if mode == "user-cgroup" and not cgroups:
        pytest.skip(
            "this host has no cgroup v1 layout to delegate from (v2 delegation needs systemd)"
        )
    host = LocalHost(mode, uid, gid, folder, python, path, cgroups)
    try:
        yield host
    finally:
        from tests.conftest import release_disks

        if mode != "root":
            _end_processes_of(uid)
        for cgroup in cgroups:
            _remove_cgroup(cgroup)
        release_disks(folder)  # a root server's workspaces are disks, kept as workspaces are
        shutil.rmtree(folder, ignore_errors=True)
