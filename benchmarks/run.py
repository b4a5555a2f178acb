"""Benchmarks: the sandbox kernel against plain ipykernel, in one run, same machine.

    python benchmarks/run.py            # the full run (a few minutes)
    python benchmarks/run.py --smoke    # a quick pass that proves the script still works
    python benchmarks/run.py --scale 1000   # adds 10, 100 and 1,000 idle sandboxes, each
                                            # answering a cell through a kernel
    python benchmarks/run.py --only-starts   # the three starts to first result, alone
    python benchmarks/run.py --only-preview  # a port's preview against the port reached directly
    python benchmarks/run.py --only-batch --rounds 50   # CI: nbmake of 10 notebooks, 20 notebooks
                                            # in parallel (nbclient) and in sequence, parallel starts

Each measure runs for the `sandbox` kernel and for plain `python3` (ipykernel) where
that makes sense, and reports medians, p95 and the ratio; results also go to JSON
(``--out``). Timing is reported, never asserted. Public tools only: jupyter_client,
the docker SDK, requests (via urllib), and a real `jupyter server` for the REST parts.
Settings: SANDBOX_KERNEL_IMAGE (default: the CI test image when present).
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
import urllib.request
import uuid
from pathlib import Path

import docker
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
    shim_rss_mib,
    start_server,
    write_kernelspec,
)
from jupyter_client.manager import start_new_kernel


class Bench(Results):
    """The Docker backend's sandbox kernel against plain ipykernel, measure by measure."""

    execute = staticmethod(execute)

    def __init__(self, root: Path, image: str) -> None:
        super().__init__()
        self.root = root
        self.image = image
        self.user = f"bench-{uuid.uuid4().hex[:6]}"
        self.env = sandbox_env(root, self.user, image)
        # The kernelspec users get, pointed at this run's settings; "sandbox-ci" as in a
        # CI checkout: the notebook's folder is the work folder.
        write_kernelspec(root, "sandbox", self.env)
        write_kernelspec(root, "sandbox-ci", {**self.env, "SANDBOX_KERNEL_WORK_ROOT": "auto"})

    @property
    def sandbox_id(self) -> str:
        return f"sk-{self.user}"

    @property
    def container_name(self) -> str:
        """The engine's name of the sandbox (its id plus the installation's tag)."""
        from sandbox_kernel.backends.base import engine_name, installation_id

        return engine_name(installation_id(self.env["SANDBOX_KERNEL_STATE_DIR"]), self.sandbox_id)

    def first_result(self, name: str) -> float:
        return first_result(name)

    def with_server(self) -> tuple[subprocess.Popen, str, str]:
        return start_server(self.env, self.root)

    # -- measures ------------------------------------------------------------------
    def cells(self, runs: int) -> None:
        kernels = {name: start_new_kernel(kernel_name=name) for name in ("sandbox", "python3")}
        try:
            for _, kc in kernels.values():
                self.execute(kc, "pass")  # warm up
            times: dict[str, list[float]] = {n: [] for n in kernels}
            for _ in range(runs):  # interleaved: this machine's slow moments hit both alike
                for n, (_, kc) in kernels.items():
                    times[n].append(self.execute(kc, "pass")[0])
            self.record("warm cell round trip", times["sandbox"], times["python3"])
            lines = {}
            for n, (_, kc) in kernels.items():
                samples = []
                for _ in range(max(3, runs // 30)):
                    t, outs = self.execute(kc, "for i in range(2000):\n    print(i)")
                    text = "".join(m["content"]["text"] for m in outs if m["msg_type"] == "stream")
                    assert text.split() == [str(i) for i in range(2000)], (
                        f"{n}: lines lost or out of order"
                    )
                    samples.append(t)
                lines[n] = samples
            self.record(
                "2,000 printed lines (complete, in order)", lines["sandbox"], lines["python3"]
            )
            png = "import os\nfrom IPython.display import Image, display\ndisplay(Image(data=b'\\x89PNG\\r\\n\\x1a\\n' + os.urandom(1 << 20), format='png'))"
            big = "print('x' * 10_000_000)"
            for label, code in (("1 MB PNG display", png), ("10 MB text output", big)):
                got = {
                    n: [self.execute(kc, code)[0] for _ in range(max(2, runs // 60))]
                    for n, (_, kc) in kernels.items()
                }
                self.record(label, got["sandbox"], got["python3"])
            intr = {}
            for n, (km, kc) in kernels.items():
                samples = []
                for _ in range(max(2, runs // 60)):
                    msg_id = kc.execute("import time; time.sleep(30)")
                    time.sleep(0.5)
                    started = time.perf_counter()
                    km.interrupt_kernel()
                    while kc.get_shell_msg(timeout=30)["parent_header"].get("msg_id") != msg_id:
                        pass
                    samples.append(time.perf_counter() - started)
                intr[n] = samples
            self.record("interrupt (sleep to reply)", intr["sandbox"], intr["python3"])
        finally:
            for km, kc in kernels.values():
                kc.stop_channels()
                km.shutdown_kernel(now=True)

    def starts(self, runs: int) -> None:
        client = docker.from_env()
        # Interleaved, one of each per round, so a slow minute of this (shared) machine
        # hits every kind of start and ipykernel alike.
        plain: list[float] = []
        existing: list[float] = []
        fresh: list[float] = []
        stopped: list[float] = []
        self.first_result("sandbox")  # the sandbox and its image ready for the first round,
        self.first_result("python3")  # and both kernels' files in the page cache
        for _ in range(runs):
            plain.append(self.first_result("python3"))
            existing.append(self.first_result("sandbox"))
            client.containers.get(self.container_name).remove(force=True)
            fresh.append(self.first_result("sandbox"))
            client.containers.get(self.container_name).stop(timeout=1)
            stopped.append(self.first_result("sandbox"))
        self.record("start to first result: sandbox exists", existing, plain)
        self.record("start to first result: no sandbox yet", fresh, plain)
        self.record("start to first result: sandbox stopped", stopped, plain)

    def files(self, runs: int, size_mb: int) -> None:
        """Upload and download through the REST route and WebDAV, against ``docker cp``,
        interleaved run by run (curl for both HTTP routes, so the client is the same)."""
        self.first_result("sandbox")  # the sandbox exists and runs (docker cp needs that)
        proc, url, token = self.with_server()
        try:
            src = self.root / "blob.bin"
            with src.open("wb") as fh:
                for _ in range(size_mb):
                    fh.write(os.urandom(1 << 20))
            auth = ["-H", f"Authorization: token {token}"]
            rest = f"{url}/api/sandboxes/{self.sandbox_id}/files/bench/blob.bin"
            dav = f"{url}/sandbox-kernel/dav/{self.sandbox_id}/blob-dav.bin"
            back = str(self.root / "back.bin")
            commands = {
                "rest up": ["curl", "-sf", "-o", "/dev/null", "-T", str(src), *auth, rest],
                "rest down": ["curl", "-sf", "-o", back, *auth, rest],
                "dav up": ["curl", "-sf", "-o", "/dev/null", "-T", str(src), *auth, dav],
                "dav down": ["curl", "-sf", "-o", back, *auth, dav],
                "cp in": ["docker", "cp", str(src), f"{self.container_name}:/tmp/blob.bin"],
                "cp out": [
                    "docker",
                    "cp",
                    f"{self.container_name}:/tmp/blob.bin",
                    str(self.root / "cp.bin"),
                ],
            }
            times: dict[str, list[float]] = {name: [] for name in commands}
            for _ in range(runs):
                for name, cmd in commands.items():
                    t = time.perf_counter()
                    subprocess.run(cmd, check=True)
                    times[name].append(time.perf_counter() - t)
                    if name.endswith("down"):
                        assert Path(back).read_bytes() == src.read_bytes(), f"{name}: differs"
            self.record(
                f"{size_mb} MB upload (REST)", times["rest up"], times["cp in"], against="docker cp"
            )
            self.record(
                f"{size_mb} MB download (REST)",
                times["rest down"],
                times["cp out"],
                against="docker cp",
            )
            self.record(
                f"{size_mb} MB upload (WebDAV)",
                times["dav up"],
                times["cp in"],
                against="docker cp",
            )
            self.record(
                f"{size_mb} MB download (WebDAV)",
                times["dav down"],
                times["cp out"],
                against="docker cp",
            )
            self.listings(url, token, runs * 10)
        finally:
            proc.terminate()
            proc.wait()

    def preview(self, runs: int, size_mb: int) -> None:
        """A port's preview (sandbox-kernel/proxy/...) against reaching the container's
        port directly from the host, interleaved: the latency of a small GET (Python's
        client, one process) and the throughput of a large download (curl for both)."""
        self.first_result("sandbox")
        proc, url, token = self.with_server()
        container = docker.from_env().containers.get(self.container_name)
        try:
            container.exec_run(
                ["python3", "-c", f"open('/tmp/big.bin', 'wb').write(b'x' * ({size_mb} << 20))"]
            )
            container.exec_run(
                ["python3", "-m", "http.server", "8765", "--directory", "/tmp"], detach=True
            )
            address = next(iter(container.attrs["NetworkSettings"]["Networks"].values()))[
                "IPAddress"
            ]
            direct = f"http://{address}:8765"
            proxied = f"{url}/sandbox-kernel/proxy/{self.sandbox_id}/8765"
            deadline = time.monotonic() + 60  # the app, and the server (slow on a busy host)
            while True:
                try:
                    urllib.request.urlopen(direct + "/", timeout=5).close()
                    request(url + "/api/status", token)
                    break
                except OSError:
                    if time.monotonic() > deadline:
                        raise
                    time.sleep(0.2)
            small_p: list[float] = []
            small_d: list[float] = []
            big_p: list[float] = []
            big_d: list[float] = []
            for _ in range(runs):
                for _ in range(20):
                    t = time.perf_counter()
                    request(proxied + "/", token)
                    small_p.append(time.perf_counter() - t)
                    t = time.perf_counter()
                    urllib.request.urlopen(direct + "/", timeout=60).read()
                    small_d.append(time.perf_counter() - t)
                for target, into in ((proxied, big_p), (direct, big_d)):
                    t = time.perf_counter()
                    subprocess.run(
                        [
                            "curl",
                            "-sf",
                            "-o",
                            "/dev/null",
                            "-H",
                            f"Authorization: token {token}",
                            target + "/big.bin",
                        ],
                        check=True,
                    )
                    into.append(time.perf_counter() - t)
            self.record("preview: small GET", small_p, small_d, against="direct")
            self.record(f"preview: {size_mb} MB download", big_p, big_d, against="direct")
            for label, times in (("preview", big_p), ("direct", big_d)):
                print(f"    {label}: {size_mb / statistics.median(times):.0f} MB/s", flush=True)
        finally:
            proc.terminate()
            proc.wait()

    def listings(self, url: str, token: str, runs: int) -> None:
        """What WsgiDAV's XML costs: a folder of 100 files listed by PROPFIND (depth 1)
        against the REST route's JSON listing, interleaved, in one process (no curl)."""
        folder = f"{url}/api/sandboxes/{self.sandbox_id}/files/list100"
        for i in range(100):
            req = urllib.request.Request(
                f"{folder}/f{i:03d}.txt",
                data=b"x",
                method="PUT",
                headers={"Authorization": f"token {token}"},
            )
            urllib.request.urlopen(req, timeout=60).close()
        rest = f"{url}/api/sandboxes/{self.sandbox_id}/files?path=list100"
        dav = f"{url}/sandbox-kernel/dav/{self.sandbox_id}/list100/"
        rest_times, dav_times = [], []
        for _ in range(runs):
            t = time.perf_counter()
            request(rest, token)
            rest_times.append(time.perf_counter() - t)
            t = time.perf_counter()
            body = request(dav, token, "PROPFIND", Depth="1")
            dav_times.append(time.perf_counter() - t)
            assert b"f000.txt" in body and b"f099.txt" in body, "the PROPFIND missed files"
        self.record("listing of 100 files (WebDAV PROPFIND)", dav_times, rest_times, against="REST")

    def scale(self, counts: list[int], workers: int = 4) -> None:
        """N idle sandboxes of one user (thread scope: one per notebook), each answering a
        cell through a kernel of its own; memory per idle sandbox (the container's cgroup,
        and the engine's per-container shim on this host), the REST listing and stats of
        all of them, and where the engine's limits bite."""
        from concurrent.futures import ThreadPoolExecutor

        from sandbox_kernel.identity import ScopeKey

        service = service_of(self.env)
        backend = service.backend
        # A kernelspec without the user's settings: each kernel names its sandbox (env).
        scale_env = {k: v for k, v in self.env.items() if k != "SANDBOX_KERNEL_USER"}
        write_kernelspec(self.root, "sandbox-scale", scale_env)
        proc, url, token = self.with_server()
        made = 0
        available_before = mem_available_mib()

        def key(i: int) -> ScopeKey:
            return ScopeKey(self.user, "thread", f"idle-{i}")

        def make(i: int) -> str:
            try:
                service.ensure(key(i))
                return ""
            except Exception as exc:  # the engine's limit: say which, keep measuring
                return f"{type(exc).__name__}: {str(exc).splitlines()[0][:200]}"

        def answer(i: int) -> tuple[float, str]:
            env = {
                **os.environ,
                "SANDBOX_KERNEL_USER": self.user,
                "SANDBOX_KERNEL_SCOPE": "thread",
                "SANDBOX_KERNEL_THREAD": f"idle-{i}",
            }
            started = time.perf_counter()
            try:
                km, kc = start_new_kernel(kernel_name="sandbox-scale", startup_timeout=300, env=env)
            except Exception as exc:
                return 0.0, f"start: {type(exc).__name__}: {exc}"[:200]
            try:
                _, outs = self.execute(kc, f"print({i} * 2)", timeout=300)
                text = "".join(m["content"].get("text", "") for m in outs)
                if text.strip() != str(i * 2):
                    return 0.0, f"wrong answer: {text[:100]!r}"
                return time.perf_counter() - started, ""
            except Exception as exc:
                return 0.0, f"cell: {type(exc).__name__}: {exc}"[:200]
            finally:
                kc.stop_channels()
                km.shutdown_kernel(now=True)

        try:
            for n in counts:
                started = time.perf_counter()
                with ThreadPoolExecutor(workers) as pool:
                    errors = [e for e in pool.map(make, range(made, n)) if e]
                made = n
                infos = [i for i in backend.list(self.user) if "--t" in i.id]
                print(
                    f"{n} idle sandboxes: {len(infos)} running after {time.perf_counter() - started:.0f} s"
                    + (f"; {len(errors)} could not be made, e.g. {errors[0]}" if errors else ""),
                    flush=True,
                )
                usage = backend.usage(infos)
                per = [u["memory"] / 2**20 for u in usage.values()]
                self.record(f"{n} idle sandboxes: MiB each (cgroup)", per, None, unit="MiB")
                # What the host gave up for them all (kernel memory, the engine's shims
                # and the containers, shared pages counted once), per sandbox.
                self.record(
                    f"{n} idle sandboxes: MiB each (host, all told)",
                    [(available_before - mem_available_mib()) / max(1, len(infos))],
                    None,
                    unit="MiB",
                )
                shims = shim_rss_mib()
                if shims:
                    self.record(
                        f"{n} idle sandboxes: MiB each (engine shim)", shims, None, unit="MiB"
                    )
                with ThreadPoolExecutor(workers) as pool:
                    answers = list(pool.map(answer, range(n)))
                times = [t for t, e in answers if not e]
                failed = [e for _, e in answers if e]
                if times:
                    self.record(f"{n} idle sandboxes: kernel start to answer", times, None)
                self.results[f"{n} idle sandboxes: kernels answered"] = {
                    "answered": len(times),
                    "failed": failed[:20],
                }
                print(
                    f"{n} idle sandboxes: {len(times)} answered through a kernel, {len(failed)} failed"
                    + (f", e.g. {failed[0]}" if failed else ""),
                    flush=True,
                )
                for path, label in (
                    ("/api/sandboxes", "listing"),
                    ("/api/sandboxes-stats", "stats"),
                ):
                    took = []
                    for _ in range(5):
                        t = time.perf_counter()
                        request(url + path, token)
                        took.append(time.perf_counter() - t)
                    self.record(f"{n} idle sandboxes: {label} over REST", took, None)
                after = backend.usage(infos)
                self.record(
                    f"{n} idle sandboxes: MiB each after a kernel (spare if left)",
                    [u["memory"] / 2**20 for u in after.values()],
                    None,
                    unit="MiB",
                )
        finally:
            proc.terminate()
            proc.wait()
            with ThreadPoolExecutor(workers) as pool:
                list(
                    pool.map(
                        backend.destroy,
                        [i.id for i in backend.list(self.user) if "--t" in i.id],
                    )
                )

    # -- batch: what a CI job does --------------------------------------------------
    def notebooks(self, folder: Path, count: int) -> list[Path]:
        """Small notebooks as a CI job has them: a computation, a print, a rich display."""
        import nbformat

        folder.mkdir(parents=True, exist_ok=True)
        (folder / "data.csv").write_text("n\n" + "\n".join(str(i) for i in range(100)) + "\n")
        paths = []
        for n in range(count):
            nb = nbformat.v4.new_notebook()
            nb.cells = [
                nbformat.v4.new_code_cell(c)
                for c in (
                    "import csv\nrows = [int(r['n']) for r in csv.DictReader(open('data.csv'))]",
                    f"total = sum(rows) * {n}\nprint('notebook {n}:', total)",
                    "from IPython.display import HTML\nHTML(f'<b>{total}</b>')",
                )
            ]
            paths.append(folder / f"nb-{n:02}.ipynb")
            nbformat.write(nb, paths[-1])
        return paths

    def remove_folder_sandboxes(self, folder: Path) -> None:
        client = docker.from_env()
        for c in client.containers.list(
            ignore_removed=True, all=True, filters={"label": f"sandbox-kernel.work-folder={folder}"}
        ):
            c.remove(force=True)

    def nbmake(self, runs: int, count: int = 10) -> None:
        """`pytest --nbmake` over `count` notebooks, interleaved with ipykernel; the
        sandbox once existing, once made during the run (a fresh CI runner)."""
        folder = self.root / "nbmake"
        self.notebooks(folder, count)

        def once(kernel: str) -> float:
            started = time.perf_counter()
            done = subprocess.run(
                [
                    sys.executable,
                    "-I",
                    "-m",
                    "pytest",
                    "-q",
                    "-p",
                    "no:cacheprovider",
                    "--nbmake",
                    f"--nbmake-kernel={kernel}",
                    ".",
                ],
                cwd=folder,
                capture_output=True,
                text=True,
                timeout=900,
            )
            elapsed = time.perf_counter() - started
            assert done.returncode == 0, f"{kernel}: {done.stdout[-2000:]}"
            return elapsed

        once("sandbox-ci")  # make the folder's sandbox
        plain, existing, fresh = [], [], []
        for _ in range(runs):
            plain.append(once("python3"))
            existing.append(once("sandbox-ci"))
            self.remove_folder_sandboxes(folder)
            fresh.append(once("sandbox-ci"))
        self.record(f"nbmake, {count} notebooks: sandbox exists", existing, plain)
        self.record(f"nbmake, {count} notebooks: sandbox made in the run", fresh, plain)

    def nbclient_parallel(self, runs: int, width: int = 20) -> None:
        """`width` different notebooks run at once by nbclient in one process (a CI matrix
        on one machine), wall time, interleaved with ipykernel; all in one sandbox."""
        import asyncio

        import nbformat
        from nbclient import NotebookClient

        folder = self.root / "nbclient-parallel"
        paths = self.notebooks(folder, width)

        async def run_all(kernel: str) -> float:
            clients = [
                NotebookClient(
                    nbformat.read(p, as_version=4),
                    kernel_name=kernel,
                    timeout=300,
                    startup_timeout=300,
                    resources={"metadata": {"path": str(folder)}},
                )
                for p in paths
            ]
            started = time.perf_counter()
            await asyncio.gather(*(c.async_execute() for c in clients))
            return time.perf_counter() - started

        asyncio.run(run_all("sandbox-ci"))  # the folder's sandbox exists, as on a warm runner
        plain, sandbox = [], []
        for _ in range(runs):
            plain.append(asyncio.run(run_all("python3")))
            sandbox.append(asyncio.run(run_all("sandbox-ci")))
        self.record(f"{width} notebooks in parallel (nbclient)", sandbox, plain)

    def sequential_execute(self, runs: int, count: int = 20) -> None:
        """One `jupyter execute` of `count` notebooks, one after another, in one sandbox."""
        folder = self.root / "sequential"
        paths = self.notebooks(folder, count)

        def once(kernel: str) -> float:
            started = time.perf_counter()
            done = subprocess.run(
                [sys.executable, "-I", "-m", "jupyter", "execute", f"--kernel_name={kernel}"]
                + [p.name for p in paths],
                cwd=folder,
                capture_output=True,
                text=True,
                timeout=900,
            )
            assert done.returncode == 0, f"{kernel}: {done.stderr[-2000:]}"
            return time.perf_counter() - started

        once("sandbox-ci")
        plain, sandbox = [], []
        for _ in range(runs):
            plain.append(once("python3"))
            sandbox.append(once("sandbox-ci"))
        self.record(f"{count} notebooks in sequence (jupyter execute)", sandbox, plain)

    def parallel_starts(self, rounds: int, width: int = 20) -> None:
        """`width` `jupyter execute` at once (a CI matrix on one runner), `rounds` times
        per kernel, interleaved. Counts failures (non-zero exit) and hangs (still running
        after 5 minutes); the time of a round is reported beside them."""
        folder = self.root / "parallel"
        paths = self.notebooks(folder, width)
        failures: dict[str, list[str]] = {"sandbox-ci": [], "python3": []}
        walls: dict[str, list[float]] = {"sandbox-ci": [], "python3": []}
        for _ in range(rounds):
            for kernel in ("python3", "sandbox-ci"):
                started = time.perf_counter()
                procs = [
                    subprocess.Popen(
                        [
                            sys.executable,
                            "-I",
                            "-m",
                            "jupyter",
                            "execute",
                            f"--kernel_name={kernel}",
                            "--startup_timeout=240",
                            p.name,
                        ],
                        cwd=folder,
                        stdout=subprocess.DEVNULL,
                        stderr=subprocess.PIPE,
                        text=True,
                    )
                    for p in paths
                ]
                for proc in procs:
                    try:
                        _, err = proc.communicate(timeout=300)
                        if proc.returncode != 0:
                            failures[kernel].append(
                                err.strip().splitlines()[-1]
                                if err.strip()
                                else f"exit {proc.returncode}"
                            )
                    except subprocess.TimeoutExpired:
                        proc.kill()
                        proc.communicate()
                        failures[kernel].append("hang: still running after 300 s")
                walls[kernel].append(time.perf_counter() - started)
        total = rounds * width
        for kernel, label in (("sandbox-ci", "sandbox"), ("python3", "ipykernel")):
            print(
                f"{total} parallel starts ({rounds} rounds of {width}): {label} {len(failures[kernel])} failed",
                flush=True,
            )
            for line in sorted(set(failures[kernel])):
                print(f"    {failures[kernel].count(line)} x {line}", flush=True)
        self.record(
            f"{width} parallel jupyter execute (a round)", walls["sandbox-ci"], walls["python3"]
        )
        self.results[f"{total} parallel starts: failures"] = {
            "sandbox": failures["sandbox-ci"],
            "ipykernel": failures["python3"],
            "starts": total,
        }

    def cleanup(self) -> None:
        remove_docker_sandboxes(self.user, self.root)


def main() -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument(
        "--smoke", action="store_true", help="a quick pass (CI): few runs, small files"
    )
    parser.add_argument(
        "--scale",
        type=int,
        nargs="?",
        const=100,
        default=0,
        metavar="N",
        help="also N idle sandboxes (10, 100, then N; N = 100 when not given), each answering a cell through a kernel",
    )
    parser.add_argument(
        "--only-scale",
        type=int,
        nargs="?",
        const=100,
        default=0,
        metavar="N",
        help="run only the idle-sandboxes measure (N as for --scale)",
    )
    parser.add_argument(
        "--batch",
        action="store_true",
        help="also CI measures: nbmake of 10 notebooks, parallel starts",
    )
    parser.add_argument("--only-batch", action="store_true", help="run only the CI measures")
    parser.add_argument(
        "--only-files",
        action="store_true",
        help="run only the file transfers (REST, WebDAV, docker cp)",
    )
    parser.add_argument(
        "--only-preview",
        action="store_true",
        help="run only the preview proxy against the container's port reached directly",
    )
    parser.add_argument(
        "--only-starts",
        action="store_true",
        help="run only the starts to first result (sandbox exists, none yet, stopped)",
    )
    parser.add_argument(
        "--rounds", type=int, default=50, help="rounds of 20 parallel starts per kernel (--batch)"
    )
    parser.add_argument(
        "--out", default=str(HERE / "results" / "latest.json"), help="where to write JSON"
    )
    args = parser.parse_args()
    root = Path(tempfile.mkdtemp(prefix="sk-bench-"))
    bench = Bench(root, pick_image())
    machine = f"{platform.system()} {platform.machine()}, {os.cpu_count()} cores, python {platform.python_version()}, image {bench.image}"
    print(f"machine: {machine}", flush=True)
    try:
        only = (
            args.only_scale
            or args.only_batch
            or args.only_files
            or args.only_starts
            or args.only_preview
        )
        if not only:
            bench.cells(30 if args.smoke else 300)
        if not only or args.only_starts:
            bench.starts(1 if args.smoke else 9)
        if not only or args.only_files:
            bench.files(1 if args.smoke else 3, 10 if args.smoke else 100)
        if not only or args.only_preview:
            bench.preview(1 if args.smoke else 5, 10 if args.smoke else 100)
        top = args.only_scale or args.scale
        if top:
            bench.scale(sorted({n for n in (10, 100) if n < top} | {top}))
        if args.batch or args.only_batch:
            # The smoke proves the measures run, with 4 notebooks where a run has 20.
            width = 4 if args.smoke else 20
            bench.nbmake(1 if args.smoke else 5, count=width // 2)
            bench.nbclient_parallel(1 if args.smoke else 3, width=width)
            bench.sequential_execute(1 if args.smoke else 3, count=width)
            bench.parallel_starts(1 if args.smoke else args.rounds, width=width)
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
