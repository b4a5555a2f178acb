"""Every door holds: no host program runs code a sandbox planted, and no request mounts a
folder its user could not open through Jupyter itself.

The attacker here is code in the sandbox (a cell, an MCP agent) that writes into the
folder mounted from the host, and a client of the Jupyter server that names folders
outside its root. Each planted module writes a marker file on the host when imported
(inside the sandbox that path does not exist, so only a host import leaves a marker).
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import textwrap
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from jupyter_client.manager import KernelManager
from mcp.client.session import ClientSession
from mcp.client.stdio import StdioServerParameters, stdio_client
from tornado.httpclient import HTTPClientError

from .conftest import TEST_IMAGE, remove_user_containers, sandbox_container
from .test_terminal import Term, WebTerm

pytestmark = pytest.mark.docker

# Module names a host Python program of ours might import from its working folder.
PLANTED = [
    "sandbox_kernel/__init__.py",
    "sandbox_kernel/__main__.py",
    "sandbox_kernel/cli.py",
    "sandbox_kernel/backends/__init__.py",
    "sandbox_kernel/backends/cgroups.py",
    "json.py",
    "docker/__init__.py",
    "sitecustomize.py",
    "usercustomize.py",
    "runpy.py",
    "traitlets/__init__.py",
    "jupyter_client/__init__.py",
]


def sandbox_kernel_command() -> str:
    command = shutil.which("sandbox-kernel", path=os.path.dirname(sys.executable))
    assert command, "the sandbox-kernel command is not installed beside this Python"
    return command


@pytest.fixture
def attack(tmp_path: Path) -> Iterator[dict[str, Any]]:
    """A project folder (the work folder every door mounts) with a settings environment
    for the CLI and kernels, and a markers folder outside it."""
    user = f"test-d{uuid.uuid4().hex[:8]}"
    project = tmp_path / "project"
    (project / "notebooks").mkdir(parents=True)
    markers = tmp_path / "markers"
    markers.mkdir()
    env = {
        **{k: v for k, v in os.environ.items() if not k.startswith("SANDBOX_KERNEL_")},
        "SANDBOX_KERNEL_BACKEND": "docker",
        "SANDBOX_KERNEL_IMAGE": TEST_IMAGE,
        "SANDBOX_KERNEL_WORKSPACE_ROOT": str(tmp_path / "ws"),
        "SANDBOX_KERNEL_STATE_DIR": str(tmp_path / "state"),
        "SANDBOX_KERNEL_USER": user,
        "SANDBOX_KERNEL_WORK_ROOT": str(project),
        "JUPYTER_PATH": str(tmp_path / "share"),
        "PYTHONPATH": str(Path(__file__).resolve().parent.parent),
    }
    env.pop("PYTHONSAFEPATH", None)
    yield {"project": project, "markers": markers, "env": env, "user": user, "tmp": tmp_path}
    remove_user_containers(user)


def plant_from_the_sandbox(attack: dict[str, Any]) -> None:
    """A process in the sandbox writes the shadowing modules into the mounted folder
    (its root and the notebooks' folder), as an agent's two calls did."""
    files = {}
    for where in ("", "notebooks/"):
        for name in PLANTED:
            marker = attack["markers"] / (where + name).replace("/", "_")
            files[where + name] = (
                f"open({str(marker)!r}, 'w').write(__import__('sys').argv.__repr__())\n"
            )
    code = textwrap.dedent(
        """
        import json, os, sys
        for rel, text in json.loads(sys.argv[1]).items():
            path = os.path.join(sys.argv[2], rel)
            os.makedirs(os.path.dirname(path), exist_ok=True)
            open(path, "w").write(text)
        print("planted", len(json.loads(sys.argv[1])))
        """
    )
    done = subprocess.run(
        [
            sandbox_kernel_command(),
            "exec",
            "--",
            "python3",
            "-c",
            code,
            json.dumps(files),
            str(attack["project"]),
        ],
        cwd=attack["project"],
        env=attack["env"],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert done.returncode == 0 and "planted" in done.stdout, done.stdout + done.stderr
    assert (attack["project"] / "sandbox_kernel" / "__init__.py").exists()  # landed on the host
    assert not list(attack["markers"].iterdir())


def no_marker(attack: dict[str, Any]) -> None:
    found = sorted(p.name for p in attack["markers"].iterdir())
    assert not found, f"the host imported modules the sandbox planted: {found}"


def test_cli_commands_never_import_what_the_sandbox_planted(attack: dict[str, Any]) -> None:
    plant_from_the_sandbox(attack)
    for args in (["exec", "--", "true"], ["gc"], ["list", "--json"], ["stats"]):
        for cwd in (attack["project"], attack["project"] / "notebooks"):
            done = subprocess.run(
                [sandbox_kernel_command(), *args],
                cwd=cwd,
                env=attack["env"],
                capture_output=True,
                text=True,
                timeout=300,
            )
            assert done.returncode == 0, (args, done.stdout, done.stderr)
    term = Term(
        [], attack["env"], str(attack["project"] / "notebooks"), command=[sandbox_kernel_command()]
    )
    assert term.run("echo in-$((20+22))") == "in-42"
    term.send(b"exit\r")
    term.wait()
    no_marker(attack)


async def test_an_agent_past_its_timeout_never_runs_planted_code_on_the_host(
    attack: dict[str, Any],
) -> None:
    """The reported attack: plant beside the notebook, then a call that ignores its
    timeout (so its interpreter is ended and its processes reaped), then stop_session."""
    plant_from_the_sandbox(attack)
    params = StdioServerParameters(
        command=sandbox_kernel_command(),
        args=["mcp"],
        env=attack["env"],
        cwd=str(attack["project"] / "notebooks"),
    )
    stubborn = (
        "import signal, subprocess\n"
        "subprocess.Popen(['sleep', '600'], start_new_session=True)\n"
        "signal.signal(signal.SIGINT, signal.SIG_IGN)\n"
        "while True: pass"
    )
    async with stdio_client(params) as (read, write), ClientSession(read, write) as session:
        await session.initialize()
        ended = await session.call_tool(
            "execute_code", {"code": stubborn, "session": "s", "timeout": 1}
        )
        assert ended.is_error
        command = await session.call_tool(
            "execute_command", {"command": "trap '' TERM INT; sleep 600", "timeout": 1}
        )
        assert command.is_error or "124" in str(command.content)
        await session.call_tool("execute_code", {"code": "1", "session": "t"})
        await session.call_tool("stop_session", {"session": "t"})
    done = subprocess.run(
        [sandbox_kernel_command(), "gc"],
        cwd=attack["project"],
        env=attack["env"],
        capture_output=True,
        timeout=300,
    )
    assert done.returncode == 0
    no_marker(attack)


def test_a_kernel_starts_outside_the_folder_the_sandbox_writes(attack: dict[str, Any]) -> None:
    """The kernel is launched as `python -m sandbox_kernel` from a folder of its own, so no
    Python version puts the notebook's folder on its import path."""
    from sandbox_kernel.kernelspec import kernelspec

    spec_dir = Path(attack["env"]["JUPYTER_PATH"], "kernels", "sandbox")
    spec_dir.mkdir(parents=True)
    settings = {k: v for k, v in attack["env"].items() if k.startswith("SANDBOX_KERNEL_")}
    spec = kernelspec("sandbox (test)", {**settings, "PYTHONPATH": attack["env"]["PYTHONPATH"]})
    spec["argv"][0] = sys.executable
    (spec_dir / "kernel.json").write_text(json.dumps(spec))
    plant_from_the_sandbox(attack)
    saved = dict(os.environ)
    os.environ["JUPYTER_PATH"] = attack["env"]["JUPYTER_PATH"]
    km = KernelManager(kernel_name="sandbox")
    try:
        km.start_kernel(cwd=str(attack["project"] / "notebooks"))
        client = km.client()
        client.start_channels()
        client.wait_for_ready(timeout=300)
        reply = client.execute_interactive(
            "import os; print(os.getcwd())", timeout=300, output_hook=lambda m: None
        )
        assert reply["content"]["status"] == "ok"
        pid = km.provisioner.process.pid  # type: ignore[union-attr]
        assert os.readlink(f"/proc/{pid}/cwd") == "/"
        environ = Path(f"/proc/{pid}/environ").read_bytes().split(b"\0")
        folder = str((attack["project"] / "notebooks").resolve()).encode()
        assert b"SANDBOX_KERNEL_NOTEBOOK_DIR=" + folder in environ
        client.stop_channels()
    finally:
        km.shutdown_kernel(now=True)
        os.environ.clear()
        os.environ.update(saved)
    no_marker(attack)


# -- doors of the Jupyter server ---------------------------------------------------------
@pytest.fixture
def jp_server_config(attack: dict[str, Any], monkeypatch: pytest.MonkeyPatch) -> dict[str, Any]:
    for name, value in attack["env"].items():
        if name.startswith("SANDBOX_KERNEL_") or name == "JUPYTER_PATH":
            monkeypatch.setenv(name, value)
    monkeypatch.setenv("SANDBOX_KERNEL_WORK_ROOT", "auto")
    return {
        "ServerApp": {
            "jpserver_extensions": {"jupyter_ext": True, "jupyter_server_terminals": True}
        },
        "SandboxExtension": {"gc_interval": 0},
    }


@pytest.fixture
def jp_root_dir(attack: dict[str, Any]) -> Path:
    return attack["project"]


def mounted_folders(user: str) -> list[str]:
    container: Any = sandbox_container(f"sk-{user}")
    container.reload()
    return [m["Destination"] for m in container.attrs["Mounts"]]


async def test_a_terminal_opens_only_folders_inside_the_servers_root(
    attack: dict[str, Any], jp_fetch: Any, jp_ws_fetch: Any, tmp_path: Path
) -> None:
    secret = tmp_path / "root-only"
    secret.mkdir(mode=0o700)
    (secret / "secret.txt").write_text("host secret")
    link = attack["project"] / "notebooks" / "escape"
    link.symlink_to(secret)  # a link inside the root does not make its target openable
    for cwd in (str(secret), str(link), str(attack["project"] / ".." / "root-only"), "/"):
        with pytest.raises(HTTPClientError) as err:
            await jp_fetch("api", "terminals", method="POST", body=json.dumps({"cwd": cwd}))
        assert err.value.code == 403, cwd
    # A folder inside the root opens, and the shell there is the sandbox's.
    response = await jp_fetch(
        "api",
        "terminals",
        method="POST",
        body=json.dumps({"cwd": str(attack["project"] / "notebooks")}),
    )
    name = json.loads(response.body)["name"]
    term = WebTerm(await jp_ws_fetch("terminals", "websocket", name))
    assert await term.run("pwd") == str((attack["project"] / "notebooks").resolve())
    assert await term.run(f"cat {secret}/secret.txt 2>&1 || echo refused") != "host secret"
    assert str(secret) not in mounted_folders(attack["user"])
    term.send("exit\r")


async def test_a_kernel_opens_only_folders_inside_the_servers_root(
    attack: dict[str, Any], jp_fetch: Any, tmp_path: Path
) -> None:
    from sandbox_kernel.kernelspec import kernelspec

    spec_dir = Path(attack["env"]["JUPYTER_PATH"], "kernels", "sandbox")
    spec_dir.mkdir(parents=True, exist_ok=True)
    spec = kernelspec("sandbox (test)", {"PYTHONPATH": attack["env"]["PYTHONPATH"]})
    spec["argv"][0] = sys.executable
    (spec_dir / "kernel.json").write_text(json.dumps(spec))
    outside = tmp_path / "outside"
    outside.mkdir()
    (attack["project"] / "link-out").symlink_to(outside)
    for path in ("../outside", "link-out", "../../../etc"):
        with pytest.raises(HTTPClientError) as err:
            await jp_fetch(
                "api", "kernels", method="POST", body=json.dumps({"name": "sandbox", "path": path})
            )
        assert err.value.code == 403, path
    started = await jp_fetch(
        "api", "kernels", method="POST", body=json.dumps({"name": "sandbox", "path": "notebooks"})
    )
    kernel_id = json.loads(started.body)["id"]
    await jp_fetch("api", "kernels", kernel_id, method="DELETE")
