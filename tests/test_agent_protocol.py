"""The agent's protocol end to end over the local backend's plain processes: the real
agent, bootstrap and kernel-side connection, with no engine (part of the fast layer).

One agent per module: starting the interpreter is the slow part.
"""

from __future__ import annotations

import asyncio
import json
import os
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from sandbox_kernel.agent import bootstrap_command, bundle
from sandbox_kernel.backends import Channel
from sandbox_kernel.config import load_config
from sandbox_kernel.connection import AgentConnection, AgentGone, unpacked
from sandbox_kernel.errors import SandboxError
from sandbox_kernel.identity import ScopeKey
from sandbox_kernel.service import SandboxService

pytestmark = pytest.mark.fast


class Agent:
    """An agent in a plain local sandbox, driven from a private event loop."""

    def __init__(self, root: Path) -> None:
        cfg = load_config(
            environ={}, backend="local", workspace_root=str(root / "ws"), state_dir=str(root / "st")
        )
        self.service = SandboxService(cfg)
        self.info = self.service.ensure(ScopeKey("proto")).info
        channel = self.service.backend.open_channel(
            self.info.id, bootstrap_command(), cwd="/", env={}
        )
        self.conn = AgentConnection(channel, max_line=1 << 20)
        self.conn.start(bundle("start"))
        self.loop = asyncio.new_event_loop()
        threading.Thread(target=self.loop.run_forever, daemon=True).start()
        asyncio.run_coroutine_threadsafe(self._attach(), self.loop).result(10)

    async def _attach(self) -> None:
        self.conn.attach(asyncio.get_running_loop())

    def ask(
        self,
        op: str,
        timeout: float = 30,
        during: Any = None,
        events: list[dict[str, Any]] | None = None,
        **fields: Any,
    ) -> tuple[dict[str, Any], list[dict[str, Any]]]:
        """Send one request; its (reply, events). ``during`` runs once the request is sent;
        ``events``, when given, is the list the events are added to as they come."""
        events: list[dict[str, Any]] = [] if events is None else events

        async def go() -> dict[str, Any]:
            req = self.conn.request(op, lambda msg, _size: events.append(msg), **fields)
            return await asyncio.wait_for(req.reply, timeout)

        future = asyncio.run_coroutine_threadsafe(go(), self.loop)
        if during is not None:
            during()
        return future.result(timeout + 5), events

    def execute(self, code: str, **fields: Any) -> tuple[dict[str, Any], list[dict[str, Any]]]:
        defaults = {
            "code": code,
            "silent": False,
            "store_history": True,
            "user_expressions": {},
            "allow_stdin": False,
        }
        return self.ask("execute", **{**defaults, **fields})

    def close(self) -> None:
        self.conn.close()
        self.loop.call_soon_threadsafe(self.loop.stop)
        self.service.backend.stop(self.info.id)


@pytest.fixture(scope="module")
def agent(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Agent]:
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv(
            "SANDBOX_KERNEL_LOCAL_NO_BWRAP", "1"
        )  # plain processes: the protocol, not the isolation
        running = Agent(tmp_path_factory.mktemp("proto"))
        yield running
        running.close()


def streams(events: list[dict[str, Any]], name: str = "stdout") -> str:
    return "".join(e["text"] for e in events if e.get("ev") == "stream" and e.get("name") == name)


def test_ready_says_what_runs(agent: Agent) -> None:
    assert agent.conn.ready["ev"] == "ready" and agent.conn.ready["python_version"].count(".") == 2


def test_execute_streams_results_and_counts(agent: Agent) -> None:
    reply, events = agent.execute("x = 6\nprint('hi')\nx * 7")
    assert reply["status"] == "ok" and streams(events) == "hi\n"
    (result,) = [e for e in events if e["ev"] == "result"]
    assert (
        result["data"]["text/plain"] == "42"
        and result["execution_count"] == reply["execution_count"]
    )
    again, _ = agent.execute("x")
    assert (
        again["execution_count"] == reply["execution_count"] + 1
    )  # the interpreter kept x and counted


def test_a_printed_line_is_one_output_even_when_its_writes_are_slow(agent: Agent) -> None:
    """``print('notebook', 9)`` writes four times; on a loaded machine the flusher may
    wake between them. The unfinished line waits (up to PARTIAL_HOLD), so nbclient
    stores one output as with ipykernel, while whole lines still stream at once and a
    line that never ends (a progress bar) still shows."""
    code = (
        "import sys, time\n"
        "sys.stdout.write('notebook'); time.sleep(0.08); sys.stdout.write(' 9\\n')\n"
        "sys.stdout.write('done\\nnext'); time.sleep(0.08); sys.stdout.write(' part\\n')\n"
        "sys.stdout.write('\\rprogress'); time.sleep(0.5); print('.', end='')"
    )
    reply, events = agent.execute(code)
    texts = [e["text"] for e in events if e.get("ev") == "stream"]
    assert reply["status"] == "ok"
    assert texts == ["notebook 9\ndone\n", "next part\n", "\rprogress", "."], texts


def test_errors_are_replies_not_crashes(agent: Agent) -> None:
    reply, events = agent.execute("1/0")
    assert (reply["status"], reply["ename"]) == ("error", "ZeroDivisionError")
    assert any(e["ev"] == "error" and e["ename"] == "ZeroDivisionError" for e in events)
    assert agent.execute("print('still here')")[1][-1]["text"] == "still here\n"


def test_interrupt_keeps_the_interpreter(agent: Agent) -> None:
    agent.execute("kept = 'yes'")

    events: list[dict[str, Any]] = []

    def interrupt() -> None:  # once the cell runs its loop
        deadline = time.monotonic() + 10
        while "looping" not in streams(events) and time.monotonic() < deadline:
            time.sleep(0.01)
        agent.conn.send(op="interrupt")

    reply, _ = agent.ask(
        "execute",
        during=interrupt,
        events=events,
        code="import time\nprint('looping', flush=True)\nfor _ in range(300): time.sleep(0.1)",
        silent=False,
        store_history=True,
        user_expressions={},
        allow_stdin=False,
    )
    assert (reply["status"], reply["ename"]) == ("error", "KeyboardInterrupt")
    assert streams(agent.execute("print(kept)")[1]) == "yes\n"


def test_input_without_stdin_is_refused_in_one_line(agent: Agent) -> None:
    reply, events = agent.execute("input('name? ')")
    assert reply["status"] == "error"
    assert not any(
        e["ev"] == "input_request" for e in events
    )  # never asks a frontend that cannot answer


def test_complete_inspect_is_complete(agent: Agent) -> None:
    agent.execute("import json")
    complete, _ = agent.ask("complete", code="json.du", cursor_pos=7)
    spliced = {
        "json.du"[: complete["cursor_start"]] + m + "json.du"[complete["cursor_end"] :]
        for m in complete["matches"]
    }
    assert "json.dumps" in spliced
    inspect, _ = agent.ask("inspect", code="json.dumps", cursor_pos=10, detail_level=0)
    assert inspect["found"] is True
    assert agent.ask("is_complete", code="for i in range(3):")[0]["status"] == "incomplete"


def test_the_end_of_the_channel_ends_every_request(agent: Agent, tmp_path: Path) -> None:
    """A second agent whose interpreter exits mid-cell: the request fails with AgentGone
    at once, no hang, and later requests fail the same way."""
    other = Agent(tmp_path)
    try:
        with pytest.raises(AgentGone):
            other.execute("import os, sys\nprint('bye', flush=True)\nos._exit(3)")
        with pytest.raises(AgentGone):
            other.execute("1")
        assert other.conn.alive is False
    finally:
        other.close()


def test_an_interpreter_that_never_says_ready_is_given_up(agent: Agent) -> None:
    """A start program that stops itself before its ready (as a cell's SIGSTOP to every
    process of the sandbox would) is given up at the deadline with a line that says so,
    not waited on for ever; the next start works."""
    frozen = agent.service.backend.open_channel(
        agent.info.id, ["sh", "-c", "kill -STOP $$; cat"], cwd="/", env={}
    )
    conn = AgentConnection(frozen, max_line=1 << 20)
    began = time.monotonic()
    with pytest.raises(SandboxError, match="did not start within 0.3 s"):
        conn.start(bundle("start"), within=0.3)
    assert time.monotonic() - began < 10
    conn.close()
    reply, _ = agent.execute("40 + 2")
    assert reply["status"] == "ok"


def test_output_comes_packed_once_and_checked(agent: Agent) -> None:
    """Streams, displays and results arrive as Jupyter content packed in the sandbox: the
    kernel forwards those bytes (no second packing) once the reader has checked them."""
    reply, events = agent.execute(
        "from IPython.display import display, HTML\n"
        "print('ünïcode \\u2028 line')\n"
        "display(HTML('<b>x</b>'), display_id='d1')\n"
        "{'a': 1}"
    )
    assert reply["status"] == "ok"
    kinds = {e["msg_type"]: e for e in events if "packed" in e}
    assert set(kinds) == {"stream", "display_data", "execute_result"}
    for event in kinds.values():
        content = json.loads(event["packed"])
        assert {k: event[k] for k in content} == content  # the event is the content
    assert "ünïcode \u2028 line" in json.loads(kinds["stream"]["packed"])["text"]
    assert kinds["display_data"]["transient"] == {"display_id": "d1"}
    assert kinds["execute_result"]["execution_count"] == reply["execution_count"]


@pytest.mark.parametrize(
    "line",
    [
        b'>stream {"name": "stdout", "text": NaN}',  # not JSON to any client
        b'>stream {"name": "stdout", "text": "x", "extra": 1}',  # a field Jupyter has not
        b'>stream {"name": "stdin", "text": "x"}',
        b'>execute_result {"data": {}, "metadata": {}, "execution_count": "1"}',
        b'>display_data {"data": [], "metadata": {}, "transient": {}}',
        b'>comm_open {"comm_id": "x"}',  # only output types travel packed
        b'>stream {"name": "stdout", "text": "\xff"}',  # not UTF-8
        b">stream " + b"[" * 100_000,  # nesting
        b'>stream {"name": "stdout", "text": "x"} trailing',
    ],
)
def test_forged_packed_lines_are_dropped(line: bytes) -> None:
    import gc

    # No collection during the parse: a finalizer of what earlier tests left, run inside
    # the deep parse of the nesting case, would hit the recursion limit and be reported
    # as this test's failure.
    gc.disable()
    try:
        dropped = unpacked(line)
    finally:
        gc.enable()
    assert dropped is None


def test_a_packed_line_keeps_its_bytes() -> None:
    line = b'>update_display_data {"data": {"text/plain": "1"}, "metadata": {}, "transient": {"display_id": "d"}}'
    event = unpacked(line)
    assert event is not None and event["packed"] == line.partition(b" ")[2]
    assert (event["ev"], event["update"], event["msg_type"]) == (
        "display",
        True,
        "update_display_data",
    )


def test_the_users_path_is_theirs_and_the_hosts_programs_find_nothing_of_theirs(
    tmp_path: Path,
) -> None:
    """The sandbox's own PATH (which finds the host's programs) keeps no folder a cell
    can write, even for a sandbox made by an older version with ~/.local/bin first; the
    user's commands get ~/.local/bin first, once; the host's programs run isolated."""
    import subprocess
    import sys

    from sandbox_kernel.agent import as_user, inline
    from sandbox_kernel.backends.docker.env import exec_env, sandbox_path

    mixed = "/home/sandbox/.local/bin:/usr/local/bin::.:bin:/tmp/x:/workspace/bin:/usr/bin:/dev/shm"
    assert sandbox_path(mixed) == "/usr/local/bin:/usr/bin"
    assert (
        sandbox_path("/home/sandbox/bin")
        == "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"
    )
    old = {"Config": {"Env": ["HOME=/home/sandbox", f"PATH={mixed}"]}}
    assert exec_env(old, {"A": "1"}) == {"PATH": "/usr/local/bin:/usr/bin", "A": "1"}
    assert inline("pass", "x")[:3] == ["python3", "-I", "-c"]
    home = tmp_path / "home"
    command = as_user(["sh", "-c", 'echo "$PATH"'], [])
    for path, expected in (
        ("/usr/bin:/bin", f"{home}/.local/bin:/usr/bin:/bin"),
        (f"/bin:{home}/.local/bin", f"/bin:{home}/.local/bin"),  # already there: kept
    ):
        out = subprocess.run(
            [sys.executable, *command[1:]],
            env={"HOME": str(home), "PATH": path},
            capture_output=True,
            text=True,
            check=True,
        ).stdout
        assert out.strip() == expected


def test_host_programs_never_import_from_their_working_folder(tmp_path: Path) -> None:
    """The host's own Python helpers start in folders a sandbox can write (a checkout,
    a notebook's folder): modules left there (a ctypes.py, a sandbox_kernel package)
    must never be imported by them."""
    import subprocess
    import sys

    from jupyter_ext.terminals import SHELL_COMMAND
    from sandbox_kernel.host_python import python_command

    (tmp_path / "ctypes.py").write_text("raise SystemExit('planted ctypes ran')\n")
    (tmp_path / "sandbox_kernel").mkdir()
    (tmp_path / "sandbox_kernel" / "__init__.py").write_text("raise SystemExit('planted')\n")
    done = subprocess.run(
        python_command(
            "import ctypes, sandbox_kernel; print(ctypes.__file__, sandbox_kernel.__file__)"
        ),
        cwd=tmp_path,
        capture_output=True,
        text=True,
    )
    assert done.returncode == 0 and str(tmp_path) not in done.stdout, done
    assert SHELL_COMMAND[:3] == python_command("")[:3] == [sys.executable, "-I", "-c"]


# Imports the warm spare's module (its main does not run) and prints what the code,
# given its namespace ``ns``, prints, as JSON.
_AGENT_FUNCTIONS = """
import importlib, json, sys
ns = vars(importlib.import_module("sandbox_kernel.agent.spare"))
"""


def _agent_probe(code: str, *args: str, env: dict[str, str] | None = None) -> Any:
    import os
    import subprocess
    import sys

    done = subprocess.run(
        [sys.executable, "-s", "-c", _AGENT_FUNCTIONS + code, *args],
        capture_output=True,
        env={**os.environ, **(env or {})},
        timeout=60,
    )
    assert done.returncode == 0, done.stderr.decode()[-2000:]
    return json.loads(done.stdout)


def test_a_spare_sees_installs_but_not_caches_or_files(tmp_path: Path) -> None:
    """The warm spare ends when what is installed where imports come from changes (a
    pip install adds or replaces an install record), not when a cache or a file a cell
    wrote appears there (that would end it on every kernel)."""
    code = (
        "import os\n"
        "folder = sys.argv[1]\n"
        "sys.path.insert(0, folder)\n"
        "before = ns['python_installation']()\n"
        "os.makedirs(os.path.join(folder, '__pycache__'))\n"
        "open(os.path.join(folder, 'notes.py'), 'w').write('x = 1')\n"
        "same = ns['python_installation']() == before\n"
        "os.makedirs(os.path.join(folder, 'pkg-1.0.dist-info'))\n"
        "print(json.dumps([same, ns['python_installation']() != before]))\n"
    )
    assert _agent_probe(code, str(tmp_path)) == [True, True]


def test_a_spare_serves_no_kernel_when_the_users_site_shadows_what_it_imported(
    tmp_path: Path,
) -> None:
    """A cold start puts the user's site folder first: a package there that the spare
    already imported from the system (IPython or one of its own, here traitlets) would
    differ in a forked interpreter, so such a spare is of no use."""
    code = (
        "import os, site\n"
        "os.makedirs(site.getusersitepackages(), exist_ok=True)\n"
        "if sys.argv[1] == 'shadow':\n"
        "    os.makedirs(os.path.join(site.getusersitepackages(), 'traitlets'))\n"
        "print(json.dumps(ns['warm_up']()))\n"
    )
    for case, useful in (("empty", True), ("shadow", False)):
        base = tmp_path / case
        assert _agent_probe(code, case, env={"PYTHONUSERBASE": str(base)}) is useful, case


LAZY_PACKAGE_PROBE = """
import importlib, importlib.util, pickle, sys, threading
agent = importlib.import_module("sandbox_kernel.agent.shell")

def lazy(name):
    package, complete = agent.lazy_ipython(importlib.util.find_spec(name))
    sys.modules[name] = package
    return package, complete

whole, _ = lazy("whole")
import whole.part  # a submodule loads without the package's __init__
print("before", getattr(sys, "inits", 0), "whole.part" in sys.modules)
got = []
threads = [threading.Thread(target=lambda: got.append(whole.VALUE)) for _ in range(8)]
for t in threads: t.start()
for t in threads: t.join()
print("after", sys.inits, got.count(1), "VALUE" in dir(whole), hasattr(whole, "missing"))

seen, _ = lazy("seen")
print("dir", "VALUE" in dir(seen), sys.inits)

broken, _ = lazy("broken")
try:
    broken.VALUE
except AttributeError as exc:
    print("broken", "ModuleNotFoundError" in str(exc), hasattr(broken, "other"), sys.broken_runs)
def orphan():
    pass
orphan.__module__, orphan.__qualname__ = None, "found_nowhere"
try:  # pickle asks every module of sys.modules for it: only AttributeError is "not here"
    pickle.dumps(orphan)
except pickle.PicklingError:
    print("pickle searched", sys.broken_runs)

reloaded, _ = lazy("reloaded")
importlib.reload(reloaded)
print("reload", reloaded.VALUE, sys.reloads, hasattr(reloaded, "missing"), sys.reloads)
"""


def test_a_lazy_package_runs_its_init_once_whatever_asks(tmp_path: Path) -> None:
    """The agent's IPython package, made but not run (see shell.import_ipython_core):
    its __init__ runs once, when a name it lacks is asked for, from any number of
    threads at once, or by dir(); one that fails says why as an AttributeError (what
    hasattr and pickle expect) and is not run again; a reload counts as its run."""
    import subprocess
    import sys

    for name, init in (
        ("whole", "import sys\nsys.inits = getattr(sys, 'inits', 0) + 1\nVALUE = 1\n"),
        ("seen", "import sys\nsys.inits = getattr(sys, 'inits', 0) + 1\nVALUE = 1\n"),
        (
            "broken",
            "import sys\nsys.broken_runs = getattr(sys, 'broken_runs', 0) + 1\n"
            "import no_such_module_here\n",
        ),
        (
            "reloaded",
            "import sys\nsys.reloads = getattr(sys, 'reloads', 0) + 1\n__version__ = VALUE = 2\n",
        ),
    ):
        (tmp_path / name).mkdir()
        (tmp_path / name / "__init__.py").write_text(init)
    (tmp_path / "whole" / "part.py").write_text("PART = 1\n")
    repo = Path(__file__).parents[1]
    out = subprocess.run(
        [sys.executable, "-c", LAZY_PACKAGE_PROBE],
        cwd=tmp_path,
        env={"PYTHONPATH": f"{tmp_path}:{repo}", "PATH": "/usr/bin:/bin"},
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert out.returncode == 0, out.stderr
    assert out.stdout.splitlines() == [
        "before 0 True",
        "after 1 8 True False",
        "dir True 2",
        "broken True False 1",
        "pickle searched 1",
        "reload 2 1 False 1",
    ]


class _Pipe(Channel):
    """A channel whose far end is this test: what it writes to ``far`` is read."""

    def __init__(self) -> None:
        self.near, self.far = os.pipe()

    def write(self, data: bytes) -> None:
        pass

    def read(self, size: int = 65536) -> bytes:
        return os.read(self.near, size)

    def close(self) -> None:
        os.close(self.near)


def test_a_reader_that_outlives_its_loop_ends_quietly(monkeypatch: pytest.MonkeyPatch) -> None:
    """A program's event loop can close before the interpreter's channel ends (an MCP
    stdio server that returns). The reader then meets a line and the end with no loop to
    hand them to: it stops, with no exception in its thread."""
    raised: list[BaseException | None] = []
    monkeypatch.setattr(threading, "excepthook", lambda args: raised.append(args.exc_value))
    channel = _Pipe()
    conn = AgentConnection(channel, max_line=1 << 20)

    async def attach() -> None:
        conn.attach(asyncio.get_running_loop())

    asyncio.run(attach())  # the loop closes here
    os.write(channel.far, b'\n{"ev": "stream"}\n')
    os.close(channel.far)
    assert conn.reader is not None
    conn.reader.join(10)
    assert not conn.reader.is_alive()
    assert raised == []
    assert not conn.alive
    conn.close()
