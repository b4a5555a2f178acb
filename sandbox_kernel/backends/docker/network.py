"""What a Docker sandbox may reach on the network, and what reaches it.

Every sandbox with the network on joins one bridge network of ours on which containers
cannot reach each other (inter-container communication off), so one user's code cannot
talk to another user's sandbox, and link-local addresses (cloud metadata services,
169.254.0.0/16) are dropped by a firewall rule when this process may add one. Per-user
bridges would run out of Docker's address pools near 30 users; one shared bridge with
ICC off scales to the size of its subnet.

The host, and only the host, reaches a sandbox's ports at the container's own address
on that network (:func:`port_target_of`, for preview URLs): no port is ever published.
"""

from __future__ import annotations

import logging
import os
import shutil
import subprocess
from typing import Any

from ..base import LABEL_MANAGED, Conflict, PortTarget, SandboxFailed, SandboxNotFound
from .errors import engine_errors
from .wire import EngineCalls

log = logging.getLogger("sandbox_kernel")

NETWORK = "sandbox-kernel"
BRIDGE = "sk-br0"
LINK_LOCAL = "169.254.0.0/16"


def shared_network(engine: EngineCalls) -> str:
    """The name of our shared network, made on first use; one of that name that we did
    not make is refused (its containers could reach each other)."""
    try:
        with engine_errors(f"look up the network {NETWORK}", refused=SandboxFailed):
            network = engine.inspect_network(NETWORK)
    except SandboxNotFound:
        network = _create_network(engine)
    if (network.get("Labels") or {}).get(LABEL_MANAGED) != "1":
        raise SandboxFailed(
            f"a Docker network named {NETWORK} exists but was not made by sandbox-kernel; "
            "remove or rename it (its sandboxes could reach each other)"
        )
    if os.geteuid() == 0:
        problem = block_link_local()
        if problem:
            log.warning("sandboxes may reach link-local addresses (cloud metadata): %s", problem)
    return NETWORK


def _create_network(engine: EngineCalls) -> dict[str, Any]:
    """Make the shared network; another process making it at the same moment is fine."""
    try:
        with engine_errors(f"create the network {NETWORK}", refused=SandboxFailed):
            engine.create_network({"Name": NETWORK, "CheckDuplicate": True, **network_options()})
    except Conflict:
        pass
    with engine_errors(f"look up the network {NETWORK}", refused=SandboxFailed):
        return engine.inspect_network(NETWORK)


def network_options() -> dict[str, Any]:
    """How our shared network is made (the engine's create request): a bridge on which
    containers cannot reach each other."""
    return {
        "Driver": "bridge",
        "Options": {
            "com.docker.network.bridge.enable_icc": "false",
            "com.docker.network.bridge.name": BRIDGE,
        },
        "Labels": {LABEL_MANAGED: "1"},
    }


def block_link_local() -> str:
    """Drop traffic from our bridge to link-local addresses (cloud metadata); '' when done.

    The rule goes in DOCKER-USER (traffic routed through the host) and INPUT (addresses
    the host itself holds). It needs root and iptables; otherwise the reason is returned
    so the caller can log it once and the README's manual rule applies.
    """
    iptables = shutil.which("iptables")
    if iptables is None:
        return "iptables is not installed"
    failures = []
    for chain in ("DOCKER-USER", "INPUT"):
        rule = [chain, "-i", BRIDGE, "-d", LINK_LOCAL, "-j", "DROP"]
        try:
            present = subprocess.run([iptables, "-w", "-C", *rule], capture_output=True, timeout=10)
            if present.returncode == 0:
                continue
            added = subprocess.run([iptables, "-w", "-I", *rule], capture_output=True, timeout=10)
        except (OSError, subprocess.TimeoutExpired) as exc:
            failures.append(f"{chain}: {exc}")
            continue
        if added.returncode != 0:
            failures.append(f"{chain}: {added.stderr.decode(errors='replace').strip()[:200]}")
    return "; ".join(failures)


def port_target_of(sandbox_id: str, attrs: dict[str, Any], port: int) -> PortTarget:
    """Where the host reaches ``port`` of the running container whose inspect is
    ``attrs``: its own address on our network (other sandboxes cannot reach it there:
    the bridge has inter-container traffic off). A container made with the network off
    has no such address, and nothing outside it reaches its ports."""
    networks = (attrs.get("NetworkSettings") or {}).get("Networks") or {}
    address = (networks.get(NETWORK) or {}).get("IPAddress") or ""
    if not address:
        raise Conflict(
            f"sandbox {sandbox_id} has no network of its own (network off, or an egress "
            "allowlist: it reaches out only through its proxy), so nothing outside it "
            "reaches its ports"
        )
    return PortTarget(f"http://{address}:{port}")
