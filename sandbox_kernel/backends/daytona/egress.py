"""Egress allowlists on Daytona: its own ``domain_allow_list`` and ``network_allow_list``
take what of ``egress_allow`` they can say; the rest is named in the sandbox's listing."""

from __future__ import annotations

from typing import Any

from ...agent.egress_rules import parse_entry


def daytona_egress(entries: tuple[str, ...]) -> tuple[dict[str, Any], list[str]]:
    """Daytona's own network settings for an egress allowlist (``domain_allow_list``,
    ``network_allow_list``, or ``network_block_all`` when nothing of it can be said
    there), and what of the list they cannot hold, entry by entry."""
    if not entries:
        return {}, []
    domains, networks, lost = [], [], []
    for raw in entries:
        entry = parse_entry(raw)
        if entry.port is not None:
            lost.append(f"{raw}: no port rules (Daytona's ports apply)")
        if entry.kind == "any":
            return {}, [f"{raw}: any name: the network is left as Daytona gives it"]
        if entry.kind == "network":
            if entry.value.version == 6:
                lost.append(f"{raw}: Daytona takes IPv4 networks only (not allowed)")
                continue
            networks.append(str(entry.value))
        else:
            domains.append(("*" + entry.value) if entry.kind == "wildcard" else entry.value)
    if not domains and not networks:
        return {"network_block_all": True}, lost
    settings: dict[str, Any] = {}
    if domains:
        settings["domain_allow_list"] = ",".join(domains)
    if networks:
        settings["network_allow_list"] = ",".join(networks)
    return settings, lost


def egress_note(entries: list[str]) -> str:
    """What a Daytona sandbox's listing says of its allowlist ("" without one)."""
    if not entries:
        return ""
    lost = daytona_egress(tuple(entries))[1]
    held = "; egress_allow through Daytona's own allowlists (names, IPv4 networks"
    return held + (": not held: " + "; ".join(lost) + ")" if lost else ")")
