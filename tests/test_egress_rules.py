"""Egress allowlists without an engine: the entries an administrator may write, what
each allows, the setting's one-line errors, and the proxy program itself on this host
(real sockets on loopback: HTTP and CONNECT through it, a TLS ClientHello whose name
differs from the CONNECT host, refusals answered at once and counted)."""

from __future__ import annotations

import ipaddress
import json
import socket
import ssl
import threading
import time
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import pytest

from sandbox_kernel.agent.egress_proxy import Counts, Proxy, server_name
from sandbox_kernel.agent.egress_rules import Rules, parse_entry
from sandbox_kernel.backends.base import Spec
from sandbox_kernel.config import ConfigError, load_config

pytestmark = pytest.mark.fast


def allowed(rules: Rules, host: str, port: int, address: str) -> str:
    """'' when ``host`` (resolving to ``address``) may be reached on ``port``."""
    ip = ipaddress.ip_address(address)
    if host == address:
        if not rules.networks_for(port):
            return "no network listed"
        return rules.address_allowed(ip, port, [])
    if not rules.needs_lookup(host, port):
        return "not listed"
    return rules.address_allowed(ip, port, rules.names_for(host, port))


@pytest.mark.parametrize(
    "entry, kind",
    [
        ("pypi.org", "name"),
        ("PyPI.org.", "name"),
        ("*.pythonhosted.org", "wildcard"),
        ("*", "any"),
        ("10.20.0.0/16", "network"),
        ("203.0.113.7", "network"),
        ("2001:db8::/32", "network"),
        ("[2001:db8::/32]:443", "network"),
        ("git.example.com:22", "name"),
        ("*:*", "any"),
        ("bücher.example", "name"),
    ],
)
def test_entries_that_are_accepted(entry: str, kind: str) -> None:
    assert parse_entry(entry).kind == kind


@pytest.mark.parametrize(
    "entry, says",
    [
        ("https://pypi.org/simple", "is a URL"),
        ("pypi.org/simple", "holds a path"),
        ("10.0.0.1/8", "not a network"),
        ("pypi.org:0", "port must be a number"),
        ("pypi.org:http", "port must be a number"),
        ("py*.org", "'*' may only stand alone"),
        ("*.", "what follows '*.'"),
        ("exa mple.com", "not a host name"),
        ("", "an empty entry"),
        ("[2001:db8::/32", "without ']'"),
    ],
)
def test_entries_that_are_refused_say_why(entry: str, says: str) -> None:
    with pytest.raises(ValueError, match=says.replace("*", r"\*").replace("(", r"\(")):
        parse_entry(entry)


def test_names_wildcards_and_ports() -> None:
    rules = Rules(["pypi.org", "*.pythonhosted.org", "git.example.com:22"])
    public = "93.184.216.34"
    assert allowed(rules, "pypi.org", 443, public) == ""
    assert allowed(rules, "pypi.org", 80, public) == ""
    assert allowed(rules, "pypi.org", 8443, public) == "not listed"  # another port
    assert allowed(rules, "files.pythonhosted.org", 443, public) == ""
    assert allowed(rules, "pythonhosted.org", 443, public) == "not listed"  # not the apex
    assert allowed(rules, "evilpythonhosted.org", 443, public) == "not listed"
    assert allowed(rules, "git.example.com", 22, public) == ""
    assert allowed(rules, "git.example.com", 443, public) == "not listed"
    assert allowed(rules, public, 443, public) == "no network listed"  # a raw address


def test_inner_addresses_need_the_administrators_word() -> None:
    rules = Rules(["mirror.corp", "*.corp", "*"])
    # An exact name may lead to a private address; a wildcard or * may not.
    assert allowed(rules, "mirror.corp", 443, "10.1.2.3") == ""
    assert "private" in allowed(rules, "other.corp", 443, "10.1.2.3")
    assert "private" in allowed(rules, "anything.example", 443, "192.168.1.1")
    # Loopback and link-local (the metadata service) never through a name.
    for address in ("127.0.0.1", "169.254.169.254", "::1", "fe80::1", "::ffff:169.254.169.254"):
        assert "loopback, link-local" in allowed(rules, "mirror.corp", 443, address), address
    # NAT64 and 6to4 carry an IPv4 address inside: treated as the machine's own.
    assert allowed(rules, "mirror.corp", 443, "64:ff9b::a9fe:a9fe") != ""
    # * and 0.0.0.0/0 open the public internet only.
    assert allowed(rules, "anything.example", 443, "93.184.216.34") == ""
    wide = Rules(["0.0.0.0/0", "::/0"])
    assert allowed(wide, "93.184.216.34", 443, "93.184.216.34") == ""
    assert "private" in allowed(wide, "10.0.0.1", 443, "10.0.0.1")
    assert "link-local" in allowed(wide, "169.254.169.254", 80, "169.254.169.254")


def test_listed_inner_networks_and_the_sandboxes_own() -> None:
    rules = Rules(["10.20.0.0/16", "169.254.169.254/32:80"], never=["10.20.5.0/24"])
    assert allowed(rules, "10.20.1.1", 443, "10.20.1.1") == ""
    assert allowed(rules, "db.corp", 443, "10.20.1.1") == ""  # its address is listed
    assert "private" in allowed(rules, "10.30.1.1", 443, "10.30.1.1")
    assert allowed(rules, "169.254.169.254", 80, "169.254.169.254") == ""
    assert "link-local" in allowed(rules, "169.254.169.254", 443, "169.254.169.254")
    assert "sandboxes' own network" in allowed(rules, "10.20.5.9", 443, "10.20.5.9")


def test_the_setting_and_its_errors(tmp_path: Path) -> None:
    folders = {"workspace_root": str(tmp_path / "w"), "state_dir": str(tmp_path / "s")}
    cfg = load_config(environ={}, egress_allow=["pypi.org", "*.pythonhosted.org"], **folders)
    assert cfg.egress() == ("pypi.org", "*.pythonhosted.org")
    with pytest.raises(ConfigError) as bad:
        load_config(environ={}, egress_allow=["https://pypi.org/simple"], **folders)
    assert str(bad.value).count("\n") == 0
    assert "egress_allow" in str(bad.value) and "give only its host name" in str(bad.value)
    # From the environment: a JSON list, or words.
    env = {"SANDBOX_KERNEL_EGRESS_ALLOW": "pypi.org, *.pythonhosted.org 10.0.0.0/8"}
    assert load_config(environ=env, **folders).egress() == (
        "pypi.org",
        "*.pythonhosted.org",
        "10.0.0.0/8",
    )
    env = {"SANDBOX_KERNEL_EGRESS_ALLOW": '["pypi.org"]'}
    assert load_config(environ=env, **folders).egress() == ("pypi.org",)
    # Network off allows nothing, whatever the list.
    off = load_config(environ={}, egress_allow=["pypi.org"], network=False, **folders)
    assert off.egress() == ()


def test_a_flavor_has_its_own_list(tmp_path: Path) -> None:
    folders = {"workspace_root": str(tmp_path / "w"), "state_dir": str(tmp_path / "s")}
    flavors = {
        "web": {"cpus": 1, "memory": "1G", "disk": "10G", "egress_allow": ["*"]},
        "open": {"cpus": 1, "memory": "1G", "disk": "10G", "egress_allow": []},
    }
    cfg = load_config(environ={}, egress_allow=["pypi.org"], flavors=flavors, **folders)
    assert cfg.egress() == ("pypi.org",)
    assert cfg.egress("web") == ("*",)
    assert cfg.egress("open") == ()
    bad = {"x": {"cpus": 1, "memory": "1G", "disk": "10G", "egress_allow": ["a b"]}}
    with pytest.raises(ConfigError, match="flavor 'x': egress_allow 'a b' is not a host name"):
        load_config(environ={}, flavors=bad, **folders)


def test_a_list_is_part_of_what_a_sandbox_is_made_from() -> None:
    plain = Spec()
    assert Spec(egress=("pypi.org",)).fingerprint() != plain.fingerprint()
    assert (
        Spec(egress=("a.org", "b.org")).fingerprint()
        == Spec(egress=("b.org", "a.org")).fingerprint()
    )
    assert Spec(egress=()).fingerprint() == plain.fingerprint()  # older sandboxes keep theirs


# -- the proxy program, on this host --------------------------------------------------------


class _Hello(BaseHTTPRequestHandler):
    def do_GET(self) -> None:  # noqa: N802
        body = json.dumps({"host": self.headers.get("Host"), "path": self.path}).encode()
        self.send_response(200)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, *args: object) -> None:
        pass


@pytest.fixture
def upstream() -> Iterator[int]:
    server = ThreadingHTTPServer(("127.0.0.1", 0), _Hello)
    threading.Thread(target=server.serve_forever, args=(0.05,), daemon=True).start()
    yield server.server_address[1]
    server.shutdown()


@pytest.fixture
def proxy(
    tmp_path: Path, upstream: int, monkeypatch: pytest.MonkeyPatch
) -> Iterator[tuple[str, Path]]:
    """The proxy on a Unix socket, allowing localhost (by name, and its network) on the
    upstream server's port."""
    monkeypatch.setattr(Counts, "every", 0.02)  # the counts file follows at once
    path = tmp_path / "proxy.sock"
    counts = tmp_path / "counts.json"
    allow = [f"localhost:{upstream}", f"127.0.0.0/8:{upstream}"]
    server = Proxy({"allow": allow, "never": [], "socket": str(path), "counts": str(counts)})
    threading.Thread(target=server.serve, args=(str(path),), daemon=True).start()
    for _ in range(200):
        if path.exists():
            break
        time.sleep(0.01)
    yield str(path), counts


def _ask(path: str, request: bytes, then: bytes = b"") -> bytes:
    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as sock:
        sock.settimeout(10)
        sock.connect(path)
        sock.sendall(request)
        if then:
            head = b""
            while b"\r\n\r\n" not in head:
                head += sock.recv(4096)
            if not head.startswith(b"HTTP/1.1 200"):
                return head
            sock.sendall(then)
        data = b""
        while True:
            try:
                chunk = sock.recv(65536)
            except OSError:
                break
            if not chunk:
                break
            data += chunk
        return data


def _client_hello(name: str) -> bytes:
    """A real TLS ClientHello asking for ``name`` (from Python's own TLS)."""
    context = ssl.create_default_context()
    incoming, outgoing = ssl.MemoryBIO(), ssl.MemoryBIO()
    tls = context.wrap_bio(incoming, outgoing, server_hostname=name)
    with pytest.raises(ssl.SSLWantReadError):
        tls.do_handshake()
    return outgoing.read()


def _denied(counts: Path, expected: dict[str, int]) -> dict[str, int]:
    """The refusals the proxy's counts file holds, once they are ``expected`` (or
    what it holds after 5 s): it is written a moment after each refusal."""
    found: dict[str, int] = {}
    deadline = time.monotonic() + 5
    while found != expected and time.monotonic() < deadline:
        time.sleep(0.01)
        if counts.exists():
            found = json.loads(counts.read_text())["denied"]
    return found


def test_the_proxy_relays_what_the_list_allows(proxy: tuple[str, Path], upstream: int) -> None:
    path, _ = proxy
    reply = _ask(
        path,
        f"GET http://localhost:{upstream}/x?y HTTP/1.1\r\nHost: elsewhere.example\r\n"
        "Proxy-Authorization: Basic c2VjcmV0\r\n\r\n".encode(),
    )
    assert reply.startswith(b"HTTP/1.0 200")
    body = json.loads(reply.split(b"\r\n\r\n", 1)[1])
    # The Host is the URL's, whatever the client wrote: no second name rides along.
    assert body == {"host": f"localhost:{upstream}", "path": "/x?y"}
    tunnel = _ask(
        path,
        f"CONNECT localhost:{upstream} HTTP/1.1\r\n\r\n".encode(),
        then=b"GET /t HTTP/1.1\r\nHost: localhost\r\nConnection: close\r\n\r\n",
    )
    assert b'"path": "/t"' in tunnel


def test_the_proxy_refuses_at_once_and_counts(proxy: tuple[str, Path], upstream: int) -> None:
    path, counts = proxy
    started = time.monotonic()
    for request, status in [
        (b"CONNECT denied.example:443 HTTP/1.1\r\n\r\n", b"403"),
        (f"CONNECT localhost:{upstream + 1} HTTP/1.1\r\n\r\n".encode(), b"403"),
        (b"CONNECT 127.0.0.1:22 HTTP/1.1\r\n\r\n", b"403"),
        (b"GET http://denied.example/ HTTP/1.1\r\n\r\n", b"403"),
        (b"GET / HTTP/1.1\r\nHost: localhost\r\n\r\n", b"400"),
        (b"SSH-2.0-OpenSSH\r\n\r\n", b"400"),
    ]:
        reply = _ask(path, request)
        assert reply.split(b" ", 2)[1] == status, (request, reply)
    assert time.monotonic() - started < 30  # answered, not left to time out
    reply = _ask(path, b"CONNECT denied.example:443 HTTP/1.1\r\n\r\n")
    assert b"egress denied: denied.example is not in the allowlist (egress_allow)" in reply
    expected = {"name": 3, "port": 1, "address": 1}
    assert _denied(counts, expected) == expected


def test_a_tls_name_other_than_the_connect_host_is_refused(
    proxy: tuple[str, Path], upstream: int
) -> None:
    path, counts = proxy
    hello = _client_hello("denied.example")
    assert server_name(hello) == ("denied.example",)
    assert server_name(hello[:20]) is None  # incomplete: read on
    reply = _ask(path, f"CONNECT localhost:{upstream} HTTP/1.1\r\n\r\n".encode(), then=hello)
    assert reply == b""  # the tunnel is closed, nothing relayed
    assert _denied(counts, {"sni": 1}) == {"sni": 1}
    # The same name as the CONNECT host goes through (the server then fails TLS: it is
    # plain HTTP, which is not the proxy's business).
    good = _client_hello("localhost")
    reply = _ask(path, f"CONNECT localhost:{upstream} HTTP/1.1\r\n\r\n".encode(), then=good)
    assert b"400" in reply  # http.server's answer to a ClientHello


def test_what_daytona_can_take_of_a_list() -> None:
    from sandbox_kernel.backends.daytona.egress import daytona_egress

    assert daytona_egress(()) == ({}, [])
    settings, lost = daytona_egress(("pypi.org", "*.github.com", "10.0.0.0/8", "git.corp:22"))
    assert settings == {
        "domain_allow_list": "pypi.org,*.github.com,git.corp",
        "network_allow_list": "10.0.0.0/8",
    }
    assert lost == ["git.corp:22: no port rules (Daytona's ports apply)"]
    # Nothing it can say: closed, not open.
    assert daytona_egress(("2001:db8::/32",))[0] == {"network_block_all": True}
    # Any public name: Daytona cannot tell public from private; left as it gives it.
    assert daytona_egress(("*",))[0] == {}


def test_kubernetes_holds_the_networks_of_a_list_and_names_none() -> None:
    """On Kubernetes a list becomes the pod's whole egress: inner networks as listed,
    public ones and ``*`` without the private and local spaces in them, TCP ports only;
    names cannot be said in a network policy, so they stay unreachable and are named."""
    from sandbox_kernel.backends.kubernetes.egress import DNS, egress_note, kube_egress
    from sandbox_kernel.backends.kubernetes.objects import policy_manifest

    rules, lost = kube_egress(["10.1.2.3/32:8080", "0.0.0.0/0:*", "pypi.org", "*.example.com"])
    assert rules[0] == {
        "to": [{"ipBlock": {"cidr": "10.1.2.3/32"}}],
        "ports": [{"protocol": "TCP", "port": 8080}],
    }
    public = rules[1]["to"][0]["ipBlock"]
    assert public["cidr"] == "0.0.0.0/0" and rules[1]["ports"] == [{"protocol": "TCP"}]
    assert {"10.0.0.0/8", "127.0.0.0/8", "169.254.0.0/16", "192.168.0.0/16"} <= set(
        public["except"]
    )
    assert len(rules) == 2 and DNS not in rules  # no name listed, no DNS
    assert [entry.split(":")[0] for entry in lost] == ["pypi.org", "*.example.com"]
    assert "not held: pypi.org" in egress_note(["pypi.org"]) and not egress_note([])

    anywhere, _ = kube_egress(["*"])
    assert anywhere[0] == DNS
    assert [b["ipBlock"]["cidr"] for b in anywhere[1]["to"]] == ["0.0.0.0/0", "::/0"]
    assert "fc00::/7" in anywhere[1]["to"][1]["ipBlock"]["except"]
    assert anywhere[1]["ports"] == [
        {"protocol": "TCP", "port": 80},
        {"protocol": "TCP", "port": 443},
    ]

    labels = {"sandbox-kernel.sandbox": "s", "sandbox-kernel.installation": "i"}
    listed = policy_manifest("p", labels, True, rules)["spec"]
    assert listed["egress"] == rules and listed["ingress"] == []
    assert policy_manifest("p", labels, False, rules)["spec"]["egress"] == []  # no network wins
    names_only = policy_manifest("p", labels, True, kube_egress(["pypi.org"])[0])["spec"]
    assert names_only["egress"] == []  # nothing leaves: the list only takes away
