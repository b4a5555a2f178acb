"""Egress allowlists on Kubernetes: the sandbox's NetworkPolicy holds the networks of
``egress_allow``; names cannot be said there, so they are named in the listing and left
unreachable (the list only ever takes away).

What each entry becomes, with the proxy's meaning (:mod:`sandbox_kernel.agent.egress_rules`):

- a network inside private or local space opens that network on its ports;
- any other network (``0.0.0.0/0`` too) opens its public part: private and local
  space inside it stay out;
- ``*`` opens the public internet, IPv4 and IPv6, with the cluster's DNS to find it;
- a name or ``*.domain`` is not held: NetworkPolicy matches addresses, not names.

Ports are TCP (the proxy relays TCP only): the entry's own, else 80 and 443, every TCP
port for ``:*``. Nothing else leaves the pod: no DNS unless ``*`` is listed.
"""

from __future__ import annotations

import ipaddress
from typing import Any

from ...agent.egress_rules import ANY_PORT, DEFAULT_PORTS, INNER, Entry, parse_entry

DNS = {
    "to": [{"namespaceSelector": {}, "podSelector": {"matchLabels": {"k8s-app": "kube-dns"}}}],
    "ports": [{"protocol": "UDP", "port": 53}, {"protocol": "TCP", "port": 53}],
}


def kube_egress(entries: tuple[str, ...] | list[str]) -> tuple[list[dict[str, Any]], list[str]]:
    """The egress rules of a NetworkPolicy for an allowlist, and what of the list they
    cannot hold, entry by entry (names: left unreachable)."""
    rules: list[dict[str, Any]] = []
    lost: list[str] = []
    for raw in entries:
        entry = parse_entry(raw)
        if entry.kind in ("name", "wildcard"):
            lost.append(f"{raw}: a name (a network policy holds addresses only; not reachable)")
            continue
        if entry.kind == "any":
            blocks = public_blocks()
            if DNS not in rules:
                rules.append(DNS)
        else:
            blocks = [_block(entry)]
        rules.append({"to": blocks, "ports": _ports(entry)})
    return rules, lost


def public_blocks() -> list[dict[str, Any]]:
    """The public internet as ``ipBlock`` peers, IPv4 and IPv6: every address but the
    private and local spaces (other pods, nodes, services, the cloud's metadata)."""
    return [_public("0.0.0.0/0"), _public("::/0")]


def _block(entry: Entry) -> dict[str, Any]:
    """A network entry as an ``ipBlock``: all of it when it lies in inner space, else
    its public part."""
    network = entry.value
    if entry.inner():
        return {"ipBlock": {"cidr": str(network)}}
    return _public(str(network))


def _public(cidr: str) -> dict[str, Any]:
    """``cidr`` without the private and local spaces inside it."""
    network = ipaddress.ip_network(cidr)
    inside = sorted(
        str(space)
        for space in INNER
        if space.version == network.version
        and space.subnet_of(network)  # type: ignore[arg-type]
        # IPv4-mapped addresses never leave as IPv6 (and the API reads them as IPv4)
        and getattr(space.network_address, "ipv4_mapped", None) is None
    )
    block: dict[str, Any] = {"cidr": cidr}
    if inside:
        block["except"] = inside
    return {"ipBlock": block}


def _ports(entry: Entry) -> list[dict[str, Any]]:
    """The TCP ports an entry opens (every TCP port is said as the protocol alone)."""
    if entry.port == ANY_PORT:
        return [{"protocol": "TCP"}]
    ports = DEFAULT_PORTS if entry.port is None else (entry.port,)
    return [{"protocol": "TCP", "port": port} for port in ports]


def egress_note(entries: list[str]) -> str:
    """What a Kubernetes sandbox's listing says of its allowlist ("" without one)."""
    if not entries:
        return ""
    lost = kube_egress(entries)[1]
    held = "; egress_allow as network-policy addresses"
    return held + (" (not held: " + "; ".join(lost) + ")" if lost else "")
