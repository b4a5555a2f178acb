"""The MCP door, through the ``mcp`` SDK's own client: stdio (``sandbox-kernel mcp`` as
a subprocess) and streamable HTTP (a real Jupyter server with the extension), against
real Docker sandboxes; and what a notebook of the same user sees of the agent's work."""

from __future__ import annotations

import asyncio
import base64
import json
import os
import shutil
import sys
import time
import uuid
from collections.abc import AsyncIterator, Iterator
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import pytest
from jupyter_client.manager import start_new_kernel
from jupyter_server.auth.identity import IdentityProvider, User
from mcp.client.session import ClientSession
from mcp.client.stdio import StdioServerParameters, stdio_client
from mcp.client.streamable_http import streamable_http_client
from mcp.shared._httpx_utils import create_mcp_http_client
from mcp.types import CallToolResult, ImageContent, TextContent
from tornado.httpclient import AsyncHTTPClient

from sandbox_kernel.mcp_results import KEEP
from sandbox_kernel.service import SandboxService

from .conftest import remove_user_containers, remove_user_snapshots, sandbox_container
from .helpers import make_wheel
from .kernel_env import KernelEnv, make_kernel_env

pytestmark = pytest.mark.docker

TOOLS = {
    "execute_code",
    "execute_command",
    "get_sessions",
    "stop_session",
    "list_files",
    "read_file",
    "write_file",
    "list_sandboxes",
    "list_snapshots",
    "create_snapshot",
    "delete_snapshot",
    "get_preview_url",
}
OUTPUT_LIMIT = 1_000_000
PNG = "iVBORw0KGgoAAAANSUhEUgAAAAEAAAABCAYAAAAfFcSJAAAADUlEQVR42mP8z8BQDwAEhQGAhKmMIQAAAABJRU5ErkJggg=="


@pytest.fixture(scope="module")
def kenv(tmp_path_factory: pytest.TempPathFactory) -> Iterator[KernelEnv]:
    env = make_kernel_env(tmp_path_factory.mktemp("mcp"))
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("JUPYTER_PATH", env.jupyter_path)
        yield env
    remove_user_containers(env.user)
    remove_user_snapshots(env.user)


@pytest.fixture(autouse=True)
def _kernelspec_visible(kenv: KernelEnv, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("JUPYTER_PATH", kenv.jupyter_path)


def server_env(kenv: KernelEnv) -> dict[str, str]:
    """The settings the test kernelspec's kernels run with: the MCP server reaches the
    very sandbox a notebook of this user uses."""
    spec = json.loads((Path(kenv.jupyter_path) / "kernels" / "sandbox" / "kernel.json").read_text())
    return {
        **{k: v for k, v in os.environ.items() if not k.startswith("SANDBOX_KERNEL_")},
        **spec["env"],
        "SANDBOX_KERNEL_OUTPUT_LIMIT": str(OUTPUT_LIMIT),
    }


@asynccontextmanager
async def stdio(kenv: KernelEnv, **settings: str) -> AsyncIterator[ClientSession]:
    command = shutil.which("sandbox-kernel", path=os.path.dirname(sys.executable))
    assert command, "the sandbox-kernel command is not installed beside this Python"
    params = StdioServerParameters(
        command=command, args=["mcp"], env={**server_env(kenv), **settings}
    )
    async with stdio_client(params) as (read, write), ClientSession(read, write) as session:
        await session.initialize()
        yield session


async def call(client: ClientSession, tool: str, **arguments: Any) -> CallToolResult:
    return await client.call_tool(tool, arguments)


def texts(result: CallToolResult) -> str:
    return "\n".join(c.text for c in result.content if isinstance(c, TextContent))


def in_container(user: str, *cmd: str) -> str:
    container: Any = sandbox_container(f"sk-{user}")
    return container.exec_run(list(cmd)).output.decode()


# -- stdio ----------------------------------------------------------------------------
async def test_tools_and_their_schemas(kenv: KernelEnv) -> None:
    async with stdio(kenv) as session:
        listed = {t.name: t for t in (await session.list_tools()).tools}
    assert TOOLS <= set(listed)
    code = listed["execute_code"].input_schema
    assert code["required"] == ["code"]
    assert {"code", "session", "timeout", "sandbox_id"} <= set(code["properties"])
    assert "ctx" not in code["properties"]
    assert code["properties"]["timeout"]["exclusiveMinimum"] == 0
    command = listed["execute_command"].input_schema
    assert command["required"] == ["command"] and "cwd" in command["properties"]
    read = listed["read_file"].input_schema
    assert read["properties"]["encoding"]["enum"] == ["text", "base64"]
    assert listed["read_file"].annotations and listed["read_file"].annotations.read_only_hint


async def test_state_persists_sessions_are_separate_errors_are_clear(kenv: KernelEnv) -> None:
    async with stdio(kenv) as session:
        first = await call(session, "execute_code", code="x = 41\nprint('hello')\nx + 1")
        assert not first.is_error
        assert [c.text for c in first.content[:2] if isinstance(c, TextContent)] == [
            "hello\n",
            "42",
        ]
        assert first.structured_content and first.structured_content["duration"] >= 0
        again = await call(session, "execute_code", code="x")
        assert texts(again).startswith("41")
        other = await call(session, "execute_code", code="x", session="other")
        assert other.is_error
        assert "NameError" in texts(other) and "name 'x' is not defined" in texts(other)
        assert "\x1b[" not in texts(other)  # no terminal colours for a model to read
        assert (
            other.structured_content and other.structured_content["error"]["ename"] == "NameError"
        )
        listed = await call(session, "get_sessions")
        assert {s["name"] for s in listed.structured_content["sessions"]} == {"default", "other"}
        assert not (await call(session, "stop_session", session="other")).is_error
        listed = await call(session, "get_sessions")
        assert {s["name"] for s in listed.structured_content["sessions"]} == {"default"}
        missing = await call(session, "stop_session", session="other")
        assert missing.is_error and "no session named 'other'" in texts(missing)
        bad = await call(session, "execute_code", code="1", session="../etc")
        assert bad.is_error and "session name" in texts(bad) and "Traceback" not in texts(bad)
        refused = await call(session, "execute_code", code="1", timeout=-1)
        assert refused.is_error and "timeout" in texts(refused)


async def test_an_unused_session_is_ended_and_the_next_call_says_so(kenv: KernelEnv) -> None:
    """A forgotten interpreter must not hold its sandbox in use for as long as the MCP
    server lives: past agent_idle_stop it is ended (its process too), and the next call
    by that name is told its variables are gone."""
    async with stdio(kenv, SANDBOX_KERNEL_AGENT_IDLE_STOP="0.02") as session:  # 1.2 s
        first = await call(
            session, "execute_code", code="import os\nz = 5\nos.getpid()", session="nap"
        )
        pid = texts(first).splitlines()[0]
        deadline = time.monotonic() + 60
        while True:
            listed = await call(session, "get_sessions")
            if "nap" not in {s["name"] for s in listed.structured_content["sessions"]}:
                break
            assert time.monotonic() < deadline, "the unused session was never ended"
            await asyncio.sleep(0.5)
        listing = SandboxService(kenv.config()).list(kenv.user)
        assert "nap" not in [s["name"] for s in listing[0]["agent_sessions"]]
        wait_gone = (
            f"for i in $(seq 40); do test -e /proc/{pid} || {{ echo gone; exit; }}; sleep 0.5; done"
        )
        assert in_container(kenv.user, "sh", "-c", wait_gone).strip() == "gone"
        again = await call(session, "execute_code", code="z", session="nap")
        assert again.is_error and "NameError" in texts(again), texts(again)
        assert "'nap' was ended after 0.02 min unused" in texts(again)


async def test_rich_results_become_images_and_text(kenv: KernelEnv) -> None:
    code = (
        "import base64\nfrom IPython.display import Image, HTML, display\n"
        f"display(Image(data=base64.b64decode({PNG!r}), format='png'))\n"
        "display(HTML('<b>bold</b>'))\n"
    )
    async with stdio(kenv) as session:
        result = await call(session, "execute_code", code=code)
    assert not result.is_error, texts(result)
    images = [c for c in result.content if isinstance(c, ImageContent)]
    assert len(images) == 1 and images[0].mime_type == "image/png"
    assert base64.b64decode(images[0].data).startswith(b"\x89PNG\r\n\x1a\n")
    assert "<b>bold</b>" in texts(result) and "IPython.core.display" not in texts(result)


async def test_timeouts_interrupt_and_the_session_survives(kenv: KernelEnv) -> None:
    async with stdio(kenv) as session:
        await call(
            session, "execute_code", code="import os, time\nkept = 'still here'", session="t"
        )
        for code in ("while True: pass", "time.sleep(600)"):
            result = await call(session, "execute_code", code=code, session="t", timeout=2)
            assert result.is_error and "Timeout" in texts(result), texts(result)
            assert "interrupted" in texts(result) and "variables are kept" in texts(result)
            assert "KeyboardInterrupt" in texts(result)
            after = await call(session, "execute_code", code="kept", session="t", timeout=10)
            assert texts(after).startswith("'still here'")
        # Code that will not stop: its interpreter is ended, nothing keeps running.
        pid = texts(await call(session, "execute_code", code="os.getpid()", session="t"))
        pid = pid.splitlines()[0]
        stubborn = "import signal\nsignal.signal(signal.SIGINT, signal.SIG_IGN)\nwhile True: pass"
        result = await call(session, "execute_code", code=stubborn, session="t", timeout=2)
        assert (
            result.is_error
            and "was ended" in texts(result)
            and "variables are lost" in texts(result)
        )
        alive = in_container(
            kenv.user, "sh", "-c", f"test -e /proc/{pid} && echo alive || echo gone"
        )
        assert alive.strip() == "gone"
        fresh = await call(session, "execute_code", code="kept", session="t")
        assert fresh.is_error and "NameError" in texts(fresh)


async def test_output_flood_is_bounded(kenv: KernelEnv) -> None:
    async with stdio(kenv) as session:
        result = await call(
            session,
            "execute_code",
            code="import sys\nfor _ in range(5000): sys.stdout.write('x' * 10000 + '\\n')\nprint('alive')",
            timeout=120,
        )
        size = sum(len(c.text) for c in result.content if isinstance(c, TextContent))
        assert size < OUTPUT_LIMIT * 1.2
        assert "truncated" in texts(result)
        command = await call(
            session, "execute_command", command="yes abcdefgh | head -c 5000000; echo tail >&2"
        )
        assert command.structured_content and command.structured_content["truncated"]
        assert len(command.structured_content["stdout"]) <= OUTPUT_LIMIT
        assert "output truncated" in texts(command)
        still = await call(session, "execute_code", code="1 + 1")
        assert texts(still).startswith("2")


# What a run prints: a line number on each line, so any part of it says where it is.
SEVERAL_MB = (
    "import sys\n"
    "for i in range(60000): sys.stdout.write(f'line {i:05d} ' + 'x' * 40 + '\\n')\n"
    "sys.stderr.write('oops\\n' * 100000)\n"
    "print('the end')"
)


def whole_of(kenv: KernelEnv, result: CallToolResult) -> str:
    """The whole output a cut result names, read from the workspace on the host."""
    assert result.structured_content is not None
    saved = result.structured_content["cut"]["output_file"]
    assert saved.startswith("/workspace/.sandbox-kernel/outputs/") and saved in texts(result)
    return (kenv.workspace / saved.removeprefix("/workspace/")).read_text()


def expected_stdout() -> str:
    return "".join(f"line {i:05d} " + "x" * 40 + "\n" for i in range(60000)) + "the end\n"


async def check_several_mb(session: ClientSession, kenv: KernelEnv, limit: int) -> None:
    """A run printing several MB: a result under ``limit`` with the head, the tail and a
    notice, the whole output in the file it names; the same for a command."""
    result = await call(session, "execute_code", code=SEVERAL_MB, timeout=120)
    assert not result.is_error, texts(result)[-500:]
    assert len(result.model_dump_json(by_alias=True, exclude_none=True)) <= limit
    shown = texts(result)
    assert shown.startswith("line 00000 ") and "the end" in shown
    assert "characters cut here" in shown and "output cut to fit one result" in shown
    whole = whole_of(kenv, result)
    assert whole.startswith(expected_stdout()) and whole.count("oops\n") == 100000
    command = await call(
        session,
        "execute_command",
        command="seq -f 'row %06g' 1 400000; echo done; seq 1 50000 >&2",
        timeout=120,
    )
    assert not command.is_error
    assert len(command.model_dump_json(by_alias=True, exclude_none=True)) <= limit
    data = command.structured_content
    assert data and data["exit_code"] == 0
    assert data["stdout"].startswith("row 000001\n") and data["stdout"].endswith("done\n")
    assert data["stderr"].startswith("1\n2\n") and data["stderr"].endswith("50000\n")
    whole = whole_of(kenv, command)
    assert whole.startswith("".join(f"row {i:06d}\n" for i in range(1, 400001)) + "done\n")
    still = await call(session, "execute_code", code="6 * 7")
    assert texts(still).startswith("42")


async def test_a_run_printing_several_mb_gives_a_result_an_agent_can_read(
    kenv: KernelEnv,
) -> None:
    async with stdio(kenv, SANDBOX_KERNEL_OUTPUT_LIMIT="20MB") as session:
        await check_several_mb(session, kenv, 100_000)
        # read_file and list_files stay within one result too, whatever is asked.
        await call(
            session,
            "execute_command",
            command="mkdir -p many && cd many && seq -f 'file-%05g' 1 3000 | xargs touch && "
            "seq -f '\"quoted\" %g' 1 300000 > ../quotes.txt",
        )
        read = await call(session, "read_file", path="quotes.txt", limit=8 << 20)
        assert not read.is_error
        assert len(read.model_dump_json(by_alias=True, exclude_none=True)) <= 100_000
        end = read.structured_content["end"]
        assert texts(read).startswith('"quoted" 1\n') and f"offset={end}" in texts(read)
        assert (kenv.workspace / "quotes.txt").read_bytes()[:end] == read.content[0].text.encode()
        listed = await call(session, "list_files", path="many")
        assert len(listed.model_dump_json(by_alias=True, exclude_none=True)) <= 100_000
        assert listed.structured_content["truncated"] and "list a subfolder" in texts(listed)
        assert 100 < len(listed.structured_content["entries"]) < 3000


async def test_whole_outputs_are_kept_a_few_and_never_through_a_planted_link(
    kenv: KernelEnv, tmp_path: Path
) -> None:
    """The output files are written by the host into the workspace: only the newest
    ones stay, and a link the sandbox planted where they go is never followed (the
    result then says the whole output could not be kept)."""
    outputs = kenv.workspace / ".sandbox-kernel" / "outputs"
    async with stdio(kenv, SANDBOX_KERNEL_MCP_RESULT_LIMIT="5000") as session:
        for _ in range(KEEP + 3):
            cut = await call(session, "execute_command", command="seq 1 5000")
            assert "output cut to fit one result" in texts(cut), texts(cut)
        assert len([p for p in outputs.iterdir() if p.suffix == ".txt"]) == KEEP
        victim = tmp_path / "victim"
        victim.mkdir()
        await call(
            session,
            "execute_command",
            command=f"rm -rf /workspace/.sandbox-kernel && ln -s {victim} /workspace/.sandbox-kernel",
        )
        refused = await call(session, "execute_command", command="seq 1 5000")
        assert not refused.is_error
        assert "the whole output could not be kept" in texts(refused)
        assert "link" in texts(refused).rsplit("could not be kept", 1)[1]
        assert list(victim.iterdir()) == []
        await call(session, "execute_command", command="rm /workspace/.sandbox-kernel")


async def test_execute_command(kenv: KernelEnv) -> None:
    async with stdio(kenv) as session:
        result = await call(session, "execute_command", command="echo out; echo err >&2; exit 3")
        assert not result.is_error
        data = result.structured_content
        assert data and (data["stdout"], data["stderr"], data["exit_code"]) == ("out\n", "err\n", 3)
        await call(session, "execute_command", command="mkdir -p sub/deeper")
        for cwd in ("sub", "/workspace/sub", "sub/deeper/.."):
            here = await call(session, "execute_command", command="pwd", cwd=cwd)
            if ".." in cwd:
                assert here.is_error and "leads out" in texts(here)
            else:
                assert (
                    here.structured_content
                    and here.structured_content["stdout"] == "/workspace/sub\n"
                )
        for outside in ("../", "/etc", "/workspace/../etc"):
            refused = await call(session, "execute_command", command="pwd", cwd=outside)
            assert refused.is_error and "workspace" in texts(refused), outside
        gone = await call(session, "execute_command", command="pwd", cwd="no-such-folder")
        assert gone.is_error and "cannot work in no-such-folder" in texts(gone)
        # Past its time the command and all it started die, even a daemon in its own session.
        marker = uuid.uuid4().hex[:8]
        timed = await call(
            session,
            "execute_command",
            command=f"sleep 7{marker[:3]}1 & setsid sleep 7{marker[:3]}2 & echo started; sleep 600",
            timeout=3,
        )
        assert timed.is_error and timed.structured_content
        assert (
            timed.structured_content["timed_out"] and timed.structured_content["exit_code"] == 124
        )
        assert timed.structured_content["stdout"] == "started\n"
        assert "killed" in texts(timed)
        left = in_container(kenv.user, "ps", "-eo", "args")
        assert f"sleep 7{marker[:3]}" not in left and "sleep 600" not in left


async def test_files_through_the_hardened_layer(kenv: KernelEnv, tmp_path: Path) -> None:
    secret = tmp_path / "host-secret.txt"
    secret.write_text("host only")
    host_dir = tmp_path / "host-dir"
    host_dir.mkdir()
    async with stdio(kenv) as session:
        wrote = await call(session, "write_file", path="notes/a.txt", content="héllo\n")
        assert not wrote.is_error and "7 bytes" in texts(wrote)
        listed = await call(session, "list_files", path="notes")
        assert [e["name"] for e in listed.structured_content["entries"]] == ["a.txt"]
        read = await call(session, "read_file", path="notes/a.txt")
        assert texts(read) == "héllo\n"
        blob = bytes(range(256)) * 10
        await call(
            session,
            "write_file",
            path="b.bin",
            content=base64.b64encode(blob).decode(),
            encoding="base64",
        )
        as_text = await call(session, "read_file", path="b.bin")
        assert as_text.is_error and "encoding='base64'" in texts(as_text)
        part = await call(
            session, "read_file", path="b.bin", offset=10, limit=100, encoding="base64"
        )
        assert base64.b64decode(part.content[0].text) == blob[10:110]
        assert "offset=110" in texts(part)
        outside = await call(session, "read_file", path="../etc/passwd")
        assert outside.is_error and "bad argument" in texts(outside)
        # Links planted by code in the sandbox, pointing at host paths: refused both ways.
        await call(
            session,
            "execute_command",
            command=f"ln -s {secret} leak.txt && ln -s {host_dir} leakdir",
        )
        for tool, args in (
            ("read_file", {"path": "leak.txt"}),
            ("write_file", {"path": "leakdir/new.txt", "content": "x"}),
            ("list_files", {"path": "leakdir"}),
        ):
            refused = await call(session, tool, **args)
            assert refused.is_error, (tool, texts(refused))
            assert "Traceback" not in texts(refused)
        replaced = await call(session, "write_file", path="leak.txt", content="overwritten")
        assert secret.read_text() == "host only" and list(host_dir.iterdir()) == []
        if not replaced.is_error:  # the link itself was replaced, never followed
            assert not (kenv.workspace / "leak.txt").is_symlink()


async def test_agent_files_and_packages_are_the_notebooks(kenv: KernelEnv) -> None:
    wheel = make_wheel(kenv.workspace / "wheels", name="sk_mcp_pkg", version="2.5")
    km, kc = start_new_kernel(kernel_name="sandbox")
    try:
        async with stdio(kenv) as session:
            await call(session, "write_file", path="from-agent.txt", content="agent was here")
            installed = await call(
                session,
                "execute_command",
                command=f"python3 -m pip install --no-index -q /workspace/wheels/{wheel.name}",
                timeout=300,
            )
            assert (
                installed.structured_content and installed.structured_content["exit_code"] == 0
            ), texts(installed)
            # (Only this test's session counts: an earlier test's MCP process, killed by
            # its client, may have left a record that goes stale on its own.)
            listing = SandboxService(kenv.config()).list(kenv.user)
            assert "pkg" not in [s["name"] for s in listing[0]["agent_sessions"]]
            pid = texts(
                await call(session, "execute_code", code="import os\nos.getpid()", session="pkg")
            )
            pid = pid.splitlines()[0]
            listing = SandboxService(kenv.config()).list(kenv.user)
            assert "pkg" in [s["name"] for s in listing[0]["agent_sessions"]]
            assert listing[0]["kernels"] == 1 and len(listing[0]["kernel_ids"]) == 1
        # The MCP process ended: its interpreter is gone too, and from the listing.
        gone = in_container(kenv.user, "sh", "-c", f"sleep 2; test -e /proc/{pid} || echo gone")
        assert gone.strip() == "gone"
        listing = SandboxService(kenv.config()).list(kenv.user)
        assert "pkg" not in [s["name"] for s in listing[0]["agent_sessions"]]
        km.restart_kernel(now=True)
        kc.wait_for_ready(timeout=120)
        outputs: list[dict[str, Any]] = []
        reply = kc.execute_interactive(
            "import sk_mcp_pkg\nprint(open('/workspace/from-agent.txt').read(), sk_mcp_pkg.VALUE)",
            timeout=120,
            output_hook=lambda msg: outputs.append(msg),
        )
        assert reply["content"]["status"] == "ok"
        text = "".join(m["content"].get("text", "") for m in outputs if m["msg_type"] == "stream")
        assert text.strip() == "agent was here 2.5"
    finally:
        kc.stop_channels()
        km.shutdown_kernel(now=True)


async def test_snapshots(kenv: KernelEnv) -> None:
    name = f"mcp-{uuid.uuid4().hex[:6]}"
    async with stdio(kenv) as session:
        await call(session, "execute_command", command="echo made > /tmp/in-snapshot")
        made = await call(session, "create_snapshot", name=name)
        assert not made.is_error, texts(made)
        listed = await call(session, "list_snapshots")
        assert name in [s["name"] for s in listed.structured_content["snapshots"]]
        assert not (await call(session, "delete_snapshot", name=name)).is_error
        listed = await call(session, "list_snapshots")
        assert name not in [s["name"] for s in listed.structured_content["snapshots"]]
        missing = await call(session, "delete_snapshot", name=name)
        assert missing.is_error and "no snapshot named" in texts(missing)


# -- HTTP -------------------------------------------------------------------------------
class HeaderIdentity(IdentityProvider):
    """Test identity: the user named in X-Test-User; no header means not logged in."""

    def get_user(self, handler: Any) -> User | None:
        name = handler.request.headers.get("X-Test-User")
        return User(username=name) if name else None


@pytest.fixture
def jp_server_config(
    request: pytest.FixtureRequest, kenv: KernelEnv, monkeypatch: pytest.MonkeyPatch
) -> dict[str, Any]:
    for name, value in server_env(kenv).items():
        if name.startswith("SANDBOX_KERNEL_"):
            monkeypatch.setenv(name, value)
    config: dict[str, Any] = {
        "ServerApp": {"jpserver_extensions": {"jupyter_ext": True}},
        "SandboxExtension": {"gc_interval": 0},
    }
    if "several_mb" in request.node.name:
        monkeypatch.setenv("SANDBOX_KERNEL_OUTPUT_LIMIT", "20MB")
    if "several_users" in request.node.name:
        monkeypatch.delenv("SANDBOX_KERNEL_USER")
        config["ServerApp"]["identity_provider_class"] = HeaderIdentity
        config["ServerApp"]["disable_check_xsrf"] = True
        config["SandboxExtension"]["owner_from"] = "request"
    return config


def mcp_url(app: Any) -> str:
    return f"http://127.0.0.1:{app.port}{app.base_url}sandbox-kernel/mcp"


@asynccontextmanager
async def http_session(url: str, headers: dict[str, str]) -> AsyncIterator[ClientSession]:
    async with (
        create_mcp_http_client(headers=headers) as client,
        streamable_http_client(url, http_client=client) as (read, write),
        ClientSession(read, write) as session,
    ):
        await session.initialize()
        yield session


async def test_http_same_tools_with_jupyters_authentication(
    jp_fetch: Any, jp_serverapp: Any, jp_auth_header: dict[str, str], kenv: KernelEnv
) -> None:
    url = mcp_url(jp_serverapp)
    async with create_mcp_http_client() as anonymous:
        refused = await anonymous.post(
            url,
            json={"jsonrpc": "2.0", "id": 1, "method": "initialize", "params": {}},
            headers={"Accept": "application/json, text/event-stream"},
        )
        assert refused.status_code == 403
        stream = await anonymous.get(url, headers={"Accept": "text/event-stream"})
        assert stream.status_code == 403
    async with http_session(url, jp_auth_header) as session:
        assert TOOLS <= {t.name for t in (await session.list_tools()).tools}
        result = await call(session, "execute_code", code="y = 6 * 7\ny", session="web")
        assert not result.is_error and texts(result).startswith("42")
        busy = await call(session, "execute_command", command="echo $((1+2))")
        assert busy.structured_content and busy.structured_content["stdout"] == "3\n"
        listed = json.loads((await jp_fetch("api", "sandboxes")).body)
        mine = [s for s in listed if s["id"] == f"sk-{kenv.user}"]
        web = [a for a in mine[0]["agent_sessions"] if a["name"] == "web"]
        assert len(web) == 1 and web[0]["busy"] is False
        agent_id = web[0]["id"]
        assert agent_id not in mine[0]["kernel_ids"]  # agent sessions are not kernels
        one = json.loads((await jp_fetch("api", "sandboxes", f"sk-{kenv.user}")).body)
        assert "web" in [a["name"] for a in one["agent_sessions"]]
        assert not (await call(session, "stop_session", session="web")).is_error
        listed = json.loads((await jp_fetch("api", "sandboxes", f"sk-{kenv.user}")).body)
        assert "web" not in [a["name"] for a in listed["agent_sessions"]]
        # A web app started by the agent, and the URL it gives the user for it.
        started = await call(
            session,
            "execute_command",
            command="nohup python3 -m http.server 8123 >/dev/null 2>&1 &",
        )
        assert not started.is_error
        deadline = time.monotonic() + 60
        while True:
            preview = await call(session, "get_preview_url", port=8123)
            assert not preview.is_error and preview.structured_content
            if preview.structured_content["listening"] or time.monotonic() > deadline:
                break
            await asyncio.sleep(0.3)
        url = preview.structured_content["url"]
        assert url == (
            f"http://127.0.0.1:{jp_serverapp.port}{jp_serverapp.base_url}"
            f"sandbox-kernel/proxy/sk-{kenv.user}/8123/"
        )
        page = await AsyncHTTPClient().fetch(url, headers=jp_auth_header)
        assert b"Directory listing" in page.body
        bad = await call(session, "get_preview_url", port=70000)
        assert bad.is_error


async def test_http_several_mb_of_output_fit_one_event(
    jp_fetch: Any, jp_serverapp: Any, jp_auth_header: dict[str, str], kenv: KernelEnv
) -> None:
    """The official client refuses a server-sent event over 1 MiB: a run printing several
    MB comes back cut, with its whole output in the workspace."""
    async with http_session(mcp_url(jp_serverapp), jp_auth_header) as session:
        await check_several_mb(session, kenv, 100_000)


async def test_stdio_preview_url_from_the_running_jupyter_server(
    jp_fetch: Any, jp_serverapp: Any, jp_auth_header: dict[str, str], kenv: KernelEnv
) -> None:
    """Over stdio the URL is that of the Jupyter server running on this host, as
    ``list_running_servers()`` finds it (the file a started server writes), and it works."""
    jp_serverapp.write_server_info_file()
    runtime = {"JUPYTER_RUNTIME_DIR": jp_serverapp.runtime_dir}
    async with stdio(kenv, **runtime) as session:
        started = await call(
            session,
            "execute_command",
            command="nohup python3 -m http.server 8124 >/dev/null 2>&1 &",
        )
        assert not started.is_error, texts(started)
        deadline = time.monotonic() + 60
        while True:
            preview = await call(session, "get_preview_url", port=8124)
            assert not preview.is_error and preview.structured_content, texts(preview)
            if preview.structured_content["listening"] or time.monotonic() > deadline:
                break
            await asyncio.sleep(0.3)
        assert "the app is listening" in texts(preview)
    url = preview.structured_content["url"]
    assert url == f"{jp_serverapp.connection_url}sandbox-kernel/proxy/sk-{kenv.user}/8124/"
    page = await AsyncHTTPClient().fetch(url, headers=jp_auth_header)
    assert b"Directory listing" in page.body


async def test_stdio_preview_url_without_a_jupyter_server(kenv: KernelEnv, tmp_path: Path) -> None:
    """No server runs for this user: the tool says so in one line, naming what to do."""
    async with stdio(kenv, JUPYTER_RUNTIME_DIR=str(tmp_path)) as session:
        result = await call(session, "get_preview_url", port=8000)
    assert result.is_error
    message = texts(result)
    assert "no Jupyter server is running" in message and "jupyter lab" in message
    assert "Traceback" not in message and len(message.splitlines()) == 1


def _rpc(method: str, id_: int | None = None, **params: Any) -> dict[str, Any]:
    message: dict[str, Any] = {"jsonrpc": "2.0", "method": method}
    if id_ is not None:
        message["id"] = id_
    if params or id_ is not None:
        message["params"] = params
    return message


async def test_http_several_users_cannot_use_each_others_sessions(
    jp_fetch: Any, jp_serverapp: Any, kenv: KernelEnv
) -> None:
    url = mcp_url(jp_serverapp)
    alice, bob = f"{kenv.user}-alice", f"{kenv.user}-bob"
    accept = {"Accept": "application/json, text/event-stream"}
    try:
        async with create_mcp_http_client() as client:
            opened = await client.post(
                url,
                json=_rpc(
                    "initialize",
                    1,
                    protocolVersion="2025-06-18",
                    capabilities={},
                    clientInfo={"name": "test", "version": "1"},
                ),
                headers={**accept, "X-Test-User": alice},
            )
            assert opened.status_code == 200
            sid = opened.headers["mcp-session-id"]
            both = {**accept, "mcp-session-id": sid, "mcp-protocol-version": "2025-06-18"}
            done = await client.post(
                url, json=_rpc("notifications/initialized"), headers={**both, "X-Test-User": alice}
            )
            assert done.status_code == 202
            stolen = await client.post(
                url, json=_rpc("tools/list", 2), headers={**both, "X-Test-User": bob}
            )
            assert stolen.status_code == 404
            ended = await client.delete(url, headers={**both, "X-Test-User": bob})
            assert ended.status_code == 404
            own = await client.post(
                url, json=_rpc("tools/list", 3), headers={**both, "X-Test-User": alice}
            )
            assert own.status_code == 200 and "execute_code" in own.text
        async with http_session(url, {"X-Test-User": alice}) as a:
            made = await call(a, "execute_code", code="secret = 'alice'", session="mine")
            assert not made.is_error, texts(made)
            async with http_session(url, {"X-Test-User": bob}) as b:
                theirs = await call(b, "get_sessions")
                assert theirs.structured_content == {"sessions": []}
                sandboxes = await call(b, "list_sandboxes")
                assert f"sk-{alice}" not in texts(sandboxes)
                poke = await call(
                    b, "execute_code", code="secret", session="mine", sandbox_id=f"sk-{alice}"
                )
                assert poke.is_error and "not allowed" in texts(poke)
                peek = await call(b, "read_file", path="x", sandbox_id=f"sk-{alice}")
                assert peek.is_error and "not allowed" in texts(peek)
                own = await call(b, "execute_code", code="secret", session="mine")
                assert own.is_error and "NameError" in texts(own)
                where = own.structured_content and own.structured_content["sandbox_id"]
                assert where == f"sk-{bob}"
    finally:
        remove_user_containers(alice)
        remove_user_containers(bob)


def test_state_files_from_before_agent_sessions_are_upgraded(tmp_path: Path) -> None:
    """An older state file (kernels without kind and label) gains them: its kernels stay
    kernels, agent sessions are told apart, and the lifecycle counts both as use."""
    import sqlite3

    from sandbox_kernel.config import load_config
    from sandbox_kernel.store import AGENT, Store

    state = tmp_path / "state"
    state.mkdir()
    with sqlite3.connect(state / "state.sqlite") as conn:
        conn.execute(
            "CREATE TABLE kernels (kernel_id TEXT PRIMARY KEY, backend TEXT NOT NULL,"
            " sandbox_id TEXT NOT NULL, last_seen REAL NOT NULL, busy INTEGER NOT NULL DEFAULT 0)"
        )
        conn.execute("INSERT INTO kernels VALUES ('old-kernel', 'docker', 'sk-x', 9e12, 0)")
    store = Store(load_config(environ={}, backend="docker", state_dir=str(state)))
    store.kernel_heartbeat("agent-1", "docker", "sk-x", True, AGENT, "research")
    live = {h.id: h for h in store.live_sessions("docker")["sk-x"]}
    assert (live["old-kernel"].kind, live["old-kernel"].label) == ("kernel", "")
    assert (live["agent-1"].kind, live["agent-1"].label, live["agent-1"].busy) == (
        AGENT,
        "research",
        True,
    )
    assert sorted(store.live_kernels("docker")["sk-x"]) == [
        ("agent-1", True),
        ("old-kernel", False),
    ]
