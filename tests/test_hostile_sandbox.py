"""An attacker's test of the sandbox boundary, from code running INSIDE the sandbox.

The code in a sandbox is hostile (DESIGN.md): it runs as the sandbox user in the same
container as the interpreters the kernel talks to, it can start processes that outlive
its cell, write to any file descriptor its process holds, flood output, open sockets
to anything its network reaches, and change file modes in the workspace, which is a
host folder. Each test here is one such attack against real kernels (jupyter_client
against a test kernelspec) or real Docker sandboxes, and each checks that the attack
really happened (a listener was in place, a server answered its own container, the
host could reach its listener), so a pass never comes from an attack that did not run.

Every race is bounded in tries and in time; every process planted in a sandbox ends
by itself (``PLANT_SECONDS``) if the test cannot end it.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import signal
import socket
import stat
import subprocess
import sys
import threading
import time
import uuid
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import docker
import pytest
from jupyter_client.manager import start_new_kernel

from sandbox_kernel.agent import SPARE_SOCKET
from sandbox_kernel.backends.base import SandboxError, SandboxFailed, SandboxNotFound, engine_name
from sandbox_kernel.backends.docker import DockerBackend
from sandbox_kernel.config import SandboxConfig, load_config
from sandbox_kernel.housekeeping import GC_DELAY
from sandbox_kernel.identity import ScopeKey
from sandbox_kernel.lifecycle import gc
from sandbox_kernel.service import SandboxService
from sandbox_kernel.store import Store

from .conftest import TEST_IMAGE, remove_user_containers, sandbox_container
from .helpers import GRANDPARENT
from .kernel_env import KernelEnv, make_kernel_env

pytestmark = pytest.mark.docker

PLANT_SECONDS = 120  # no process a test plants in a sandbox outlives this
GONE_SECONDS = 20  # processes of an ended kernel must be gone within this
ANSWER_SECONDS = 10  # "the kernel answers the next cell" within this
CONNECT_SECONDS = 3  # one network attempt from a sandbox
OUTPUT_LIMIT = 1_000_000  # the output limit of the output tests, in bytes
OUTPUT_SLACK = 1.2  # what a cell may send past the limit (the notice, the protocol's bytes)
FORGED = "FORGED"


# -- helpers: containers ------------------------------------------------------------------


def engine() -> docker.DockerClient:
    return docker.from_env()


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


_LISTENER_PROBE = """
import json, socket, struct, sys
s = socket.socket(socket.AF_UNIX)
s.settimeout(2)
try:
    s.connect('\\0' + sys.argv[1][1:] if sys.argv[1].startswith('@') else sys.argv[1])
    pid = struct.unpack('3i', s.getsockopt(socket.SOL_SOCKET, socket.SO_PEERCRED, 12))[0]
except OSError:
    pid = 0
print(json.dumps(pid))
"""


def listener_at(container: Any, path: str) -> int:
    """The pid listening at a unix socket path in the container (0: nobody)."""
    return int(json.loads(in_container(container, _LISTENER_PROBE, path)))


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


# -- 1: a listener planted where the warm spare waits ---------------------------------------

# What a cell leaves listening at the spare's path: ``serve`` records every byte and every
# SCM_RIGHTS descriptor it is given and answers with forged agent output, on the
# connection and on every descriptor it got; given a kernel's channel (its fds 0 and 1)
# it plays a whole agent: a "ready" line, then FORGED and an ok reply to every request.
_PLANTED = """
import array, json, os, socket, threading, time
FORGED_LINE = b'{"ev":"stream","name":"stdout","text":"FORGED"}\\n'
READY = b'{"ev":"ready","python_version":"3.11.2","ipython":true,"pid":1}\\n'
REPLY = b'{"ev":"reply","content":{"status":"ok","execution_count":1,"user_expressions":{},"payload":[]}}\\n'
def _log(record, **fields):
    with open(record, 'a') as fh:
        fh.write(json.dumps(fields) + '\\n')
def _write(fd, data):
    try:
        os.write(fd, data)
    except OSError:
        pass
def _fake_agent(rfd, wfd):
    _write(wfd, READY + FORGED_LINE)
    buf = b''
    while True:
        try:
            chunk = os.read(rfd, 65536)
        except OSError:
            return
        if not chunk:
            return
        buf += chunk
        while b'\\n' in buf:
            line, buf = buf.split(b'\\n', 1)
            try:
                op = json.loads(line).get('op')
            except ValueError:
                continue
            if op not in ('interrupt', 'input_reply'):
                _write(wfd, FORGED_LINE + REPLY)
def serve(path, record, seconds):
    listener = socket.socket(socket.AF_UNIX)
    listener.bind('\\0' + path[1:] if path.startswith('@') else path)
    listener.listen(16)
    listener.settimeout(1)
    _log(record, ev='listening', pid=os.getpid())
    deadline = time.time() + seconds
    while time.time() < deadline:
        try:
            conn, _ = listener.accept()
        except socket.timeout:
            continue
        conn.settimeout(3)
        got, fds = 0, []
        try:
            while True:
                msg, anc, _, _ = conn.recvmsg(1 << 16, socket.CMSG_SPACE(64 * 4))
                new = array.array('i')
                for level, kind, data in anc:
                    if level == socket.SOL_SOCKET and kind == socket.SCM_RIGHTS:
                        new.frombytes(data[: len(data) - len(data) % 4])
                if not msg and not anc:
                    break
                got += len(msg)
                fds.extend(new)
                _log(record, ev='received', bytes=len(msg), fds=len(new))
                if len(new) >= 2:  # a channel: (stdin, stdout) of a kernel's start program
                    threading.Thread(target=_fake_agent, args=(new[0], new[-1]), daemon=True).start()
                for fd in new[:-1] if len(new) >= 2 else new:
                    _write(fd, FORGED_LINE)
                conn.sendall(b'k')
        except OSError:
            pass
        _log(record, ev='connection', bytes=got, fds=len(fds))
        conn.close()
"""

# The spare itself turned into the listener: a helper hands the waiting spare a channel of
# its own (two pipes), as a kernel would, and has it run ``serve`` in a thread. The
# listener at the path is then the very process the host recorded (same pid, same start
# time), so checking who listens is not enough.
_HIJACK = """
import json, os, socket, sys, time, array
path, record, seconds = sys.argv[1], sys.argv[2], float(sys.argv[3])
to_spare_r, to_spare_w = os.pipe()
from_spare_r, from_spare_w = os.pipe()
conn = socket.socket(socket.AF_UNIX)
conn.settimeout(10)
try:
    conn.connect('\\0' + path[1:] if path.startswith('@') else path)
    settings = json.dumps({'env': {}, 'cwd': '/workspace'}).encode() + b'\\n'
    conn.sendmsg([settings], [(socket.SOL_SOCKET, socket.SCM_RIGHTS, array.array('i', [to_spare_r, from_spare_w]))])
    answer = conn.recv(1)
except OSError as exc:
    answer = repr(exc).encode()
if answer not in (b'k', b'K'):  # the spare would not serve us: the attack ends here
    with open(record, 'a') as fh:
        fh.write(json.dumps({'ev': 'refused', 'answer': answer.decode(errors='replace')}) + '\\n')
    sys.exit()
os.close(to_spare_r)
os.close(from_spare_w)
code = sys.argv[4] + '\\nimport threading\\nthreading.Thread(target=serve, args=(%r, %r, %r), daemon=True).start()' % (path, record, seconds)
os.write(to_spare_w, json.dumps({'op': 'execute', 'code': code, 'silent': False, 'store_history': False,
                                  'user_expressions': {}, 'allow_stdin': False}).encode() + b'\\n')
deadline = time.time() + seconds
os.set_blocking(from_spare_r, False)
while time.time() < deadline:  # hold the spare's channel open, and drain what it says
    try:
        if not os.read(from_spare_r, 65536):
            break
    except BlockingIOError:
        time.sleep(0.2)
"""

# An abstract socket (SPARE_SOCKET starts with "@") has no file to unlink: that way of
# taking the spare's place does not exist there.
PLANT_MODES = ("kill", "hijack") if SPARE_SOCKET.startswith("@") else ("kill", "unlink", "hijack")


def plant_cell(record: str, mode: str) -> str:
    """A cell that takes the spare's place at SPARE_SOCKET and leaves a listener there,
    detached: ``kill`` kills the waiting spare first, ``unlink`` only removes its socket
    file (the spare lives on), ``hijack`` makes the spare itself the listener.
    Prints the spare's pid and the listener's."""
    return f"""
import json, os, signal, socket, struct, subprocess, sys, time
P, RECORD, PLANTED, HIJACK = {SPARE_SOCKET!r}, {record!r}, {_PLANTED!r}, {_HIJACK!r}
SECONDS = '{PLANT_SECONDS}'
spare = 0
probe = socket.socket(socket.AF_UNIX)
probe.settimeout(2)
try:
    probe.connect('\\0' + P[1:] if P.startswith('@') else P)
    spare = struct.unpack('3i', probe.getsockopt(socket.SOL_SOCKET, socket.SO_PEERCRED, 12))[0]
except OSError:
    pass
probe.close()
if {mode!r} == 'kill' and spare:
    os.kill(spare, signal.SIGKILL)
if {mode!r} != 'hijack':
    try:
        os.unlink(P)
    except OSError:
        pass
if {mode!r} == 'hijack':
    argv = [sys.executable, '-c', HIJACK, P, RECORD, SECONDS, PLANTED]
else:
    argv = [sys.executable, '-c', PLANTED + '\\nimport sys\\nserve(sys.argv[1], sys.argv[2], float(sys.argv[3]))', P, RECORD, SECONDS]
subprocess.Popen(argv,
                 start_new_session=True, stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL,
                 stderr=subprocess.DEVNULL, close_fds=True)
deadline = time.time() + 15
first = {{}}
while time.time() < deadline and not first:
    time.sleep(0.05)
    try:
        first = json.loads(open(RECORD).readline())
    except (OSError, ValueError):
        pass
print(json.dumps({{'spare': spare, 'planted': first.get('pid', 0), 'refused': first.get('ev') == 'refused'}}))
"""


def wait_for_spare(container: Any, seconds: float = 20, not_these: tuple[int, ...] = ()) -> int:
    """The pid of a warm spare listening at SPARE_SOCKET (0 if none came in time);
    ``not_these``: listeners planted earlier, which are not spares."""
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        pid = listener_at(container, SPARE_SOCKET)
        if pid and pid not in not_these:
            time.sleep(0.5)  # the host records a spare a moment after it listens
            return pid
        time.sleep(0.5)
    return 0


def read_record(container: Any, record: str) -> list[dict]:
    out = in_container(
        container, "import sys; print(open(sys.argv[1]).read())", record, check=False
    )
    return [json.loads(line) for line in out.splitlines() if line.strip()]


# A cell of an interpreter the warm spare forked hunts its own memory (which is a copy
# of the spare's) for the spare's secret: every 64-hex-digit string, each tried against
# the spare as a kernel's start program would present it. A string the cell planted
# itself proves that the hunt sees what is in memory.
_HUNT_SECRET = f"""
import array, ctypes, json, os, re, secrets, socket
ctypes.CDLL(None).prctl(4, 1, 0, 0, 0)  # dumpable again: /proc/self/mem opens (our own)
planted = bytearray(secrets.token_hex(32).encode())
runs = set()
pattern = re.compile(rb'[0-9a-f]{{64,}}')
with open('/proc/self/maps') as fh:
    maps = fh.read().splitlines()  # all of it before reading: our reads map memory
with open('/proc/self/mem', 'rb', 0) as mem:
    for line in maps:
        fields = line.split()
        if 'r' not in fields[1] or (len(fields) > 5 and fields[5] in ('[vvar]', '[vsyscall]')):
            continue
        start, end = (int(x, 16) for x in fields[0].split('-'))
        try:
            mem.seek(start)
            chunk = mem.read(end - start)
        except (OSError, OverflowError, ValueError):
            continue
        runs.update(m.group() for m in pattern.finditer(chunk))
seen_planted = any(bytes(planted) in run for run in runs)
# Every 64-digit window of the runs (a copy may sit next to other hex digits).
found = {{run[i:i + 64] for run in runs if len(run) <= 256 for i in range(len(run) - 63)}}
found.discard(bytes(planted))
path = {SPARE_SOCKET!r}
address = '\\0' + path[1:] if path.startswith('@') else path
accepted = []
for candidate in sorted(found)[:300]:
    r, w = os.pipe()
    conn = socket.socket(socket.AF_UNIX)
    conn.settimeout(5)
    try:
        conn.connect(address)
        settings = json.dumps({{'env': {{}}, 'cwd': '/workspace'}}).encode()
        conn.sendmsg([candidate + b'\\n' + settings + b'\\n'],
                     [(socket.SOL_SOCKET, socket.SCM_RIGHTS, array.array('i', [r, w]))])
        if conn.recv(1) == b'K':
            accepted.append(candidate.decode())
    except OSError:
        pass
    finally:
        conn.close()
        os.close(r)
        os.close(w)
print(json.dumps({{'planted_seen': seen_planted, 'runs': sorted(r.decode() for r in runs),
                  'accepted': accepted}}))
"""


# The hunt's way of presenting a candidate, from the host with the real secret: the spare
# must serve it (the proof that a candidate the hunt presents would have been served).
_PRESENT = f"""
import array, json, os, socket, sys
path = {SPARE_SOCKET!r}
r, w = os.pipe()
conn = socket.socket(socket.AF_UNIX)
conn.settimeout(5)
conn.connect('\\0' + path[1:] if path.startswith('@') else path)
settings = json.dumps({{'env': {{}}, 'cwd': '/workspace'}}).encode()
conn.sendmsg([sys.argv[1].encode() + b'\\n' + settings + b'\\n'],
             [(socket.SOL_SOCKET, socket.SCM_RIGHTS, array.array('i', [r, w]))])
print(conn.recv(1).decode())
"""


def test_a_spares_child_holds_no_copy_of_its_secret(kernels: Kernels) -> None:
    """Attack: the warm spare forks every kernel's interpreter, so each starts as a copy
    of the spare's memory, where the secret that makes the spare serve someone lives.
    A cell that found it could have the spare fork interpreters for it, outside its
    kernel's process tree and free of its kernel's Landlock rule. The cell of a kernel
    the spare served hunts its own memory for every 64-hex-digit string and presents
    each to the spare: none may be the secret the host recorded, and the spare must
    serve none. The hunt must see the string the cell planted (the proof it looks)."""
    start_kernel(kernels)
    container = kernels.container()
    spare = wait_for_spare(container)
    assert spare, "no warm spare appeared for the second kernel"
    _, kc = kernels.start()
    assert interpreter_spare(kc) == spare, "the second kernel's interpreter is not the spare's"
    assert kernels.env is not None
    record = Store(kernels.env.config()).spare("docker", kernels.sandbox_id)
    assert record is not None and len(record.secret) == 64, "the host recorded no spare secret"
    hunt = json.loads(ok_cell(kc, _HUNT_SECRET, timeout=120))
    assert hunt["planted_seen"], "the hunt did not see the string it planted (test bug)"
    assert not [r for r in hunt["runs"] if record.secret in r], (
        "the spare's secret is in its child's memory"
    )
    assert hunt["accepted"] == [], f"the spare served a cell: {hunt['accepted']}"
    assert listener_at(container, SPARE_SOCKET) == spare, "the spare no longer waits"
    assert in_container(container, _PRESENT, record.secret).strip() == "K", (
        "the spare refused its own secret presented as the hunt presents one (test bug)"
    )


# A cell's hunt for interpreters as they start: every new process of the sandbox is
# tried, again and again until it ends or the hunt does, for an open of its stdin
# through /proc (what the host sends next could then be copied with tee(2), and the
# same check guards ptrace). Its own child proves that such an open works. Only the
# interpreters' start programs count: the host's short helpers (python3 -I -c) start
# from python3 as it is.
_HUNT_STARTS = r"""
import os, subprocess, threading, time
hunt = {"seen": {}, "opened": [], "own_child": False, "control": False}
def _hunt(stop, hunt, known):
    tries = {}
    while not stop.is_set():
        for p in os.listdir("/proc"):
            if not p.isdigit() or p in known:
                continue
            tries[p] = tries.get(p, 0) + 1
            if b"# " not in hunt["seen"].get(p, b""):  # until it is python3 running ours
                try:
                    hunt["seen"][p] = open("/proc/%s/cmdline" % p, "rb").read()[:200]
                except OSError:
                    pass
            try:
                fd = os.open("/proc/%s/fd/0" % p, os.O_RDONLY | os.O_NONBLOCK)
            except FileNotFoundError:
                known.add(p)
                continue
            except OSError:
                if tries[p] > 20000:
                    known.add(p)
                continue
            # Opened mid-exec, the command line may not be there yet: wait for it.
            now = b""
            for _ in range(200):
                try:
                    now = open("/proc/%s/cmdline" % p, "rb").read()[:200]
                except OSError:
                    break
                if b"# " in now:
                    break
                time.sleep(0.001)
            os.close(fd)
            known.add(p)
            if p == str(hunt.get("child")):
                hunt["own_child"] = True
            elif b"# Started as" in now:  # a start program of ours (boot.py)
                hunt["opened"].append(now.decode("utf-8", "replace")[:60])
            elif b"# control" in now:  # python3 started by the host, as ours once were
                hunt["control"] = True
_child = subprocess.Popen(["sleep", "3"], stdin=subprocess.PIPE)
hunt["child"] = _child.pid
hunt_stop = threading.Event()
# What runs now, before the cell returns (the thread may start later than that).
known = set(os.listdir("/proc")) - {str(hunt["child"])}
hunt_thread = threading.Thread(target=_hunt, args=(hunt_stop, hunt, known), daemon=True)
hunt_thread.start()
threading.Timer(PLANT_SECONDS, hunt_stop.set).start()
"""

_HUNT_REPORT = r"""
import json
time.sleep(0.5)
hunt_stop.set(); hunt_thread.join()
boots = [c for c in hunt["seen"].values() if b"# Started as" in c]
print(json.dumps({"boots": len(boots), "opened": hunt["opened"], "own_child": hunt["own_child"],
                  "control": hunt["control"]}))
"""


def test_a_cell_cannot_open_an_interpreter_as_it_starts(kernels: Kernels) -> None:
    """Attack: a process the host starts in the sandbox is, for its first milliseconds,
    an ordinary process of the sandbox's uid, until it makes itself non-dumpable. A cell
    that hunts new processes could open its stdin through /proc in that moment, and copy
    with tee(2) (without taking it away) what the host sends next: another kernel's
    token for its socket, the spare's secret. It could also ptrace it (the same check).
    The host starts interpreters from an unreadable copy of python3, non-dumpable from
    their first instruction: hunting through a warm start and a cold one, the cell
    opens none of them, though it sees them start and opens its own child."""
    _, kc = start_kernel(kernels)
    container = kernels.container()
    assert kernels.env is not None
    store = Store(kernels.env.config())
    deadline = time.monotonic() + 30
    while (python := store.python_for("docker", kernels.sandbox_id, container.id)) is None:
        assert time.monotonic() < deadline, "the host made no unreadable python3"
        time.sleep(0.3)
    assert python.endswith("/.sandbox-kernel-python3"), python
    spare = wait_for_spare(container)
    assert spare, "no warm spare appeared for the second kernel"

    backend = SandboxService(kernels.env.config()).backend

    def hunt_through(start: Callable[[], tuple[Any, Any]]) -> tuple[Any, dict]:
        """Start a kernel while the cell hunts, and a plain python3 from the host
        beside it, which the hunt must catch (the proof that it is quick enough)."""
        ok_cell(kc, _HUNT_STARTS.replace("PLANT_SECONDS", str(PLANT_SECONDS)))
        control = backend.open_channel(
            kernels.sandbox_id, ["python3", "-c", "# control\nimport time; time.sleep(5)"]
        )
        try:
            _, started = start()
            return started, json.loads(ok_cell(kc, _HUNT_REPORT))
        finally:
            control.close()

    warm, first = hunt_through(kernels.start)
    assert interpreter_spare(warm) == spare, "the second kernel's interpreter is not the spare's"
    time.sleep(GC_DELAY + 1)  # the warm kernel's housekeeping saw its spare alive
    ok_cell(kc, f"import os, signal; os.kill({spare}, signal.SIGKILL)")
    deadline = time.monotonic() + 10
    while listener_at(container, SPARE_SOCKET):  # no spare at all: the next start is cold
        assert time.monotonic() < deadline, "a spare still listens"
        time.sleep(0.2)
    cold, second = hunt_through(kernels.start)
    assert interpreter_spare(cold) != spare, "the third kernel did not start cold"

    for hunt in (first, second):
        assert hunt["own_child"], f"the hunt could not open even its own child (test bug): {hunt}"
        assert hunt["control"], f"the hunt missed python3 started by the host (test bug): {hunt}"
        assert hunt["boots"] >= 1, f"the hunt saw no interpreter start (test bug): {hunt}"
        assert hunt["opened"] == [], f"a cell opened a starting interpreter: {hunt['opened']}"
    seen = ok_cell(
        cold,
        "import ctypes, os, sys\n"
        "print(sys.executable, ctypes.CDLL(None).prctl(3, 0, 0, 0, 0), os.path.basename("
        "open('/proc/self/cmdline', 'rb').read().split(b'\\0')[0].decode()))",
    ).split()
    assert seen == [python.rsplit("/", 1)[0] + "/python3", "0", ".sandbox-kernel-python3"], seen
    # Without the race: the cell starts the copy and python3 itself, and tries each.
    tried = json.loads(ok_cell(kc, _OPEN_OWN_START.replace("COPY", repr(python))))
    assert tried == {"copy": "denied", "python3": "opened"}, tried


_OPEN_OWN_START = r"""
import json, os, subprocess, time
tried = {}
for name, program in (("copy", COPY), ("python3", "python3")):
    child = subprocess.Popen([program, "-I", "-c", "import time; time.sleep(30)"], stdin=subprocess.PIPE)
    time.sleep(0.5)
    try:
        os.close(os.open("/proc/%d/fd/0" % child.pid, os.O_RDONLY | os.O_NONBLOCK))
        tried[name] = "opened"
    except PermissionError:
        tried[name] = "denied"
    child.kill()
    child.wait()
print(json.dumps(tried))
"""


def test_a_frozen_spare_costs_one_cold_start_and_is_replaced(kernels: Kernels) -> None:
    """Attack: a cell stops the warm spare (SIGSTOP: same uid), so the next kernel's
    hand-over waits on a spare that never answers. That kernel must still start (cold,
    once its start program gives up) and answer; it forgets the frozen spare, a new
    spare takes its place, and the kernel after that gets a child of the new one."""
    _, kc1 = start_kernel(kernels)
    container = kernels.container()
    frozen = wait_for_spare(container)
    assert frozen, "no warm spare appeared"
    assert kernels.env is not None
    before = Store(kernels.env.config()).spare("docker", kernels.sandbox_id)
    assert before is not None and before.pid == frozen, f"the host records {before}"
    ok_cell(kc1, f"import os, signal\nos.kill({frozen}, signal.SIGSTOP)")
    _, kc2 = kernels.start()
    assert interpreter_spare(kc2) != frozen, "the frozen spare served a kernel"
    assert ok_cell(kc2, "print('answers')") == "answers\n"
    fresh = wait_for_spare(container, seconds=30, not_these=(frozen,))
    assert fresh, "no new spare replaced the frozen one"
    record = Store(kernels.env.config()).spare("docker", kernels.sandbox_id)
    assert record is not None and record.pid == fresh, f"the host records {record}"
    _, kc3 = kernels.start()
    assert interpreter_spare(kc3) == fresh, "the next kernel did not take the new spare's child"
    # The cold interpreter was forked from the start program that held the frozen
    # spare's secret: no copy of it may be left there for a cell to find.
    hunt = json.loads(ok_cell(kc2, _HUNT_SECRET, timeout=120))
    assert hunt["planted_seen"], "the hunt did not see the string it planted (test bug)"
    assert not [r for r in hunt["runs"] if before.secret in r], (
        "the start program's copy of the secret is in the cold interpreter's memory"
    )
    assert hunt["accepted"] == [], f"the spare served a cell: {hunt['accepted']}"


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
        assert listener_at(container, SPARE_SOCKET) != spare, "the spare was not killed"
    marker = f"sk-orphan-{uuid.uuid4().hex[:8]}"
    kc.execute(f"MARKER = {marker!r}\n" + _DIE_LEAVING_A_DAEMON)
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
    answers(kc, 60)


def test_planted_spare_listener_gets_nothing(kernels: Kernels) -> None:
    """Attack: a cell takes the warm spare's place at SPARE_SOCKET with a listener of
    its own that records every byte and descriptor it is handed and answers as a fake
    agent with forged output. Three rounds, each against a fresh spare: the spare is
    killed; its socket file only unlinked (it lives on, as recorded); the spare itself
    is handed a channel by the cell and made to run the listener (the pid and start
    time the host recorded are then the listener's). Each time a NEW kernel on the
    sandbox must run its first cell untouched (exactly "genuine\\n", no FORGED) and
    the planted listener must have received nothing: no byte, no descriptor."""
    _, kc1 = start_kernel(kernels)
    container = kernels.container()
    planter = kc1
    plants: list[int] = []
    problems = []
    for round_no, mode in enumerate(PLANT_MODES, start=1):
        # Each kernel leaves a warm spare for the next one a moment after it starts (a
        # product without spares is attacked all the same: the listener is planted).
        spare = wait_for_spare(container, not_these=tuple(plants))
        record = f"/workspace/planted-{round_no}.jsonl"
        planted = json.loads(ok_cell(planter, plant_cell(record, mode)))
        assert planted["spare"] == spare, (
            f"{mode}: the cell found {planted['spare']} at the path, not the spare {spare}"
        )
        if planted["refused"]:
            assert mode == "hijack"  # the spare would not serve the cell: nothing is planted
        else:
            assert planted["planted"], f"{mode}: the planted listener did not start"
            plants.append(planted["planted"])
            # The attack is in place: the planted listener, not a spare, listens at the path.
            assert listener_at(container, SPARE_SOCKET) == planted["planted"], (
                f"{mode}: displaced before the kernel came"
            )
        _, kc_new = kernels.start()
        reply, outputs = run(kc_new, 'print("genuine")')
        seen = read_record(container, record)
        pieces = [e for e in seen if e.get("ev") == "received"]  # logged as they arrive
        received = sum(e["bytes"] for e in pieces), sum(e["fds"] for e in pieces)
        if (
            reply["status"] != "ok"
            or text_of(outputs) != "genuine\n"
            or FORGED in all_text(outputs)
        ):
            problems.append(
                f"{mode}: the new kernel's first cell gave {reply['status']} {all_text(outputs)!r}"
            )
        if received != (0, 0):
            problems.append(
                f"{mode} (spare {spare}, listener {planted['planted']}): the planted listener received "
                f"{received[0]} bytes and {received[1]} descriptors"
            )
        planter = kc_new  # the next round plants from the newest kernel (the older ones stay)
    assert not problems, "\n".join(problems)


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
# A pid hopper: forks and lets the parent exit, again and again, so its pid is never the
# one a killer read a moment ago (its command line carries the marker in argv).
hopper = 'import os, sys, time\\nwhile time.time() < float(sys.argv[1]):\\n    try:\\n        if os.fork(): os._exit(0)\\n    except OSError:\\n        time.sleep(0.01)\\n'
subprocess.Popen([sys.executable, '-c', hopper, str(time.time() + 30), MARKER], start_new_session=True)
time.sleep(0.3)  # the setsid child has called setsid by now
print(json.dumps({name: [pid, _start_time(pid)] for name, pid in procs.items()}))
"""
)


# Freezes the processes that watch this interpreter for its kernel (WARM: whether a warm
# spare forked it): its parent, the watcher, and for a warm one also the start program of
# its kernel (its command line names the spare's socket and the spare's pid, the
# watcher's parent; in these tests one kernel only takes a spare's child). The spare
# itself is never stopped. SIGSTOP needs no privilege: same uid.
_STOP_SUPERVISORS = f"""
import json, os, signal
me, parent = os.getpid(), os.getppid()
found = {{parent}} if parent > 1 else set()
if WARM:
    stat = open('/proc/%d/stat' % parent).read()
    spare = int(stat.rsplit(')', 1)[1].split()[1])
    for p in os.listdir('/proc'):
        if not p.isdigit() or int(p) == me:
            continue
        try:
            argv = open('/proc/%s/cmdline' % p, 'rb').read().split(b'\\0')
        except OSError:
            continue
        if {SPARE_SOCKET!r}.encode() in argv and str(spare).encode() in argv:
            found.add(int(p))
for pid in found:
    os.kill(pid, signal.SIGSTOP)
print(json.dumps(sorted(found)))
"""


def leave_behind_then_kill(kernels: Kernels, start: str, stop_supervisors: bool) -> None:
    """A cell of a kernel (``start``: cold or a warm spare) leaves processes behind, its
    kernel is killed hard; none of them may exist GONE_SECONDS later."""
    km, kc = start_kernel(kernels)
    container = kernels.container()
    spare = wait_for_spare(container) if start == "spare" else 0
    if start == "spare":
        assert spare, "no warm spare appeared for the second kernel"
        km, kc = kernels.start()
    marker = f"sk-hopper-{uuid.uuid4().hex[:8]}"
    cell = f"MARKER = {marker!r}\n" + _LEAVE_BEHIND
    procs = {name: (pid, when) for name, (pid, when) in json.loads(ok_cell(kc, cell)).items()}
    identities = {pid: when for pid, when in procs.values()}
    assert len(live_processes(container, identities)) == 4, "the cell's processes did not all start"
    assert marked_processes(container, marker), "the pid hopper is not running"
    if start == "spare":
        assert interpreter_spare(kc) == spare, "the second kernel's interpreter is not the spare's"
    if stop_supervisors:
        stopped = json.loads(ok_cell(kc, f"WARM = {start == 'spare'}\n" + _STOP_SUPERVISORS))
        assert stopped, "the cell found nothing watching its interpreter"
        states = json.loads(in_container(container, _PROC_IDENTITY, json.dumps(stopped)))
        assert {state for _, state in states.values()} == {"T"}, (
            f"the supervisors were not stopped: {states}"
        )
    km.signal_kernel(signal.SIGKILL)
    killed = time.monotonic()
    deadline = killed + 10
    while km.is_alive() and time.monotonic() < deadline:
        time.sleep(0.1)
    assert not km.is_alive(), "the host kernel process survived SIGKILL"
    if stop_supervisors:
        # Nothing in the sandbox can act now: the host's reaper (run by the server every
        # few minutes, by the next kernel's start, by `sandbox-kernel gc`) ends them.
        assert kernels.env is not None
        cfg = kernels.env.config()
        gc(SandboxService(cfg).backend, cfg)
    left = wait_gone(container, identities)
    names = {pid: name for name, (pid, _) in procs.items()}
    while True:
        hoppers = marked_processes(container, marker)
        if not hoppers or time.monotonic() > killed + GONE_SECONDS:
            break
    survivors = sorted(names[p] for p in left) + (["pid hopper"] if hoppers else [])
    assert not survivors, (
        f"{survivors} still exist {GONE_SECONDS} s after the kernel was killed:\n"
        + process_table(container)
    )


@pytest.mark.parametrize("start", ["cold", "spare"])
def test_killed_kernel_leaves_no_process(kernels: Kernels, start: str) -> None:
    """Attack: a cell starts ``sleep 1000``, a process that calls setsid(), a
    double-forked daemon and a pid hopper (forks and exits, over and over, so no pid
    read a moment ago is still its own), then its kernel is killed hard (SIGKILL to
    the host kernel process: no shutdown message ever reaches the sandbox). Within
    GONE_SECONDS none of them, nor the interpreter, may exist in the container.
    ``spare``: the kernel's interpreter is a warm spare it took over; ``cold``: one it
    started itself."""
    leave_behind_then_kill(kernels, start, stop_supervisors=False)


@pytest.mark.parametrize("start", ["cold", "spare"])
def test_killed_kernel_leaves_no_process_even_with_its_watcher_frozen(
    kernels: Kernels, start: str
) -> None:
    """Attack: as above, but first the cell SIGSTOPs whatever in the sandbox watches
    its interpreter for the kernel (same uid: no privilege needed), so no process in
    the sandbox is left to act when the kernel dies. Then the host's reaper must: after
    one run, within GONE_SECONDS nothing the cell started, nor the interpreter, exists."""
    leave_behind_then_kill(kernels, start, stop_supervisors=True)


# A daemon of the cell (a session of its own) that waits until its interpreter is
# stopped (whose threads come and go, freeing pids), then forks sleepers until the
# sandbox may have no process more, and goes on taking every pid that comes free.
_TAKE_EVERY_PID = """
import os, time
interpreter = os.getpid()
daemon = os.fork()
if daemon == 0:
    os.setsid()
    while open("/proc/%d/stat" % interpreter).read().rsplit(")", 1)[1].split()[0] != "T":
        time.sleep(0.01)
    while True:
        try:
            if os.fork() == 0:
                while True:
                    time.sleep(1000)
        except OSError:  # the pid limit: try again at once, to win every pid freed
            pass
print(daemon)
"""


def _pids_cgroup(container_id: str) -> Path:
    from sandbox_kernel.backends.docker.cgroups import _cgroup_dirs

    found = [d for d in _cgroup_dirs(container_id, "pids") if (d / "pids.max").exists()]
    if not found:
        pytest.skip("this host does not show the container's pids cgroup")
    return found[0]


def _stat_field(host_pid: int, index: int) -> str:
    """Field ``index`` after the command of /proc/<pid>/stat (0: state, 3: session,
    19: start time), as this host sees it; "" when the process is gone."""
    try:
        stat = Path(f"/proc/{host_pid}/stat").read_bytes()
    except OSError:
        return ""
    return stat[stat.rfind(b")") + 2 :].split()[index].decode()


def _host_pid(container_id: str, inner_pid: int, start: str) -> int:
    """The host pid of the container's process ``inner_pid`` that started at ``start``."""
    from sandbox_kernel.backends.docker.cgroups import container_pids

    for pid in container_pids(container_id) or []:
        if _inner_of(pid) == inner_pid and _stat_field(pid, 19) == start:
            return pid
    raise AssertionError(f"no process {inner_pid} in the container")


def test_killed_kernel_leaves_no_process_even_with_every_pid_taken(kernels: Kernels) -> None:
    """Attack: the cell stops its interpreter's watcher; a daemon of it waits until the
    interpreter is stopped too (here by the test, from the host: the daemon could as
    well), then takes every pid the sandbox may have; the kernel is killed hard. No
    program of ours in the sandbox can start a process now, so the host's reaper must
    end them from outside: within GONE_SECONDS none of the daemon's processes, nor the
    interpreter or its watcher, exists, and the sandbox answers a new kernel's cell."""
    from sandbox_kernel.backends.docker.cgroups import container_pids

    km, kc = start_kernel(kernels)
    container = kernels.container()
    [(inner, started)] = interpreter(kc).items()
    interpreter_pid = _host_pid(container.id, inner, started)
    watcher_pid = int(_stat_field(interpreter_pid, 1))
    assert json.loads(ok_cell(kc, "WARM = False\n" + _STOP_SUPERVISORS)), "nothing watched"
    daemon_inner = int(ok_cell(kc, _TAKE_EVERY_PID))
    os.kill(interpreter_pid, signal.SIGSTOP)  # its reply is in: the daemon may begin
    pids = _pids_cgroup(container.id)
    limit = int((pids / "pids.max").read_text())

    def wait_full(why: str) -> None:
        deadline = time.monotonic() + 60
        while int((pids / "pids.current").read_text()) < limit:
            assert time.monotonic() < deadline, why
            time.sleep(0.1)

    wait_full("the cell's daemon did not take every pid")
    # The point of the attack: nothing in there can start a process (an exec joins the
    # sandbox from outside, but cannot fork once in).
    forked = container.exec_run(["sh", "-c", "/bin/true && echo forked"], user="1000")
    assert b"forked" not in forked.output, "a process could still fork: no attack"
    km.signal_kernel(signal.SIGKILL)
    killed = time.monotonic()
    while km.is_alive() and time.monotonic() < killed + 10:
        time.sleep(0.1)
    assert not km.is_alive(), "the host kernel process survived SIGKILL"
    wait_full("the cell's daemon did not keep every pid")
    # The daemon's processes: its session (a warm spare may have started meanwhile).
    session = next(
        p
        for p in container_pids(container.id) or []
        if _stat_field(p, 3) == str(p) and daemon_inner == _inner_of(p)
    )
    doomed = {
        p: _stat_field(p, 19)
        for p in container_pids(container.id) or []
        if _stat_field(p, 3) == str(session)
    }
    assert len(doomed) > 50, f"the daemon's session holds only {len(doomed)} processes"
    doomed.update({p: _stat_field(p, 19) for p in (interpreter_pid, watcher_pid)})
    assert kernels.env is not None
    cfg = kernels.env.config()
    gc(SandboxService(cfg).backend, cfg)
    while True:  # what was there, and anything of the session forked since
        left = [p for p, start in doomed.items() if start and _stat_field(p, 19) == start]
        left += _session_of(container.id, session)
        if not left or time.monotonic() > killed + GONE_SECONDS:
            break
        time.sleep(0.2)
    assert not left, f"{len(set(left))} of the {len(doomed)} processes outlived the kernel"
    _, kc2 = kernels.start()
    assert ok_cell(kc2, "print(6 * 7)").strip() == "42"


def _session_of(container_id: str, leader: int) -> list[int]:
    """Host pids of the container's processes in the session of host pid ``leader``."""
    from sandbox_kernel.backends.docker.cgroups import container_pids

    return [p for p in container_pids(container_id) or [] if _stat_field(p, 3) == str(leader)]


# A daemon of the cell (a session of its own) whose main thread exits while another
# thread forks: the process then reads as a zombie, yet lives and forks on.
_HEADLESS_DAEMON = """
import ctypes, os, threading, time
daemon = os.fork()
if daemon == 0:
    os.setsid()
    def fork_on():
        while True:
            if os.fork() == 0:
                time.sleep(1000)
                os._exit(0)
            time.sleep(0.2)
    threading.Thread(target=fork_on).start()
    time.sleep(0.3)
    ctypes.CDLL(None).pthread_exit(None)
print(daemon)
"""


def test_killed_kernel_leaves_no_headless_daemon(kernels: Kernels) -> None:
    """Attack: the cell stops its interpreter's watcher and leaves a daemon whose main
    thread exited while another thread forks on (it shows as a zombie; on cgroup v1
    its /proc cgroup file reads "/" too); the kernel is killed hard. The host's reaper
    must end it and all it forked: within GONE_SECONDS its session is empty."""
    km, kc = start_kernel(kernels)
    container = kernels.container()
    assert json.loads(ok_cell(kc, "WARM = False\n" + _STOP_SUPERVISORS)), "nothing watched"
    daemon_inner = int(ok_cell(kc, _HEADLESS_DAEMON))
    time.sleep(1)  # its main thread is gone and it has forked
    session = next(
        p
        for p in _container_pids(container.id)
        if _inner_of(p) == daemon_inner and _stat_field(p, 3) == str(p)
    )
    assert _stat_field(session, 0) == "Z", "the daemon's main thread did not exit"
    assert len(_session_of(container.id, session)) > 1, "the headless daemon did not fork"
    km.signal_kernel(signal.SIGKILL)
    killed = time.monotonic()
    while km.is_alive() and time.monotonic() < killed + 10:
        time.sleep(0.1)
    assert kernels.env is not None
    cfg = kernels.env.config()
    gc(SandboxService(cfg).backend, cfg)
    while _session_of(container.id, session) and time.monotonic() < killed + GONE_SECONDS:
        time.sleep(0.2)
    left = _session_of(container.id, session)
    assert not left, f"{len(left)} processes of the headless daemon outlived the kernel"


def _container_pids(container_id: str) -> list[int]:
    from sandbox_kernel.backends.docker.cgroups import container_pids

    return container_pids(container_id) or []


def _inner_of(host_pid: int) -> int:
    """The pid of a host process inside its own pid namespace (0 when it is gone)."""
    try:
        status = Path(f"/proc/{host_pid}/status").read_text()
    except OSError:
        return 0
    return next(
        (int(line.split()[-1]) for line in status.splitlines() if line.startswith("NSpid:")), 0
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
    helper (outside and inside the workspace), the folder walk, the process reaper,
    `sandbox-kernel exec` with a time limit, an agent's shell command, a terminal, and a
    full reaper round. None may run the planted python3, and only the kernels'
    interpreters (the user's own, started with ``-s -u``) may read the user's site code.
    The user keeps their PATH: cells, commands and terminals see ``~/.local/bin`` first."""
    from sandbox_kernel.agent_sessions import AgentSessions
    from sandbox_kernel.files import RemoteWorkspace
    from sandbox_kernel.lifecycle import end_processes
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
    end_processes(backend, sid, "[]")
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
    # site once hardened and restricted (tests/test_work_folders.py checks that order).
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


# -- helpers: sandboxes made by a backend ----------------------------------------------------

_TCP_SERVER = """
import socket, sys, time
server = socket.socket()
server.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
server.bind((sys.argv[1], int(sys.argv[2])))
server.listen(16)
server.settimeout(1)
deadline = time.time() + float(sys.argv[4])
while time.time() < deadline:
    try:
        conn, _ = server.accept()
    except socket.timeout:
        continue
    conn.sendall(sys.argv[3].encode())
    conn.close()
"""

_DETACH = """
import subprocess, sys
subprocess.Popen([sys.executable, '-c', sys.argv[1], *sys.argv[2:]], start_new_session=True,
                 stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
"""

_CONNECT = """
import json, socket, sys, threading
timeout, results = float(sys.argv[1]), {}
def attempt(target):
    host, port = target.rsplit(':', 1)
    s = socket.socket(socket.AF_INET6 if ':' in host else socket.AF_INET)
    s.settimeout(timeout)
    try:
        s.connect((host, int(port)))
        results[target] = 'connected: ' + s.recv(64).decode(errors='replace')
    except OSError as exc:
        results[target] = 'refused: ' + (type(exc).__name__ + ' ' + str(exc))
    finally:
        s.close()
threads = [threading.Thread(target=attempt, args=(t,)) for t in sys.argv[2:]]
for t in threads:
    t.start()
for t in threads:
    t.join()
print(json.dumps(results))
"""


def connect_from(
    backend: DockerBackend, sandbox_id: str, targets: list[str], seconds: float = CONNECT_SECONDS
) -> dict[str, str]:
    """Try TCP connections (at once) from inside the sandbox to each "host:port"; what
    happened to each ("connected: <greeting>" or "refused: <error>")."""
    result = backend.exec(sandbox_id, ["python3", "-c", _CONNECT, str(seconds), *targets])
    assert result.exit_code == 0, result.output
    return json.loads(result.output.decode().strip().splitlines()[-1])


def sandbox_py(backend: DockerBackend, sandbox_id: str, code: str, *args: str) -> str:
    """Run a python snippet in a backend's sandbox (as the sandbox user); its output."""
    result = backend.exec(sandbox_id, ["python3", "-c", code, *args])
    assert result.exit_code == 0, result.output.decode(errors="replace")
    return result.output.decode()


def addresses_of(engine_id: str) -> list[str]:
    """Every IP address a container has, on every network it is on."""
    networks = engine().containers.get(engine_id).attrs["NetworkSettings"]["Networks"] or {}
    found = []
    for net in networks.values():
        for key in ("IPAddress", "GlobalIPv6Address"):
            if net.get(key):
                found.append(net[key])
    return found


class HostListener:
    """A TCP listener of the test process that greets every connection with a token."""

    def __init__(self, host: str, port: int = 0) -> None:
        self.token = f"host-{uuid.uuid4().hex[:8]}"
        self.sock = socket.socket(socket.AF_INET)
        self.sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        self.sock.bind((host, port))
        self.sock.listen(16)
        self.sock.settimeout(0.5)
        self.port = self.sock.getsockname()[1]
        self.stop = threading.Event()
        self.thread = threading.Thread(target=self._serve, daemon=True)
        self.thread.start()

    def _serve(self) -> None:
        while not self.stop.is_set():
            try:
                conn, _ = self.sock.accept()
            except OSError:
                continue
            try:
                conn.sendall(self.token.encode())
            except OSError:
                pass
            conn.close()

    def reachable_from_host(self, host: str) -> bool:
        try:
            with socket.create_connection((host, self.port), timeout=CONNECT_SECONDS) as conn:
                return conn.recv(64).decode() == self.token
        except OSError:
            return False

    def close(self) -> None:
        self.stop.set()
        self.thread.join(5)
        self.sock.close()


# -- 6, 7, 8: the network ------------------------------------------------------------------


@pytest.mark.usefixtures("docker_cleanup")
def test_sandboxes_cannot_reach_each_other(
    make_config: Callable[..., SandboxConfig], test_user: str
) -> None:
    """Attack: user 2's code connects to a TCP server user 1's sandbox runs on
    0.0.0.0:8000, at every address user 1's container has. It must fail (within
    CONNECT_SECONDS), while user 1's sandbox reaches its own server (it runs)."""
    service = SandboxService(make_config())
    backend = service.backend
    a = service.ensure(ScopeKey(test_user + "-a")).info
    b = service.ensure(ScopeKey(test_user + "-b")).info
    token = f"server-{uuid.uuid4().hex[:8]}"
    sandbox_py(backend, a.id, _DETACH, _TCP_SERVER, "0.0.0.0", "8000", token, str(PLANT_SECONDS))
    targets = [f"{ip}:8000" for ip in addresses_of(a.engine_id)]
    assert targets, "user 1's sandbox has no address"
    deadline = time.monotonic() + 10
    while True:  # the server needs a moment to bind
        own = connect_from(backend, a.id, targets)
        if all(v == f"connected: {token}" for v in own.values()) or time.monotonic() > deadline:
            break
        time.sleep(0.3)
    assert all(v == f"connected: {token}" for v in own.values()), (
        f"user 1's server does not answer its own sandbox: {own}"
    )
    started = time.monotonic()
    other = connect_from(backend, b.id, targets)
    reached = {t: v for t, v in other.items() if v.startswith("connected")}
    assert not reached, f"user 2's sandbox reached user 1's server: {reached}"
    assert time.monotonic() - started < CONNECT_SECONDS + 5


METADATA = "169.254.169.254"


@dataclass
class MetadataService:
    """Where the fake metadata service answers: ports on METADATA, each greeting with token."""

    ports: list[int]
    token: str

    def reachable_from_host(self, port: int, seconds: float = 5) -> bool:
        deadline = time.monotonic() + seconds
        while time.monotonic() < deadline:  # the listener needs a moment to bind
            try:
                with socket.create_connection((METADATA, port), timeout=CONNECT_SECONDS) as conn:
                    return conn.recv(64).decode() == self.token
            except OSError:
                time.sleep(0.2)
        return False


def _ip(*args: str) -> None:
    done = subprocess.run(["ip", *args], capture_output=True, text=True)
    assert done.returncode == 0, f"ip {' '.join(args)}: {done.stderr.strip()}"


@pytest.fixture(params=["on the host", "routed"])
def metadata_service(request: pytest.FixtureRequest) -> Iterator[MetadataService]:
    """A fake cloud metadata service at 169.254.169.254, ports 80 and 8080.

    ``on the host``: the address on a dummy interface of the host (an empty bridge where
    the kernel has no dummy module), so a sandbox's packets to it stop at the host.
    ``routed``: the address in a network namespace behind a veth pair, routed like a
    real cloud's metadata service one hop away, so a sandbox's packets are forwarded.
    Root and iproute2 needed; everything is removed afterwards."""
    if os.geteuid() != 0:
        pytest.skip("making the metadata address needs root")
    if shutil.which("ip") is None:
        pytest.skip("iproute2 (`ip`) is not installed")
    tag = str(os.getpid() % 100000)  # names of our own: concurrent runs must not collide
    token = f"metadata-{uuid.uuid4().hex[:8]}"
    ports = [80, 8080]
    undo: list[list[str]] = []
    servers: list[subprocess.Popen[bytes]] = []
    try:
        if request.param == "on the host":
            link = f"sk-meta{tag}"
            errors = []
            for kind in ("dummy", "bridge"):
                made = subprocess.run(
                    ["ip", "link", "add", link, "type", kind], capture_output=True, text=True
                )
                if made.returncode == 0:
                    break
                errors.append(f"{kind}: {made.stderr.strip()}")
            else:
                pytest.skip(
                    f"cannot make an interface for the metadata address ({'; '.join(errors)})"
                )
            undo.append(["link", "del", link])
            _ip("addr", "add", f"{METADATA}/32", "dev", link)
            _ip("link", "set", link, "up")
            prefix: list[str] = []
        else:
            netns, near, far = f"sk-meta{tag}", f"skmh{tag}", f"skmp{tag}"
            _ip("netns", "add", netns)
            undo.append(["netns", "del", netns])  # takes the veth pair with it
            _ip("link", "add", near, "type", "veth", "peer", "name", far)
            undo.insert(0, ["link", "del", near])
            _ip("link", "set", far, "netns", netns)
            _ip("addr", "add", "169.254.169.1/32", "dev", near)
            _ip("link", "set", near, "up")
            _ip("route", "add", f"{METADATA}/32", "dev", near)
            inside = ["netns", "exec", netns, "ip"]
            _ip(*inside, "addr", "add", f"{METADATA}/32", "dev", far)
            _ip(*inside, "link", "set", far, "up")
            _ip(*inside, "link", "set", "lo", "up")
            _ip(*inside, "route", "add", "169.254.169.1/32", "dev", far)
            _ip(*inside, "route", "add", "default", "via", "169.254.169.1", "dev", far)
            prefix = ["ip", "netns", "exec", netns]
        for port in ports:
            servers.append(
                subprocess.Popen(
                    [
                        *prefix,
                        sys.executable,
                        "-c",
                        _TCP_SERVER,
                        METADATA,
                        str(port),
                        token,
                        str(PLANT_SECONDS),
                    ],
                    stdout=subprocess.DEVNULL,
                    stderr=subprocess.DEVNULL,
                )
            )
        yield MetadataService(ports, token)
    finally:
        for server in servers:
            server.kill()
            server.wait()
        for args in undo:
            subprocess.run(["ip", *args], capture_output=True)


@pytest.mark.usefixtures("docker_cleanup")
def test_cloud_metadata_address_unreachable(
    make_config: Callable[..., SandboxConfig], test_user: str, metadata_service: MetadataService
) -> None:
    """Attack: sandbox code connects to the cloud metadata address 169.254.169.254
    (ports 80 and 8080), served by the host itself or one routed hop away. The host
    reaches it (so the test can fail); the sandbox must not."""
    service = SandboxService(make_config())
    backend = service.backend
    info = service.ensure(ScopeKey(test_user)).info
    for port in metadata_service.ports:
        assert metadata_service.reachable_from_host(port), (
            f"the host cannot reach the metadata service on port {port}"
        )
    got = connect_from(backend, info.id, [f"{METADATA}:{port}" for port in metadata_service.ports])
    reached = {t: v for t, v in got.items() if v.startswith("connected")}
    assert not reached, f"the sandbox reached the metadata address: {reached}"


def host_addresses() -> list[str]:
    """IPv4 addresses of this host a container might route to: Docker's gateways and
    the host's own global addresses."""
    found = set()
    for net in engine().networks.list():
        for conf in (net.attrs.get("IPAM") or {}).get("Config") or []:
            gateway = conf.get("Gateway", "")
            if gateway and ":" not in gateway:
                found.add(gateway)
    out = subprocess.run(
        ["ip", "-4", "-o", "addr", "show", "scope", "global"], capture_output=True, text=True
    )
    for line in out.stdout.splitlines():
        parts = line.split()
        if "inet" in parts:
            found.add(parts[parts.index("inet") + 1].split("/")[0])
    return sorted(found - {"169.254.169.254"})


@pytest.mark.usefixtures("docker_cleanup")
def test_network_off_means_only_loopback(
    make_config: Callable[..., SandboxConfig], test_user: str
) -> None:
    """Attack: with ``network=False`` sandbox code looks for any interface but ``lo``
    (/proc/net/dev) and connects to a listener of the host at every host address
    (Docker's gateways, the host's own addresses). Only ``lo``; nothing reached."""
    service = SandboxService(make_config(network=False))
    backend = service.backend
    info = service.ensure(ScopeKey(test_user)).info
    interfaces = sandbox_py(
        backend,
        info.id,
        "print(sorted(l.split(':')[0].strip() for l in open('/proc/net/dev').read().splitlines()[2:]))",
    ).strip()
    assert interfaces == "['lo']"
    listener = HostListener("0.0.0.0")
    try:
        addresses = host_addresses()
        reachable = [a for a in addresses if listener.reachable_from_host(a)]
        assert reachable, f"the host reaches its listener at none of {addresses}"
        got = connect_from(backend, info.id, [f"{a}:{listener.port}" for a in reachable])
        reached = {t: v for t, v in got.items() if v.startswith("connected")}
        assert not reached, f"a sandbox without network reached the host: {reached}"
    finally:
        listener.close()


# -- 9, 10, 11: installations and state ----------------------------------------------------


@pytest.mark.usefixtures("docker_cleanup")
def test_two_installations_never_touch_each_other(
    make_config: Callable[..., SandboxConfig], test_user: str, tmp_path: Path
) -> None:
    """Attack (by a user of installation A, or A's reaper): reach installation B's
    sandbox of the same user name on the same engine by every name it has (its
    sandbox id, its container name, its engine id, short or long) through A's
    backend: get, stop, exec, destroy, and A's reaper with no grace after A's own
    records are gone. Only A's own container may ever be reached; B's keeps running."""
    cfg_a = make_config(
        state_dir=str(tmp_path / "a" / "state"), workspace_root=str(tmp_path / "a" / "ws")
    )
    cfg_b = make_config(
        state_dir=str(tmp_path / "b" / "state"), workspace_root=str(tmp_path / "b" / "ws")
    )
    service_a, service_b = SandboxService(cfg_a), SandboxService(cfg_b)
    backend_a, backend_b = service_a.backend, service_b.backend
    key = ScopeKey(test_user)
    a = service_a.ensure(key).info
    b = service_b.ensure(key).info
    client = engine()
    b_container = client.containers.get(b.engine_id)
    assert a.engine_id != b.engine_id
    assert [i.engine_id for i in backend_a.list()] == [a.engine_id]
    assert [i.engine_id for i in backend_b.list()] == [b.engine_id]
    # Each sees its own workspace folder.
    sandbox_py(backend_a, a.id, "open('/workspace/who.txt', 'w').write('A')")
    sandbox_py(backend_b, b.id, "open('/workspace/who.txt', 'w').write('B')")
    assert (Path(cfg_a.workspace_root) / key.user_id / "who.txt").read_text() == "A"
    assert (Path(cfg_b.workspace_root) / key.user_id / "who.txt").read_text() == "B"
    assert sandbox_py(backend_a, a.id, "print(open('/workspace/who.txt').read())").strip() == "A"

    def b_untouched() -> None:
        b_container.reload()
        assert b_container.status == "running", f"B's container is {b_container.status}"

    refs = {
        b.id,
        b_container.name,
        b.engine_id,
        b.engine_id[:12],
        engine_name(service_b.installation, b.id),
    }
    for ref in sorted(refs):
        for action in ("get", "exec", "stop"):
            try:
                if action == "get":
                    got = backend_a.get(ref).engine_id
                elif action == "exec":
                    out = sandbox_py(
                        backend_a, ref, "print(open('/workspace/who.txt').read())"
                    ).strip()
                    got = a.engine_id if out == "A" else f"a container whose workspace says {out!r}"
                else:
                    got = backend_a.stop(ref).engine_id
                    backend_a.start(a.id)
            except SandboxNotFound:
                continue
            assert ref == a.id, (
                f"A's backend reached {ref!r} with {action} (only A's own id may resolve)"
            )
            assert got == a.engine_id, (
                f"{action} {ref!r} through A reached {got}, not A's own container"
            )
        b_untouched()
    for ref in sorted(refs - {a.id}):
        assert backend_a.destroy(ref) is False, f"A's backend destroyed {ref!r}"
        b_untouched()
    # A's reaper, its own records gone and no grace: B's container is not its business.
    store_a = Store(cfg_a)
    for record in store_a.all("docker"):
        store_a.delete("docker", record.id)
    actions = gc(
        backend_a,
        make_config(state_dir=cfg_a.state_dir, workspace_root=cfg_a.workspace_root, orphan_grace=0),
    )
    assert all(act.engine_id != b.engine_id for act in actions), actions
    b_untouched()
    assert backend_b.get(b.id).engine_id == b.engine_id


@pytest.mark.usefixtures("docker_cleanup")
def test_reaper_survives_a_sandbox_without_record(
    make_config: Callable[..., SandboxConfig], test_user: str
) -> None:
    """A sandbox whose owner record vanished (deleted by hand, a lost state file): the
    reaper with the default grace must neither raise nor act on it."""
    cfg = make_config()
    service = SandboxService(cfg)
    backend = service.backend
    info = service.ensure(ScopeKey(test_user)).info
    Store(cfg).delete("docker", info.id)
    actions = gc(backend, cfg)
    assert [a for a in actions if a.sandbox_id == info.id or a.engine_id == info.engine_id] == []
    assert backend.get(info.id).state == "running"


@pytest.mark.usefixtures("docker_cleanup")
def test_state_is_private(
    make_config: Callable[..., SandboxConfig], test_user: str, tmp_path: Path
) -> None:
    """The state folder says who owns which sandbox and where warm interpreters wait:
    0700 for the folder, 0600 for state.sqlite."""
    cfg = make_config(state_dir=str(tmp_path / "private-state"))
    SandboxService(cfg).ensure(ScopeKey(test_user))
    state = Path(cfg.state_dir)
    assert oct(state.stat().st_mode & 0o777) == oct(0o700)
    assert oct((state / "state.sqlite").stat().st_mode & 0o777) == oct(0o600)


# -- 12, 13: the workspace as host ground ------------------------------------------------------


def host_accounts() -> dict[int, str]:
    accounts = {}
    for line in Path("/etc/passwd").read_text().splitlines():
        parts = line.split(":")
        if len(parts) > 2 and parts[2].isdigit():
            accounts[int(parts[2])] = parts[0]
    return accounts


@pytest.mark.usefixtures("docker_cleanup")
def test_workspace_files_belong_to_the_host_user(
    make_config: Callable[..., SandboxConfig], test_user: str
) -> None:
    """A root server's sandbox writes into its workspace: the folder and what the
    sandbox writes there must belong on the host to root (the host user), never to
    uid 1000 or any other host account, which would gain the files."""
    if os.geteuid() != 0:
        pytest.skip("only a root host user is checked")
    service = SandboxService(make_config())
    backend = service.backend
    info = service.ensure(ScopeKey(test_user)).info
    sandbox_py(
        backend,
        info.id,
        "import os; os.mkdir('/workspace/d'); open('/workspace/d/f.txt', 'w').write('x'); open('/workspace/g.txt', 'w').write('y')",
    )
    workspace = Path(info.workspace)
    accounts = host_accounts()
    owners = {
        str(p): p.lstat().st_uid
        for p in (workspace, workspace / "d", workspace / "d" / "f.txt", workspace / "g.txt")
    }
    wrong = {
        p: f"{uid} ({accounts.get(uid, 'no account')})"
        for p, uid in owners.items()
        if uid != os.geteuid()
    }
    assert not wrong, f"workspace paths not owned by the host user: {wrong}"


_SETUID_ATTEMPTS = """
import ctypes, errno, json, os, stat
results = {}
def attempt(name, fn):
    try:
        fn()
        results[name] = 'done'
    except OSError as exc:
        results[name] = errno.errorcode.get(exc.errno, str(exc.errno))
open('/workspace/x', 'w').write('#!/bin/sh\\n')
attempt('chmod 0755', lambda: os.chmod('/workspace/x', 0o755))
attempt('chmod 4755', lambda: os.chmod('/workspace/x', 0o4755))
attempt('chmod 2755', lambda: os.chmod('/workspace/x', 0o2755))
def fchmod():
    fd = os.open('/workspace/x', os.O_RDONLY)
    try:
        os.fchmod(fd, 0o6755)
    finally:
        os.close(fd)
attempt('fchmod 6755', fchmod)
def create():
    os.close(os.open('/workspace/y', os.O_CREAT | os.O_WRONLY, 0o4755))
attempt('open O_CREAT 4755', create)
def create_gid():
    os.close(os.open('/workspace/y2', os.O_CREAT | os.O_WRONLY, 0o2755))
attempt('open O_CREAT 2755', create_gid)
attempt('mknod 4755', lambda: os.mknod('/workspace/z', stat.S_IFREG | 0o4755))
libc = ctypes.CDLL(None, use_errno=True)
def raw(nr, *args):
    def call():
        if libc.syscall(nr, *args) < 0:
            raise OSError(ctypes.get_errno(), 'syscall %d' % nr)
    return call
if os.uname().machine == 'x86_64':
    AT_FDCWD = -100
    attempt('fchmodat2 4755', raw(452, AT_FDCWD, b'/workspace/x', 0o4755, 0))
    attempt('fchmodat 4755', raw(268, AT_FDCWD, b'/workspace/x', 0o4755))
    attempt('creat 4755', raw(85, b'/workspace/c', 0o4755))
    attempt('open(2) O_CREAT 2755', raw(2, b'/workspace/o', os.O_CREAT | os.O_WRONLY, 0o2755))
print(json.dumps(results))
"""


@pytest.mark.usefixtures("docker_cleanup")
def test_setuid_files_refused(make_config: Callable[..., SandboxConfig], test_user: str) -> None:
    """Attack: make a set-user-ID or set-group-ID file in the workspace (a host folder:
    such a file would be a setuid program on the host) by chmod, fchmod, open with
    O_CREAT, mknod and raw syscalls. chmod must raise PermissionError; nothing may
    leave S_ISUID or S_ISGID on any file as the host sees it."""
    service = SandboxService(make_config())
    backend = service.backend
    info = service.ensure(ScopeKey(test_user)).info
    results = json.loads(sandbox_py(backend, info.id, _SETUID_ATTEMPTS).strip().splitlines()[-1])
    assert results["chmod 0755"] == "done", results  # modes can change: only the bits are refused
    assert results["chmod 4755"] == "EPERM", results
    assert results["chmod 2755"] == "EPERM", results
    workspace = Path(info.workspace)
    assert (workspace / "x").exists(), "the attack's file is not in the host workspace"
    marked = {
        p.name: oct(p.lstat().st_mode)
        for p in workspace.iterdir()
        if p.lstat().st_mode & (stat.S_ISUID | stat.S_ISGID)
    }
    assert not marked, f"setuid/setgid files on the host: {marked} (attempts: {results})"


# -- 14: a runtime the engine does not have --------------------------------------------------


@pytest.mark.usefixtures("docker_cleanup")
def test_unknown_runtime_fails_fast_and_cleanly(tmp_path: Path, test_user: str) -> None:
    """An administrator names a runtime the engine lacks (SANDBOX_KERNEL_RUNTIME): the
    first ensure fails within 30 s with SandboxFailed naming the runtime and the
    setting, and leaves no container (nor an idmapped mount) behind."""
    runtime = "sk-no-such-runtime"
    cfg = load_config(
        environ={"SANDBOX_KERNEL_RUNTIME": runtime},
        backend="docker",
        image=TEST_IMAGE,
        workspace_root=str(tmp_path / "ws"),
        state_dir=str(tmp_path / "state"),
    )
    assert cfg.runtime == runtime
    key = ScopeKey(test_user)
    started = time.monotonic()
    with pytest.raises(SandboxError) as err:
        SandboxService(cfg).ensure(key)
    assert time.monotonic() - started < 30
    assert isinstance(err.value, SandboxFailed), type(err.value)
    assert runtime in str(err.value) and "SANDBOX_KERNEL_RUNTIME" in str(err.value), str(err.value)
    left = [
        c.name
        for c in engine().containers.list(all=True, filters={"label": "sandbox-kernel.managed=1"})
        if c.labels.get("sandbox-kernel.user-id", "").startswith(test_user)
    ]
    assert left == []
    name = engine_name(SandboxService(cfg).installation, key.name)
    mounts = Path("/proc/self/mountinfo").read_text()
    assert name not in mounts, "an idmapped mount of the failed sandbox was left behind"
