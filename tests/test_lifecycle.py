"""Lifecycle policies, quotas, stats and snapshots against the real Docker engine.

Times are made short by configuration (fractions of a minute), never by sleeping for
the real defaults.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import threading
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import docker
import pytest

from sandbox_kernel.backends.base import (
    BadRequest,
    Conflict,
    QuotaExceeded,
    SandboxError,
    SandboxNotFound,
    engine_name,
    installation_id,
    sandbox_labels,
)
from sandbox_kernel.backends.docker import files as docker_files
from sandbox_kernel.config import SandboxConfig
from sandbox_kernel.identity import ScopeKey
from sandbox_kernel.lifecycle import gc, stats
from sandbox_kernel.service import SandboxService
from sandbox_kernel.store import Store

from .conftest import remove_user_snapshots
from .helpers import make_wheel

pytestmark = [pytest.mark.docker, pytest.mark.usefixtures("docker_cleanup")]
SECONDS = 1 / 60  # config values are minutes


def engine() -> docker.DockerClient:
    return docker.from_env()


def test_idle_stop_then_delete_keeps_workspace(
    make_config: Callable[..., SandboxConfig], test_user: str
) -> None:
    cfg = make_config(idle_stop=1 * SECONDS, idle_delete=1 * SECONDS)
    service = SandboxService(cfg)
    backend = service.backend
    key = ScopeKey(test_user)
    info = service.ensure(key).info
    backend.exec(info.id, ["python3", "-c", "open('/workspace/keep.txt', 'w').write('k')"])
    assert [a for a in gc(backend, cfg) if a.sandbox_id == info.id] == []  # fresh: not idle yet
    time.sleep(1.5)
    [action] = [a for a in gc(backend, cfg) if a.sandbox_id == info.id]
    assert (action.action, action.done) == ("stop", True)
    assert backend.get(info.id).state == "stopped"
    time.sleep(1.5)
    [action] = [a for a in gc(backend, cfg, dry_run=True) if a.sandbox_id == info.id]
    assert (action.action, action.done) == ("destroy", False)  # dry run touches nothing
    assert backend.get(info.id).state == "stopped"
    [action] = [a for a in gc(backend, cfg) if a.sandbox_id == info.id]
    assert (action.action, action.done) == ("destroy", True)
    with pytest.raises(SandboxNotFound):
        backend.get(info.id)
    assert (Path(info.workspace) / "keep.txt").read_text() == "k"


def test_busy_kernel_is_not_idle(make_config: Callable[..., SandboxConfig], test_user: str) -> None:
    """A long silent cell: its kernel beats busy, so a 3 s idle policy leaves it alone."""
    cfg = make_config(idle_stop=3 * SECONDS, idle_stop_with_kernel=3 * SECONDS)
    service = SandboxService(cfg)
    backend = service.backend
    info = service.ensure(ScopeKey(test_user)).info
    store = Store(cfg)
    stop = threading.Event()

    def beat() -> None:
        while not stop.is_set():
            store.kernel_heartbeat("kernel-1", "docker", info.id, busy=True)
            stop.wait(1)

    thread = threading.Thread(target=beat)
    thread.start()
    try:
        for _ in range(8):
            time.sleep(1)
            assert [a for a in gc(backend, cfg) if a.sandbox_id == info.id] == []
    finally:
        stop.set()
        thread.join()
    assert backend.get(info.id).state == "running"
    # The same kernel now idle: after idle_stop_with_kernel it is stopped.
    store.kernel_heartbeat("kernel-1", "docker", info.id, busy=False)
    time.sleep(3.5)
    store.kernel_heartbeat("kernel-1", "docker", info.id, busy=False)
    [action] = [a for a in gc(backend, cfg) if a.sandbox_id == info.id]
    assert action.action == "stop" and "idle kernel" in action.reason


def test_orphans_reaped_foreign_untouched(
    make_config: Callable[..., SandboxConfig], test_user: str
) -> None:
    cfg = make_config(orphan_grace=1 * SECONDS)
    service = SandboxService(cfg)
    backend = service.backend
    client = engine()
    image = cfg.image
    foreign = client.containers.create(
        image, ["python3", "-c", "import time; time.sleep(600)"], name=f"{test_user}-foreign"
    )
    foreign.start()
    labelled_foreign = client.containers.create(
        image,
        ["python3", "-c", "pass"],
        name=f"{test_user}-other-tool",
        labels={"sandbox-kernel.user-id": test_user},
    )
    try:
        no_record = service.ensure(ScopeKey(test_user + "-a")).info
        Store(cfg).delete("docker", no_record.id)  # its owner record is gone
        key = ScopeKey(test_user + "-b")
        half = client.containers.create(  # a create that crashed before start
            image,
            ["python3", "-c", "pass"],
            name=engine_name(service.installation, key.name),
            labels=sandbox_labels(
                key,
                service.spec(key.user),
                service.installation,
                str(Path(cfg.workspace_root) / key.user_id),
            ),
        )
        # Made with flavor medium; its owner has since asked for small: it is resized,
        # never reaped for it (its installed packages are the user's).
        resized = (
            SandboxService(make_config(flavor="medium")).ensure(ScopeKey(test_user + "-c")).info
        )
        small = SandboxService(make_config(orphan_grace=1 * SECONDS, flavor="small"))
        notice = " ".join(small.ensure(ScopeKey(test_user + "-c")).notes)
        assert "now has flavor small" in notice and "it had medium" in notice
        healthy = service.ensure(ScopeKey(test_user + "-d")).info
        time.sleep(1.5)
        done = {a.sandbox_id: a for a in gc(backend, cfg)}
        assert "no owner record" in done[no_record.id].reason
        assert "half-created" in done[key.name].reason
        assert healthy.id not in done and resized.id not in done
        for gone in (no_record.id, key.name):
            with pytest.raises(docker.errors.NotFound):
                client.containers.get(engine_name(service.installation, gone))
        assert backend.get(resized.id).limits["memory"] == 1 << 30
        with pytest.raises(docker.errors.NotFound):  # the half-created container itself
            client.containers.get(half.id)
        assert client.containers.get(foreign.id).status == "running"
        assert client.containers.get(labelled_foreign.id).status == "created"
    finally:
        foreign.remove(force=True)
        labelled_foreign.remove(force=True)


def test_other_installations_are_left_alone(
    make_config: Callable[..., SandboxConfig], test_user: str, tmp_path: Path
) -> None:
    mine = make_config(orphan_grace=0, idle_stop=0)
    theirs = make_config(state_dir=str(tmp_path / "elsewhere"))
    other = SandboxService(theirs).ensure(ScopeKey(test_user)).info
    assert installation_id(mine) != installation_id(theirs)
    assert all(a.sandbox_id != other.id for a in gc(SandboxService(mine).backend, mine))
    assert engine().containers.get(other.engine_id).status == "running"


def test_concurrent_reapers(make_config: Callable[..., SandboxConfig], test_user: str) -> None:
    cfg = make_config(idle_stop=1 * SECONDS, idle_delete=0)
    service = SandboxService(cfg)
    backend = service.backend
    ids = [service.ensure(ScopeKey(f"{test_user}-{i}")).info.id for i in range(3)]
    time.sleep(1.5)
    with ThreadPoolExecutor(2) as pool:
        runs = list(pool.map(lambda _: gc(SandboxService(cfg).backend, cfg), range(2)))
    for run in runs:
        assert all(not a.error for a in run)
    assert all(backend.get(i).state == "stopped" for i in ids)


def test_a_frozen_sandbox_cannot_hang_the_hosts_exec(
    make_config: Callable[..., SandboxConfig], test_user: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Attack: a process of the sandbox stops every other process of its user, over and
    over (no privilege needed). The time limit of the host's exec (the reaper's, the
    lifecycle's) is kept by a runner in the sandbox, which is frozen too: the host must
    give up on its own at the limit and a little grace, not wait for ever. And the
    engine, whose start of the command was frozen with it, must still let the sandbox
    be inspected and destroyed."""
    service = SandboxService(make_config())
    backend = service.backend
    info = service.ensure(ScopeKey(test_user)).info
    freezer = "import os, signal, time\ntime.sleep(1)\nwhile True:\n    os.kill(-1, signal.SIGSTOP)"
    backend.exec(info.id, ["sh", "-c", f"python3 -c '{freezer}' >/dev/null 2>&1 &"])
    time.sleep(1.5)
    # A file transfer (REST files of remote workspaces, the folder copy) gives up on a
    # silent helper: here after 2 s instead of the 60 s of the default.
    monkeypatch.setattr(docker_files, "HELPER_IDLE", 2.0)
    began = time.monotonic()
    with pytest.raises(SandboxError):
        b"".join(backend.get_file(info.id, "/etc/hostname"))
    assert time.monotonic() - began < 20
    began = time.monotonic()
    result = backend.exec(info.id, ["sh", "-c", "sleep 60; echo finished"], timeout=2)
    took = time.monotonic() - began
    assert result.exit_code == 124 and b"timed out after 2" in result.output, result
    assert took < 15, f"the host waited {took:.1f} s for a 2 s limit"
    # The engine's start of that command was frozen half-way, holding the container's
    # lock (inspect, stop and remove hung for good): the host freed it.
    with ThreadPoolExecutor(1) as pool:
        state = pool.submit(lambda: backend.get(info.id).state).result(timeout=20)
    assert state == "running"
    # A process started without a deadline (a kernel's, a terminal's) wedges it again:
    # the reaper's round frees it; and the owner's destroy (what the REST route and the
    # CLI call) goes through even when it is wedged.
    backend.open_channel(info.id, ["true"]).close()
    time.sleep(1)  # younger than STUCK_AFTER: the host looks again at that age
    with ThreadPoolExecutor(1) as pool:
        pool.submit(gc, backend, service.config).result(timeout=30)
        assert pool.submit(backend.get, info.id).result(timeout=20).state == "running"
    backend.open_channel(info.id, ["true"]).close()
    time.sleep(1)  # younger than STUCK_AFTER: the host looks again at that age
    with ThreadPoolExecutor(1) as pool:
        assert pool.submit(service.destroy, test_user, info.id).result(timeout=30)
    assert backend.find(info.id) is None


def test_quotas(make_config: Callable[..., SandboxConfig], test_user: str) -> None:
    cfg = make_config(max_sandboxes=2)
    service = SandboxService(cfg)
    backend = service.backend
    mine = [i.id for i in backend.list()]
    if len(mine) >= 2:
        pytest.skip("other sandboxes on this engine exceed the test quota")
    created = [service.ensure(ScopeKey(f"{test_user}-{i}")).info.id for i in range(2 - len(mine))]
    with pytest.raises(QuotaExceeded) as err:
        service.ensure(ScopeKey(f"{test_user}-over"))
    assert "max_sandboxes=2" in str(err.value) and "sandbox-kernel destroy" in str(err.value)
    listed = {i.id for i in backend.list()}
    assert (
        set(created) <= listed and service.sandbox_id(ScopeKey(f"{test_user}-over")) not in listed
    )  # refused: nothing made
    service.ensure(ScopeKey(f"{test_user}-0"))  # an existing one is still reachable
    mem_cfg = make_config(max_sandboxes=0, max_total_memory="1m")
    with pytest.raises(QuotaExceeded, match="max_total_memory=1m"):
        SandboxService(mem_cfg).ensure(ScopeKey(f"{test_user}-mem"))


@pytest.mark.parametrize(
    ("flavor", "cpus", "memory"), [("small", 1, 1 << 30), ("large", 4, 4 << 30)]
)
def test_flavor_limits(
    make_config: Callable[..., SandboxConfig], test_user: str, flavor: str, cpus: int, memory: int
) -> None:
    info = SandboxService(make_config(flavor=flavor)).ensure(ScopeKey(test_user)).info
    host = engine().containers.get(info.engine_id).attrs["HostConfig"]
    cpus = min(cpus, engine().info()["NCPU"])  # clamped to what the machine has
    assert (host["NanoCpus"], host["Memory"], info.flavor) == (cpus * 10**9, memory, flavor)


def test_stats_add_up(make_config: Callable[..., SandboxConfig], test_user: str) -> None:
    cfg = make_config(max_sandboxes=1000)
    service = SandboxService(cfg)
    backend = service.backend
    service.ensure(ScopeKey(f"{test_user}-run"))
    stopped = service.ensure(ScopeKey(f"{test_user}-stop")).info
    backend.stop(stopped.id)
    totals = stats(backend, cfg)
    everything = backend.list()
    assert totals["sandboxes"] == len(everything) == sum(totals["by_state"].values())
    assert sum(totals["by_flavor"].values()) == len(everything)
    running = [i for i in everything if i.state == "running"]
    assert totals["memory"]["reserved"] == sum(i.limits["memory"] for i in running)
    assert 0 < totals["memory"]["used"] < totals["memory"]["reserved"]
    assert totals["quota"]["sandboxes_left"] == 1000 - len(everything)


def test_snapshot_round_trip(
    make_config: Callable[..., SandboxConfig], test_user: str, tmp_path: Path
) -> None:
    cfg = make_config()
    service = SandboxService(cfg)
    backend = service.backend
    info = service.ensure(ScopeKey(test_user)).info
    wheel = make_wheel(tmp_path / "w")
    backend.put_file(info.id, f"w/{wheel.name}", wheel.read_bytes())
    assert (
        backend.exec(
            info.id,
            ["python3", "-m", "pip", "install", "--no-index", "-q", f"/workspace/w/{wheel.name}"],
        ).exit_code
        == 0
    )
    name = f"{test_user}-snap"
    with pytest.raises(BadRequest, match="bad snapshot name"):
        service.create_snapshot(test_user, info.id, "Bad Name!")
    snap = service.create_snapshot(test_user, info.id, name)
    try:
        assert (snap["name"], snap["source"], snap["user"]) == (name, info.id, test_user)
        assert snap["size"] > 0
        assert name in [s["name"] for s in service.snapshots(test_user)]
        assert name not in [s["name"] for s in service.snapshots(test_user + "-other")]
        # A sandbox of the same user started from it (a thread sandbox: the user's own exists).
        from_snap = SandboxService(make_config(snapshot=name, scope="thread"))
        clone = from_snap.ensure(ScopeKey(test_user, "thread", "clone.ipynb")).info
        assert clone.snapshot == name
        out = from_snap.backend.exec(
            clone.id,
            [
                "python3",
                "-c",
                "import sk_demo_pkg, os; print(sk_demo_pkg.VALUE, os.listdir('/workspace'))",
            ],
        )
        assert (
            out.output.decode().strip().startswith("1.0 [")
        )  # package kept: the workspace is the user's own
        with pytest.raises(Conflict, match="used by"):
            service.delete_snapshot(test_user, name)
        from_snap.destroy(test_user, clone.id)
        assert service.delete_snapshot(test_user, name) is True
        with pytest.raises(SandboxNotFound):
            service.delete_snapshot(test_user, name)
    finally:
        remove_user_snapshots(test_user)


def test_cli_gc_stats_snapshot(
    make_config: Callable[..., SandboxConfig], test_user: str, tmp_path: Path
) -> None:
    cfg = make_config()
    env = {
        "PATH": "/usr/bin:/bin",
        "HOME": str(tmp_path),
        "JUPYTER_CONFIG_DIR": str(tmp_path / "c"),
        "SANDBOX_KERNEL_BACKEND": "docker",
        "SANDBOX_KERNEL_IMAGE": cfg.image,
        "SANDBOX_KERNEL_WORKSPACE_ROOT": cfg.workspace_root,
        "SANDBOX_KERNEL_STATE_DIR": cfg.state_dir,
        "SANDBOX_KERNEL_USER": test_user,
        "SANDBOX_KERNEL_WORK_ROOT": "none",
    }

    def cli(*args: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            [sys.executable, "-m", "sandbox_kernel.cli", *args],
            env=env,
            capture_output=True,
            text=True,
            timeout=120,
        )

    assert cli("exec", "--", "true").returncode == 0
    totals = json.loads(cli("stats", "--json").stdout)
    assert totals["sandboxes"] >= 1 and "by_state" in totals
    assert "sandboxes of this installation, all users: 1 (yours: 1)" in cli("stats").stdout
    # `sandbox-kernel stats | head -1`: a reader that stops early is no error and no traceback.
    read_end, write_end = os.pipe()
    os.close(read_end)
    try:
        piped = subprocess.run(
            [sys.executable, "-m", "sandbox_kernel.cli", "stats"],
            env=env,
            stdout=write_end,
            stderr=subprocess.PIPE,
            text=True,
            timeout=120,
        )
    finally:
        os.close(write_end)
    assert (piped.returncode, piped.stderr) == (0, "")
    assert json.loads(cli("gc", "--dry-run", "--json").stdout) == []
    name = f"{test_user}-cli"
    made = cli("snapshot", "create", f"sk-{test_user}", name, "--json")
    assert made.returncode == 0, made.stderr
    try:
        listed = json.loads(cli("snapshot", "list", "--json").stdout)
        assert [s["name"] for s in listed] == [name]
        bad = cli("snapshot", "create", f"sk-{test_user}", "NO WAY")
        assert bad.returncode == 1 and "bad snapshot name" in bad.stderr
        assert "deleted" in cli("snapshot", "delete", name).stdout
    finally:
        remove_user_snapshots(test_user)
