"""A newcomer's first hour, as they meet it: every door and runner with a real Docker
engine, a real Jupyter server and the tools from PyPI.

* an image that cannot be pulled fails `jupyter execute`, papermill, nbmake and nbval
  with the one line that names the setting, and the kernel says "creating ... pulling"
  once however many cells try;
* one folder gives one sandbox through every door: a notebook in JupyterLab,
  `sandbox-kernel exec`, `jupyter execute` and `sandbox-kernel mcp` in the server's
  folder all use `sk-<user>`, and `list` shows each sandbox's folder;
* a flavor the engine's machine cannot give is said as applied, a plain `exec` never
  shrinks a sandbox, a snapshot that does not exist is an error;
* a Docker and a local sandbox with one id are told apart by the backend;
* `logs`, `doctor` without an image, the local backend's fallback said once, and
  `uninstall` (which leaves another installation on the same engine alone).
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import docker
import nbformat
import pytest
from jupyter_client import AsyncKernelClient
from mcp import ClientSession
from mcp.client.stdio import StdioServerParameters, stdio_client

from sandbox_kernel.backends import disks
from sandbox_kernel.config import load_config
from sandbox_kernel.identity import ScopeKey
from sandbox_kernel.service import SandboxService

from .conftest import TEST_IMAGE, remove_user_containers, remove_user_snapshots
from .kernel_env import KernelEnv, make_kernel_env

pytestmark = pytest.mark.docker

CLI = str(Path(sys.executable).parent / "sandbox-kernel")
# An image no registry can give (a local address nothing listens on: no traffic leaves).
ABSENT = "127.0.0.1:9/sandbox-kernel/absent:1"
LINE = f"SandboxUnavailable: image {ABSENT} is not present and could not be pulled"


def notebook(path: Path, cells: list[str]) -> Path:
    nb = nbformat.v4.new_notebook()
    nb.cells = [nbformat.v4.new_code_cell(c) for c in cells]
    nb.metadata["kernelspec"] = {"name": "sandbox", "display_name": "sandbox", "language": "python"}
    path.parent.mkdir(parents=True, exist_ok=True)
    nbformat.write(nb, path)
    return path


def tool(
    kenv: KernelEnv, cwd: Path, *cmd: str, env: dict[str, str] | None = None
) -> subprocess.CompletedProcess[str]:
    """A command as a user types it in ``cwd``, with the test kernelspec on the path
    (``env``: the whole environment instead)."""
    return subprocess.run(
        list(cmd),
        cwd=cwd,
        env=env or {**kenv.environ(), "JUPYTER_PATH": kenv.jupyter_path},
        capture_output=True,
        text=True,
        timeout=300,
    )


def cli_env(kenv: KernelEnv, **extra: str) -> dict[str, str]:
    """The test kernelspec's settings as a shell would have them for the CLI."""
    spec = json.loads((Path(kenv.jupyter_path) / "kernels" / "sandbox" / "kernel.json").read_text())
    base = {k: v for k, v in os.environ.items() if not k.startswith("SANDBOX_KERNEL_")}
    return {**base, **spec["env"], "JUPYTER_PATH": kenv.jupyter_path, **extra}


def test_an_image_that_cannot_be_pulled_is_one_line_in_every_runner(tmp_path: Path) -> None:
    kenv = make_kernel_env(tmp_path / "k", SANDBOX_KERNEL_IMAGE=ABSENT)
    folder = tmp_path / "nb"
    notebook(folder / "report.ipynb", ["1", "2", "3"])
    py = sys.executable
    done = tool(
        kenv, folder, py, "-m", "jupyter", "execute", "--kernel_name=sandbox", "report.ipynb"
    )
    assert done.returncode == 1 and LINE in done.stderr, done.stderr[-3000:]
    assert "SANDBOX_KERNEL_IMAGE" in done.stderr
    # The kernel tried twice (at its start, then for the cell), and said it once.
    assert done.stderr.count(f"creating sandbox sk-{kenv.user}") == 1, done.stderr
    assert done.stderr.count(f"image {ABSENT} is not here; pulling it") == 1, done.stderr
    # Every cell that tries gets the line; the kernel's progress is still said once.
    done = tool(
        kenv,
        folder,
        py,
        "-m",
        "jupyter",
        "execute",
        "--allow-errors",
        "--inplace",
        "--kernel_name=sandbox",
        "report.ipynb",
    )
    assert done.returncode == 0, done.stderr[-3000:]
    errors = [o for c in nbformat.read(folder / "report.ipynb", 4).cells for o in c.outputs]
    assert len(errors) == 3 and all(
        len(e["traceback"]) == 1 and e["traceback"][0].startswith(LINE) for e in errors
    ), errors
    assert done.stderr.count(f"creating sandbox sk-{kenv.user}") == 1, done.stderr
    notebook(folder / "report.ipynb", ["1"])
    done = tool(kenv, folder, py, "-m", "papermill", "-k", "sandbox", "report.ipynb", "out.ipynb")
    assert done.returncode != 0 and LINE in done.stdout + done.stderr, done.stderr[-3000:]
    (folder / "pytest.ini").write_text("[pytest]\n")
    for plugin in (
        ["--nbmake", "--nbmake-kernel=sandbox"],
        ["--nbval", "--nbval-kernel-name=sandbox"],
    ):
        done = tool(
            kenv, folder, py, "-m", "pytest", "-p", "no:cacheprovider", *plugin, "report.ipynb"
        )
        assert done.returncode == 1 and LINE in done.stdout, (plugin, done.stdout[-3000:])


@pytest.fixture
def lab(tmp_path: Path, test_user: str, monkeypatch: pytest.MonkeyPatch) -> Iterator[Path]:
    """A JupyterLab root folder and the test kernelspec, for a real server (below)."""
    root = tmp_path / "lab-root"
    (root / "projects" / "a").mkdir(parents=True)
    env = make_kernel_env(
        tmp_path / "k", SANDBOX_KERNEL_WORK_ROOT="auto", SANDBOX_KERNEL_USER=test_user
    )
    monkeypatch.setenv("JUPYTER_PATH", env.jupyter_path)
    spec = json.loads((Path(env.jupyter_path) / "kernels" / "sandbox" / "kernel.json").read_text())
    for name in ("BACKEND", "IMAGE", "WORKSPACE_ROOT", "STATE_DIR", "USER"):
        monkeypatch.setenv(f"SANDBOX_KERNEL_{name}", spec["env"][f"SANDBOX_KERNEL_{name}"])
    (root / ".kenv").write_text(json.dumps({"root": str(env.root), "user": env.user}))
    yield root
    remove_user_containers(test_user)


@pytest.fixture
def jp_server_config(lab: Path) -> dict[str, Any]:
    return {
        "ServerApp": {"jpserver_extensions": {"jupyter_ext": True}, "root_dir": str(lab)},
        "SandboxExtension": {"gc_interval": 0},
    }


async def test_one_folder_one_sandbox_through_every_door(
    jp_fetch: Any, jp_serverapp: Any, lab: Path, test_user: str, tmp_path: Path
) -> None:
    """A notebook opened in JupyterLab, then from a shell in the same folder (the server's
    root folder is not in their environment): `exec`, `jupyter execute` and the MCP server
    all use `sk-<user>` with the folder at its path; a folder elsewhere gets its own."""
    saved = json.loads((lab / ".kenv").read_text())
    kenv = KernelEnv(root=Path(saved["root"]), user=saved["user"])
    body = json.dumps(
        {
            "path": "projects/a/nb.ipynb",
            "type": "notebook",
            "name": "",
            "kernel": {"name": "sandbox"},
        }
    )
    session = json.loads((await jp_fetch("api", "sessions", method="POST", body=body)).body)
    km = jp_serverapp.kernel_manager.get_kernel(session["kernel"]["id"])
    client = AsyncKernelClient()
    client.load_connection_info(km.get_connection_info())
    client.start_channels()
    try:
        await client.wait_for_ready(timeout=120)
        reply = await client.execute_interactive("import os; os.getcwd()", timeout=120)
        assert reply["content"]["status"] == "ok"
    finally:
        client.stop_channels()
    mine = f"sk-{test_user}"
    shell = cli_env(kenv, SANDBOX_KERNEL_WORK_ROOT="auto")
    shell.pop("SANDBOX_KERNEL_SERVER_ROOT", None)  # a shell, not a door of the server
    here = lab / "projects" / "a"
    done = tool(kenv, here, CLI, "exec", "--", "pwd", env=shell)
    assert done.returncode == 0 and done.stdout.strip() == str(here), done.stderr
    notebook(here / "batch.ipynb", ["import os\nprint(os.getcwd())"])
    done = tool(
        kenv,
        here,
        sys.executable,
        "-m",
        "jupyter",
        "execute",
        "--kernel_name=sandbox",
        "--inplace",
        "batch.ipynb",
        env=shell,
    )
    assert done.returncode == 0, done.stderr[-2000:]
    assert nbformat.read(here / "batch.ipynb", 4).cells[0].outputs[0]["text"] == f"{here}\n"
    params = StdioServerParameters(command=CLI, args=["mcp"], env=shell, cwd=str(lab))
    async with stdio_client(params) as (read, write), ClientSession(read, write) as mcp:
        await mcp.initialize()
        said = await mcp.call_tool("execute_command", {"command": "ls -d " + str(here)})
        assert not said.is_error, said
    service = SandboxService(load_config(environ=shell))
    assert [i["id"] for i in service.list(test_user)] == [mine]
    # A folder outside the server's root: a sandbox of its own, named by its folder.
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    done = tool(kenv, elsewhere, CLI, "exec", "--", "pwd", env=shell)
    assert done.returncode == 0 and done.stdout.strip() == str(elsewhere), done.stderr
    listed = tool(kenv, elsewhere, CLI, "list", env=shell).stdout.splitlines()
    assert "FOLDER" in listed[0]
    folders = {line.split()[0]: line.split()[-1] for line in listed[1:3]}
    assert folders[mine] == str(lab) and len(folders) == 2
    assert [f for i, f in folders.items() if i != mine] == [str(elsewhere)]


@pytest.fixture
def kenv(tmp_path: Path) -> Iterator[KernelEnv]:
    env = make_kernel_env(tmp_path / "k")
    yield env
    remove_user_containers(env.user)
    remove_user_snapshots(env.user)


def test_flavors_say_what_was_applied_and_change_only_when_asked(kenv: KernelEnv) -> None:
    engine_cpus = docker.from_env().info()["NCPU"]
    key = ScopeKey(kenv.user)
    big = SandboxService(kenv.config(flavor="large")).ensure(key)
    assert big.info.limits["memory"] == 4 << 30
    if engine_cpus < 4:  # this machine: the engine gives what it has, and says so
        assert big.info.limits["cpus"] == engine_cpus
        assert any(
            f"asks for 4 CPUs, but the engine's machine has {engine_cpus}" in n for n in big.notes
        ), big.notes
    done = subprocess.run(
        [CLI, "exec", "--", "true"], env=cli_env(kenv), capture_output=True, text=True, timeout=120
    )
    assert done.returncode == 0 and "flavor" not in done.stderr, done.stderr
    assert SandboxService(kenv.config()).backend.get(big.info.id).limits["memory"] == 4 << 30
    small = SandboxService(kenv.config(flavor="small")).ensure(key)
    assert small.info.limits["memory"] == 1 << 30
    assert any("now has flavor small (1 CPU," in n for n in small.notes), small.notes
    grown = SandboxService(kenv.config(flavor="large")).ensure(key)
    if engine_cpus < 4:
        note = " ".join(grown.notes)
        assert f"({engine_cpus:g} CPUs (flavor large asks for 4" in note, note
    # A snapshot asked for that does not exist is an error, not a silent sandbox of old.
    with pytest.raises(Exception, match="no snapshot named 'nope'.*SANDBOX_KERNEL_SNAPSHOT"):
        SandboxService(kenv.config(snapshot="nope")).ensure(key)


def test_a_docker_and_a_local_sandbox_of_one_id(kenv: KernelEnv) -> None:
    key = ScopeKey(kenv.user)
    docker_one = SandboxService(kenv.config()).ensure(key).info
    local = SandboxService(kenv.config(backend="local")).ensure(key).info
    assert docker_one.id == local.id == f"sk-{kenv.user}"
    env = cli_env(kenv, SANDBOX_KERNEL_BACKEND="auto")
    listed = subprocess.run([CLI, "list"], env=env, capture_output=True, text=True, timeout=120)
    assert listed.stdout.count(f"sk-{kenv.user} ") >= 2
    assert f"sk-{kenv.user}: a sandbox of each backend has this id" in listed.stdout
    done = subprocess.run(
        [CLI, "destroy", f"sk-{kenv.user}"], env=env, capture_output=True, text=True, timeout=120
    )
    assert done.returncode == 2
    assert "names a docker and local sandbox; say which with --backend docker" in done.stderr
    done = subprocess.run(
        [CLI, "destroy", "--backend", "local", f"sk-{kenv.user}"],
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == 0, done.stderr
    assert SandboxService(kenv.config(backend="local")).backend.find(local.id) is None
    assert SandboxService(kenv.config()).backend.find(docker_one.id) is not None


def test_logs_say_what_happened(kenv: KernelEnv) -> None:
    env = cli_env(kenv)
    sid = f"sk-{kenv.user}"
    for cmd in (["exec", "--", "true"], ["stop", sid], ["logs", sid]):
        done = subprocess.run([CLI, *cmd], env=env, capture_output=True, text=True, timeout=120)
        assert done.returncode == 0, done.stderr
    lines = [line.split("  ", 1)[1] for line in done.stdout.splitlines()]
    assert lines[0] == f"creating sandbox {sid} from {TEST_IMAGE} (small)"
    assert lines[1:] == ["created (running)", "stopped"], lines
    other = subprocess.run(
        [CLI, "logs", "sk-someone-else"], env=env, capture_output=True, text=True, timeout=60
    )
    assert other.returncode == 1 and "no sandbox with id 'sk-someone-else'" in other.stderr


def test_doctor_without_the_image_names_the_setting(kenv: KernelEnv, tmp_path: Path) -> None:
    done = subprocess.run(
        [CLI, "doctor"],
        env=cli_env(kenv, SANDBOX_KERNEL_IMAGE=ABSENT),
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=120,
    )
    lines = dict(line.split(None, 1) for line in done.stdout.splitlines())
    assert done.returncode == 1, done.stdout + done.stderr
    assert lines["engine"].startswith("ok: Docker engine")
    assert lines["image"].startswith(f"problem: {ABSENT} is not here")
    assert "from 127.0.0.1:9" in lines["image"] and "SANDBOX_KERNEL_IMAGE" in lines["image"]
    assert ", e.g. " in lines["image"]  # images that are here, as examples
    assert [lines[n].split(":")[0] for n in ("sandbox", "index", "workspace")] == ["skipped"] * 3
    assert not docker.from_env().containers.list(
        ignore_removed=True, all=True, filters={"label": f"sandbox-kernel.user={kenv.user}"}
    )


def test_without_an_engine_the_fallback_is_said_once(tmp_path: Path) -> None:
    """Backend auto without an engine: the kernel's log says once that the sandbox is a
    local one, and why; the notebook stores only what its cells printed."""
    kenv = make_kernel_env(
        tmp_path / "k",
        SANDBOX_KERNEL_BACKEND="auto",
        DOCKER_HOST="unix:///nonexistent/docker.sock",
    )
    folder = tmp_path / "nb"
    notebook(folder / "two.ipynb", ["print(1)", "print(2)"])
    try:
        done = tool(
            kenv,
            folder,
            sys.executable,
            "-m",
            "jupyter",
            "execute",
            "--inplace",
            "--kernel_name=sandbox",
            "two.ipynb",
        )
        assert done.returncode == 0, done.stderr[-3000:]
        said = [line for line in done.stderr.splitlines() if "runs on the local backend" in line]
        assert len(said) == 1, done.stderr
        assert "cannot reach the Docker engine at unix:///nonexistent/docker.sock" in said[0]
        assert "SANDBOX_KERNEL_BACKEND=local" in said[0]
        cells = nbformat.read(folder / "two.ipynb", 4).cells
        assert [[o.get("text") for o in c.outputs] for c in cells] == [["1\n"], ["2\n"]]
    finally:
        SandboxService(kenv.config(backend="local")).destroy(None, f"sk-{kenv.user}")


def test_uninstall_removes_this_installation_only(kenv: KernelEnv, tmp_path: Path) -> None:
    key = ScopeKey(kenv.user)
    service = SandboxService(kenv.config())
    info = service.ensure(key).info
    service.create_snapshot(kenv.user, info.id, "base")
    (kenv.workspace / "notes.txt").write_text("mine")
    # Another installation on the same engine (another state folder), and its sandbox.
    neighbour = SandboxService(kenv.config(state_dir=str(tmp_path / "other-state")))
    theirs = neighbour.ensure(key).info
    data = tmp_path / "jupyter-data"
    env = cli_env(kenv, JUPYTER_DATA_DIR=str(data))
    env.pop("JUPYTER_PATH")
    done = subprocess.run(
        [CLI, "install", "--user", "--name", "sandbox-big", "--flavor", "large"],
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert done.returncode == 0, done.stderr
    gone_venv = data / "kernels" / "sandbox-old"
    gone_venv.mkdir(parents=True)
    spec = {"argv": ["/no/such/venv/bin/python", "-m", "sandbox_kernel", "-f", "{connection_file}"]}
    (gone_venv / "kernel.json").write_text(json.dumps(spec))
    plain = data / "kernels" / "python-other"
    plain.mkdir()
    (plain / "kernel.json").write_text(
        json.dumps({"argv": ["python3", "-m", "ipykernel_launcher"]})
    )
    dry = subprocess.run(
        [CLI, "uninstall", "--dry-run"], env=env, capture_output=True, text=True, timeout=120
    )
    assert dry.returncode == 0, dry.stderr
    for what in (
        "would remove kernelspec sandbox-big",
        "would remove kernelspec sandbox-old",
        "which no longer exists",
        f"would remove sandbox {info.id} of {kenv.user} (docker)",
        f"would remove snapshot base of {kenv.user} (docker)",
        f"would remove the state folder {kenv.config().state_dir}",
        f"keeping the workspaces in {kenv.config().workspace_root}",
    ):
        assert what in dry.stdout, (what, dry.stdout)
    assert "python-other" not in dry.stdout and service.backend.find(info.id) is not None
    done = subprocess.run([CLI, "uninstall"], env=env, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stdout + done.stderr
    assert "kept the network sandbox-kernel" in done.stdout
    assert not (data / "kernels" / "sandbox-big").exists() and not gone_venv.exists()
    assert plain.exists()
    client = docker.from_env()
    assert client.containers.get(theirs.engine_id).status == "running"  # never another's
    with pytest.raises(docker.errors.NotFound):
        client.containers.get(info.engine_id)
    assert not [
        i
        for i in client.images.list(filters={"label": "sandbox-kernel.snapshot"})
        if i.labels.get("sandbox-kernel.user") == kenv.user
    ]
    state = Path(kenv.config().state_dir)
    images = state / "disks" / "workspace"
    if disks.support().ok:  # the workspace's files are in its disk image: kept with it
        assert f"keeping the workspaces' disk images in {images}" in done.stdout
        left = {str(p.relative_to(state)) for p in state.rglob("*") if not p.is_dir()}
        assert f"disks/workspace/{key.user_id}.img" in left, left
        assert all(p.startswith("disks/workspace/") for p in left), left
        disks.release_beneath(kenv.workspace)  # as a reboot would
        assert not (kenv.workspace / "notes.txt").exists()
        again = SandboxService(kenv.config()).ensure(key).info  # installed again
        assert (kenv.workspace / "notes.txt").read_text() == "mine"
        SandboxService(kenv.config()).destroy(None, again.id)
    else:
        assert not state.exists()
        assert (kenv.workspace / "notes.txt").read_text() == "mine"
    shutil.rmtree(tmp_path / "other-state", ignore_errors=True)


def test_uninstall_with_workspaces_removes_them_and_their_disk_images(
    kenv: KernelEnv, tmp_path: Path
) -> None:
    """--workspaces takes the workspaces' disk images off their folders first, then
    removes both: nothing of the installation is left, nothing is left mounted."""
    service = SandboxService(kenv.config())
    service.ensure(ScopeKey(kenv.user))
    (kenv.workspace / "notes.txt").write_text("mine")
    env = cli_env(kenv, JUPYTER_DATA_DIR=str(tmp_path / "jupyter-data"))
    env.pop("JUPYTER_PATH")
    done = subprocess.run(
        [CLI, "uninstall", "--workspaces"], env=env, capture_output=True, text=True, timeout=300
    )
    assert done.returncode == 0, done.stdout + done.stderr
    config = kenv.config()
    assert not Path(config.state_dir).exists()
    assert not Path(config.workspace_root).exists()
    assert not [m for m in disks.mount_points() if m[1].startswith(config.workspace_root)]


def test_papermill_from_the_checkout_root_reads_beside_the_notebook_with_cwd(
    tmp_path: Path,
) -> None:
    """As with ipykernel, papermill starts the kernel in the folder it runs in; `--cwd`
    names the notebook's folder, and cells read the data beside it (the recipe the
    README gives for CI)."""
    checkout = tmp_path / "repo"
    (checkout / ".git").mkdir(parents=True)
    notebook(checkout / "notebooks" / "report.ipynb", ["print(open('data.txt').read())"])
    (checkout / "notebooks" / "data.txt").write_text("beside the notebook")
    kenv = make_kernel_env(tmp_path / "k", SANDBOX_KERNEL_WORK_ROOT="auto")
    env = cli_env(kenv)
    args = [sys.executable, "-m", "papermill", "-k", "sandbox", "notebooks/report.ipynb"]
    done = tool(kenv, checkout, *args, "out.ipynb", "--cwd", "notebooks", env=env)
    assert done.returncode == 0, done.stderr[-3000:]
    assert nbformat.read(checkout / "out.ipynb", 4).cells[0].outputs[0]["text"] == (
        "beside the notebook\n"
    )
    done = tool(kenv, checkout, *args, "out2.ipynb", env=env)
    remove_user_containers(kenv.user)
    assert done.returncode != 0 and "FileNotFoundError" in done.stdout + done.stderr


def test_doctor_without_an_engine_says_what_backend_auto_falls_back_to(
    kenv: KernelEnv, tmp_path: Path
) -> None:
    env = cli_env(
        kenv,
        SANDBOX_KERNEL_BACKEND="auto",
        DOCKER_HOST="unix:///nonexistent/docker.sock",
        PIP_INDEX_URL="https://127.0.0.1:9/simple/",  # nothing listens: refused at once
    )
    try:
        done = subprocess.run(
            [CLI, "doctor"], env=env, cwd=tmp_path, capture_output=True, text=True, timeout=120
        )
        lines = dict(line.split(None, 1) for line in done.stdout.splitlines())
        assert done.returncode == 1, done.stdout + done.stderr
        assert lines["engine"].startswith(
            "problem: cannot reach the Docker engine at unix:///nonexistent"
        )
        assert (
            "local sandboxes" in lines["engine"]
            and "SANDBOX_KERNEL_BACKEND=local" in lines["engine"]
        )
        assert lines["image"].startswith("ok: none needed")
        assert lines["sandbox"].startswith(f"ok: sk-{kenv.user} runs (made now)")
        assert lines["index"].startswith(
            "problem: the sandbox cannot reach https://127.0.0.1:9/simple/"
        )
        assert lines["workspace"] == "ok: /workspace writable from the sandbox"
    finally:
        SandboxService(kenv.config(backend="local")).destroy(None, f"sk-{kenv.user}")
