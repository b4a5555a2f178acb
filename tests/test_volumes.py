"""An administrator's folders in every sandbox, on real Docker: a read-only data set read
and never written from a cell, a writable cache written from a cell and seen on the host,
a hostile cell unable to plant links, FIFOs or setuid files there or touch what host
tools trust, and a changed mapping applied at the sandbox's next start with its
installed packages kept (also after a crash half-way, and with several starts at once).
"""

from __future__ import annotations

import json
import os
import stat
from collections.abc import Callable, Iterator
from concurrent.futures import ProcessPoolExecutor
from pathlib import Path
from typing import Any

import docker
import pytest
from jupyter_client.manager import start_new_kernel

from sandbox_kernel.backends.base import SandboxInfo
from sandbox_kernel.backends.docker.carry import LABEL_CARRY
from sandbox_kernel.config import SandboxConfig, load_config
from sandbox_kernel.identity import ScopeKey
from sandbox_kernel.service import SandboxService

from .conftest import remove_user_containers
from .helpers import make_wheel
from .kernel_env import make_kernel_env

pytestmark = pytest.mark.docker

# A cell that tries, in a writable mapped folder, everything that would turn a host tool
# against the host user; one line per attempt: "NAME made" or "NAME refused ERRNO".
HOSTILE = """
import errno, os, socket
os.chdir('/cache')
def attempt(name, fn):
    try:
        fn(); print(name, 'made')
    except OSError as e:
        print(name, 'refused', errno.errorcode.get(e.errno))
attempt('symlink', lambda: os.symlink('/etc/passwd', 'report.csv'))
attempt('dirlink', lambda: os.symlink('/', 'rootlink'))
attempt('fifo', lambda: os.mkfifo('pipe'))
attempt('socket', lambda: socket.socket(socket.AF_UNIX).bind('sock'))
attempt('setuid', lambda: (open('tool', 'w').close(), os.chmod('tool', 0o4755)))
attempt('setgid', lambda: os.chmod('tool', 0o2755))
attempt('git-config', lambda: open('repo/.git/config', 'a').write('[core]\\n\\tfsmonitor = !touch /tmp/x\\n'))
attempt('git-moved', lambda: os.rename('repo/.git', 'repo/.git-old'))
attempt('hook', lambda: open('repo/.git/hooks/post-checkout', 'w').write('#!/bin/sh\\n'))
attempt('plain', lambda: open('plain.txt', 'w').write('fine'))
"""


def run_cell(kc: Any, code: str) -> str:
    """stdout of one cell (raises with the error when it fails)."""
    chunks: list[str] = []
    reply = kc.execute_interactive(
        code,
        timeout=180,
        output_hook=lambda m: (
            chunks.append(m["content"].get("text", "")) if m["msg_type"] == "stream" else None
        ),
    )
    assert reply["content"]["status"] == "ok", reply["content"]
    return "".join(chunks)


@pytest.fixture
def folders(tmp_path: Path) -> dict[str, Path]:
    """The administrator's folders: a data set, a cache holding a git checkout, models."""
    data, cache, models = tmp_path / "data", tmp_path / "cache", tmp_path / "models"
    (data / "corpus").mkdir(parents=True)
    (data / "corpus" / "words.txt").write_text("alpha beta\n")
    (cache / "repo" / ".git" / "hooks").mkdir(parents=True)
    (cache / "repo" / ".git" / "config").write_text("[core]\n")
    models.mkdir()
    (models / "weights.bin").write_bytes(b"\x00" * 64)
    return {"data": data, "cache": cache, "models": models}


@pytest.fixture
def settings(tmp_path: Path, test_user: str) -> Iterator[Callable[..., SandboxConfig]]:
    """Settings of one installation with the given mappings (as an administrator writes
    them), for ``test_user``'s sandboxes."""
    from .conftest import TEST_IMAGE

    def make(volumes: list[str], **more: Any) -> SandboxConfig:
        return load_config(
            environ={},
            backend="docker",
            image=TEST_IMAGE,
            workspace_root=str(tmp_path / "workspaces"),
            state_dir=str(tmp_path / "state"),
            user=test_user,
            volumes=volumes,
            **more,
        )

    yield make
    remove_user_containers(test_user)
    remove_carry_images(test_user)


def remove_carry_images(user: str) -> None:
    client = docker.from_env()
    for image in client.images.list(filters={"label": LABEL_CARRY}):
        if (image.labels or {}).get("sandbox-kernel.user") == user:
            for tag in image.tags:
                client.images.remove(tag, noprune=False)


def sh(service: SandboxService, info: SandboxInfo, script: str) -> tuple[int, str]:
    """A shell script run in the sandbox as the user's own command."""
    done = service.exec(info, service.as_user(info, ["sh", "-c", script]))
    return done.exit_code, done.output.decode(errors="replace")


def carry_images(sandbox_id: str) -> list[Any]:
    """Every image holding a sandbox's kept files, tagged or not."""
    return docker.from_env().images.list(all=True, filters={"label": f"{LABEL_CARRY}={sandbox_id}"})


def test_a_cell_reads_a_read_only_mapping_and_writes_a_writable_one(
    tmp_path: Path, folders: dict[str, Path], monkeypatch: pytest.MonkeyPatch
) -> None:
    volumes = [f"{folders['data']}:/data", f"{folders['cache']}:/cache:rw"]
    env = make_kernel_env(tmp_path / "k", SANDBOX_KERNEL_VOLUMES=json.dumps(volumes))
    monkeypatch.setenv("JUPYTER_PATH", env.jupyter_path)
    km, kc = start_new_kernel(kernel_name="sandbox")
    try:
        said = run_cell(
            kc,
            "import errno\n"
            "print(open('/data/corpus/words.txt').read().strip())\n"
            "try:\n"
            "    open('/data/corpus/new.txt', 'w')\n"
            "except OSError as e:\n"
            "    print('ro refused', errno.errorcode[e.errno])\n"
            "open('/cache/result.txt', 'w').write('from a cell')\n",
        )
        assert said.splitlines() == ["alpha beta", "ro refused EROFS"]
        written = folders["cache"] / "result.txt"
        assert written.read_text() == "from a cell"
        # The host user's, not a sandbox uid's: nothing of the host changes owner.
        assert (written.stat().st_uid, written.stat().st_gid) == (os.getuid(), os.getgid())
        assert not (folders["data"] / "corpus" / "new.txt").exists()

        attempts = dict(line.split(" ", 1) for line in run_cell(kc, HOSTILE).splitlines())
        for name in ("symlink", "dirlink", "fifo", "socket", "setuid", "setgid"):
            assert attempts[name].startswith("refused"), (name, attempts)
        for name in ("git-config", "git-moved", "hook"):
            assert attempts[name].startswith("refused"), (name, attempts)
        assert attempts["plain"] == "made"
        cache = folders["cache"]
        for planted in ("report.csv", "rootlink", "pipe", "sock"):
            assert not os.path.lexists(cache / planted), planted
        assert not (cache / "tool").stat().st_mode & (stat.S_ISUID | stat.S_ISGID)
        assert (cache / "repo" / ".git" / "config").read_text() == "[core]\n"
        assert not (cache / "repo" / ".git" / "hooks" / "post-checkout").exists()
        assert (cache / "plain.txt").read_text() == "fine"
    finally:
        km.shutdown_kernel(now=True)
    # A command the host runs for the user (`sandbox-kernel exec`, a terminal, an agent's
    # shell command) is held to the same.
    service = SandboxService(env.config(volumes=volumes))
    (item,) = service.list(env.user)
    assert item["volumes"] == [
        {"source": str(folders["data"]), "target": "/data", "mode": "ro", "kind": "host folder"},
        {"source": str(folders["cache"]), "target": "/cache", "mode": "rw", "kind": "host folder"},
    ]
    assert item["outdated"] == "" and item["remake"] == ""
    info = service.backend.get(item["id"])
    code, out = sh(service, info, "ln -s /etc/passwd /cache/cli-link; mkfifo /cache/cli-fifo")
    assert code != 0 and "Permission denied" in out
    assert not os.path.lexists(folders["cache"] / "cli-link")
    assert not os.path.lexists(folders["cache"] / "cli-fifo")
    remove_user_containers(env.user)


def test_a_changed_mapping_is_applied_at_the_next_start_keeping_installed_packages(
    settings: Callable[..., SandboxConfig], folders: dict[str, Path], test_user: str
) -> None:
    data = f"{folders['data']}:/data"
    cache = f"{folders['cache']}:/cache:rw"
    first = SandboxService(settings([data]))
    info = first.ensure(ScopeKey(test_user)).info
    wheel = make_wheel(Path(first.config.workspace_root) / ScopeKey(test_user).user_id / "wheels")
    code, out = sh(
        first,
        info,
        f"python3 -m pip install -q --user --no-index /workspace/wheels/{wheel.name} && "
        "echo mine > ~/notes.txt && echo old > /tmp/scratch",
    )
    assert code == 0, out

    # The administrator adds a writable cache: the running sandbox keeps its folders and
    # says what its next start does.
    second = SandboxService(settings([data, cache]))
    (item,) = second.list(test_user)
    assert item["state"] == "running"
    assert "made with other folder mappings" in item["outdated"]
    assert "/cache (rw)" in item["outdated"]
    assert item["remake"] == (
        "made anew with them at its next start: its files and installed packages are kept"
    )
    kept = second.ensure(ScopeKey(test_user))
    assert kept.event == "existing" and kept.info.engine_id == info.engine_id
    assert any("made anew with them at its next start" in n for n in kept.notes), kept.notes
    assert sh(second, kept.info, "test -d /cache")[0] != 0

    # Its next start (here the CLI's and REST's start) makes it anew with them.
    second.stop(None, info.id)
    started = second.start(None, info.id)
    assert started["engine_id"] != info.engine_id and started["state"] == "running"
    assert started["outdated"] == "" and started["remake"] == ""
    assert [v["target"] for v in started["volumes"]] == ["/data", "/cache"]
    now = second.backend.get(info.id)
    code, out = sh(
        second,
        now,
        "python3 -c 'import sk_demo_pkg; print(sk_demo_pkg.VALUE)'; cat ~/notes.txt /tmp/scratch; "
        "echo new > /cache/from-remade.txt && cat /data/corpus/words.txt",
    )
    assert code == 0 and out.split() == ["1.0", "mine", "old", "alpha", "beta"], out
    assert (folders["cache"] / "from-remade.txt").read_text() == "new\n"

    # Again, through a kernel's way in (ensure): the data set goes, models come.
    third = SandboxService(settings([cache, f"{folders['models']}:/models"]))
    third.stop(None, info.id)
    again = third.ensure(ScopeKey(test_user))
    assert again.event == "started" and again.info.engine_id != now.engine_id
    code, out = sh(
        third,
        again.info,
        "python3 -c 'import sk_demo_pkg; print(sk_demo_pkg.VALUE)'; cat ~/notes.txt; "
        "wc -c < /models/weights.bin; test -e /data/corpus/words.txt || echo no-data",
    )
    assert code == 0 and out.split() == ["1.0", "mine", "64", "no-data"], out
    assert len([i for i in carry_images(info.id) if i.tags]) == 1

    # Destroyed: the kept files go too, every layer of them.
    assert third.destroy(None, info.id)
    assert carry_images(info.id) == []


def test_a_crash_between_removal_and_remaking_loses_nothing(
    settings: Callable[..., SandboxConfig], folders: dict[str, Path], test_user: str
) -> None:
    """The old container was committed and removed, and the process died before making
    the new one: the next start finds the kept files."""
    first = SandboxService(settings([f"{folders['data']}:/data"]))
    info = first.ensure(ScopeKey(test_user)).info
    assert sh(first, info, "echo survived > ~/notes.txt")[0] == 0
    first.stop(None, info.id)
    second = SandboxService(settings([f"{folders['cache']}:/cache:rw"]))
    backend: Any = second.backend
    found = backend._lookup(info.id)
    backend._carry.commit(found, info.id, second.spec(test_user))
    backend._remove(found)
    assert second.backend.find(info.id) is None
    made = second.ensure(ScopeKey(test_user)).info
    code, out = sh(second, made, "cat ~/notes.txt; test -d /cache && echo cache")
    assert code == 0 and out.split() == ["survived", "cache"], out


def _start_in_another_process(args: tuple[dict[str, Any], str]) -> str:
    values, user = args
    ensured = SandboxService(load_config(environ={}, **values)).ensure(ScopeKey(user))
    return ensured.info.engine_id


def test_several_starts_at_once_make_it_anew_once(
    settings: Callable[..., SandboxConfig], folders: dict[str, Path], test_user: str
) -> None:
    first = SandboxService(settings([f"{folders['data']}:/data"]))
    info = first.ensure(ScopeKey(test_user)).info
    assert sh(first, info, "echo kept > ~/notes.txt")[0] == 0
    first.stop(None, info.id)
    cfg = settings([f"{folders['cache']}:/cache:rw"])
    values = {
        "backend": "docker",
        "image": cfg.image,
        "workspace_root": cfg.workspace_root,
        "state_dir": cfg.state_dir,
        "user": test_user,
        "volumes": cfg.volumes,
    }
    with ProcessPoolExecutor(4) as pool:
        engine_ids = list(pool.map(_start_in_another_process, [(values, test_user)] * 4))
    assert len(set(engine_ids)) == 1, engine_ids
    service = SandboxService(cfg)
    (item,) = service.list(test_user)
    assert item["engine_id"] == engine_ids[0] and item["outdated"] == ""
    code, out = sh(service, service.backend.get(item["id"]), "cat ~/notes.txt")
    assert code == 0 and out.strip() == "kept"


def test_a_snapshot_of_a_remade_sandbox_is_a_snapshot_and_kept_files_never_are(
    settings: Callable[..., SandboxConfig], folders: dict[str, Path], test_user: str
) -> None:
    from .conftest import remove_user_snapshots

    first = SandboxService(settings([f"{folders['data']}:/data"]))
    info = first.ensure(ScopeKey(test_user)).info
    first.stop(None, info.id)
    second = SandboxService(settings([f"{folders['cache']}:/cache:rw"]))
    second.start(None, info.id)
    try:
        second.create_snapshot(test_user, info.id, "after-remake")
        assert [s["name"] for s in second.snapshots(test_user)] == ["after-remake"]
        second.destroy(None, info.id)
        assert [s["name"] for s in second.snapshots(test_user)] == ["after-remake"]
        assert second.delete_snapshot(test_user, "after-remake")
        assert carry_images(info.id) == []
    finally:
        remove_user_snapshots(ScopeKey(test_user).user_id)


def test_the_sweep_removes_kept_files_of_a_sandbox_removed_behind_our_back(
    settings: Callable[..., SandboxConfig], folders: dict[str, Path], test_user: str
) -> None:
    first = SandboxService(settings([f"{folders['data']}:/data"]))
    info = first.ensure(ScopeKey(test_user)).info
    first.stop(None, info.id)
    second = SandboxService(settings([f"{folders['cache']}:/cache:rw"]))
    second.start(None, info.id)
    assert carry_images(info.id)
    client = docker.from_env()  # `docker rm -f`, not through us
    for container in client.containers.list(
        ignore_removed=True,
        all=True,
        sparse=True,
        filters={"label": f"sandbox-kernel.user={test_user}"},
    ):
        client.api.remove_container(container.id, force=True)
    backend: Any = second.backend
    assert backend._carry.keep == 120 * 60  # as long as a stopped sandbox (idle_delete)
    backend.sweep()
    assert carry_images(info.id), "kept a while: a start may want it (its maker died)"
    backend._carry.keep = 0.0
    backend.sweep()
    assert carry_images(info.id) == []
