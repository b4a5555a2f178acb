"""Files where you work: cells run beside the notebook, in every way a notebook is run.

A CI checkout run by ``jupyter execute --inplace`` and by papermill, a notebook opened
through a real Jupyter server (its contents API sees what the cell wrote), one user's
notebooks in two folders, and the hostile side of a mounted host folder (no links,
FIFOs or sockets can be made there, dot-entries read-only or hidden). Real Docker.
"""

from __future__ import annotations

import json
import os
import stat
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import nbformat
import pytest

from sandbox_kernel.folders import folder_tag
from sandbox_kernel.service import SandboxService

from .conftest import remove_user_containers
from .kernel_env import KernelEnv, make_kernel_env

pytestmark = pytest.mark.docker

REPO = Path(__file__).resolve().parent.parent

# The notebook a CI job runs: data beside it, a result written beside it.
REPORT = [
    "import csv, os\nrows = list(csv.reader(open('data.csv')))\nprint(len(rows), os.getcwd())",
    "open('out.csv', 'w').write('total,' + str(sum(int(r[1]) for r in rows[1:])))",
    "from IPython.display import Image\nImage('pic.png')",
]
PNG = bytes.fromhex(
    "89504e470d0a1a0a0000000d4948445200000001000000010806000000"
    "1f15c4890000000d49444154789c6360000002000100e221bc330000000049454e44ae426082"
)


@pytest.fixture
def kenv(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[KernelEnv]:
    """The test kernelspec with the default work folder choice (``auto``)."""
    env = make_kernel_env(tmp_path / "k", SANDBOX_KERNEL_WORK_ROOT="auto")
    monkeypatch.setenv("JUPYTER_PATH", env.jupyter_path)
    yield env
    remove_user_containers(env.user)


def make_checkout(root: Path) -> Path:
    """A repository checkout as a CI runner has it: notebook, data and a picture, a .git."""
    checkout = root / "repo"
    (checkout / "notebooks").mkdir(parents=True)
    (checkout / ".git" / "hooks").mkdir(parents=True)
    (checkout / ".git" / "HEAD").write_text("ref: refs/heads/main\n")
    nb = nbformat.v4.new_notebook()
    nb.cells = [nbformat.v4.new_code_cell(c) for c in REPORT]
    nb.metadata["kernelspec"] = {"name": "sandbox", "display_name": "sandbox", "language": "python"}
    nbformat.write(nb, checkout / "notebooks" / "report.ipynb")
    (checkout / "notebooks" / "data.csv").write_text("name,n\na,1\nb,2\n")
    (checkout / "notebooks" / "pic.png").write_bytes(PNG)
    return checkout


def run_tool(kenv: KernelEnv, cwd: Path, *cmd: str) -> subprocess.CompletedProcess[str]:
    env = {**kenv.environ(), "JUPYTER_PATH": kenv.jupyter_path}
    done = subprocess.run(list(cmd), cwd=cwd, env=env, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-3000:]
    return done


def outputs(path: Path) -> list[list[dict[str, Any]]]:
    return [[dict(o) for o in cell.outputs] for cell in nbformat.read(path, as_version=4).cells]


def service_for(kenv: KernelEnv) -> SandboxService:
    return SandboxService(kenv.config())


def test_ci_checkout_with_jupyter_execute_inplace(kenv: KernelEnv, tmp_path: Path) -> None:
    """`jupyter execute --inplace report.ipynb` in a checkout: the data beside it is read,
    the picture shows, the result lands beside it, owned by the host user."""
    checkout = make_checkout(tmp_path / "ci")
    folder = checkout / "notebooks"
    run_tool(
        kenv,
        folder,
        sys.executable,
        "-m",
        "jupyter",
        "execute",
        "--inplace",
        "--kernel_name=sandbox",
        "report.ipynb",
    )
    cells = outputs(folder / "report.ipynb")
    stdout = [o for o in cells[0] if o.get("name") == "stdout"]
    assert stdout[0]["text"] == f"3 {folder}\n"  # os.getcwd() is the notebook's folder
    assert cells[2][0]["data"]["image/png"]  # Image('pic.png') found the file beside the notebook
    out = folder / "out.csv"
    assert out.read_text() == "total,3"
    assert out.stat().st_uid == os.getuid() and out.stat().st_gid == os.getgid()
    # One sandbox for the checkout (the repository around the notebook), not the user's plain one.
    (item,) = service_for(kenv).list(kenv.user)
    assert item["id"] == f"sk-{kenv.user}--w{folder_tag(str(checkout))}" and item[
        "work_folder"
    ] == str(checkout)


def test_papermill_with_parameters_in_a_checkout(kenv: KernelEnv, tmp_path: Path) -> None:
    """papermill -p in a checkout: parameters injected, data read beside the notebook."""
    checkout = make_checkout(tmp_path / "pm")
    folder = checkout / "notebooks"
    nb = nbformat.read(folder / "report.ipynb", as_version=4)
    params = nbformat.v4.new_code_cell("factor = 1")
    params.metadata["tags"] = ["parameters"]
    nb.cells.insert(0, params)
    nb.cells.append(nbformat.v4.new_code_cell("print('scaled', factor * len(rows))"))
    nbformat.write(nb, folder / "param.ipynb")
    run_tool(
        kenv,
        folder,
        sys.executable,
        "-m",
        "papermill",
        "-k",
        "sandbox",
        "param.ipynb",
        "param-out.ipynb",
        "-p",
        "factor",
        "10",
    )
    cells = outputs(folder / "param-out.ipynb")
    texts = ["".join(o.get("text", "") for o in c) for c in cells]
    assert any("scaled 30" in t for t in texts), texts
    assert (folder / "out.csv").read_text() == "total,3"


def test_host_folder_is_hostile_ground(kenv: KernelEnv, tmp_path: Path) -> None:
    """A cell cannot plant links, FIFOs or sockets in the host folder (they would turn
    JupyterLab or `jupyter execute --inplace` against the host user), cannot touch the
    checkout's .git (hooks run on the host), and cannot make setuid files there."""
    checkout = make_checkout(tmp_path / "hostile")
    folder = checkout / "notebooks"
    probe = folder / "probe.ipynb"
    nb = nbformat.v4.new_notebook()
    nb.cells = [
        nbformat.v4.new_code_cell(
            "import os, socket, errno\n"
            "def attempt(name, fn):\n"
            "    try:\n"
            "        fn(); print(name, 'made')\n"
            "    except OSError as e:\n"
            "        print(name, 'refused', errno.errorcode.get(e.errno))\n"
            "attempt('symlink', lambda: os.symlink('/etc/passwd', 'report-link.ipynb'))\n"
            "attempt('dirlink', lambda: os.symlink('/', 'rootlink'))\n"
            "attempt('fifo', lambda: os.mkfifo('pipe'))\n"
            "attempt('socket', lambda: socket.socket(socket.AF_UNIX).bind('sock'))\n"
            "attempt('hook', lambda: open('../.git/hooks/post-checkout', 'w').write('#!/bin/sh\\necho pwned'))\n"
            "attempt('setuid', lambda: (open('x', 'w').close(), os.chmod('x', 0o4755)))\n"
            "attempt('tmp-symlink', lambda: os.symlink('/etc/passwd', '/home/sandbox/ok-link'))\n"
            "attempt('write', lambda: open('fine.txt', 'w').write('ok'))\n"
        )
    ]
    nb.metadata["kernelspec"] = {"name": "sandbox", "display_name": "sandbox", "language": "python"}
    nbformat.write(nb, probe)
    run_tool(
        kenv,
        folder,
        sys.executable,
        "-m",
        "jupyter",
        "execute",
        "--inplace",
        "--kernel_name=sandbox",
        "probe.ipynb",
    )
    stdout = "".join(o.get("text", "") for o in outputs(probe)[0] if o.get("name") == "stdout")
    said = dict(line.split(" ", 1) for line in stdout.splitlines())
    assert said["symlink"].startswith("refused") and said["dirlink"].startswith("refused")
    assert said["fifo"].startswith("refused") and said["socket"].startswith("refused")
    assert said["hook"].startswith("refused") and said["setuid"].startswith("refused")
    assert (
        said["tmp-symlink"] == "made" and said["write"] == "made"
    )  # elsewhere, and plain files: fine
    for name in ("report-link.ipynb", "rootlink", "pipe", "sock"):
        assert not os.path.lexists(folder / name)
    assert not (checkout / ".git" / "hooks" / "post-checkout").exists()
    assert not (folder / "x").stat().st_mode & (stat.S_ISUID | stat.S_ISGID)


def test_code_left_for_the_next_kernel_runs_only_restricted(
    kenv: KernelEnv, tmp_path: Path
) -> None:
    """Attack: a cell leaves code for the next kernel's interpreter to run at its start,
    before the agent restricts it: a ``.pth`` file in the user's site-packages and a
    ``ctypes.py`` in the notebook's folder (the start program imports ctypes), each
    planting a link in the host folder. The next kernels (cold, and from the warm spare)
    must run the .pth only once restricted (its link refused) and never the module; the
    user's site-packages and the notebook's folder still import, in ipykernel's order."""
    checkout = make_checkout(tmp_path / "planted")
    folder = checkout / "notebooks"
    link_attempt = (
        "import os\n"
        "try:\n"
        "    os.symlink('/etc/passwd', {link!r}); said = 'made'\n"
        "except OSError:\n"
        "    said = 'refused'\n"
        "open({log!r}, 'a').write(said + '\\n')\n"
    )
    pth_code = link_attempt.format(link=str(folder / "pth-link"), log="/tmp/pth-said")
    cwd_code = link_attempt.format(link=str(folder / "cwd-link"), log="/tmp/cwd-said")
    plant = nbformat.v4.new_notebook()
    plant.cells = [
        nbformat.v4.new_code_cell(
            "import os, site\n"
            "user_site = site.getusersitepackages()\n"
            "os.makedirs(user_site, exist_ok=True)\n"
            f"open(os.path.join(user_site, 'planted.py'), 'w').write({pth_code!r})\n"
            "open(os.path.join(user_site, 'zz-planted.pth'), 'w').write('import planted\\n')\n"
            "open(os.path.join(user_site, 'usermod.py'), 'w').write('WHERE = \"user site\"\\n')\n"
            f"open('ctypes.py', 'w').write({cwd_code!r} + 'raise ImportError(\"planted\")\\n')\n"
            "open('localmod.py', 'w').write('WHERE = \"notebook folder\"\\n')\n"
        ),
        nbformat.v4.new_code_cell("import time; time.sleep(5)  # a warm spare comes meanwhile"),
    ]
    check = nbformat.v4.new_notebook()
    check.cells = [
        nbformat.v4.new_code_cell(
            "import time\n"
            "time.sleep(5)  # the kernel leaves a warm spare for the next run meanwhile\n"
            "import json, site, sys, usermod, localmod\n"
            "system = [i for i, p in enumerate(sys.path) if p in site.getsitepackages()]\n"
            "print(json.dumps([sys.path[0], usermod.WHERE, localmod.WHERE,\n"
            "    sys.path.index(site.getusersitepackages()) < min(system)]))\n"
        ),
        # The agent's own output thread made to run a cell's code: a warm spare started
        # it long before it was restricted, once.
        nbformat.v4.new_code_cell(
            "import os, sys, time\n"
            "def attack():\n"
            "    try:\n"
            f"        os.symlink('/etc/passwd', {str(folder / 'flusher-link')!r}); said = 'made'\n"
            "    except OSError:\n"
            "        said = 'refused'\n"
            "    open('/tmp/flusher-said', 'a').write(said + '\\n')\n"
            "sys.stdout.output.flush = attack\n"
            "sys.stdout.output.wake.set()\n"
            "time.sleep(1)\n"
        ),
    ]
    for name, nb in (("plant.ipynb", plant), ("check.ipynb", check)):
        nb.metadata["kernelspec"] = {
            "name": "sandbox",
            "display_name": "sandbox",
            "language": "python",
        }
        nbformat.write(nb, folder / name)
    run = ("-m", "jupyter", "execute", "--inplace", "--kernel_name=sandbox")
    run_tool(kenv, folder, sys.executable, *run, "plant.ipynb")
    for _ in range(3):  # each takes the warm spare the previous kernel left
        run_tool(kenv, folder, sys.executable, *run, "--allow-errors", "check.ipynb")
        (shown,) = outputs(folder / "check.ipynb")[0]
        assert json.loads(shown.get("text", "null")) == [
            "",
            "user site",
            "notebook folder",
            True,
        ], shown
    for link in ("pth-link", "cwd-link", "flusher-link"):
        assert not os.path.lexists(folder / link), link
    (info,) = service_for(kenv).list(kenv.user)
    logs = service_for(kenv).exec(
        service_for(kenv).backend.get(info["id"]),
        [
            "sh",
            "-c",
            "cat /tmp/pth-said; echo --; cat /tmp/cwd-said 2>/dev/null; echo --; cat /tmp/flusher-said",
        ],
    )
    pth, cwd, flusher = logs.output.decode().split("--")
    assert len(flusher.split()) >= 3 and set(flusher.split()) == {"refused"}, logs.output
    assert pth.split() and set(pth.split()) == {"refused"}, logs.output  # ran, restricted
    assert cwd.split() == [], logs.output  # never imported


def test_one_user_two_folders(kenv: KernelEnv, tmp_path: Path) -> None:
    """Two checkouts of one user: two sandboxes (each with its folder), one workspace."""
    one = make_checkout(tmp_path / "one") / "notebooks"
    two = make_checkout(tmp_path / "two") / "notebooks"
    for folder in (one, two):
        nb = nbformat.read(folder / "report.ipynb", as_version=4)
        nb.cells.append(
            nbformat.v4.new_code_cell(
                "open('/workspace/shared.txt', 'a').write(os.getcwd() + '\\n')"
            )
        )
        nbformat.write(nb, folder / "report.ipynb")
        run_tool(
            kenv,
            folder,
            sys.executable,
            "-m",
            "jupyter",
            "execute",
            "--inplace",
            "--kernel_name=sandbox",
            "report.ipynb",
        )
        assert (folder / "out.csv").read_text() == "total,3"
    ids = sorted(i["id"] for i in service_for(kenv).list(kenv.user))
    assert len(ids) == 2
    assert (kenv.workspace / "shared.txt").read_text().splitlines() == [str(one), str(two)]


@pytest.fixture
def server_env(tmp_path: Path, test_user: str, monkeypatch: pytest.MonkeyPatch) -> Iterator[Path]:
    root = tmp_path / "lab-root"
    (root / "projects" / "a").mkdir(parents=True)
    (root / "projects" / "b").mkdir(parents=True)
    env = make_kernel_env(tmp_path / "k", SANDBOX_KERNEL_WORK_ROOT="auto")
    spec = json.loads((Path(env.jupyter_path) / "kernels" / "sandbox" / "kernel.json").read_text())
    spec["env"]["SANDBOX_KERNEL_USER"] = test_user
    (Path(env.jupyter_path) / "kernels" / "sandbox" / "kernel.json").write_text(json.dumps(spec))
    monkeypatch.setenv("JUPYTER_PATH", env.jupyter_path)
    for name in ("BACKEND", "IMAGE", "WORKSPACE_ROOT", "STATE_DIR"):
        monkeypatch.setenv(f"SANDBOX_KERNEL_{name}", spec["env"][f"SANDBOX_KERNEL_{name}"])
    monkeypatch.setenv("SANDBOX_KERNEL_USER", test_user)
    yield root
    remove_user_containers(test_user)


@pytest.fixture
def jp_server_config(server_env: Path) -> dict[str, Any]:
    return {
        "ServerApp": {"jpserver_extensions": {"jupyter_ext": True}, "root_dir": str(server_env)},
        "SandboxExtension": {"gc_interval": 0},
    }


async def _run_in_session(jp_fetch: Any, jp_serverapp: Any, path: str, code: str) -> str:
    """Open a notebook session through the server (as JupyterLab does) and run a cell."""
    body = json.dumps({"path": path, "type": "notebook", "name": "", "kernel": {"name": "sandbox"}})
    session = json.loads((await jp_fetch("api", "sessions", method="POST", body=body)).body)
    km = jp_serverapp.kernel_manager.get_kernel(session["kernel"]["id"])
    assert km.transport == "ipc"  # the kernelspec's provisioner applies to the server's kernels too
    # The kernel's own manager's client: it asks the manager whether the kernel lives. A
    # bare client judges by heartbeats, and one late ping on a loaded machine reads to it
    # as a dead kernel ("Kernel died before replying to kernel_info").
    client = km.client()
    client.start_channels()
    try:
        await client.wait_for_ready(timeout=120)
        chunks: list[str] = []
        reply = await client.execute_interactive(
            code,
            timeout=120,
            output_hook=lambda m: (
                chunks.append(m["content"].get("text", ""))
                if m["msg_type"] == "stream" and m["content"]["name"] == "stdout"
                else None
            ),
        )
        assert reply["content"]["status"] == "ok", reply["content"]
        return "".join(chunks)
    finally:
        client.stop_channels()


async def test_jupyterlab_sees_what_cells_write(
    jp_fetch: Any, jp_serverapp: Any, server_env: Path, test_user: str
) -> None:
    """Through a real server: a file put by the contents API (a drag into the file
    browser) is read by the cell; what the cell writes beside its notebook is listed by
    the contents API. Notebooks in two folders of the server share one sandbox."""
    put = json.dumps({"type": "file", "format": "text", "content": "dragged in"})
    await jp_fetch("api", "contents", "projects", "a", "dropped.txt", method="PUT", body=put)
    said = await _run_in_session(
        jp_fetch,
        jp_serverapp,
        "projects/a/one.ipynb",
        "import os\nprint(open('dropped.txt').read(), os.getcwd())\nopen('from-cell.csv', 'w').write('x,y')",
    )
    assert said == f"dragged in {server_env / 'projects' / 'a'}\n"
    listed = json.loads((await jp_fetch("api", "contents", "projects", "a")).body)
    assert "from-cell.csv" in [item["name"] for item in listed["content"]]
    assert (server_env / "projects" / "a" / "from-cell.csv").stat().st_uid == os.getuid()
    said = await _run_in_session(
        jp_fetch,
        jp_serverapp,
        "projects/b/two.ipynb",
        "import os\nprint(os.getcwd(), os.path.exists('../a/from-cell.csv'))",
    )
    assert said == f"{server_env / 'projects' / 'b'} True\n"
    sandboxes = json.loads((await jp_fetch("api", "sandboxes")).body)
    assert [s["id"] for s in sandboxes] == [f"sk-{test_user}"]  # the server's root: the plain id


def test_readme_quick_start_shows_the_counter(kenv: KernelEnv, tmp_path: Path) -> None:
    """The README's quick start as written (examples/hello.ipynb by `jupyter execute`, then
    `cat examples/runs.txt`), twice: one line per run, kept between kernels."""
    checkout = tmp_path / "clone"
    (checkout / "examples").mkdir(parents=True)
    source = Path(__file__).resolve().parent.parent / "examples" / "hello.ipynb"
    (checkout / "examples" / "hello.ipynb").write_bytes(source.read_bytes())
    readme = (Path(__file__).resolve().parent.parent / "README.md").read_text()
    assert (
        "jupyter execute --kernel_name=sandbox examples/hello.ipynb && cat examples/runs.txt"
        in readme
    )
    for run in (1, 2):
        run_tool(
            kenv,
            checkout,
            sys.executable,
            "-m",
            "jupyter",
            "execute",
            "--kernel_name=sandbox",
            "examples/hello.ipynb",
        )
        lines = (checkout / "examples" / "runs.txt").read_text().splitlines()
        assert len(lines) == run and all(
            "uid 1000" in line and "sandbox " in line for line in lines
        ), lines
    assert len({line.split("sandbox ")[1] for line in lines}) == 1  # the same sandbox both times


def test_cli_in_a_checkout_never_runs_what_a_cell_left_there(
    kenv: KernelEnv, tmp_path: Path
) -> None:
    """`sandbox-kernel exec` in a checkout makes the checkout's sandbox, which (on a root
    server) starts a helper process in that folder: a ctypes.py a cell wrote there must
    not run on the host."""
    checkout = make_checkout(tmp_path / "cli")
    folder = checkout / "notebooks"
    marker = tmp_path / "planted-ran"
    (folder / "ctypes.py").write_text(f"open({str(marker)!r}, 'w').write('ran')\n")
    cfg = kenv.config()
    env = {
        **kenv.environ(),
        "SANDBOX_KERNEL_BACKEND": "docker",
        "SANDBOX_KERNEL_IMAGE": cfg.image,
        "SANDBOX_KERNEL_WORKSPACE_ROOT": cfg.workspace_root,
        "SANDBOX_KERNEL_STATE_DIR": cfg.state_dir,
        "SANDBOX_KERNEL_USER": kenv.user,
        "SANDBOX_KERNEL_WORK_ROOT": "auto",
    }
    cli = Path(sys.executable).parent / "sandbox-kernel"
    done = subprocess.run(
        [str(cli), "exec", "--", "python3", "-c", "print('inside')"],
        cwd=folder,
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert done.returncode == 0 and done.stdout.strip() == "inside", done.stderr[-2000:]
    assert not marker.exists()
