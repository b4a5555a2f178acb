"""An attacker's test of the sandbox boundary, from code running INSIDE the sandbox: the
kernel's own side of it.

The code in a sandbox is hostile (docs/operators/security.md): it runs as the sandbox user
in the same container as the interpreters the kernel talks to, it can start processes
that outlive its cell, plant programs where the host's tools look, write to any file
descriptor its process holds and flood output. Each test here is one such attack against
real kernels (jupyter_client against a test kernelspec) on real Docker sandboxes, and each
checks that the attack really happened, so a pass never comes from an attack that did
not run. The attacks on the sandbox's neighbours (other sandboxes, the host's network,
another installation, the host's files) are in test_hostile_neighbours.py.

Every race is bounded in tries and in time; every process planted in a sandbox ends
by itself (``PLANT_SECONDS``) if the test cannot end it.
"""

from __future__ import annotations

import json
import re
import signal
import time
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from jupyter_client.manager import start_new_kernel

from sandbox_kernel.config import SandboxConfig
from sandbox_kernel.lifecycle import gc
from sandbox_kernel.service import SandboxService

from .conftest import remove_user_containers, sandbox_container
from .helpers import GRANDPARENT, SPARE_PID_PROBE
from .kernel_env import KernelEnv, make_kernel_env

pytestmark = pytest.mark.docker

PLANT_SECONDS = 120  # no process a test plants in a sandbox outlives this
GONE_SECONDS = 20  # processes of an ended kernel must be gone within this
ANSWER_SECONDS = 10  # "the kernel answers the next cell" within this
OUTPUT_LIMIT = 1_000_000  # the output limit of the output tests, in bytes
OUTPUT_SLACK = 1.2  # what a cell may send past the limit (the notice, the protocol's bytes)


# -- helpers: containers ------------------------------------------------------------------


def in_container(container: Any, code: str, *args: str, check: bool = True) -> str:
    """Run ``python3 -c code args...`` in the container as the sandbox user; its stdout.

    The snippets bound their own run time (the SDK's exec has no timeout). A snippet
    the runtime could not start (126: the attack's pid hopper holds the sandbox at its
    process limit for a moment, more so on a loaded machine) is tried again, for up
    to 5 s: the check is about the sandbox's processes, not about the test's own exec."""
    deadline = time.monotonic() + 5
    while True:
        code_rc, (out, err) = container.exec_run(["python3", "-I", "-c", code, *args], demux=True)
        if code_rc != 126 or time.monotonic() > deadline:
            break
        time.sleep(0.1)
    out, err = (out or b"").decode(errors="replace"), (err or b"").decode(errors="replace")
    if check:
        assert code_rc == 0, f"snippet failed ({code_rc}): {(err or out)[-2000:]}"
    return out


_PROC_IDENTITY = """
import json, sys
found = {}
for pid in json.loads(sys.argv[1]):
    try:
        data = open('/proc/%d/stat' % pid, 'rb').read()
    except OSError:
        continue
    rest = data[data.rfind(b')') + 2:].split()
    found[str(pid)] = [rest[19].decode(), rest[0].decode()]
print(json.dumps(found))
"""

# Put at the top of a cell or snippet: the identity (pid, start time) of a process.
_START_TIME = (
    "def _start_time(pid):\n"
    "    data = open('/proc/%d/stat' % pid, 'rb').read()\n"
    "    return data[data.rfind(b')') + 2:].split()[19].decode()\n"
)


def live_processes(container: Any, procs: dict[int, str]) -> dict[int, str]:
    """Which of {pid: start time} still live in the container (same pid AND start
    time, so a reused pid is not mistaken for the old process; a zombie is dead, only
    not yet reaped); {pid: state}."""
    if not procs:
        return {}
    found = json.loads(in_container(container, _PROC_IDENTITY, json.dumps(list(procs))))
    return {
        int(pid): state
        for pid, (start, state) in found.items()
        if procs[int(pid)] == start and state != "Z"
    }


def wait_gone(
    container: Any, procs: dict[int, str], seconds: float = GONE_SECONDS
) -> dict[int, str]:
    """Poll until none of the processes exists; what is left when time is up."""
    deadline = time.monotonic() + seconds
    while True:
        left = live_processes(container, procs)
        if not left or time.monotonic() > deadline:
            return left
        time.sleep(0.5)


def marked_processes(container: Any, marker: str, seconds: float = 1.0) -> list[int]:
    """Live (not zombie) processes of the container whose command line holds ``marker``,
    seen in any of the scans of /proc made during ``seconds`` (one scan can miss a
    process that changes pid between the listing and the read)."""
    code = (
        "import os, sys, time\n"
        "found, deadline = set(), time.time() + float(sys.argv[2])\n"
        "while time.time() < deadline:\n"
        "    for p in os.listdir('/proc'):\n"
        "        if not p.isdigit() or int(p) == os.getpid():\n"
        "            continue\n"
        "        try:\n"
        "            cmd = open('/proc/%s/cmdline' % p, 'rb').read()\n"
        "            state = open('/proc/%s/stat' % p, 'rb').read().rsplit(b')', 1)[1].split()[0]\n"
        "        except (OSError, IndexError):\n"
        "            continue\n"
        "        if sys.argv[1].encode() in cmd and state != b'Z':\n"
        "            found.add(int(p))\n"
        "print(' '.join(map(str, sorted(found))))\n"
    )
    return [int(pid) for pid in in_container(container, code, marker, str(seconds)).split()]


def process_table(container: Any) -> str:
    """The container's live processes (pid, parent, state, command line) and how many
    zombies it holds, for failure messages."""
    code = (
        "import os\n"
        "zombies = 0\n"
        "for p in sorted((int(p) for p in os.listdir('/proc') if p.isdigit())):\n"
        "    try:\n"
        "        stat = open('/proc/%d/stat' % p, 'rb').read().rsplit(b')', 1)[1].split()\n"
        "        cmd = open('/proc/%d/cmdline' % p, 'rb').read().replace(b'\\0', b' ')\n"
        "    except OSError:\n"
        "        continue\n"
        "    if stat[0] == b'Z':\n"
        "        zombies += 1\n"
        "        continue\n"
        "    print(p, int(stat[1]), stat[0].decode(), cmd.decode(errors='replace').replace('\\n', ' ')[:70])\n"
        "print(zombies, 'zombies')\n"
    )
    return in_container(container, code, check=False)


# -- helpers: kernels -------------------------------------------------------------------


class Kernels:
    """Kernels of one test kernelspec (its env: the settings), all on one sandbox."""

    def __init__(self, root: Path, monkeypatch: pytest.MonkeyPatch) -> None:
        self.root = root
        self.monkeypatch = monkeypatch
        self.env: KernelEnv | None = None
        self.started: list[tuple[Any, Any]] = []

    def configure(self, **settings: str) -> KernelEnv:
        self.env = make_kernel_env(self.root, **settings)
        self.monkeypatch.setenv("JUPYTER_PATH", self.env.jupyter_path)
        return self.env

    def start(self) -> tuple[Any, Any]:
        """A new kernel; (KernelManager, BlockingKernelClient), ready."""
        if self.env is None:
            self.configure()
        km, kc = start_new_kernel(kernel_name="sandbox", startup_timeout=90)
        self.started.append((km, kc))
        return km, kc

    @property
    def sandbox_id(self) -> str:
        assert self.env is not None
        return f"sk-{self.env.user}"

    def container(self) -> Any:
        return sandbox_container(self.sandbox_id)

    def close(self) -> None:
        for km, kc in self.started:
            try:
                kc.stop_channels()
                km.shutdown_kernel(now=True)
            except Exception:
                pass
        if self.env is not None:
            remove_user_containers(self.env.user)


@pytest.fixture
def kernels(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[Kernels]:
    made = Kernels(tmp_path / "k", monkeypatch)
    yield made
    made.close()


def start_kernel(kernels: Kernels, **env: str) -> tuple[Any, Any]:
    """Start a kernel whose kernelspec env carries ``env``; (km, kc)."""
    if kernels.env is None:
        kernels.configure(**env)
    return kernels.start()


def collect(kc: Any, msg_id: str, deadline: float) -> tuple[dict, list[dict]]:
    """(reply content, iopub messages) of a request, all within the deadline
    (time.monotonic()); raises TimeoutError naming what was missing."""
    outputs: list[dict] = []
    idle = False
    while not idle:
        left = deadline - time.monotonic()
        if left <= 0:
            raise TimeoutError(f"no idle status in time; got {[m['msg_type'] for m in outputs]}")
        try:
            msg = kc.get_iopub_msg(timeout=left)
        except Exception:
            continue
        if msg["parent_header"].get("msg_id") != msg_id:
            continue
        if msg["msg_type"] == "status":
            idle = msg["content"]["execution_state"] == "idle"
        elif msg["msg_type"] != "execute_input":
            outputs.append(msg)
    while True:
        left = deadline - time.monotonic()
        if left <= 0:
            raise TimeoutError("no execute_reply in time")
        try:
            reply = kc.get_shell_msg(timeout=left)
        except Exception:
            continue
        if reply["parent_header"].get("msg_id") == msg_id:
            return reply["content"], outputs


def run(kc: Any, code: str, timeout: float = 60) -> tuple[dict, list[dict]]:
    """Execute a cell; (reply content, its iopub messages) within ``timeout`` seconds."""
    return collect(kc, kc.execute(code), time.monotonic() + timeout)


def text_of(outputs: list[dict], name: str | None = None) -> str:
    return "".join(
        m["content"]["text"]
        for m in outputs
        if m["msg_type"] == "stream" and (name is None or m["content"]["name"] == name)
    )


def all_text(outputs: list[dict]) -> str:
    """Every text a user would see: streams, and the data of displays and results."""
    parts = [text_of(outputs)]
    for m in outputs:
        for value in (m["content"].get("data") or {}).values():
            parts.append(value if isinstance(value, str) else json.dumps(value))
        parts.extend(m["content"].get("traceback") or [])
    return "".join(parts)


def content_size(outputs: list[dict]) -> int:
    return sum(len(json.dumps(m["content"])) for m in outputs)


def answers(kc: Any, seconds: float = ANSWER_SECONDS) -> None:
    """The kernel answers ``1+1`` within ``seconds``."""
    started = time.monotonic()
    reply, outputs = run(kc, "1+1", timeout=seconds)
    assert reply["status"] == "ok", reply
    results = [m for m in outputs if m["msg_type"] == "execute_result"]
    assert results and results[-1]["content"]["data"]["text/plain"] == "2", outputs
    assert time.monotonic() - started < seconds


def interpreter(kc: Any) -> dict[int, str]:
    """{pid: start time} of the interpreter behind a kernel."""
    reply, outputs = run(
        kc,
        _START_TIME + "import os, json; print(json.dumps([os.getpid(), _start_time(os.getpid())]))",
    )
    assert reply["status"] == "ok", reply
    pid, start = json.loads(text_of(outputs, "stdout"))
    return {pid: start}


def interpreter_spare(kc: Any) -> int:
    """The parent of the watcher of the interpreter behind a kernel: the warm spare that
    forked it (0 or another process for a cold start)."""
    return int(ok_cell(kc, GRANDPARENT + "print(grandparent())"))


def ok_cell(kc: Any, code: str, timeout: float = 60) -> str:
    """Run a cell that must succeed; its stdout."""
    reply, outputs = run(kc, code, timeout=timeout)
    assert reply["status"] == "ok", (reply, text_of(outputs))
    return text_of(outputs, "stdout")


# -- 1: an interpreter that dies on its own -------------------------------------------------
def wait_for_spare(container: Any, seconds: float = 20) -> int:
    """The pid of a warm spare listening in the sandbox (0 if none came in time)."""
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        pid = int(in_container(container, SPARE_PID_PROBE).strip() or 0)
        if pid:
            return pid
        time.sleep(0.5)
    return 0


_DIE_LEAVING_A_DAEMON = """
import os, subprocess, sys, time
subprocess.Popen([sys.executable, '-c', 'import time; time.sleep(300)', MARKER], start_new_session=True)
time.sleep(0.5)
os.kill(os.getpid(), 9)
"""


@pytest.mark.parametrize("start", ["cold", "spare", "spare-killed"])
def test_an_interpreter_that_dies_takes_its_cells_processes_along(
    kernels: Kernels, start: str
) -> None:
    """Attack: a cell leaves a daemon (its own session) and kills its own interpreter,
    so no kernel's kill of that interpreter's tree ever finds the daemon: it was
    orphaned to the process that adopts them: the interpreter's watcher, for a cold
    start and for a child of the warm spare, even when the cell killed the spare first
    (``spare-killed``). The daemon must be gone within GONE_SECONDS, and the kernel
    must answer again."""
    km, kc = start_kernel(kernels)
    container = kernels.container()
    if start.startswith("spare"):
        spare = wait_for_spare(container)
        assert spare, "no warm spare appeared for the second kernel"
        km, kc = kernels.start()
        assert interpreter_spare(kc) == spare, "the second kernel's interpreter is not the spare's"
    if start == "spare-killed":
        ok_cell(kc, f"import os\nos.kill({spare}, 9)")
        assert int(in_container(container, SPARE_PID_PROBE) or 0) != spare, "the spare lives on"
    marker = f"sk-orphan-{uuid.uuid4().hex[:8]}"
    dying = kc.execute(f"MARKER = {marker!r}\n" + _DIE_LEAVING_A_DAEMON)
    deadline = time.monotonic() + 10
    seen = []
    while not seen and time.monotonic() < deadline:
        seen = marked_processes(container, marker)
    assert seen, "the daemon did not start (test bug)"
    deadline = time.monotonic() + GONE_SECONDS
    left = seen
    while left and time.monotonic() < deadline:
        left = marked_processes(container, marker)
    assert not left, f"the dead interpreter's daemon {left} lives on:\n{process_table(container)}"
    # The lost cell's error reply first: a cell sent before it would be queued behind a
    # failed cell, and aborted (stop_on_error), on a machine slow to see the loss.
    lost, _ = collect(kc, dying, time.monotonic() + 60)
    assert lost["status"] == "error", lost
    answers(kc, 60)


# -- 2: an interpreter stuck in C with the GIL held --------------------------------------


def stuck_cell_then(kc: Any) -> str:
    """Send a cell that holds the GIL for hours (C loop, no signal checks); don't wait."""
    msg_id = kc.execute("sum(range(10**12))")
    time.sleep(1)
    return msg_id


def test_gil_held_interpreter_ends_with_its_kernel(kernels: Kernels) -> None:
    """Attack: a cell that never gives the GIL back (``sum(range(10**12))``), so the
    interpreter cannot act on any message, not even an interrupt. Restarting the
    kernel, and then shutting the restarted one down (both the polite way,
    ``now=False``), must end the stuck interpreter within GONE_SECONDS, and the
    restarted kernel must answer. The first interpreter was started cold, the second
    is the warm spare the restarted kernel took over."""
    km, kc = start_kernel(kernels)
    container = kernels.container()
    first = interpreter(kc)  # started cold: the sandbox's first kernel
    spare = wait_for_spare(container)  # what the restarted kernel will take over
    stuck = stuck_cell_then(kc)
    assert live_processes(container, first) == {pid: "R" for pid in first}, (
        "the cell is not burning CPU"
    )
    km.interrupt_kernel()  # the proof that it is stuck: not even an interrupt ends it
    with pytest.raises(TimeoutError):
        collect(kc, stuck, time.monotonic() + 2)
    km.restart_kernel(now=False)
    left = wait_gone(container, first)
    assert not left, (
        f"after restart_kernel the stuck interpreter {left} still exists:\n{process_table(container)}"
    )
    kc.wait_for_ready(timeout=60)
    answers(kc, 30)
    second = interpreter(kc)
    assert second != first
    if spare:  # both ways an interpreter starts are attacked
        assert interpreter_spare(kc) == spare, (
            "the restarted kernel's interpreter is not the spare's"
        )
    stuck_cell_then(kc)
    km.shutdown_kernel(now=False)
    left = wait_gone(container, second)
    assert not left, (
        f"after shutdown_kernel the stuck interpreter {left} still exists:\n{process_table(container)}"
    )


# -- 3: what a killed kernel's cells left running ----------------------------------------

_LEAVE_BEHIND = (
    _START_TIME
    + """
import json, os, subprocess, sys, time
pidfile = '/workspace/daemon-%d.pid' % os.getpid()
procs = {}
sleeper = subprocess.Popen(['sleep', '1000'])
procs['sleep'] = sleeper.pid
setsid = subprocess.Popen([sys.executable, '-c', 'import os, time; os.setsid(); time.sleep(1000)'])
procs['setsid'] = setsid.pid
child = os.fork()
if child == 0:  # the classic daemon: fork, setsid, fork, the middle one exits
    os.setsid()
    if os.fork() == 0:
        with open(pidfile + '.tmp', 'w') as fh:
            fh.write(str(os.getpid()))
        os.rename(pidfile + '.tmp', pidfile)
        time.sleep(1000)
    os._exit(0)
os.waitpid(child, 0)
deadline = time.time() + 10
while not os.path.exists(pidfile) and time.time() < deadline:
    time.sleep(0.05)
procs['daemon'] = int(open(pidfile).read())
procs['interpreter'] = os.getpid()
time.sleep(0.3)  # the setsid child has called setsid by now
print(json.dumps({name: [pid, _start_time(pid)] for name, pid in procs.items()}))
"""
)


@pytest.mark.parametrize("start", ["cold", "spare"])
def test_killed_kernel_leaves_no_process(kernels: Kernels, start: str) -> None:
    """A cell starts ``sleep 1000``, a process that calls setsid() and a double-forked
    daemon, then its kernel is killed hard (SIGKILL to the host kernel process: no
    shutdown message ever reaches the sandbox). Within GONE_SECONDS none of them, nor
    the interpreter, may exist in the container: a killed kernel holds none of its
    sandbox's memory or processes. ``spare``: the kernel's interpreter was forked by
    the warm spare; ``cold``: one it started itself."""
    km, kc = start_kernel(kernels)
    container = kernels.container()
    spare = wait_for_spare(container) if start == "spare" else 0
    if start == "spare":
        assert spare, "no warm spare appeared for the second kernel"
        km, kc = kernels.start()
        assert interpreter_spare(kc) == spare, "the second kernel's interpreter is not the spare's"
    procs = {
        name: (pid, when) for name, (pid, when) in json.loads(ok_cell(kc, _LEAVE_BEHIND)).items()
    }
    identities = {pid: when for pid, when in procs.values()}
    assert len(live_processes(container, identities)) == 4, "the cell's processes did not all start"
    km.signal_kernel(signal.SIGKILL)
    deadline = time.monotonic() + 10
    while km.is_alive() and time.monotonic() < deadline:
        time.sleep(0.1)
    assert not km.is_alive(), "the host kernel process survived SIGKILL"
    left = wait_gone(container, identities)
    names = {pid: name for name, (pid, _) in procs.items()}
    survivors = sorted(names[p] for p in left)
    assert not survivors, (
        f"{survivors} still exist {GONE_SECONDS} s after the kernel was killed:\n"
        + process_table(container)
    )


# -- 3b: a python3 and site code planted where the user's own programs are found ----------

# What a cell leaves behind: a `python3` (and `python`) first on the user's PATH that logs
# who ran it and then runs the real one, and a .pth file in the user's site-packages that
# logs the first flag of every interpreter that reads it. Both keep working, as an
# attacker's would, so nothing fails visibly: only the logs say who ran them.
_PLANT_PROGRAMS = r"""
import json, os, site
bin_dir = os.path.expanduser("~/.local/bin")
os.makedirs(bin_dir, exist_ok=True)
for name in ("python3", "python"):
    path = os.path.join(bin_dir, name)
    with open(path, "w") as fh:
        fh.write('#!/bin/sh\necho "$0 $1" >> /workspace/planted-python3.log\nexec /usr/bin/python3 "$@"\n')
    os.chmod(path, 0o755)
user_site = site.getusersitepackages()
os.makedirs(user_site, exist_ok=True)
with open(os.path.join(user_site, "zz-planted.pth"), "w") as fh:
    fh.write("import sys; open('/workspace/planted-site.log', 'ab').write(open('/proc/self/cmdline', 'rb').read().split(b'\\0')[1] + b'\\n')\n")
print(json.dumps(os.environ["PATH"].split(":")))
"""


def _first_path_entry(text: str) -> str:
    """The first folder of the PATH= line a command printed."""
    found = re.search(r"PATH=(/[^:\n]*)", text)
    assert found, f"no PATH= in {text[-500:]!r}"
    return found.group(1)


def _terminal_path(service: SandboxService, info: Any) -> str:
    """What a JupyterLab terminal of the sandbox says its PATH starts with (a login
    shell: the image's /etc/profile sets PATH anew)."""
    from sandbox_kernel.terminal import open_shell

    pty = open_shell(service, info)
    try:
        pty.write(b"echo PATH=$PATH; exit\r")
        seen = b""
        deadline = time.monotonic() + 60
        while b"\nPATH=/" not in seen.replace(b"\r", b"") or not seen.endswith(b"\n"):
            assert time.monotonic() < deadline, f"no PATH from the terminal: {seen[-500:]!r}"
            chunk = pty.read()
            if not chunk:
                break
            seen += chunk
        return _first_path_entry(seen.decode(errors="replace").replace("\r", ""))
    finally:
        pty.close()


def test_planted_python3_and_site_code_never_run_the_hosts_programs(kernels: Kernels) -> None:
    """Attack: a cell plants ``~/.local/bin/python3`` (first on the user's PATH) and a
    ``.pth`` file in the user's site-packages. Then everything the host starts in the
    sandbox runs: a new kernel's interpreter (cold and from the warm spare), the file
    helper (outside and inside the workspace), the folder walk,
    `sandbox-kernel exec` with a time limit, an agent's shell command, a terminal, and a
    full reaper round. None may run the planted python3, and only the kernels'
    interpreters (the user's own, started with ``-s -u``) may read the user's site code.
    The user keeps their PATH: cells, commands and terminals see ``~/.local/bin`` first."""
    from sandbox_kernel.agent_sessions import AgentSessions
    from sandbox_kernel.files import RemoteWorkspace
    from sandbox_kernel.sync import listing

    km1, kc1 = start_kernel(kernels)
    user_bin = "/home/sandbox/.local/bin"
    assert json.loads(ok_cell(kc1, _PLANT_PROGRAMS))[0] == user_bin
    container = kernels.container()
    wait_for_spare(container)
    _, kc2 = kernels.start()  # takes the spare
    _, kc3 = kernels.start()  # cold, or the next spare
    for kc in (kc2, kc3):
        assert ok_cell(kc, "import os; print(os.environ['PATH'].split(':')[0])").strip() == user_bin
    assert kernels.env is not None
    cfg = kernels.env.config()
    service = SandboxService(cfg)
    backend = service.backend
    info = backend.get(kernels.sandbox_id)
    sid = info.id
    backend.put_file(sid, "/tmp/probe.txt", b"probe")
    assert b"".join(backend.get_file(sid, "/tmp/probe.txt")) == b"probe"
    entries, _ = RemoteWorkspace(backend, sid).list("")
    assert "planted-python3.log" not in {e.name for e in entries}
    assert "planted-site.log" in {e.name for e in entries}  # the kernels read it
    listing(backend, sid, "/workspace")
    ran = service.exec(info, service.as_user(info, ["sh", "-c", "echo PATH=$PATH"]), timeout=30)
    assert ran.exit_code == 0 and _first_path_entry(ran.output.decode()) == user_bin, ran
    agent = AgentSessions(service, str(kernels.root)).run_command(
        kernels.env.user, "echo PATH=$PATH", 30, sandbox_id=sid
    )
    assert agent.exit_code == 0 and _first_path_entry(agent.stdout) == user_bin, agent
    assert _terminal_path(service, info).startswith("/")
    kc1.stop_channels()
    km1.shutdown_kernel(now=True)
    gc(backend, cfg)
    logs = json.loads(
        in_container(
            container,
            "import json, os\n"
            "print(json.dumps({f: open(f).read() if os.path.exists(f) else '' for f in "
            "('/workspace/planted-python3.log', '/workspace/planted-site.log')}))",
        )
    )
    assert logs["/workspace/planted-python3.log"] == "", f"the planted python3 ran: {logs}"
    readers = set(logs["/workspace/planted-site.log"].split())
    # Only the kernels' interpreters (`python3 -s -u`) read it: their agent adds the user's
    # site once restricted (tests/test_work_folders.py checks that order).
    assert readers <= {"-s"}, f"a program of the host read the user's site code: {readers}"


# -- 4 and 5: output that would swamp the notebook ---------------------------------------

_HOSTILE_WIRE = """
import gc, json, os
wires = [o for o in gc.get_objects() if type(o).__name__ == 'Wire' and isinstance(getattr(o, 'wfd', None), int)]
assert wires, 'no Wire object found'
line = (json.dumps({"ev": "display", "data": {"text/html": "%s" * %d}, "metadata": {}, "transient": {}, "update": False}) + "\\n").encode()
for _ in range(%d):
    view = memoryview(line)
    while view:
        view = view[os.write(wires[0].wfd, view):]
"""


def hostile_wire_cell(char: str, size: int, lines: int) -> str:
    """A cell that writes ``lines`` raw display events (``size`` characters of HTML
    each) straight to the agent's private protocol descriptor, past the agent."""
    return _HOSTILE_WIRE % (char, size, lines)


_UNFINISHED_WIRE = """
import gc, os
wire = [o for o in gc.get_objects() if type(o).__name__ == 'Wire' and isinstance(getattr(o, 'wfd', None), int)][0]
view = memoryview(b'{"ev":"stream","name":"stdout","text":"' + b'n' * %d)
while view:
    view = view[os.write(wire.wfd, view):]
"""

# name: (code, whether the cell's output passes the limit, so a notice must say so)
OUTPUT_CELLS: dict[str, tuple[str, bool]] = {
    "display x3": (
        "from IPython.display import HTML, display\nfor _ in range(3):\n    display(HTML('x' * 5_000_000))",
        True,
    ),
    "execute_result": ("'r' * 5_000_000", True),
    "update_display_data": (
        "from IPython.display import HTML, display\n"
        "h = display(HTML('a'), display_id=True)\n"
        "h.update(HTML('y' * 5_000_000))",
        True,
    ),
    "raw wire, 20 x 5 MB lines": (hostile_wire_cell("z", 5_000_000, 20), True),
    "raw wire, 20 x 0.9 MB lines": (hostile_wire_cell("w", 900_000, 20), True),
    # A line the cell leaves open: whatever the agent writes next would end it.
    "raw wire, 5 MB and no newline": (_UNFINISHED_WIRE % 5_000_000, True),
    "raw wire, a short line left open": (_UNFINISHED_WIRE % 6, False),
}
CELL_SECONDS = 15  # one output cell, start to reply (the largest sends 100 MB down the wire)


def test_output_limit_covers_every_message(kernels: Kernels) -> None:
    """Attack: a cell sends far more than SANDBOX_KERNEL_OUTPUT_LIMIT (1 MB here) as
    rich displays, as its result, as a display update, and as raw protocol lines
    written straight to the agent's private wire descriptor (found with
    ``gc.get_objects()``), bypassing the agent's own accounting: lines far over the
    limit, lines just under it, and a line left without its newline (5 MB, or a few
    bytes), which the agent's next message would complete. For every cell: it ends,
    at most ~1.2 MB of iopub content arrives, a notice says the output was truncated
    (when it was over the limit), and the kernel answers the next cell within
    ANSWER_SECONDS. A kernel that hangs is restarted to try the next attack."""
    km, kc = start_kernel(kernels, SANDBOX_KERNEL_OUTPUT_LIMIT=str(OUTPUT_LIMIT))
    problems = []
    for name, (code, over_limit) in OUTPUT_CELLS.items():
        try:
            reply, outputs = run(kc, code, timeout=CELL_SECONDS)
        except TimeoutError as exc:
            problems.append(f"{name}: the cell did not end within {CELL_SECONDS} s ({exc})")
            reply, outputs = {"status": "hung"}, []
        size = content_size(outputs)
        if reply["status"] not in ("ok", "hung"):
            problems.append(f"{name}: the cell failed: {reply.get('ename')}: {reply.get('evalue')}")
        if size > OUTPUT_LIMIT * OUTPUT_SLACK:
            kinds = sorted({m["msg_type"] for m in outputs})
            problems.append(
                f"{name}: {size / 1e6:.1f} MB of iopub content ({kinds}) for a 1 MB limit"
            )
        if over_limit and reply["status"] != "hung" and "truncated" not in all_text(outputs):
            problems.append(
                f"{name}: no notice that the output was truncated ({size} bytes arrived)"
            )
        try:
            if reply["status"] == "hung":
                raise TimeoutError("the kernel is still in the cell")
            answers(kc)
        except (AssertionError, TimeoutError) as exc:
            problems.append(
                f"{name}: the next cell did not answer within {ANSWER_SECONDS} s ({exc})"
            )
            km.restart_kernel(now=True)
            kc.wait_for_ready(timeout=60)
    assert not problems, "\n".join(problems)


_FLOODS = {
    "sys.stdout.write": (
        "import sys\n"
        "while True:\n"
        "    for _ in range(300):\n"
        "        sys.stdout.write('x' * (1 << 20))\n"
    ),
    "subprocess writing fd 1": (
        "import subprocess, sys\n"
        "subprocess.run([sys.executable, '-c', 'import os\\nb = b\"x\" * (1 << 20)\\nwhile True: os.write(1, b)'])\n"
    ),
}


@pytest.mark.parametrize("flood", list(_FLOODS))
def test_flood_without_newlines_keeps_kernel_responsive(kernels: Kernels, flood: str) -> None:
    """Attack: a cell writes hundreds of MB to stdout with no newline, from Python and
    from a subprocess on fd 1, and never stops by itself. The kernel must stay
    responsive: an interrupt ends the cell (within ANSWER_SECONDS), the output that
    arrived is truncated with a notice, and the next cell answers within
    ANSWER_SECONDS."""
    km, kc = start_kernel(kernels)  # the default output limit
    limit = SandboxConfig.output_limit.default_value
    msg_id = kc.execute(_FLOODS[flood])
    time.sleep(3)
    km.interrupt_kernel()
    try:
        reply, outputs = collect(kc, msg_id, time.monotonic() + ANSWER_SECONDS)
    except TimeoutError as exc:
        pytest.fail(
            f"the flooding cell did not end within {ANSWER_SECONDS} s of the interrupt: {exc}"
        )
    assert reply["status"] == "error" and reply["ename"] == "KeyboardInterrupt", reply
    assert "truncated" in all_text(outputs)
    assert content_size(outputs) <= limit * OUTPUT_SLACK
    answers(kc)
