"""Disk bounded like memory on the local backend: the disk images of a workspace and of
a local sandbox's own files (home, /tmp), through the real backend, kernel and CLI, as
a root server (which alone can mount images); an ordinary user's server runs sandboxes
unbounded and says so.

The host's gain is measured as what the images hold on its disk (their allocated
blocks), never as the machine's free space, which every other process moves.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from sandbox_kernel.backends import disks
from sandbox_kernel.backends.idmap import is_mountpoint
from sandbox_kernel.backends.local.disk import LocalDisks
from sandbox_kernel.config import load_config
from sandbox_kernel.errors import DiskFull
from sandbox_kernel.identity import ScopeKey
from sandbox_kernel.service import SandboxService

from .conftest import release_disks, require_bwrap
from .local_host import LocalHost, _local_host
from .test_disk import MiB, held_on_host, sh
from .test_disk import flavors as flavors  # noqa: F401 (a fixture)
from .test_disk import need_disks as need_disks  # noqa: F401 (a fixture)

USER = "disker"


@pytest.fixture
def local_service(
    need_disks: None, flavors: dict[str, Any], tmp_path: Path
) -> Iterator[Callable[..., SandboxService]]:
    """Services over one local installation (a root server's), by flavor."""
    require_bwrap()

    def make(flavor: str = "tiny", **overrides: Any) -> SandboxService:
        return SandboxService(
            load_config(
                environ={},
                backend="local",
                workspace_root=str(tmp_path / "ws"),
                state_dir=str(tmp_path / "st"),
                work_root="none",
                flavor=flavor,
                **overrides,
            )
        )

    yield make


def _images(tmp_path: Path, engine_id: str) -> tuple[Path, Path]:
    state = tmp_path / "st" / "disks"
    return (
        state / "sandbox" / f"{engine_id}.img",
        state / "workspace" / f"{ScopeKey(USER).user_id}.img",
    )


def test_a_local_sandbox_is_bounded_in_its_workspace_and_its_own_files(
    local_service: Callable[..., SandboxService], tmp_path: Path
) -> None:
    service = local_service()
    info = service.ensure(ScopeKey(USER)).info
    assert info.limits["disk"] == info.limits["workspace_disk"] == 128 * MiB
    assert info.disk_note == "" and "disk limited by disk images" in info.isolation
    # Each disk's root is the sandbox user's inside (root's on disk, idmapped to it).
    owners = sh(service, info.id, "stat -c %u /workspace /home/sandbox /tmp")
    assert owners.split() == ["1000", "1000", "1000"], owners
    assert os.stat(info.workspace).st_uid == 0 and is_mountpoint(Path(info.workspace))
    for place in ("/workspace", "/home/sandbox", "/tmp"):
        out = sh(
            service, info.id, f"dd if=/dev/zero of={place}/big bs=1M count=200 2>&1; echo rc=$?"
        )
        assert "No space left on device" in out and "rc=1" in out, (place, out)
        sh(service, info.id, f"rm -f {place}/big")
    # A sandbox that filled its own disk still starts its next process: what the host
    # keeps for it (its record, its processes' markers) is not on that disk.
    sh(service, info.id, "dd if=/dev/zero of=$HOME/fill bs=1M 2>/dev/null; true")
    assert sh(service, info.id, "echo still starts") == "still starts\n"
    sh(service, info.id, "rm -f $HOME/fill")
    sh(
        service,
        info.id,
        "head -c 50000000 /dev/zero > /workspace/kept; head -c 30000000 /dev/zero > ~/kept",
    )
    own, workspace = _images(tmp_path, info.engine_id)
    for image in (own, workspace):
        assert held_on_host(image) <= 128 * MiB, image
    item = service.get(None, info.id)
    assert item["limits"]["disk"] == item["limits"]["workspace_disk"] == 128 * MiB
    assert 30_000_000 <= item["usage"]["disk"] < 60_000_000
    assert 50_000_000 <= item["usage"]["workspace_disk"] < 80_000_000
    service.stop(None, info.id)
    stopped = service.get(None, info.id)
    assert stopped["state"] == "stopped" and stopped["usage"]["workspace_disk"] >= 50_000_000
    totals = service.stats(None)["disk"]
    assert totals["sandboxes"] == totals["workspaces"] == 128 * MiB
    assert totals["note"] == "" and totals["unbounded"] == []
    upload = service.workspace(None, info.id).start_upload("upload.bin")
    with pytest.raises(DiskFull, match="the workspace's disk is full"):
        for _ in range(200):
            upload.write(b"y" * MiB)
    upload.abort()
    assert not [p for p in Path(info.workspace).iterdir() if p.name.startswith(".sk-upload")]
    # destroy: the sandbox's disk goes, the workspace's stays with its files.
    service.destroy(None, info.id)
    assert not own.exists() and workspace.exists()
    assert (Path(info.workspace) / "kept").stat().st_size == 50_000_000


def test_a_larger_flavor_grows_both_disks_keeping_files(
    local_service: Callable[..., SandboxService],
) -> None:
    """Grown while a process of the sandbox runs: at once where the server may grow a
    mounted disk; else when the sandbox next starts (the test's kernel-like process
    ends, the sandbox stops and starts, and its first process finds them grown)."""
    key = ScopeKey(USER)
    info = local_service("tiny").ensure(key).info
    sh(local_service(), info.id, "echo mine > /workspace/w.txt; echo mine > ~/h.txt")
    busy = local_service().backend.open_channel(info.id, ["sh", "-c", "cat > /dev/null"])
    try:
        ensured = local_service("roomy").ensure(key)
    finally:
        busy.close()
    note = " ".join(ensured.notes)
    assert f"sandbox {info.id} now has flavor roomy" in note
    service = local_service("roomy")
    if not disks.grows_online():  # the server may not resize a mounted disk: next start
        assert "grows to 256 MiB at its next start" in note and "CAP_SYS_RESOURCE" in note
        service.stop(None, info.id)
        service.start(None, info.id)
        assert sh(service, info.id, "echo started") == "started\n"
    grown = service.get(None, info.id)
    assert grown["flavor"] == "roomy" and grown["disk_note"] == ""
    assert grown["limits"]["disk"] == grown["limits"]["workspace_disk"] == 256 * MiB
    out = sh(
        service, info.id, "cat /workspace/w.txt ~/h.txt; df -k /home/sandbox /workspace | tail -2"
    )
    assert out.startswith("mine\nmine\n")
    assert all(int(line.split()[1]) > 200 * 1024 for line in out.splitlines()[2:]), out
    again = local_service("tiny").ensure(key)
    assert "its disk stays 256 MiB: disks never shrink" in " ".join(again.notes)
    assert local_service("tiny").get(None, info.id)["limits"]["disk"] == 256 * MiB


def test_disks_come_back_after_a_reboot(
    local_service: Callable[..., SandboxService], tmp_path: Path
) -> None:
    """A reboot ends every process and drops the host's mounts: a file route (which never
    starts a sandbox) mounts the workspace's disk again, the next process both, with
    their files; the workspace is shown from its disk whatever loop device holds it."""
    service = local_service()
    info = service.ensure(ScopeKey(USER)).info
    sh(service, info.id, "echo home > ~/h.txt; echo ws > /workspace/w.txt")
    service.backend.end_all()  # what a reboot does to the processes...
    for image, target in disks.mount_points():  # ...and to the mounts
        if image.startswith(str(tmp_path)):
            disks.unmount(Path(target))
    assert not is_mountpoint(Path(info.workspace))
    names = [e.name for e in service.workspace(None, info.id).list("")[0]]
    assert names == ["w.txt"] and is_mountpoint(Path(info.workspace))
    assert sh(service, info.id, "cat ~/h.txt /workspace/w.txt") == "home\nws\n"


def test_a_sandbox_whose_maker_died_before_its_disks_gets_them_at_its_start(
    local_service: Callable[..., SandboxService], monkeypatch: pytest.MonkeyPatch
) -> None:
    """A process that wrote the record and died before the disks were mounted: the
    sandbox's first process mounts them, never runs unbounded."""
    key = ScopeKey(USER)

    def dies(self: LocalDisks, record: dict[str, Any], **kw: Any) -> None:
        raise KeyboardInterrupt  # the maker is gone, between its record and its disks

    with monkeypatch.context() as patched:
        patched.setattr(LocalDisks, "prepare", dies)
        with pytest.raises(KeyboardInterrupt):
            local_service().ensure(key)
    service = local_service()
    info = service.ensure(key).info
    assert info.state == "running"
    for place in ("$HOME", "/workspace"):
        out = sh(
            service, info.id, f"dd if=/dev/zero of={place}/big bs=1M count=200 2>&1; echo rc=$?"
        )
        assert "No space left on device" in out and "rc=1" in out, (place, out)
    listed = service.get(None, info.id)["limits"]
    assert listed["disk"] == listed["workspace_disk"] == 128 * MiB


def test_a_workspace_holding_files_stays_unbounded_and_says_so(
    local_service: Callable[..., SandboxService], tmp_path: Path
) -> None:
    folder = tmp_path / "ws" / ScopeKey(USER).user_id
    folder.mkdir(parents=True)
    (folder / "notes.txt").write_text("from before disk bounds")
    info = local_service().ensure(ScopeKey(USER)).info
    assert info.limits["disk"] == 128 * MiB and "workspace_disk" not in info.limits
    assert "its workspace is not bounded: the workspace held files before disk bounds" in (
        info.disk_note
    )
    assert (folder / "notes.txt").exists() and not is_mountpoint(folder)


def test_disks_of_sandboxes_gone_behind_our_back_are_swept(
    local_service: Callable[..., SandboxService], tmp_path: Path
) -> None:
    service = local_service()
    info = service.ensure(ScopeKey(USER)).info
    assert sh(service, info.id, "echo up") == "up\n"
    own, _ = _images(tmp_path, info.engine_id)
    (tmp_path / "st" / "local" / f"{info.id}.json").unlink()  # removed by hand
    old = os.stat(own).st_mtime - disks.FRESH - 1
    os.utime(own, (old, old))  # past the grace a sweep gives to disks being made
    service.backend.sweep()
    assert not own.exists()


def test_a_kernel_cell_past_the_disk_gets_enospc_and_one_line(
    need_disks: None, flavors: dict[str, Any], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from jupyter_client.manager import start_new_kernel

    from .kernel_env import make_kernel_env
    from .test_kernel import run, text_of

    require_bwrap()
    env = make_kernel_env(
        tmp_path / "k", SANDBOX_KERNEL_BACKEND="local", SANDBOX_KERNEL_FLAVOR="tiny"
    )
    monkeypatch.setenv("JUPYTER_PATH", env.jupyter_path)
    km, kc = start_new_kernel(kernel_name="sandbox")
    try:
        for place in ("/workspace", "/home/sandbox", "/tmp"):
            reply, outputs = run(
                kc, f"open('{place}/big', 'wb').write(b'x' * (200 << 20))", timeout=120
            )
            assert reply["status"] == "error" and "[Errno 28]" in reply["evalue"]
            lines = [x for x in text_of(outputs, "stderr").splitlines() if "disk full" in x]
            assert len(lines) == 1, outputs
            assert f"sandbox sk-{env.user} has flavor tiny" in lines[0]
            assert "/workspace" in lines[0] and "its own files (home, /tmp)" in lines[0]
            assert "128 MiB" in lines[0] and "SANDBOX_KERNEL_FLAVOR=roomy: 256 MiB" in lines[0]
            run(kc, f"import os; os.remove('{place}/big')")
        reply, outputs = run(kc, "print('still fine')")
        assert reply["status"] == "ok" and "disk full" not in text_of(outputs, "stderr")
        settings = _kernel_settings(env)
        listed = subprocess.run(
            [sys.executable, "-m", "sandbox_kernel.cli", "list", "--json"],
            capture_output=True,
            text=True,
            env={**env.environ(), **settings},
            check=True,
        )
        (item,) = json.loads(listed.stdout)
        assert item["backend"] == "local" and item["limits"]["disk"] == 128 * MiB
        assert "disk" in item["usage"] and "workspace_disk" in item["usage"]
        table = subprocess.run(
            [sys.executable, "-m", "sandbox_kernel.cli", "list"],
            capture_output=True,
            text=True,
            env={**env.environ(), **settings},
            check=True,
        ).stdout
        assert "/128 MiB, ws " in table, table
    finally:
        kc.stop_channels()
        km.shutdown_kernel(now=True)
        release_disks(tmp_path)


def _kernel_settings(env: Any) -> dict[str, str]:
    spec = json.loads((Path(env.jupyter_path) / "kernels" / "sandbox" / "kernel.json").read_text())
    return {k: v for k, v in spec["env"].items() if k.startswith("SANDBOX_KERNEL_")}


@pytest.fixture
def user_host(ordinary_account: tuple[int, int]) -> Iterator[LocalHost]:
    """An ordinary user's server (an account made for the session when we are root)."""
    yield from _local_host("user", ordinary_account)


def test_an_ordinary_users_server_says_disks_are_not_bounded(user_host: LocalHost) -> None:
    """Only root can mount disk images: an ordinary user's sandboxes run unbounded, and
    the listing, the totals and doctor's report say so, and why."""
    result = user_host.run(
        """
from sandbox_kernel.backends.local import limits_report
svc = service()
info = svc.ensure(ScopeKey("unbounded")).info
RESULT["limits"], RESULT["note"], RESULT["isolation"] = info.limits, info.disk_note, info.isolation
RESULT["stats"] = svc.stats(None)["disk"]
RESULT["report"] = [l for l in limits_report(svc.installation) if l.startswith("disk:")]
code, out = run(svc, info.id, "print(open('/proc/self/mountinfo').read())")
RESULT["loops"] = [l for l in out.splitlines() if "/dev/loop" in l]
"""
    )
    assert "disk" not in result["limits"] and "workspace_disk" not in result["limits"]
    assert result["note"].startswith("not bounded: the server does not run as root")
    assert "disk not limited" in result["isolation"]
    assert result["stats"]["note"].startswith("the server does not run as root")
    assert "neither workspaces nor sandboxes' own files are bounded" in result["stats"]["note"]
    assert result["report"] == [
        "disk: not bounded (the server does not run as root, and only root can mount the "
        "disk images that bound it; the host file system's own quota is the only bound)"
    ]
    assert result["loops"] == []
