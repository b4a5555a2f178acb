"""Idle stop, idle delete, orphan reaping, quotas and stats, for any backend.

Nothing here keeps state in memory: sandboxes come from the engine (one list call),
activity and live kernels from the SQLite store, so the reaper can run from the
server extension, from ``sandbox-kernel gc`` in cron or CI, and at kernel start, even
several at once: every action is idempotent (stopping a stopped sandbox, destroying
a gone one), acts only on the incarnation that was judged, and a sandbox that
vanished mid-run is skipped.

One function, :func:`decide`, says what will happen to a sandbox and when; the reaper
does what is due, and listings show what is coming ("stops in 12 min"), so nothing is
removed without having been announced.

Activity is a running cell (kernels beat while busy), a cell's start, and REST use of
the sandbox itself (start, exec); a long silent cell is activity even with no browser
attached. File use is not a code sandbox's activity: host workspaces are read
directly, and a remote one through its owner's files sandbox, which has rules of its
own here (stopped after ``files_idle_stop`` without file use, removed after
``idle_delete`` stopped; never counted in quotas).
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import asdict, dataclass
from typing import Any

from . import events
from .backends.base import Backend, SandboxInfo, is_files_sandbox
from .config import SandboxConfig, setting_names
from .errors import QuotaExceeded, SandboxNotFound
from .store import AGENT, EVENTS_DAYS, LiveSession, Record, Reservation, Store
from .units import format_size

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


@dataclass
class Decision:
    """What the lifecycle policies will do to one sandbox, and when (epoch seconds)."""

    action: str = ""  # "" (nothing planned) | "stop" | "destroy"
    at: float = 0.0
    reason: str = ""

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


def _minutes(value: float) -> float:
    return value * MINUTE


def decide(
    info: SandboxInfo, record: Record | None, live: list[tuple[str, bool]], config: SandboxConfig
) -> Decision:
    """The next lifecycle action for ``info`` and when it falls due (pure)."""
    if is_files_sandbox(info.id):
        return _decide_files(info, record, config)
    busy = any(b for _, b in live)
    grace = _minutes(config.orphan_grace)
    if info.state == "creating":
        return Decision("destroy", info.created + grace, "left half-created")
    if record is None:
        # No owner record: an orphan, or one being made right now (between the engine's
        # create and the record, or a slow remote create): the grace period decides.
        return (
            Decision()
            if live
            else Decision("destroy", info.created + grace, "orphan: no owner record")
        )
    if record.engine_id and info.engine_id and record.engine_id != info.engine_id and not live:
        return Decision("destroy", info.created + grace, "orphan: an older sandbox of the same id")
    last = max(record.last_activity, info.created)
    options: list[Decision] = []
    if config.max_age and not busy:
        options.append(
            Decision(
                "destroy",
                info.created + _minutes(config.max_age),
                f"older than max_age={config.max_age:g} min",
            )
        )
    if info.state == "running":
        if not live and config.idle_stop:
            options.append(
                Decision(
                    "stop",
                    last + _minutes(config.idle_stop),
                    f"idle {config.idle_stop:g} min with no live kernel",
                )
            )
        elif live and not busy and config.idle_stop_with_kernel:
            options.append(
                Decision(
                    "stop",
                    last + _minutes(config.idle_stop_with_kernel),
                    f"idle {config.idle_stop_with_kernel:g} min with an idle kernel",
                )
            )
    elif info.state == "stopped" and config.idle_delete:
        stopped = max(info.finished, last)
        options.append(
            Decision(
                "destroy",
                stopped + _minutes(config.idle_delete),
                f"stopped for {config.idle_delete:g} min",
            )
        )
    return min(options, key=lambda d: d.at) if options else Decision()


def _decide_files(info: SandboxInfo, record: Record | None, config: SandboxConfig) -> Decision:
    """A files sandbox's rule. It holds nothing of its own (the workspace is the user's
    volume, and the next file use makes a new one in seconds), no kernel ever uses it
    and its record only says when its files were last used: stopped after
    ``files_idle_stop`` without file use, removed after ``idle_delete`` stopped, and
    removed when it failed or was left half-made."""
    if info.state == "creating":
        return Decision(
            "destroy", info.created + _minutes(config.orphan_grace), "files sandbox left half-made"
        )
    if info.state == "error":
        return Decision("destroy", info.created, "files sandbox failed; file use makes a new one")
    last = max(record.last_activity if record else 0.0, info.created, info.started)
    if info.state == "running" and config.files_idle_stop:
        return Decision(
            "stop",
            last + _minutes(config.files_idle_stop),
            f"files sandbox without file use for {config.files_idle_stop:g} min",
        )
    if info.state == "stopped" and config.idle_delete:
        return Decision(
            "destroy",
            max(info.finished, last) + _minutes(config.idle_delete),
            f"files sandbox stopped for {config.idle_delete:g} min",
        )
    return Decision()


def plan(
    infos: list[SandboxInfo],
    config: SandboxConfig,
    store: Store,
    backend_name: str,
    now: float | None = None,
) -> list[Action]:
    """What is due now; pure apart from reading the store."""
    now = time.time() if now is None else now
    records = {r.id: r for r in store.all(backend_name)}
    kernels = store.live_kernels(backend_name)
    actions = []
    for info in infos:
        decision = decide(info, records.get(info.id), kernels.get(info.id, []), config)
        if decision.action and decision.at <= now:
            actions.append(
                Action(info.id, decision.action, decision.reason, engine_id=info.engine_id)
            )
    return actions


# What an orphan's action says (see decide): made by us, owned by no one any more.
ORPHAN_REASONS = ("orphan", "left half-", "files sandbox left half-")


def is_orphan(action: Action) -> bool:
    """Whether ``action`` removes an orphan (no owner record, an older incarnation, a
    sandbox left half-made), not a sandbox someone owns."""
    return action.action == "destroy" and action.reason.startswith(ORPHAN_REASONS)


def gc(
    backend: Backend, config: SandboxConfig, dry_run: bool = False, orphans_only: bool = False
) -> list[Action]:
    """Apply the lifecycle policies to every sandbox of this installation on this backend
    (``orphans_only``: only remove orphans whose grace is over)."""
    store = Store(config)
    if not dry_run:
        try:
            forget_dead_kernels(store, backend.name)
        except Exception:  # leftovers wait for the next run
            pass
    infos = []
    for info in [*backend.list(), *backend.files_sandboxes()]:
        if info.state == "stopped":  # listings are summaries: ask when it stopped
            try:
                info = backend.get(info.id)
            except SandboxNotFound:
                continue
        infos.append(info)
    actions = plan(infos, config, store, backend.name)
    if orphans_only:
        actions = [a for a in actions if is_orphan(a)]
    if dry_run:
        return actions
    try:
        backend.sweep()  # also frees what a frozen sandbox wedged in the engine
    except Exception:  # leftovers wait for the next run
        pass
    try:  # sandboxes' logs (`sandbox-kernel logs`) keep a month
        store.forget_events(time.time() - EVENTS_DAYS * 86400)
    except Exception:
        pass
    for action in actions:
        try:
            _apply(backend, store, action)
        except SandboxNotFound:
            action.done = True  # another reaper (or the user) got there first
            continue
        except Exception as exc:  # one sandbox's trouble must not stop the run
            action.error = str(exc) or type(exc).__name__
            kind = events.error_kind(exc)
            if kind:
                events.count(
                    store, events.ENGINE_ERRORS, backend=backend.name, operation="reap", kind=kind
                )
        if action.done:
            events.count(
                store,
                events.STOPS,
                backend=backend.name,
                action=action.action,
                reason=events.reap_reason(action.reason),
            )
        try:  # the sandbox's log says what the lifecycle did to it (`sandbox-kernel logs`)
            what = action.action if action.done else f"failed to {action.action}"
            store.add_event(backend.name, action.sandbox_id, f"lifecycle: {what} ({action.reason})")
        except Exception:
            pass
    return actions


def forget_dead_kernels(store: Store, backend_name: str) -> int:
    """Forget the kernels recorded on this host whose process is gone (a kernel killed
    hard never says goodbye), so they stop holding their sandboxes in use at once rather
    than when their heartbeats go stale. Their interpreters ended with their channels
    (each has a watcher that ends it and what its cells started). Returns how many."""
    import os
    import socket

    forgotten = 0
    for kernel_id, host_pid in store.kernels_of_host(backend_name, socket.gethostname()):
        try:
            os.kill(host_pid, 0)
            continue  # alive
        except ProcessLookupError:
            pass
        except PermissionError:
            continue  # someone else's process with that pid: alive
        store.kernel_gone(kernel_id)
        forgotten += 1
    return forgotten


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


def quota_check(
    backend: Backend, config: SandboxConfig, sandbox_id: str, memory: int, new: bool
) -> Callable[[list[Reservation]], None]:
    """The check a quota reservation runs (under the state file's write lock).

    It counts this installation's sandboxes as the engine lists them, plus the ones
    other processes are making or starting right now (their reservations): a new
    sandbox must fit ``max_sandboxes``, and a running one's memory ``max_total_memory``.
    """

    def check(others: list[Reservation]) -> None:
        limit_count = config.max_sandboxes
        limit_memory = config.max_total_memory_bytes
        if not limit_count and not limit_memory:
            return
        infos = [i for i in backend.list() if i.id != sandbox_id]
        listed = {i.id for i in infos}
        names = ", ".join(i.id for i in infos[:5]) + (" ..." if len(infos) > 5 else "")
        pending = [r for r in others if r.new and r.sandbox_id not in listed]
        count = len(infos) + len(pending)
        if new and limit_count and count >= limit_count:
            raise QuotaExceeded(
                f"quota max_sandboxes={limit_count} reached ({count} sandboxes of this installation: {names}); "
                f"destroy one with `sandbox-kernel destroy ID` or ask for a larger {setting_names('max_sandboxes')}"
            )
        running = {i.id: int(i.limits.get("memory") or 0) for i in infos if i.state == "running"}
        reserved = sum(running.values()) + sum(
            r.memory for r in others if r.sandbox_id not in running
        )
        if limit_memory and reserved + memory > limit_memory:
            raise QuotaExceeded(
                f"quota max_total_memory={config.max_total_memory} reached ({format_size(reserved)} reserved by "
                f"running sandboxes of this installation, {format_size(memory)} more asked); stop or destroy one "
                "(`sandbox-kernel stop ID`) or pick a smaller flavor"
            )

    return check


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
    disk_use = backend.disk_usage(infos)
    workspaces: dict[str, tuple[int, int]] = {}  # a user's workspace counts once
    for info in infos:
        if info.limits.get("workspace_disk"):
            used = disk_use.get(info.id, {}).get("workspace_disk", 0)
            workspaces[info.user] = (int(info.limits["workspace_disk"]), int(used))
    return {
        "backend": backend.name,
        "sandboxes": len(infos),
        "by_state": by_state,
        "by_flavor": by_flavor,
        "memory": {"reserved": int(reserved_memory), "used": int(used_memory)},
        "cpus": {"reserved": reserved_cpus},
        "disk": {
            # The sandboxes' own files, and their users' workspaces: each bounded by a
            # disk of its flavor's size where the engine allows (see disk_note).
            "sandboxes": sum(int(i.limits.get("disk") or 0) for i in infos),
            "sandboxes_used": sum(u.get("disk", 0) for u in disk_use.values()),
            "workspaces": sum(size for size, _ in workspaces.values()),
            "workspaces_used": sum(used for _, used in workspaces.values()),
            "unbounded": sorted(
                i.id for i in infos if i.disk_note and "not bounded" in i.disk_note
            ),
            "note": backend.disk_bound(),
        },
        "quota": {
            "max_sandboxes": config.max_sandboxes,
            "sandboxes_left": max(0, config.max_sandboxes - len(infos))
            if config.max_sandboxes
            else None,
            "max_total_memory": limit_memory,
            "memory_left": max(0, int(limit_memory - reserved_memory)) if limit_memory else None,
            # What the quotas count, said plainly (the panel and `stats` show it).
            "counts": (
                f"sandboxes of this installation only (state folder {config.state_dir}), stopped ones "
                "included; memory: the limits of the running ones"
            ),
        },
    }


__all__ = ["Action", "Decision", "decide", "gc", "plan", "quota_check", "stats"]


class CpuRates:
    """CPU use as a rate: each sandbox's CPU seconds (what engines report) against the
    sample taken at its previous listing."""

    def __init__(self) -> None:
        self._samples: dict[str, tuple[float, float]] = {}

    def usage(self, sandbox_id: str, usage: dict[str, float]) -> dict[str, float]:
        """``usage`` with ``cpu_seconds`` turned into ``cpu`` (a fraction of one CPU;
        absent on the first sample)."""
        usage = dict(usage)
        seconds = usage.pop("cpu_seconds", None)
        if seconds is None:
            return usage
        now = time.monotonic()
        previous = self._samples.get(sandbox_id)
        self._samples[sandbox_id] = (now, seconds)
        if previous and now > previous[0] and seconds >= previous[1]:
            usage["cpu"] = round((seconds - previous[1]) / (now - previous[0]), 3)
        return usage


def agent_sessions(holders: list[LiveSession]) -> list[dict[str, Any]]:
    """The agents' interpreters among a sandbox's holders, as listings show them."""
    found = [{"id": h.id, "name": h.label, "busy": h.busy} for h in holders if h.kind == AGENT]
    return sorted(found, key=lambda s: (s["name"], s["id"]))
