"""sandbox-kernel's Prometheus metrics, in the server's ``/metrics`` (its default registry).

Three sources, by where things happen:

* **this server's own traffic** (file and WebDAV bytes, preview requests and bytes):
  counters of this process, updated where the bytes pass;
* **events of any process** (starts by outcome and their duration, stops and reaps by
  reason, quota refusals, agent sessions, the engine's errors): kernels and the CLI
  start sandboxes in processes of their own, so each counts in the installation's state
  file (:mod:`sandbox_kernel.events`) and this collector exports that table when
  scraped, as ``sandbox_kernel_<name>_total`` (a histogram as its buckets);
* **sandboxes now** by state, backend and flavor: a gauge from a listing the
  extension refreshes in the background every ``metrics_interval`` seconds (a
  scrape never waits for the engine), with ``sandbox_kernel_engine_up`` saying whether
  the last listing worked and ``sandbox_kernel_listing_age_seconds`` how old it is.
  A scrape that finds the listing older than that starts the next one in a thread and
  answers with the one it has;
* **egress refusals**: connections the egress proxies refused (sandboxes with an
  ``egress_allow`` list), read from the proxies with the same listing, as
  ``sandbox_kernel_egress_denied_total`` by allowlist and reason.
"""

from __future__ import annotations

import json
import logging
import threading
import time
from collections.abc import Iterator
from typing import Any

from prometheus_client import REGISTRY, Counter
from prometheus_client.core import (
    CounterMetricFamily,
    GaugeMetricFamily,
    HistogramMetricFamily,
    Metric,
)
from prometheus_client.registry import Collector

from sandbox_kernel import events
from sandbox_kernel.service import SandboxService

PREFIX = "sandbox_kernel_"
log = logging.getLogger("sandbox_kernel")

FILE_BYTES = Counter(
    PREFIX + "file_bytes",
    "Bytes of workspace files moved by the REST file routes and WebDAV.",
    ["door", "direction"],
)
PROXY_REQUESTS = Counter(
    PREFIX + "proxy_requests",
    "Requests and WebSockets relayed to sandbox ports by the preview proxy.",
    ["kind"],
)
PROXY_BYTES = Counter(
    PREFIX + "proxy_bytes",
    "Bytes relayed by the preview proxy (bodies and WebSocket messages).",
    ["direction"],
)

_HELP = {
    events.STARTS: "Sandbox starts asked for by kernels, the CLI, the API and agents, by outcome (created, started, recreated, existing, failed, quota).",
    events.STOPS: "Sandboxes stopped or destroyed, by action and reason (user, or the reaper's: idle, stopped_too_long, orphan, max_age, half_created).",
    events.QUOTA_REFUSALS: "Sandbox makes or starts refused by a quota, by quota.",
    events.AGENT_SESSIONS: "Agent interpreters (MCP execute_code sessions) started.",
    events.ENGINE_ERRORS: "Errors of the sandbox engine (unreachable, or refused work), by operation.",
}
_START_HELP = "Seconds to make or start a sandbox (sandboxes found running are not counted)."


class SandboxCollector(Collector):
    """Exports the state file's event counters and the cached sandbox listing."""

    def __init__(self) -> None:
        self.service: SandboxService | None = None
        self.interval = 15.0
        self._listing = threading.Lock()
        self._tried = 0.0
        self.listing: list[tuple[str, str, str]] = []  # (state, backend, flavor) per sandbox
        self.listed_at = 0.0
        self.engine_up = False
        self.egress: list[tuple[str, str, str, int]] = []  # backend, allowlist, reason, count

    def refresh_soon(self) -> None:
        """Start a listing in a thread when the last one is older than ``interval``."""
        if time.monotonic() - self._tried < self.interval or self._listing.locked():
            return
        self._tried = time.monotonic()
        threading.Thread(target=self.refresh, name="sandbox-metrics", daemon=True).start()

    def refresh(self) -> None:
        """List the sandboxes (blocking: call it from a thread)."""
        with self._listing:
            self._refresh()

    def _refresh(self) -> None:
        service = self.service
        if service is None:
            return
        backend = service.backend.name
        try:
            with events.engine_call(service.store, backend, "list"):
                infos = service.backend.list()
        except Exception as exc:  # the gauge says so; the server goes on
            log.debug("sandbox listing for metrics failed: %s", exc)
            self.engine_up = False
            return
        self.listing = [(i.state, backend, i.flavor or "") for i in infos]
        self.listed_at = time.time()
        self.engine_up = True
        try:
            counts = service.backend.egress_denied()
        except Exception as exc:  # the last counts stay
            log.debug("egress counts for metrics failed: %s", exc)
            return
        self.egress = [(backend, c.allowlist, c.reason, c.count) for c in counts]

    def collect(self) -> Iterator[Metric]:
        service = self.service
        if service is None:
            return
        self.refresh_soon()
        yield from self._now(service.backend.name)
        try:
            rows = service.store.counters()
        except Exception as exc:
            log.debug("metrics: cannot read the state file's counters: %s", exc)
            rows = []
        yield from _families(rows)

    def _now(self, backend: str) -> Iterator[Metric]:
        sandboxes = GaugeMetricFamily(
            PREFIX + "sandboxes",
            "Sandboxes of this installation by state, backend and flavor (from the last listing).",
            labels=["state", "backend", "flavor"],
        )
        counts: dict[tuple[str, str, str], int] = {}
        for key in self.listing:
            counts[key] = counts.get(key, 0) + 1
        for state in ("running", "stopped", "creating", "error"):  # every state, even at 0
            if not any(k[0] == state for k in counts):
                counts[(state, backend, "")] = 0
        for (state, name, flavor), n in sorted(counts.items()):
            sandboxes.add_metric([state, name, flavor], n)
        yield sandboxes
        up = GaugeMetricFamily(
            PREFIX + "engine_up",
            "1 when the last listing of sandboxes from the engine worked.",
            labels=["backend"],
        )
        up.add_metric([backend], 1 if self.engine_up else 0)
        yield up
        age = GaugeMetricFamily(
            PREFIX + "listing_age_seconds",
            "Seconds since the sandbox listing behind sandbox_kernel_sandboxes was taken.",
            labels=["backend"],
        )
        age.add_metric([backend], time.time() - self.listed_at if self.listed_at else -1)
        yield age
        denied = CounterMetricFamily(
            PREFIX + "egress_denied",
            "Connections refused by the egress proxies of sandboxes with an allowlist, by "
            "allowlist (a digest) and reason (name, port, address, sni, request), since each "
            "proxy started.",
            labels=["backend", "allowlist", "reason"],
        )
        for name, allowlist, reason, count in self.egress:
            denied.add_metric([name, allowlist, reason], count)
        yield denied


def _families(rows: list[tuple[str, str, float]]) -> Iterator[Metric]:
    """The state file's counters as metric families (a histogram from its parts)."""
    counters: dict[str, dict[tuple[tuple[str, str], ...], float]] = {}
    for name, labels_json, value in rows:
        try:
            labels = json.loads(labels_json)
        except ValueError:
            continue
        counters.setdefault(name, {})[tuple(sorted(labels.items()))] = value
    for name, help_text in _HELP.items():
        series = counters.get(name, {})
        keys = sorted({k for labels in series for k, _ in labels})
        family = CounterMetricFamily(PREFIX + name, help_text, labels=keys)
        for labels, value in sorted(series.items()):
            values = dict(labels)
            family.add_metric([values.get(k, "") for k in keys], value)
        yield family
    yield _histogram(events.START_SECONDS, counters)


def _histogram(name: str, counters: dict[str, Any]) -> Metric:
    family = HistogramMetricFamily(PREFIX + name, _START_HELP, labels=["backend"])
    sums = counters.get(f"{name}_sum", {})
    buckets = counters.get(f"{name}_bucket", {})
    for labels, total in sorted(sums.items()):
        backend = dict(labels).get("backend", "")
        found = {
            dict(b)["le"]: v for b, v in buckets.items() if dict(b).get("backend", "") == backend
        }
        bounds = [f"{b:g}" for b in events.START_BUCKETS] + ["+Inf"]
        # Buckets are cumulative: each observation was added to every bound at or above it.
        family.add_metric([backend], [(bound, found.get(bound, 0.0)) for bound in bounds], total)
    return family


COLLECTOR = SandboxCollector()
_registered = False


def register(service: SandboxService, interval: float) -> SandboxCollector:
    """Export ``service``'s installation in the server's /metrics (once per process),
    its sandboxes listed at most every ``interval`` seconds."""
    global _registered
    COLLECTOR.service = service
    COLLECTOR.interval = interval
    COLLECTOR.listing, COLLECTOR.listed_at, COLLECTOR.engine_up = [], 0.0, False
    COLLECTOR.egress = []
    COLLECTOR._tried = 0.0
    if not _registered:
        REGISTRY.register(COLLECTOR)
        _registered = True
    return COLLECTOR
