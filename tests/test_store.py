"""The state file under concurrency: many processes (kernels starting at once, the
server, the CLI) opening one brand-new state file (150 processes: in the full run, not
the fast layer)."""

from __future__ import annotations

import multiprocessing
from pathlib import Path

from sandbox_kernel.config import load_config
from sandbox_kernel.store import Store

ROUNDS = 15
PROCESSES = 10


def _first_use(
    state_dir: str, start: multiprocessing.synchronize.Event, errors: multiprocessing.Queue
) -> None:  # type: ignore[type-arg]
    try:
        store = Store(
            load_config(
                environ={}, backend="docker", state_dir=state_dir, workspace_root=state_dir + "-ws"
            )
        )
        start.wait(10)
        store.kernel_heartbeat("k", "docker", "sk-x", False)
        store.put("docker", "sk-x", "ann", "e1")
    except Exception as exc:  # reported to the test, which fails on it
        errors.put(f"{type(exc).__name__}: {exc}")


def test_many_processes_open_a_new_state_file_at_once(tmp_path: Path) -> None:
    """Ten processes set up one new state file at the same moment, in rounds: none fails
    (SQLite's switch to WAL does not wait for a lock the way queries do)."""
    ctx = multiprocessing.get_context("fork")
    errors = ctx.Queue()
    for round_ in range(ROUNDS):
        start = ctx.Event()
        state_dir = str(tmp_path / f"state-{round_}")
        procs = [
            ctx.Process(target=_first_use, args=(state_dir, start, errors))
            for _ in range(PROCESSES)
        ]
        for proc in procs:
            proc.start()
        start.set()
        for proc in procs:
            proc.join(60)
        assert all(proc.exitcode == 0 for proc in procs)
    failures = []
    while not errors.empty():
        failures.append(errors.get())
    assert failures == []
    assert {
        r.id
        for r in Store(
            load_config(environ={}, backend="docker", state_dir=str(tmp_path / "state-0"))
        ).all("docker")
    } == {"sk-x"}


def _store(tmp_path: Path) -> Store:
    return Store(
        load_config(
            environ={},
            backend="docker",
            state_dir=str(tmp_path / "state"),
            workspace_root=str(tmp_path / "ws"),
        )
    )
