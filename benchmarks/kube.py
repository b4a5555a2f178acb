"""Benchmarks of the kubernetes backend, beside Docker's rows of run.py, on the cluster
KUBECONFIG names (CI: the test cluster of .ci/kube-up.sh).

    python benchmarks/kube.py            # starts, warm cells, 100 MB through REST, density
    python benchmarks/kube.py --smoke    # a quick pass that proves the script still works
    python benchmarks/kube.py --density 150   # sandboxes on the node until a limit bites

Rows: start to first result with the user's sandbox running, stopped (no pod, claims
kept) and absent (destroyed: a new home claim); a warm cell; 100 MB up and down
through the REST route (files pod) against the backend's own exec stream; the import
of the backend's client against the official ``kubernetes`` client's; exec's first
byte; idle sandboxes until the node refuses one, with memory per idle sandbox. Each
sandbox row has plain ipykernel or a direct path beside it. Timing is reported, never
asserted. Each run works in a namespace of its own, removed at the end.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import shutil
import subprocess
import sys
import tempfile
import time
import uuid
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
from run import Bench, mem_available_mib, pick_image, request  # noqa: E402

from sandbox_kernel.backends.kubernetes.client import Api, load_config  # noqa: E402
from sandbox_kernel.config import load_config as load_settings  # noqa: E402
from sandbox_kernel.identity import ScopeKey  # noqa: E402
from sandbox_kernel.service import SandboxService  # noqa: E402


class KubeBench(Bench):
    def __init__(self, root: Path, image: str) -> None:
        self.namespace = f"sk-bench-{uuid.uuid4().hex[:6]}"
        self.api = Api(load_config())
        self.api.post("/api/v1/namespaces", {"metadata": {"name": self.namespace}})
        super().__init__(root, image)
        self.env.update(
            SANDBOX_KERNEL_BACKEND="kubernetes",
            SANDBOX_KERNEL_KUBERNETES_NAMESPACE=self.namespace,
        )
        for name in ("sandbox", "sandbox-ci"):
            spec = root / "share" / "kernels" / name / "kernel.json"
            data = json.loads(spec.read_text())
            data["env"].update(self.env)
            spec.write_text(json.dumps(data))
        self.service = SandboxService(
            load_settings(
                environ={},
                backend="kubernetes",
                image=image,
                kubernetes_namespace=self.namespace,
                state_dir=self.env["SANDBOX_KERNEL_STATE_DIR"],
                max_sandboxes=1000,
            )
        )

    def starts(self, runs: int) -> None:
        backend = self.service.backend
        plain: list[float] = []
        running: list[float] = []
        absent: list[float] = []
        stopped: list[float] = []
        self.first_result("sandbox")
        self.first_result("python3")
        for _ in range(runs):
            plain.append(self.first_result("python3"))
            running.append(self.first_result("sandbox"))
            backend.stop(self.sandbox_id)
            stopped.append(self.first_result("sandbox"))
            backend.destroy(self.sandbox_id)
            absent.append(self.first_result("sandbox"))
        self.record("kubernetes: start to first result: sandbox running", running, plain)
        self.record("kubernetes: start to first result: sandbox stopped", stopped, plain)
        self.record("kubernetes: start to first result: no sandbox yet", absent, plain)

    def warm_cells(self, runs: int) -> None:
        from jupyter_client.manager import start_new_kernel

        kernels = {name: start_new_kernel(kernel_name=name) for name in ("sandbox", "python3")}
        try:
            for _, kc in kernels.values():
                self.execute(kc, "pass")
            times: dict[str, list[float]] = {n: [] for n in kernels}
            for _ in range(runs):
                for n, (_, kc) in kernels.items():
                    times[n].append(self.execute(kc, "pass")[0])
            self.record("kubernetes: warm cell round trip", times["sandbox"], times["python3"])
        finally:
            for km, kc in kernels.values():
                kc.stop_channels()
                km.shutdown_kernel(now=True)

    def client_costs(self, runs: int) -> None:
        """The import on a kernel's start path, and the first byte of an exec."""
        ours, official = [], []
        for _ in range(runs):
            for target, into in (
                ("sandbox_kernel.backends.kubernetes", ours),
                ("kubernetes.client, kubernetes.config, kubernetes.stream", official),
            ):
                code = (
                    "import time, sandbox_kernel.backends.base, sandbox_kernel.config\n"
                    f"t = time.perf_counter(); import {target}; print(time.perf_counter() - t)"
                )
                out = subprocess.run(
                    [sys.executable, "-c", code], capture_output=True, text=True, check=True
                )
                into.append(float(out.stdout.strip()))
        self.record(
            "kubernetes: import of the API client", ours, official, against="official client"
        )
        info = self.service.ensure(ScopeKey(self.user)).info
        backend = self.service.backend
        firsts, whole = [], []
        for _ in range(runs * 5):
            t = time.perf_counter()
            channel = backend.open_channel(info.id, ["python3", "-c", "print('x')"])
            channel.read()
            firsts.append(time.perf_counter() - t)
            channel.close()
            t = time.perf_counter()
            backend.exec(info.id, ["true"])
            whole.append(time.perf_counter() - t)
        self.record("kubernetes: exec, first byte of python3", firsts, whole, against="exec true")

    def files(self, runs: int, size_mb: int) -> None:
        """Up and down through the REST route (the files pod, while the sandbox runs too)
        against the backend's own exec stream into the sandbox."""
        info = self.service.ensure(ScopeKey(self.user)).info
        backend = self.service.backend
        proc, url, token = self.with_server()
        try:
            src = self.root / "blob.bin"
            with src.open("wb") as fh:
                for _ in range(size_mb):
                    fh.write(os.urandom(1 << 20))
            auth = ["-H", f"Authorization: token {token}"]
            rest = f"{url}/api/sandboxes/{info.id}/files/bench/blob.bin"
            back = self.root / "back.bin"
            times: dict[str, list[float]] = {k: [] for k in ("up", "down", "exec up", "exec down")}
            request(f"{url}/api/sandboxes/{info.id}/files?path=", token)  # the files pod, up
            for _ in range(runs):
                t = time.perf_counter()
                subprocess.run(
                    ["curl", "-sf", "-o", "/dev/null", "-T", str(src), *auth, rest], check=True
                )
                times["up"].append(time.perf_counter() - t)
                t = time.perf_counter()
                subprocess.run(["curl", "-sf", "-o", str(back), *auth, rest], check=True)
                times["down"].append(time.perf_counter() - t)
                assert back.read_bytes() == src.read_bytes(), "REST download differs"
                t = time.perf_counter()
                with src.open("rb") as fh:
                    backend.put_file(info.id, "/tmp/blob.bin", fh)
                times["exec up"].append(time.perf_counter() - t)
                t = time.perf_counter()
                size = sum(len(c) for c in backend.get_file(info.id, "/tmp/blob.bin"))
                times["exec down"].append(time.perf_counter() - t)
                assert size == size_mb << 20
            self.record(
                f"kubernetes: {size_mb} MB upload (REST)",
                times["up"],
                times["exec up"],
                against="exec stream",
            )
            self.record(
                f"kubernetes: {size_mb} MB download (REST)",
                times["down"],
                times["exec down"],
                against="exec stream",
            )
        finally:
            proc.terminate()
            proc.wait()

    def density(self, limit: int) -> None:
        """Idle sandboxes (thread scope: one per notebook) until the node refuses one or
        ``limit`` is reached; memory per idle sandbox from the machine's MemAvailable."""
        backend = self.service.backend
        thread_service = SandboxService(self.service.config_with(scope="thread"))
        before = mem_available_mib()
        made = 0
        elapsed = 0.0
        reason = f"stopped at {limit}"
        started = time.perf_counter()
        for i in range(limit):
            key = ScopeKey(self.user, "thread", f"density-{i}.ipynb")
            try:
                thread_service.ensure(key)
            except Exception as exc:  # the limit that bit: reported, not raised
                reason = str(exc).splitlines()[0][:200]
                break
            made += 1
            elapsed = time.perf_counter() - started  # to the last one made
        after = mem_available_mib()
        per = (before - after) / made if made else 0.0
        self.results["kubernetes: idle sandboxes on the node"] = {
            "count": made,
            "why it stopped": reason,
            "memory per idle sandbox MiB": round(per, 1),
            "seconds per sandbox": round(elapsed / made, 2) if made else None,
        }
        print(
            f"kubernetes: idle sandboxes on the node        {made} ({reason}); "
            f"{per:.1f} MiB each; {elapsed / max(made, 1):.2f} s each to make",
            flush=True,
        )
        for info in backend.list(self.user):
            backend.destroy(info.id)

    def cleanup(self) -> None:
        self.api.delete(f"/api/v1/namespaces/{self.namespace}")


def main() -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--smoke", action="store_true", help="a quick pass (CI)")
    parser.add_argument(
        "--density", type=int, default=0, metavar="N", help="idle sandboxes, at most N"
    )
    parser.add_argument(
        "--out", default=str(HERE / "results" / "kube-latest.json"), help="where to write JSON"
    )
    args = parser.parse_args()
    root = Path(tempfile.mkdtemp(prefix="sk-kbench-"))
    bench = KubeBench(root, pick_image())
    version = bench.api.get("/version").get("gitVersion", "?")
    machine: dict[str, Any] | str = (
        f"{platform.system()} {platform.machine()}, {os.cpu_count()} cores, "
        f"Kubernetes {version}, image {bench.image}"
    )
    print(f"machine: {machine}", flush=True)
    try:
        bench.client_costs(2 if args.smoke else 10)
        bench.warm_cells(10 if args.smoke else 200)
        bench.starts(1 if args.smoke else 7)
        bench.files(1 if args.smoke else 3, 10 if args.smoke else 100)
        if args.density or args.smoke:
            bench.density(args.density or 3)
    finally:
        bench.cleanup()
        shutil.rmtree(root, ignore_errors=True)
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(
        json.dumps({"machine": machine, "smoke": args.smoke, "results": bench.results}, indent=2)
    )
    print(f"wrote {out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
