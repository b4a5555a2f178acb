"""A newcomer's first hour, the parts that need no engine: settings for what sandboxes
inherit (certificates, proxy and index variables), the account and profile a new
container gets, the uninstaller's care with mounts, the CLI's version and the `[lab]`
extra. The engine-bound side is in test_first_hour.py and test_trust.py."""

from __future__ import annotations

import io
import os
import subprocess
import sys
import tarfile
import time
from pathlib import Path

import pytest

from sandbox_kernel import trust
from sandbox_kernel.backends.docker.accounts import (
    PROFILE,
    from_archive,
    from_layers,
    root_files,
    with_group,
    with_user,
)
from sandbox_kernel.cleanup import remove_tree
from sandbox_kernel.config import ConfigError, load_config
from sandbox_kernel.doctor import registry_of
from sandbox_kernel.trust import passed_env

pytestmark = pytest.mark.fast

ROOT = Path(__file__).resolve().parent.parent
PEM = "-----BEGIN CERTIFICATE-----\nMIIB\n-----END CERTIFICATE-----\n"


def test_pass_env_passes_public_settings_and_a_credential_only_on_purpose(
    tmp_path: Path, caplog: pytest.LogCaptureFixture, monkeypatch: pytest.MonkeyPatch
) -> None:
    host = {
        "HTTPS_PROXY": "http://proxy.example:3128",
        "PIP_INDEX_URL": "https://user:s3cret@index.example/simple/",
        "PIP_CERT": "/etc/ssl/host-only.pem",  # a host path: never a default
        "SECRET_TOKEN": "t0ken",
    }
    cfg = load_config(environ={})
    assert passed_env(cfg, host) == {"HTTPS_PROXY": "http://proxy.example:3128"}
    assert "not passing PIP_INDEX_URL" in caplog.text and "s3cret" not in caplog.text
    # Named on purpose (an administrator's file, or the environment where it is not one):
    # passed as they are, the credential included.
    cfg = load_config(environ={"SANDBOX_KERNEL_PASS_ENV": "PIP_INDEX_URL, SECRET_TOKEN"})
    assert passed_env(cfg, host) == {
        "PIP_INDEX_URL": "https://user:s3cret@index.example/simple/",
        "SECRET_TOKEN": "t0ken",
    }
    conf = tmp_path / "conf"
    conf.mkdir()
    (conf / "sandbox_kernel_config.py").write_text("c.SandboxConfig.pass_env = ['HTTPS_PROXY']\n")
    monkeypatch.setenv("JUPYTER_CONFIG_DIR", str(conf))
    cfg = load_config(environ={"SANDBOX_KERNEL_PASS_ENV": "SECRET_TOKEN"})  # policy: ignored
    assert passed_env(cfg, host) == {"HTTPS_PROXY": "http://proxy.example:3128"}


@pytest.mark.parametrize(
    ("value", "says"),
    [
        ("PATH", "not passed to sandboxes"),
        ("LD_PRELOAD", "not passed to sandboxes"),
        ("PYTHONPATH", "not passed to sandboxes"),
        ("NO-DASHES", "not an environment variable name"),
    ],
)
def test_pass_env_refuses_what_sandboxes_set_themselves(value: str, says: str) -> None:
    with pytest.raises(ConfigError) as err:
        load_config(environ={"SANDBOX_KERNEL_PASS_ENV": value})
    assert "SANDBOX_KERNEL_PASS_ENV" in str(err.value) and says in str(err.value)


def test_ca_bundle_setting(tmp_path: Path) -> None:
    good = tmp_path / "corp.pem"
    good.write_text(PEM)
    assert load_config(environ={"SANDBOX_KERNEL_CA_BUNDLE": str(good)}).ca_bundle == str(good)
    assert load_config(environ={"SANDBOX_KERNEL_CA_BUNDLE": "none"}).ca_bundle == "none"
    bad = tmp_path / "notes.txt"
    bad.write_text("hello")
    for value, says in (
        (str(bad), "is not a file of PEM certificates"),
        (str(tmp_path / "missing.pem"), "cannot read"),
        ("corp.pem", "not an absolute path"),
    ):
        with pytest.raises(ConfigError) as err:
            load_config(environ={"SANDBOX_KERNEL_CA_BUNDLE": value})
        assert "SANDBOX_KERNEL_CA_BUNDLE" in str(err.value) and says in str(err.value)


def test_the_bundle_is_the_hosts_store_plus_the_setting(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    store = tmp_path / "store.pem"
    store.write_text(PEM.replace("MIIB", "HOST"))
    monkeypatch.setenv("SSL_CERT_FILE", str(store))
    extra = tmp_path / "corp.pem"
    extra.write_text(PEM.replace("MIIB", "CORP"))
    assert trust.bundle("").count(b"BEGIN CERTIFICATE") == 1
    both = trust.bundle(str(extra))
    assert b"HOST" in both and b"CORP" in both
    assert trust.bundle("none") == b""
    folder = trust.write_bundle(str(tmp_path / "state"), str(extra))
    assert folder is not None
    written = folder / trust.BUNDLE
    assert written.read_bytes() == both and oct(written.stat().st_mode & 0o777) == "0o644"
    assert os.listdir(folder) == [trust.BUNDLE]  # all that sandboxes see of the state folder
    inode = written.stat().st_ino
    trust.write_bundle(str(tmp_path / "state"), "")  # another setting: replaced whole
    assert b"CORP" not in written.read_bytes() and written.stat().st_ino != inode
    assert trust.write_bundle(str(tmp_path / "other"), "none") is None
    assert set(trust.trust_env()) == {"SSL_CERT_FILE", "NODE_EXTRA_CA_CERTS"}
    assert set(trust.named_env()) == {
        "PIP_CERT",
        "REQUESTS_CA_BUNDLE",
        "CURL_CA_BUNDLE",
        "GIT_SSL_CAINFO",
    }


def test_a_flavor_is_asked_only_when_someone_says_it() -> None:
    assert "flavor" not in load_config(environ={}).asked
    assert "flavor" in load_config(environ={"SANDBOX_KERNEL_FLAVOR": "large"}).asked
    assert "flavor" in load_config(environ={}, flavor="medium").asked


def test_an_account_for_the_sandbox_user_only_when_the_image_lacks_one() -> None:
    passwd = b"root:x:0:0:root:/root:/bin/bash\nnobody:x:65534:65534::/nonexistent:/bin/false\n"
    added = with_user(passwd, 1000, 1000)
    assert added is not None and added.startswith(passwd)
    assert added.endswith(b"sandbox:x:1000:1000:sandbox user:/home/sandbox:/bin/sh\n")
    assert with_user(added, 1000, 1000) is None  # made again (a half-made container): once
    taken = passwd + b"sandbox:x:1001:1001::/home/sandbox:/bin/sh\n"
    assert b"sandbox1000:x:1000:" in (with_user(taken, 1000, 1000) or b"")
    assert with_group(b"root:x:0:\n", 1000) == b"root:x:0:\nsandbox:x:1000:\n"
    assert with_group(b"root:x:0:\nstaff:x:1000:\n", 1000) is None
    files = dict((p, d) for p, d, _ in root_files(1000, 1000, lambda _p: None, ca=b"CA"))
    assert files["etc/profile.d/sandbox-kernel.sh"] == PROFILE
    assert "etc/passwd" not in files  # no passwd, or not a plain file: left alone
    assert files["etc/sandbox-kernel/trust/ca-certificates.crt"] == b"CA"


def test_the_profile_puts_local_bin_first_once(tmp_path: Path) -> None:
    script = tmp_path / "profile.sh"
    script.write_bytes(PROFILE)
    for start in ("/usr/bin:/bin", f"{tmp_path}/.local/bin:/usr/bin"):
        done = subprocess.run(
            ["sh", "-c", f'. {script}; echo "$PATH"'],
            env={"HOME": str(tmp_path), "PATH": start},
            capture_output=True,
            text=True,
            check=True,
        )
        assert done.stdout.strip() == f"{tmp_path}/.local/bin:/usr/bin" + (
            ":/bin" if start == "/usr/bin:/bin" else ""
        )


def test_image_files_are_read_as_overlayfs_shows_them(tmp_path: Path) -> None:
    top, middle, bottom = (tmp_path / n for n in ("top", "middle", "bottom"))
    for layer in (top, middle, bottom):
        (layer / "etc").mkdir(parents=True)
    (bottom / "etc" / "passwd").write_text("old\n")
    (middle / "etc" / "passwd").write_text("new\n")
    (bottom / "etc" / "group").write_text("group\n")
    (top / "etc" / "group").symlink_to("/etc/shadow")  # never followed
    read = from_layers({"Data": {"LowerDir": f"{top}:{middle}:{bottom}"}})
    assert read("etc/passwd") == b"new\n"
    assert read("etc/group") is None
    assert read("etc/missing") is None
    os.mknod(middle / "etc" / "hosts", 0o600 | 0o020000, os.makedev(0, 0))  # a whiteout
    (bottom / "etc" / "hosts").write_text("hidden\n")
    assert read("etc/hosts") is None


def test_image_files_from_the_engines_archive() -> None:
    def tar_of(**members: bytes) -> bytes:
        buf = io.BytesIO()
        with tarfile.open(fileobj=buf, mode="w") as tar:
            for name, data in members.items():
                entry = tarfile.TarInfo(name)
                entry.size = len(data)
                tar.addfile(entry, io.BytesIO(data))
        return buf.getvalue()

    assert (
        from_archive(tar_of(passwd=b"root:x:0:0::/root:/bin/sh\n"))
        == b"root:x:0:0::/root:/bin/sh\n"
    )
    assert from_archive(tar_of(a=b"1", b=b"2")) is None
    assert from_archive(b"not a tar") is None
    link = io.BytesIO()
    with tarfile.open(fileobj=link, mode="w") as tar:
        entry = tarfile.TarInfo("passwd")
        entry.type, entry.linkname = tarfile.SYMTYPE, "/elsewhere"
        tar.addfile(entry)
    assert from_archive(link.getvalue()) is None


def test_the_uninstaller_never_goes_into_a_mount_or_what_it_keeps(tmp_path: Path) -> None:
    state = tmp_path / "state"
    (state / "workspaces" / "alice").mkdir(parents=True)
    (state / "workspaces" / "alice" / "notes.txt").write_text("mine")
    (state / "mounts" / "sk-alice" / "workspace").mkdir(parents=True)
    (state / "mounts" / "sk-alice" / "workspace" / "data.csv").write_text("mounted")
    (state / "state.sqlite").write_text("")
    (state / "link").symlink_to(tmp_path / "outside")
    (tmp_path / "outside").mkdir()
    (tmp_path / "outside" / "keep.txt").write_text("outside")
    mounted = str(state / "mounts" / "sk-alice" / "workspace")
    left = remove_tree(state, {str(state / "workspaces")}, {mounted})
    assert sorted(left) == sorted([str(state / "workspaces"), mounted])
    assert (state / "workspaces" / "alice" / "notes.txt").read_text() == "mine"
    assert (Path(mounted) / "data.csv").read_text() == "mounted"
    assert not (state / "state.sqlite").exists() and not (state / "link").is_symlink()
    assert (tmp_path / "outside" / "keep.txt").exists()


def test_where_an_image_would_come_from() -> None:
    assert registry_of("python:3.12-slim") == "Docker Hub (docker.io)"
    assert registry_of("jupyter/scipy-notebook") == "Docker Hub (docker.io)"
    assert registry_of("registry.corp.example/team/py:3") == "registry.corp.example"
    assert registry_of("localhost:5000/py") == "localhost:5000"


def test_version_and_the_lab_extra() -> None:
    done = subprocess.run(
        [sys.executable, "-I", "-m", "sandbox_kernel.cli", "--version"],
        capture_output=True,
        text=True,
        cwd="/",
    )
    assert done.returncode == 0 and done.stdout.startswith("sandbox-kernel "), done.stderr
    tomllib = pytest.importorskip("tomllib")
    extras = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"][
        "optional-dependencies"
    ]
    assert any(req.startswith("jupyterlab") for req in extras["lab"])


def test_a_sandboxs_log_keeps_its_newest_lines_for_a_month(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from sandbox_kernel import store as store_module

    monkeypatch.setattr(store_module, "EVENTS_KEPT", 5)  # 500 in use: the same rule
    store = store_module.Store(load_config(environ={}, state_dir=str(tmp_path / "state")))
    for n in range(8):
        store.add_event("docker", "sk-alice", f"line {n}")
    store.add_event("docker", "sk-bob", "other")
    lines = [line for _, line in store.events("docker", "sk-alice")]
    assert lines == [f"line {n}" for n in range(3, 8)]
    store.forget_events(before=time.time() + 1)
    assert store.events("docker", "sk-alice") == [] == store.events("docker", "sk-bob")
