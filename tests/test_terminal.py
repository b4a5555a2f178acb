"""The terminal door: ``sandbox-kernel shell`` under a real pty, and JupyterLab's
terminals over the real Jupyter terminals websocket, each landing in the sandbox.

Every wait is bounded and looks for a marker in the output; no assertion depends on
how long something took.
"""

from __future__ import annotations

import asyncio
import fcntl
import json
import os
import re
import select
import shlex
import signal
import struct
import subprocess
import sys
import termios
import time
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import docker
import pytest
from jupyter_server.auth.identity import IdentityProvider, User
from tornado.httpclient import HTTPClientError

from sandbox_kernel.config import SandboxConfig
from sandbox_kernel.identity import ScopeKey
from sandbox_kernel.service import SandboxService

from .conftest import TEST_IMAGE, remove_user_containers, require_bwrap, sandbox_container

CLI = [sys.executable, "-m", "sandbox_kernel.cli"]
# A full-screen program every image with python3 has: curses in the alternate screen,
# the window's size drawn in the middle, a key to quit.
CURSES_APP = shlex.quote(
    "import curses; curses.wrapper(lambda w: (w.addstr(w.getmaxyx()[0] // 2, 2, "
    "'FULLSCREEN %dx%d' % w.getmaxyx()), w.refresh(), w.getch())); print('CURSES-' + 'DONE')"
)


# -- the CLI under a real pseudo-terminal ------------------------------------------------
class Term:
    """``sandbox-kernel shell`` on the slave side of a pty pair; the test is the user."""

    def __init__(
        self,
        args: list[str],
        env: dict[str, str],
        cwd: str,
        rows: int = 30,
        command: list[str] | None = None,
    ) -> None:
        self.master, self.slave = os.openpty()
        self.resize(rows, 100, signal_child=False)
        self.initial = termios.tcgetattr(self.slave)  # cooked: as a shell leaves it
        self.proc = subprocess.Popen(
            [*(command or CLI), "shell", *args],
            stdin=self.slave,
            stdout=self.slave,
            stderr=self.slave,
            env=env,
            cwd=cwd,
            start_new_session=True,
            preexec_fn=lambda: fcntl.ioctl(0, termios.TIOCSCTTY, 0),
        )
        self.out = b""

    def resize(self, rows: int, cols: int, signal_child: bool = True) -> None:
        # TIOCSWINSZ on the terminal sends SIGWINCH to its foreground process group.
        fcntl.ioctl(self.master, termios.TIOCSWINSZ, struct.pack("HHHH", rows, cols, 0, 0))
        if signal_child:
            os.kill(self.proc.pid, signal.SIGWINCH)

    def send(self, data: bytes) -> None:
        os.write(self.master, data)

    def expect(self, pattern: str | bytes, timeout: float = 120.0) -> re.Match[bytes]:
        """Read until ``pattern`` (a regex) appears after what earlier calls consumed."""
        regex = re.compile(pattern.encode() if isinstance(pattern, str) else pattern)
        deadline = time.monotonic() + timeout
        while True:
            found = regex.search(self.out)
            if found:
                self.out = self.out[found.end() :]
                return found
            left = deadline - time.monotonic()
            if left <= 0:
                raise AssertionError(f"no {regex.pattern!r} in the terminal: {self.out[-2000:]!r}")
            ready, _, _ = select.select([self.master], [], [], min(left, 1.0))
            if ready:
                try:
                    chunk = os.read(self.master, 65536)
                except OSError:
                    chunk = b""
                if not chunk:
                    raise AssertionError(
                        f"the terminal closed before {regex.pattern!r}: {self.out[-2000:]!r}"
                    )
                self.out += chunk

    def run(self, command: str, timeout: float = 60.0) -> str:
        """Run one shell command; its output between two markers."""
        tag = uuid.uuid4().hex[:8]
        self.send(f"echo B{tag}E; {command}; echo E{tag}E\r".encode())
        self.expect(f"B{tag}E\r\n", timeout)  # the output, not the echo of the line
        return self.expect(rf"([\s\S]*?)E{tag}E\r\n", timeout).group(1).decode().strip()

    def wait(self, timeout: float = 60.0) -> int:
        deadline = time.monotonic() + timeout
        while self.proc.poll() is None and time.monotonic() < deadline:
            ready, _, _ = select.select([self.master], [], [], 0.5)
            if ready:
                try:
                    self.out += os.read(self.master, 65536)
                except OSError:
                    pass
        return self.proc.wait(timeout=1)

    def close(self) -> None:
        if self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait()
        for fd in (self.master, self.slave):
            try:
                os.close(fd)
            except OSError:
                pass


@pytest.fixture
def cli_env(tmp_path: Path, test_user: str) -> Iterator[dict[str, str]]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("SANDBOX_KERNEL_")}
    env.update(
        SANDBOX_KERNEL_IMAGE=TEST_IMAGE,
        SANDBOX_KERNEL_WORKSPACE_ROOT=str(tmp_path / "ws"),
        SANDBOX_KERNEL_STATE_DIR=str(tmp_path / "state"),
        SANDBOX_KERNEL_USER=test_user,
        SANDBOX_KERNEL_WORK_ROOT="none",
        TERM="xterm-256color",
    )
    yield env
    remove_user_containers(test_user)


@pytest.fixture
def terms() -> Iterator[Callable[..., Term]]:
    made: list[Term] = []

    def make(*args: str, env: dict[str, str], cwd: str = "/", rows: int = 30) -> Term:
        made.append(Term(list(args), env, cwd, rows))
        return made[-1]

    yield make
    for term in made:
        term.close()


def _backend_env(cli_env: dict[str, str], backend: str) -> dict[str, str]:
    if backend == "local":
        require_bwrap()
    return {**cli_env, "SANDBOX_KERNEL_BACKEND": backend}


def _service(env: dict[str, str], backend: str) -> SandboxService:
    from sandbox_kernel.config import load_config

    return SandboxService(
        load_config(
            environ={},
            backend=backend,
            image=TEST_IMAGE,
            workspace_root=env["SANDBOX_KERNEL_WORKSPACE_ROOT"],
            state_dir=env["SANDBOX_KERNEL_STATE_DIR"],
            work_root="none",
        )
    )


@pytest.mark.parametrize("backend", [pytest.param("docker", marks=pytest.mark.docker), "local"])
def test_shell_is_a_real_terminal_in_the_sandbox(
    backend: str, cli_env: dict[str, str], terms: Callable[..., Term], test_user: str
) -> None:
    env = _backend_env(cli_env, backend)
    term = terms(env=env, rows=30)
    assert term.run("pwd") == "/workspace"
    assert term.run("id -u") not in ("", "0")
    assert term.run("stty size") == "30 100"
    # A resize of our window reaches the sandbox's terminal.
    term.resize(41, 123)
    for _ in range(100):  # the resize travels asynchronously: poll a bounded number of times
        if term.run("stty size") == "41 123":
            break
    assert term.run("stty size") == "41 123"
    # Ctrl-C interrupts the foreground program, not the shell; job control works.
    term.send(b"sh -c 'echo SLEEP\"\"ING; exec sleep 100'\r")
    term.expect("SLEEPING\r\n")  # printed by the foreground process
    term.send(b"\x03")
    term.send(b"echo AFTER-$?\r")
    term.expect("AFTER-130\r\n")
    term.send(b"sleep 101 &\r")
    assert "sleep 101" in term.run("jobs")
    term.run("kill %1")
    # A full-screen program draws at the window's size and quits on a key.
    term.send(f"python3 -c {CURSES_APP}\r".encode())
    term.expect(r"\x1b\[\?1049h")  # the alternate screen
    term.expect("FULLSCREEN 41x123")
    term.send(b"q")
    term.expect("CURSES-DONE")
    # A file written in the terminal is in the workspace the notebook sees.
    term.run("echo from-the-terminal > made-in-terminal.txt")
    service = _service(env, backend)
    info = service.owned(test_user, ScopeKey(test_user).name)
    assert (Path(info.workspace) / "made-in-terminal.txt").read_text() == "from-the-terminal\n"
    if backend == "docker":
        container = sandbox_container(info.id)
        assert container.id in term.run("cat /proc/self/mountinfo | grep -o 'containers/[0-9a-f]*'")
    # The shell's exit status is the command's; our terminal is as it was.
    assert termios.tcgetattr(term.slave) != term.initial  # raw while relaying
    term.send(b"exit 7\r")
    assert term.wait() == 7
    assert termios.tcgetattr(term.slave) == term.initial


@pytest.mark.docker
def test_shell_counts_as_activity_and_hangs_up_when_killed(
    cli_env: dict[str, str], terms: Callable[..., Term], test_user: str
) -> None:
    """A relay killed outright (terminado kills a closed terminal's process group) still
    ends its shell in the sandbox: Docker would otherwise keep it running."""
    env = _backend_env(cli_env, "docker")
    service = _service(env, "docker")
    term = terms(env=env)
    marker = uuid.uuid4().hex[:12]
    pid = term.run(f"echo $$; exec -a sk-{marker} sleep 1000 & echo started").splitlines()[0]
    info = service.owned(test_user, ScopeKey(test_user).name)
    record = service.store.get("docker", info.id)
    assert record is not None and record.last_activity > 0
    os.killpg(term.proc.pid, signal.SIGKILL)
    term.proc.wait()
    container = sandbox_container(info.id)
    for _ in range(300):  # bounded: the watcher hangs the session up
        alive = container.exec_run(
            ["python3", "-c", f"import os; print(os.path.exists('/proc/{pid}'))"]
        )
        if alive.output.strip() == b"False":
            break
        time.sleep(0.1)
    assert alive.output.strip() == b"False", "the shell outlived its terminal"


@pytest.mark.docker
def test_unknown_and_foreign_ids(
    cli_env: dict[str, str], terms: Callable[..., Term], test_user: str
) -> None:
    env = _backend_env(cli_env, "docker")
    other = f"{test_user}-other"
    service = _service(env, "docker")
    theirs = service.ensure(ScopeKey(other)).info
    term = terms(theirs.id, env=env)
    assert term.wait() == 1
    assert b"belongs to another user" in term.out and b"Traceback" not in term.out
    term = terms("sk-nobody-has-this", env=env)
    assert term.wait() == 1
    assert b"no sandbox with id 'sk-nobody-has-this'" in term.out
    assert b"Traceback" not in term.out
    # Piped standard input: a clear line, nothing made.
    piped = subprocess.run([*CLI, "shell"], input=b"ls\n", capture_output=True, env=env, timeout=60)
    assert piped.returncode == 2
    assert b"not a terminal" in piped.stderr and b"exec" in piped.stderr
    assert [i["id"] for i in service.list(test_user)] == []


# -- hostile sandboxes ----------------------------------------------------------------------
@pytest.mark.parametrize("backend", [pytest.param("docker", marks=pytest.mark.docker), "local"])
def test_output_flood_keeps_the_relay_small(
    backend: str, cli_env: dict[str, str], terms: Callable[..., Term]
) -> None:
    env = _backend_env(cli_env, backend)
    term = terms(env=env)
    term.run("true")
    flood = 200 << 20
    term.send(f"head -c {flood} /dev/zero | tr '\\0' x; echo; echo FLOOD-DONE\r".encode())
    # Not reading for a while: a relay that buffered would now swallow the flood.
    ready_deadline = time.monotonic() + 3
    while time.monotonic() < ready_deadline:
        time.sleep(0.5)
    seen = 0
    deadline = time.monotonic() + 600
    tail = b""
    while b"FLOOD-DONE" not in tail:
        assert time.monotonic() < deadline, "the flood did not get through"
        chunk = os.read(term.master, 1 << 20)
        seen += chunk.count(b"x")
        tail = (tail + chunk)[-64:]
    assert seen >= flood
    status = Path(f"/proc/{term.proc.pid}/status").read_text()
    peak = int(re.search(r"VmHWM:\s+(\d+) kB", status).group(1)) << 10  # type: ignore[union-attr]
    assert peak < 150 << 20, f"the relay peaked at {peak >> 20} MiB for a {flood >> 20} MiB flood"
    term.send(b"exit\r")
    assert term.wait() == 0


@pytest.mark.parametrize("backend", [pytest.param("docker", marks=pytest.mark.docker), "local"])
def test_planted_fifo_and_link_stay_in_the_sandbox(
    backend: str, cli_env: dict[str, str], terms: Callable[..., Term], tmp_path: Path
) -> None:
    """A shell that plants a FIFO and a link where the host looks (its workspace) neither
    hangs nor redirects the host: the relay never opens a path, and the REST routes read
    the workspace through descriptors (their own tests); here the relay's side."""
    env = _backend_env(cli_env, backend)
    secret = tmp_path / "host-secret.txt"
    secret.write_text("host only\n")
    term = terms(env=env)
    term.run(f"mkfifo trap.fifo; ln -s {secret} link-out; ln -s /dev/tty my-tty")
    assert term.run("cat link-out 2>&1 | head -c 200").endswith("No such file or directory")
    # The relay keeps working, and ends normally, with the traps in place.
    assert term.run("echo still-here") == "still-here"
    term.send(b"exit 3\r")
    assert term.wait() == 3
    assert secret.read_text() == "host only\n"


TIOCSTI_PROBE = r"""
import fcntl, os, termios
rdev = lambda fd: os.fstat(fd).st_rdev
ctty = int(open('/proc/self/stat').read().rsplit(')', 1)[1].split()[4])
print('CTTY', ctty, 'FD0', rdev(0))
seen = set()
for name in os.listdir('/proc/self/fd'):
    try:
        seen.add(os.stat('/proc/self/fd/' + name).st_rdev)
    except OSError:
        pass
print('RDEVS', ' '.join(map(str, sorted(seen))))
injected = 0
for ch in b'echo INJECTED-BY-SANDBOX\n':
    try:
        fcntl.ioctl(0, termios.TIOCSTI, bytes([ch]))
        injected += 1
    except OSError:
        pass
print('INJECTED', injected)
"""


def test_local_shell_never_holds_the_host_terminal(
    cli_env: dict[str, str], terms: Callable[..., Term]
) -> None:
    """The local backend gives the sandbox a new pty: TIOCSTI from inside reaches only
    that terminal (typed into the sandbox's own shell), never the user's terminal."""
    env = _backend_env(cli_env, "local")
    term = terms(env=env)
    outer = os.fstat(term.slave).st_rdev
    term.run("true")
    (
        Path(env["SANDBOX_KERNEL_WORKSPACE_ROOT"]) / env["SANDBOX_KERNEL_USER"] / "probe.py"
    ).write_text(TIOCSTI_PROBE)
    report = term.run("python3 probe.py")
    ctty = int(re.search(r"CTTY (\d+)", report).group(1))  # type: ignore[union-attr]
    fd0 = int(re.search(r"FD0 (\d+)", report).group(1))  # type: ignore[union-attr]
    rdevs = {int(v) for v in re.search(r"RDEVS ([\d ]*)", report).group(1).split()}  # type: ignore[union-attr]
    assert ctty == fd0 != outer
    assert outer not in rdevs
    # What was injected landed in the sandbox's own terminal: its shell runs it there.
    term.expect("INJECTED-BY-SANDBOX")
    term.send(b"exit\r")
    term.wait()
    # Nothing waits in the user's terminal's input queue.
    os.set_blocking(term.slave, False)
    try:
        pending = os.read(term.slave, 65536)
    except BlockingIOError:
        pending = b""
    assert b"INJECTED" not in pending


# -- Daytona through the fake server --------------------------------------------------------
@pytest.fixture
def fake_daytona(tmp_path: Path) -> Iterator[Any]:
    """The wire-faithful fake (see fake_daytona.py); on the way out only this test's
    sandboxes are removed (the fake's close() would take every fake's containers)."""
    from types import SimpleNamespace

    from .fake_daytona import API_KEY, FakeDaytona

    fake = FakeDaytona(tmp_path / "fake-daytona", {"sandbox-kernel-test": TEST_IMAGE})
    fake.start()
    yield SimpleNamespace(server=fake, url=fake.url, api_key=API_KEY)
    client = docker.from_env()
    for box in list(fake.sandboxes.values()):
        if box.container_id:
            try:
                client.containers.get(box.container_id).remove(force=True)
            except docker.errors.NotFound:
                pass
    if fake._loop is not None:
        fake._loop.call_soon_threadsafe(fake._loop.stop)


@pytest.mark.docker
def test_daytona_shell_through_its_pty_session(
    fake_daytona: Any, cli_env: dict[str, str], terms: Callable[..., Term]
) -> None:
    env = {
        **cli_env,
        "SANDBOX_KERNEL_BACKEND": "daytona",
        "DAYTONA_API_KEY": fake_daytona.api_key,
        "DAYTONA_API_URL": fake_daytona.url,
        "DAYTONA_TARGET": "us",
        "DAYTONA_USE_DEPRECATED_POLLING": "true",
        "SANDBOX_KERNEL_IMAGE": "sandbox-kernel-test",
    }
    term = terms(env=env, rows=30)
    assert term.run("pwd") == "/workspace"
    assert term.run("stty size") == "30 100"
    assert not term.out.count(b"SKSHELL")
    term.resize(33, 90)
    for _ in range(100):
        if term.run("stty size") == "33 90":
            break
    assert term.run("stty size") == "33 90"
    assert any(
        i["rows"] == 33 and i["cols"] == 90 for i in fake_daytona.server.toolbox.pty_info.values()
    )
    term.send(b"sh -c 'echo SLEEP\"\"ING; exec sleep 100'\r")
    term.expect("SLEEPING\r\n")  # printed by the foreground process
    term.send(b"\x03")
    term.send(b"echo AFTER-$?\r")
    term.expect("AFTER-130\r\n")
    term.send(b"exit 5\r")
    assert term.wait() == 5


# -- JupyterLab's terminals over the Jupyter terminals websocket ------------------------------
class HeaderIdentity(IdentityProvider):
    """Test identity: the user named in X-Test-User; no header means not logged in."""

    def get_user(self, handler: Any) -> User | None:
        name = handler.request.headers.get("X-Test-User")
        return User(username=name) if name else None


@pytest.fixture
def terminal_mode() -> str:
    return "sandbox"


@pytest.fixture
def owner_from() -> str:
    return "server"


@pytest.fixture
def jp_server_config(
    rest_env: dict[str, str], terminal_mode: str, owner_from: str, monkeypatch: pytest.MonkeyPatch
) -> dict[str, Any]:
    monkeypatch.setenv("SANDBOX_KERNEL_WORK_ROOT", "none")
    server: dict[str, Any] = {
        "jpserver_extensions": {"jupyter_ext": True, "jupyter_server_terminals": True}
    }
    if owner_from == "request":
        monkeypatch.delenv("SANDBOX_KERNEL_USER")
        server.update(identity_provider_class=HeaderIdentity, disable_check_xsrf=True)
    return {
        "ServerApp": server,
        "SandboxExtension": {
            "gc_interval": 0,
            "terminals": terminal_mode,
            "owner_from": owner_from,
        },
    }


class WebTerm:
    """A terminal as JupyterLab drives it: terminado's JSON messages on the websocket."""

    def __init__(self, ws: Any) -> None:
        self.ws = ws
        self.out = ""

    def send(self, text: str) -> None:
        self.ws.write_message(json.dumps(["stdin", text]))

    async def expect(self, pattern: str, timeout: float = 120.0) -> re.Match[str]:
        regex = re.compile(pattern)
        deadline = asyncio.get_running_loop().time() + timeout
        while True:
            found = regex.search(self.out)
            if found:
                self.out = self.out[found.end() :]
                return found
            left = deadline - asyncio.get_running_loop().time()
            if left <= 0:
                raise AssertionError(f"no {pattern!r} in the terminal: {self.out[-2000:]!r}")
            raw = await asyncio.wait_for(self.ws.read_message(), left)
            if raw is None:
                raise AssertionError(
                    f"the terminal closed before {pattern!r}: {self.out[-2000:]!r}"
                )
            msg = json.loads(raw)
            if msg[0] == "stdout":
                self.out += msg[1]

    async def run(self, command: str) -> str:
        tag = uuid.uuid4().hex[:8]
        self.send(f"echo B{tag}E; {command}; echo E{tag}E\r")
        await self.expect(f"B{tag}E\r\n")
        return (await self.expect(rf"([\s\S]*?)E{tag}E\r\n")).group(1).strip()


async def open_terminal(
    jp_fetch: Any, jp_ws_fetch: Any, headers: dict[str, str] | None = None
) -> tuple[str, WebTerm]:
    response = await jp_fetch("api", "terminals", method="POST", body="{}", headers=headers or {})
    name = json.loads(response.body)["name"]
    ws = await jp_ws_fetch("terminals", "websocket", name, headers=headers or {})
    return name, WebTerm(ws)


@pytest.mark.docker
async def test_jupyterlab_terminal_is_the_sandbox(
    jp_fetch: Any, jp_ws_fetch: Any, rest_env: dict[str, str], test_user: str, jp_serverapp: Any
) -> None:
    name, term = await open_terminal(jp_fetch, jp_ws_fetch)
    term.ws.write_message(json.dumps(["set_size", 27, 91, 600, 800]))
    assert await term.run("hostname") == "sandbox" != os.uname().nodename
    info = SandboxService(_rest_config(rest_env)).owned(test_user, ScopeKey(test_user).name)
    container = sandbox_container(info.id)
    assert container.id in await term.run(
        "grep -o 'containers/[0-9a-f]*' /proc/self/mountinfo | head -1"
    )
    assert await term.run("pwd") == "/workspace"
    assert await term.run("id -u") not in ("", "0")
    # Its uid has an account (the prompt said "I have no name!" in images without one),
    # and what `pip install --user` puts in ~/.local/bin is found.
    assert await term.run("whoami") == "sandbox"
    assert (await term.run('echo "${PS1@P}"')).startswith("sandbox@sandbox:")
    assert (await term.run('echo "$PATH"')).startswith("/home/sandbox/.local/bin:")
    for _ in range(100):
        if await term.run("stty size") == "27 91":
            break
    assert await term.run("stty size") == "27 91"
    # Written in the terminal, read through the notebook side's REST files route.
    await term.run("echo typed-in-lab > from-lab.txt")
    body = await jp_fetch("api", "sandboxes", info.id, "files", "from-lab.txt")
    assert body.body == b"typed-in-lab\n"
    term.send("sh -c 'echo SLEEP\"\"ING; exec sleep 100'\r")
    await term.expect("SLEEPING\r\n")
    term.send("\x03")
    term.send("echo AFTER-$?\r")
    await term.expect("AFTER-130\r\n")
    term.send(f"python3 -c {CURSES_APP}\r")
    await term.expect("FULLSCREEN 27x91")
    term.send("q")
    await term.expect("CURSES-DONE")
    # A client cannot pick the command: a POST body's shell_command is ignored.
    response = await jp_fetch(
        "api", "terminals", method="POST", body=json.dumps({"shell_command": ["/bin/sh"]})
    )
    other = json.loads(response.body)["name"]
    ws = await jp_ws_fetch("terminals", "websocket", other)
    assert await WebTerm(ws).run("hostname") == "sandbox"
    term.send("exit\r")
    await jp_fetch("api", "terminals", other, method="DELETE")


def _rest_config(rest_env: dict[str, str]) -> SandboxConfig:
    from sandbox_kernel.config import load_config

    return load_config(
        environ={},
        backend="docker",
        image=TEST_IMAGE,
        workspace_root=rest_env["SANDBOX_KERNEL_WORKSPACE_ROOT"],
        state_dir=rest_env["SANDBOX_KERNEL_STATE_DIR"],
        work_root="none",
    )


@pytest.mark.docker
@pytest.mark.parametrize("terminal_mode", ["host"])
async def test_host_terminals_when_the_setting_says_host(
    jp_fetch: Any, jp_ws_fetch: Any, rest_env: dict[str, str], test_user: str
) -> None:
    _name, term = await open_terminal(jp_fetch, jp_ws_fetch)
    assert await term.run("hostname") == os.uname().nodename
    assert (
        docker.from_env().containers.list(
            ignore_removed=True, all=True, filters={"label": f"sandbox-kernel.user={test_user}"}
        )
        == []
    )


@pytest.mark.docker
@pytest.mark.parametrize("owner_from", ["request"])
async def test_request_mode_terminals_are_per_user(
    jp_fetch: Any, jp_ws_fetch: Any, rest_env: dict[str, str], test_user: str
) -> None:
    alice, bob = f"{test_user}-alice", f"{test_user}-bob"
    a_headers = {"X-Test-User": alice, "Authorization": ""}
    b_headers = {"X-Test-User": bob, "Authorization": ""}
    a_name, a_term = await open_terminal(jp_fetch, jp_ws_fetch, a_headers)
    b_name, b_term = await open_terminal(jp_fetch, jp_ws_fetch, b_headers)
    await a_term.run("echo alice-was-here > mine.txt")
    assert (await b_term.run("cat mine.txt 2>&1 || echo absent")).endswith("absent")
    service = SandboxService(_rest_config(rest_env))
    assert service.owned(alice, ScopeKey(alice).name).user == alice
    assert service.owned(bob, ScopeKey(bob).name).user == bob
    # Bob cannot see, read, attach to or remove Alice's terminal.
    listed = json.loads((await jp_fetch("api", "terminals", headers=b_headers)).body)
    assert [t["name"] for t in listed] == [b_name]
    for method in ("GET", "DELETE"):
        with pytest.raises(HTTPClientError) as err:
            await jp_fetch("api", "terminals", a_name, method=method, headers=b_headers)
        assert err.value.code == 404
    with pytest.raises(HTTPClientError) as err:
        await jp_ws_fetch("terminals", "websocket", a_name, headers=b_headers)
    assert err.value.code == 404
    # Nor take its name, nor pick his user through the body.
    with pytest.raises(HTTPClientError) as err:
        await jp_fetch(
            "api", "terminals", method="POST", body=json.dumps({"name": a_name}), headers=b_headers
        )
    assert err.value.code == 409
    response = await jp_fetch(
        "api",
        "terminals",
        method="POST",
        body=json.dumps({"extra_env": {"SANDBOX_KERNEL_USER": alice}}),
        headers=b_headers,
    )
    sneaky = json.loads(response.body)["name"]
    ws = await jp_ws_fetch("terminals", "websocket", sneaky, headers=b_headers)
    assert (await WebTerm(ws).run("cat mine.txt 2>&1 || echo absent")).endswith("absent")
    # Alice still has hers.
    assert await a_term.run("cat mine.txt") == "alice-was-here"
    listed = json.loads((await jp_fetch("api", "terminals", headers=a_headers)).body)
    assert [t["name"] for t in listed] == [a_name]
    remove_user_containers(test_user)
