"""What our containers carry (Docker-only labels) and how one reads as a :class:`SandboxInfo`.

Two sources, kept apart because they cost differently: a listing entry (one engine
call for every container, limits read back from our labels, uptime from the rounded
"Up 5 minutes") and a full inspect (exit reason, exact start and stop times, the
limits the container has now, which a resize changes and labels cannot).
"""

from __future__ import annotations

import re
import time
from collections.abc import Callable
from typing import Any

from ...units import format_size
from ..base import (
    LABEL_AGENT_SOCKETS,
    LABEL_FLAVOR,
    LABEL_IMAGE,
    LABEL_INSTALLATION,
    LABEL_PREFIX,
    LABEL_SCOPE,
    LABEL_SNAPSHOT_OF,
    LABEL_SPEC,
    LABEL_THREAD,
    LABEL_USER,
    LABEL_WORK_FOLDER,
    LABEL_WORKSPACE,
    SandboxError,
    SandboxInfo,
    egress_of,
    epoch_of,
    sandbox_id_of,
    volumes_of,
)
from .cgroups import cgroup_usage
from .errors import engine_errors

BACKEND = "docker"
# Labels only the Docker backend writes (beside base.py's): the limits a container was
# made with, how it runs, and what of the host it holds.
LABEL_RUNTIME = LABEL_PREFIX + "runtime"
LABEL_CPUS = LABEL_PREFIX + "cpus"
LABEL_MEMORY = LABEL_PREFIX + "memory"
LABEL_PIDS = LABEL_PREFIX + "pids"
LABEL_UID = LABEL_PREFIX + "uid"  # "uid:gid" the sandbox runs as
LABEL_OWNERSHIP = LABEL_PREFIX + "ownership"  # same-user | idmap | chown (see docker_mounts)
LABEL_MOUNT = LABEL_PREFIX + "workspace-mount"  # the idmapped mount given to Docker, if any
LABEL_WORK_MOUNT = LABEL_PREFIX + "work-mount"  # the same for the work folder
# "device:inode" of the folder each idmapped mount showed when made: a remount (after a
# reboot) must show the same folder, not whatever a path leads to by then.
LABEL_MOUNT_ID = LABEL_PREFIX + "workspace-mount-id"
LABEL_WORK_MOUNT_ID = LABEL_PREFIX + "work-mount-id"
# The idmapped mounts of writable mapped folders: a JSON list of [folder, mount, identity].
LABEL_VOLUME_MOUNTS = LABEL_PREFIX + "volume-mounts"
# How the container trusts the host's CA bundle (see trust.py): "mount", "copy" or "".
LABEL_TRUST = LABEL_PREFIX + "trust"
LABEL_SNAPSHOT_REF = LABEL_PREFIX + "snapshot-ref"  # on snapshots and the sandboxes made from them
# How the sandbox's own files were bounded when it was made, and to what size
# ("image:10737418240", "storage-opt:...", "" for not at all): see docker/disk.py.
LABEL_DISK = LABEL_PREFIX + "disk"
LABEL_WORKSPACE_DISK = LABEL_PREFIX + "workspace-disk"  # "1": its workspace had its disk

# Docker's container states, as the rest of sandbox-kernel names them.
STATES = {
    "running": "running",
    "created": "creating",
    "restarting": "creating",
    "paused": "stopped",
    "exited": "stopped",
    "dead": "error",
    "removing": "error",
}


class Inspected:
    """A container as one inspect saw it: the part of the SDK's model that reads
    (``attrs``, ``id``, ``name``, ``labels``, ``status``), without the SDK behind it,
    so looking a sandbox up and starting a process in it never loads the SDK."""

    def __init__(self, attrs: dict[str, Any]) -> None:
        self.attrs = attrs

    @property
    def id(self) -> str:
        return str(self.attrs.get("Id", ""))

    @property
    def name(self) -> str:
        return str(self.attrs.get("Name", "")).lstrip("/")

    @property
    def labels(self) -> dict[str, str]:
        return dict((self.attrs.get("Config") or {}).get("Labels") or {})

    @property
    def status(self) -> str:
        state = self.attrs.get("State")
        return str(state.get("Status", "") if isinstance(state, dict) else state or "")


def container_info(installation: str, container: Any) -> SandboxInfo:
    """Everything about one container, from a full inspect (``container.attrs``)."""
    attrs = container.attrs
    state = attrs.get("State", {})
    host = attrs.get("HostConfig", {})
    info = summary_info(
        installation,
        {
            "Names": ["/" + container.name],
            "Id": container.id,
            "State": state.get("Status", ""),
            "Labels": container.labels,
            "Image": attrs.get("Config", {}).get("Image", ""),
            "Created": epoch_of(attrs.get("Created", "")),
            "HostConfig": {"NetworkMode": host.get("NetworkMode", "")},
        },
    )
    info.limits = {
        "cpus": (host.get("NanoCpus") or 0) / 1e9,
        "memory": host.get("Memory") or 0,
        "pids": host.get("PidsLimit") or 0,
        "network": host.get("NetworkMode") != "none" or bool(egress_of(container.labels)),
    }
    if egress_of(container.labels):
        info.limits["egress_allow"] = egress_of(container.labels)
    info.exit_reason = _exit_reason(state, host)
    if state.get("Status") != "running":
        info.finished = epoch_of(state.get("FinishedAt", ""))
    else:
        info.started = epoch_of(state.get("StartedAt", ""))
    return info


def summary_info(installation: str, summary: dict[str, Any]) -> SandboxInfo:
    """A listing entry: built from one list call, with limits read from our labels."""
    labels = summary.get("Labels") or {}
    runtime = labels.get(LABEL_RUNTIME, "")
    return SandboxInfo(
        id=sandbox_id_of(installation, (summary.get("Names") or ["/?"])[0].lstrip("/")),
        backend=BACKEND,
        scope=labels.get(LABEL_SCOPE, "user"),
        user=labels.get(LABEL_USER, ""),
        thread=labels.get(LABEL_THREAD, ""),
        state=STATES.get(summary.get("State", ""), "error"),
        image=labels.get(LABEL_IMAGE) or summary.get("Image", ""),
        created=float(summary.get("Created") or 0),
        engine_id=summary.get("Id", ""),
        flavor=labels.get(LABEL_FLAVOR, ""),
        isolation=(
            "container (non-root, no capabilities, seccomp, pids/memory/CPU limits"
            + (f", runtime {runtime})" if runtime else ")")
        ),
        workspace=labels.get(LABEL_WORKSPACE, ""),
        limits={
            "cpus": float(labels.get(LABEL_CPUS) or 0),
            "memory": int(labels.get(LABEL_MEMORY) or 0),
            "pids": int(labels.get(LABEL_PIDS) or 0),
            "network": (summary.get("HostConfig") or {}).get("NetworkMode") != "none"
            or bool(egress_of(labels)),
            **({"egress_allow": egress_of(labels)} if egress_of(labels) else {}),
        },
        snapshot=labels.get(LABEL_SNAPSHOT_OF, ""),
        spec=labels.get(LABEL_SPEC, ""),
        installation=labels.get(LABEL_INSTALLATION, ""),
        started=_started_from_status(summary.get("Status", ""))
        if summary.get("State") == "running"
        else 0.0,
        file_owner=labels.get(LABEL_UID, "") if labels.get(LABEL_OWNERSHIP) == "chown" else "",
        work_folder=labels.get(LABEL_WORK_FOLDER, ""),
        agent_sockets=labels.get(LABEL_AGENT_SOCKETS, ""),
        volumes=[v.to_dict() for v in volumes_of(labels)],
    )


def _exit_reason(state: dict[str, Any], host: dict[str, Any]) -> str:
    """Why a container is not running, in the words a user needs (the limit it hit)."""
    if state.get("OOMKilled"):
        return f"out of memory (limit {format_size(host.get('Memory') or 0)})"
    if state.get("Status") == "exited":
        return f"exited with code {state.get('ExitCode')}"
    return ""


_UNITS = {
    "second": 1,
    "minute": 60,
    "hour": 3600,
    "day": 86400,
    "week": 7 * 86400,
    "month": 30 * 86400,
    "year": 365 * 86400,
}


def _started_from_status(status: str) -> float:
    """When a listed container started, from the list call's "Up 5 minutes" (the engine's
    rounding, at most a unit off): listings stay one engine call; a full inspect is exact."""
    match = re.match(r"Up (Less than a second|About an? (\w+)|(\d+) (\w+?)s?)(?: \(|$)", status)
    if not match:
        return 0.0
    if match.group(1) == "Less than a second":
        seconds = 0.0
    elif match.group(2):
        seconds = _UNITS.get(match.group(2), 0)
    else:
        seconds = int(match.group(3)) * _UNITS.get(match.group(4), 0)
    return time.time() - seconds


def stats_usage(raw: dict[str, Any]) -> dict[str, float]:
    """Memory in use (less the cache it could give back) and processes, from the engine's
    one-shot stats of a container (where its cgroup files are not on this host)."""
    mem = raw.get("memory_stats") or {}
    stats = mem.get("stats") or {}
    cache = stats.get("total_inactive_file", 0) or stats.get("cache", 0)
    return {
        "memory": max(0, (mem.get("usage") or 0) - cache),
        "pids": (raw.get("pids_stats") or {}).get("current", 0),
    }


def memory_usage(
    infos: list[SandboxInfo], client: Callable[[], Any]
) -> dict[str, dict[str, float]]:
    """Memory in use per running sandbox of ``infos``.

    Read from the engine host's cgroup files when they are here (no engine round trip,
    so listing 100 sandboxes stays fast); else one one-shot stats call each through
    ``client()`` (the SDK's)."""
    found: dict[str, dict[str, float]] = {}
    for info in infos:
        local = cgroup_usage(info.engine_id)
        if local is not None:
            found[info.id] = local
            continue
        try:
            with engine_errors("read the memory use of", info.id):
                raw = client().api.stats(info.engine_id, stream=False, one_shot=True)
        except SandboxError:
            continue  # it stopped meanwhile: no figure rather than an error
        found[info.id] = stats_usage(raw)
    return found
