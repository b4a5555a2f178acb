"""Egress allowlists on the local backend, as an attacker would try them.

A sandbox with a list has only its loopback, where its egress proxy (a process of the
host, one per sandbox) listens. Each test runs as a root server's sandboxes and as an
ordinary user's (``tests/local_host.py``). The first needs nothing but this host; the
others use the servers of ``tests/test_egress_docker.py`` (containers on internal
Docker networks: an HTTPS package index and a git server allowed by name, a denied
server), whose names the test's processes see in an /etc/hosts of their own (this
machine's resolver cannot be told them), and run the same attacks, each of which must
end in a refusal, never a time-out, and be counted.
"""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
from pathlib import Path
from typing import Any

import nbformat
import pytest

from sandbox_kernel.backends.local import bwrap_works
from sandbox_kernel.config import load_config
from sandbox_kernel.errors import SandboxFailed
from sandbox_kernel.identity import ScopeKey
from sandbox_kernel.service import SandboxService

from .conftest import require_bwrap
from .local_host import LocalHost
from .test_egress_docker import World
from .test_egress_docker import world as world  # noqa: F401 (a fixture)
from .test_hostile_local import _KILL_ALL, Listener
from .test_hostile_local import listeners as listeners  # noqa: F401 (a fixture)

ALLOW = ["index.test", "git.test"]

# Run in a sandbox with a list: what it has, and what each way out gives.
_PROBE = r"""
import json, os, socket, sys, urllib.request
host_port = int(sys.argv[1])
out = {"interfaces": [n for _, n in socket.if_nameindex()], "proxy": os.environ.get("HTTPS_PROXY")}
try:
    urllib.request.urlopen("https://denied.test/", timeout=20)
except Exception as exc:
    out["denied_name"] = str(exc)
try:
    socket.create_connection(("192.0.2.1", 80), timeout=20)
except OSError as exc:
    out["raw"] = exc.errno
s = socket.create_connection(("127.0.0.1", 3128), timeout=20)
s.sendall(b"CONNECT 127.0.0.1:%d HTTP/1.1\r\n\r\n" % host_port)
out["host_loopback"] = s.recv(4096).split(b"\r\n", 1)[0].decode()
print(json.dumps(out))
"""

# Run by the driver: the processes of this host whose command line names ``needle``.
_PROCESSES = r"""
def processes(needle):
    found = []
    for pid in os.listdir("/proc"):
        try:
            with open("/proc/%s/cmdline" % pid, "rb") as fh:
                if needle.encode() in fh.read():
                    found.append(int(pid))
        except (OSError, ValueError):
            pass
    return [p for p in found if p != os.getpid()]
"""


def test_a_list_is_held_by_a_proxy_of_the_sandboxs_own(
    local_host: LocalHost, listeners: list[Listener]
) -> None:
    """Only loopback; the proxy found through HTTPS_PROXY refuses a name off the list (and
    counts it); a raw address has no route; the host's own loopback is never reached
    through the proxy, even listed; the sandbox cannot kill its proxy; a stop leaves no
    proxy running."""
    host = Listener(socket.AF_INET, ("127.0.0.1", 0))
    listeners.append(host)
    assert host.answers(("127.0.0.1", host.port))  # the control: the host reaches it
    result = local_host.run(
        _PROCESSES
        + """
svc = service(egress_allow=["index.test", "127.0.0.0/8:*"])
info = svc.ensure(ScopeKey("lister")).info
RESULT["limits"], RESULT["isolation"] = info.limits, info.isolation
code, out = run(svc, info.id, ARGS["probe"], str(ARGS["port"]))
RESULT["seen"] = last_json(out) if code == 0 else out
deadline = time.monotonic() + 30
while time.monotonic() < deadline:
    counts = {c.reason: c.count for c in svc.backend.egress_denied()}
    if sum(counts.values()) >= 2:
        break
    time.sleep(0.2)
RESULT["counts"] = counts
folder = str(svc.backend.root / info.id)
RESULT["proxies"] = len(processes(folder))
# The sandbox signals every process it may (its proxy runs as its uid, as root's): its
# way out stays.
RESULT["killed"] = run(svc, info.id, ARGS["kill_all"])
code, out = run(svc, info.id, ARGS["probe"], str(ARGS["port"]))
RESULT["after"] = last_json(out)["denied_name"] if code == 0 else out
svc.stop(None, info.id)
deadline = time.monotonic() + 10
while processes(folder) and time.monotonic() < deadline:
    time.sleep(0.05)
RESULT["left"] = len(processes(folder))
""",
        probe=_PROBE,
        port=host.port,
        kill_all=_KILL_ALL,
    )
    assert result["limits"]["network"] is True
    assert result["limits"]["egress_allow"] == ["index.test", "127.0.0.0/8:*"]
    assert "network only through its egress proxy (egress_allow)" in result["isolation"]
    seen = result["seen"]
    assert isinstance(seen, dict), seen
    assert seen["interfaces"] == ["lo"] and seen["proxy"] == "http://127.0.0.1:3128"
    assert "403 egress denied: denied.test is not in the allowlist" in seen["denied_name"]
    assert seen["raw"] == 101  # ENETUNREACH: no route at all, at once
    assert seen["host_loopback"].startswith("HTTP/1.1 403 egress denied: 127.0.0.1:")
    assert "127.0.0.1 is on this host itself, where the proxy runs" in seen["host_loopback"]
    assert result["counts"] == {"name": 1, "address": 1}
    assert result["killed"][1].strip() in ("sent", "nothing to signal")
    assert "403 egress denied: denied.test is not in the allowlist" in result["after"]
    assert result["proxies"] >= 1 and result["left"] == 0


def test_without_bubblewrap_a_list_is_refused(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("SANDBOX_KERNEL_LOCAL_NO_BWRAP", "1")
    bwrap_works.cache_clear()
    try:
        with pytest.raises(SandboxFailed) as refused:
            SandboxService(
                load_config(
                    environ={},
                    backend="local",
                    workspace_root=str(tmp_path / "ws"),
                    state_dir=str(tmp_path / "st"),
                    egress_allow=["pypi.org"],
                )
            ).ensure(ScopeKey("ann"))
        assert "\n" not in str(refused.value)
        assert "install bubblewrap, use Docker, or clear egress_allow" in str(refused.value)
    finally:
        bwrap_works.cache_clear()


# -- with the servers of the Docker test's world ---------------------------------------


def _hosts(world: World) -> str:
    """/etc/hosts naming the world's servers (as Docker's DNS names them on Docker)."""
    lines = [f"{address}\t{name}" for name, address in world.addresses.items()]
    return "127.0.0.1\tlocalhost\n::1\tlocalhost\n" + "\n".join(lines) + "\n"


@pytest.mark.docker
def test_the_allowlist_holds_against_every_way_around_it(
    world: World, local_host: LocalHost, listeners: list[Listener]
) -> None:
    """The Docker test's attacks from a local sandbox: every one ends in a refusal (an
    error at once, or the proxy's 403), none in a time-out; what the proxy refused is
    counted. Instead of another sandbox's address (local sandboxes have none), the
    host's own loopback, listed on purpose, through the proxy."""
    from .test_egress_docker import ATTACKS

    host = Listener(socket.AF_INET, ("127.0.0.1", 0))
    listeners.append(host)
    attacks = ATTACKS.replace(
        "print(json.dumps(out))",
        'attempt("host_loopback", lambda: through_proxy(("CONNECT 127.0.0.1:%s HTTP/1.1'
        '\\r\\n\\r\\n" % os.environ["EGRESS_TEST_HOST_PORT"]).encode()))\n'
        "print(json.dumps(out))",
    )
    result = local_host.run(
        """
svc = service(egress_allow=ARGS["allow"])
info = svc.ensure(ScopeKey("attacker")).info
done = svc.backend.exec(info.id, ["python3", "-c", ARGS["attacks"]], env=ARGS["env"], timeout=300)
RESULT["code"], RESULT["out"] = done.exit_code, done.output.decode(errors="replace")
deadline = time.monotonic() + 30
while time.monotonic() < deadline:
    counts = {c.reason: c.count for c in svc.backend.egress_denied()}
    if sum(counts.values()) >= 11:
        break
    time.sleep(0.5)
RESULT["counts"] = counts
""",
        hosts=_hosts(world),
        allow=[*ALLOW, "127.0.0.0/8:*"],
        attacks=attacks,
        env={
            "EGRESS_TEST_ADDRESSES": json.dumps({**world.addresses, "other-sandbox": "10.0.2.100"}),
            "EGRESS_TEST_HOST_PORT": str(host.port),
        },
    )
    assert result["code"] == 0, result["out"]
    out = json.loads(result["out"].strip().splitlines()[-1])
    print(json.dumps(out, indent=1))  # the seconds each took, for the report
    timed_out = [name for name, r in out.items() if "timeout" in r]
    assert not timed_out, f"these waited for a time-out instead of a refusal: {timed_out}"
    for name in (
        "raw_address",
        "raw_address_of_allowed_host",
        "other_port_direct",
        "dns_to_another_server",
        "ipv6",
        "udp",
    ):
        assert out[name].get("errno") in (101, 97), (name, out[name])  # no route, at once
    assert out["dns_lookup"]["error"] == "gaierror", out["dns_lookup"]
    for name in ("proxy_unset", "proxy_changed"):
        assert out[name]["error"] == "URLError", (name, out[name])
    for name in (
        "other_port_via_proxy",
        "ipv6_via_proxy",
        "connect_denied_name",
        "http_denied_name",
        "connect_raw_address",
        "metadata",
        "metadata_connect",
        "other_sandbox",
        "host_loopback",
    ):
        assert out[name].get("ok", "").startswith("HTTP/1.1 403 egress denied"), (name, out[name])
    assert "this host itself" in out["host_loopback"]["ok"]
    assert "private address" in out["other_sandbox"]["ok"]  # slirp's address: no sandbox's
    assert out["sni_differs"]["ok"] == "relayed 0 bytes after HTTP/1.1 200 Connection established"
    assert out["sni_same"]["ok"].startswith("relayed") and not out["sni_same"]["ok"].startswith(
        "relayed 0 "
    )  # the index's TLS server answered the ClientHello, through the proxy on the host
    assert out["proxy_itself"]["ok"].startswith("HTTP/1.1 400")
    counts = result["counts"]
    assert counts.get("sni") == 1 and counts.get("name") == 2 and counts.get("port") == 1
    # A raw address, its IPv6 form, the metadata address twice, slirp's address, the
    # host's loopback.
    assert counts.get("address") == 6


@pytest.mark.docker
def test_pip_and_git_in_cells_need_no_proxy_setting(world: World, tmp_path: Path) -> None:
    """`%pip install` from the allowed HTTPS index and `git clone` from the allowed git
    server in notebook cells run by `jupyter execute` on the local backend (a root
    server's sandbox); the cells say nothing about a proxy."""
    from .kernel_env import make_kernel_env
    from .local_host import with_hosts

    if os.geteuid() != 0:
        pytest.skip("naming the test's servers for the kernel needs root (a mount namespace)")
    kenv = make_kernel_env(
        tmp_path, SANDBOX_KERNEL_BACKEND="local", SANDBOX_KERNEL_EGRESS_ALLOW=",".join(ALLOW)
    )
    hosts = tmp_path / "hosts"
    hosts.write_text(_hosts(world))
    service = SandboxService(kenv.config(backend="local", egress_allow=ALLOW))
    info = service.ensure(ScopeKey(kenv.user)).info
    service.backend.put_file(
        info.id, ".egress-ca.pem", (world.root / "tls" / "ca.pem").read_bytes()
    )
    setup = (
        "mkdir -p ~/.config/pip && printf '[global]\\nindex-url = https://index.test/simple/\\n"
        "cert = /workspace/.egress-ca.pem\\n' > ~/.config/pip/pip.conf"
    )
    assert service.backend.exec(info.id, ["sh", "-c", setup]).exit_code == 0
    service.backend.stop(info.id)  # its next start (the kernel's) makes the proxy anew
    service.backend.start(info.id)
    nb = nbformat.v4.new_notebook()
    # Into a folder of its own: the host's Python may be a virtualenv's, where pip
    # refuses --user (which a local sandbox's pip uses), proxy or not.
    nb.cells = [
        nbformat.v4.new_code_cell("%pip install -q --no-user --target /tmp/pkgs sk_egress_pkg"),
        nbformat.v4.new_code_cell(
            "import sys; sys.path.insert(0, '/tmp/pkgs'); import sk_egress_pkg; "
            "print('version', sk_egress_pkg.VALUE)"
        ),
        nbformat.v4.new_code_cell(
            "!git clone -q http://git.test/cgi-bin/git/repo.git /tmp/repo && cat /tmp/repo/hello.txt"
        ),
    ]
    nb.metadata["kernelspec"] = {"name": "sandbox", "display_name": "sandbox", "language": "python"}
    path = tmp_path / "egress.ipynb"
    nbformat.write(nb, path)
    run = subprocess.run(
        [sys.executable, "-m", "jupyter", "execute", "--inplace", "--timeout=600", str(path)],
        env=kenv.environ(),
        capture_output=True,
        text=True,
        timeout=900,
        preexec_fn=lambda: with_hosts(str(hosts)),
    )
    assert run.returncode == 0, run.stderr[-3000:]
    outputs = [
        "".join(o.get("text", "") for o in cell.outputs) for cell in nbformat.read(path, 4).cells
    ]
    assert "version 1.0" in outputs[1]
    assert "cloned through the egress proxy" in outputs[2]


@pytest.fixture
def local_env(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> dict[str, str]:
    """A Jupyter server under test on the local backend, with an egress list."""
    require_bwrap()
    env = {
        "SANDBOX_KERNEL_BACKEND": "local",
        "SANDBOX_KERNEL_WORKSPACE_ROOT": str(tmp_path / "ws"),
        "SANDBOX_KERNEL_STATE_DIR": str(tmp_path / "state"),
        "SANDBOX_KERNEL_USER": "metered",
        "SANDBOX_KERNEL_WORK_ROOT": "none",
        "SANDBOX_KERNEL_EGRESS_ALLOW": "index.test",
    }
    for name, value in env.items():
        monkeypatch.setenv(name, value)
    return env


@pytest.fixture
def jp_server_config(local_env: dict[str, str]) -> dict[str, Any]:
    return {
        "ServerApp": {"jpserver_extensions": {"jupyter_ext": True}},
        "SandboxExtension": {"gc_interval": 0, "metrics_interval": 0.2},
    }


async def test_refusals_are_counted_on_metrics(jp_fetch: Any, local_env: dict[str, str]) -> None:
    """A local sandbox of the server's user asks its proxy for a name not on the list:
    the server's /metrics counts it, by allowlist and reason."""
    from sandbox_kernel.backends.egress import digest

    from .test_metrics import until, value

    cfg = load_config(
        environ={},
        backend="local",
        workspace_root=local_env["SANDBOX_KERNEL_WORKSPACE_ROOT"],
        state_dir=local_env["SANDBOX_KERNEL_STATE_DIR"],
        work_root="none",
        egress_allow=["index.test"],
    )
    service = SandboxService(cfg)
    info = service.ensure(ScopeKey("metered")).info
    ask = (
        "import urllib.request\n"
        "try: urllib.request.urlopen('https://denied.test/', timeout=20)\n"
        "except Exception as exc: print(exc)\n"
    )
    result = service.backend.exec(info.id, ["python3", "-c", ask])
    assert "403 egress denied: denied.test is not in the allowlist" in result.output.decode()
    listed = digest(["index.test"])
    text = await until(
        jp_fetch,
        lambda t: value(t, "sandbox_kernel_egress_denied_total", allowlist=listed) >= 1,
    )
    assert value(text, "sandbox_kernel_egress_denied_total", reason="name", allowlist=listed) == 1
