"""Settings and identity: pure functions, no engine needed."""

from __future__ import annotations

from pathlib import Path

import pytest

from sandbox_kernel.config import ConfigError, load_config
from sandbox_kernel.identity import ScopeKey, notebook_thread, resolve_user, safe_id, scope_key
from sandbox_kernel.units import format_size

pytestmark = pytest.mark.fast


def test_defaults_and_env_override() -> None:
    cfg = load_config(environ={})
    assert (cfg.backend, cfg.scope, cfg.flavor, cfg.network) == ("auto", "user", "small", True)
    cfg = load_config(
        environ={
            "SANDBOX_KERNEL_BACKEND": "docker",
            "SANDBOX_KERNEL_SCOPE": "thread",
            "SANDBOX_KERNEL_IMAGE": "img:1",
            "SANDBOX_KERNEL_FLAVOR": "large",
            "SANDBOX_KERNEL_NETWORK": "false",
            "SANDBOX_KERNEL_PIDS_LIMIT": "64",
        }
    )
    assert (cfg.backend, cfg.scope, cfg.image, cfg.network, cfg.pids_limit) == (
        "docker",
        "thread",
        "img:1",
        False,
        64,
    )
    assert (cfg.cpus, cfg.memory) == (4.0, 4 << 30)


def test_config_file_then_env_wins(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    conf = tmp_path / "conf"
    conf.mkdir()
    (conf / "sandbox_kernel_config.py").write_text(
        "c.SandboxConfig.image = 'from-file:1'\nc.SandboxConfig.flavor = 'medium'\n"
    )
    monkeypatch.setenv("JUPYTER_CONFIG_DIR", str(conf))
    cfg = load_config(environ={})
    assert (cfg.image, cfg.flavor) == ("from-file:1", "medium")
    cfg = load_config(environ={"SANDBOX_KERNEL_IMAGE": "from-env:2"})
    assert (cfg.image, cfg.flavor) == ("from-env:2", "medium")


@pytest.mark.parametrize(
    ("env", "named"),
    [
        ({"SANDBOX_KERNEL_BACKEND": "podman"}, "SANDBOX_KERNEL_BACKEND"),
        ({"SANDBOX_KERNEL_SCOPE": "team"}, "SANDBOX_KERNEL_SCOPE"),
        ({"SANDBOX_KERNEL_PIDS_LIMIT": "-5"}, "SANDBOX_KERNEL_PIDS_LIMIT"),
        ({"SANDBOX_KERNEL_PIDS_LIMIT": "many"}, "SANDBOX_KERNEL_PIDS_LIMIT"),
        ({"SANDBOX_KERNEL_CELL_TIMEOUT": "-1"}, "SANDBOX_KERNEL_CELL_TIMEOUT"),
        ({"SANDBOX_KERNEL_SHARED_FOLDER": "/does/not/exist"}, "SANDBOX_KERNEL_SHARED_FOLDER"),
        ({"SANDBOX_KERNEL_NETWORK": "maybe"}, "SANDBOX_KERNEL_NETWORK"),
        ({"SANDBOX_KERNEL_FLAVOR": "huge"}, "SANDBOX_KERNEL_FLAVOR"),
        # Values that parse but would break things later, far from their cause.
        ({"SANDBOX_KERNEL_MAX_TOTAL_MEMORY": "inf"}, "SANDBOX_KERNEL_MAX_TOTAL_MEMORY"),
        ({"SANDBOX_KERNEL_MAX_TOTAL_MEMORY": "nan"}, "SANDBOX_KERNEL_MAX_TOTAL_MEMORY"),
        ({"SANDBOX_KERNEL_CELL_TIMEOUT": "1e309"}, "SANDBOX_KERNEL_CELL_TIMEOUT"),
        ({"SANDBOX_KERNEL_CELL_TIMEOUT": "nan"}, "SANDBOX_KERNEL_CELL_TIMEOUT"),
        ({"SANDBOX_KERNEL_START_TIMEOUT": "nan"}, "SANDBOX_KERNEL_START_TIMEOUT"),
        ({"SANDBOX_KERNEL_IDLE_STOP": "inf"}, "SANDBOX_KERNEL_IDLE_STOP"),
        ({"SANDBOX_KERNEL_PIDS_LIMIT": "1"}, "SANDBOX_KERNEL_PIDS_LIMIT"),
        ({"SANDBOX_KERNEL_RUNTIME": "run sc; rm"}, "SANDBOX_KERNEL_RUNTIME"),
        ({"SANDBOX_KERNEL_OUTPUT_LIMIT": "10 parsecs"}, "SANDBOX_KERNEL_OUTPUT_LIMIT"),
        ({"SANDBOX_KERNEL_WORKSPACE_ROOT": "relative/ws"}, "SANDBOX_KERNEL_WORKSPACE_ROOT"),
        ({"SANDBOX_KERNEL_STATE_DIR": "state"}, "SANDBOX_KERNEL_STATE_DIR"),
    ],
)
def test_bad_values_name_the_setting(env: dict[str, str], named: str) -> None:
    with pytest.raises(ConfigError) as err:
        load_config(environ=env)
    message = str(err.value)
    assert named in message
    assert "Traceback" not in message


def test_folders_that_cannot_be_made_name_the_setting(tmp_path: Path) -> None:
    blocker = tmp_path / "a-file"
    blocker.write_text("not a folder")
    for name in ("STATE_DIR", "WORKSPACE_ROOT"):
        with pytest.raises(ConfigError, match=f"SANDBOX_KERNEL_{name}.*cannot be created"):
            load_config(environ={f"SANDBOX_KERNEL_{name}": str(blocker / "below")})


def test_state_folder_is_private(tmp_path: Path) -> None:
    from sandbox_kernel.store import Store

    store = Store(load_config(environ={}, state_dir=str(tmp_path / "state")))
    store.touch("docker", "sk-x")
    assert (tmp_path / "state").stat().st_mode & 0o777 == 0o700
    assert (tmp_path / "state" / "state.sqlite").stat().st_mode & 0o777 == 0o600
    # A state folder made earlier with looser modes is tightened.
    (tmp_path / "old").mkdir(mode=0o755)
    (tmp_path / "old").chmod(0o755)
    Store(load_config(environ={}, state_dir=str(tmp_path / "old"))).touch("docker", "sk-x")
    assert (tmp_path / "old").stat().st_mode & 0o777 == 0o700


def test_unknown_setting_in_file(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    (tmp_path / "sandbox_kernel_config.json").write_text('{"SandboxConfig": {"imagee": "x"}}')
    monkeypatch.setenv("JUPYTER_CONFIG_DIR", str(tmp_path))
    with pytest.raises(ConfigError, match="imagee"):
        load_config(environ={})


def test_user_resolution_order(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("JUPYTERHUB_USER", "hubuser")
    assert resolve_user(load_config(environ={})) == "hubuser"
    assert resolve_user(load_config(environ={"SANDBOX_KERNEL_USER": "explicit"})) == "explicit"
    monkeypatch.setenv(
        "KERNEL_USERNAME", "gateway-user"
    )  # a kernel gateway's, or our provisioner's
    assert resolve_user(load_config(environ={})) == "gateway-user"
    monkeypatch.delenv("KERNEL_USERNAME")
    monkeypatch.delenv("JUPYTERHUB_USER")
    assert resolve_user(load_config(environ={})) not in ("", "hubuser")


def test_no_fallback_to_the_servers_user_with_several_users(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Started by a server with several users but told no user (a kernelspec without our
    provisioner, a host terminal): refuse rather than share the server user's sandbox."""
    monkeypatch.setenv("SANDBOX_KERNEL_OWNER_FROM", "request")
    with pytest.raises(ConfigError, match="every user their own sandbox"):
        resolve_user(load_config(environ={}))
    assert resolve_user(load_config(environ={"SANDBOX_KERNEL_USER": "ann"})) == "ann"
    monkeypatch.setenv("KERNEL_USERNAME", "bea")
    assert resolve_user(load_config(environ={})) == "bea"


def test_thread_resolution(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    cfg = load_config(environ={"SANDBOX_KERNEL_SCOPE": "thread", "SANDBOX_KERNEL_USER": "ann"})
    assert scope_key(cfg, kernel_id="k1") == ScopeKey("ann", "thread", "k1")
    nb = tmp_path / "a.ipynb"
    nb.write_text('{"metadata": {}, "cells": [], "nbformat": 4, "nbformat_minor": 5}')
    monkeypatch.setenv("JPY_SESSION_NAME", str(nb))
    by_path = scope_key(cfg, kernel_id="k1")
    assert by_path.thread == str(nb.resolve())
    # A notebook that carries its own id keeps it across a rename.
    nb.write_text(
        '{"metadata": {"sandbox": {"thread": "nb-42"}}, "cells": [], "nbformat": 4, "nbformat_minor": 5}'
    )
    moved = nb.rename(tmp_path / "renamed.ipynb")
    monkeypatch.setenv("JPY_SESSION_NAME", str(moved))
    assert scope_key(cfg).thread == "nb-42"
    assert notebook_thread(None) is None
    explicit = load_config(
        environ={
            "SANDBOX_KERNEL_SCOPE": "thread",
            "SANDBOX_KERNEL_THREAD": "t1",
            "SANDBOX_KERNEL_USER": "ann",
        }
    )
    assert scope_key(explicit).thread == "t1"


def test_safe_ids_are_stable_safe_and_distinct() -> None:
    import re

    names = [
        "alice",
        "Alice",
        "alice smith",
        "alice/smith",
        "alice--smith",
        "ålice",
        "アリス",
        "a" * 300,
        "a" * 301,
        "../etc",
        "alice.",
        "x--0123456789ab",
        "",
    ]
    ids = [safe_id(n) for n in names]
    assert len(set(ids)) == len(ids)
    for i in ids:
        assert re.fullmatch(r"[a-z0-9][a-z0-9_.-]*", i), i
        assert len(i) <= 40
    assert safe_id("alice") == "alice" == safe_id("alice")
    assert safe_id("Alice Smith") == safe_id("Alice Smith")


def test_scope_names_never_collide() -> None:
    long_path = "/home/u/" + "deep/" * 200 + "notebook.ipynb"
    keys = [
        ScopeKey("alice"),
        ScopeKey("bob"),
        ScopeKey("alice", "thread", "/n/a.ipynb"),
        ScopeKey("alice", "thread", "/n/b.ipynb"),
        ScopeKey("bob", "thread", "/n/a.ipynb"),
        ScopeKey("alice", "thread", long_path),
    ]
    names = [k.name for k in keys]
    assert len(set(names)) == len(names)
    assert all(len(n) < 64 for n in names)
    assert ScopeKey("alice", "thread", "/n/a.ipynb").user_id == ScopeKey("alice").user_id


@pytest.mark.parametrize(
    ("env", "says"),
    [
        ({"SANDBOX_KERNEL_START_TIMEOUT": "abc"}, "expected a number of seconds, e.g. 300"),
        ({"SANDBOX_KERNEL_IDLE_STOP": "soon"}, "expected a number of minutes, e.g. 15"),
        (
            {"SANDBOX_KERNEL_OUTPUT_LIMIT": "lots"},
            "write e.g. 10 MB, 512 MiB, 64g or a number of bytes",
        ),
        (
            {"SANDBOX_KERNEL_WORKSPACE_ROOT": "ws"},
            "'ws' is not an absolute folder; write its full path",
        ),
    ],
)
def test_bad_values_say_what_to_write(env: dict[str, str], says: str) -> None:
    with pytest.raises(ConfigError) as err:
        load_config(environ=env)
    assert says in str(err.value) and len(str(err.value).splitlines()) == 1


@pytest.mark.parametrize(
    ("text", "size"),
    [
        ("10 MB", 10_000_000),
        ("10MB", 10_000_000),
        ("1.5 GiB", 3 << 29),
        ("512m", 512 << 20),
        ("10_000_000", 10_000_000),
        ("2kb", 2000),
        ("64g", 64 << 30),
    ],
)
def test_output_limit_takes_sizes_with_units(text: str, size: int) -> None:
    """The manual writes "10 MB": that, Docker's letters and plain bytes all work."""
    assert load_config(environ={"SANDBOX_KERNEL_OUTPUT_LIMIT": text}).output_limit == size


def test_output_limit_size_in_a_config_file(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    (tmp_path / "sandbox_kernel_config.json").write_text(
        '{"SandboxConfig": {"output_limit": "2 MB"}}'
    )
    monkeypatch.setenv("JUPYTER_CONFIG_DIR", str(tmp_path))
    assert load_config(environ={}).output_limit == 2_000_000


def test_a_misspelt_variable_is_named_with_its_likely_meaning(
    caplog: pytest.LogCaptureFixture,
) -> None:
    with caplog.at_level("WARNING", logger="sandbox_kernel"):
        cfg = load_config(
            environ={
                "SANDBOX_KERNEL_FLAVR": "large",
                "SANDBOX_KERNEL_TEST_IMAGE": "x",
                "SANDBOX_KERNEL_SERVER_ROOT": "/srv",
            }
        )
    assert cfg.flavor == "small"
    assert [r.getMessage() for r in caplog.records] == [
        "ignoring SANDBOX_KERNEL_FLAVR: no such setting; did you mean SANDBOX_KERNEL_FLAVOR?"
    ]


@pytest.mark.parametrize(
    ("size", "text"),
    [
        (0, "0 B"),
        (1023, "1023 B"),
        (1536, "1.5 KiB"),
        (512 << 20, "512 MiB"),
        (1 << 30, "1 GiB"),
        (3 << 29, "1.5 GiB"),
        (12 << 30, "12 GiB"),
        (-5, "0 B"),
        (5 << 40, "5 TiB"),
    ],
)
def test_sizes_read_the_same_everywhere(size: int, text: str) -> None:
    assert format_size(size) == text


# -- the kernel's early start: which kernel a command line launches -----------------------


@pytest.mark.parametrize(
    ("argv", "expected"),
    [
        (["-f", "/run/jupyter/kernel-1a2b.json"], "/run/jupyter/kernel-1a2b.json"),
        (["-f=/x/kernel-9.json"], "/x/kernel-9.json"),
        (["--debug", "--f=/x/kernel-9.json"], "/x/kernel-9.json"),
        (["-f", "/a/kernel-1.json", "-f", "/b/kernel-2.json"], "/b/kernel-2.json"),  # the last
        (["install"], None),
        (["-f"], None),  # no file after the flag: no kernel to start for
    ],
)
def test_the_connection_file_is_read_from_the_command_line(
    argv: list[str], expected: str | None
) -> None:
    from sandbox_kernel.early_start import connection_file_of

    assert connection_file_of(argv) == expected


def test_the_kernel_id_is_the_one_jupyter_named_the_file_after() -> None:
    from sandbox_kernel.early_start import kernel_id_of

    assert kernel_id_of("/r/kernel-5f3c-11.json") == "5f3c-11"
    assert kernel_id_of("/tmp/tmpab12.json") is None  # a launcher's own name: no id


def test_a_start_begun_for_another_kernel_is_ended_not_taken(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """When the kernel reads another id than the command line gave (a launcher this
    reading misses), what was begun is ended and its records go, never reused under
    the wrong kernel id."""
    from sandbox_kernel import early_start

    monkeypatch.setenv("SANDBOX_KERNEL_BACKEND", "nonesuch")  # a setup error: no sandbox sought
    monkeypatch.setenv("SANDBOX_KERNEL_STATE_DIR", str(tmp_path))
    begun = early_start.EarlyStart("kernel-a")
    ended: list[str] = []
    monkeypatch.setattr(begun, "abandon", lambda: ended.append("a"))
    monkeypatch.setattr(early_start, "_pending", [begun])
    taken = early_start.take("kernel-b")
    assert ended == ["a"] and taken is not begun and taken.kernel_id == "kernel-b"
    assert "nonesuch" in taken.error and early_start._pending == []
    with pytest.raises(Exception, match="nonesuch"):
        taken.agent.result(timeout=10)


def test_the_sandbox_is_sought_before_asyncio_or_package_metadata_is_imported() -> None:
    """What ``python -m sandbox_kernel`` imports before it begins seeking the sandbox is
    on the path of every start with no sandbox yet; asyncio and importlib.metadata
    (about 50 ms together) are needed only later, by which time Jupyter's own imports,
    running meanwhile, have brought them in. The version is still there when asked."""
    import subprocess
    import sys

    code = (
        "import sys; import sandbox_kernel.early_start; "
        "print(sorted(m for m in ('asyncio', 'importlib.metadata', 'docker') if m in sys.modules)); "
        "import sandbox_kernel; print(sandbox_kernel.__version__ != '')"
    )
    out = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, check=True
    ).stdout.split("\n")
    assert out[:2] == ["[]", "True"]


def test_built_in_flavors_have_disk_sizes() -> None:
    cfg = load_config(environ={})
    assert {name: cfg.flavors[name]["disk"] for name in ("small", "medium", "large")} == {
        "small": 10 << 30,
        "medium": 20 << 30,
        "large": 40 << 30,
    }
    assert (cfg.cpus, cfg.memory, cfg.disk) == (1.0, 1 << 30, 10 << 30)


def test_administrators_flavors_add_to_the_built_in_ones(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """c.SandboxConfig.flavors is policy: a user picks among its names, and an environment
    variable can neither replace the table nor add to it."""
    conf = tmp_path / "conf"
    conf.mkdir()
    (conf / "sandbox_kernel_config.py").write_text(
        "c.SandboxConfig.flavors = {\n"
        "    'gpu': {'cpus': 8, 'memory': '32G', 'disk': '100G'},\n"
        "    'small': {'cpus': 0.5, 'memory': '512M', 'disk': '2G'},\n"
        "}\n"
    )
    monkeypatch.setenv("JUPYTER_CONFIG_DIR", str(conf))
    cfg = load_config(environ={"SANDBOX_KERNEL_FLAVOR": "gpu"})
    assert (cfg.cpus, cfg.memory, cfg.disk) == (8.0, 32 << 30, 100 << 30)
    assert sorted(cfg.flavors) == ["gpu", "large", "medium", "small"]
    small = load_config(environ={})
    assert (small.cpus, small.memory, small.disk) == (0.5, 512 << 20, 2 << 30)
    mine = '{"mine": {"cpus": 64, "memory": "256G", "disk": "10T"}}'
    cfg = load_config(environ={"SANDBOX_KERNEL_FLAVORS": mine})
    assert "mine" not in cfg.flavors
    with pytest.raises(ConfigError, match="unknown flavor 'mine'.*gpu, large, medium, small"):
        load_config(environ={"SANDBOX_KERNEL_FLAVORS": mine, "SANDBOX_KERNEL_FLAVOR": "mine"})


@pytest.mark.parametrize(
    ("table", "says"),
    [
        (
            {"tiny": {"cpus": 1, "memory": "1G"}},
            "flavor 'tiny' has no 'disk': give cpus, memory and disk",
        ),
        (
            {"tiny": {"cpus": 1, "memory": "1G", "disk": "1G", "gpus": 1}},
            "flavor 'tiny' has unknown key 'gpus'",
        ),
        (
            {"tiny": {"cpus": 0, "memory": "1G", "disk": "1G"}},
            "flavor 'tiny': cpus must be a number above 0",
        ),
        (
            {"tiny": {"cpus": "many", "memory": "1G", "disk": "1G"}},
            "flavor 'tiny': cpus 'many' is not a number",
        ),
        (
            {"tiny": {"cpus": 1, "memory": "lots", "disk": "1G"}},
            "flavor 'tiny': memory 'lots' is not a size",
        ),
        (
            {"tiny": {"cpus": 1, "memory": "1G", "disk": "1M"}},
            "flavor 'tiny': disk '1M' is too small",
        ),
        (
            {"tiny": {"cpus": 1, "memory": "1G", "disk": True}},
            "flavor 'tiny': disk True is not a size",
        ),
        ({"tiny": "large"}, "flavor 'tiny' must be a table like"),
        (
            {"no/slash": {"cpus": 1, "memory": "1G", "disk": "1G"}},
            "flavor 'no/slash' is not a flavor name",
        ),
    ],
)
def test_a_bad_flavor_table_names_the_entry(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, table: dict[str, object], says: str
) -> None:
    conf = tmp_path / "conf"
    conf.mkdir()
    (conf / "sandbox_kernel_config.py").write_text(f"c.SandboxConfig.flavors = {table!r}\n")
    monkeypatch.setenv("JUPYTER_CONFIG_DIR", str(conf))
    with pytest.raises(ConfigError) as caught:
        load_config(environ={})
    message = str(caught.value)
    assert message.startswith("bad value for c.SandboxConfig.flavors: ") and says in message
    assert "\n" not in message


def test_flavors_in_the_environment_are_json(tmp_path: Path) -> None:
    cfg = load_config(
        environ={
            "SANDBOX_KERNEL_FLAVORS": '{"tiny": {"cpus": 0.5, "memory": "256M", "disk": "1G"}}',
            "SANDBOX_KERNEL_FLAVOR": "tiny",
        }
    )
    assert (cfg.cpus, cfg.memory, cfg.disk) == (0.5, 256 << 20, 1 << 30)
    with pytest.raises(ConfigError, match="SANDBOX_KERNEL_FLAVORS: expected a JSON table"):
        load_config(environ={"SANDBOX_KERNEL_FLAVORS": "tiny=1"})


@pytest.mark.parametrize(
    ("settings", "copies"),
    [
        ({"SANDBOX_KERNEL_BACKEND": "docker"}, False),
        ({"SANDBOX_KERNEL_BACKEND": "local"}, False),
        ({"SANDBOX_KERNEL_BACKEND": "daytona"}, True),
        ({"SANDBOX_KERNEL_BACKEND": "kubernetes"}, True),
        ({"SANDBOX_KERNEL_BACKEND": "daytona", "SANDBOX_KERNEL_WORK_ROOT": "none"}, False),
        ({"SANDBOX_KERNEL_BACKEND": "no-such-engine"}, False),
    ],
)
def test_only_a_kernel_that_copies_its_folder_gets_the_long_shutdown(
    settings: dict[str, str], copies: bool
) -> None:
    """A kernel on a backend without host folders copies its notebook's folder back as
    it shuts down, and is given the provisioner's shutdown_wait for it; every other
    kernel keeps the client's own wait (a kernel that hangs is stopped as soon as before)."""
    from sandbox_kernel.provisioner import SandboxProvisioner, copies_folder

    env = {"HOME": "/nonexistent", **settings}
    assert copies_folder(env) is copies
    provisioner = SandboxProvisioner(kernel_id="k", kernel_spec=None)
    provisioner._copies_folder = copies_folder(env)
    assert provisioner.get_shutdown_wait_time(5.0) == (60.0 if copies else 5.0)
