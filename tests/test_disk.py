"""Disk bounded like memory: the disk images that bound a workspace and a sandbox's own
files, on the host (root, loop devices) and through the real engine and kernel.

The host's gain is measured as what the images hold on its disk (their allocated
blocks): the machine's free space moves with every other process writing to it, the
images' blocks only with what the sandbox wrote into them.
"""

from __future__ import annotations

import errno
import io
import json
import os
import shutil
import stat
import subprocess
import sys
import tempfile
import traceback
from collections.abc import Callable, Iterator
from contextlib import redirect_stderr, redirect_stdout
from pathlib import Path
from typing import Any

import pytest

from sandbox_kernel.backends import disks
from sandbox_kernel.backends.docker.disk import DockerDisks
from sandbox_kernel.backends.idmap import is_mountpoint
from sandbox_kernel.config import SandboxConfig
from sandbox_kernel.errors import DiskFull
from sandbox_kernel.identity import ScopeKey
from sandbox_kernel.service import SandboxService

from .conftest import (
    TEST_IMAGE,
    release_disks,
    remove_user_containers,
    remove_user_snapshots,
    sandbox_container,
)

MiB = 1 << 20
TINY = {"cpus": 1, "memory": "512M", "disk": "128M"}
ROOMY = {"cpus": 1, "memory": "512M", "disk": "256M"}


@pytest.fixture
def need_disks() -> None:
    """Disk images need root, loop devices and e2fsprogs: the CI machine has them."""
    support = disks.support()
    if support.ok:
        return
    if os.environ.get("SANDBOX_KERNEL_REQUIRE_DOCKER") == "1":
        pytest.fail(f"disk images are required here but cannot be made: {support.reason}")
    pytest.skip(support.reason)


def held_on_host(image: Path) -> int:
    """Bytes of the host's disk an image file takes (its allocated blocks)."""
    return os.stat(image).st_blocks * 512


def fill(folder: Path, name: str = "big") -> tuple[int, int]:
    """Write into ``folder`` until the disk refuses: (bytes written, the errno)."""
    written = 0
    chunk = b"x" * MiB
    with open(folder / name, "wb") as fh:
        try:
            while True:
                written += os.write(fh.fileno(), chunk)
        except OSError as exc:
            return written, exc.errno or 0


# -- the host side: images, without an engine -----------------------------------------
def test_an_image_bounds_its_folder_and_the_host_gains_at_most_its_size(
    need_disks: None, tmp_path: Path
) -> None:
    images = disks.DiskImages(str(tmp_path / "state"))
    folder = tmp_path / "ws" / "alice"
    assert images.mount(disks.WORKSPACE, "alice", 128 * MiB, folder)
    image = images.image(disks.WORKSPACE, "alice")
    assert stat.S_IMODE(os.stat(image.parent).st_mode) == 0o700
    assert held_on_host(image) < 16 * MiB  # sparse: the empty file system takes little
    written, code = fill(folder)
    assert code == errno.ENOSPC
    assert 100 * MiB < written < 128 * MiB
    assert held_on_host(image) <= 128 * MiB
    use = disks.usage(folder)
    assert use is not None and use.total <= 128 * MiB and use.used >= written
    assert disks.usage(tmp_path) is None  # a plain folder of the host: nothing bounds it
    # Mounting again (another sandbox of the user, a restart) keeps the one disk.
    assert images.mount(disks.WORKSPACE, "alice", 128 * MiB, folder)
    assert [image for image, _ in disks.mount_points()].count(str(image)) == 1


def test_an_image_grows_with_its_files_and_never_shrinks(need_disks: None, tmp_path: Path) -> None:
    images = disks.DiskImages(str(tmp_path / "state"))
    folder = tmp_path / "ws" / "bob"
    images.mount(disks.WORKSPACE, "bob", 128 * MiB, folder)
    (folder / "kept.txt").write_text("still here")
    grown = images.grow(disks.WORKSPACE, "bob", 256 * MiB)
    # Online where this process may resize a mounted file system; else it waits until
    # nothing else has the disk, and settle does it then.
    assert grown == disks.grows_online()
    assert images.pending(disks.WORKSPACE, "bob") is not grown
    if not grown:
        assert images.settle(disks.WORKSPACE, "bob", folder)
    assert not images.pending(disks.WORKSPACE, "bob")
    use = disks.usage(folder)
    assert use is not None and 200 * MiB < use.total <= 256 * MiB
    assert (folder / "kept.txt").read_text() == "still here"
    images.grow(disks.WORKSPACE, "bob", 64 * MiB)
    assert images.size(disks.WORKSPACE, "bob") == 256 * MiB
    # Unmounted (a reboot), the next mount finds it as it was.
    disks.unmount(folder)
    assert not (folder / "kept.txt").exists()
    images.mount(disks.WORKSPACE, "bob", 0, folder)
    assert (folder / "kept.txt").read_text() == "still here"


def test_a_grown_image_still_mounted_elsewhere_is_never_checked_or_resized(
    need_disks: None, tmp_path: Path
) -> None:
    """While another mount (a container's view) holds the disk, growing offline would
    write to a mounted file system: settle leaves it and mounts the same device back."""
    images = disks.DiskImages(str(tmp_path / "state"))
    folder, other = tmp_path / "ws" / "carol", tmp_path / "view"
    images.mount(disks.WORKSPACE, "carol", 128 * MiB, folder)
    other.mkdir()
    subprocess.run(["mount", "--bind", str(folder), str(other)], check=True)
    try:
        images.grow(disks.WORKSPACE, "carol", 256 * MiB)
        if disks.grows_online():
            pytest.skip("this host grows mounted disks online: nothing waits")
        assert not images.settle(disks.WORKSPACE, "carol", folder)
        assert is_mountpoint(folder) and images.mounted_at(disks.WORKSPACE, "carol", folder)
        (folder / "seen.txt").write_text("one file system")
        assert (other / "seen.txt").read_text() == "one file system"
        assert len(disks._loop_devices_of(images.image(disks.WORKSPACE, "carol"))) == 1
    finally:
        disks.unmount(other)
    assert images.settle(disks.WORKSPACE, "carol", folder)


def test_a_folder_holding_files_is_not_hidden_by_a_disk(need_disks: None, tmp_path: Path) -> None:
    images = disks.DiskImages(str(tmp_path / "state"))
    folder = tmp_path / "ws" / "dave"
    folder.mkdir(parents=True)
    (folder / "notes.txt").write_text("from before disk bounds")
    assert not images.mount(disks.WORKSPACE, "dave", 128 * MiB, folder, only_if_empty=True)
    assert not images.image(disks.WORKSPACE, "dave").exists()
    assert (folder / "notes.txt").exists() and not is_mountpoint(folder)


@pytest.mark.parametrize("planted", ["link", "fifo"])
def test_planted_links_and_fifos_are_never_followed(
    need_disks: None, tmp_path: Path, planted: str
) -> None:
    """Where a disk is mounted, or its image kept, a link or a FIFO in its place is
    refused: nothing is mounted over the link's target, nothing written through it, and
    no open blocks on the FIFO."""
    images = disks.DiskImages(str(tmp_path / "state"))
    victim = tmp_path / "victim"
    victim.mkdir()
    (victim / "precious.txt").write_text("host file")
    folder = tmp_path / "ws" / "eve"
    folder.parent.mkdir(parents=True)
    if planted == "link":
        folder.symlink_to(victim)
    else:
        os.mkfifo(folder)
    with pytest.raises(disks.DiskError, match="is not a folder"):
        images.mount(disks.WORKSPACE, "eve", 128 * MiB, folder)
    assert not is_mountpoint(victim) and (victim / "precious.txt").read_text() == "host file"
    assert not images.image(disks.WORKSPACE, "eve").exists()
    # The image's own place: a link to a host file, or a FIFO, where the image would be.
    image = images.image(disks.WORKSPACE, "frank")
    image.parent.mkdir(parents=True, exist_ok=True)
    if planted == "link":
        image.symlink_to(victim / "precious.txt")
    else:
        os.mkfifo(image)
    with pytest.raises(OSError):
        images.mount(disks.WORKSPACE, "frank", 128 * MiB, tmp_path / "ws" / "frank")
    assert (victim / "precious.txt").read_text() == "host file"
    assert not is_mountpoint(tmp_path / "ws" / "frank")
    assert disks.fs_size(image) == 0 and images.size(disks.WORKSPACE, "frank") == 0


def test_a_server_that_is_not_root_says_disks_are_not_bounded(tmp_path: Path) -> None:
    """The real detection, in a process of a user that is not root (nobody)."""
    read, write = os.pipe()
    pid = os.fork()
    if pid == 0:  # pragma: no cover - the child reports through the pipe
        try:
            os.close(read)
            os.setgid(65534)
            os.setuid(65534)
            disks.support.cache_clear()
            settings = _settings(tmp_path)
            found = DockerDisks(settings, lambda: None, lambda: True, print)  # type: ignore[arg-type,return-value]
            reason = found.unbounded_reason()
            os.write(write, json.dumps([disks.support().ok, reason]).encode())
        finally:
            os._exit(0)
    os.close(write)
    with os.fdopen(read) as fh:
        ok, reason = json.loads(fh.read())
    os.waitpid(pid, 0)
    assert ok is False
    assert "does not run as root" in reason and "host file system's own quota" in reason


def _settings(tmp_path: Path) -> Any:
    from sandbox_kernel.backends.base import EngineSettings

    return EngineSettings("test", str(tmp_path / "ws"), str(tmp_path / "state"))


# -- through the engine ----------------------------------------------------------------
@pytest.fixture
def flavors(tmp_path: Path) -> dict[str, dict[str, Any]]:
    """An administrator's flavors table in the test's Jupyter config folder (every
    process of the test, kernels included, reads it)."""
    table = {"tiny": TINY, "roomy": ROOMY}
    conf = Path(os.environ["JUPYTER_CONFIG_DIR"])
    conf.mkdir(parents=True, exist_ok=True)
    (conf / "sandbox_kernel_config.py").write_text(f"c.SandboxConfig.flavors = {table!r}\n")
    return table


@pytest.fixture
def tiny_service(
    need_disks: None,
    flavors: dict[str, Any],
    make_config: Callable[..., SandboxConfig],
    test_user: str,
) -> Iterator[Callable[..., SandboxService]]:
    def make(flavor: str = "tiny", **overrides: Any) -> SandboxService:
        return SandboxService(make_config(flavor=flavor, **overrides))

    yield make
    remove_user_containers(test_user)


def sh(service: SandboxService, sandbox_id: str, script: str) -> str:
    result = service.backend.exec(sandbox_id, ["sh", "-c", script], timeout=120)
    return result.output.decode("utf-8", "replace")


@pytest.mark.docker
def test_a_sandbox_is_bounded_in_its_workspace_and_its_own_files(
    tiny_service: Callable[..., SandboxService], test_user: str, tmp_path: Path
) -> None:
    service = tiny_service()
    info = service.ensure(ScopeKey(test_user)).info
    assert info.limits["disk"] == info.limits["workspace_disk"] == 128 * MiB
    assert info.disk_note == ""
    for place in ("/workspace", "/home/sandbox", "/tmp"):
        out = sh(
            service, info.id, f"dd if=/dev/zero of={place}/big bs=1M count=200 2>&1; echo rc=$?"
        )
        assert "No space left on device" in out and "rc=1" in out, (place, out)
        sh(service, info.id, f"rm -f {place}/big")
    sh(
        service,
        info.id,
        "head -c 50000000 /dev/zero > /workspace/kept; head -c 30000000 /dev/zero > ~/kept",
    )
    # The host holds no more than the two disks' sizes for them, whatever was written.
    state = tmp_path / "state" / "disks"
    layer = state / "sandbox" / f"{info.engine_id}.img"
    workspace = state / "workspace" / f"{ScopeKey(test_user).user_id}.img"
    for image in (layer, workspace):
        assert held_on_host(image) <= 128 * MiB, image
    # Listings show the use against the sizes.
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
    # A file route writing past the workspace's disk: one line, nothing left behind.
    upload = service.workspace(None, info.id).start_upload("upload.bin")
    with pytest.raises(DiskFull, match="the workspace's disk is full"):
        for _ in range(200):
            upload.write(b"y" * MiB)
    upload.abort()
    assert not [p for p in Path(info.workspace).iterdir() if p.name.startswith(".sk-upload")]
    # destroy: the sandbox's disk goes, the workspace's stays with its files.
    service.destroy(None, info.id)
    assert not layer.exists() and workspace.exists()
    assert (Path(info.workspace) / "kept").stat().st_size == 50_000_000


@pytest.mark.docker
def test_a_larger_flavor_grows_both_disks_keeping_files(
    tiny_service: Callable[..., SandboxService], test_user: str
) -> None:
    key = ScopeKey(test_user)
    info = tiny_service("tiny").ensure(key).info
    sh(tiny_service(), info.id, "echo mine > /workspace/w.txt; echo mine > ~/h.txt")
    ensured = tiny_service("roomy").ensure(key)
    note = " ".join(ensured.notes)
    assert f"sandbox {info.id} now has flavor roomy" in note
    service = tiny_service("roomy")
    if not disks.grows_online():  # the server may not resize a mounted disk: next start
        assert "grows to 256 MiB at its next start" in note and "CAP_SYS_RESOURCE" in note
        service.stop(None, info.id)
        service.start(None, info.id)
    grown = service.get(None, info.id)
    assert grown["flavor"] == "roomy"
    assert grown["limits"]["disk"] == grown["limits"]["workspace_disk"] == 256 * MiB
    assert grown["disk_note"] == ""
    out = sh(service, info.id, "cat /workspace/w.txt ~/h.txt; df -k / /workspace | tail -2")
    assert out.startswith("mine\nmine\n")
    assert all(int(line.split()[1]) > 200 * 1024 for line in out.splitlines()[2:]), out
    # A smaller flavor again: the disks keep their size (they never shrink).
    again = tiny_service("tiny").ensure(key)
    assert "its disk stays 256 MiB: disks never shrink" in " ".join(again.notes)
    assert tiny_service("tiny").get(None, info.id)["limits"]["disk"] == 256 * MiB


@pytest.mark.docker
def test_disks_come_back_after_a_reboot_and_snapshots_keep_the_files(
    tiny_service: Callable[..., SandboxService], test_user: str, tmp_path: Path
) -> None:
    """A reboot drops the host's mounts: the next start (or a file route, which never
    starts a sandbox) mounts the disks again, with the files; a snapshot of a sandbox
    whose files are on its disk has them."""
    service = tiny_service()
    info = service.ensure(ScopeKey(test_user)).info
    sh(service, info.id, "echo home > ~/h.txt; echo ws > /workspace/w.txt")
    service.stop(None, info.id)
    for _image, target in disks.mount_points():  # what a reboot does to them
        if info.engine_id in _image or str(tmp_path) in _image:
            disks.unmount(Path(target))
    assert not is_mountpoint(Path(info.workspace))
    names = [e.name for e in service.workspace(None, info.id).list("")[0]]
    assert names == ["w.txt"] and sandbox_container(info.id).status == "exited"
    service.start(None, info.id)
    assert sh(service, info.id, "cat ~/h.txt /workspace/w.txt") == "home\nws\n"
    service.create_snapshot(None, info.id, "with-home")
    try:
        other = tiny_service(snapshot="with-home", scope="thread", thread="from-snap")
        made = other.ensure(ScopeKey(test_user, "thread", "from-snap")).info
        assert made.engine_id != info.engine_id and made.limits["disk"] == 128 * MiB
        assert sh(other, made.id, "cat ~/h.txt /workspace/w.txt") == "home\nws\n"
    finally:
        remove_user_containers(test_user)
        remove_user_snapshots(test_user)


@pytest.mark.docker
def test_a_sandbox_whose_maker_died_before_its_disk_gets_it_at_its_start(
    tiny_service: Callable[..., SandboxService],
    test_user: str,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A process that made the container and died before its disk was mounted: the
    next start gives the never-started container its disk, never runs it unbounded."""
    key = ScopeKey(test_user)

    def dies(self: DockerDisks, container: Any, size: int) -> None:
        raise KeyboardInterrupt  # the maker is gone, between create and disk

    with monkeypatch.context() as patched:
        patched.setattr(DockerDisks, "bound_layer", dies)
        with pytest.raises(KeyboardInterrupt):
            tiny_service().ensure(key)
    assert sandbox_container(f"sk-{test_user}").status == "created"
    service = tiny_service()
    info = service.ensure(key).info
    assert info.state == "running" and info.limits["disk"] == 128 * MiB
    out = sh(service, info.id, "dd if=/dev/zero of=$HOME/big bs=1M count=200 2>&1; echo rc=$?")
    assert "No space left on device" in out and "rc=1" in out


@pytest.mark.docker
def test_a_container_removed_behind_our_back_leaves_no_disk(
    tiny_service: Callable[..., SandboxService], test_user: str, tmp_path: Path
) -> None:
    service = tiny_service()
    info = service.ensure(ScopeKey(test_user)).info
    image = tmp_path / "state" / "disks" / "sandbox" / f"{info.engine_id}.img"
    assert image.exists()
    sandbox_container(info.id).remove(force=True)  # docker rm: it unmounts the layer's disk
    old = os.stat(image).st_mtime - disks.FRESH - 1
    os.utime(image, (old, old))  # past the grace a sweep gives to disks being made
    service.backend.sweep()
    assert not image.exists()


@pytest.mark.docker
def test_a_kernel_cell_past_the_disk_gets_enospc_and_one_line(
    need_disks: None, flavors: dict[str, Any], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from jupyter_client.manager import start_new_kernel

    from .kernel_env import make_kernel_env
    from .test_kernel import run, text_of

    env = make_kernel_env(tmp_path / "k", SANDBOX_KERNEL_FLAVOR="tiny")
    monkeypatch.setenv("JUPYTER_PATH", env.jupyter_path)
    km, kc = start_new_kernel(kernel_name="sandbox")
    try:
        for place in ("/workspace", "/home/sandbox"):
            reply, outputs = run(
                kc, f"open('{place}/big', 'wb').write(b'x' * (200 << 20))", timeout=120
            )
            assert reply["status"] == "error" and "[Errno 28]" in reply["evalue"]
            lines = [
                line for line in text_of(outputs, "stderr").splitlines() if "disk full" in line
            ]
            assert len(lines) == 1, outputs
            line = lines[0]
            assert f"sandbox sk-{env.user} has flavor tiny" in line
            assert "/workspace" in line and "its own files (home, /tmp)" in line
            assert "128 MiB" in line and "SANDBOX_KERNEL_FLAVOR=roomy: 256 MiB" in line
            run(kc, f"import os; os.remove('{place}/big')")
        reply, outputs = run(kc, "print('still fine')")
        assert reply["status"] == "ok" and "disk full" not in text_of(outputs, "stderr")
        listed = subprocess.run(
            [sys.executable, "-m", "sandbox_kernel.cli", "list", "--json"],
            capture_output=True,
            text=True,
            env={**env.environ(), **_kernel_settings(env)},
            check=True,
        )
        (item,) = json.loads(listed.stdout)
        assert item["flavor"] == "tiny" and item["limits"]["disk"] == 128 * MiB
        assert "disk" in item["usage"] and "workspace_disk" in item["usage"]
        table = subprocess.run(
            [sys.executable, "-m", "sandbox_kernel.cli", "list"],
            capture_output=True,
            text=True,
            env={**env.environ(), **_kernel_settings(env)},
            check=True,
        ).stdout
        assert "/128 MiB, ws " in table, table
    finally:
        kc.stop_channels()
        km.shutdown_kernel(now=True)
        remove_user_containers(env.user)
        release_disks(tmp_path)


def _kernel_settings(env: Any) -> dict[str, str]:
    spec = json.loads((Path(env.jupyter_path) / "kernels" / "sandbox" / "kernel.json").read_text())
    return {k: v for k, v in spec["env"].items() if k.startswith("SANDBOX_KERNEL_")}


@pytest.mark.docker
def test_the_cli_of_a_server_that_is_not_root_says_disk_is_not_bounded(
    tmp_path: Path, test_user: str
) -> None:
    """`sandbox-kernel stats` and `list` run by a user who is not root (nobody, in the
    engine's group): its sandbox runs, unbounded, and both say so and why."""
    import grp
    import sqlite3  # noqa: F401  (the child, nobody, cannot read Python's own library here)

    import docker  # noqa: F401

    from sandbox_kernel import cli

    try:
        docker_gid = grp.getgrnam("docker").gr_gid
    except KeyError:
        pytest.skip("no docker group whose members may use the engine")
    # Beside pytest's folders, which only root may enter.
    folder = Path(tempfile.mkdtemp(prefix="sk-nobody-"))
    os.chmod(folder, 0o755)
    os.chown(folder, 65534, 65534)
    env = {
        "SANDBOX_KERNEL_BACKEND": "docker",
        "SANDBOX_KERNEL_IMAGE": TEST_IMAGE,
        "SANDBOX_KERNEL_WORKSPACE_ROOT": str(folder / "ws"),
        "SANDBOX_KERNEL_STATE_DIR": str(folder / "state"),
        "SANDBOX_KERNEL_USER": test_user,
        "SANDBOX_KERNEL_WORK_ROOT": "none",
        # Its own home and Jupyter folders: root's are closed to it.
        "HOME": str(folder),
        "JUPYTER_CONFIG_DIR": str(folder / "jupyter"),
        "JUPYTER_DATA_DIR": str(folder / "jupyter"),
    }
    read, write = os.pipe()
    pid = os.fork()
    if pid == 0:  # pragma: no cover - the child reports through the pipe
        code = 1
        try:
            os.close(read)
            os.setgroups([docker_gid])
            os.setgid(65534)
            os.setuid(65534)
            os.environ.update(env)
            disks.support.cache_clear()
            raw = io.BytesIO()
            out = io.TextIOWrapper(raw, write_through=True)  # exec writes bytes to .buffer
            with redirect_stdout(out), redirect_stderr(out):
                cli.main(["exec", "--", "true"])
                cli.main(["stats"])
                cli.main(["list"])
            os.write(write, raw.getvalue())
            code = 0
        except BaseException:
            os.write(write, f"the child failed: {traceback.format_exc()}".encode())
        finally:
            os._exit(code)
    os.close(write)
    with os.fdopen(read) as fh:
        said = fh.read()
    os.waitpid(pid, 0)
    try:
        assert "disk not bounded for new sandboxes: the server does not run as root" in said, said
        assert f"sk-{test_user}: disk: not bounded: the server does not run as root" in said
        assert "neither workspaces nor sandboxes' own files are bounded" in said
    finally:
        remove_user_containers(test_user)
        shutil.rmtree(folder, ignore_errors=True)


# -- the choice of bound, from what the engine says (no engine needed) ------------------
OVERLAY_EXT4 = {"Driver": "overlay2", "DriverStatus": [["Backing Filesystem", "extfs"]]}
OVERLAY_XFS = {"Driver": "overlay2", "DriverStatus": [["Backing Filesystem", "xfs"]]}
BTRFS = {"Driver": "btrfs", "DriverStatus": []}
VFS = {"Driver": "vfs", "DriverStatus": []}


class RefusingEngine:
    """An engine whose storage driver refuses --storage-opt as Docker does for overlay2
    on xfs without project quotas (such an engine cannot be had on this machine: its
    Docker keeps its layers on ext4); every create is recorded."""

    def __init__(self) -> None:
        self.creates: list[dict[str, Any]] = []

    def create_container(self, name: str, config: dict[str, Any]) -> str:
        from sandbox_kernel.backends.docker.wire import EngineRefused

        self.creates.append(json.loads(json.dumps(config)))
        if "StorageOpt" in config["HostConfig"]:
            raise EngineRefused(
                500,
                "--storage-opt is supported only for overlay over xfs with 'pquota' mount option",
            )
        return "c0ffee"


@pytest.mark.fast
@pytest.mark.parametrize(
    ("root", "local", "driver", "way"),
    [
        (True, True, OVERLAY_EXT4, "image"),  # this machine: a disk over the layer
        (True, True, OVERLAY_XFS, "image"),  # grows online, where --storage-opt cannot
        (False, True, OVERLAY_XFS, "storage-opt"),  # no root: the engine's own bound
        (False, True, BTRFS, "storage-opt"),
        (True, False, BTRFS, "storage-opt"),  # an engine on another host
        (False, True, OVERLAY_EXT4, ""),  # nothing can bound it: listings say why
        (True, True, VFS, ""),
    ],
)
def test_the_bound_of_a_sandboxs_own_files_fits_its_engine(
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    root: bool,
    local: bool,
    driver: dict[str, Any],
    way: str,
) -> None:
    reason = "" if root else "the server does not run as root"
    monkeypatch.setattr(disks, "support", lambda: disks.Support(root, reason))
    found = DockerDisks(_settings(tmp_path), RefusingEngine, lambda: local, print)  # type: ignore[arg-type]
    assert found.layer_way(driver) == way
    assert (found.layer_reason(driver) == "") == bool(way)


@pytest.mark.fast
def test_an_engine_refusing_storage_opt_makes_the_sandbox_without_it(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(disks, "support", lambda: disks.Support(False, "not root"))
    engine = RefusingEngine()
    found = DockerDisks(_settings(tmp_path), lambda: engine, lambda: True, print)  # type: ignore[arg-type,return-value]
    config = {
        "HostConfig": {"StorageOpt": {"size": "1073741824"}},
        "Labels": {"sandbox-kernel.disk": "storage-opt:1073741824"},
    }
    assert found.create_container("sk-a--i1", "sk-a", config) == "c0ffee"
    assert [("StorageOpt" in c["HostConfig"]) for c in engine.creates] == [True, False]
    assert config["Labels"]["sandbox-kernel.disk"] == ""
    assert found.layer_way(OVERLAY_XFS) == ""  # the next ones go without at once
    assert "refused --storage-opt size" in found.layer_reason(OVERLAY_XFS)
