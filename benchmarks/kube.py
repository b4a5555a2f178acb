"""Benchmarks of the kubernetes backend beside the Docker backend and plain ipykernel, in
one run, on the cluster KUBECONFIG names (CI: the test cluster of .ci/kube-up.sh) and
the Docker engine of this machine.

    python benchmarks/kube.py            # starts, warm cells, exec, 100 MB through REST
    python benchmarks/kube.py --smoke    # a quick pass that proves the script still works
    python benchmarks/kube.py --density 150   # also sandboxes on the node until a limit bites

Where both engines do the same thing, each round measures kubernetes, Docker and (where
it makes sense) ipykernel one after another, the engines' order swapped every round, so
a slow moment of a shared machine hits all of them alike; a row has the three medians
and their ratios (kubernetes/docker, kubernetes/ipykernel, docker/ipykernel). Rows: start
to first result with the user's sandbox running, stopped and absent (destroyed); a warm
cell; exec's first byte of ``python3`` and a whole ``exec true``; 100 MB up and down
through the REST route and through the backend's own stream into the sandbox.
Kubernetes alone: the import of the backend's client against the official
``kubernetes`` client's, and idle sandboxes until the node refuses one, with memory
per idle sandbox. Timing is reported, never asserted. Each run works in a namespace of
its own and state folders of its own, all removed at the end.
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

from harness import (
    HERE,
    Results,
    execute,
    first_result,
    mem_available_mib,
    pick_image,
    remove_docker_sandboxes,
    request,
    sandbox_env,
    service_of,
    start_server,
    write_kernelspec,
)

from sandbox_kernel.backends.base import Backend
from sandbox_kernel.backends.kubernetes.client import Api, load_config
from sandbox_kernel.identity import ScopeKey
from sandbox_kernel.service import SandboxService

ENGINES = ("kubernetes", "docker")


class KubeBench(Results):
    """One user's sandbox on each engine, a kernelspec for each, and the measures."""

    def __init__(self, root: Path, image: str) -> None:
        super().__init__()
        self.root = root
        self.image = image
        self.user = f"bench-{uuid.uuid4().hex[:6]}"
        self.namespace = f"sk-bench-{uuid.uuid4().hex[:6]}"
        self.api = Api(load_config())
        self.api.post("/api/v1/namespaces", {"metadata": {"name": self.namespace}})
        self.env = {
            "kubernetes": {
                **sandbox_env(root, self.user, image, state="state-kube"),
                "SANDBOX_KERNEL_BACKEND": "kubernetes",
                "SANDBOX_KERNEL_KUBERNETES_NAMESPACE": self.namespace,
            },
            "docker": sandbox_env(root, self.user, image, state="state-docker"),
        }
        self.kernel = {engine: f"sandbox-{engine}" for engine in ENGINES}
        self.service: dict[str, SandboxService] = {}
        for engine in ENGINES:
            write_kernelspec(root, self.kernel[engine], self.env[engine])
            self.service[engine] = service_of(self.env[engine])

    @property
    def sandbox_id(self) -> str:
        return f"sk-{self.user}"

    def backend(self, engine: str) -> Backend:
        return self.service[engine].backend

    @staticmethod
    def order(round_: int) -> tuple[str, ...]:
        """The engines in the order of this round: swapped every round, so neither is
        always the one measured just after the other's work."""
        return ENGINES if round_ % 2 == 0 else ENGINES[::-1]

    def starts(self, runs: int) -> None:
        plain: list[float] = []
        running: dict[str, list[float]] = {e: [] for e in ENGINES}
        stopped: dict[str, list[float]] = {e: [] for e in ENGINES}
        absent: dict[str, list[float]] = {e: [] for e in ENGINES}
        for engine in ENGINES:  # each sandbox made, both kernels' files in the page cache
            first_result(self.kernel[engine])
        first_result("python3")
        for r in range(runs):
            plain.append(first_result("python3"))
            for engine in self.order(r):
                running[engine].append(first_result(self.kernel[engine]))
            for engine in self.order(r):
                self.backend(engine).stop(self.sandbox_id)
                stopped[engine].append(first_result(self.kernel[engine]))
            for engine in self.order(r):
                self.backend(engine).destroy(self.sandbox_id)
                absent[engine].append(first_result(self.kernel[engine]))
        for label, times in (
            ("sandbox running", running),
            ("sandbox stopped", stopped),
            ("no sandbox yet", absent),
        ):
            self.compare(f"start to first result: {label}", {**times, "ipykernel": plain})

    def warm_cells(self, runs: int) -> None:
        from jupyter_client.manager import start_new_kernel

        names = {**self.kernel, "ipykernel": "python3"}
        kernels = {label: start_new_kernel(kernel_name=name) for label, name in names.items()}
        try:
            for _, kc in kernels.values():
                execute(kc, "pass")
            times: dict[str, list[float]] = {label: [] for label in kernels}
            for r in range(runs):
                for label in (*self.order(r), "ipykernel"):
                    times[label].append(execute(kernels[label][1], "pass")[0])
            self.compare("warm cell round trip", times)
        finally:
            for km, kc in kernels.values():
                kc.stop_channels()
                km.shutdown_kernel(now=True)

    def client_import(self, runs: int) -> None:
        """The import on a kubernetes kernel's start path: the backend's own client
        against the official one."""
        times: dict[str, list[float]] = {"ours": [], "official": []}
        for _ in range(runs):
            for label, target in (
                ("ours", "sandbox_kernel.backends.kubernetes"),
                ("official", "kubernetes.client, kubernetes.config, kubernetes.stream"),
            ):
                code = (
                    "import time, sandbox_kernel.backends.base, sandbox_kernel.config\n"
                    f"t = time.perf_counter(); import {target}; print(time.perf_counter() - t)"
                )
                out = subprocess.run(
                    [sys.executable, "-I", "-c", code], capture_output=True, text=True, check=True
                )
                times[label].append(float(out.stdout.strip()))
        self.compare("kubernetes: import of the API client", times)

    def exec_costs(self, runs: int) -> None:
        """The first byte of ``python3`` through the backend's exec, and a whole ``exec
        true``, in the user's running sandbox of each engine."""
        for engine in ENGINES:
            self.service[engine].ensure(ScopeKey(self.user))
        firsts: dict[str, list[float]] = {e: [] for e in ENGINES}
        whole: dict[str, list[float]] = {e: [] for e in ENGINES}
        for r in range(runs):
            for engine in self.order(r):
                backend = self.backend(engine)
                t = time.perf_counter()
                channel = backend.open_channel(self.sandbox_id, ["python3", "-c", "print('x')"])
                first = channel.read()
                firsts[engine].append(time.perf_counter() - t)
                channel.close()
                assert first.startswith(b"x"), f"{engine}: exec answered {first[:80]!r}"
                t = time.perf_counter()
                result = backend.exec(self.sandbox_id, ["true"])
                whole[engine].append(time.perf_counter() - t)
                assert result.exit_code == 0, f"{engine}: exec true ended {result.exit_code}"
        self.compare("exec: first byte of python3", firsts)
        self.compare("exec: true, whole", whole)

    def files(self, runs: int, size_mb: int) -> None:
        """Up and down through each engine's REST route (kubernetes: the user's files pod;
        Docker: the sandbox itself), and through the backend's own stream into the
        running sandbox, curl for every HTTP transfer."""
        servers = {}
        try:
            for engine in ENGINES:
                self.service[engine].ensure(ScopeKey(self.user))
                servers[engine] = start_server(self.env[engine], self.root)
            src = self.root / "blob.bin"
            with src.open("wb") as fh:
                for _ in range(size_mb):
                    fh.write(os.urandom(1 << 20))
            back = self.root / "back.bin"
            kinds = ("REST up", "REST down", "stream up", "stream down")
            times: dict[str, dict[str, list[float]]] = {k: {e: [] for e in ENGINES} for k in kinds}
            for _, url, token in servers.values():  # kubernetes: the files pod comes up
                request(f"{url}/api/sandboxes/{self.sandbox_id}/files?path=", token)
            for r in range(runs):
                for engine in self.order(r):
                    _, url, token = servers[engine]
                    self.transfers(engine, url, token, src, back, times)
            for kind, label in (
                ("REST up", "upload (REST)"),
                ("REST down", "download (REST)"),
                ("stream up", "upload (the backend's stream)"),
                ("stream down", "download (the backend's stream)"),
            ):
                self.compare(f"{size_mb} MB {label}", times[kind])
        finally:
            for proc, _, _ in servers.values():
                proc.terminate()
                proc.wait()

    def transfers(
        self,
        engine: str,
        url: str,
        token: str,
        src: Path,
        back: Path,
        times: dict[str, dict[str, list[float]]],
    ) -> None:
        """One round of ``engine``'s four transfers of ``src``, each checked."""
        auth = ["-H", f"Authorization: token {token}"]
        rest = f"{url}/api/sandboxes/{self.sandbox_id}/files/bench/blob.bin"
        backend = self.backend(engine)
        t = time.perf_counter()
        subprocess.run(["curl", "-sf", "-o", "/dev/null", "-T", str(src), *auth, rest], check=True)
        times["REST up"][engine].append(time.perf_counter() - t)
        t = time.perf_counter()
        subprocess.run(["curl", "-sf", "-o", str(back), *auth, rest], check=True)
        times["REST down"][engine].append(time.perf_counter() - t)
        assert back.read_bytes() == src.read_bytes(), f"{engine}: the REST download differs"
        t = time.perf_counter()
        with src.open("rb") as fh:
            backend.put_file(self.sandbox_id, "/tmp/blob.bin", fh)
        times["stream up"][engine].append(time.perf_counter() - t)
        t = time.perf_counter()
        size = sum(len(c) for c in backend.get_file(self.sandbox_id, "/tmp/blob.bin"))
        times["stream down"][engine].append(time.perf_counter() - t)
        assert size == src.stat().st_size, f"{engine}: the stream gave {size} bytes back"

    def density(self, limit: int) -> None:
        """Idle kubernetes sandboxes (thread scope: one per notebook) until the node
        refuses one or ``limit`` is reached; memory per idle sandbox from the machine's
        MemAvailable."""
        service = self.service["kubernetes"]
        thread_service = SandboxService(service.config_with(scope="thread"))
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
            f"kubernetes: idle sandboxes on the node: {made} ({reason}); "
            f"{per:.1f} MiB each; {elapsed / max(made, 1):.2f} s each to make",
            flush=True,
        )
        backend = service.backend
        for info in backend.list(self.user):
            backend.destroy(info.id)

    def cleanup(self) -> None:
        try:
            self.api.delete(f"/api/v1/namespaces/{self.namespace}")
        finally:
            remove_docker_sandboxes(self.user, self.root)


def main() -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--smoke", action="store_true", help="a quick pass (CI)")
    parser.add_argument(
        "--rounds", type=int, default=7, metavar="N", help="rounds of the starts (default 7)"
    )
    parser.add_argument(
        "--density", type=int, default=0, metavar="N", help="idle sandboxes, at most N"
    )
    parser.add_argument(
        "--out", default=str(HERE / "results" / "kube-latest.json"), help="where to write JSON"
    )
    args = parser.parse_args()
    import docker

    root = Path(tempfile.mkdtemp(prefix="sk-kbench-"))
    bench = KubeBench(root, pick_image())
    version = bench.api.get("/version").get("gitVersion", "?")
    machine = (
        f"{platform.system()} {platform.machine()}, {os.cpu_count()} cores, "
        f"Kubernetes {version}, Docker {docker.from_env().version().get('Version', '?')}, "
        f"image {bench.image}"
    )
    print(f"machine: {machine}", flush=True)
    try:
        bench.client_import(2 if args.smoke else 10)
        bench.exec_costs(5 if args.smoke else 50)
        bench.warm_cells(10 if args.smoke else 200)
        bench.starts(1 if args.smoke else args.rounds)
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
