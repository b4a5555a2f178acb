"""Building and installing from source, as a newcomer does it: one version, and one line
(not a yarn traceback) when Node.js is missing; and the kernelspecs ``sandbox-kernel
install`` writes. No engine needed."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

import sandbox_kernel

from .conftest import TEST_IMAGE

ROOT = Path(__file__).resolve().parent.parent


def _fake_node(folder: Path, version: str) -> Path:
    folder.mkdir(parents=True, exist_ok=True)
    node = folder / "node"
    node.write_text(f"#!/bin/sh\necho {version}\n")
    node.chmod(0o755)
    return folder


@pytest.mark.fast
def test_one_version() -> None:
    """The package, its metadata and the lab extension say the same version."""
    npm = json.loads((ROOT / "labextension" / "package.json").read_text())["version"]
    assert sandbox_kernel.__version__ == npm
    assert 'dynamic = ["version"]' in (ROOT / "pyproject.toml").read_text()


@pytest.mark.fast
@pytest.mark.parametrize(
    ("node_version", "expected"),
    [(None, "`node` is not on PATH"), ("v12.22.9", "is v12.22.9"), ("v20.11.1", None)],
)
def test_node_check(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, node_version: str | None, expected: str | None
) -> None:
    sys.path.insert(0, str(ROOT))
    try:
        from hatch_build import node_problem
    finally:
        sys.path.remove(str(ROOT))
    bin_dir = _fake_node(tmp_path / "bin", node_version) if node_version else tmp_path / "empty"
    bin_dir.mkdir(exist_ok=True)
    monkeypatch.setenv("PATH", str(bin_dir))
    source = tmp_path / "src"
    source.mkdir()
    problem = node_problem(source)
    if expected is None:
        assert problem is None
    else:
        assert problem is not None and expected in problem and "Node.js 18 or newer" in problem
    # A tree whose panel is built needs no node at all.
    built = source / "jupyter_ext" / "labextension" / "static"
    built.mkdir(parents=True)
    (built / "style.js").write_text("")
    assert node_problem(source) is None


def _clean_copy(dest: Path, with_built_panel: bool = False) -> Path:
    """The sources as a fresh clone has them (optionally with the panel already built,
    which saves a node build): nothing of a developer's tree besides."""
    tracked = subprocess.run(
        ["git", "ls-files"], cwd=ROOT, capture_output=True, text=True, check=True
    ).stdout.split()
    for name in tracked:
        if (ROOT / name).is_file():
            (dest / name).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(ROOT / name, dest / name)
    built = ROOT / "jupyter_ext" / "labextension"
    if with_built_panel and (built / "static" / "style.js").exists():
        shutil.copytree(
            built,
            dest / "jupyter_ext" / "labextension",
            ignore=shutil.ignore_patterns("install.json", "build_log.json"),
        )
    return dest


def _pip_wheel(source: Path, out: Path, env: dict[str, str]) -> subprocess.CompletedProcess[str]:
    """`pip wheel` of ``source`` with this environment's build tools (no isolation)."""
    return subprocess.run(
        [
            sys.executable,
            "-m",
            "pip",
            "wheel",
            "--no-build-isolation",
            "--no-deps",
            "-w",
            str(out),
            str(source),
        ],
        capture_output=True,
        text=True,
        env=env,
        timeout=600,
    )


def test_pip_install_without_node_says_so_in_one_line(tmp_path: Path) -> None:
    """The real build (pip, hatchling, the jupyter-builder hook) on a clean copy of the
    sources, with no `node` on PATH: the failure names Node.js and no traceback shows."""
    source = _clean_copy(tmp_path / "src")
    no_node = tmp_path / "bin"
    no_node.mkdir()
    env = {k: v for k, v in os.environ.items() if not k.startswith(("PIP_", "VIRTUAL_ENV"))}
    env["PATH"] = str(no_node)
    done = _pip_wheel(source, tmp_path / "out", env)
    output = done.stdout + done.stderr
    assert done.returncode != 0
    assert "needs Node.js 18 or newer" in output and "apt-get install nodejs" in output, output
    assert "Traceback" not in output, output


def test_wheel_ships_what_an_installation_needs(tmp_path: Path) -> None:
    """The wheel as pip builds it: the kernelspec with its logos, the server extension's
    config, the built panel with its settings schema, the programs sent into sandboxes."""
    import zipfile

    env = {
        **os.environ,
        "PATH": f"{Path(sys.executable).parent}{os.pathsep}{os.environ.get('PATH', '')}",
    }
    done = _pip_wheel(_clean_copy(tmp_path / "src", with_built_panel=True), tmp_path, env)
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-2000:]
    (wheel,) = tmp_path.glob("sandbox_kernel-*.whl")
    assert wheel.name.startswith(f"sandbox_kernel-{sandbox_kernel.__version__}-")
    names = set(zipfile.ZipFile(wheel).namelist())
    data = f"sandbox_kernel-{sandbox_kernel.__version__}.data/data/share/jupyter"
    for needed in [
        f"{data}/kernels/sandbox/kernel.json",
        f"{data}/kernels/sandbox/logo-32x32.png",
        f"{data}/kernels/sandbox/logo-64x64.png",
        f"{data}/kernels/sandbox/logo-svg.svg",
        f"{data}/labextensions/sandbox-kernel-labextension/package.json",
        f"{data}/labextensions/sandbox-kernel-labextension/install.json",
        "sandbox_kernel/agent/start.py",
        "sandbox_kernel/agent/boot.py",
        "sandbox_kernel/resources/logo-64x64.png",
    ]:
        assert needed in names, needed
    assert any(
        n.startswith(f"{data}/labextensions/sandbox-kernel-labextension/static/") for n in names
    )
    assert any(n.endswith("jupyter_server_config.d/jupyter_ext.json") for n in names)


def test_install_kernelspec_variant(tmp_path: Path) -> None:
    done = subprocess.run(
        [
            sys.executable,
            "-m",
            "sandbox_kernel.cli",
            "install",
            "--prefix",
            str(tmp_path),
            "--name",
            "sandbox-big",
            "--display-name",
            "Python 3 (sandbox, large)",
            "--flavor",
            "large",
            "--scope",
            "thread",
            "--image",
            TEST_IMAGE,
        ],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert done.returncode == 0, done.stderr
    installed = tmp_path / "share" / "jupyter" / "kernels" / "sandbox-big"
    spec = json.loads((installed / "kernel.json").read_text())
    assert spec["display_name"] == "Python 3 (sandbox, large)"
    assert sorted(p.name for p in installed.glob("logo-*")) == [
        "logo-32x32.png",
        "logo-64x64.png",
        "logo-svg.svg",
    ]
    assert spec["interrupt_mode"] == "message"
    # This venv holds the package: the kernel starts isolated (no user site, no
    # PYTHON* variables, no working folder on its import path).
    assert spec["argv"] == [sys.executable, "-I", "-m", "sandbox_kernel", "-f", "{connection_file}"]
    # Another image: the variant's sandboxes are its own (a flavor alone would resize).
    assert spec["env"] == {
        "PYTHONSAFEPATH": "1",  # the notebook's folder stays off the kernel's import path
        "SANDBOX_KERNEL_FLAVOR": "large",
        "SANDBOX_KERNEL_SCOPE": "thread",
        "SANDBOX_KERNEL_IMAGE": TEST_IMAGE,
        "SANDBOX_KERNEL_VARIANT": "sandbox-big",
    }
    bad = subprocess.run(
        [
            sys.executable,
            "-m",
            "sandbox_kernel.cli",
            "install",
            "--prefix",
            str(tmp_path),
            "--scope",
            "team",
        ],
        capture_output=True,
        text=True,
    )
    assert bad.returncode == 2 and "invalid choice" in bad.stderr


def test_install_leaves_out_isolation_a_python_cannot_start_with(tmp_path: Path) -> None:
    """An interpreter that finds the package only on PYTHONPATH (or in a user site) would
    not start under -I: its kernelspec says -P instead (3.11+), and still starts the kernel."""
    bare = tmp_path / "bare"
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(bare)], check=True)
    python = str(bare / "bin" / "python")
    here = [p for p in sys.path if p.endswith("site-packages")]
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(Path(__file__).parents[1]), *here])}
    done = subprocess.run(
        [python, "-m", "sandbox_kernel.cli", "install", "--prefix", str(tmp_path / "p")],
        capture_output=True,
        text=True,
        timeout=120,
        env=env,
    )
    assert done.returncode == 0, done.stderr
    kernels = tmp_path / "p" / "share" / "jupyter" / "kernels"
    spec = json.loads((kernels / "sandbox" / "kernel.json").read_text())
    # -P (3.11+) keeps the working folder off the path, and PYTHONPATH on it.
    safe = ["-P"] if sys.version_info >= (3, 11) else []
    assert spec["argv"] == [python, *safe, "-m", "sandbox_kernel", "-f", "{connection_file}"]
    started = subprocess.run(
        [python, *safe, "-c", "import sandbox_kernel.kernel"],
        env=env,
        capture_output=True,
        timeout=120,
    )
    assert started.returncode == 0, started.stderr
