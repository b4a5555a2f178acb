"""Egress allowlists on Docker: sandboxes that reach only the listed destinations.

A sandbox with an allowlist (``egress_allow``) gets no network at all: only its own
loopback. Raw addresses, other ports, DNS to any server, IPv6, UDP and a cell that
unsets or changes the proxy variables all meet the same wall, at once (no route, so
no waiting on a timeout). Its one way out is a Unix socket of the **egress proxy**,
mounted read-only from a volume: the sandbox's main process (``agent.egress_forward``)
carries what its programs send to ``http://127.0.0.1:3128`` (``HTTPS_PROXY`` and
``HTTP_PROXY``, so pip, git and curl need no setting) to that socket.

The proxy (``agent.egress_proxy``, stdlib only) is a container of ours, one per
allowlist and installation, found by name and label like sandboxes; it lives as long as
the engine (restarted with it) and needs no host process. It sits on our shared
network (link-local addresses dropped there, other sandboxes out of reach), checks
every CONNECT host and port, the TLS name that follows and every plain HTTP request's
host against its list, resolves names itself and connects only to addresses the list
allows, never into the sandboxes' network. It runs as uid 0 without any capability,
read-only, with memory and process limits; one proxy per list means a sandbox can only
ever reach its own list's proxy (the volume holds that proxy's socket alone).
"""

from __future__ import annotations

import json
import logging
from collections.abc import Callable
from typing import Any

from ...agent import inline, program
from ..base import (
    LABEL_EGRESS,
    LABEL_PREFIX,
    Conflict,
    EgressCount,
    SandboxError,
    SandboxFailed,
    SandboxNotFound,
    egress_label,
    egress_of,
)
from ..egress import PORT, PROXY_ENV, digest
from .env import path_of
from .errors import engine_errors
from .network import NETWORK, shared_network
from .security import seccomp_profile
from .wire import EngineCalls

log = logging.getLogger("sandbox_kernel")

LABEL_PROXY = LABEL_PREFIX + "egress-proxy"  # on a proxy: the installation it serves
LABEL_LIST = LABEL_PREFIX + "egress-list"  # on a proxy: its allowlist's digest
LABEL_EGRESS_IMAGE = LABEL_PREFIX + "egress-image"  # on a sandbox: its proxy's image
SOCKET_DIR = "/run/sandbox-kernel/egress"
SOCKET = SOCKET_DIR + "/proxy.sock"
COUNTS = "/run/egress-state/counts.json"
PROXY_MEMORY = 256 << 20
PROXY_PIDS = 1100  # a thread per connection, up to the proxy's 512, and room


def proxy_name(installation: str, entries: tuple[str, ...] | list[str]) -> str:
    """The proxy container's name, which is also its volume's: never a sandbox id's shape."""
    return f"sandbox-kernel-egress-{digest(entries)}--i{installation[:8]}"


def sandbox_config(config: dict[str, Any], installation: str, entries: tuple[str, ...]) -> None:
    """Make a sandbox's create request (``config``) one with an allowlist: no network,
    the proxy's socket mounted read-only, the forwarder as its main process, and the
    proxy variables in its environment."""
    host = config["HostConfig"]
    host["NetworkMode"] = "none"
    host["Mounts"].append(
        {
            "Type": "volume",
            "Source": proxy_name(installation, entries),
            "Target": SOCKET_DIR,
            "ReadOnly": True,
            "VolumeOptions": {"NoCopy": True},
        }
    )
    config["Cmd"] = program("egress_forward", str(PORT), SOCKET)
    config["Env"] += [f"{k}={v}" for k, v in PROXY_ENV.items()]


class EgressProxies:
    """The egress proxies of one installation on one engine."""

    def __init__(
        self, installation: str, engine: Callable[[], EngineCalls], client: Callable[[], Any]
    ) -> None:
        self.installation = installation
        self._engine = engine
        self._client = client

    def for_sandbox(
        self, entries: tuple[str, ...], labels: dict[str, str], image: Any
    ) -> dict[str, str]:
        """Ensure the proxy of a sandbox about to be made, from ``image`` (an image's
        model, never a user's snapshot: the proxy would keep it from being deleted); the
        sandbox's labels with the proxy's image, for its later starts."""
        self.ensure(entries, image.id, path_of(image.attrs))
        return {**labels, LABEL_EGRESS_IMAGE: image.id}

    def again(self, labels: dict[str, str], path: str) -> None:
        """Ensure the proxy of a sandbox about to start again (labelled ``labels``)."""
        entries = egress_of(labels)
        if entries:
            self.ensure(tuple(entries), labels.get(LABEL_EGRESS_IMAGE, ""), path)

    def ensure(self, entries: tuple[str, ...], image: str, path: str) -> None:
        """The proxy for ``entries`` running, made from ``image`` (any image of ours
        has python3; ``path`` is its PATH) when there is none."""
        name = proxy_name(self.installation, entries)
        try:
            with engine_errors("look up the egress proxy", refused=SandboxFailed):
                found = self._engine().inspect_container(name)
        except SandboxNotFound:
            found = self._create(name, entries, image, path)
        labels = (found.get("Config") or {}).get("Labels") or {}
        if labels.get(LABEL_PROXY) != self.installation:
            raise SandboxFailed(
                f"a container named {name} exists but is not this installation's egress "
                "proxy; remove or rename it (we never touch containers that are not ours)"
            )
        if not (found.get("State") or {}).get("Running"):
            with engine_errors("start the egress proxy", refused=SandboxFailed):
                self._engine().start_container(found["Id"])

    def _create(self, name: str, entries: tuple[str, ...], image: str, path: str) -> dict[str, Any]:
        engine = self._engine()
        shared_network(engine)
        with engine_errors(f"look up the network {NETWORK}", refused=SandboxFailed):
            ipam = engine.inspect_network(NETWORK).get("IPAM") or {}
        never = [c["Subnet"] for c in ipam.get("Config") or [] if c.get("Subnet")]
        settings = {"allow": list(entries), "never": never, "socket": SOCKET, "counts": COUNTS}
        config = {
            "Image": image,
            "Cmd": program("egress_proxy", json.dumps(settings)),
            "Entrypoint": [],
            "User": "0:0",
            "WorkingDir": "/",
            "Hostname": "egress-proxy",
            "Env": [f"PATH={path}", "PYTHONUNBUFFERED=1"],
            "Labels": {
                LABEL_PROXY: self.installation,
                LABEL_LIST: digest(entries),
                LABEL_EGRESS: egress_label(entries),
            },
            "HostConfig": {
                "Init": True,
                "Mounts": [{"Type": "volume", "Source": name, "Target": SOCKET_DIR}],
                "Tmpfs": {"/run/egress-state": "rw,nosuid,nodev,noexec,size=1m"},
                "ReadonlyRootfs": True,
                "CapDrop": ["ALL"],
                "SecurityOpt": ["no-new-privileges", f"seccomp={seccomp_profile()}"],
                "PidsLimit": PROXY_PIDS,
                "Memory": PROXY_MEMORY,
                "MemorySwap": PROXY_MEMORY,
                "NanoCpus": int(1e9),
                "NetworkMode": NETWORK,
                "RestartPolicy": {"Name": "unless-stopped"},
                "LogConfig": {"Type": "json-file", "Config": {"max-size": "1m", "max-file": "2"}},
            },
        }
        try:
            with engine_errors("create the egress proxy", refused=SandboxFailed):
                engine.create_container(name, config)
        except Conflict:
            pass  # another process made it at the same moment
        log.info("made the egress proxy %s for %s", name, ", ".join(entries))
        with engine_errors("look up the egress proxy", refused=SandboxFailed):
            return engine.inspect_container(name)

    def proxies(self) -> list[dict[str, Any]]:
        """The proxies of this installation (the engine's list entries)."""
        with engine_errors("list the egress proxies"):
            return self._engine().list_containers({"label": [f"{LABEL_PROXY}={self.installation}"]})

    def denied(self) -> list[EgressCount]:
        """What each running proxy refused since it started."""
        found = []
        read = inline(
            f"import sys\ntry: sys.stdout.write(open({COUNTS!r}).read())\nexcept OSError: pass"
        )
        for proxy in self.proxies():
            if proxy.get("State") != "running":
                continue
            allowlist = (proxy.get("Labels") or {}).get(LABEL_LIST, "")
            try:
                with engine_errors("read the egress proxy's counts"):
                    api = self._client().api
                    exec_id = api.exec_create(proxy["Id"], read, user="0:0")["Id"]
                    raw = api.exec_start(exec_id)
                counts = json.loads(raw or b"{}").get("denied") or {}
            except (SandboxError, ValueError) as exc:
                log.debug("egress proxy %s: no counts (%s)", proxy.get("Names"), exc)
                continue
            found += [EgressCount(allowlist, str(k), int(v)) for k, v in sorted(counts.items())]
        return found

    def remove_all(self) -> list[str]:
        """Remove this installation's proxies and their volumes; their names."""
        removed = []
        client = self._client()
        for proxy in self.proxies():
            name = (proxy.get("Names") or ["/?"])[0].lstrip("/")
            try:
                with engine_errors("remove the egress proxy"):
                    client.api.remove_container(proxy["Id"], force=True)
                    client.api.remove_volume(name, force=True)
            except SandboxError as exc:
                log.warning("could not remove %s: %s", name, exc)
                continue
            removed.append(name)
        return removed
