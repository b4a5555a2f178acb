"""The Docker backend against a real engine and the locally built test image."""

from __future__ import annotations

import multiprocessing
import os
import shutil
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import docker
import pytest

from sandbox_kernel.backends import EngineUnavailable, SandboxError, SandboxNotFound
from sandbox_kernel.backends.base import LABEL_MANAGED, engine_name
from sandbox_kernel.backends.docker import DockerBackend
from sandbox_kernel.config import SandboxConfig
from sandbox_kernel.identity import ScopeKey
from sandbox_kernel.service import SandboxService, workspace_dir

from .helpers import make_wheel

pytestmark = [pytest.mark.docker, pytest.mark.usefixtures("docker_cleanup")]


@pytest.fixture
def service(make_config: Callable[..., SandboxConfig]) -> SandboxService:
    """The orchestrator, as kernel, CLI and server use it, over the Docker backend."""
    return SandboxService(make_config())


@pytest.fixture
def backend(service: SandboxService) -> DockerBackend:
    return service.backend  # type: ignore[return-value]


def engine() -> docker.DockerClient:
    return docker.from_env()


def run(backend: DockerBackend, sandbox_id: str, code: str) -> str:
    result = backend.exec(sandbox_id, ["python3", "-c", code])
    assert result.exit_code == 0, result.output
    return result.output.decode().strip()


def test_reuse_and_state_across_calls(
    backend: DockerBackend, service: SandboxService, test_user: str
) -> None:
    key = ScopeKey(test_user)
    first = service.ensure(key)
    assert first.event == "created"
    second = service.ensure(key)
    assert second.event == "existing"
    assert second.info.engine_id == first.info.engine_id
    run(backend, first.info.id, "open('/workspace/note.txt', 'w').write('kept')")
    assert run(backend, second.info.id, "print(open('/workspace/note.txt').read())") == "kept"
    run(backend, first.info.id, "open('/home/sandbox/tier2.txt', 'w').write('fs')")
    assert run(backend, first.info.id, "print(open('/home/sandbox/tier2.txt').read())") == "fs"


@pytest.mark.parametrize("way", ["layer", "archive"])
def test_home_folder_is_the_sandbox_users_either_way(
    backend: DockerBackend,
    service: SandboxService,
    test_user: str,
    way: str,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """HOME is made in the new container's own layer on this (root, overlay2) host, or by
    the engine's archive call where that is not certain to be right: the same folder.
    Either way the sandbox's uid gets an account (a terminal's prompt names it, `whoami`
    answers) and a login shell finds what `pip install --user` puts in ~/.local/bin."""
    from sandbox_kernel.backends.docker import home as home_module
    from sandbox_kernel.backends.docker.home import home_in_layer

    if way == "layer" and (os.geteuid() != 0 or engine().info().get("Driver") != "overlay2"):
        pytest.skip("the layer is written only by root, on an overlay2 engine")
    taken: list[bool] = []

    def spy(driver: dict, uid: int, gid: int, extra: Any = ()) -> bool:
        taken.append(way == "layer" and home_in_layer(driver, uid, gid, extra))
        return taken[-1]

    monkeypatch.setattr(home_module, "home_in_layer", spy)
    info = service.ensure(ScopeKey(test_user)).info
    assert taken == [way == "layer"]
    shown = run(
        backend,
        info.id,
        "import os; h = os.stat('/home'); s = os.stat('/home/sandbox'); "
        "print(h.st_uid, h.st_gid, oct(h.st_mode & 0o7777), s.st_uid == os.getuid(), "
        "s.st_gid == os.getgid(), oct(s.st_mode & 0o7777), os.environ['HOME'])",
    )
    assert shown == "0 0 0o755 True True 0o755 /home/sandbox"
    accounts = run(
        backend,
        info.id,
        "import grp, os, pwd; p = pwd.getpwuid(os.getuid()); "
        "s = os.stat('/etc/profile.d/sandbox-kernel.sh'); "
        "print(p.pw_name, p.pw_dir, grp.getgrgid(os.getgid()).gr_name, "
        "pwd.getpwuid(0).pw_name, s.st_uid, oct(s.st_mode & 0o777))",
    )
    assert accounts == "sandbox /home/sandbox sandbox root 0 0o644"  # the image's root kept
    login = backend.exec(info.id, ["bash", "-lc", 'whoami; echo "$PATH"'])
    name, path = login.output.decode().split()
    assert (name, path.split(":")[0]) == ("sandbox", "/home/sandbox/.local/bin"), login.output
    run(backend, info.id, "open('/home/sandbox/kept.txt', 'w').write('home')")
    backend.stop(info.id)
    backend.start(info.id)
    assert run(backend, info.id, "print(open('/home/sandbox/kept.txt').read())") == "home"


def test_installed_package_persists_until_destroy(
    backend: DockerBackend, service: SandboxService, test_user: str, tmp_path: Path
) -> None:
    key = ScopeKey(test_user)
    info = service.ensure(key).info
    wheel = make_wheel(tmp_path / "wheels")
    backend.put_file(info.id, f"wheels/{wheel.name}", wheel.read_bytes())
    result = backend.exec(
        info.id,
        ["python3", "-m", "pip", "install", "--no-index", "-q", f"/workspace/wheels/{wheel.name}"],
    )
    assert result.exit_code == 0, result.output
    assert run(backend, info.id, "import sk_demo_pkg; print(sk_demo_pkg.VALUE)") == "1.0"
    backend.stop(info.id)
    backend.start(info.id)
    assert run(backend, info.id, "import sk_demo_pkg; print(sk_demo_pkg.VALUE)") == "1.0"
    # Destroy drops the sandbox filesystem (tier 2) but never the workspace (tier 3).
    backend.destroy(info.id)
    fresh = service.ensure(key).info
    assert backend.exec(fresh.id, ["python3", "-c", "import sk_demo_pkg"]).exit_code != 0
    assert run(backend, fresh.id, "import os; print(os.path.exists('/workspace/wheels'))") == "True"


def test_user_scope_shares_one_container_and_users_are_separate(
    make_config: Callable[..., SandboxConfig], test_user: str
) -> None:
    service = SandboxService(make_config())
    backend = service.backend
    a = service.ensure(ScopeKey(test_user)).info
    again = SandboxService(make_config()).ensure(ScopeKey(test_user)).info  # another notebook
    other = service.ensure(ScopeKey(test_user + "-b")).info
    assert a.engine_id == again.engine_id
    assert other.engine_id != a.engine_id
    assert other.workspace != a.workspace
    assert [i.id for i in backend.list(test_user)] == [a.id]
    run(backend, a.id, "open('/workspace/mine', 'w').write('a')")
    assert run(backend, other.id, "import os; print(os.listdir('/workspace'))") == "[]"


def test_thread_scope_separate_containers_shared_workspace(
    backend: DockerBackend, service: SandboxService, test_user: str
) -> None:
    one = service.ensure(ScopeKey(test_user, "thread", "/nb/one.ipynb")).info
    two = service.ensure(ScopeKey(test_user, "thread", "/nb/two.ipynb")).info
    assert one.engine_id != two.engine_id
    assert (one.scope, one.thread) == ("thread", "/nb/one.ipynb")
    run(backend, one.id, "open('/workspace/shared.txt', 'w').write('from one')")
    assert run(backend, two.id, "print(open('/workspace/shared.txt').read())") == "from one"
    assert sorted(i.id for i in backend.list(test_user)) == sorted([one.id, two.id])


def test_destroy_keeps_workspace_and_is_idempotent(
    backend: DockerBackend, service: SandboxService, test_user: str
) -> None:
    key = ScopeKey(test_user)
    info = service.ensure(key).info
    run(backend, info.id, "open('/workspace/data.csv', 'w').write('a,b\\n')")
    assert backend.destroy(info.id) is True
    assert backend.destroy(info.id) is False
    with pytest.raises(SandboxNotFound):
        backend.get(info.id)
    assert not engine().containers.list(
        ignore_removed=True, all=True, filters={"name": f"^{info.id}$"}
    )
    assert (workspace_dir(service.config, key) / "data.csv").read_text() == "a,b\n"


def test_recreated_after_removal_behind_our_back(
    backend: DockerBackend, service: SandboxService, test_user: str
) -> None:
    key = ScopeKey(test_user)
    info = service.ensure(key).info
    engine().containers.get(info.engine_id).remove(force=True)
    ensured = service.ensure(key)
    assert ensured.event == "recreated"
    assert ensured.info.engine_id != info.engine_id
    assert "variables were lost, files in /workspace were kept" in ensured.notice


def test_stopped_container_is_started_again(
    backend: DockerBackend, service: SandboxService, test_user: str
) -> None:
    key = ScopeKey(test_user)
    info = service.ensure(key).info
    engine().containers.get(info.engine_id).stop(timeout=1)
    assert backend.get(info.id).state == "stopped"
    assert backend.get(info.id).started == 0.0  # no uptime while stopped
    time.sleep(1.1)
    ensured = service.ensure(key)
    assert (ensured.event, ensured.info.state, ensured.info.engine_id) == (
        "started",
        "running",
        info.engine_id,
    )
    # Uptime counts from this start, not from the creation: exact from an inspect,
    # within the engine's rounding (a second here) from the one-call listing.
    exact = backend.get(info.id)
    assert exact.started > exact.created + 1 and abs(exact.started - time.time()) < 5
    (listed,) = [i for i in backend.list(test_user) if i.id == info.id]
    assert abs(listed.started - exact.started) < 3


def _ensure_in_process(args: tuple[dict, str]) -> str:
    values, user = args
    from sandbox_kernel.config import load_config

    return SandboxService(load_config(environ={}, **values)).ensure(ScopeKey(user)).info.engine_id


def test_ten_processes_get_one_container(
    make_config: Callable[..., SandboxConfig], test_user: str
) -> None:
    cfg = make_config()
    values = {
        "backend": "docker",
        "image": cfg.image,
        "workspace_root": cfg.workspace_root,
        "state_dir": cfg.state_dir,
    }
    with multiprocessing.get_context("spawn").Pool(10) as pool:
        ids = pool.map(_ensure_in_process, [(values, test_user)] * 10)
    assert len(set(ids)) == 1
    found = engine().containers.list(
        ignore_removed=True, all=True, filters={"label": f"sandbox-kernel.user-id={test_user}"}
    )
    assert [c.id for c in found] == [ids[0]]
    assert found[0].status == "running"


@pytest.mark.parametrize("transport", ["wire", "sdk"])
def test_hardening_is_applied(
    make_config: Callable[..., SandboxConfig], test_user: str, transport: str
) -> None:
    service = SandboxService(make_config(flavor="medium", pids_limit=100, network=False))
    backend = service.backend
    if transport == "sdk":  # an engine reached over TCP: the SDK carries the create
        backend._wire = None  # type: ignore[attr-defined]
    info = service.ensure(ScopeKey(test_user)).info
    attrs = engine().containers.get(info.engine_id).attrs
    host = attrs["HostConfig"]
    assert attrs["Config"]["User"] == "1000:1000"
    assert host["CapDrop"] == ["ALL"]
    assert "no-new-privileges" in host["SecurityOpt"]
    assert host["PidsLimit"] == 100
    assert host["Memory"] == 2 << 30
    assert host["NanoCpus"] == 2_000_000_000
    assert host["NetworkMode"] == "none"
    assert not host.get("PortBindings")
    assert host["Privileged"] is False
    # ... and seen from inside: not root, no capabilities, no network interface but lo.
    inside = run(
        backend,
        info.id,
        "import os; caps=[l for l in open('/proc/self/status') if l.startswith('CapEff')][0].split()[1];"
        "print(os.getuid(), caps, sorted(os.listdir('/sys/class/net')))",
    )
    assert inside == "1000 0000000000000000 ['lo']"
    limits = {"cpus": 2.0, "memory": 2 << 30, "pids": 100, "network": False}
    if transport == "wire":  # a disk of the flavor's size bounds its files, and its workspace's
        limits.update(disk=20 << 30, workspace_disk=20 << 30)
    assert info.limits == limits


def test_fork_bomb_is_stopped_by_pids_limit(
    make_config: Callable[..., SandboxConfig], test_user: str
) -> None:
    service = SandboxService(make_config(pids_limit=64))
    backend = service.backend
    info = service.ensure(ScopeKey(test_user)).info
    code = (
        "import subprocess\nprocs=[]\n"
        "try:\n    for _ in range(300): procs.append(subprocess.Popen(['sleep','30']))\n"
        "except OSError as e: print('refused', e.errno)\n"
        "for p in procs: p.kill()\n"
    )
    assert run(backend, info.id, code).startswith("refused")


def test_shared_folder_is_read_only(
    make_config: Callable[..., SandboxConfig], test_user: str, tmp_path: Path
) -> None:
    shared = tmp_path / "shared"
    shared.mkdir()
    (shared / "ref.txt").write_text("reference")
    service = SandboxService(make_config(shared_folder=str(shared)))
    backend = service.backend
    info = service.ensure(ScopeKey(test_user)).info
    assert run(backend, info.id, "print(open('/shared/ref.txt').read())") == "reference"
    result = backend.exec(info.id, ["python3", "-c", "open('/shared/x', 'w')"])
    assert result.exit_code != 0 and b"Read-only file system" in result.output


def test_unsafe_names(backend: DockerBackend, service: SandboxService) -> None:
    user = "test-Ünsafe user/../" + "x" * 80
    try:
        info = service.ensure(ScopeKey(user, "thread", "/very/" + "long/" * 100 + "nb.ipynb")).info
        assert info.user == user
        assert [i.id for i in backend.list(user)] == [info.id]
        assert Path(info.workspace).parent == Path(service.config.workspace_root)
    finally:
        for i in backend.list(user):
            backend.destroy(i.id)


def test_files_round_trip_streamed(
    backend: DockerBackend, service: SandboxService, test_user: str, tmp_path: Path
) -> None:
    info = service.ensure(ScopeKey(test_user)).info
    payload = bytes(range(256)) * 40000 + b"tail"  # ~10 MB, not a multiple of 512
    src = tmp_path / "blob.bin"
    src.write_bytes(payload)
    with src.open("rb") as fh:
        backend.put_file(info.id, "deep/er/blob.bin", fh)
    assert b"".join(backend.get_file(info.id, "deep/er/blob.bin")) == payload
    assert (Path(info.workspace) / "deep/er/blob.bin").stat().st_size == len(payload)


@pytest.fixture(params=["wire", "sdk"])
def via(request: pytest.FixtureRequest, backend: DockerBackend) -> str:
    """Processes started over the engine's socket directly (a local engine), or through
    the SDK (an engine reached over TCP or SSH): both paths, the same behaviour."""
    if request.param == "sdk":
        backend._wire = None
    return str(request.param)


def test_exec_exit_code_output_and_timeout(
    backend: DockerBackend, service: SandboxService, test_user: str, via: str
) -> None:
    info = service.ensure(ScopeKey(test_user)).info
    # Output written at once may share a packet with the attach's answer: never lost.
    for _ in range(20):
        assert backend.exec(info.id, ["echo", "first"]).output == b"first\n"
    result = backend.exec(
        info.id,
        ["python3", "-c", "import sys; print('out'); print('err', file=sys.stderr); sys.exit(7)"],
    )
    assert result.exit_code == 7
    assert b"out" in result.output and b"err" in result.output
    result = backend.exec(info.id, ["python3", "-c", "import time; time.sleep(30)"], timeout=1)
    assert result.exit_code == 124


def test_channel_round_trip_and_process_ends_on_close(
    backend: DockerBackend, service: SandboxService, test_user: str, via: str
) -> None:
    info = service.ensure(ScopeKey(test_user)).info
    channel = backend.open_channel(
        info.id,
        [
            "python3",
            "-u",
            "-c",
            "import sys\nfor line in sys.stdin: print(line.strip()[::-1], flush=True)",
        ],
    )
    channel.write(b"abc\n")
    got = b""
    while not got.endswith(b"\n"):  # unbuffered print writes text and newline apart
        chunk = channel.read()
        assert chunk, f"channel ended early after {got!r}"
        got += chunk
    assert got == b"cba\n"
    channel.close()
    # The marker is assembled at run time so the probe does not match itself.
    probe = "import os,time\ntime.sleep(0.5)\nm=b'sys.'+b'stdin'\nprint(sum(1 for p in os.listdir('/proc') if p.isdigit() and m in open('/proc/'+p+'/cmdline','rb').read()))"
    assert run(backend, info.id, probe) == "0"


def test_foreign_container_with_our_name_is_refused(
    backend: DockerBackend, service: SandboxService, test_user: str
) -> None:
    key = ScopeKey(test_user)
    name = engine_name(service.installation, key.name)
    foreign = engine().containers.create(service.config.image, ["python3", "-c", "pass"], name=name)
    try:
        with pytest.raises(Exception, match="not made by this sandbox-kernel installation"):
            service.ensure(key)
        assert backend.destroy(key.name) is False  # never ours to remove
        engine().containers.get(foreign.id)
    finally:
        foreign.remove(force=True)


def test_unreachable_engine_says_what_to_do(
    make_config: Callable[..., SandboxConfig], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("DOCKER_HOST", "unix:///nonexistent/docker.sock")
    service = SandboxService(make_config())
    backend = service.backend
    health = backend.health()
    assert not health.ok and "cannot reach the Docker engine" in health.message
    with pytest.raises(EngineUnavailable, match="SANDBOX_KERNEL_BACKEND=local"):
        backend.list()
    with pytest.raises(EngineUnavailable, match="SANDBOX_KERNEL_BACKEND=local"):
        backend.find("sk-anything")  # a kernel's lookup, without the SDK


def test_list_only_shows_ours(
    backend: DockerBackend, service: SandboxService, test_user: str
) -> None:
    service.ensure(ScopeKey(test_user))
    everything = backend.list()
    assert all(
        engine().containers.get(i.engine_id).labels.get(LABEL_MANAGED) == "1" for i in everything
    )


def test_cli_commands(
    make_config: Callable[..., SandboxConfig], test_user: str, tmp_path: Path
) -> None:
    cfg = make_config()
    env = {
        "PATH": "/usr/bin:/bin",
        "SANDBOX_KERNEL_BACKEND": "docker",
        "SANDBOX_KERNEL_IMAGE": cfg.image,
        "SANDBOX_KERNEL_WORKSPACE_ROOT": cfg.workspace_root,
        "SANDBOX_KERNEL_STATE_DIR": cfg.state_dir,
        "SANDBOX_KERNEL_USER": test_user,
        "SANDBOX_KERNEL_WORK_ROOT": "none",
        "JUPYTER_CONFIG_DIR": str(tmp_path / "cfg"),
        "HOME": str(tmp_path),
    }

    def cli(*args: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            [sys.executable, "-m", "sandbox_kernel.cli", *args],
            env=env,
            capture_output=True,
            text=True,
            timeout=120,
        )

    created = cli(
        "exec", "--", "python3", "-c", "print('hello from', open('/etc/hostname').read().strip())"
    )
    assert created.returncode == 0, created.stderr
    assert created.stdout.strip() == "hello from sandbox"
    assert "creating sandbox" in created.stderr
    listed = cli("list", "--json")
    [row] = __import__("json").loads(listed.stdout)
    assert (row["user"], row["state"], row["backend"]) == (test_user, "running", "docker")
    assert cli("exec", row["id"], "--", "python3", "-c", "raise SystemExit(5)").returncode == 5
    # Without --: the command as typed; a first word that is an id names the sandbox.
    plain = cli("exec", "python3", "-c", "print(6 * 7)")
    assert (plain.returncode, plain.stdout) == (0, "42\n"), plain.stderr
    assert cli("exec", "--timeout", "30", row["id"], "python3", "-c", "print(1)").stdout == "1\n"
    missing = cli("exec", "--", "nosuchcmd", "-x")
    assert (missing.returncode, missing.stdout) == (
        127,
        "nosuchcmd: command not found in the sandbox\n",
    )
    not_runnable = cli("exec", "--", "/etc/passwd")
    assert not_runnable.returncode == 126 and "permission denied" in not_runnable.stdout.lower()
    assert "OCI" not in missing.stdout + not_runnable.stdout
    assert cli("stop", row["id"]).stdout.strip() == f"{row['id']}: stopped"
    stopped = cli("exec", row["id"], "--", "true")
    assert stopped.returncode == 1 and "start it with" in stopped.stderr
    assert cli("start", row["id"]).returncode == 0
    assert "destroyed" in cli("destroy", row["id"]).stdout
    again = cli("destroy", row["id"])
    assert again.returncode == 0 and "already gone" in again.stdout
    unknown = cli("stop", "sk-no-such")
    assert (
        unknown.returncode == 1
        and unknown.stderr.count("\n") == 1
        and "no sandbox with id" in unknown.stderr
    )
    env["DOCKER_HOST"] = "unix:///nonexistent/docker.sock"
    down = cli("list", "--backend", "docker")
    assert (
        down.returncode == 1
        and down.stderr.count("\n") == 1
        and "cannot reach the Docker engine" in down.stderr
    )


def test_cli_says_what_to_type(tmp_path: Path) -> None:
    """Mistakes a newcomer makes get one line saying what to type, never a traceback."""
    env = {
        "PATH": "/usr/bin:/bin",
        "HOME": str(tmp_path),
        "JUPYTER_CONFIG_DIR": str(tmp_path / "cfg"),
        "JUPYTER_DATA_DIR": str(tmp_path / "data"),
        "DOCKER_HOST": "unix:///nonexistent/docker.sock",
    }

    def cli(*args: str, **extra: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            [sys.executable, "-m", "sandbox_kernel.cli", *args],
            env={**env, **extra},
            capture_output=True,
            text=True,
            timeout=60,
        )

    bad_name = cli("install", "--user", "--name", "bad name")
    assert bad_name.returncode == 2 and bad_name.stderr.count("\n") == 1
    assert "'bad name' cannot be a kernel name: use letters, digits" in bad_name.stderr
    no_action = cli("snapshot")
    assert (
        no_action.returncode == 2
        and "`snapshot create ID NAME`, `snapshot list` or `snapshot delete NAME`"
        in no_action.stderr
    )
    nothing = cli("exec")
    assert nothing.returncode == 2 and "nothing to run" in nothing.stderr
    two = cli("exec", "sk-a", "extra", "--", "ls")
    assert two.returncode == 2 and "only a sandbox id may come before --" in two.stderr
    helped = cli("exec", "--help")
    assert "Run a command in a sandbox" in helped.stdout and "names the sandbox" in helped.stdout
    assert "Snapshots of a sandbox's filesystem" in cli("snapshot", "--help").stdout
    typo = cli(
        "list",
        "--backend",
        "local",
        SANDBOX_KERNEL_FLAVR="large",
        SANDBOX_KERNEL_STATE_DIR=str(tmp_path / "st"),
    )
    assert typo.returncode == 0
    assert (
        typo.stderr
        == "sandbox-kernel: ignoring SANDBOX_KERNEL_FLAVR: no such setting; did you mean SANDBOX_KERNEL_FLAVOR?\n"
    )
    for result in (bad_name, no_action, nothing, two, typo):
        assert "Traceback" not in result.stderr


def test_missing_image_that_cannot_be_pulled(
    make_config: Callable[..., SandboxConfig], test_user: str
) -> None:
    """No registry answers here, so a pull fails fast: the message says what to do."""
    service = SandboxService(make_config(image="127.0.0.1:9/sandbox-kernel/absent:1"))
    backend = service.backend
    seen: list[str] = []
    with pytest.raises(Exception, match="is not present and could not be pulled") as err:
        service.ensure(ScopeKey(test_user), progress=seen.append)
    assert "SANDBOX_KERNEL_IMAGE" in str(err.value)
    assert any("pulling" in line for line in seen)
    assert backend.list(test_user) == []


def test_remount_refuses_a_folder_swapped_for_a_link(
    make_config: Callable[..., SandboxConfig], test_user: str, tmp_path: Path
) -> None:
    """Nested checkouts: sandbox B binds outer/sub, and a sandbox that binds outer (or
    anyone writing there) swaps sub for a link to a root-only folder while B is stopped
    and its idmapped mounts are gone (a reboot). B's next start must refuse, never give
    B the link's target writable as the sandbox user; unchanged folders start as before."""
    from sandbox_kernel.backends import idmap

    if os.geteuid() != 0 or not idmap.supported(str(tmp_path)):
        pytest.skip("idmapped mounts need a root server and a kernel that has them")
    secret = tmp_path / "root-only"
    secret.mkdir(mode=0o700)
    (secret / "secret.txt").write_text("host only")
    outer = tmp_path / "outer"
    inner = outer / "sub"
    inner.mkdir(parents=True)
    (inner / "data.csv").write_text("a,1\n")
    service = SandboxService(make_config(work_root="auto"))
    info = service.ensure(ScopeKey(test_user), work_folder=str(inner)).info
    assert info.work_folder == str(inner)
    labels = docker.from_env().containers.get(info.engine_id).labels

    def reboot() -> None:
        service.backend.stop(info.id)
        for point in (
            labels["sandbox-kernel.work-mount"],
            labels["sandbox-kernel.workspace-mount"],
        ):
            idmap.unmount(Path(point))

    # Nothing changed: a start after a reboot remakes the mounts of the same folders.
    reboot()
    service.start(None, info.id)
    assert (
        run(service.backend, info.id, f"print(open({str(inner / 'data.csv')!r}).read())") == "a,1"
    )
    # The folder swapped for a link to a root-only one: refused, and nothing of it shown.
    reboot()
    shutil.rmtree(inner)
    inner.symlink_to(secret)
    with pytest.raises(SandboxError, match="no longer the folder this sandbox was made with"):
        service.start(None, info.id)
    assert idmap.mounts_of(secret) == []
    assert (secret / "secret.txt").read_text() == "host only"
    assert secret.stat().st_mode & 0o777 == 0o700


def test_sweeps_never_release_the_mounts_of_a_sandbox_being_made(
    make_config: Callable[..., SandboxConfig], test_user: str
) -> None:
    """Race: every kernel's start runs a reaper round a moment later, whose sweep
    releases the idmapped mounts of containers the engine does not list. A sandbox's
    mounts are made before its container: a sweep in between must not release them
    (the create then failed with "cannot present the folder"). Sweeps run back to back
    in a thread while users' sandboxes are made; then a mount whose container never
    came is released once it is no longer fresh."""
    import threading

    from sandbox_kernel.backends import idmap
    from sandbox_kernel.backends.docker import mounts as docker_mounts

    service = SandboxService(make_config())
    backend = service.backend
    assert isinstance(backend, DockerBackend)
    if backend._mounts.ownership(engine().images.get(service.config.image))[2] != "idmap":
        pytest.skip("idmapped mounts need a root server and a kernel that has them")
    done = threading.Event()
    sweeps = 0

    def sweep_on() -> None:
        nonlocal sweeps
        while not done.is_set():
            backend.sweep()
            sweeps += 1

    sweeper = threading.Thread(target=sweep_on)
    sweeper.start()
    try:
        made = [service.ensure(ScopeKey(f"{test_user}-{n}")).info for n in range(6)]
    finally:
        done.set()
        sweeper.join()
    assert sweeps > 6
    for info in made:
        assert (
            run(backend, info.id, "import os; print(len(os.listdir('/workspace')) >= 0)") == "True"
        )
    # Mounts made for a container that never came: spared while fresh, then released.
    name = engine_name(backend._installation, f"sk-{test_user}-never")
    _, point = backend._mounts.workspace(ScopeKey(f"{test_user}-never"), name, 1000, 1000, "idmap")
    assert idmap.is_mountpoint(point)
    backend.sweep()
    assert idmap.is_mountpoint(point)
    old = time.time() - docker_mounts.FRESH - 1
    os.utime(point.parent / ".lock", (old, old))
    backend.sweep()
    assert not idmap.is_mountpoint(point) and not point.parent.exists()


def test_a_mount_made_while_another_is_released_stays(
    make_config: Callable[..., SandboxConfig],
    test_user: str,
    monkeypatch: pytest.MonkeyPatch,
    tmp_path: Path,
) -> None:
    """Race: one process releases a sandbox's mounts (slowed down here) while another
    makes them for the same name anew. The new mount must be there afterwards, made
    once the release is over; and a mount left from a workspace folder that was made
    anew since is replaced, never shown instead of the folder at that path."""
    import threading

    from sandbox_kernel.backends import idmap
    from sandbox_kernel.backends.docker.mounts import WorkspaceMounts

    service = SandboxService(make_config())
    backend = service.backend
    assert isinstance(backend, DockerBackend)
    mounts: WorkspaceMounts = backend._mounts
    if mounts.ownership(engine().images.get(service.config.image))[2] != "idmap":
        pytest.skip("idmapped mounts need a root server and a kernel that has them")
    key = ScopeKey(test_user)
    name = engine_name(backend._installation, key.name)
    workspace, point = mounts.workspace(key, name, 1000, 1000, "idmap")
    slow_unmount = idmap.unmount

    def unmount(target: Path) -> None:
        time.sleep(0.3)
        slow_unmount(target)

    monkeypatch.setattr(idmap, "unmount", unmount)
    releasing = threading.Thread(target=mounts.release, args=(name,))
    releasing.start()
    time.sleep(0.1)  # the release holds the lock now
    _, again = mounts.workspace(key, name, 1000, 1000, "idmap")
    releasing.join()
    monkeypatch.setattr(idmap, "unmount", slow_unmount)
    assert again == point and idmap.is_mountpoint(point)
    assert idmap.identity(point) == idmap.identity(workspace)
    # The workspace folder made anew (destroyed and recreated by hand): the old mount goes.
    workspace.rename(workspace.with_name(workspace.name + "-old"))
    workspace.mkdir()
    mounts.workspace(key, name, 1000, 1000, "idmap")
    assert idmap.identity(point) == idmap.identity(workspace)
    mounts.release(name)
    assert not point.parent.exists()
    # A link where a folder should be is never presented (its target would be).
    link = workspace.with_name(workspace.name + "-link")
    link.symlink_to(workspace)
    elsewhere = tmp_path / "point"
    with pytest.raises(idmap.IdmapError, match="is a link, not a folder"):
        idmap.mount(link, elsewhere, 1000, 1000)
    assert not idmap.is_mountpoint(elsewhere)


def test_idmap_support_is_probed_once_per_kernel(
    backend: DockerBackend, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The probe starts a helper process, so its answer is kept (beside the mounts,
    emptied at boot) and asked again only under another kernel."""
    from sandbox_kernel.backends import idmap

    if os.geteuid() != 0:
        pytest.skip("only a root server uses idmapped mounts")
    mounts = backend._mounts
    kept = mounts._base() / ".idmap-probed"
    kept.unlink(missing_ok=True)
    probes: list[str] = []
    real = idmap.supported
    monkeypatch.setattr(idmap, "supported", lambda base: probes.append(base) or real(base))
    answer = mounts._idmap_works()
    assert [mounts._idmap_works() for _ in range(3)] == [answer] * 3
    assert len(probes) == 1
    kept.write_text(f"0.0.0-another-kernel\n{'no' if answer else 'yes'}")
    assert mounts._idmap_works() == answer and len(probes) == 2
    kept.write_text("garbled")
    assert mounts._idmap_works() == answer and len(probes) == 3


def _remove_image(image_id: str) -> None:
    """Remove a test's image, and the containers made from it first."""
    for container in engine().containers.list(
        ignore_removed=True, all=True, filters={"ancestor": image_id}
    ):
        container.remove(force=True)
    engine().images.remove(image_id, force=True)
