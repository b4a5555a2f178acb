"""A local sandbox's record: ``<state_dir>/local/<id>.json``, and what is read from it.

The record is everything the backend knows of a sandbox that must outlive a process
(see :mod:`.backend`); these are the small readings of it that several modules share.
"""

from __future__ import annotations

import json
import os
import resource
import tempfile
from pathlib import Path
from typing import Any

from ..base import Spec, not_found
from . import holder


class Records:
    """The records of one installation's local sandboxes, in ``root``."""

    def __init__(self, root: Path) -> None:
        self.root = root

    def path(self, sandbox_id: str) -> Path:
        """Where the record of ``sandbox_id`` is (a bad id is an unknown one)."""
        if "/" in sandbox_id or sandbox_id.startswith("."):
            raise not_found(sandbox_id)
        return self.root / f"{sandbox_id}.json"

    def load(self, sandbox_id: str) -> dict[str, Any] | None:
        try:
            return json.loads(self.path(sandbox_id).read_text())
        except (OSError, ValueError):
            return None

    def save(self, record: dict[str, Any]) -> None:
        """Write a record whole (never half of one: a reader finds the old or the new)."""
        path = self.path(record["id"])
        fd, tmp = tempfile.mkstemp(dir=self.root, prefix=".rec-")
        with os.fdopen(fd, "w") as fh:
            json.dump(record, fh)
        os.replace(tmp, path)

    def all(self) -> list[dict[str, Any]]:
        """Every record of the installation."""
        if not self.root.is_dir():
            return []
        return [r for r in (self.load(p.stem) for p in self.root.glob("*.json")) if r]

    def runs(self, sandbox_id: str) -> bool:
        """Whether the sandbox runs: its holder, or a process of it."""
        return holder.load(self.root / sandbox_id) is not None or self.busy(sandbox_id)

    def busy(self, sandbox_id: str) -> bool:
        """Whether a process of the sandbox runs (a command, kernel or terminal: what
        has its folders mounted, which its holder alone has not)."""
        procs = self.root / sandbox_id / "procs"
        markers = procs.glob("*") if procs.is_dir() else []
        return any(m.name.isdigit() and marker_matches(m) for m in markers)


def make_tmp(folder: Path) -> None:
    """The sandbox's /tmp on disk: every process of it may write there, as in /tmp."""
    tmp = folder / "tmp"
    if not tmp.is_dir():
        tmp.mkdir(parents=True, exist_ok=True)
        os.chmod(tmp, 0o1777)


def resources(record: dict[str, Any]) -> tuple[int, int, float]:
    """(memory bytes, processes, CPUs) of a sandbox; a record made before they were kept
    gets a Spec's defaults."""
    default = Spec()
    return (
        int(record.get("memory") or default.memory),
        int(record.get("pids") or default.pids),
        float(record.get("cpus") or default.cpus),
    )


def process_limits(record: dict[str, Any], controllers: tuple[str, ...]) -> list[tuple[int, int]]:
    """The resource limits of each process of the sandbox: processes per sandbox, and
    memory per process where no cgroup bounds the sandbox's (``controllers``: its
    cgroup's)."""
    memory, pids, _ = resources(record)
    limits = [(resource.RLIMIT_NPROC, pids)]
    if "memory" not in controllers:
        limits.append((resource.RLIMIT_DATA, memory))
    return limits


def network_of(record: dict[str, Any]) -> str:
    """The sandbox's network: "open" (out through slirp4netns, where installed), "egress"
    (only its egress proxy) or "none" (also a list's sandboxes made before proxies)."""
    if not record.get("network", True):
        return "none"
    return "egress" if record.get("egress_allow") else "open"


def marker_matches(marker: Path) -> bool:
    """Whether the process a marker names is still the one it was written for."""
    try:
        said = marker.read_text().strip()
    except OSError:
        return False
    return not said or holder.start_time(int(marker.name)) == said
