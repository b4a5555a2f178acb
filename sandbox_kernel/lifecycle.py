"""Idle stop, idle delete, orphan reaping, quotas and stats, for any backend.

Nothing here keeps state in memory: sandboxes come from the engine (one list call),
activity and live kernels from the SQLite store, so the reaper can run from the
server extension, from ``sandbox-kernel gc`` in cron or CI, and at kernel start, even
several at once: every action is idempotent (stopping a stopped sandbox, destroying
a gone one) and a sandbox that vanished mid-run is skipped.

Activity is a running cell (kernels beat while busy), a cell's start, and any file or
REST use; a long silent cell is activity even with no browser attached.
"""

from __future__ import annotations

import time
from dataclasses import asdict, dataclass
from typing import Any

from .backends.base import (
    Backend,
    QuotaExceeded,
    SandboxInfo,
    SandboxNotFound,
    installation_id,
)
from .config import SandboxConfig
from .store import Store

MINUTE = 60.0


@dataclass
class Action:
    """One thing the reaper did, or would do with ``dry_run``."""

    sandbox_id: str
    action: str  # "stop" | "destroy"
    reason: str
    done: bool = False
    error: str = ""
    engine_id: str = ""  # the incarnation judged; never acted on if the id now names another

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


def _minutes(value: float) -> float:
    return value * MINUTE


def plan(
    infos: list[SandboxInfo],
    config: SandboxConfig,
    store: Store,
    backend_name: str,
    now: float | None = None,
) -> list[Action]:
    """Decide what to stop or destroy; pure apart from reading the store."""
    now = time.time() if now is None else now
    records = {r.id: r for r in store.all(backend_name)}
    kernels = store.live_kernels(backend_name)
    actions: list[Action] = []
    for info in infos:
        record = records.get(info.id)
        live = kernels.get(info.id, [])
        busy = any(b for _, b in live)
        last = max(record.last_activity if record else 0.0, info.created)
        age = now - info.created
        grace = _minutes(config.orphan_grace)
        if info.state == "creating" and age > grace:
            actions.append(Action(info.id, "destroy", f"left half-created for {age / MINUTE:.0f} min", engine_id=info.engine_id))
        elif record is None:
            # No owner record: either an orphan, or one being made right now (between the
            # engine's create and the record, or a slow remote create): grace decides.
            if not live and age > grace:
                actions.append(Action(info.id, "destroy", "orphan: no owner record", engine_id=info.engine_id))
        elif record.engine_id and info.engine_id and record.engine_id != info.engine_id and not live and age > grace:
            actions.append(Action(info.id, "destroy", "orphan: its record points at a newer sandbox of the same id", engine_id=info.engine_id))
        elif record.spec and info.spec and info.spec != record.spec and not live and age > grace:
            actions.append(Action(info.id, "destroy", "orphan: made with an older configuration (image, flavor or mounts)", engine_id=info.engine_id))
        elif config.max_age and age > _minutes(config.max_age) and not busy:
            actions.append(Action(info.id, "destroy", f"older than max_age={config.max_age:g} min", engine_id=info.engine_id))
        elif info.state == "running":
            idle = now - last
            if not live and config.idle_stop and idle > _minutes(config.idle_stop):
                actions.append(Action(info.id, "stop", f"idle {idle / MINUTE:.1f} min with no live kernel", engine_id=info.engine_id))
            elif live and not busy and config.idle_stop_with_kernel and idle > _minutes(config.idle_stop_with_kernel):
                actions.append(Action(info.id, "stop", f"idle {idle / MINUTE:.1f} min with an idle kernel", engine_id=info.engine_id))
        elif info.state == "stopped" and config.idle_delete:
            stopped_for = now - max(info.finished, last)
            if stopped_for > _minutes(config.idle_delete):
                actions.append(Action(info.id, "destroy", f"stopped for {stopped_for / MINUTE:.1f} min", engine_id=info.engine_id))
    return actions


def gc(backend: Backend, config: SandboxConfig, dry_run: bool = False) -> list[Action]:
    """Apply the lifecycle policies to every sandbox of ours on this backend."""
    store = Store(config)
    mine = installation_id(config)
    infos = []
    for info in backend.list():
        if info.installation != mine:
            continue
        if info.state == "stopped":  # listings are summaries: ask when it stopped
            try:
                info = backend.get(info.id)
            except SandboxNotFound:
                continue
        infos.append(info)
    actions = plan(infos, config, store, backend.name)
    if dry_run:
        return actions
    try:
        backend.sweep()
    except Exception:  # leftovers wait for the next run
        pass
    for action in actions:
        try:
            _apply(backend, store, action)
        except SandboxNotFound:
            action.done = True  # another reaper (or the user) got there first
        except Exception as exc:  # one sandbox's trouble must not stop the run
            action.error = str(exc) or type(exc).__name__
    return actions


def _apply(backend: Backend, store: Store, action: Action) -> None:
    """Do one action, to the very sandbox that was judged (its engine id), or to none."""
    current = backend.get(action.sandbox_id)
    same = not action.engine_id or current.engine_id == action.engine_id
    if action.action == "stop":
        if same:
            backend.stop(action.sandbox_id)
        action.done = same
        return
    if same:
        backend.destroy(action.sandbox_id)
        store.delete(backend.name, action.sandbox_id)
        action.done = True
    elif backend.finds_engine_ids:
        # The id names a newer sandbox now (this one is an older incarnation): remove
        # the old one by its engine id and leave the id's record alone.
        action.done = backend.destroy(action.engine_id)
    else:
        action.error = "it changed while the reaper ran; left for the next run"


def check_quota(backend: Backend, config: SandboxConfig, new_memory: int) -> None:
    """Refuse a new sandbox that would pass max_sandboxes or max_total_memory."""
    limit_count = config.max_sandboxes
    limit_memory = config.max_total_memory_bytes
    if not limit_count and not limit_memory:
        return
    infos = backend.list()
    names = ", ".join(i.id for i in infos[:5]) + (" ..." if len(infos) > 5 else "")
    if limit_count and len(infos) >= limit_count:
        raise QuotaExceeded(
            f"quota max_sandboxes={limit_count} reached ({len(infos)} sandboxes: {names}); "
            "destroy one with `sandbox-kernel destroy ID` or raise SANDBOX_KERNEL_MAX_SANDBOXES"
        )
    reserved = sum(int(i.limits.get("memory") or 0) for i in infos if i.state != "stopped")
    if limit_memory and reserved + new_memory > limit_memory:
        raise QuotaExceeded(
            f"quota max_total_memory={config.max_total_memory} reached ({_gib(reserved)} reserved by "
            f"running sandboxes {names}, {_gib(new_memory)} more asked); stop or destroy one "
            "(`sandbox-kernel stop ID`) or pick a smaller flavor"
        )


def _gib(n: float) -> str:
    return f"{n / 2**30:.1f} GiB"


def stats(backend: Backend, config: SandboxConfig) -> dict[str, Any]:
    """Totals for the REST API and `sandbox-kernel stats`: one list call, plus usage."""
    infos = backend.list()
    by_state: dict[str, int] = {}
    by_flavor: dict[str, int] = {}
    reserved_memory = reserved_cpus = used_memory = 0.0
    for info in infos:
        by_state[info.state] = by_state.get(info.state, 0) + 1
        by_flavor[info.flavor or "?"] = by_flavor.get(info.flavor or "?", 0) + 1
        if info.state == "running":
            reserved_memory += float(info.limits.get("memory") or 0)
            reserved_cpus += float(info.limits.get("cpus") or 0)
    usage = backend.usage([i for i in infos if i.state == "running"])
    used_memory = sum(u.get("memory", 0) for u in usage.values())
    limit_memory = config.max_total_memory_bytes
    return {
        "backend": backend.name,
        "sandboxes": len(infos),
        "by_state": by_state,
        "by_flavor": by_flavor,
        "memory": {"reserved": int(reserved_memory), "used": int(used_memory)},
        "cpus": {"reserved": reserved_cpus},
        "quota": {
            "max_sandboxes": config.max_sandboxes,
            "sandboxes_left": max(0, config.max_sandboxes - len(infos)) if config.max_sandboxes else None,
            "max_total_memory": limit_memory,
            "memory_left": max(0, int(limit_memory - reserved_memory)) if limit_memory else None,
        },
    }
