"""What happened to sandboxes, counted for the server's Prometheus ``/metrics``.

Sandboxes are started by kernels (each its own process), by the CLI and by the server,
and reaped by the server's reaper or ``sandbox-kernel gc``: no one process sees every
event. So events are counted in the installation's state file (:class:`~.store.Store`,
table ``counters``), by whichever process saw them, and the server extension exports
the table when it is scraped (``jupyter_ext/metrics.py``). Counting never fails the
work it counts: a state file that cannot be written loses the count, not the start.

Names here are the metric names without the ``sandbox_kernel_`` prefix; a histogram is
kept as its cumulative buckets (``le``), sum and count, as Prometheus exposes it.
"""

from __future__ import annotations

import json
import logging
from collections.abc import Iterator
from contextlib import contextmanager

from .errors import EngineUnavailable, QuotaExceeded, SandboxError, SandboxFailed
from .store import Store

log = logging.getLogger("sandbox_kernel")

STARTS = "starts"  # outcome: created | started | recreated | existing | failed | quota
START_SECONDS = "start_seconds"  # histogram of made or started sandboxes
STOPS = "stops"  # reason: user | idle | ...
REAPS = "reaps"  # action: stop | destroy; reason: idle | stopped | orphan | max_age | ...
QUOTA_REFUSALS = "quota_refusals"  # quota: max_sandboxes | max_total_memory
AGENT_SESSIONS = "agent_sessions"  # agent interpreters started (MCP execute_code sessions)
ENGINE_ERRORS = "engine_errors"  # backend, operation, kind
START_BUCKETS = (0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0, 120.0, 300.0)


def _key(labels: dict[str, str]) -> str:
    return json.dumps(labels, sort_keys=True, separators=(",", ":"))


def count(store: Store, name: str, amount: float = 1.0, **labels: str) -> None:
    """Add ``amount`` to counter ``name`` with ``labels``; never raises."""
    try:
        store.add([(name, _key(labels), amount)])
    except Exception as exc:  # a lost count must never fail the work counted
        log.debug("could not count %s: %s", name, exc)


def observe(store: Store, name: str, seconds: float, **labels: str) -> None:
    """One observation of histogram ``name`` (in one transaction); never raises."""
    rows = [(f"{name}_count", _key(labels), 1.0), (f"{name}_sum", _key(labels), seconds)]
    for bound in START_BUCKETS:
        if seconds <= bound:
            rows.append((f"{name}_bucket", _key({**labels, "le": f"{bound:g}"}), 1.0))
    rows.append((f"{name}_bucket", _key({**labels, "le": "+Inf"}), 1.0))
    try:
        store.add(rows)
    except Exception as exc:
        log.debug("could not count %s: %s", name, exc)


def quota_name(exc: QuotaExceeded) -> str:
    """Which quota a refusal names (its message starts "quota NAME=...")."""
    words = str(exc).split()
    return words[1].split("=", 1)[0] if len(words) > 1 and "=" in words[1] else "other"


def reap_reason(reason: str) -> str:
    """A lifecycle reason as a label of few values ("idle 15 min ..." -> "idle")."""
    for word, label in (
        ("orphan", "orphan"),
        ("half-created", "half_created"),
        ("max_age", "max_age"),
        ("idle", "idle"),
        ("stopped", "stopped_too_long"),
    ):
        if word in reason:
            return label
    return "other"


def error_kind(exc: BaseException) -> str:
    """An engine error's kind as a label ("" when it is not the engine's)."""
    if isinstance(exc, EngineUnavailable):
        return "unavailable"
    if isinstance(exc, SandboxFailed):
        return "failed"
    return ""


@contextmanager
def engine_call(store: Store, backend: str, operation: str) -> Iterator[None]:
    """Count the engine's errors raised inside (unreachable engine, refused work)."""
    try:
        yield
    except SandboxError as exc:
        kind = error_kind(exc)
        if kind:
            count(store, ENGINE_ERRORS, backend=backend, operation=operation, kind=kind)
        raise
