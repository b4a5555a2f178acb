"""Which destinations a sandbox with an egress allowlist may reach.

The rules of ``c.SandboxConfig.egress_allow``, shared by the host (which checks the
setting and names a bad entry) and the egress proxy (which decides each connection).
An entry is a name (``pypi.org``), a wildcard (``*.pythonhosted.org``: every name
below it, not the name itself), ``*`` (any name), or an address or network
(``203.0.113.7``, ``10.20.0.0/16``, ``2001:db8::/32``); any of them may end in
``:PORT`` (``[2001:db8::/32]:443`` for a network of IPv6) or ``:*`` for every port.
Without a port an entry allows 80 and 443.

Names are decided before anything is resolved; the proxy then resolves them itself
and connects only to an address that the list allows as well:

* a public address: any entry that matched;
* a private one (10/8, 172.16/12, 192.168/16, 100.64/10, fc00::/7 ...): a name given
  exactly (not by a wildcard), or a listed network inside private space;
* loopback, link-local (the cloud metadata service 169.254.169.254), multicast and the
  like: only a listed network inside that space (``169.254.169.254/32``), never a name;
* the sandboxes' own network (the proxy is told it): never.

So ``*`` or ``0.0.0.0/0`` opens the public internet and nothing of the machine's own
networks, and a name whose DNS answer points at an inner address is refused.

Standard library only, Python 3.8 (it runs in the proxy's container).
"""

import ipaddress
import re

DEFAULT_PORTS = (80, 443)
ANY_PORT = 0

_LABEL = re.compile(r"[a-z0-9_]([a-z0-9_-]{0,61}[a-z0-9_])?")

# Addresses that are not the public internet. LOCAL ones are the machine's or its
# link's own (loopback, link-local, multicast, unspecified, reserved, and IPv6 forms
# that carry an IPv4 address inside): only a listed network inside them opens them.
_LOCAL = [
    ipaddress.ip_network(n)
    for n in (
        "0.0.0.0/8",
        "127.0.0.0/8",
        "169.254.0.0/16",
        "224.0.0.0/4",
        "240.0.0.0/4",
        "::/128",
        "::1/128",
        "::ffff:0:0/96",
        "64:ff9b::/96",
        "64:ff9b:1::/48",
        "2002::/16",
        "2001::/32",
        "fe80::/10",
        "ff00::/8",
    )
]
_PRIVATE = [
    ipaddress.ip_network(n)
    for n in (
        "10.0.0.0/8",
        "100.64.0.0/10",
        "172.16.0.0/12",
        "192.0.0.0/24",
        "192.0.2.0/24",
        "192.168.0.0/16",
        "198.18.0.0/15",
        "198.51.100.0/24",
        "203.0.113.0/24",
        "100::/64",
        "2001:db8::/32",
        "fc00::/7",
    )
]
# Every space a network entry must lie inside to open it: what ``*`` never opens.
INNER = _LOCAL + _PRIVATE


class Entry:
    """One entry of the list: ``kind`` is name, wildcard, any or network."""

    def __init__(self, text, kind, value, port):
        self.text = text
        self.kind = kind
        self.value = value  # the name, the wildcard's suffix (".example.com"), or a network
        self.port = port  # ANY_PORT, or a port; None: the default ports

    def allows_port(self, port):
        if self.port is None:
            return port in DEFAULT_PORTS
        return self.port == ANY_PORT or self.port == port

    def matches(self, name):
        if self.kind == "any":
            return True
        if self.kind == "wildcard":
            return name.endswith(self.value)
        return self.kind == "name" and name == self.value

    def opens(self, address):
        """Whether this network entry holds ``address`` and may open its kind of space."""
        if self.kind != "network" or address.version != self.value.version:
            return False
        return address in self.value

    def inner(self):
        """Whether this network lies inside private or local space (the administrator's
        word that those addresses may be reached)."""
        return any(
            self.value.version == space.version and self.value.subnet_of(space)
            for space in _LOCAL + _PRIVATE
        )


def normal_name(text):
    """A host name as the rules compare it: lower case, no final dot, IDNA for
    non-ASCII; ValueError when it is no host name."""
    name = text.strip().lower()
    if name.endswith("."):
        name = name[:-1]
    try:
        name = name.encode("idna").decode("ascii")
    except (UnicodeError, ValueError):
        raise ValueError("%r is not a host name" % text) from None
    if not name or len(name) > 253 or not all(_LABEL.fullmatch(p) for p in name.split(".")):
        raise ValueError("%r is not a host name" % text)
    return name


def address_of(text):
    """``text`` as an IP address (brackets and an IPv6 zone left out), or None."""
    value = text.strip()
    if value.startswith("[") and value.endswith("]"):
        value = value[1:-1]
    value = value.split("%", 1)[0]
    try:
        return ipaddress.ip_address(value)
    except ValueError:
        return None


def _split_port(text):
    """(host part, port or None) of an entry."""
    if text.startswith("["):
        host, sep, rest = text[1:].partition("]")
        if not sep:
            raise ValueError("%r has '[' without ']'" % text)
        if not rest:
            return host, None
        if not rest.startswith(":"):
            raise ValueError("%r: only ':PORT' may follow ']'" % text)
        return host, _port(text, rest[1:])
    if text.count(":") == 1:  # a name or IPv4 with a port (IPv6 needs brackets for one)
        host, _, port = text.partition(":")
        return host, _port(text, port)
    return text, None


def _port(text, port):
    if port == "*":
        return ANY_PORT
    if not port.isdigit() or not 0 < int(port) < 65536:
        raise ValueError("%r: the port must be a number from 1 to 65535, or *" % text)
    return int(port)


def parse_entry(raw):
    """One entry as an :class:`Entry`; ValueError saying what is wrong with it."""
    if not isinstance(raw, str):
        raise ValueError("%r is not text: give a name, *.domain, an address or a network" % (raw,))
    text = raw.strip()
    if not text:
        raise ValueError("an empty entry: give a name, *.domain, an address or a network")
    if "://" in text:
        raise ValueError("%r is a URL: give only its host name" % raw)
    host, port = _split_port(text)
    if "/" in host and address_of(host.split("/", 1)[0]) is None:
        raise ValueError("%r holds a path: give only the host name" % raw)
    if "/" in host or address_of(host) is not None:
        try:
            network = ipaddress.ip_network(host.split("%", 1)[0], strict=True)
        except ValueError as exc:
            raise ValueError("%r is not a network: %s" % (raw, exc)) from None
        return Entry(text, "network", network, port)
    if host == "*":
        return Entry(text, "any", "", port)
    if host.startswith("*."):
        try:
            return Entry(text, "wildcard", "." + normal_name(host[2:]), port)
        except ValueError:
            raise ValueError("%r: what follows '*.' is not a domain" % raw) from None
    if "*" in host:
        raise ValueError("%r: '*' may only stand alone or begin an entry as '*.'" % raw)
    try:
        return Entry(text, "name", normal_name(host), port)
    except ValueError:
        raise ValueError(
            "%r is not a host name, *.domain, address or network (a URL? give its host)" % raw
        ) from None


class Rules:
    """The parsed list, and the networks that are never reached, listed or not (the
    sandboxes' own network on Docker; the host's own loopback where the proxy runs on
    the host), which ``never_why`` names in a refusal."""

    def __init__(self, entries, never=(), never_why="the sandboxes' own network"):
        self.entries = [parse_entry(e) for e in entries]
        self.never = [ipaddress.ip_network(n, strict=False) for n in never]
        self.never_why = never_why

    def names_for(self, name, port):
        """The name entries that allow ``name`` on ``port``."""
        return [
            e
            for e in self.entries
            if e.kind != "network" and e.matches(name) and e.allows_port(port)
        ]

    def networks_for(self, port):
        return [e for e in self.entries if e.kind == "network" and e.allows_port(port)]

    def needs_lookup(self, host, port):
        """Whether ``host`` could be allowed at all (so is worth resolving): a listed
        name, or a name whose address a listed network might hold."""
        return bool(self.names_for(host, port) or self.networks_for(port))

    def address_allowed(self, address, port, named):
        """'' when ``address`` may be reached on ``port`` (``named``: the entries that
        matched the name it was resolved from), else why not."""
        if address.version == 6 and address.ipv4_mapped is not None:
            address = address.ipv4_mapped
        if any(address.version == n.version and address in n for n in self.never):
            return "%s is on %s" % (address, self.never_why)
        networks = [e for e in self.networks_for(port) if e.opens(address)]
        if _within(address, _LOCAL):
            if any(e.inner() for e in networks):
                return ""
            return (
                "%s is a loopback, link-local or reserved address; list it as a network to allow it"
                % address
            )
        if _within(address, _PRIVATE) or not address.is_global:
            if any(e.inner() for e in networks) or any(e.kind == "name" for e in named):
                return ""
            return (
                "%s is a private address; list the host by its exact name, or its network" % address
            )
        if named or networks:
            return ""
        return "%s is not in a listed network" % address


def _within(address, spaces):
    return any(address.version == s.version and address in s for s in spaces)


def host_and_port(authority, default_port):
    """(host, port) of ``host``, ``host:port``, ``[v6]`` or ``[v6]:port``; ValueError."""
    text = authority.strip()
    if text.startswith("["):
        host, sep, rest = text[1:].partition("]")
        if not sep or (rest and not rest.startswith(":")):
            raise ValueError("bad address %r" % authority)
        port = rest[1:] if rest else str(default_port)
    elif text.count(":") == 1:
        host, _, port = text.partition(":")
    elif ":" in text:
        raise ValueError("an IPv6 address needs brackets: %r" % authority)
    else:
        host, port = text, str(default_port)
    if not port.isdigit() or not 0 < int(port) < 65536:
        raise ValueError("bad port in %r" % authority)
    return host, int(port)
