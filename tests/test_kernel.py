"""The sandbox kernel end to end: real kernels (jupyter_client, nbclient, jupyter
execute) against real Docker sandboxes of the locally built test image."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import docker
import nbformat
import pytest
from jupyter_client.manager import start_new_kernel
from nbclient import NotebookClient

from sandbox_kernel.service import SandboxService

from .conftest import remove_user_containers, sandbox_container
from .helpers import GRANDPARENT, SPARE_PID_PROBE, make_wheel
from .kernel_env import ConformanceSuite, KernelEnv, make_kernel_env

pytestmark = pytest.mark.docker


@pytest.fixture(scope="module")
def kenv(tmp_path_factory: pytest.TempPathFactory) -> Iterator[KernelEnv]:
    env = make_kernel_env(tmp_path_factory.mktemp("kernel"))
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("JUPYTER_PATH", env.jupyter_path)
        yield env
    remove_user_containers(env.user)


@pytest.fixture(autouse=True)
def _kernelspec_visible(kenv: KernelEnv, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("JUPYTER_PATH", kenv.jupyter_path)


def run(
    kc: Any, code: str, timeout: float = 60, allow_stdin: bool = False
) -> tuple[dict, list[dict]]:
    """Execute and collect (reply content, iopub messages of that request)."""
    msg_id = kc.execute(code, allow_stdin=allow_stdin)
    outputs = []
    while True:
        msg = kc.get_iopub_msg(timeout=timeout)
        if msg["parent_header"].get("msg_id") != msg_id:
            continue
        if msg["msg_type"] == "status" and msg["content"]["execution_state"] == "idle":
            break
        if msg["msg_type"] not in ("status", "execute_input"):
            outputs.append(msg)
    while True:
        reply = kc.get_shell_msg(timeout=timeout)
        if reply["parent_header"].get("msg_id") == msg_id:
            return reply["content"], outputs


def wait_for_iopub(kc: Any, timeout: float = 60) -> None:
    """Wait for the kernel's welcome on iopub (JEP 65): until the subscription reaches
    the kernel, what it publishes is dropped (ZeroMQ's slow joiner), so a client that
    executes before then may never see the cell's idle status. jupyter_client's
    `wait_for_ready` waits for this too, but asks on the shell channel."""
    deadline = time.monotonic() + timeout
    while kc.get_iopub_msg(timeout=max(0.0, deadline - time.monotonic()))["msg_type"] != (
        "iopub_welcome"
    ):
        pass


def text_of(outputs: list[dict], name: str = "stdout") -> str:
    return "".join(
        m["content"]["text"]
        for m in outputs
        if m["msg_type"] == "stream" and m["content"]["name"] == name
    )


def container_id(user: str) -> str:
    return sandbox_container(f"sk-{user}").id


@pytest.fixture
def kernel(kenv: KernelEnv) -> Iterator[tuple[Any, Any]]:
    km, kc = start_new_kernel(kernel_name="sandbox")
    yield km, kc
    kc.stop_channels()
    km.shutdown_kernel(now=True)


class TestConformance(ConformanceSuite):
    """The official kernel conformance suite, against the Docker backend."""

    __test__ = True

    @classmethod
    def clean_up(cls) -> None:
        remove_user_containers(cls.kenv.user)

    def test_language_version_is_the_sandboxes(self) -> None:
        self.flush_channels()
        info = self.kc.kernel_info(reply=True, timeout=30)["content"]
        assert info["language_info"]["version"].startswith("3.11")  # the image's python
        assert info["supported_features"] == []


START_PATH = """
import io, json, logging, sys
from sandbox_kernel.config import load_config
from sandbox_kernel.identity import scope_key
from sandbox_kernel.kernel import SandboxKernel
from sandbox_kernel.session import SandboxSession

log = io.StringIO()
logging.getLogger("sandbox_kernel").addHandler(logging.StreamHandler(log))
logging.getLogger("sandbox_kernel").setLevel(logging.INFO)
cfg = load_config()
session = SandboxSession(cfg, scope_key(cfg, "k1"), "k1")
agent = session.open()
kernel = SandboxKernel.__new__(SandboxKernel)
kernel._python_version = agent.ready["python_version"]
info = kernel.kernel_info
agent.close()
heavy = ("docker", "requests", "urllib3", "debugpy", "ipykernel.debugger")
print(json.dumps({
    "loaded": [name for name in heavy if name in sys.modules],
    "log": log.getvalue(),
    "version": info["language_info"]["version"],
    "features": info["supported_features"],
}))
"""


def test_a_kernels_start_loads_neither_the_sdk_nor_a_debugger(tmp_path: Path) -> None:
    """The kernel's start (make or find the sandbox, start the interpreter) speaks to
    the engine's socket itself, and its kernel_info never loads ipykernel's debugger:
    the docker SDK (requests) and debugpy cost about 110 ms of CPU in the process that
    is answering Jupyter's first request."""
    kenv = make_kernel_env(tmp_path)
    spec = json.loads((Path(kenv.jupyter_path) / "kernels" / "sandbox" / "kernel.json").read_text())
    env = {**os.environ, **spec["env"], "SANDBOX_KERNEL_MAX_SANDBOXES": "50"}  # a quota: a listing

    def start() -> dict[str, Any]:
        done = subprocess.run(
            [sys.executable, "-c", START_PATH], env=env, capture_output=True, text=True, timeout=180
        )
        assert done.returncode == 0, done.stderr[-2000:]
        return dict(json.loads(done.stdout.splitlines()[-1]))

    try:
        made = start()  # no sandbox yet: it is made
        assert "creating sandbox" in made["log"]
        again = start()  # it runs: found
        sandbox_container(f"sk-{kenv.user}").stop(timeout=1)  # type: ignore[attr-defined]
        restarted = start()  # it had stopped: started again
        for run in (made, again, restarted):
            assert run["loaded"] == [], run
            assert run["version"].startswith("3.11") and run["features"] == []
    finally:
        remove_user_containers(kenv.user)


def test_first_cell_stores_nothing_of_the_sandbox(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Making the sandbox is the kernel's business, not the cell's output (a CI run must
    store what ipykernel stores); the status bar and the log get the progress."""
    from sandbox_kernel.config import load_config
    from sandbox_kernel.store import Store

    env = make_kernel_env(tmp_path)
    monkeypatch.setenv("JUPYTER_PATH", env.jupyter_path)
    km, kc = start_new_kernel(kernel_name="sandbox")
    try:
        reply, outputs = run(kc, "1")
        assert reply["status"] == "ok"
        assert [m["msg_type"] for m in outputs] == ["execute_result"]
        progress = Store(load_config(environ={}, state_dir=str(env.root / "state"))).progress(
            "docker", since=0
        )
        assert any(f"creating sandbox sk-{env.user}" in p["message"] for p in progress), progress
    finally:
        kc.stop_channels()
        km.shutdown_kernel(now=True)
        remove_user_containers(env.user)


@pytest.mark.parametrize("sandbox", ["made", "running"])
def test_a_kernel_asked_first_on_control_still_runs_cells(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, sandbox: str
) -> None:
    """Jupyter's server asks kernel_info on the control channel too, and that may come
    first (a restart through the server): ipykernel answers control on another thread
    and event loop, and a connection made there left every cell of the kernel waiting
    for ever. Asked there first, the kernel still answers, and its cells run."""
    from jupyter_client.manager import KernelManager

    env = make_kernel_env(tmp_path)
    monkeypatch.setenv("JUPYTER_PATH", env.jupyter_path)
    rounds = 3 if sandbox == "running" else 1
    try:
        if sandbox == "running":
            km, kc = start_new_kernel(kernel_name="sandbox")
            assert run(kc, "1")[0]["status"] == "ok"
            kc.stop_channels()
            km.shutdown_kernel(now=True)
        for _ in range(rounds):
            km = KernelManager(kernel_name="sandbox")
            km.start_kernel()
            kc = km.client()
            kc.start_channels()
            try:
                asked = kc.session.msg("kernel_info_request")
                kc.control_channel.send(asked)
                answer = kc.control_channel.get_msg(timeout=60)
                assert answer["parent_header"]["msg_id"] == asked["header"]["msg_id"]
                assert answer["content"]["language_info"]["name"] == "python"
                wait_for_iopub(kc)
                reply, outputs = run(kc, "print('ran')", timeout=30)
                assert reply["status"] == "ok", reply
                assert [o["content"].get("text") for o in outputs] == ["ran\n"]
            finally:
                kc.stop_channels()
                km.shutdown_kernel(now=True)
    finally:
        remove_user_containers(env.user)


LAZY_IPYTHON = """
import sys, threading
print("before", "IPython.terminal.embed" in sys.modules)
import IPython
got, errors = [], []
def ask():
    try:
        got.append(IPython.sys_info is not None and IPython.embed is not None)
    except Exception as exc:
        errors.append(repr(exc))
threads = [threading.Thread(target=ask) for _ in range(8)]
for t in threads: t.start()
for t in threads: t.join()
from IPython import display, embed
from IPython.core.release import version
print("asked", got.count(True), errors, IPython.__version__ == version)
print("whole", "IPython.terminal.embed" in sys.modules, "embed" in dir(IPython))
print("same shell", IPython.get_ipython() is get_ipython())
"""


def test_the_ipython_package_is_whole_once_something_asks(kernel: tuple[Any, Any]) -> None:
    """The interpreter imports the part of IPython its shell needs and leaves the
    package's own __init__ (its terminal) for the first time a name of it is asked for,
    from any thread; then every name is there, as after a plain import."""
    _, kc = kernel
    reply, outputs = run(kc, LAZY_IPYTHON)
    assert reply["status"] == "ok", outputs
    assert text_of(outputs).splitlines() == [
        "before False",
        "asked 8 [] True",
        "whole True True",
        "same shell True",
    ]


def test_streams_incrementally(kernel: tuple[Any, Any]) -> None:
    _, kc = kernel
    msg_id = kc.execute(
        "import time\nfor i in range(3):\n    print(i, flush=True)\n    time.sleep(0.6)"
    )
    arrivals = []
    while True:
        msg = kc.get_iopub_msg(timeout=30)
        if msg["parent_header"].get("msg_id") != msg_id:
            continue
        if msg["msg_type"] == "stream" and msg["content"]["name"] == "stdout":
            arrivals.append(time.monotonic())
        if msg["msg_type"] == "status" and msg["content"]["execution_state"] == "idle":
            break
    assert len(arrivals) == 3  # one message per printed line, not one at the end
    assert arrivals[-1] - arrivals[0] > 0.9


def test_interrupt_keeps_variables(kernel: tuple[Any, Any]) -> None:
    km, kc = kernel
    run(kc, "kept = 'still here'")
    msg_id = kc.execute("import time; time.sleep(60)")
    time.sleep(1)
    started = time.monotonic()
    km.interrupt_kernel()
    while True:
        reply = kc.get_shell_msg(timeout=10)
        if reply["parent_header"]["msg_id"] == msg_id:
            break
    assert time.monotonic() - started < 2
    assert (
        reply["content"]["status"] == "error" and reply["content"]["ename"] == "KeyboardInterrupt"
    )
    reply, outputs = run(kc, "print(kept)")
    assert reply["status"] == "ok" and text_of(outputs) == "still here\n"


def test_input_through_stdin(kernel: tuple[Any, Any]) -> None:
    _, kc = kernel
    msg_id = kc.execute("name = input('who? ')\nprint('hi', name)", allow_stdin=True)
    request = kc.get_stdin_msg(timeout=30)
    assert request["content"]["prompt"] == "who? "
    kc.input("ada")
    outputs = []
    while True:
        msg = kc.get_iopub_msg(timeout=30)
        if msg["parent_header"].get("msg_id") != msg_id:
            continue
        if msg["msg_type"] == "status" and msg["content"]["execution_state"] == "idle":
            break
        outputs.append(msg)
    assert "hi ada" in text_of(outputs)
    reply, outputs = run(kc, "input()")
    assert reply["status"] == "error" and "does not support input" in reply["evalue"]


def test_update_display_and_rich_outputs(kernel: tuple[Any, Any]) -> None:
    _, kc = kernel
    code = (
        "from IPython.display import display, update_display, SVG\n"
        "h = display('first', display_id='d1')\n"
        "update_display('second', display_id='d1')\n"
        "class P:\n    def _repr_png_(self): return b'\\x89PNG\\r\\n\\x1a\\nfake'\n"
        "display(P())\n"
        "display(SVG('<svg xmlns=\"http://www.w3.org/2000/svg\"></svg>'))\n"
    )
    reply, outputs = run(kc, code)
    assert reply["status"] == "ok"
    kinds = [m["msg_type"] for m in outputs]
    assert kinds == ["display_data", "update_display_data", "display_data", "display_data"]
    assert outputs[1]["content"]["transient"] == {"display_id": "d1"}
    assert "image/png" in outputs[2]["content"]["data"]
    assert "image/svg+xml" in outputs[3]["content"]["data"]


def test_two_kernels_share_files_not_variables(kenv: KernelEnv) -> None:
    km1, kc1 = start_new_kernel(kernel_name="sandbox")
    km2, kc2 = start_new_kernel(kernel_name="sandbox")
    try:
        run(kc1, "secret = 1\nopen('/workspace/shared.txt', 'w').write('from one')")
        reply, outputs = run(kc2, "print(open('/workspace/shared.txt').read())\nsecret")
        assert "from one" in text_of(outputs)
        assert reply["status"] == "error" and reply["ename"] == "NameError"
    finally:
        for km, kc in ((km1, kc1), (km2, kc2)):
            kc.stop_channels()
            km.shutdown_kernel(now=True)


def test_restart_keeps_files_and_container(kernel: tuple[Any, Any], kenv: KernelEnv) -> None:
    km, kc = kernel
    run(kc, "v = 5\nopen('/home/sandbox/outside-workspace.txt', 'w').write('tier 2')")
    before = container_id(kenv.user)
    km.restart_kernel(now=False)
    kc.wait_for_ready(timeout=60)
    reply, outputs = run(kc, "print(open('/home/sandbox/outside-workspace.txt').read())\nv")
    assert "tier 2" in text_of(outputs)
    assert reply["ename"] == "NameError"  # variables start fresh, as after any restart
    assert container_id(kenv.user) == before


def spare_pids(user: str, root: Path) -> list[int]:
    """The warm spare waiting in the user's sandbox, if one listens (see SPARE_PID_PROBE)."""
    out = sandbox_container(f"sk-{user}").exec_run(["python3", "-c", SPARE_PID_PROBE]).output
    pid = int(out.decode().strip() or 0)
    return [pid] if pid else []


def wait_for_spare(kenv: KernelEnv, other_than: int = 0) -> int:
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        pids = [p for p in spare_pids(kenv.user, kenv.root) if p != other_than]
        if pids:
            return pids[0]
        time.sleep(0.2)
    raise AssertionError("no spare interpreter appeared")


def test_restart_takes_a_child_of_the_warm_spare_which_stays(
    kernel: tuple[Any, Any], kenv: KernelEnv
) -> None:
    """A kernel leaves a warm spare behind; the next start gets an interpreter the spare
    forked (fresh variables, its own settings, same files) and the spare stays for the
    kernel after it."""
    km, kc = kernel
    run(kc, "import os\nleftover = 1")
    spare = wait_for_spare(kenv)
    km.restart_kernel(now=True)
    kc.wait_for_ready(timeout=60)
    reply, outputs = run(
        kc, "print(os.getpid() if 'os' in globals() else 'fresh', 'leftover' in globals())"
    )
    assert text_of(outputs) == "fresh False\n"
    run(kc, GRANDPARENT)
    reply, outputs = run(
        kc,
        "import os, sys\nprint(grandparent(), os.getcwd(), os.environ.get('SANDBOX_AGENT_OUTPUT_LIMIT'), sys.stdin.read())",
    )
    parent, cwd, limit, *rest = text_of(outputs).split()
    assert (int(parent), cwd, limit, rest) == (spare, "/workspace", "10000000", [])
    assert spare_pids(kenv.user, kenv.root) == [spare]  # the next kernel's too
    reply, outputs = run(
        kc,
        "import subprocess\nprint(subprocess.run(['echo', 'fd capture'], capture_output=False).returncode)",
    )
    assert text_of(outputs) == "fd capture\n0\n"


def test_kernels_starting_at_once_each_get_a_child_of_the_one_spare(
    kernel: tuple[Any, Any], kenv: KernelEnv
) -> None:
    """A burst of kernels on one sandbox (a CI matrix on one machine): each gets its own
    interpreter, forked by the one warm spare (none starts cold), and the spare stays."""
    from jupyter_client.manager import KernelManager

    spare = wait_for_spare(kenv)
    managers = [KernelManager(kernel_name="sandbox") for _ in range(3)]
    clients = []
    try:
        for km in managers:
            km.start_kernel()  # all three start at once: none waits for another
        for km in managers:
            kc = km.client()
            kc.start_channels()
            clients.append(kc)
            kc.wait_for_ready(timeout=120)
        seen = []
        for kc in clients:
            run(kc, GRANDPARENT)
            _, outputs = run(kc, "import os\nprint(grandparent(), os.getpid())")
            seen.append(tuple(int(word) for word in text_of(outputs).split()))
        assert {parent for parent, _ in seen} == {spare}, seen
        assert len({pid for _, pid in seen}) == 3, seen
        assert spare_pids(kenv.user, kenv.root) == [spare]
    finally:
        for kc in clients:
            kc.stop_channels()
        for km in managers:
            km.shutdown_kernel(now=True)


def test_container_removed_between_cells(kernel: tuple[Any, Any], kenv: KernelEnv) -> None:
    _, kc = kernel
    run(kc, "x = 1\nopen('/workspace/survivor.txt', 'w').write('kept')")
    sandbox_container(f"sk-{kenv.user}").remove(force=True)
    reply, outputs = run(kc, "print(open('/workspace/survivor.txt').read())")
    notices = [
        line for line in text_of(outputs, "stderr").splitlines() if "sandbox restarted" in line
    ]
    assert (
        notices == [notices[0]]
        and "variables were lost, files in /workspace were kept" in notices[0]
    )
    assert reply["status"] == "ok" and text_of(outputs) == "kept\n"
    reply, outputs = run(kc, "x")
    assert reply["ename"] == "NameError"


def test_container_removed_during_a_cell(kernel: tuple[Any, Any], kenv: KernelEnv) -> None:
    _, kc = kernel
    msg_id = kc.execute("import time; time.sleep(30)")
    time.sleep(1)
    sandbox_container(f"sk-{kenv.user}").remove(force=True)
    while True:
        reply = kc.get_shell_msg(timeout=30)
        if reply["parent_header"]["msg_id"] == msg_id:
            break
    assert reply["content"]["status"] == "error"
    assert "was removed" in reply["content"]["evalue"]
    # The reply says it as ipykernel's would (nbclient builds its message from it).
    content = reply["content"]
    assert content["traceback"] == [f"{content['ename']}: {content['evalue']}"]
    reply, outputs = run(kc, "print('back')")
    assert reply["status"] == "ok" and text_of(outputs) == "back\n"
    assert "sandbox restarted" in text_of(outputs, "stderr")


def test_output_flood_is_truncated(kernel: tuple[Any, Any]) -> None:
    _, kc = kernel
    reply, outputs = run(
        kc,
        "import sys\nchunk = 'y' * 1_000_000 + '\\n'\nfor _ in range(200):\n    sys.stdout.write(chunk)",
        timeout=120,
    )
    assert reply["status"] == "ok"
    total = sum(len(m["content"]["text"]) for m in outputs if m["msg_type"] == "stream")
    assert total < 11_000_000
    assert "output truncated" in text_of(outputs, "stderr")
    reply, outputs = run(kc, "print('responsive')")
    assert text_of(outputs) == "responsive\n"


def _notebook(cells: list[str]) -> nbformat.NotebookNode:
    nb = nbformat.v4.new_notebook()
    nb.cells = [nbformat.v4.new_code_cell(c) for c in cells]
    nb.metadata["kernelspec"] = {
        "name": "sandbox",
        "display_name": "Python 3 (sandbox)",
        "language": "python",
    }
    return nb


def test_notebooks_with_nbclient(kenv: KernelEnv) -> None:
    project = kenv.workspace / "project"
    project.mkdir(exist_ok=True)
    (project / "data.csv").write_text("a,b\n1,2\n")
    wheel = make_wheel(kenv.workspace / "wheels")
    nb = _notebook(
        [
            "rows = open('data.csv').read().splitlines()\nrows",
            "len(rows)",
            "from IPython.display import HTML\nHTML('<i>rich</i>')",
            "1/0",
            f"%pip install --no-index -q /workspace/wheels/{wheel.name}",
            "import sk_demo_pkg\nprint(sk_demo_pkg.VALUE)",
            "!echo from-shell",
            "%%bash\necho from-bash",
            "import os\nprint(os.getcwd())\nopen('made-by-notebook.txt', 'w').write('ok')",
        ]
    )
    NotebookClient(
        nb,
        kernel_name="sandbox",
        allow_errors=True,
        timeout=120,
        resources={"metadata": {"path": str(project)}},
    ).execute()
    out = [list(c.outputs) for c in nb.cells]
    assert out[0][0]["data"]["text/plain"] == "['a,b', '1,2']"
    assert out[1][0]["data"]["text/plain"] == "2"
    assert out[2][0]["data"]["text/html"] == "<i>rich</i>"
    assert out[3][0]["ename"] == "ZeroDivisionError"
    assert "1.0" in out[5][0]["text"]
    assert "from-shell" in out[6][0]["text"]
    assert "from-bash" in out[7][0]["text"]
    assert out[8][0]["text"].strip() == "/workspace/project"
    assert (project / "made-by-notebook.txt").read_text() == "ok"
    # A second run is a new kernel in the same sandbox: files and the package are there.
    nb2 = _notebook(
        ["import sk_demo_pkg, os\nprint(sk_demo_pkg.VALUE, os.path.exists('made-by-notebook.txt'))"]
    )
    NotebookClient(
        nb2, kernel_name="sandbox", timeout=120, resources={"metadata": {"path": str(project)}}
    ).execute()
    assert nb2.cells[0].outputs[0]["text"].strip() == "1.0 True"


def test_jupyter_execute(kenv: KernelEnv) -> None:
    project = kenv.workspace / "cli"
    project.mkdir(exist_ok=True)
    (project / "input.txt").write_text("41")
    path = project / "run.ipynb"
    nbformat.write(_notebook(["n = int(open('input.txt').read())", "print(n + 1)"]), path)
    done = subprocess.run(
        [
            sys.executable,
            "-m",
            "jupyter",
            "execute",
            "--kernel_name=sandbox",
            "--inplace",
            str(path),
        ],
        env=kenv.environ(),
        cwd=project,
        capture_output=True,
        text=True,
        timeout=180,
    )
    assert done.returncode == 0, done.stderr
    assert nbformat.read(path, 4).cells[1].outputs[0]["text"] == "42\n"


@pytest.mark.parametrize(
    ("settings", "says", "hint"),
    [
        (
            {"DOCKER_HOST": "unix:///nonexistent/docker.sock"},
            "cannot reach the Docker engine",
            "SANDBOX_KERNEL_BACKEND=local",
        ),
        (
            {"SANDBOX_KERNEL_IMAGE": "127.0.0.1:9/sandbox-kernel/absent:1"},
            "is not present and could not be pulled",
            "SANDBOX_KERNEL_IMAGE",
        ),
    ],
    ids=["no engine", "image missing"],
)
def test_what_the_user_must_fix_is_the_first_cells_one_line_error(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, settings: dict[str, str], says: str, hint: str
) -> None:
    """The kernel still starts; the first cell's error is the message (what went wrong,
    what to do), one line, no traceback, nothing else stored."""
    env = make_kernel_env(tmp_path, **settings)
    monkeypatch.setenv("JUPYTER_PATH", env.jupyter_path)
    km, kc = start_new_kernel(kernel_name="sandbox")
    try:
        reply, outputs = run(kc, "1+1")
        assert reply["status"] == "error"
        assert says in reply["evalue"] and hint in reply["evalue"]
        assert [m["msg_type"] for m in outputs] == ["error"]
        (error,) = [m["content"] for m in outputs]
        assert len(error["traceback"]) == 1 and "\n" not in error["traceback"][0]
        assert "Traceback" not in error["traceback"][0]
        assert reply["traceback"] == error["traceback"]  # the reply says it too
    finally:
        kc.stop_channels()
        km.shutdown_kernel(now=True)
        remove_user_containers(env.user)


def test_out_of_memory_names_the_limit(kernel: tuple[Any, Any]) -> None:
    _, kc = kernel
    run(kc, "before = 1")
    reply, _ = run(kc, "hog = []\nwhile True:\n    hog.append(bytearray(50_000_000))", timeout=120)
    assert reply["status"] == "error"
    assert "memory limit of 1 GiB" in reply["evalue"], reply["evalue"]
    assert reply["traceback"] == [f"{reply['ename']}: {reply['evalue']}"]
    reply, outputs = run(kc, "print('alive')")
    assert text_of(outputs) == "alive\n"
    assert "sandbox restarted" in text_of(outputs, "stderr")


def test_notebook_metadata_picks_the_flavor(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    env = make_kernel_env(tmp_path)
    monkeypatch.setenv("JUPYTER_PATH", env.jupyter_path)
    nb = _notebook(["1"])
    nb.metadata["sandbox"] = {"flavor": "medium"}
    path = tmp_path / "medium.ipynb"
    nbformat.write(nb, path)
    km, kc = start_new_kernel(
        kernel_name="sandbox", env={**os.environ, "JPY_SESSION_NAME": str(path)}
    )
    try:
        reply, _ = run(kc, "1")
        assert reply["status"] == "ok"
        host = sandbox_container(f"sk-{env.user}").attrs["HostConfig"]
        assert host["Memory"] == 2 << 30
    finally:
        kc.stop_channels()
        km.shutdown_kernel(now=True)
        remove_user_containers(env.user)


def test_busy_cell_is_not_idle_and_a_stop_is_reported(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A silent cell is activity; once idle past idle_stop_with_kernel the sandbox is
    stopped, and the next cell says what happened."""
    from sandbox_kernel.lifecycle import gc

    env = make_kernel_env(tmp_path, SANDBOX_KERNEL_IDLE_STOP_WITH_KERNEL="0.05")  # 3 s
    monkeypatch.setenv("JUPYTER_PATH", env.jupyter_path)
    cfg = env.config(
        idle_stop_with_kernel=0.05,
    )
    backend = SandboxService(cfg).backend
    km, kc = start_new_kernel(kernel_name="sandbox")
    try:
        run(kc, "x = 1")
        msg_id = kc.execute("import time; time.sleep(8)")
        for _ in range(3):
            time.sleep(2.5)
            assert [a for a in gc(backend, cfg) if a.sandbox_id == f"sk-{env.user}"] == []
        while kc.get_shell_msg(timeout=30)["parent_header"].get("msg_id") != msg_id:
            pass
        time.sleep(4)
        stopped = [a for a in gc(backend, cfg) if a.sandbox_id == f"sk-{env.user}"]
        assert [a.action for a in stopped] == ["stop"]
        reply, outputs = run(kc, "print('back')")
        assert reply["status"] == "ok" and text_of(outputs) == "back\n"
        assert f"sk-{env.user} had been stopped" in text_of(outputs, "stderr")
    finally:
        kc.stop_channels()
        km.shutdown_kernel(now=True)
        remove_user_containers(env.user)


def test_kernel_start_applies_the_lifecycle_policies(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Hosts without a server still get idle stops: every kernel start runs the reaper
    (a moment after starting, off the first cell's path)."""
    from sandbox_kernel.identity import ScopeKey

    env = make_kernel_env(tmp_path, SANDBOX_KERNEL_IDLE_STOP=str(1 / 60))
    monkeypatch.setenv("JUPYTER_PATH", env.jupyter_path)
    idle_user = f"{env.user}-idle"
    cfg = env.config(
        idle_stop=1 / 60,
    )
    idle = SandboxService(cfg).ensure(ScopeKey(idle_user)).info
    time.sleep(1.5)  # idle for longer than idle_stop, and no kernel attached
    km, kc = start_new_kernel(kernel_name="sandbox")
    try:
        assert run(kc, "1")[0]["status"] == "ok"
        deadline = time.monotonic() + 20
        while (
            docker.from_env().containers.get(idle.engine_id).status == "running"
            and time.monotonic() < deadline
        ):
            time.sleep(0.5)
        assert docker.from_env().containers.get(idle.engine_id).status == "exited"
        assert sandbox_container(f"sk-{env.user}").status == "running"  # its own is busy
    finally:
        kc.stop_channels()
        km.shutdown_kernel(now=True)
        remove_user_containers(env.user)


def test_sandbox_with_too_few_processes_says_how_to_recover(tmp_path: Path) -> None:
    """A sandbox made with a process limit too low for an interpreter (before the setting
    was checked, or by hand) is not a dead end: the cell says how to get out."""
    from sandbox_kernel.identity import ScopeKey

    env = make_kernel_env(tmp_path)
    cfg = env.config()
    cfg._trait_values["pids_limit"] = 5  # what validation now refuses
    SandboxService(cfg).ensure(ScopeKey(env.user))
    try:
        with pytest.MonkeyPatch.context() as mp:
            mp.setenv("JUPYTER_PATH", env.jupyter_path)
            km, kc = start_new_kernel(kernel_name="sandbox")
            try:
                reply, _ = run(kc, "print(1)", timeout=120)
            finally:
                kc.stop_channels()
                km.shutdown_kernel(now=True)
        assert reply["status"] == "error"
        assert (
            "allows only 5 processes" in reply["evalue"]
            and "SANDBOX_KERNEL_PIDS_LIMIT" in reply["evalue"]
        )
        assert f"sandbox-kernel destroy sk-{env.user}" in reply["evalue"]
    finally:
        remove_user_containers(env.user)


def _counts(kc: Any, code: str, **options: Any) -> tuple[Any, Any, Any]:
    """(execute_input's count, execute_result's count, the reply's count) of one request."""
    msg_id = kc.execute(code, **options)
    published: dict[str, Any] = {"execute_input": None, "execute_result": None, "error": None}
    while True:
        msg = kc.get_iopub_msg(timeout=60)
        if msg["parent_header"].get("msg_id") != msg_id:
            continue
        if msg["msg_type"] == "status" and msg["content"]["execution_state"] == "idle":
            break
        if msg["msg_type"] in ("execute_input", "execute_result"):
            published[msg["msg_type"]] = msg["content"]["execution_count"]
    while True:
        reply = kc.get_shell_msg(timeout=60)
        if reply["parent_header"].get("msg_id") == msg_id:
            return (
                published["execute_input"],
                published["execute_result"],
                reply["content"]["execution_count"],
            )


def test_execution_counts_are_ipykernels(kenv: KernelEnv) -> None:
    """The count a frontend shows (execute_input, Out[n]) and the reply's are one number,
    the same as ipykernel's, also around cells that are not stored, silent or failing."""
    sequence = [
        ("1", {}),
        ("2", {"store_history": False}),
        ("3", {"silent": True}),
        ("1/0", {}),
        ("4", {}),
        ("5", {"store_history": False}),
        ("6", {}),
    ]
    seen = {}
    for name in ("python3", "sandbox"):
        km, kc = start_new_kernel(kernel_name=name)
        try:
            seen[name] = [_counts(kc, code, **options) for code, options in sequence]
        finally:
            kc.stop_channels()
            km.shutdown_kernel(now=True)
    assert seen["sandbox"] == seen["python3"], seen


def test_execution_counts_start_again_with_a_new_interpreter(kernel: tuple[Any, Any]) -> None:
    """The interpreter ends mid-cell: that cell's reply keeps its number, and the next
    cell, in a new interpreter, is 1 everywhere (execute_input, Out[n], the reply)."""
    _, kc = kernel
    assert _counts(kc, "1") == (1, 1, 1)
    assert _counts(kc, "2") == (2, 2, 2)
    lost_input, _, lost_reply = _counts(kc, "import os; os._exit(3)")
    assert lost_input == lost_reply == 3
    assert _counts(kc, "5") == (1, 1, 1)
