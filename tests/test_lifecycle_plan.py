"""The lifecycle policies as tables: which sandbox is stopped or removed, when and why.

Pure (``decide``) and over a real state file (``plan(now=…)``): no engine, part of the
fast layer. The engine-side effects of the same policies are in test_lifecycle.py.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from sandbox_kernel.backends.base import SandboxInfo, files_sandbox_id
from sandbox_kernel.config import SandboxConfig, load_config
from sandbox_kernel.lifecycle import Decision, decide, plan
from sandbox_kernel.store import Record, Store

pytestmark = pytest.mark.fast

T0 = 1_800_000_000.0  # when every sandbox of the tables was created
MIN = 60.0
FILES = files_sandbox_id("ann")


def cfg(tmp_path: Path, **settings: float) -> SandboxConfig:
    return load_config(
        environ={},
        backend="docker",
        state_dir=str(tmp_path / "state"),
        workspace_root=str(tmp_path / "ws"),
        **settings,
    )


def info(
    state: str = "running", engine_id: str = "e1", finished: float = 0.0, sid: str = "sk-ann"
) -> SandboxInfo:
    return SandboxInfo(
        id=sid,
        backend="docker",
        scope="user",
        user="ann",
        thread="",
        state=state,
        image="img",
        created=T0,
        engine_id=engine_id,
        finished=finished,
    )


def record(last_activity: float = T0, engine_id: str = "e1") -> Record:
    return Record(
        id="sk-ann",
        backend="docker",
        user="ann",
        engine_id=engine_id,
        created=T0,
        last_activity=last_activity,
    )


IDLE = [("k1", False)]
BUSY = [("k1", True)]

# (case, sandbox, record, live kernels, settings, expected decision)
TABLE = [
    (
        "running, no kernel: stopped after idle_stop from its last activity",
        info(),
        record(T0 + 5 * MIN),
        [],
        {},
        Decision("stop", T0 + 20 * MIN, "idle 15 min with no live kernel"),
    ),
    (
        "running with an idle kernel: kept (idle_stop_with_kernel is 0)",
        info(),
        record(),
        IDLE,
        {},
        Decision(),
    ),
    (
        "running with an idle kernel and idle_stop_with_kernel",
        info(),
        record(),
        IDLE,
        {"idle_stop_with_kernel": 60},
        Decision("stop", T0 + 60 * MIN, "idle 60 min with an idle kernel"),
    ),
    (
        "a busy kernel: never stopped, never aged out",
        info(),
        record(),
        BUSY,
        {"idle_stop_with_kernel": 1, "max_age": 1},
        Decision(),
    ),
    (
        "stopped: removed idle_delete after it stopped",
        info("stopped", finished=T0 + 30 * MIN),
        record(),
        [],
        {},
        Decision("destroy", T0 + 150 * MIN, "stopped for 120 min"),
    ),
    (
        "stopped, idle_delete 0: kept",
        info("stopped", finished=T0),
        record(),
        [],
        {"idle_delete": 0},
        Decision(),
    ),
    (
        "max_age comes before idle_stop when sooner",
        info(),
        record(T0 + 100 * MIN),
        [],
        {"max_age": 30},
        Decision("destroy", T0 + 30 * MIN, "older than max_age=30 min"),
    ),
    (
        "no owner record and no kernel: an orphan, after the grace",
        info(),
        None,
        [],
        {},
        Decision("destroy", T0 + 10 * MIN, "orphan: no owner record"),
    ),
    (
        "no owner record but a live kernel: being made right now, kept",
        info(),
        None,
        IDLE,
        {},
        Decision(),
    ),
    (
        "half-created: removed after the grace",
        info("creating"),
        record(),
        [],
        {},
        Decision("destroy", T0 + 10 * MIN, "left half-created"),
    ),
    (
        "an older incarnation of the id, no kernel: an orphan",
        info(engine_id="e2"),
        record(engine_id="e1"),
        [],
        {},
        Decision("destroy", T0 + 10 * MIN, "orphan: an older sandbox of the same id"),
    ),
    (
        "idle_stop 0: a running sandbox without kernel is kept",
        info(),
        record(),
        [],
        {"idle_stop": 0},
        Decision(),
    ),
    # A files sandbox (Daytona's, serving a workspace) has its own rule: no kernel ever
    # uses it, its record is only its file use, and it is no orphan without one.
    (
        "files sandbox: stopped files_idle_stop after its last file use",
        info(sid=FILES),
        record(T0 + 5 * MIN),
        [],
        {},
        Decision("stop", T0 + 65 * MIN, "files sandbox without file use for 60 min"),
    ),
    (
        "files sandbox without a record: no orphan, stopped from its creation",
        info(sid=FILES),
        None,
        [],
        {"max_age": 1},
        Decision("stop", T0 + 60 * MIN, "files sandbox without file use for 60 min"),
    ),
    (
        "files sandbox, files_idle_stop 0: kept running",
        info(sid=FILES),
        record(),
        [],
        {"files_idle_stop": 0},
        Decision(),
    ),
    (
        "files sandbox stopped: removed idle_delete after it stopped",
        info("stopped", finished=T0 + 70 * MIN, sid=FILES),
        record(),
        [],
        {},
        Decision("destroy", T0 + 190 * MIN, "files sandbox stopped for 120 min"),
    ),
    (
        "files sandbox failed: removed now (file use makes a new one)",
        info("error", sid=FILES),
        record(),
        [],
        {},
        Decision("destroy", T0, "files sandbox failed; file use makes a new one"),
    ),
    (
        "files sandbox half-made: removed after the grace",
        info("creating", sid=FILES),
        None,
        [],
        {},
        Decision("destroy", T0 + 10 * MIN, "files sandbox left half-made"),
    ),
]


@pytest.mark.parametrize(
    ("sandbox", "rec", "live", "settings", "expected"),
    [row[1:] for row in TABLE],
    ids=[row[0] for row in TABLE],
)
def test_decide(
    tmp_path: Path,
    sandbox: SandboxInfo,
    rec: Record | None,
    live: list[tuple[str, bool]],
    settings: dict[str, float],
    expected: Decision,
) -> None:
    assert decide(sandbox, rec, live, cfg(tmp_path, **settings)) == expected


def test_plan_acts_only_on_what_is_due(tmp_path: Path) -> None:
    """plan(now=…) over a real state file: a sandbox is due only once its time has come,
    and activity recorded later pushes its stop back."""
    config = cfg(tmp_path)
    store = Store(config)
    sandbox = info()
    store.put("docker", sandbox.id, "ann", sandbox.engine_id)
    store.touch("docker", sandbox.id, when=T0)
    with store._connect() as conn:  # the record as it was when the sandbox was made
        conn.execute(
            "UPDATE sandboxes SET created = ?, last_activity = ? WHERE id = ?", (T0, T0, sandbox.id)
        )
    assert plan([sandbox], config, store, "docker", now=T0 + 14 * MIN) == []
    (due,) = plan([sandbox], config, store, "docker", now=T0 + 15 * MIN)
    assert (due.sandbox_id, due.action, due.engine_id) == ("sk-ann", "stop", "e1")
    store.touch("docker", sandbox.id, when=T0 + 10 * MIN)
    assert plan([sandbox], config, store, "docker", now=T0 + 15 * MIN) == []
    assert [a.action for a in plan([sandbox], config, store, "docker", now=T0 + 25 * MIN)] == [
        "stop"
    ]
    # Another backend's records are not this one's: the same id there is an orphan.
    (orphan,) = plan([sandbox], config, store, "daytona", now=T0 + 10 * MIN)
    assert orphan.reason == "orphan: no owner record"
