"""nbclient's own test notebooks give the same outputs in the sandbox as in ipykernel.

The notebooks ship in nbclient's source distribution (``tests/files``); the test
downloads it from PyPI (as CI can) and uses the notebooks as data, run in their own
folder exactly as ``jupyter execute`` would run them, once with plain ipykernel and
once with the sandbox kernel. Outputs are compared after removing what differs by
nature (memory addresses, times, traceback frames); the notebooks that cannot match
are listed in ``DIFFERENT`` with the reason, and in the manual (docs/users/kernel.md).
"""

from __future__ import annotations

import re
import subprocess
import sys
import tarfile
import time
from collections.abc import Iterator
from pathlib import Path
from queue import Empty
from typing import Any

import nbformat
import pytest
from jupyter_client.asynchronous import AsyncKernelClient
from jupyter_client.channels import AsyncZMQSocketChannel
from jupyter_client.manager import AsyncKernelManager
from nbclient import NotebookClient
from traitlets import Type

from .kernel_env import KernelEnv, make_kernel_env

pytestmark = pytest.mark.docker

# Notebooks that cannot give ipykernel's outputs, and why (docs/users/kernel.md lists them too).
DIFFERENT = {
    "Check History in Memory.ipynb": "reads IPython's history manager settings in the kernel process (ipykernel's private configuration)",
    "Autokill.ipynb": "kills its own kernel process: nbclient reports a dead kernel either way, through different paths",
    "Interrupt.ipynb": "needs nbclient's interrupt_on_timeout test setup (the interrupt itself is tested in test_kernel.py)",
    "Parallel Execute A.ipynb": "needs the two notebooks run at once with a shared environment variable (tests/test_batch.py does that)",
    "Parallel Execute B.ipynb": "as Parallel Execute A",
    "Sleep1s.ipynb": "prints wall-clock times",
    "update-display-id.ipynb": "publishes through get_ipython().kernel.iopub_socket and .session, ipykernel's private objects",
}


@pytest.fixture(scope="module")
def nbclient_files(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """nbclient's tests/files, from its source distribution on PyPI."""
    import nbclient

    where = tmp_path_factory.mktemp("nbclient-sdist")
    done = subprocess.run(
        [
            sys.executable,
            "-m",
            "pip",
            "download",
            "-q",
            "--no-deps",
            "--no-binary",
            ":all:",
            f"nbclient=={nbclient.__version__}",
            "-d",
            str(where),
        ],
        capture_output=True,
        text=True,
        timeout=300,
    )
    if done.returncode != 0:
        pytest.fail(f"could not download nbclient's sources from PyPI: {done.stderr[-500:]}")
    (archive,) = where.glob("nbclient-*.tar.gz")
    with tarfile.open(archive) as tar:
        members = [m for m in tar.getmembers() if "/tests/files/" in m.name and m.isfile()]
        tar.extractall(where, members=members, filter="data")
    (files,) = where.glob("nbclient-*/tests/files")
    return files


@pytest.fixture(scope="module")
def kenv(tmp_path_factory: pytest.TempPathFactory, nbclient_files: Path) -> Iterator[KernelEnv]:
    """The sandbox kernel, its sandbox given the widget packages the host's ipykernel has
    (from local wheels: the test image has no network to an index)."""
    import comm
    import ipywidgets

    from sandbox_kernel.identity import ScopeKey
    from sandbox_kernel.service import SandboxService

    from .conftest import remove_user_containers

    env = make_kernel_env(tmp_path_factory.mktemp("kernel"), SANDBOX_KERNEL_WORK_ROOT="auto")
    wheels = env.workspace / "wheels"
    wanted = [
        f"comm=={comm.__version__}",
        f"ipywidgets=={ipywidgets.__version__}",
        "widgetsnbextension",
        "jupyterlab_widgets",
    ]
    done = subprocess.run(
        [
            sys.executable,
            "-m",
            "pip",
            "download",
            "-q",
            "--no-deps",
            "--only-binary",
            ":all:",
            *wanted,
            "-d",
            str(wheels),
        ],
        capture_output=True,
        text=True,
        timeout=300,
    )
    if done.returncode != 0:
        pytest.fail(f"could not download the widget wheels from PyPI: {done.stderr[-500:]}")
    service = SandboxService(env.config())
    # The sandbox of the notebooks' folder (the one their kernels use).
    info = service.ensure(
        ScopeKey(env.user), work_folder=service.work_folder(str(nbclient_files))
    ).info
    names = [f"/workspace/wheels/{w.name}" for w in wheels.glob("*.whl")]
    installed = service.backend.exec(
        info.id, ["python3", "-m", "pip", "install", "-q", "--no-index", "--no-deps", *names]
    )
    assert installed.exit_code == 0, installed.output[-2000:]
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("JUPYTER_PATH", env.jupyter_path)
        yield env
    remove_user_containers(env.user)


def normalized(nb: nbformat.NotebookNode) -> list[list[dict[str, Any]]]:
    """Cell outputs without what differs by nature between two runs of one notebook."""
    cells = []
    for cell in nb.cells:
        if cell.cell_type != "code":
            continue
        outs = []
        for out in cell.get("outputs", []):
            item: dict[str, Any] = {"type": out["output_type"]}
            if out["output_type"] == "stream":
                item["name"], item["text"] = out["name"], _scrub(out["text"])
            elif out["output_type"] == "error":
                item["ename"], item["evalue"] = out["ename"], _scrub(out["evalue"])
            else:
                item["data"] = {k: _scrub(v) for k, v in out.get("data", {}).items()}
                if "execution_count" in out:
                    item["execution_count"] = out["execution_count"]
            outs.append(item)
        cells.append(outs)
    return cells


def _scrub(text: Any) -> Any:
    """Memory addresses and widget model ids differ by nature between two runs."""
    if isinstance(text, dict):
        return {k: ("?" if k == "model_id" else _scrub(v)) for k, v in text.items()}
    return re.sub(r"0x[0-9a-f]+", "0x?", text) if isinstance(text, str) else text


class PolledChannel(AsyncZMQSocketChannel):
    """A channel that waits for a message in short polls.

    nbclient sends the Output widget's comm messages on the shell socket while another of
    its tasks polls that socket for the cell's reply, and pyzmq's asyncio poll can then miss
    the reply's wake-up: the reply is seen only when the poll times out, after the cell's
    whole timeout (120 s here). That is nbclient's and pyzmq's, not a kernel's: plain
    ipykernel stalls so in 5 of 8 runs of ``Output.ipynb``. Short polls bound each stall."""

    async def get_msg(self, timeout: float | None = None) -> dict[str, Any]:
        deadline = None if timeout is None else time.monotonic() + timeout
        while True:
            left = 0.25 if deadline is None else max(0.0, min(0.25, deadline - time.monotonic()))
            try:
                return await super().get_msg(timeout=left)
            except Empty:
                if deadline is not None and time.monotonic() >= deadline:
                    raise


class PolledClient(AsyncKernelClient):
    """nbclient's client, its shell and IOPub channels polled in short steps."""

    shell_channel_class = Type(PolledChannel)  # type: ignore[arg-type]
    iopub_channel_class = Type(PolledChannel)  # type: ignore[arg-type]


class PolledKernelManager(AsyncKernelManager):
    """A kernel manager whose clients are :class:`PolledClient`."""

    client_factory = Type(PolledClient)  # type: ignore[arg-type]


def run_with(kernel: str, path: Path) -> list[list[dict[str, Any]]]:
    nb = nbformat.read(path, as_version=4)
    client = NotebookClient(
        nb,
        kernel_name=kernel,
        kernel_manager_class=PolledKernelManager,
        timeout=120,
        allow_errors=True,  # errors are outputs to compare too
        resources={"metadata": {"path": str(path.parent)}},
    )
    client.execute()
    return normalized(nb)


@pytest.mark.timeout(
    900
)  # some 30 notebooks, each run by two kernels: a hang guard, not a speed test
def test_nbclient_notebooks_match_ipykernel(nbclient_files: Path, kenv: KernelEnv) -> None:
    """Every notebook not in DIFFERENT: same outputs, cell by cell, as ipykernel's."""
    checked, mismatched = [], {}
    for path in sorted(nbclient_files.glob("*.ipynb")):
        if path.name in DIFFERENT:
            continue
        expected = run_with("python3", path)
        got = run_with("sandbox", path)
        checked.append(path.name)
        if got != expected:
            mismatched[path.name] = (expected, got)
    assert checked, "no notebooks found in nbclient's sources"
    assert not mismatched, "\n".join(
        f"{name}: {first_difference(e, g)}" for name, (e, g) in mismatched.items()
    )


def first_difference(expected: Any, got: Any, where: str = "") -> str:
    """Where two normalized notebooks first differ, and how (short enough to read)."""
    if isinstance(expected, dict) and isinstance(got, dict):
        for key in sorted(set(expected) | set(got)):
            if expected.get(key) != got.get(key):
                return first_difference(expected.get(key), got.get(key), f"{where}.{key}")
    if isinstance(expected, list) and isinstance(got, list):
        for index, (e, g) in enumerate(zip(expected, got, strict=False)):
            if e != g:
                return first_difference(e, g, f"{where}[{index}]")
        if len(expected) != len(got):
            return f"{where}: {len(expected)} items in ipykernel, {len(got)} in the sandbox"
    return f"{where}: ipykernel {str(expected)[:200]!r}, sandbox {str(got)[:200]!r}"
