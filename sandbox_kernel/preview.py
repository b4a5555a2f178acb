"""Preview URLs: which ports of a sandbox listen, and how a port is named in a request.

The proxy itself is the server extension's (``jupyter_ext/proxy.py``); where a port is
reached is the engine's (:meth:`~.backends.base.Backend.port_target`); the rules (whose
sandbox, never waking a stopped one) are the orchestrator's. Here are the small pure
parts they share: the check of a port number a client sent, the program that reads a
sandbox's listening sockets, and the parsing of what it prints (untrusted: any process
of the sandbox could have written it).
"""

from __future__ import annotations

import ipaddress
import time
from dataclasses import asdict, dataclass
from typing import Any

from .agent import inline
from .backends.base import MAX_PORT, MIN_PORT, Backend
from .errors import BadRequest, SandboxError, SandboxFailed, shorten

PROXY_MOUNT = "sandbox-kernel/proxy"
MAX_PORTS = 256  # listening ports reported for one sandbox (the rest are left out)
LISTEN = "0A"  # the TCP state LISTEN in /proc/net/tcp
# Reads the sandbox's own TCP tables (its network namespace's): stdlib only, any python3.
READ_TABLES = inline(
    "import sys\n"
    "for name in ('/proc/net/tcp', '/proc/net/tcp6'):\n"
    "    try:\n"
    "        with open(name) as f:\n"
    "            sys.stdout.write(f.read(1 << 20))\n"
    "    except OSError:\n"
    "        pass\n"
)
# Docker's embedded DNS resolver listens here in every container on a network of ours:
# the engine's, never an app of the sandbox's.
ENGINE_RESOLVER = "127.0.0.11"


def check_port(value: Any) -> int:
    """A port number from a client: an integer 1-65535 written in plain digits."""
    text = str(value)
    if (
        not text.isascii()
        or not text.isdigit()
        or len(text) > 5
        or not (MIN_PORT <= int(text) <= MAX_PORT)
    ):
        raise BadRequest(
            f"bad port {shorten(text, 20)!r}: a port is a number from {MIN_PORT} to {MAX_PORT}"
        )
    return int(text)


def proxy_path(base_url: str, sandbox_id: str, port: int, absolute: bool = False) -> str:
    """The path of a sandbox port's preview on a server whose base URL is ``base_url``."""
    base = base_url if base_url.endswith("/") else base_url + "/"
    middle = "absolute/" if absolute else ""
    return f"{base}{PROXY_MOUNT}/{middle}{sandbox_id}/{port}/"


@dataclass(frozen=True)
class ListeningPort:
    """One TCP port a process of the sandbox listens on."""

    port: int
    address: str  # what it listens on: 0.0.0.0, ::, 127.0.0.1, ...
    reachable: bool  # False when it listens on the sandbox's loopback only

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


def _address(hexaddr: str) -> str:
    """An address of /proc/net/tcp{,6} (hex, in host byte order per 32-bit word) as text."""
    raw = bytes.fromhex(hexaddr)
    if len(raw) not in (4, 16):
        raise ValueError(hexaddr)
    # Each 32-bit word is little-endian on the machines we run on.
    words = b"".join(raw[i : i + 4][::-1] for i in range(0, len(raw), 4))
    ip = ipaddress.ip_address(words)
    if isinstance(ip, ipaddress.IPv6Address) and ip.ipv4_mapped is not None:
        ip = ip.ipv4_mapped
    return str(ip)


def listening_ports(text: str) -> list[ListeningPort]:
    """The listening ports in the TCP tables ``text`` (lines of /proc/net/tcp and tcp6),
    one entry per port (reachable when any of its sockets listens beyond loopback, any
    of 127.0.0.0/8 and ::1 being loopback), sorted; malformed lines and the engine's DNS
    resolver are skipped."""
    found: dict[int, ListeningPort] = {}
    for line in text.splitlines():
        fields = line.split()
        if len(fields) < 4 or fields[3] != LISTEN or ":" not in fields[1]:
            continue
        hexaddr, _, hexport = fields[1].partition(":")
        try:
            port = int(hexport, 16)
            address = _address(hexaddr)
        except ValueError:
            continue
        if not (MIN_PORT <= port <= MAX_PORT) or address == ENGINE_RESOLVER:
            continue
        entry = ListeningPort(port, address, not ipaddress.ip_address(address).is_loopback)
        known = found.get(port)
        if known is None or (entry.reachable and not known.reachable):
            found[port] = entry
        if len(found) >= MAX_PORTS:
            break
    return [found[p] for p in sorted(found)]


PORTS_TIMEOUT = 10.0  # seconds reading a sandbox's listening ports may take
STOP_SETTLES = 2.0  # seconds a read cut short may wait for the engine to say the sandbox stopped


def read_listening_ports(backend: Backend, sandbox_id: str) -> list[ListeningPort]:
    """The TCP ports processes of the running sandbox listen on, read from inside it (its
    own TCP tables, by a short program of the host's, bounded in time)."""
    result = backend.exec(sandbox_id, READ_TABLES, timeout=PORTS_TIMEOUT, cwd="/")
    if result.exit_code != 0:
        raise SandboxFailed(
            f"could not read the listening ports of {sandbox_id} "
            f"(exit {result.exit_code}): {shorten(result.output.decode(errors='replace'), 200)}"
        )
    return listening_ports(result.output.decode("ascii", "replace"))


def ports_of_running(backend: Backend, sandbox_id: str) -> tuple[str, list[ListeningPort]]:
    """(state, listening ports) of a sandbox that was running: one stopped (or removed)
    while its ports are read has none, which is not an error."""
    try:
        return "running", read_listening_ports(backend, sandbox_id)
    except SandboxError:
        # A stop kills the read before the engine says the sandbox stopped: give the
        # engine a moment to say so before calling the failure an error.
        deadline = time.monotonic() + STOP_SETTLES
        while True:
            now = backend.find(sandbox_id)
            if now is None or now.state != "running":
                return (now.state if now is not None else "stopped"), []
            if time.monotonic() >= deadline:
                raise
            time.sleep(0.1)
