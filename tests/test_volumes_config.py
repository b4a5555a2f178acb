"""The administrator's mapped folders as settings: what is accepted, what is refused (each
in one line naming the mapping), how the environment may give them, and what a sandbox
made from them records. No engine: the fast layer."""

from __future__ import annotations

import hashlib
import json
import os
from pathlib import Path

import pytest
from jupyter_core.paths import jupyter_data_dir

from sandbox_kernel.backends.base import (
    LABEL_VOLUMES,
    SandboxInfo,
    Spec,
    mapped_volumes,
    sandbox_labels,
    volumes_of,
    writable_host_folders,
)
from sandbox_kernel.config import ConfigError, SandboxConfig, load_config
from sandbox_kernel.errors import NotSupported, SandboxFailed
from sandbox_kernel.identity import ScopeKey
from sandbox_kernel.volumes import Volume, check_work_folder, guards, parse

pytestmark = pytest.mark.fast


@pytest.fixture
def host(tmp_path: Path) -> Path:
    """Host folders an administrator maps, beside (never inside) the state folder and
    the workspaces."""
    for name in ("data", "cache", "models", "state", "workspaces"):
        (tmp_path / name).mkdir()
    (tmp_path / "workspaces" / "bob").mkdir()
    return tmp_path


def settings(host: Path, volumes: list[str], **more: object) -> SandboxConfig:
    return load_config(
        environ={},
        volumes=volumes,
        state_dir=str(host / "state"),
        workspace_root=str(host / "workspaces"),
        **more,
    )


def refused(host: Path, volumes: list[str], **more: object) -> str:
    with pytest.raises(ConfigError) as caught:
        settings(host, volumes, **more)
    message = str(caught.value)
    assert "\n" not in message and "Traceback" not in message
    assert "c.SandboxConfig.volumes" in message and "SANDBOX_KERNEL_VOLUMES" in message
    return message


def test_mappings_are_read_only_unless_said(host: Path) -> None:
    cfg = settings(host, [f"{host}/data:/data", f"{host}/cache:/cache:rw", f"{host}/models:/m:ro"])
    assert cfg.mappings == (
        Volume(str(host / "data"), "/data", "ro"),
        Volume(str(host / "cache"), "/cache", "rw"),
        Volume(str(host / "models"), "/m", "ro"),
    )
    assert cfg.volumes == [
        f"{host}/data:/data:ro",
        f"{host}/cache:/cache:rw",
        f"{host}/models:/m:ro",
    ]
    # A volume by name (Daytona's), and the targets a data set usually gets.
    named = settings(host, ["corpora:/data:rw", f"{host}/models:/home/sandbox/models"])
    assert named.mappings[0] == Volume("corpora", "/data", "rw") and not named.mappings[0].on_host
    # Links in the administrator's path are resolved once, here.
    (host / "link").symlink_to(host / "data")
    assert settings(host, [f"{host}/link:/data"]).mappings[0].source == str(host / "data")


@pytest.mark.parametrize(
    ("mapping", "said"),
    [
        ("{h}/data", "is not host_dir:sandbox_dir[:ro|rw]"),
        ("{h}/data:/data:rx", "mode 'rx' is neither ro nor rw"),
        ("{h}/data:/data:ro:x", "is not host_dir:sandbox_dir[:ro|rw]"),
        ("{h}/data:data", "'data' is not an absolute path"),
        ("{h}/data:/data/../etc", "without '.' or '..'"),
        ("{h}/data:/", "the sandbox's root"),
        ("{h}/data:/usr", "/usr is in /usr, a system folder"),
        ("{h}/data:/usr/local/data", "a system folder of the sandbox"),
        ("{h}/data:/etc/data", "a system folder of the sandbox"),
        ("{h}/data:/proc/x", "a system folder of the sandbox"),
        ("{h}/data:/sys", "a system folder of the sandbox"),
        ("{h}/data:/dev/shm", "a system folder of the sandbox"),
        ("{h}/data:/bin", "a system folder of the sandbox"),
        ("{h}/data:/lib64/x", "a system folder of the sandbox"),
        ("{h}/data:/sbin", "a system folder of the sandbox"),
        ("{h}/data:/run/kernel-sockets", "a system folder of the sandbox"),
        ("{h}/data:/var/tmp", "a system folder of the sandbox"),
        ("{h}/data:/home/sandbox", "the sandbox's home"),
        ("{h}/data:/tmp", "the sandbox's own scratch folder"),
        ("{h}/data:/workspace", "the user's own workspace"),
        ("{h}/data:/workspace/data", "the user's own workspace"),
        ("{h}/missing:/data", "host folder {h}/missing does not exist"),
        ("relative/data:/data", "neither a host folder"),
        ("/:/host", "/ is the whole host"),
        ("/etc:/hostetc", "/etc is /etc, the host's configuration"),
        ("/etc/ssl:/certs", "/etc/ssl is in /etc, the host's configuration"),
        ("/proc:/p", "the kernel's interfaces"),
        ("/dev:/d", "the host's devices"),
        ("/run:/r", "the engine's socket"),
        ("/var:/v", "/var holds /var/run"),
        ("/var/lib:/v", "the engine's containers"),
        ("/usr/share:/share:rw", "the host's programs, which no sandbox may write"),
        ("{h}/state:/state", "the state folder"),
        ("{h}/workspaces:/all", "the workspaces root"),
        ("{h}/workspaces/bob:/bob", "the workspaces root"),
        ("{h}:/everything", "the state folder"),
    ],
)
def test_each_refusal_names_the_mapping(host: Path, mapping: str, said: str) -> None:
    given = mapping.format(h=host)
    message = refused(host, [given])
    assert f"mapping '{given}" in message, message
    assert said.format(h=host) in message, message


def test_mappings_refused_together(host: Path) -> None:
    data, cache = f"{host}/data", f"{host}/cache"
    assert "appear at overlapping places" in refused(host, [f"{data}:/data", f"{cache}:/data/c"])
    assert "appear at overlapping places" in refused(host, [f"{data}:/d", f"{cache}:/d:rw"])
    # A read-only mapping inside (or around) a writable one would not be read-only.
    (host / "cache" / "inner").mkdir()
    message = refused(host, [f"{cache}:/cache:rw", f"{cache}/inner:/inner"])
    assert "show overlapping host folders and one is writable" in message
    assert f"'{cache}:/cache:rw'" in message
    # Two read-only views of one folder are fine.
    assert len(settings(host, [f"{data}:/a", f"{data}:/b"]).mappings) == 2
    # The shared folder is /shared, read-only: no mapping there, none writing it.
    shared = {"shared_folder": str(host / "models")}
    assert "where the shared folder is mounted" in refused(host, [f"{data}:/shared"], **shared)
    assert "read-only shared folder" in refused(host, [f"{host}/models:/m:rw"], **shared)


def test_what_no_sandbox_may_see(host: Path) -> None:
    """Jupyter's folders (tokens, kernels' keys), the server user's home and its
    dot-folders, this installation's Python for a writable mapping."""
    data_dir = Path(jupyter_data_dir())
    if data_dir.parent.is_dir():
        assert "a folder of Jupyter's own" in refused(host, [f"{data_dir.parent}:/x"])
    # The home (here it holds Jupyter's folders too: either reason is given).
    assert "which no sandbox may see" in refused(host, [f"{Path.home()}:/x"])
    # Beneath it: a plain folder is fine, a dot-folder (keys, tokens) is not.
    plain, secrets = Path.home() / f"sk-test-{host.name}", Path.home() / f".sk-test-{host.name}"
    plain.mkdir()
    secrets.mkdir()
    try:
        assert settings(host, [f"{plain}:/x"]).mappings[0].source == str(plain.resolve())
        assert "is in the dot-folders of" in refused(host, [f"{secrets}:/x"])
    finally:
        plain.rmdir()
        secrets.rmdir()
    names = [g.why for g in guards(str(host / "state"), str(host / "workspaces"))]
    assert "this installation's own Python" in names


def test_the_environment_gives_a_json_list_unless_the_administrator_pinned_them(
    host: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    base = {
        "SANDBOX_KERNEL_STATE_DIR": str(host / "state"),
        "SANDBOX_KERNEL_WORKSPACE_ROOT": str(host / "workspaces"),
    }
    env = {**base, "SANDBOX_KERNEL_VOLUMES": json.dumps([f"{host}/data:/data"])}
    assert load_config(environ=env).volumes == [f"{host}/data:/data:ro"]
    # As every list setting: words apart by commas or spaces too.
    words = {**base, "SANDBOX_KERNEL_VOLUMES": f"{host}/data:/data, {host}/cache:/cache:rw"}
    assert load_config(environ=words).volumes == [
        f"{host}/data:/data:ro",
        f"{host}/cache:/cache:rw",
    ]
    with pytest.raises(ConfigError) as caught:
        load_config(environ={**base, "SANDBOX_KERNEL_VOLUMES": f'["{host}/data:/data"'})
    assert "expected a JSON list" in str(caught.value) and "\n" not in str(caught.value)
    with pytest.raises(ConfigError) as caught:
        load_config(environ={**base, "SANDBOX_KERNEL_VOLUMES": f"{host}/data"})
    assert f"mapping '{host}/data' is not host_dir:sandbox_dir" in str(caught.value)
    # The administrator's file wins over the environment.
    config_dir = Path(os.environ["JUPYTER_CONFIG_DIR"])
    config_dir.mkdir(parents=True, exist_ok=True)
    pinned = {"SandboxConfig": {"volumes": [f"{host}/models:/models"]}}
    (config_dir / "sandbox_kernel_config.json").write_text(json.dumps(pinned))
    assert load_config(environ=env).volumes == [f"{host}/models:/models:ro"]


def test_a_work_folder_under_or_over_a_mapping_is_refused(host: Path) -> None:
    work = host / "project"
    (work / "data").mkdir(parents=True)
    given = (Volume(str(host / "data"), str(work / "data"), "ro"),)
    with pytest.raises(ValueError) as caught:
        check_work_folder(given, str(work))
    assert "overlaps your work folder" in str(caught.value)
    writable = (Volume(str(host), "/everything", "rw"),)
    with pytest.raises(ValueError) as caught:
        check_work_folder(writable, str(work))
    assert "is writable and shows your work folder" in str(caught.value)
    # Read-only and elsewhere: fine.
    check_work_folder((Volume(str(host), "/everything", "ro"),), str(work))
    check_work_folder(writable, "")


def test_a_kernel_in_a_clashing_work_folder_hears_it_in_one_line(host: Path) -> None:
    from sandbox_kernel.service import SandboxService

    work = host / "project"
    work.mkdir()
    cfg = settings(host, [f"{host}/data:{work}/data"], backend="local")
    service = SandboxService(cfg)
    with pytest.raises(SandboxFailed) as caught:
        service.spec("alice", work_folder=str(work))
    assert str(caught.value).startswith(f"mapping '{host}/data:{work}/data:ro'")
    assert "\n" not in str(caught.value)


def test_what_a_sandbox_records_and_old_ones_keep_their_hash(host: Path) -> None:
    plain = Spec(image="python:3.12-slim")
    old = {
        "image": "python:3.12-slim",
        "snapshot": "",
        "network": True,
        "shared": "",
        "runtime": "",
    }
    digest = hashlib.sha256(json.dumps(old, sort_keys=True).encode()).hexdigest()[:12]
    assert plain.fingerprint() == digest  # sandboxes made before mappings are not outdated
    mapped = Spec(image="python:3.12-slim", volumes=(Volume(str(host / "data"), "/data"),))
    assert mapped.fingerprint() != digest
    labels = sandbox_labels(ScopeKey("alice"), mapped, "i" * 12, "")
    assert json.loads(labels[LABEL_VOLUMES]) == [f"{host}/data:/data:ro"]
    assert volumes_of(labels) == mapped.volumes
    assert sandbox_labels(ScopeKey("alice"), plain, "i" * 12, "")[LABEL_VOLUMES] == ""
    assert volumes_of({LABEL_VOLUMES: "not json"}) == ()
    info = SandboxInfo(
        id="sk-alice",
        backend="docker",
        scope="user",
        user="alice",
        thread="",
        state="running",
        image="x",
        created=0.0,
        work_folder="/home/alice/project",
        volumes=[v.to_dict() for v in (*mapped.volumes, Volume(str(host / "cache"), "/c", "rw"))],
    )
    assert mapped_volumes(info)[0] == mapped.volumes[0]
    assert writable_host_folders(info) == ["/home/alice/project", "/c"]
    assert info.to_dict()["volumes"][1] == {
        "source": str(host / "cache"),
        "target": "/c",
        "mode": "rw",
        "kind": "host folder",
    }


def test_engines_say_what_they_cannot_mount(host: Path) -> None:
    from sandbox_kernel.backends.base import EngineSettings
    from sandbox_kernel.backends.daytona.mapped import check_mapped
    from sandbox_kernel.backends.docker import DockerBackend

    docker = DockerBackend(EngineSettings("i" * 12, str(host / "workspaces"), str(host / "state")))
    with pytest.raises(NotSupported) as caught:
        docker.check_volumes((Volume("corpora", "/data", "rw"),))
    assert "mounts host folders, not volumes by name" in str(caught.value)
    docker.check_volumes((Volume(str(host / "data"), "/data"),))
    for volume, said in [
        (Volume(str(host / "data"), "/data", "rw"), "cannot mount this host's folders"),
        (Volume("corpora", "/data", "ro"), "writable only"),
        (Volume("sk-ws-bob", "/bob", "rw"), "sandbox-kernel's own"),
    ]:
        with pytest.raises(NotSupported) as caught:
            check_mapped((volume,))
        assert said in str(caught.value) and f"mapping '{volume}'" in str(caught.value)
    check_mapped((Volume("corpora", "/data", "rw"),))


def test_parse_alone_refuses_what_is_not_text() -> None:
    with pytest.raises(ValueError):
        parse(42)


def test_a_server_that_is_not_root_has_the_engine_mount_what_host_tools_trust(
    host: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A root server mounts the protected paths of a writable mapping in the container's
    namespace at each start; one that is not root cannot, and hands them to the engine
    with the container: read-only, the folders on their way pinned (bound onto
    themselves). A read-only mapping needs none."""
    from sandbox_kernel.backends.base import EngineSettings
    from sandbox_kernel.backends.docker import mounts

    cache, data = host / "cache", host / "data"
    (cache / "repo" / ".git").mkdir(parents=True)
    (cache / "repo" / ".git" / "config").write_text("[core]\n")
    (data / ".bashrc").write_text("")
    settings = EngineSettings(
        "i" * 12,
        str(host / "workspaces"),
        str(host / "state"),
        protected_paths=(".git/config", ".bashrc"),
    )
    spec = Spec(volumes=(Volume(str(cache), "/cache", "rw"), Volume(str(data), "/data", "ro")))
    monkeypatch.setattr(mounts.os, "geteuid", lambda: 4242)
    made, label = mounts.WorkspaceMounts(settings).volumes(
        "sk-x--iiiiiiii", spec, 4242, 4242, "same-user"
    )
    assert [(m["Target"], m["Source"], m["ReadOnly"]) for m in made] == [
        ("/cache", str(cache), False),
        ("/cache/repo", str(cache / "repo"), False),
        ("/cache/repo/.git", str(cache / "repo" / ".git"), False),
        ("/cache/repo/.git/config", str(cache / "repo" / ".git" / "config"), True),
        ("/data", str(data), True),
    ]
    assert label == ""  # nothing idmapped: nothing to remake at a start
