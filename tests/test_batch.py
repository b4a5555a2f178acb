"""Notebook CI: the tools CI users run, pointed at the ``sandbox`` kernel by name.

Every tool runs as a CI job would run it (a subprocess in the notebook's folder, the
kernel found by name through JUPYTER_PATH) and the verdict or stored notebook is
compared with the same tool on plain ipykernel (``python3``): nbmake, nbval, papermill,
testbook and ``jupyter execute --inplace``. Then the start path CI leans on: 20 clients
starting kernels at once (no port can collide: the kernelspec's provisioner launches
over IPC in a private folder), and a kernel killed while it starts (the client fails
at once, naming the reason, instead of hanging). Real Docker, real tools from PyPI.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import signal
import stat
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import nbformat
import pytest
from jupyter_client.manager import start_new_kernel

from .conftest import remove_user_containers
from .kernel_env import KernelEnv, make_kernel_env

pytestmark = pytest.mark.docker

# Cells whose outputs a CI job would store: streams on both channels, a result, a rich
# display, a loop, data read beside the notebook. Nothing in them depends on the kernel.
CELLS = [
    "import sys\nprint('hello')\nprint('careful', file=sys.stderr)",
    "x = 6 * 7\nx",
    "from IPython.display import HTML, display\ndisplay(HTML('<b>bold</b>'))\n{'a': 1, 'b': [1, 2]}",
    "for i in range(3):\n    print(i)",
    "import os\nos.path.basename(os.getcwd()), open('data.txt').read()",
]


@pytest.fixture
def kenv(tmp_path: Path) -> Iterator[KernelEnv]:
    """The test kernelspec with default work folders: each tool runs beside its notebook."""
    env = make_kernel_env(tmp_path / "k", SANDBOX_KERNEL_WORK_ROOT="auto")
    yield env
    remove_user_containers(env.user)


def write_notebook(path: Path, cells: list[str], kernel: str = "sandbox", **outputs: Any) -> Path:
    nb = nbformat.v4.new_notebook()
    nb.cells = [nbformat.v4.new_code_cell(c) for c in cells]
    nb.metadata["kernelspec"] = {"name": kernel, "display_name": kernel, "language": "python"}
    path.parent.mkdir(parents=True, exist_ok=True)
    (path.parent / "data.txt").write_text("beside the notebook")
    nbformat.write(nb, path)
    return path


def run(
    kenv: KernelEnv, cwd: Path, *cmd: str, timeout: float = 300, **env: str
) -> subprocess.CompletedProcess[str]:
    """A CI step: the command in the notebook's folder, the sandbox kernelspec on the path
    (and ``env`` added to its environment)."""
    return subprocess.run(
        [sys.executable, "-m", *cmd],
        cwd=cwd,
        env={**kenv.environ(), **env},
        capture_output=True,
        text=True,
        timeout=timeout,
    )


def pytest_in(kenv: KernelEnv, folder: Path, *args: str) -> subprocess.CompletedProcess[str]:
    """pytest as CI runs it in a project folder (its own rootdir, none of our conftest)."""
    (folder / "pytest.ini").write_text("[pytest]\n")
    return run(kenv, folder, "pytest", "-p", "no:cacheprovider", "-rA", *args)


def stored(path: Path) -> list[dict[str, Any]]:
    """What a notebook stores per cell, minus timing metadata every run changes."""
    nb = nbformat.read(path, as_version=4)
    return [
        {
            "source": c.source,
            "execution_count": c.get("execution_count"),
            "outputs": c.get("outputs"),
        }
        for c in nb.cells
    ]


def fresh(kenv: KernelEnv) -> bool:
    """No sandbox of this user exists yet: the next kernel makes one (the first CI run)."""
    out = subprocess.run(
        ["docker", "ps", "-aq", "--filter", f"label=sandbox-kernel.user={kenv.user}"],
        capture_output=True,
        text=True,
        check=True,
    )
    return not out.stdout.strip()


def test_jupyter_execute_inplace_stores_what_ipykernel_stores(
    kenv: KernelEnv, tmp_path: Path
) -> None:
    """On a fresh sandbox (its creation is not the cell's output) and on the existing one."""
    assert fresh(kenv)
    for attempt in ("fresh", "existing"):
        ours = write_notebook(tmp_path / attempt / "sandbox.ipynb", CELLS)
        theirs = write_notebook(tmp_path / attempt / "ipykernel.ipynb", CELLS, kernel="python3")
        for path, kernel in ((ours, "sandbox"), (theirs, "python3")):
            done = run(
                kenv,
                path.parent,
                "jupyter",
                "execute",
                "--inplace",
                f"--kernel_name={kernel}",
                path.name,
            )
            assert done.returncode == 0, done.stderr[-3000:]
        assert stored(ours) == stored(theirs), attempt
        if attempt == "fresh":
            # Both folders are one sandbox apart: the second attempt finds its own made.
            assert not fresh(kenv)


def test_nbmake_pass_and_fail(kenv: KernelEnv, tmp_path: Path) -> None:
    """The failing notebook fails with its cell's error in the report; the other passes."""
    write_notebook(tmp_path / "nb" / "good.ipynb", CELLS)
    write_notebook(
        tmp_path / "nb" / "bad.ipynb", ["x = 1", "raise ValueError('the data is wrong: 1729')"]
    )
    done = pytest_in(
        kenv, tmp_path / "nb", "--nbmake", "--nbmake-kernel=sandbox", "good.ipynb", "bad.ipynb"
    )
    assert done.returncode == 1, done.stdout[-3000:] + done.stderr[-2000:]
    assert "PASSED good.ipynb" in done.stdout, done.stdout[-3000:]
    assert "FAILED bad.ipynb" in done.stdout, done.stdout[-3000:]
    report = re.sub(
        r"\x1b\[[0-9;]*m", "", done.stdout
    )  # tracebacks come coloured, as from ipykernel
    assert "ValueError: the data is wrong: 1729" in report  # the failing cell's error
    assert "raise ValueError('the data is wrong: 1729')" in report  # and its source
    # The stored notebooks are untouched (nbmake only reads them).
    assert stored(tmp_path / "nb" / "good.ipynb")[0]["outputs"] == []


def nbval_verdicts(kenv: KernelEnv, folder: Path, kernel: str) -> dict[str, str]:
    done = pytest_in(kenv, folder, "--nbval", f"--nbval-kernel-name={kernel}", "stored.ipynb")
    verdicts = {}
    for line in done.stdout.splitlines():
        for word in ("PASSED", "FAILED"):
            if line.startswith(word + " "):
                verdicts[line.split()[1]] = word
    assert verdicts, done.stdout[-3000:] + done.stderr[-2000:]
    return verdicts


def test_nbval_gives_ipykernel_verdicts_on_fresh_and_existing_sandbox(
    kenv: KernelEnv, tmp_path: Path
) -> None:
    """Outputs stored by ipykernel; one cell's stored output is wrong on purpose."""
    folder = tmp_path / "val"
    path = write_notebook(folder / "stored.ipynb", [*CELLS, "print(1 + 1)"], kernel="python3")
    done = run(kenv, folder, "jupyter", "execute", "--inplace", "--kernel_name=python3", path.name)
    assert done.returncode == 0, done.stderr[-3000:]
    nb = nbformat.read(path, as_version=4)
    nb.cells[-1].outputs[0]["text"] = "3\n"  # a regression nbval must catch
    nbformat.write(nb, path)

    expected = nbval_verdicts(kenv, folder, "python3")
    assert list(expected.values()).count("FAILED") == 1, expected
    assert fresh(kenv)
    assert nbval_verdicts(kenv, folder, "sandbox") == expected  # the sandbox is made during the run
    assert not fresh(kenv)
    assert nbval_verdicts(kenv, folder, "sandbox") == expected  # and now exists


def test_papermill_output_equals_ipykernel(kenv: KernelEnv, tmp_path: Path) -> None:
    """Parameters injected the same way; outputs equal apart from execution metadata."""
    folder = tmp_path / "pm"
    cells = ["factor = 1", *CELLS, "print('scaled', factor * x)"]
    path = write_notebook(folder / "params.ipynb", cells)
    nb = nbformat.read(path, as_version=4)
    nb.cells[0].metadata["tags"] = ["parameters"]
    nbformat.write(nb, path)
    for kernel in ("sandbox", "python3"):
        done = run(
            kenv,
            folder,
            "papermill",
            "-k",
            kernel,
            path.name,
            f"out-{kernel}.ipynb",
            "-p",
            "factor",
            "10",
        )
        assert done.returncode == 0, done.stderr[-3000:]
    ours, theirs = stored(folder / "out-sandbox.ipynb"), stored(folder / "out-python3.ipynb")
    assert ours == theirs
    assert ours[-1]["outputs"][0]["text"] == "scaled 420\n"
    assert ours[1]["source"].startswith("# Parameters")  # papermill's injected cell


TESTBOOK_TEST = """
from testbook import testbook


@testbook("lib.ipynb", execute=True, kernel_name="sandbox", timeout=120)
def test_notebook(tb):
    area = tb.ref("area")
    assert area(3, 4) == 12  # a function defined in the notebook, called in the sandbox
    assert tb.ref("settings")["name"] == "beside the notebook"
    tb.inject("settings['name'] = 'changed by the test'")
    assert tb.value("settings['name']") == "changed by the test"
    assert tb.value("import os; os.path.exists('/.dockerenv') or os.getuid()") is not None
    tb.inject("raise_it = lambda: 1 / 0")
    try:
        tb.ref("raise_it")()
    except Exception as err:  # testbook re-raises the notebook's error
        assert "ZeroDivisionError" in str(err) or "ZeroDivisionError" in type(err).__name__
    else:
        raise AssertionError("no error")
"""


def test_testbook_ref_inject_value(kenv: KernelEnv, tmp_path: Path) -> None:
    folder = tmp_path / "tb"
    write_notebook(
        folder / "lib.ipynb",
        ["def area(w, h):\n    return w * h", "settings = {'name': open('data.txt').read()}"],
    )
    (folder / "test_lib.py").write_text(TESTBOOK_TEST)
    done = pytest_in(kenv, folder, "test_lib.py")
    assert done.returncode == 0, done.stdout[-4000:] + done.stderr[-2000:]
    assert "1 passed" in done.stdout


def test_kernel_starts_over_a_private_ipc_folder(
    kenv: KernelEnv, monkeypatch: pytest.MonkeyPatch
) -> None:
    """No TCP port to race for: the connection file says ipc, the sockets sit in a 0700
    folder of their own, a restart comes back at the same addresses and the folder goes
    with the kernel."""
    monkeypatch.setenv("JUPYTER_PATH", kenv.jupyter_path)
    monkeypatch.setenv("PYTHONPATH", kenv.environ()["PYTHONPATH"])
    km, kc = start_new_kernel(kernel_name="sandbox", startup_timeout=120)
    try:
        folder = Path(km.ip).parent
        info = json.loads(Path(km.connection_file).read_text())
        assert info["transport"] == "ipc" and info["ip"] == km.ip
        assert stat.S_IMODE(folder.stat().st_mode) == 0o700 and folder.stat().st_uid == os.getuid()
        assert sorted(p.name for p in folder.iterdir()) == [f"k-{n}" for n in sorted(km.ports)]
        assert all(stat.S_ISSOCK((folder / f"k-{n}").stat().st_mode) for n in km.ports)
        reply = kc.execute_interactive("n = 1", timeout=120)
        assert reply["content"]["status"] == "ok"
        km.restart_kernel(now=False)
        kc.wait_for_ready(timeout=120)
        assert Path(km.ip).parent == folder
        texts: list[str] = []
        kc.execute_interactive(
            "print('back')",
            timeout=120,
            output_hook=lambda m: texts.append(m["content"].get("text", "")),
        )
        assert "back\n" in texts
    finally:
        kc.stop_channels()
        km.shutdown_kernel(now=False)
    assert not folder.exists()


def test_twenty_parallel_starts_three_rounds(kenv: KernelEnv, tmp_path: Path) -> None:
    """A CI matrix on one runner: 20 ``jupyter execute`` at once, three rounds, the first
    racing to make the sandbox. Every run succeeds and every notebook holds its own
    kernel's answer (a client on another kernel's port would show another number)."""
    folder = tmp_path / "matrix"
    for n in range(20):
        write_notebook(folder / f"nb-{n:02}.ipynb", [f"print('notebook', {n})"])
    # Their own runtime folder (short: it holds sockets), so that what is left there is
    # theirs: other pytest-xdist workers start kernels in the user's at the same time.
    runtime = Path(tempfile.mkdtemp(prefix="sk-rt-", dir="/tmp"))

    def one(n: int) -> tuple[int, subprocess.CompletedProcess[str]]:
        return n, run(
            kenv,
            folder,
            "jupyter",
            "execute",
            "--inplace",
            "--kernel_name=sandbox",
            "--startup_timeout=240",
            f"nb-{n:02}.ipynb",
            timeout=400,
            JUPYTER_RUNTIME_DIR=str(runtime),
        )

    for round_ in range(3):
        with ThreadPoolExecutor(20) as pool:
            results = list(pool.map(one, range(20)))
        failures = {n: done.stderr[-800:] for n, done in results if done.returncode != 0}
        assert not failures, (round_, failures)
        for n, _ in results:
            text = stored(folder / f"nb-{n:02}.ipynb")[0]["outputs"][0]["text"]
            assert text == f"notebook {n}\n", (round_, n, text)
    try:
        assert not [
            p for p in runtime.glob("sk-*") if p.is_dir() and not any(p.iterdir())
        ]  # no folder left behind
    finally:
        shutil.rmtree(runtime, ignore_errors=True)


def kernel_children(parent: int) -> list[int]:
    """Pids of ``-m sandbox_kernel`` processes whose parent is ``parent``."""
    found = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            status = (entry / "status").read_text()
            cmdline = (entry / "cmdline").read_bytes().split(b"\0")
        except OSError:
            continue
        ppid = next(
            int(line.split()[1]) for line in status.splitlines() if line.startswith("PPid:")
        )
        if ppid == parent and b"sandbox_kernel" in cmdline:
            found.append(int(entry.name))
    return found


def test_kernel_killed_during_start_fails_the_client_fast(kenv: KernelEnv, tmp_path: Path) -> None:
    """The kernel process dies before it answers: ``jupyter execute`` exits non-zero well
    within its start timeout and says the kernel died (it does not wait out the timeout)."""
    folder = tmp_path / "dies"
    write_notebook(folder / "nb.ipynb", ["print('never')"])
    startup_timeout = 120
    proc = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "jupyter",
            "execute",
            "--kernel_name=sandbox",
            f"--startup_timeout={startup_timeout}",
            "nb.ipynb",
        ],
        cwd=folder,
        env=kenv.environ(),
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    killed = None
    deadline = time.monotonic() + 60
    while killed is None and time.monotonic() < deadline and proc.poll() is None:
        for pid in kernel_children(proc.pid):
            os.kill(pid, signal.SIGKILL)
            killed = pid
        time.sleep(0.005)
    assert killed, "the kernel never started"
    try:
        _, stderr = proc.communicate(timeout=startup_timeout)  # bounded: a hang fails here
    except subprocess.TimeoutExpired:
        proc.kill()
        raise AssertionError("jupyter execute still waiting for a dead kernel") from None
    assert proc.returncode != 0
    assert "Kernel died" in stderr or "kernel died" in stderr.lower(), stderr[-2000:]


def test_the_kernels_own_messages_go_to_the_job_log_not_the_notebook(tmp_path: Path) -> None:
    """What the kernel process itself says (making the sandbox, a setting the
    administrator pinned) is in the CI job's log, where a user looks when a run is slow
    or odd; the notebook stores only what the cells printed."""
    conf = tmp_path / "conf"
    conf.mkdir()
    (conf / "sandbox_kernel_config.json").write_text(
        json.dumps({"SandboxConfig": {"network": False}})
    )
    kenv = make_kernel_env(
        tmp_path / "k",
        SANDBOX_KERNEL_WORK_ROOT="auto",
        SANDBOX_KERNEL_NETWORK="true",
        JUPYTER_CONFIG_DIR=str(conf),
    )
    try:
        path = write_notebook(
            tmp_path / "log" / "nb.ipynb", ["import warnings\nprint('only this')"]
        )
        done = run(
            kenv, path.parent, "jupyter", "execute", "--inplace", "--kernel_name=sandbox", path.name
        )
        assert done.returncode == 0, done.stderr[-3000:]
        assert stored(path)[0]["outputs"] == [
            {"name": "stdout", "output_type": "stream", "text": "only this\n"}
        ]
        assert "ignoring SANDBOX_KERNEL_NETWORK='true'" in done.stderr, done.stderr
        assert f"creating sandbox sk-{kenv.user}" in done.stderr, done.stderr
        # No noise a user must learn to ignore.
        assert "Debugger warning" not in done.stderr, done.stderr
    finally:
        remove_user_containers(kenv.user)
