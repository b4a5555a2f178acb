"""What the MCP tools about a user's sandboxes as a whole answer: the folders mapped into
them, their resources against the quotas, and (for an administrator) the removal of
orphans. Each function returns the text an agent reads and the structured result;
:mod:`.mcp_server` makes them tools.
"""

from __future__ import annotations

import os
from typing import Any

from .config import SandboxConfig
from .errors import Forbidden
from .lifecycle import gc
from .service import SandboxService
from .units import cpus_words, format_size

Answer = tuple[str, dict[str, Any]]


def volume_mappings(service: SandboxService, owner: str, sandbox_id: str = "") -> Answer:
    """The folders mapped into ``owner``'s sandboxes (or one of them), with their modes;
    and those the settings map now (new sandboxes get them, older ones at their next
    start)."""
    items = (
        [service.get(owner, sandbox_id)] if sandbox_id else service.list(owner)
    )  # (owner rules: another user's id is 403)
    configured = [v.to_dict() for v in service.config.mappings]
    lines = [
        "folders mapped into new sandboxes: "
        + (", ".join(_mapping(v) for v in configured) or "none")
    ]
    for item in items:
        mapped = ", ".join(_mapping(v) for v in item["volumes"]) or "no mapped folders"
        lines.append(f"{item['id']} ({item['state']}): {mapped}")
        if item.get("remake"):
            lines.append(f"  {item['id']} is {item['outdated']}: {item['remake']}")
    writable = [v["target"] for v in configured if v["mode"] == "rw"]
    if writable:
        lines.append(
            f"writable ({', '.join(writable)}): shared by every sandbox they are mapped into; "
            "no links, FIFOs or setuid files can be made there, and only the host's own disk "
            "bounds them"
        )
    structured = {
        "configured": configured,
        "sandboxes": [
            {
                "id": i["id"],
                "state": i["state"],
                "volumes": i["volumes"],
                "outdated": i.get("outdated", ""),
                "remake": i.get("remake", ""),
            }
            for i in items
        ],
    }
    return "\n".join(lines), structured


def _mapping(volume: dict[str, str]) -> str:
    return f"{volume['target']} <- {volume['source']} ({volume['mode']})"


def resource_stats(service: SandboxService, owner: str) -> Answer:
    """``owner``'s sandboxes with their CPU, memory and disk against their limits, their
    totals, and how far this installation's quotas are from full (as ``stats`` says)."""
    items = service.list(owner)
    totals = service.stats(owner)
    mine = {i["id"] for i in items}
    disk = dict(totals["disk"])
    disk["unbounded"] = [i for i in disk["unbounded"] if i in mine]  # only yours are named
    sandboxes = [_usage(i) for i in items]
    running = [s for s in sandboxes if s["state"] == "running"]
    yours = {
        "sandboxes": len(sandboxes),
        "running": len(running),
        "cpus_reserved": sum(s["cpus"] for s in running),
        "memory_reserved": sum(s["memory"] for s in running),
        "memory_used": sum(s["memory_used"] or 0 for s in running),
    }
    quota = totals["quota"]
    lines = [_usage_line(s) for s in sandboxes] or ["no sandboxes yet: execute_code makes yours"]
    lines.append(
        f"yours: {yours['sandboxes']} sandboxes ({yours['running']} running), "
        f"{cpus_words(yours['cpus_reserved'])} and {format_size(yours['memory_reserved'])} of memory "
        f"reserved, {format_size(yours['memory_used'])} used"
    )
    left = quota["sandboxes_left"]
    memory_left = quota["memory_left"]
    lines.append(
        f"quota headroom ({quota['counts']}): "
        + (
            f"{left} more sandboxes of {quota['max_sandboxes']}"
            if left is not None
            else "no limit on sandboxes"
        )
        + "; "
        + (
            f"{format_size(memory_left)} of memory left of {format_size(quota['max_total_memory'])}"
            if memory_left is not None
            else "no limit on memory"
        )
    )
    if disk["note"]:
        lines.append(f"disk not bounded for new sandboxes: {disk['note']}")
    structured = {
        "sandboxes": sandboxes,
        "yours": yours,
        "installation": {
            "backend": totals["backend"],
            "sandboxes": totals["sandboxes"],
            "by_state": totals["by_state"],
            "memory": totals["memory"],
            "cpus": totals["cpus"],
            "disk": disk,
        },
        "quota": quota,
    }
    return "\n".join(lines), structured


def _usage(item: dict[str, Any]) -> dict[str, Any]:
    limits, usage = item.get("limits") or {}, item.get("usage") or {}
    return {
        "id": item["id"],
        "state": item["state"],
        "flavor": item["flavor"],
        "cpus": float(limits.get("cpus") or 0),
        "cpu": usage.get("cpu"),
        "memory": int(limits.get("memory") or 0),
        "memory_used": usage.get("memory"),
        "disk": int(limits.get("disk") or 0),
        "disk_used": usage.get("disk"),
        "workspace_disk": int(limits.get("workspace_disk") or 0),
        "workspace_disk_used": usage.get("workspace_disk"),
        "disk_note": item.get("disk_note", ""),
    }


def _usage_line(s: dict[str, Any]) -> str:
    def of(used: Any, limit: int) -> str:
        shown = "?" if used is None else format_size(used)
        return f"{shown} of {format_size(limit)}" if limit else f"{shown} (not bounded)"

    parts = [f"{s['id']}: {s['state']}, flavor {s['flavor']} ({cpus_words(s['cpus'])})"]
    if s["state"] == "running":
        if s["cpu"] is not None:
            parts.append(f"CPU {s['cpu'] * 100:.0f}%")
        parts.append(f"memory {of(s['memory_used'], s['memory'])}")
    if s["disk"] or s["disk_used"] is not None:
        parts.append(f"own files {of(s['disk_used'], s['disk'])}")
    if s["workspace_disk"] or s["workspace_disk_used"] is not None:
        parts.append(f"workspace {of(s['workspace_disk_used'], s['workspace_disk'])}")
    return ", ".join(parts)


NOT_YOURS = (
    "cleanup_orphan_sandboxes is for the administrators of this installation, and it is "
    "not yours to run: the reaper removes orphans by itself after orphan_grace minutes "
    "(an administrator names who may run it in c.SandboxExtension.admin_users)"
)


def cleanup_orphans(service: SandboxService, admin: bool, dry_run: bool) -> Answer:
    """Remove (``dry_run``: list) this installation's orphans whose grace is over: our
    sandboxes that no one owns any more (no owner record, an older sandbox of an id that
    has a newer one, one left half-made). Only for an administrator (``admin``);
    workspaces are kept."""
    if not admin:
        raise Forbidden(NOT_YOURS)
    actions = gc(service.backend, service.config, dry_run=dry_run, orphans_only=True)
    verb = "would remove" if dry_run else "removed"
    lines = [
        f"{a.sandbox_id}: "
        + (verb if dry_run or a.done else "could not remove")
        + f" ({a.reason}){': ' + a.error if a.error else ''}"
        for a in actions
    ]
    lines = lines or [
        f"no orphans to remove now (those younger than orphan_grace="
        f"{service.config.orphan_grace:g} min wait, as they may be being made)"
    ]
    return "\n".join(lines), {
        "dry_run": dry_run,
        "orphans": [a.to_dict() for a in actions],
    }


def owns_state_folder(config: SandboxConfig) -> bool:
    """Whether this process's user administers the installation of ``config``: root, or
    the owner of its state folder (who can run `sandbox-kernel gc` on it anyway)."""
    if os.geteuid() == 0:
        return True
    try:
        return os.stat(config.state_dir).st_uid == os.geteuid()
    except OSError:
        return False
