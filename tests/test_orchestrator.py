"""The orchestrator's rules, tried as a user would trip over them: variants, resizes,
outdated sandboxes, per-user snapshots (CLI and REST), quotas under a race, on start,
and counted per installation. Real Docker engine, real kernels, real Jupyter server."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections.abc import Callable
from concurrent.futures import ProcessPoolExecutor
from pathlib import Path
from typing import Any

import pytest
from jupyter_client.manager import start_new_kernel

from sandbox_kernel.config import SandboxConfig, load_config
from sandbox_kernel.errors import QuotaExceeded, SandboxNotFound
from sandbox_kernel.identity import ScopeKey
from sandbox_kernel.lifecycle import gc
from sandbox_kernel.service import SandboxService

from .conftest import TEST_IMAGE, remove_user_containers, remove_user_snapshots
from .helpers import make_wheel
from .kernel_env import make_kernel_env

pytestmark = [pytest.mark.docker, pytest.mark.usefixtures("docker_cleanup")]


def run_cell(kc: Any, code: str) -> str:
    """stdout of one cell (raises with the error when it fails)."""
    chunks: list[str] = []
    reply = kc.execute_interactive(
        code,
        timeout=120,
        output_hook=lambda m: (
            chunks.append(m["content"].get("text", "")) if m["msg_type"] == "stream" else None
        ),
    )
    assert reply["content"]["status"] == "ok", reply["content"]
    return "".join(chunks)


def test_flavor_variant_resizes_in_place_and_gc_loses_nothing(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, request: pytest.FixtureRequest
) -> None:
    """A kernelspec variant with a larger flavor on a user's existing sandbox: the same
    sandbox grows (its packages stay), the kernel says so, and the reaper keeps it."""
    env = make_kernel_env(tmp_path)
    # Its own user (not docker_cleanup's): its sandbox goes with it, as every test's does.
    request.addfinalizer(lambda: remove_user_containers(env.user))
    monkeypatch.setenv("JUPYTER_PATH", env.jupyter_path)
    cfg = env.config(
        orphan_grace=0,
    )
    plain = SandboxService(cfg)
    info = plain.ensure(ScopeKey(env.user)).info
    wheel = make_wheel(env.workspace / "wheels")
    assert (
        plain.backend.exec(
            info.id,
            [
                "python3",
                "-m",
                "pip",
                "install",
                "-q",
                "--no-index",
                f"/workspace/wheels/{wheel.name}",
            ],
        ).exit_code
        == 0
    )
    # The variant kernelspec: same sandbox settings but flavor large.
    spec = json.loads((Path(env.jupyter_path) / "kernels" / "sandbox" / "kernel.json").read_text())
    spec["env"]["SANDBOX_KERNEL_FLAVOR"] = "large"
    (Path(env.jupyter_path) / "kernels" / "sandbox" / "kernel.json").write_text(json.dumps(spec))
    km, kc = start_new_kernel(kernel_name="sandbox")
    try:
        said: list[str] = []
        kc.execute_interactive(
            "import sk_demo_pkg; print(sk_demo_pkg.VALUE)",
            timeout=120,
            output_hook=lambda m: (
                said.append(m["content"].get("text", "")) if m["msg_type"] == "stream" else None
            ),
        )
        assert "1.0" in "".join(said)  # the package installed before is still there
        # The resize is the kernel's news, not the cell's output: the status bar has it.
        assert any(
            "now has flavor large" in p["message"] for p in plain.store.progress("docker", since=0)
        )
        grown = plain.backend.get(info.id)
        assert grown.engine_id == info.engine_id and grown.limits["memory"] == 4 << 30
    finally:
        kc.stop_channels()
        km.shutdown_kernel()  # a clean shutdown: the kernel's heartbeat record goes with it
    assert plain.store.live_kernels("docker").get(info.id, []) == []
    assert [
        a for a in gc(plain.backend, cfg) if a.sandbox_id == info.id and a.action == "destroy"
    ] == []
    assert plain.backend.get(info.id).engine_id == info.engine_id
    # A door that asks for no flavor (a plain `exec`) takes the sandbox as it is: it never
    # shrinks back to the default behind the user's back.
    kept = plain.ensure(ScopeKey(env.user))
    assert kept.notes == [] and kept.info.limits["memory"] == 4 << 30
    # Asked for small: the sandbox shrinks (no other kernel uses it) and keeps the package.
    again = SandboxService(plain.config_with(flavor="small")).ensure(ScopeKey(env.user))
    assert (
        "now has flavor small" in " ".join(again.notes) and again.info.limits["memory"] == 1 << 30
    )
    assert plain.backend.exec(info.id, ["python3", "-c", "import sk_demo_pkg"]).exit_code == 0


def test_image_variant_gets_its_own_sandbox_and_outdated_is_said(
    make_config: Callable[..., SandboxConfig], test_user: str
) -> None:
    """Another image with a variant name: a second sandbox beside the plain one. Another
    image without one: the existing sandbox is used, and the notice says how to switch."""
    plain = SandboxService(make_config())
    base = plain.ensure(ScopeKey(test_user)).info
    variant = SandboxService(
        make_config(image="sandbox-kernel-test:bookworm-alias", variant="py-other")
    )
    _alias_test_image("sandbox-kernel-test:bookworm-alias")
    other = variant.ensure(ScopeKey(test_user))
    assert other.info.id.startswith(f"sk-{test_user}--v") and other.info.id != base.id
    assert other.info.workspace == base.workspace  # one workspace per user
    assert plain.backend.get(base.id).engine_id == base.engine_id  # untouched
    # The same image change without a variant: not silent, and nothing is lost.
    changed = SandboxService(make_config(image="sandbox-kernel-test:bookworm-alias")).ensure(
        ScopeKey(test_user)
    )
    assert changed.info.engine_id == base.engine_id
    assert "your settings now make sandbox-kernel-test:bookworm-alias" in " ".join(changed.notes)
    assert f"sandbox-kernel destroy {base.id}" in " ".join(changed.notes)
    listed = {
        i["id"]: i
        for i in SandboxService(make_config(image="sandbox-kernel-test:bookworm-alias")).list(
            test_user
        )
    }
    assert listed[base.id]["outdated"] and not listed[other.info.id]["outdated"]


def _alias_test_image(tag: str) -> None:
    import docker

    repo, _, name = tag.partition(":")
    docker.from_env().images.get(TEST_IMAGE).tag(repo, name)


def _cli(env: dict[str, str], *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "sandbox_kernel.cli", *args],
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
    )


def test_snapshots_are_per_user_on_the_cli(
    make_config: Callable[..., SandboxConfig], test_user: str, tmp_path: Path
) -> None:
    """Two users each make a snapshot called 'base'; neither sees, deletes or starts from
    the other's; an administrator sees both with --all."""
    cfg = make_config()
    base_env = {
        **os.environ,
        "PYTHONPATH": str(Path(__file__).resolve().parent.parent),
        "SANDBOX_KERNEL_BACKEND": "docker",
        "SANDBOX_KERNEL_IMAGE": cfg.image,
        "SANDBOX_KERNEL_WORKSPACE_ROOT": cfg.workspace_root,
        "SANDBOX_KERNEL_STATE_DIR": cfg.state_dir,
        "SANDBOX_KERNEL_WORK_ROOT": "none",
        "JUPYTER_CONFIG_DIR": str(tmp_path / "cfg"),
    }
    alice = {**base_env, "SANDBOX_KERNEL_USER": f"{test_user}-a"}
    bob = {**base_env, "SANDBOX_KERNEL_USER": f"{test_user}-b"}
    try:
        for env, mark in ((alice, "from-alice"), (bob, "from-bob")):
            assert (
                _cli(env, "exec", "--", "sh", "-c", f"echo {mark} > /home/sandbox/mark").returncode
                == 0
            )
            made = _cli(env, "snapshot", "create", f"sk-{env['SANDBOX_KERNEL_USER']}", "base")
            assert made.returncode == 0, made.stderr
        assert _cli(alice, "snapshot", "list").stdout.count("base") == 1
        everyone = _cli(alice, "snapshot", "list", "--all").stdout
        assert everyone.count("base") == 2 and f"{test_user}-b" in everyone
        # Bob cannot snapshot Alice's sandbox, nor start from her snapshot by name: his own "base" is used.
        refused = _cli(bob, "snapshot", "create", f"sk-{test_user}-a", "stolen")
        assert refused.returncode == 1 and "belongs to another user" in refused.stderr
        thread = {
            **bob,
            "SANDBOX_KERNEL_SCOPE": "thread",
            "SANDBOX_KERNEL_THREAD": "t1",
            "SANDBOX_KERNEL_SNAPSHOT": "base",
        }
        assert _cli(thread, "exec", "--", "cat", "/home/sandbox/mark").stdout.strip() == "from-bob"
        # Bob deleting "base" deletes his (once the sandbox made from it is gone), never Alice's.
        assert _cli(bob, "destroy", f"sk-{test_user}-b--{_thread_tag('t1')}").returncode == 0
        assert _cli(bob, "snapshot", "delete", "base").returncode == 0
        assert _cli(bob, "snapshot", "delete", "base").returncode == 1
        assert "base" in _cli(alice, "snapshot", "list").stdout
        assert _cli(alice, "snapshot", "delete", "base").returncode == 0
    finally:
        remove_user_containers(test_user)
        remove_user_snapshots(test_user)


def _thread_tag(thread: str) -> str:
    from sandbox_kernel.identity import thread_id

    return thread_id(thread)


def _make_one(args: tuple[dict[str, Any], str]) -> str:
    values, user = args
    try:
        return SandboxService(load_config(environ={}, **values)).ensure(ScopeKey(user)).info.id
    except QuotaExceeded as exc:
        return f"refused: {exc}"


def test_quota_race_makes_exactly_the_allowed_number(
    make_config: Callable[..., SandboxConfig], test_user: str
) -> None:
    """Ten processes at once, room for three: three sandboxes, seven clear refusals."""
    cfg = make_config(max_sandboxes=3)
    values = {
        "backend": "docker",
        "image": cfg.image,
        "workspace_root": cfg.workspace_root,
        "state_dir": cfg.state_dir,
        "max_sandboxes": 3,
    }
    with ProcessPoolExecutor(10) as pool:
        results = list(pool.map(_make_one, [(values, f"{test_user}-{n}") for n in range(10)]))
    made = [r for r in results if not r.startswith("refused")]
    refused = [r for r in results if r.startswith("refused")]
    assert len(made) == 3 and len(refused) == 7, results
    assert all("max_sandboxes=3" in r and "destroy one" in r for r in refused)
    assert len(SandboxService(cfg).backend.list()) == 3


def test_quota_is_checked_on_start_and_counts_this_installation_only(
    make_config: Callable[..., SandboxConfig], test_user: str, tmp_path: Path
) -> None:
    """A stopped sandbox does not start past the memory quota; another installation's
    sandboxes on the same engine never count against this one's quotas."""
    roomy = SandboxService(make_config())
    first = roomy.ensure(ScopeKey(f"{test_user}-1")).info
    second = roomy.ensure(ScopeKey(f"{test_user}-2")).info
    roomy.stop(None, second.id)
    tight = SandboxService(make_config(max_total_memory="1.5g"))
    with pytest.raises(QuotaExceeded, match="max_total_memory"):
        tight.start(None, second.id)
    with pytest.raises(QuotaExceeded, match="max_total_memory"):
        tight.ensure(ScopeKey(f"{test_user}-2"))
    assert roomy.backend.get(second.id).state == "stopped"
    roomy.stop(None, first.id)
    assert tight.start(None, second.id)["state"] == "running"  # room again
    # Another installation (its own state folder) on the same engine: not counted.
    other = SandboxService(make_config(state_dir=str(tmp_path / "other-state"), max_sandboxes=1))
    assert other.ensure(ScopeKey(f"{test_user}-x")).event == "created"
    assert (
        other.stats(None)["sandboxes"] == 1
        and "this installation only" in other.stats(None)["quota"]["counts"]
    )


def test_listing_says_which_kernels_are_busy_and_what_comes_next(
    make_config: Callable[..., SandboxConfig], test_user: str
) -> None:
    service = SandboxService(make_config(idle_stop=15))
    info = service.ensure(ScopeKey(test_user)).info
    service.store.kernel_heartbeat("k-busy", "docker", info.id, busy=True)
    service.store.kernel_heartbeat("k-idle", "docker", info.id, busy=False)
    (item,) = service.list(test_user)
    assert item["kernel_ids"] == ["k-busy", "k-idle"] and item["busy_kernel_ids"] == ["k-busy"]
    assert item["next"]["action"] == ""  # live kernels: no idle stop planned
    service.store.kernel_gone("k-busy")
    service.store.kernel_gone("k-idle")
    (item,) = service.list(test_user)
    assert item["next"]["action"] == "stop" and item["next"]["at"] > item["last_activity"]


def test_a_policy_the_administrator_pinned_is_not_loosened(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """network=false in the configuration file holds against a user's environment; a
    personal setting (the flavor) is theirs to choose among those allowed."""
    conf = tmp_path / "conf"
    conf.mkdir()
    (conf / "sandbox_kernel_config.json").write_text(
        json.dumps({"SandboxConfig": {"network": False, "allowed_flavors": ["small", "medium"]}})
    )
    monkeypatch.setenv("JUPYTER_CONFIG_DIR", str(conf))
    cfg = load_config(environ={"SANDBOX_KERNEL_NETWORK": "true", "SANDBOX_KERNEL_FLAVOR": "medium"})
    assert cfg.network is False and cfg.flavor == "medium"
    from sandbox_kernel.config import ConfigError

    with pytest.raises(ConfigError, match="flavor 'large' is not allowed here.*small, medium"):
        load_config(environ={"SANDBOX_KERNEL_FLAVOR": "large"})


def test_snapshot_of_another_user_is_not_found_on_rest_paths(
    make_config: Callable[..., SandboxConfig], test_user: str
) -> None:
    """Through the service the REST handlers use: names are per user."""
    service = SandboxService(make_config())
    a = service.ensure(ScopeKey(f"{test_user}-a")).info
    b = service.ensure(ScopeKey(f"{test_user}-b")).info
    try:
        service.create_snapshot(f"{test_user}-a", a.id, "base")
        service.create_snapshot(f"{test_user}-b", b.id, "base")
        assert [s["user"] for s in service.snapshots(f"{test_user}-a")] == [f"{test_user}-a"]
        assert {s["user"] for s in service.snapshots(None)} >= {f"{test_user}-a", f"{test_user}-b"}
        assert service.delete_snapshot(f"{test_user}-b", "base") is True
        assert [s["name"] for s in service.snapshots(f"{test_user}-a")] == ["base"]
        with pytest.raises(SandboxNotFound):
            service.delete_snapshot(f"{test_user}-b", "base")
    finally:
        remove_user_containers(test_user)
        remove_user_snapshots(test_user)
