"""What run.py and kube.py share: the test image, a run's settings and kernelspecs, a
cell's round trip, a kernel's start to its first result, a Jupyter server with the
extension, and the rows of results (medians, p95, ratios) printed and kept for JSON.

Timing is reported, never asserted.
"""

from __future__ import annotations

import json
import os
import socket
import statistics
import subprocess
import sys
import time
import urllib.request
import uuid
from pathlib import Path
from typing import TYPE_CHECKING, Any

HERE = Path(__file__).resolve().parent
REPO = HERE.parent
if str(REPO) not in sys.path:  # run from a checkout without installing
    sys.path.insert(0, str(REPO))

from sandbox_kernel.kernelspec import kernelspec  # noqa: E402

if TYPE_CHECKING:
    from sandbox_kernel.service import SandboxService


def pick_image() -> str:
    """SANDBOX_KERNEL_IMAGE, else the CI test image when the engine has it."""
    if os.environ.get("SANDBOX_KERNEL_IMAGE"):
        return os.environ["SANDBOX_KERNEL_IMAGE"]
    import docker

    try:
        docker.from_env().images.get("sandbox-kernel-test:bookworm")
        return "sandbox-kernel-test:bookworm"
    except Exception:
        return "python:3.12-slim"


def sandbox_env(root: Path, user: str, image: str, state: str = "state") -> dict[str, str]:
    """The settings of a run's Docker sandboxes: its own state folder (installation) and
    workspaces beneath ``root``, plain sandboxes (no host folder), kernels started from
    this checkout."""
    return {
        "SANDBOX_KERNEL_BACKEND": "docker",
        "SANDBOX_KERNEL_IMAGE": image,
        "SANDBOX_KERNEL_WORKSPACE_ROOT": str(root / "ws"),
        "SANDBOX_KERNEL_STATE_DIR": str(root / state),
        "SANDBOX_KERNEL_USER": user,
        "SANDBOX_KERNEL_OUTPUT_LIMIT": str(50_000_000),
        "SANDBOX_KERNEL_MAX_SANDBOXES": "1000",
        "SANDBOX_KERNEL_WORK_ROOT": "none",
        "PYTHONPATH": str(REPO),
    }


def write_kernelspec(root: Path, name: str, env: dict[str, str]) -> None:
    """The kernelspec users get (with its IPC provisioner) as ``name`` beneath
    ``root/share``, with ``env``; JUPYTER_PATH points there so clients find it."""
    spec = root / "share" / "kernels" / name
    spec.mkdir(parents=True, exist_ok=True)
    (spec / "kernel.json").write_text(
        # -I: the benchmark's folders are ones its sandboxes write; nothing planted there
        # may be imported on the host.
        json.dumps(kernelspec(f"{name} (bench)", env, python=sys.executable, flags=["-I"]))
    )
    os.environ["JUPYTER_PATH"] = str(root / "share")


def service_of(env: dict[str, str]) -> SandboxService:
    """The orchestrator with ``env``'s settings (the SANDBOX_KERNEL_ variables, as a
    kernel of that environment reads them; nothing from this process's environment)."""
    from sandbox_kernel.config import load_config
    from sandbox_kernel.service import SandboxService

    settings: dict[str, Any] = {
        k.removeprefix("SANDBOX_KERNEL_").lower(): v
        for k, v in env.items()
        if k.startswith("SANDBOX_KERNEL_")
    }
    return SandboxService(load_config(environ={}, **settings))


def execute(kc: Any, code: str, timeout: float = 120) -> tuple[float, list[dict]]:
    """Run ``code`` on a kernel client: seconds to the idle status, and the outputs."""
    started = time.perf_counter()
    msg_id = kc.execute(code)
    outputs = []
    while True:
        msg = kc.get_iopub_msg(timeout=timeout)
        if msg["parent_header"].get("msg_id") != msg_id:
            continue
        if msg["msg_type"] == "status" and msg["content"]["execution_state"] == "idle":
            break
        if msg["msg_type"] in ("stream", "display_data", "execute_result"):
            outputs.append(msg)
    elapsed = time.perf_counter() - started
    while kc.get_shell_msg(timeout=timeout)["parent_header"].get("msg_id") != msg_id:
        pass
    return elapsed, outputs


def first_result(name: str) -> float:
    """Seconds from starting kernel ``name`` to the result of its first cell."""
    from jupyter_client.manager import start_new_kernel

    started = time.perf_counter()
    km, kc = start_new_kernel(kernel_name=name, startup_timeout=300)
    try:
        execute(kc, "1")
        return time.perf_counter() - started
    finally:
        kc.stop_channels()
        km.shutdown_kernel(now=True)


def start_server(env: dict[str, str], root: Path) -> tuple[subprocess.Popen, str, str]:
    """A `jupyter server` with the extension and ``env``'s settings, answering: its
    process, URL and token. Its root folder is one of its own beneath ``root``: the
    extension records it as the user's primary folder, whose sandbox is the plain
    ``sk-<user>``, and the notebooks of the CI measures beside it must each keep a
    sandbox of their folder, as in a CI checkout."""
    serves = root / "server"
    serves.mkdir(exist_ok=True)
    port = free_port()
    token = uuid.uuid4().hex
    proc = subprocess.Popen(
        [
            sys.executable,
            "-I",
            "-m",
            "jupyter",
            "server",
            f"--port={port}",
            "--no-browser",
            "--allow-root",
            f"--IdentityProvider.token={token}",
            "--ServerApp.jpserver_extensions={'jupyter_ext': True}",
            "--SandboxExtension.gc_interval=0",
            f"--ServerApp.root_dir={serves}",
        ],
        env={**os.environ, **env},
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    url = f"http://127.0.0.1:{port}"
    deadline = time.monotonic() + 120  # a loaded machine starts a server slowly
    while True:
        try:
            request(url + "/api/status", token)
            break
        except OSError:
            if proc.poll() is not None or time.monotonic() > deadline:
                proc.kill()
                raise RuntimeError("the Jupyter server for the measures did not start") from None
            time.sleep(0.1)
    return proc, url, token


def request(url: str, token: str, method: str = "GET", **headers: str) -> bytes:
    """The body of an authenticated request to a Jupyter server."""
    req = urllib.request.Request(
        url, method=method, headers={"Authorization": f"token {token}", **headers}
    )
    with urllib.request.urlopen(req, timeout=60) as response:
        return response.read()


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def mem_available_mib() -> float:
    """The host's MemAvailable (MiB)."""
    for line in Path("/proc/meminfo").read_text().splitlines():
        if line.startswith("MemAvailable:"):
            return int(line.split()[1]) / 1024
    return 0.0


def shim_rss_mib() -> list[float]:
    """Resident memory of each of the engine's per-container shims on this host (MiB)."""
    found = []
    for proc in Path("/proc").iterdir():
        if not proc.name.isdigit():
            continue
        try:
            if not (proc / "comm").read_text().startswith("containerd-shim"):
                continue
            for line in (proc / "status").read_text().splitlines():
                if line.startswith("VmRSS:"):
                    found.append(int(line.split()[1]) / 1024)
        except OSError:
            continue
    return found


def remove_docker_sandboxes(user: str, root: Path) -> None:
    """Every Docker sandbox of ``user`` (a run's own user), and the workspaces' disks
    mounted beneath ``root`` so the folder can go."""
    import docker

    from sandbox_kernel.backends import disks

    client = docker.from_env()
    for c in client.containers.list(
        ignore_removed=True, all=True, filters={"label": "sandbox-kernel.managed=1"}
    ):
        if c.labels.get("sandbox-kernel.user-id", "").startswith(user):
            c.remove(force=True)
    disks.release_beneath(root)


def summary(values: list[float]) -> dict[str, float]:
    ordered = sorted(values)
    p95 = ordered[min(len(ordered) - 1, int(round(0.95 * (len(ordered) - 1))))]
    return {"median": statistics.median(ordered), "p95": p95, "n": len(ordered)}


def fmt(s: dict[str, float], unit: str = "s") -> str:
    if unit != "s":
        return f"median {s['median']:9.1f} {unit} p95 {s['p95']:9.1f} {unit}"
    return f"median {s['median'] * 1000:9.2f} ms p95 {s['p95'] * 1000:9.2f} ms"


def ratio(a: dict[str, float], b: dict[str, float]) -> float | None:
    """The ratio of two medians, rounded; None when the second is zero."""
    return round(a["median"] / b["median"], 2) if b["median"] else None


class Results:
    """The rows of a run, printed as they come and kept for the JSON file."""

    def __init__(self) -> None:
        self.results: dict[str, Any] = {}

    def record(
        self,
        name: str,
        sandbox: list[float],
        baseline: list[float] | None,
        unit: str = "s",
        against: str = "ipykernel",
    ) -> None:
        """A row of the sandbox kernel, beside a baseline when there is one."""
        row: dict[str, Any] = {"unit": unit, "sandbox": summary(sandbox)}
        line = f"{name:42s} sandbox {fmt(row['sandbox'], unit)}"
        if baseline:
            row[against] = summary(baseline)
            row["ratio"] = ratio(row["sandbox"], row[against])
            line += f"  {against} {fmt(row[against], unit)}  ratio {row['ratio']}x"
        self.results[name] = row
        print(line, flush=True)

    def compare(self, name: str, columns: dict[str, list[float]], unit: str = "s") -> None:
        """A row of several columns measured in one run (interleaved), with the ratio of
        each column to each one after it: for kubernetes, docker, ipykernel that is
        kubernetes/docker, kubernetes/ipykernel and docker/ipykernel."""
        stats = {label: summary(values) for label, values in columns.items()}
        labels = list(stats)
        ratios = {
            f"{a}/{b}": ratio(stats[a], stats[b])
            for i, a in enumerate(labels)
            for b in labels[i + 1 :]
        }
        self.results[name] = {"unit": unit, **stats, "ratios": ratios}
        width = max(len(label) for label in labels)
        lines = [name]
        lines += [f"    {label:{width}s}  {fmt(stats[label], unit)}" for label in labels]
        lines.append("    " + "  ".join(f"{k} {v}x" for k, v in ratios.items()))
        print("\n".join(lines), flush=True)
