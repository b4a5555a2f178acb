"""Egress allowlists on real Docker, as an attacker would try them.

The "internet" here is this machine only: two internal Docker networks of the test's
own, one holding a package index over HTTPS (signed by a CA the test makes) and a git
server (``git http-backend`` behind ``http.server``), both allowed by name, the other a
"denied" server. The proxy of the sandbox's allowlist is connected to both networks, as
the world would be reachable from it. From the sandbox: ``%pip install`` and
``git clone`` in cells with no proxy setting of their own; then every way around the
list (a raw address, another port, DNS to another server, the proxy variables unset or
changed, IPv6, UDP, a CONNECT to a denied name, a TLS name other than the CONNECT
host, the metadata address, another sandbox), each of which must end in a refusal,
never a time-out, and the refusals counted on the server's /metrics.
"""

from __future__ import annotations

import datetime
import json
import subprocess
import sys
import textwrap
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import docker
import nbformat
import pytest

from sandbox_kernel.backends.docker.egress import proxy_name
from sandbox_kernel.config import load_config
from sandbox_kernel.identity import ScopeKey
from sandbox_kernel.service import SandboxService

from .conftest import TEST_IMAGE, remove_user_containers
from .helpers import make_wheel
from .kernel_env import make_kernel_env
from .test_metrics import until, value

pytestmark = pytest.mark.docker

WORLD = "sandbox-kernel-test.egress-world"
ALLOW = ["index.test", "git.test"]

# The servers, each run by python3 in a container of the test image as nobody.
HTTPS_SERVER = """
import functools, http.server, ssl, sys
name = sys.argv[1]
handler = functools.partial(http.server.SimpleHTTPRequestHandler, directory="/srv/www")
handler.log_message = lambda *a: None
server = http.server.ThreadingHTTPServer(("", 443), handler)
context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
context.load_cert_chain("/srv/tls/%s.pem" % name, "/srv/tls/%s.key" % name)
server.socket = context.wrap_socket(server.socket, server_side=True)
server.serve_forever()
"""
GIT_SERVER = """
import http.server, os, warnings
warnings.simplefilter("ignore")
os.chdir("/srv/gitweb")
http.server.ThreadingHTTPServer(("", 80), http.server.CGIHTTPRequestHandler).serve_forever()
"""
GIT_CGI = """#!/bin/sh
export GIT_PROJECT_ROOT=/srv/git GIT_HTTP_EXPORT_ALL=1
export GIT_CONFIG_COUNT=1 GIT_CONFIG_KEY_0=safe.directory GIT_CONFIG_VALUE_0='*'
exec git http-backend
"""
PLAIN_SERVER = """
import http.server, socket, threading
def udp():
    s = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    s.bind(("", 53))
    while True:
        data, peer = s.recvfrom(2048)
        s.sendto(data, peer)
threading.Thread(target=udp, daemon=True).start()
http.server.ThreadingHTTPServer(("", 80), http.server.SimpleHTTPRequestHandler).serve_forever()
"""


@dataclass
class World:
    root: Path
    networks: list[Any]
    addresses: dict[str, str]  # server name -> its address

    def join(self, proxy: str) -> None:
        """Connect the proxy container ``proxy`` to the test's networks (its world)."""
        client = docker.from_env()
        container = client.containers.get(proxy)
        attached = (container.attrs["NetworkSettings"]["Networks"] or {}).keys()
        for network in self.networks:
            if network.name not in attached:
                network.connect(container)


def _ca(root: Path) -> None:
    """A CA of the test's own, and certificates it signs for index.test and denied.test."""
    from cryptography import x509
    from cryptography.hazmat.primitives import hashes, serialization
    from cryptography.hazmat.primitives.asymmetric import ec
    from cryptography.x509.oid import NameOID

    tls = root / "tls"
    tls.mkdir()
    now = datetime.datetime.now(datetime.timezone.utc)
    key = ec.generate_private_key(ec.SECP256R1())
    ca_name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "egress test CA")])
    ca = (
        x509.CertificateBuilder()
        .subject_name(ca_name)
        .issuer_name(ca_name)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - datetime.timedelta(days=1))
        .not_valid_after(now + datetime.timedelta(days=2))
        .add_extension(x509.BasicConstraints(ca=True, path_length=None), critical=True)
        .sign(key, hashes.SHA256())
    )
    (tls / "ca.pem").write_bytes(ca.public_bytes(serialization.Encoding.PEM))
    for name in ("index.test", "denied.test"):
        leaf_key = ec.generate_private_key(ec.SECP256R1())
        leaf = (
            x509.CertificateBuilder()
            .subject_name(x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, name)]))
            .issuer_name(ca_name)
            .public_key(leaf_key.public_key())
            .serial_number(x509.random_serial_number())
            .not_valid_before(now - datetime.timedelta(days=1))
            .not_valid_after(now + datetime.timedelta(days=2))
            .add_extension(x509.SubjectAlternativeName([x509.DNSName(name)]), critical=False)
            .sign(key, hashes.SHA256())
        )
        (tls / f"{name}.pem").write_bytes(leaf.public_bytes(serialization.Encoding.PEM))
        (tls / f"{name}.key").write_bytes(
            leaf_key.private_bytes(
                serialization.Encoding.PEM,
                serialization.PrivateFormat.PKCS8,
                serialization.NoEncryption(),
            )
        )


def _index(root: Path) -> None:
    """A PEP 503 simple index with one wheel."""
    wheel = make_wheel(root / "www" / "files", "sk_egress_pkg", "1.0")
    project = root / "www" / "simple" / "sk-egress-pkg"
    project.mkdir(parents=True)
    (project / "index.html").write_text(
        f'<html><body><a href="../../files/{wheel.name}">{wheel.name}</a></body></html>'
    )


def _git(root: Path) -> None:
    """A bare repository with one commit, and the CGI script that serves it."""
    work = root / "git-work"
    work.mkdir()
    env = {
        "GIT_AUTHOR_NAME": "t",
        "GIT_AUTHOR_EMAIL": "t@t",
        "GIT_COMMITTER_NAME": "t",
        "GIT_COMMITTER_EMAIL": "t@t",
        "HOME": str(root),
        "PATH": "/usr/bin:/bin",
    }
    (work / "hello.txt").write_text("cloned through the egress proxy\n")
    for cmd in (["init", "-q", "-b", "main"], ["add", "."], ["commit", "-qm", "first"]):
        subprocess.run(["git", "-C", str(work), *cmd], check=True, env=env)
    (root / "git").mkdir()
    subprocess.run(
        ["git", "clone", "-q", "--bare", str(work), str(root / "git" / "repo.git")],
        check=True,
        env=env,
    )
    cgi = root / "gitweb" / "cgi-bin" / "git"
    cgi.parent.mkdir(parents=True)
    cgi.write_text(GIT_CGI)
    cgi.chmod(0o755)


@pytest.fixture(scope="module")
def world(tmp_path_factory: pytest.TempPathFactory) -> Iterator[World]:
    client = docker.from_env()
    tag = uuid.uuid4().hex[:8]
    root = tmp_path_factory.mktemp("egress-world")
    root.chmod(0o755)
    _ca(root)
    _index(root)
    _git(root)
    subprocess.run(["chmod", "-R", "a+rX", str(root)], check=True)
    # Internal: nothing on them reaches past this machine.
    near = client.networks.create(f"sk-egress-near-{tag}", internal=True, labels={WORLD: tag})
    far = client.networks.create(f"sk-egress-far-{tag}", internal=True, labels={WORLD: tag})
    servers = [
        ("index.test", near, HTTPS_SERVER, ["index.test"]),
        ("git.test", near, GIT_SERVER, []),
        ("denied.test", far, PLAIN_SERVER, []),
        ("denied-tls.test", far, HTTPS_SERVER, ["denied.test"]),
    ]
    addresses = {}
    try:
        for name, network, code, args in servers:
            container = client.containers.create(
                TEST_IMAGE,
                ["python3", "-c", textwrap.dedent(code), *args],
                user="65534:65534",
                labels={WORLD: tag},
                volumes={str(root): {"bind": "/srv", "mode": "ro"}},
                working_dir="/srv/www",
                network_disabled=False,
            )
            network.connect(container, aliases=[name])
            client.networks.get("bridge").disconnect(container)
            container.start()
            container.reload()
            addresses[name] = container.attrs["NetworkSettings"]["Networks"][network.name][
                "IPAddress"
            ]
        yield World(root, [near, far], addresses)
    finally:
        for container in client.containers.list(
            ignore_removed=True, all=True, filters={"label": f"{WORLD}={tag}"}
        ):
            container.remove(force=True)
        for network in (near, far):
            for attached in client.api.inspect_network(network.id).get("Containers") or {}:
                network.disconnect(attached, force=True)
            network.remove()


def _remove_proxies(state_dir: str) -> None:
    """The test installation's egress proxies and their volumes."""
    from sandbox_kernel.backends import make_backend

    cfg = load_config(environ={}, backend="docker", state_dir=state_dir)
    backend = make_backend(cfg)
    backend._egress.remove_all()  # type: ignore[attr-defined]


ATTACKS = r"""
import errno, json, os, socket, ssl, time, urllib.request

far, near = json.loads(os.environ["EGRESS_TEST_ADDRESSES"]), None
out = {}

def attempt(name, fn):
    started = time.monotonic()
    try:
        result = fn()
        out[name] = {"ok": result}
    except socket.timeout as exc:
        out[name] = {"timeout": str(exc)}
    except Exception as exc:
        out[name] = {"error": type(exc).__name__, "errno": getattr(exc, "errno", None), "text": str(exc)[:300]}
    out[name]["seconds"] = round(time.monotonic() - started, 3)

def tcp(host, port, family=socket.AF_INET):
    s = socket.socket(family, socket.SOCK_STREAM)
    s.settimeout(20)
    try:
        s.connect((host, port))
        return "connected"
    finally:
        s.close()

def udp(host, port):
    s = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    s.settimeout(20)
    try:
        s.sendto(b"\x12\x34\x01\x00\x00\x01\x00\x00\x00\x00\x00\x00\x05index\x04test\x00\x00\x01\x00\x01", (host, port))
        return s.recv(512).hex()
    finally:
        s.close()

def through_proxy(request, then=b""):
    s = socket.create_connection(("127.0.0.1", 3128), timeout=20)
    try:
        s.sendall(request)
        head = b""
        while b"\r\n\r\n" not in head:
            chunk = s.recv(4096)
            if not chunk:
                break
            head += chunk
        status = head.split(b"\r\n", 1)[0].decode()
        if not then or " 200 " not in status + " ":
            return status
        s.sendall(then)
        rest = s.recv(4096)
        return "relayed %d bytes after %s" % (len(rest), status)
    finally:
        s.close()

def client_hello(name):
    incoming, outgoing = ssl.MemoryBIO(), ssl.MemoryBIO()
    tls = ssl.create_default_context().wrap_bio(incoming, outgoing, server_hostname=name)
    try:
        tls.do_handshake()
    except ssl.SSLWantReadError:
        pass
    return outgoing.read()

def direct(url):
    opener = urllib.request.build_opener(urllib.request.ProxyHandler({}))
    return opener.open(url, timeout=20).status

def changed_proxy(url, proxy):
    opener = urllib.request.build_opener(urllib.request.ProxyHandler({"http": proxy, "https": proxy}))
    return opener.open(url, timeout=20).status

attempt("raw_address", lambda: tcp(far["denied.test"], 80))
attempt("raw_address_of_allowed_host", lambda: tcp(far["index.test"], 443))
attempt("other_port_direct", lambda: tcp(far["index.test"], 8443))
attempt("other_port_via_proxy", lambda: through_proxy(b"CONNECT index.test:8443 HTTP/1.1\r\n\r\n"))
attempt("dns_to_another_server", lambda: udp(far["denied.test"], 53))
attempt("dns_lookup", lambda: socket.getaddrinfo("denied.test", 443))
attempt("proxy_unset", lambda: direct("https://index.test/simple/"))
attempt("proxy_changed", lambda: changed_proxy("http://denied.test/", "http://%s:80" % far["denied.test"]))
attempt("ipv6", lambda: tcp("::ffff:" + far["denied.test"], 80, socket.AF_INET6))
attempt("ipv6_via_proxy", lambda: through_proxy(("CONNECT [::ffff:%s]:80 HTTP/1.1\r\n\r\n" % far["denied.test"]).encode()))
attempt("udp", lambda: udp(far["denied.test"], 9999))
attempt("connect_denied_name", lambda: through_proxy(b"CONNECT denied.test:443 HTTP/1.1\r\n\r\n"))
attempt("http_denied_name", lambda: through_proxy(b"GET http://denied.test/ HTTP/1.1\r\nHost: denied.test\r\n\r\n"))
attempt("connect_raw_address", lambda: through_proxy(("CONNECT %s:443 HTTP/1.1\r\n\r\n" % far["denied.test"]).encode()))
attempt("sni_differs", lambda: through_proxy(b"CONNECT index.test:443 HTTP/1.1\r\n\r\n", then=client_hello("denied.test")))
attempt("sni_same", lambda: through_proxy(b"CONNECT index.test:443 HTTP/1.1\r\n\r\n", then=client_hello("index.test")))
attempt("metadata", lambda: through_proxy(b"GET http://169.254.169.254/latest/meta-data/ HTTP/1.1\r\n\r\n"))
attempt("metadata_connect", lambda: through_proxy(b"CONNECT 169.254.169.254:80 HTTP/1.1\r\n\r\n"))
attempt("other_sandbox", lambda: through_proxy(("CONNECT %s:8000 HTTP/1.1\r\n\r\n" % far["other-sandbox"]).encode()))
attempt("proxy_itself", lambda: through_proxy(b"GET / HTTP/1.1\r\nHost: x\r\n\r\n"))
print(json.dumps(out))
"""


def test_the_allowlist_holds_against_every_way_around_it(
    world: World, tmp_path: Path, test_user: str, docker_cleanup: None
) -> None:
    """Every attack ends in a refusal (an error at once, or the proxy's 403), none in a
    time-out; what the proxy refused is counted."""
    other_user = test_user + "-other"
    state = str(tmp_path / "state")
    folders = {"workspace_root": str(tmp_path / "ws"), "state_dir": state}
    try:
        # Another user's sandbox without a list, with a server, on the shared network.
        open_cfg = load_config(environ={}, backend="docker", image=TEST_IMAGE, **folders)
        other = SandboxService(open_cfg).ensure(ScopeKey(other_user)).info
        SandboxService(open_cfg).backend.exec(
            other.id, ["sh", "-c", "nohup python3 -m http.server 8000 >/dev/null 2>&1 &"]
        )
        client = docker.from_env()
        other_address = client.containers.get(other.engine_id).attrs["NetworkSettings"]["Networks"][
            "sandbox-kernel"
        ]["IPAddress"]
        shared = client.api.inspect_network("sandbox-kernel")["IPAM"]["Config"][0]["Subnet"]
        # The sandboxes' own network listed on purpose: it is never reached all the same.
        cfg = load_config(
            environ={},
            backend="docker",
            image=TEST_IMAGE,
            egress_allow=[*ALLOW, f"{shared}:*"],
            **folders,
        )
        service = SandboxService(cfg)
        info = service.ensure(ScopeKey(test_user)).info
        assert info.limits["network"] is True and info.limits["egress_allow"]
        world.join(proxy_name(service.installation, cfg.egress()))
        addresses = {**world.addresses, "other-sandbox": other_address}
        result = service.backend.exec(
            info.id,
            ["python3", "-c", ATTACKS],
            env={"EGRESS_TEST_ADDRESSES": json.dumps(addresses)},
            timeout=300,
        )
        assert result.exit_code == 0, result.output.decode()
        out = json.loads(result.output.decode().strip().splitlines()[-1])
        print(json.dumps(out, indent=1))  # the seconds each took, for the report
        timed_out = [name for name, r in out.items() if "timeout" in r]
        assert not timed_out, f"these waited for a time-out instead of a refusal: {timed_out}"
        unreachable = {errno for errno in (101, 97)}  # ENETUNREACH, EAFNOSUPPORT
        for name in (
            "raw_address",
            "raw_address_of_allowed_host",
            "other_port_direct",
            "dns_to_another_server",
            "ipv6",
            "udp",
        ):
            assert out[name].get("errno") in unreachable, (name, out[name])
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
        ):
            assert out[name].get("ok", "").startswith("HTTP/1.1 403 egress denied"), (
                name,
                out[name],
            )
        assert "sandboxes' own network" in out["other_sandbox"]["ok"]
        assert (
            out["sni_differs"]["ok"] == "relayed 0 bytes after HTTP/1.1 200 Connection established"
        )
        assert out["sni_same"]["ok"].startswith("relayed") and not out["sni_same"]["ok"].startswith(
            "relayed 0 "
        )  # the index's TLS server answered the ClientHello
        assert out["proxy_itself"]["ok"].startswith("HTTP/1.1 400")
        counts = {c.reason: c.count for c in _until_counted(service)}
        assert counts.get("sni") == 1
        assert counts.get("name") == 2 and counts.get("port") == 1
        # A raw address, its IPv6 form, the metadata address twice, the other sandbox.
        assert counts.get("address") == 5
    finally:
        remove_user_containers(other_user)
        remove_user_containers(test_user)
        _remove_proxies(state)


def _until_counted(service: SandboxService) -> list[Any]:
    import time

    deadline = time.monotonic() + 30
    while True:
        found = service.backend.egress_denied()
        if sum(c.count for c in found) >= 10 or time.monotonic() > deadline:
            return found
        time.sleep(0.5)


def test_pip_and_git_in_cells_need_no_proxy_setting(world: World, tmp_path: Path) -> None:
    """`%pip install` from the allowed HTTPS index and `git clone` from the allowed git
    server in notebook cells run by `jupyter execute`; the cells say nothing about a
    proxy. The index's CA and URL are in the sandbox's pip configuration, as a company's
    image carries them."""
    kenv = make_kernel_env(tmp_path, SANDBOX_KERNEL_EGRESS_ALLOW=",".join(ALLOW))
    cfg = kenv.config(egress_allow=ALLOW)
    service = SandboxService(cfg)
    try:
        info = service.ensure(ScopeKey(kenv.user)).info
        world.join(proxy_name(service.installation, cfg.egress()))
        ca = (world.root / "tls" / "ca.pem").read_bytes()
        service.backend.put_file(info.id, ".egress-ca.pem", ca)
        setup = (
            "mkdir -p ~/.config/pip && printf '[global]\\nindex-url = https://index.test/simple/\\n"
            "cert = /workspace/.egress-ca.pem\\n' > ~/.config/pip/pip.conf"
        )
        assert service.backend.exec(info.id, ["sh", "-c", setup]).exit_code == 0
        nb = nbformat.v4.new_notebook()
        nb.cells = [
            nbformat.v4.new_code_cell("%pip install -q sk_egress_pkg"),
            nbformat.v4.new_code_cell(
                "import sk_egress_pkg; print('version', sk_egress_pkg.VALUE)"
            ),
            nbformat.v4.new_code_cell(
                "!git clone -q http://git.test/cgi-bin/git/repo.git /tmp/repo && cat /tmp/repo/hello.txt"
            ),
        ]
        nb.metadata["kernelspec"] = {
            "name": "sandbox",
            "display_name": "sandbox",
            "language": "python",
        }
        path = tmp_path / "egress.ipynb"
        nbformat.write(nb, path)
        run = subprocess.run(
            [sys.executable, "-m", "jupyter", "execute", "--inplace", "--timeout=600", str(path)],
            env=kenv.environ(),
            capture_output=True,
            text=True,
            timeout=900,
        )
        assert run.returncode == 0, run.stderr[-3000:]
        outputs = [
            "".join(o.get("text", "") for o in cell.outputs)
            for cell in nbformat.read(path, 4).cells
        ]
        assert "version 1.0" in outputs[1]
        assert "cloned through the egress proxy" in outputs[2]
    finally:
        remove_user_containers(kenv.user)
        _remove_proxies(cfg.state_dir)


@pytest.fixture
def jp_server_config(rest_env: dict[str, str], monkeypatch: pytest.MonkeyPatch) -> dict[str, Any]:
    monkeypatch.setenv("SANDBOX_KERNEL_EGRESS_ALLOW", "index.test")
    return {
        "ServerApp": {"jpserver_extensions": {"jupyter_ext": True}},
        "SandboxExtension": {"gc_interval": 0, "metrics_interval": 0.2},
    }


async def test_refusals_are_counted_on_metrics(
    jp_fetch: Any, rest_env: dict[str, str], test_user: str
) -> None:
    """A sandbox of the server's user asks its proxy for a name not on the list: the
    server's /metrics counts it, by allowlist and reason."""
    cfg = load_config(
        environ={},
        backend="docker",
        image=TEST_IMAGE,
        workspace_root=rest_env["SANDBOX_KERNEL_WORKSPACE_ROOT"],
        state_dir=rest_env["SANDBOX_KERNEL_STATE_DIR"],
        egress_allow=["index.test"],
    )
    service = SandboxService(cfg)
    try:
        info = service.ensure(ScopeKey(test_user)).info
        ask = (
            "import urllib.request\n"
            "try: urllib.request.urlopen('https://denied.test/', timeout=20)\n"
            "except Exception as exc: print(exc)\n"
        )
        result = service.backend.exec(info.id, ["python3", "-c", ask])
        assert "403 egress denied: denied.test is not in the allowlist" in result.output.decode()
        text = await until(
            jp_fetch, lambda t: value(t, "sandbox_kernel_egress_denied_total", reason="name") >= 1
        )
        assert value(text, "sandbox_kernel_egress_denied_total", reason="name") == 1
        assert "# HELP sandbox_kernel_egress_denied_total Connections refused" in text
    finally:
        remove_user_containers(test_user)
        _remove_proxies(cfg.state_dir)
