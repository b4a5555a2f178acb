"""The embedded local backend (bubblewrap when it works, plain processes otherwise)."""

from __future__ import annotations

import json
import multiprocessing
import os
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import nbformat
import pytest

from sandbox_kernel.backends import SandboxError, SandboxNotFound, make_backend
from sandbox_kernel.backends.local import PLAIN_ISOLATION, LocalBackend, bwrap_works
from sandbox_kernel.backends.local.holder import start_time
from sandbox_kernel.config import SandboxConfig, load_config
from sandbox_kernel.identity import ScopeKey
from sandbox_kernel.kernelspec import kernelspec
from sandbox_kernel.service import SandboxService

from .conftest import require_bwrap


def config(tmp_path: Path, **extra: object) -> SandboxConfig:
    return load_config(
        environ={},
        backend="local",
        workspace_root=str(tmp_path / "ws"),
        state_dir=str(tmp_path / "st"),
        **extra,
    )


@pytest.fixture(params=["bwrap", "plain"])
def service(
    request: pytest.FixtureRequest, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> Iterator[SandboxService]:
    """The orchestrator over the local backend, with and without bubblewrap."""
    if request.param == "bwrap":
        require_bwrap()
    if request.param == "plain":
        monkeypatch.setenv("SANDBOX_KERNEL_LOCAL_NO_BWRAP", "1")
    bwrap_works.cache_clear()
    yield SandboxService(config(tmp_path))
    bwrap_works.cache_clear()


@pytest.fixture
def backend(service: SandboxService) -> LocalBackend:
    return service.backend  # type: ignore[return-value]


def py(backend: LocalBackend, sandbox_id: str, code: str) -> str:
    result = backend.exec(sandbox_id, ["python3", "-c", code])
    assert result.exit_code == 0, result.output
    return result.output.decode().strip()


def test_reuse_state_and_tiers(backend: LocalBackend, service: SandboxService) -> None:
    key = ScopeKey("ann")
    first = service.ensure(key)
    again = service.ensure(key)
    assert (first.event, again.event) == ("created", "existing")
    assert first.info.engine_id == again.info.engine_id
    sid = first.info.id
    py(
        backend,
        sid,
        "import os; open('note.txt', 'w').write('w'); open(os.path.expanduser('~/t2.txt'), 'w').write('h')",
    )
    assert py(backend, sid, "print(open('note.txt').read())") == "w"
    backend.stop(sid)
    assert backend.get(sid).started == 0.0
    with pytest.raises(SandboxError, match="start it with"):
        backend.exec(sid, ["true"])
    assert backend.start(sid).started >= first.info.created  # uptime counts from this start
    assert py(backend, sid, "import os; print(open(os.path.expanduser('~/t2.txt')).read())") == "h"
    assert backend.destroy(sid) is True
    assert backend.destroy(sid) is False
    with pytest.raises(SandboxNotFound):
        backend.get(sid)
    fresh = service.ensure(key).info
    assert fresh.engine_id != first.info.engine_id
    assert (
        py(
            backend,
            fresh.id,
            "import os; print(os.path.exists(os.path.expanduser('~/t2.txt')), open('note.txt').read())",
        )
        == "False w"
    )


def test_sharing_and_separation(backend: LocalBackend, service: SandboxService) -> None:
    one = service.ensure(ScopeKey("ann", "thread", "/a.ipynb")).info
    two = service.ensure(ScopeKey("ann", "thread", "/b.ipynb")).info
    bob = service.ensure(ScopeKey("bob")).info
    assert one.id != two.id and one.workspace == two.workspace != bob.workspace
    py(
        backend,
        one.id,
        "open('/workspace/s.txt' if __import__('os').path.isdir('/workspace') else 's.txt', 'w').write('1')",
    )
    assert py(backend, two.id, "import os; print(os.path.exists('s.txt'))") == "True"
    assert py(backend, bob.id, "import os; print(os.path.exists('s.txt'))") == "False"
    assert [i.id for i in backend.list("bob")] == [bob.id]


def test_channel_ends_with_close(backend: LocalBackend, service: SandboxService) -> None:
    info = service.ensure(ScopeKey("ann")).info
    channel = backend.open_channel(
        info.id,
        [
            "python3",
            "-u",
            "-c",
            "import sys\nfor l in sys.stdin: print(l.strip()[::-1], flush=True)",
        ],
    )
    channel.write(b"abc\n")
    got = b""
    while not got.endswith(b"\n"):
        chunk = channel.read()
        assert chunk, f"channel ended early after {got!r}"
        got += chunk
    assert got == b"cba\n"
    pid = channel.proc.pid
    channel.close()
    time.sleep(0.2)
    with pytest.raises(ProcessLookupError):
        os.kill(pid, 0)


def test_stop_ends_live_processes(backend: LocalBackend, service: SandboxService) -> None:
    info = service.ensure(ScopeKey("ann")).info
    channel = backend.open_channel(info.id, ["python3", "-c", "import time; time.sleep(60)"])
    backend.stop(info.id)
    assert channel.read() == b""
    channel.proc.wait(timeout=5)


def _running(marker: str) -> list[int]:
    """Host pids of processes whose command line holds ``marker``."""
    found = []
    for entry in os.scandir("/proc"):
        if entry.name.isdigit():
            try:
                if marker.encode() in Path(entry.path, "cmdline").read_bytes():
                    found.append(int(entry.name))
            except OSError:
                pass
    return found


_DAEMON = """
import os, subprocess, sys
if os.fork() == 0:
    os.setsid()
    if os.fork() == 0:
        subprocess.Popen(["sleep", sys.argv[1]]).wait()
    os._exit(0)
print("started", flush=True)
sys.stdin.read()
"""


def test_stop_leaves_no_process_of_the_sandbox(
    backend: LocalBackend, service: SandboxService, request: pytest.FixtureRequest
) -> None:
    """A daemon a cell left (double fork, a session of its own) ends with the sandbox's
    stop, and so does the sandbox's holder; a command of a stopped sandbox is refused."""
    if not bwrap_works():
        pytest.skip("plain processes (no bubblewrap) are not bounded by anything")
    info = service.ensure(ScopeKey("ann")).info
    marker = str(3000 + os.getpid() % 997)  # sleep's argument: our process to find
    channel = backend.open_channel(info.id, ["python3", "-c", _DAEMON, marker])
    got = b""
    while b"started" not in got:
        chunk = channel.read()
        assert chunk, f"the daemon did not start: {got!r}"
        got += chunk
    deadline = time.monotonic() + 10
    while not _running(f"sleep\0{marker}") and time.monotonic() < deadline:
        time.sleep(0.05)
    assert _running(f"sleep\0{marker}"), "the daemon is not running (test bug)"
    holder = json.loads((backend.root / info.id / "holder.json").read_text())
    backend.stop(info.id)
    assert _running(f"sleep\0{marker}") == []
    assert start_time(holder["pid"]) == ""  # gone (or a zombie its parent reaps)
    with pytest.raises(SandboxError, match="start it with"):
        backend.exec(info.id, ["true"])
    channel.close()


def _ensure(args: tuple[str, str]) -> str:
    ws, st = args
    cfg = load_config(environ={}, backend="local", workspace_root=ws, state_dir=st)
    return SandboxService(cfg).ensure(ScopeKey("racer")).info.engine_id


def test_ten_processes_one_sandbox(tmp_path: Path) -> None:
    args = (str(tmp_path / "ws"), str(tmp_path / "st"))
    with multiprocessing.get_context("spawn").Pool(10) as pool:
        ids = pool.map(_ensure, [args] * 10)
    assert len(set(ids)) == 1
    assert len(list((tmp_path / "st" / "local").glob("*.json"))) == 1


def test_files_confined(backend: LocalBackend, service: SandboxService, tmp_path: Path) -> None:
    info = service.ensure(ScopeKey("ann")).info
    backend.put_file(info.id, "a/b/c.txt", b"data")
    assert b"".join(backend.get_file(info.id, "/workspace/a/b/c.txt")) == b"data"
    secret = tmp_path / "secret.txt"
    secret.write_text("host")
    os.symlink(str(tmp_path), Path(info.workspace) / "escape")
    for bad in ("../secret.txt", "/etc/passwd", "escape/secret.txt", "a/../../secret.txt"):
        with pytest.raises(SandboxError):
            backend.put_file(info.id, bad, b"x")
        with pytest.raises(SandboxError):
            b"".join(backend.get_file(info.id, bad))
    assert secret.read_text() == "host"


def test_files_of_a_stopped_sandbox_leave_it_stopped(
    backend: LocalBackend, service: SandboxService
) -> None:
    """File use reads the host folder: it neither starts a stopped sandbox nor counts
    as its activity."""
    info = service.ensure(ScopeKey("ann")).info
    service.stop("ann", info.id)
    before = service.store.get("local", info.id)
    assert before is not None
    ws = service.workspace("ann", info.id)
    upload = ws.start_upload("notes/a.txt")
    upload.write(b"asleep")
    upload.commit()
    assert [e.name for e in ws.list("notes")[0]] == ["a.txt"]
    assert b"".join(ws.open_read("notes/a.txt")[1]) == b"asleep"
    assert backend.get(info.id).state == "stopped"
    after = service.store.get("local", info.id)
    assert after is not None and after.last_activity == before.last_activity


def test_bubblewrap_hides_the_host(tmp_path: Path) -> None:
    require_bwrap()
    bwrap_works.cache_clear()
    service = SandboxService(config(tmp_path))
    backend = service.backend
    secret = tmp_path / "outside.txt"
    secret.write_text("host only")
    info = service.ensure(ScopeKey("ann")).info
    assert info.isolation.startswith("bubblewrap") and "weaker than a container" in info.isolation
    assert (
        py(backend, info.id, f"import os; print(os.path.exists({str(secret)!r}), os.getcwd())")
        == "False /workspace"
    )
    py(backend, info.id, "open('/workspace/w.txt', 'w').write('ok')")
    assert (Path(info.workspace) / "w.txt").read_text() == "ok"
    assert (
        py(
            backend,
            info.id,
            "import os; print(os.path.exists('/etc/passwd'), os.access('/usr', os.W_OK))",
        )
        == "True False"
    )


def test_plain_mode_says_so(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("SANDBOX_KERNEL_LOCAL_NO_BWRAP", "1")
    bwrap_works.cache_clear()
    info = SandboxService(config(tmp_path)).ensure(ScopeKey("ann")).info
    assert info.isolation == PLAIN_ISOLATION and info.isolation.startswith("none")
    bwrap_works.cache_clear()


def test_auto_without_engine_is_local(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("DOCKER_HOST", "unix:///nonexistent/docker.sock")
    backend = make_backend(load_config(environ={}, backend="auto", state_dir=str(tmp_path)))
    assert backend.name == "local"


def test_kernel_on_local_backend_with_jupyter_execute(tmp_path: Path) -> None:
    """The README's main command on a machine without an engine."""
    share = tmp_path / "share" / "kernels" / "sandbox"
    share.mkdir(parents=True)
    spec = kernelspec("s", None, python=sys.executable)
    (share / "kernel.json").write_text(json.dumps(spec))
    ws = tmp_path / "ws" / "me" / "project"
    ws.mkdir(parents=True)
    (ws / "data.csv").write_text("1,2\n")
    nb = nbformat.v4.new_notebook()
    nb.cells = [
        nbformat.v4.new_code_cell("import os\nprint(os.getcwd(), open('data.csv').read().strip())"),
        nbformat.v4.new_code_cell("from IPython.display import HTML\nHTML('<b>x</b>')"),
    ]
    nbformat.write(nb, ws / "nb.ipynb")
    env = {
        **os.environ,
        "JUPYTER_PATH": str(tmp_path / "share"),
        "PYTHONPATH": str(Path(__file__).resolve().parent.parent),
        "DOCKER_HOST": "unix:///nonexistent/docker.sock",  # no engine: auto picks local
        "SANDBOX_KERNEL_WORKSPACE_ROOT": str(tmp_path / "ws"),
        "SANDBOX_KERNEL_STATE_DIR": str(tmp_path / "st"),
        "SANDBOX_KERNEL_USER": "me",
    }
    done = subprocess.run(
        [
            sys.executable,
            "-m",
            "jupyter",
            "execute",
            "--kernel_name=sandbox",
            "--inplace",
            str(ws / "nb.ipynb"),
        ],
        env=env,
        cwd=ws,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == 0, done.stderr
    out = nbformat.read(ws / "nb.ipynb", 4).cells
    expected_cwd = "/workspace/project" if bwrap_works() else str(ws)
    stdout = [o for o in out[0].outputs if o.get("name") == "stdout"]
    assert stdout[0]["text"].strip() == f"{expected_cwd} 1,2"
    assert [o["output_type"] for o in out[0].outputs] == [
        "stream"
    ]  # the cell's print, nothing of ours
    assert "[SandboxKernel] creating local sandbox sk-me" in done.stderr  # in the job's log instead
    assert out[1].outputs[0]["data"]["text/html"] == "<b>x</b>"


@pytest.mark.docker
def test_local_sandboxes_stay_visible_once_an_engine_answers(tmp_path: Path) -> None:
    """Made while no engine answered (backend auto), a local sandbox is still listed and
    managed by the CLI once Docker is up: nothing of yours hides behind the engine."""
    env = {
        **os.environ,
        "SANDBOX_KERNEL_STATE_DIR": str(tmp_path / "st"),
        "SANDBOX_KERNEL_WORKSPACE_ROOT": str(tmp_path / "ws"),
        "SANDBOX_KERNEL_USER": "me-local",
        "SANDBOX_KERNEL_WORK_ROOT": "none",
        "PYTHONPATH": str(Path(__file__).resolve().parent.parent),
    }
    env.pop("SANDBOX_KERNEL_BACKEND", None)

    def cli(*args: str, **extra: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            [sys.executable, "-m", "sandbox_kernel.cli", *args],
            env={**env, **extra},
            capture_output=True,
            text=True,
            timeout=120,
        )

    made = cli("exec", "--", "true", DOCKER_HOST="unix:///nonexistent/docker.sock")
    assert made.returncode == 0, made.stderr
    listed = json.loads(cli("list", "--json").stdout)
    assert [(i["id"], i["backend"]) for i in listed] == [("sk-me-local", "local")]
    assert cli("exec", "sk-me-local", "echo", "here").stdout == "here\n"
    assert cli("destroy", "sk-me-local").stdout.strip() == "destroyed sk-me-local (workspace kept)"
    assert json.loads(cli("list", "--json").stdout) == []
