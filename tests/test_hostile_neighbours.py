"""An attacker's test of the sandbox's neighbours, from code running INSIDE a sandbox:
other sandboxes, the host's network and cloud metadata, another installation on the same
engine, the server's state, and the host files a workspace is made of.

The code in a sandbox is hostile (docs/operators/security.md): it can open sockets to
anything its network reaches, start servers, and change file modes in the workspace,
which is a host folder. Each test checks that the attack really happened (a listener
was in place, a server answered its own container, the host could reach its listener),
so a pass never comes from an attack that did not run. The attacks on the kernel itself
(its processes, planted programs, output floods) are in test_hostile_sandbox.py.

Every race is bounded in tries and in time; every process planted in a sandbox ends
by itself (``PLANT_SECONDS``) if the test cannot end it.
"""

from __future__ import annotations

import json
import os
import shutil
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

import docker
import pytest

from sandbox_kernel.backends.base import SandboxError, SandboxFailed, SandboxNotFound, engine_name
from sandbox_kernel.backends.docker import DockerBackend
from sandbox_kernel.config import SandboxConfig, load_config
from sandbox_kernel.identity import ScopeKey
from sandbox_kernel.lifecycle import gc
from sandbox_kernel.service import SandboxService
from sandbox_kernel.store import Store

from .conftest import TEST_IMAGE

pytestmark = pytest.mark.docker

PLANT_SECONDS = 120  # no process a test plants in a sandbox outlives this
CONNECT_SECONDS = 3  # one network attempt from a sandbox


def engine() -> docker.DockerClient:
    return docker.from_env()


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

# Run in a sandbox: try each target ("host:port", or "@name" for an abstract Unix
# socket) at once; print {target: "connected: <greeting>" | "refused: <error>"}.
CONNECT = r"""
import json, socket, sys, threading
timeout, results = float(sys.argv[1]), {}
def attempt(target):
    if target.startswith("@"):
        s, address = socket.socket(socket.AF_UNIX), b"\0" + target[1:].encode()
    else:
        host, port = target.rsplit(":", 1)
        host = host.strip("[]")
        s = socket.socket(socket.AF_INET6 if ":" in host else socket.AF_INET)
        address = (host, int(port))
    s.settimeout(timeout)
    try:
        s.connect(address)
        results[target] = "connected: " + s.recv(64).decode(errors="replace")
    except OSError as exc:
        results[target] = "refused: " + type(exc).__name__ + " " + str(exc)
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
    result = backend.exec(sandbox_id, ["python3", "-c", CONNECT, str(seconds), *targets])
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


class Listener:
    """A listener of the test process (the host) that greets every connection with a
    token: what a sandbox reaches of the host. ``family`` and ``address`` as for
    ``socket.bind`` (an abstract Unix name too)."""

    def __init__(self, family: int, address: object) -> None:
        self.token = f"host-{uuid.uuid4().hex[:8]}"
        self.sock = socket.socket(family)
        if family != socket.AF_UNIX:
            self.sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        self.sock.bind(address)
        self.sock.listen(16)
        self.sock.settimeout(0.3)
        self.address = self.sock.getsockname()
        self.stop = threading.Event()
        self.thread = threading.Thread(target=self._serve, daemon=True)
        self.thread.start()

    @property
    def port(self) -> int:
        return int(self.address[1])  # type: ignore[index]

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

    def answers(self, address: object) -> bool:
        """Whether the host itself reaches it there (the control of an attack)."""
        with socket.socket(self.sock.family) as conn:
            conn.settimeout(CONNECT_SECONDS)
            try:
                conn.connect(address)
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
    listener = Listener(socket.AF_INET, ("0.0.0.0", 0))
    try:
        addresses = host_addresses()
        reachable = [a for a in addresses if listener.answers((a, listener.port))]
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
        for c in engine().containers.list(
            ignore_removed=True, all=True, filters={"label": "sandbox-kernel.managed=1"}
        )
        if c.labels.get("sandbox-kernel.user-id", "").startswith(test_user)
    ]
    assert left == []
    name = engine_name(SandboxService(cfg).installation, key.name)
    mounts = Path("/proc/self/mountinfo").read_text()
    assert name not in mounts, "an idmapped mount of the failed sandbox was left behind"
