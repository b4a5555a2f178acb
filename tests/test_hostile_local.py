"""An attacker's test of the local backend's boundary, from code inside a local sandbox.

Each attack runs against the sandboxes a root server makes and against an ordinary
user's (``tests/local_host.py``), as the issue that made the local backend a real
boundary asked: read root-only host files it can see, reach services bound to the
host's loopback and the host's abstract Unix sockets, reach another user's sandbox,
fork without end, allocate without end, make setuid files and links where the host's
tools read. Each checks that the attack really ran (a control that must succeed: the
host reaches its own listener, the sandbox reads a file anyone may read, reaches a
service on the host's external address, its own abstract socket), so a pass never
comes from an attack that did not happen. Every race and wait is bounded.
"""

from __future__ import annotations

import json
import os
import shutil
import socket
import stat
import subprocess
import tempfile
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest

from .local_host import LocalHost
from .test_hostile_neighbours import _SETUID_ATTEMPTS, CONNECT, Listener, MetadataService
from .test_hostile_neighbours import metadata_service as metadata_service  # noqa: F401 (a fixture)

CONNECT_SECONDS = 3

# Run in a sandbox over a channel: serve TCP on 0.0.0.0:PORT and an abstract socket,
# greeting with TOKEN, until stdin closes.
_SERVER = r"""
import socket, sys, threading
port, name, token = int(sys.argv[1]), sys.argv[2], sys.argv[3].encode()
tcp = socket.socket(); tcp.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
tcp.bind(("0.0.0.0", port)); tcp.listen(16)
unix = socket.socket(socket.AF_UNIX); unix.bind(b"\0" + name.encode()); unix.listen(16)
def serve(sock):
    while True:
        conn, _ = sock.accept()
        conn.sendall(token)
        conn.close()
for sock in (tcp, unix):
    threading.Thread(target=serve, args=(sock,), daemon=True).start()
print("READY", flush=True)
sys.stdin.read()
"""


# Run in a sandbox: its own abstract socket works (the control of the host's).
_OWN_ABSTRACT = r"""
import socket
server = socket.socket(socket.AF_UNIX)
server.bind(b"\0mine")
server.listen()
socket.socket(socket.AF_UNIX).connect(b"\0mine")
print("own abstract socket works")
"""


# Run in a sandbox: SIGKILL to every process it may signal (kill(-1)).
_KILL_ALL = r"""
import os, signal
try:
    os.kill(-1, signal.SIGKILL)
    print("sent")
except ProcessLookupError:
    print("nothing to signal")
"""


@pytest.fixture
def listeners() -> Iterator[list[Listener]]:
    made: list[Listener] = []
    yield made
    for listener in made:
        listener.close()


def host_addresses() -> list[str]:
    """This host's own global IPv4 addresses (what a sandbox's traffic could reach it by)."""
    out = subprocess.run(
        ["ip", "-4", "-o", "addr", "show", "scope", "global"], capture_output=True, text=True
    )
    found = set()
    for line in out.stdout.splitlines():
        parts = line.split()
        if "inet" in parts:
            found.add(parts[parts.index("inet") + 1].split("/")[0])
    return sorted(found - {"169.254.169.254"})


# -- files ------------------------------------------------------------------------------------


@pytest.fixture
def shared_folder() -> Iterator[Path]:
    """An administrator's shared folder (mounted read-only at /shared) holding what anyone
    may read, and files and a folder only root, or another account, may read."""
    folder = Path(tempfile.mkdtemp(prefix="sk-shared-", dir="/tmp"))
    os.chmod(folder, 0o755)
    (folder / "open.txt").write_text("public")
    (folder / "secret.txt").write_text("ROOT-SECRET")
    os.chmod(folder / "secret.txt", 0o600)
    (folder / "private").mkdir(mode=0o700)
    (folder / "private" / "f.txt").write_text("ROOT-SECRET")
    (folder / "other.txt").write_text("OTHER-SECRET")
    os.chmod(folder / "other.txt", 0o600)
    if os.geteuid() == 0:
        os.chown(folder / "other.txt", 65534, 65534)  # another account's: nobody's
    yield folder
    shutil.rmtree(folder, ignore_errors=True)


_READ_ATTEMPTS = r"""
import errno, json, os, sys
ARGS_HOST_FILE = sys.argv[1]
results = {}
def attempt(name, fn):
    try:
        got = fn()
        results[name] = "done: " + str(got)[:40]
    except OSError as exc:
        results[name] = errno.errorcode.get(exc.errno, str(exc.errno))
attempt("open", lambda: open("/shared/open.txt").read())
attempt("root-only file", lambda: open("/shared/secret.txt").read())
attempt("root-only folder", lambda: os.listdir("/shared/private"))
attempt("in root-only folder", lambda: open("/shared/private/f.txt").read())
attempt("another account's file", lambda: open("/shared/other.txt").read())
attempt("/etc/shadow", lambda: open("/etc/shadow").read())
attempt("/etc/gshadow", lambda: open("/etc/gshadow").read())
attempt("/etc/sudoers", lambda: open("/etc/sudoers").read())
attempt("/etc/ssl/private", lambda: os.listdir("/etc/ssl/private"))
attempt("root's folder", lambda: open(ARGS_HOST_FILE).read())
attempt("write /shared", lambda: open("/shared/new.txt", "w").write("x"))
attempt("chmod /shared", lambda: os.chmod("/shared/open.txt", 0o666))
attempt("write /usr", lambda: open("/usr/planted", "w").write("x"))
status = dict(l.split(":", 1) for l in open("/proc/self/status") if ":" in l)
results["uid"] = os.getuid()
results["caps"] = status["CapEff"].strip()
results["no_new_privs"] = status["NoNewPrivs"].strip()
results["user"] = __import__("getpass").getuser()
print(json.dumps(results))
"""


def test_root_only_host_files_stay_closed(
    local_host: LocalHost, shared_folder: Path, tmp_path: Path
) -> None:
    """Attack: read a root-only file, list a root-only folder and read another account's
    file in a host folder the sandbox sees (the shared folder), read /etc/shadow,
    /etc/gshadow, /etc/sudoers and /etc/ssl/private, list /root, write or chmod what is
    read-only. Only the file anyone may read opens (the control); the sandbox user is
    uid 1000 'sandbox' with no capabilities. As root, its host uid is one of its own."""
    host_file = tmp_path / "root-secret.txt"  # the tests' own folder: 0700, the host's
    host_file.write_text("ROOT-SECRET")
    result = local_host.run(
        """
svc = service(shared_folder=ARGS["shared"])
info = svc.ensure(ScopeKey("reader")).info
code, out = run(svc, info.id, ARGS["code"], ARGS["host_file"])
RESULT["code"], RESULT["said"] = code, last_json(out) if code == 0 else out
RESULT["holder"] = json.loads((svc.backend.root / info.id / "holder.json").read_text())
""",
        shared=str(shared_folder),
        code=_READ_ATTEMPTS,
        host_file=str(host_file),
    )
    assert result["code"] == 0, result
    said = result["said"]
    assert said["open"] == "done: public", said
    for name in ("root-only file", "root-only folder", "in root-only folder"):
        assert said[name] == "EACCES", (name, said)
    if os.geteuid() == 0:
        assert said["another account's file"] == "EACCES", said
    for name in (
        "/etc/shadow",
        "/etc/gshadow",
        "/etc/sudoers",
        "/etc/ssl/private",
        "root's folder",
    ):
        assert said[name] in ("ENOENT", "EACCES"), (name, said)
    for name in ("write /shared", "chmod /shared", "write /usr"):
        assert said[name] in ("EROFS", "EACCES", "EPERM"), (name, said)
    assert (said["uid"], said["user"], said["caps"]) == (1000, "sandbox", "0000000000000000")
    assert said["no_new_privs"] == "1"
    assert (shared_folder / "open.txt").read_text() == "public"
    if local_host.root:
        assert result["holder"]["uid"] >= 0x78000000, result["holder"]
    else:
        assert result["holder"]["uid"] == local_host.uid


# -- the network ------------------------------------------------------------------------------


def test_host_loopback_and_abstract_sockets_unreachable(
    local_host: LocalHost, listeners: list[Listener]
) -> None:
    """Attack: connect to a server the host binds on 127.0.0.1 and ::1 (by those
    addresses, localhost, slirp's alias of the host 10.0.2.2 and the host's own
    addresses) and to an abstract Unix socket the host binds. Nothing is reached, while
    the host reaches all of them and the sandbox reaches a server on the host's external
    address (the control: its network works, and its attempts are real)."""
    loop4 = Listener(socket.AF_INET, ("127.0.0.1", 0))
    listeners.append(loop4)
    loop6 = Listener(socket.AF_INET6, ("::1", 0))
    listeners.append(loop6)
    name = f"sk-host-{uuid.uuid4().hex[:8]}"
    abstract = Listener(socket.AF_UNIX, b"\0" + name.encode())
    listeners.append(abstract)
    outside = Listener(socket.AF_INET, ("0.0.0.0", 0))
    listeners.append(outside)
    addresses = host_addresses()
    assert addresses, "this host has no global address to test with"
    assert loop4.answers(("127.0.0.1", loop4.port)) and loop6.answers(("::1", loop6.port))
    assert abstract.answers(b"\0" + name.encode())
    assert outside.answers((addresses[0], outside.port))
    targets = [
        f"127.0.0.1:{loop4.port}",
        f"localhost:{loop4.port}",
        f"10.0.2.2:{loop4.port}",
        f"[::1]:{loop6.port}",
        f"@{name}",
        *(f"{a}:{loop4.port}" for a in addresses),
    ]
    result = local_host.run(
        """
svc = service()
info = svc.ensure(ScopeKey("netter")).info
code, out = run(svc, info.id, ARGS["connect"], str(ARGS["seconds"]), *ARGS["targets"], ARGS["control"])
RESULT["said"] = last_json(out) if code == 0 else out
RESULT["own"] = run(svc, info.id, ARGS["own"])
""",
        connect=CONNECT,
        seconds=CONNECT_SECONDS,
        targets=targets,
        control=f"{addresses[0]}:{outside.port}",
        own=_OWN_ABSTRACT,
    )
    said = result["said"]
    assert isinstance(said, dict), said
    assert said.pop(f"{addresses[0]}:{outside.port}") == f"connected: {outside.token}", said
    reached = {t: v for t, v in said.items() if v.startswith("connected")}
    assert not reached, f"the sandbox reached the host's loopback: {reached}"
    assert set(said) == set(targets)
    assert result["own"] == [0, "own abstract socket works\n"]


def test_network_off_means_only_loopback(local_host: LocalHost, listeners: list[Listener]) -> None:
    """Attack: with ``network = false`` look for any interface but ``lo`` and connect to
    a listener of the host on all its addresses. Only ``lo``; nothing reached (the host
    reaches its listener, and the listing says there is no network)."""
    outside = Listener(socket.AF_INET, ("0.0.0.0", 0))
    listeners.append(outside)
    addresses = host_addresses()
    assert addresses and outside.answers((addresses[0], outside.port))
    result = local_host.run(
        """
svc = service(network=False)
info = svc.ensure(ScopeKey("offline")).info
RESULT["limits"], RESULT["isolation"] = info.limits, info.isolation
code, out = run(svc, info.id, "print(sorted(l.split(':')[0].strip() for l in open('/proc/net/dev').read().splitlines()[2:]))")
RESULT["interfaces"] = out.strip()
code, out = run(svc, info.id, ARGS["connect"], str(ARGS["seconds"]), *ARGS["targets"])
RESULT["said"] = last_json(out) if code == 0 else out
""",
        connect=CONNECT,
        seconds=CONNECT_SECONDS,
        targets=[f"{a}:{outside.port}" for a in addresses] + [f"10.0.2.2:{outside.port}"],
    )
    assert result["interfaces"] == "['lo']"
    reached = {t: v for t, v in result["said"].items() if v.startswith("connected")}
    assert not reached, f"a sandbox without network reached the host: {reached}"
    assert result["limits"]["network"] is False and "no network" in result["isolation"]


def test_another_users_sandbox_unreachable(local_host: LocalHost) -> None:
    """Attack: user 2's code connects to a TCP server and an abstract socket user 1's
    sandbox serves (on 0.0.0.0:8000), at every address it could have, looks for its
    processes and sends SIGKILL to every process it may signal. Nothing is reached or
    seen, and user 1's server still answers its own sandbox (the control, before and
    after). As root, the two sandboxes run as two different host uids."""
    addresses = host_addresses()
    result = local_host.run(
        """
svc = service()
a = svc.ensure(ScopeKey("user-one")).info
b = svc.ensure(ScopeKey("user-two")).info
token = "server-" + os.urandom(4).hex()
server = svc.backend.open_channel(a.id, ["python3", "-c", ARGS["server"], "8000", "sk-one", token])
try:
    said = b""
    while b"READY" not in said:
        chunk = server.read()
        if not chunk:
            break
        said += chunk
    targets = ["127.0.0.1:8000", "10.0.2.100:8000", "@sk-one"]
    code, out = run(svc, a.id, ARGS["connect"], str(ARGS["seconds"]), *targets)
    RESULT["own_before"] = last_json(out) if code == 0 else out
    others = targets + ["10.0.2.2:8000"] + [f"{h}:8000" for h in ARGS["addresses"]]
    code, out = run(svc, b.id, ARGS["connect"], str(ARGS["seconds"]), *others)
    RESULT["other"] = last_json(out) if code == 0 else out
    RESULT["other_procs"] = run(svc, b.id, "import os; print(sorted(int(p) for p in os.listdir('/proc') if p.isdigit()))")
    RESULT["kill_all"] = run(svc, b.id, ARGS["kill_all"])
    code, out = run(svc, a.id, ARGS["connect"], str(ARGS["seconds"]), *targets)
    RESULT["own_after"] = last_json(out) if code == 0 else out
    RESULT["token"] = token
    RESULT["uids"] = [json.loads((svc.backend.root / i.id / "holder.json").read_text())["uid"] for i in (a, b)]
finally:
    server.close()
""",
        server=_SERVER,
        connect=CONNECT,
        seconds=CONNECT_SECONDS,
        addresses=addresses,
        kill_all=_KILL_ALL,
    )
    expected = f"connected: {result['token']}"
    for when in ("own_before", "own_after"):
        assert result[when] == {t: expected for t in result[when]}, (when, result[when])
    reached = {t: v for t, v in result["other"].items() if v.startswith("connected")}
    assert not reached, f"user 2's sandbox reached user 1's server: {reached}"
    code, procs = result["other_procs"]
    assert code == 0 and len(json.loads(procs)) <= 3, f"user 2 sees processes: {procs}"
    assert result["kill_all"] in ([0, "nothing to signal\n"], [0, "sent\n"]), result["kill_all"]
    one, two = result["uids"]
    if local_host.root:
        assert one != two and min(one, two) >= 0x78000000, result["uids"]


def test_cloud_metadata_address_unreachable(
    local_host: LocalHost,
    metadata_service: MetadataService,  # noqa: F811 (the fixture imported above)
) -> None:
    """Attack: connect to the cloud metadata address 169.254.169.254 (ports 80 and 8080),
    served by the host itself or one routed hop away. The host reaches it; a root
    server's sandbox must not (a firewall rule over the sandboxes' uids). An ordinary
    user cannot add that rule: its sandboxes reach what the host reaches there."""
    if not local_host.root:
        pytest.skip(
            "an ordinary user's local sandboxes reach link-local addresses the host reaches "
            "(no firewall rule without root); run the server as root or use Docker"
        )
    metadata = metadata_service
    ports = metadata.ports
    for port in ports:
        assert metadata.reachable_from_host(port)
    result = local_host.run(
        """
svc = service()
info = svc.ensure(ScopeKey("cloud")).info
code, out = run(svc, info.id, ARGS["connect"], str(ARGS["seconds"]), *ARGS["targets"])
RESULT["said"] = last_json(out) if code == 0 else out
""",
        connect=CONNECT,
        seconds=CONNECT_SECONDS,
        targets=[f"169.254.169.254:{port}" for port in ports],
    )
    reached = {t: v for t, v in result["said"].items() if v.startswith("connected")}
    assert not reached, f"the sandbox reached the metadata address: {reached}"


# -- limits -----------------------------------------------------------------------------------

_FORK_LOOP = r"""
import subprocess
procs = []
try:
    for _ in range(1000):
        procs.append(subprocess.Popen(["sleep", "60"]))
    print("made", len(procs))
except OSError as exc:
    print("refused", exc.errno, "after", len(procs))
for p in procs:
    p.kill()
"""

_FORK_BOMB = r"""
import os, time
end = time.monotonic() + 4
while time.monotonic() < end:
    try:
        os.fork()
    except OSError:
        time.sleep(0.01)
"""


def test_fork_bomb_is_stopped(limited_host: LocalHost) -> None:
    """Attack: start processes without end (with a process limit of 64), then a real
    fork bomb for a few seconds. The first is refused (EAGAIN) near the limit; after
    the bomb the sandbox still runs a command, and stopping it leaves no process."""
    result = limited_host.run(
        """
svc = service(pids_limit=64)
info = svc.ensure(ScopeKey("forker")).info
RESULT["limits"], RESULT["isolation"] = info.limits, info.isolation
RESULT["loop"] = run(svc, info.id, ARGS["loop"])
RESULT["bomb"] = run(svc, info.id, ARGS["bomb"], timeout=30)
RESULT["after"] = run(svc, info.id, "print('alive')")
RESULT["stopped"] = svc.backend.stop(info.id).state
""",
        loop=_FORK_LOOP,
        bomb=_FORK_BOMB,
    )
    code, out = result["loop"]
    assert code == 0 and out.startswith("refused 11 after"), out
    assert int(out.split()[-1]) < 64, out
    assert result["after"] == [0, "alive\n"]
    assert result["limits"]["pids"] == 64 and result["stopped"] == "stopped"


_DAEMON = r"""
import os, subprocess, sys
if os.fork() == 0:
    os.setsid()
    if os.fork() == 0:
        subprocess.Popen(["sleep", sys.argv[1]]).wait()
    os._exit(0)
print("started", flush=True)
sys.stdin.read()
"""


def test_stop_leaves_no_process(limited_host: LocalHost) -> None:
    """Attack: a command leaves a daemon (double fork, a session of its own) and a fork
    loop, then the sandbox is stopped. Nothing of it runs after the stop."""
    marker = str(4000 + os.getpid() % 997)
    result = limited_host.run(
        """
def running(marker):
    found = []
    for pid in filter(str.isdigit, os.listdir("/proc")):
        try:
            if ("sleep" + chr(0) + marker).encode() in open(f"/proc/{pid}/cmdline", "rb").read():
                found.append(int(pid))
        except OSError:
            pass
    return found
svc = service()
info = svc.ensure(ScopeKey("leaver")).info
channel = svc.backend.open_channel(info.id, ["python3", "-c", ARGS["daemon"], ARGS["marker"]])
said = b""
while b"started" not in said:
    chunk = channel.read()
    if not chunk:
        break
    said += chunk
deadline = time.monotonic() + 10
while not running(ARGS["marker"]) and time.monotonic() < deadline:
    time.sleep(0.05)
RESULT["before"] = running(ARGS["marker"])
svc.backend.stop(info.id)
RESULT["after"] = running(ARGS["marker"])
channel.close()
""",
        daemon=_DAEMON,
        marker=marker,
    )
    assert result["before"], "the daemon did not start (test bug)"
    assert result["after"] == [], result


_HOG = r"""
hog = []
while len(hog) < 80:  # 4 GB at most: past any flavor this test uses
    hog.append(bytearray(50_000_000))
print("allocated", len(hog) * 50, "MB")
"""


def test_memory_hog_is_stopped(limited_host: LocalHost) -> None:
    """Attack: allocate without end in a command and in a kernel's cell (flavor small,
    1 GiB). With a cgroup (root, or a user given one) the memory limit kills it and the
    cell's message names the limit; without, the process's own limit makes the
    allocation fail (MemoryError), and the listing says memory is only bounded per
    process. The kernel answers the next cell either way."""
    result = limited_host.run(
        """
svc = service()
info = svc.ensure(ScopeKey("hogger")).info
RESULT["limits"], RESULT["isolation"] = info.limits, info.isolation
RESULT["command"] = run(svc, info.id, ARGS["hog"])
from jupyter_client.manager import start_new_kernel
from sandbox_kernel.kernelspec import kernelspec
share = os.path.join(os.environ["HOME"], "share", "kernels", "sandbox")
os.makedirs(share, exist_ok=True)
env = {"PYTHONPATH": os.pathsep.join(sys.path[:len(ARGS["path"])]), "SANDBOX_KERNEL_BACKEND": "local",
       "SANDBOX_KERNEL_WORKSPACE_ROOT": os.environ["SK_TEST_WS"], "SANDBOX_KERNEL_STATE_DIR": os.environ["SK_TEST_STATE"],
       "SANDBOX_KERNEL_USER": "hogger", "SANDBOX_KERNEL_WORK_ROOT": "none"}
with open(os.path.join(share, "kernel.json"), "w") as fh:
    json.dump(kernelspec("local test", env, python=sys.executable), fh)
os.environ["JUPYTER_PATH"] = os.path.join(os.environ["HOME"], "share")
km, kc = start_new_kernel(kernel_name="sandbox")
try:
    def cell(code):
        msg_id = kc.execute(code)
        reply = kc.get_shell_msg(timeout=180)
        while reply["parent_header"].get("msg_id") != msg_id:
            reply = kc.get_shell_msg(timeout=180)
        out = []
        while True:
            msg = kc.get_iopub_msg(timeout=30)
            if msg["parent_header"].get("msg_id") != msg_id:
                continue
            if msg["msg_type"] == "stream":
                out.append(msg["content"]["text"])
            if msg["msg_type"] == "status" and msg["content"]["execution_state"] == "idle":
                break
        content = reply["content"]
        said = content.get("ename", "") + ": " + content.get("evalue", "")
        return content.get("status"), said, "".join(out)
    RESULT["cell"] = cell("before = 1")
    RESULT["hog"] = cell(ARGS["hog"])
    RESULT["next"] = cell("print('alive')")
finally:
    kc.stop_channels()
    km.shutdown_kernel(now=True)
""",
        hog=_HOG,
        path=limited_host.path,
        driver_timeout=600,
    )
    code, out = result["command"]
    status, evalue, _ = result["hog"]
    assert result["cell"][0] == "ok", result["cell"]
    assert status == "error", result["hog"]
    if limited_host.mode in ("root", "user-cgroup"):
        assert code == 137, out  # killed by the cgroup's memory limit
        assert result["limits"]["memory"] == 1 << 30
        assert "memory limit of 1 GiB" in evalue, evalue
    else:
        assert code == 1 and "MemoryError" in out, out
        assert result["limits"]["memory"] == 0
        assert "memory per process only" in result["isolation"]
        assert evalue.startswith("MemoryError"), evalue
    next_status, _, next_out = result["next"]
    assert next_status == "ok" and "alive" in next_out, result["next"]


# -- host folders -----------------------------------------------------------------------------


def test_setuid_files_refused(local_host: LocalHost) -> None:
    """Attack: make a set-user-ID or set-group-ID file in the workspace (a host folder:
    with a root server it lands as root's, a setuid-root program on the host) by chmod,
    fchmod, open with O_CREAT, mknod and raw system calls. Refused; nothing on the host
    carries S_ISUID or S_ISGID; the files belong to the host user."""
    result = local_host.run(
        """
svc = service()
info = svc.ensure(ScopeKey("setuider")).info
code, out = run(svc, info.id, ARGS["code"])
RESULT["said"] = last_json(out) if code == 0 else out
RESULT["workspace"] = info.workspace
""",
        code=_SETUID_ATTEMPTS,
    )
    said = result["said"]
    assert isinstance(said, dict), said
    assert said["chmod 0755"] == "done", said
    assert said["chmod 4755"] == "EPERM" and said["chmod 2755"] == "EPERM", said
    workspace = Path(result["workspace"])
    assert (workspace / "x").exists(), "the attack's file is not in the host workspace"
    marked = {
        p.name: oct(p.lstat().st_mode)
        for p in workspace.iterdir()
        if p.lstat().st_mode & (stat.S_ISUID | stat.S_ISGID)
    }
    assert not marked, f"setuid/setgid files on the host: {marked} (attempts: {said})"
    owners = {p.name: p.lstat().st_uid for p in [workspace, *workspace.iterdir()]}
    assert set(owners.values()) == {local_host.uid}, owners


def test_planted_links_in_the_work_folder_refused(local_host: LocalHost) -> None:
    """Attack: a command in a sandbox with a host work folder (a checkout) plants a
    symlink, a folder link, a FIFO and a socket there (they would turn the host user's
    tools against them) and writes the checkout's git hooks. Refused, while a plain
    file is written (and is the host user's) and a link elsewhere is fine."""
    checkout = local_host.folder / "checkout"
    result = local_host.run(
        """
checkout = ARGS["checkout"]
os.makedirs(os.path.join(checkout, ".git", "hooks"))
open(os.path.join(checkout, ".git", "HEAD"), "w").write("ref: refs/heads/main\\n")
svc = service(work_root=checkout)
work = svc.work_folder(checkout)
info = svc.ensure(ScopeKey("planter"), work_folder=work).info
RESULT["work"] = info.work_folder
done = svc.exec(info, svc.as_user(info, ["python3", "-c", ARGS["code"]]), cwd=checkout)
RESULT["said"] = done.output.decode(errors="replace")
""",
        checkout=str(checkout),
        code=(
            "import os, socket, errno\n"
            "def attempt(name, fn):\n"
            "    try:\n"
            "        fn(); print(name, 'made')\n"
            "    except OSError as e:\n"
            "        print(name, 'refused', errno.errorcode.get(e.errno))\n"
            "attempt('symlink', lambda: os.symlink('/etc/passwd', 'report.ipynb'))\n"
            "attempt('dirlink', lambda: os.symlink('/', 'rootlink'))\n"
            "attempt('fifo', lambda: os.mkfifo('pipe'))\n"
            "attempt('socket', lambda: socket.socket(socket.AF_UNIX).bind('sock'))\n"
            "attempt('hook', lambda: open('.git/hooks/post-checkout', 'w').write('#!/bin/sh'))\n"
            "attempt('elsewhere', lambda: os.symlink('/etc/passwd', '/home/sandbox/ok-link'))\n"
            "attempt('write', lambda: open('fine.txt', 'w').write('ok'))\n"
        ),
    )
    assert result["work"] == str(checkout), result
    said = dict(line.split(" ", 1) for line in result["said"].splitlines() if " " in line)
    for name in ("symlink", "dirlink", "fifo", "socket", "hook"):
        assert said.get(name, "").startswith("refused"), (name, result["said"])
    assert said.get("elsewhere") == "made" and said.get("write") == "made", result["said"]
    for name in ("report.ipynb", "rootlink", "pipe", "sock"):
        assert not os.path.lexists(checkout / name)
    assert not (checkout / ".git" / "hooks" / "post-checkout").exists()
    assert (checkout / "fine.txt").lstat().st_uid == local_host.uid
