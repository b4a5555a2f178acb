"""Engines are found by name: ours, and any other package registers through the
``sandbox_kernel.backends`` entry points (fast: a package made on disk, no engine)."""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from sandbox_kernel.backends import BUILTIN, ENTRY_POINTS
from sandbox_kernel.backends.base import epoch_of
from sandbox_kernel.config import ENGINES, ConfigError, load_config

pytestmark = pytest.mark.fast

# A third party's engine: a package with a module and its dist-info naming it.
ENGINE_MODULE = textwrap.dedent(
    """
    from sandbox_kernel.backends.base import Backend, Health, SandboxError

    class MemoryBackend(Backend):
        name = "memory"

        def health(self):
            return Health(True, self.name, "always")

        def find(self, sandbox_id): return None
        def list(self, user=None): return []
        def create(self, sandbox_id, key, spec, labels, progress): raise SandboxError('not in this test')
        def start(self, sandbox_id, progress=None): raise SandboxError('not in this test')
        def stop(self, sandbox_id): raise SandboxError('not in this test')
        def destroy(self, sandbox_id): return False
        def exec(self, sandbox_id, cmd, **kw): raise SandboxError('not in this test')
        def open_channel(self, sandbox_id, cmd, **kw): raise SandboxError('not in this test')
        def put_file(self, sandbox_id, path, data): raise SandboxError('not in this test')
        def get_file(self, sandbox_id, path): raise SandboxError('not in this test')
    """
)

PROBE = textwrap.dedent(
    """
    import json, sys
    from sandbox_kernel.backends import engine_names, make_backend
    from sandbox_kernel.config import ConfigError, load_config
    cfg = load_config(environ={}, backend="memory", state_dir=sys.argv[1], workspace_root=sys.argv[1])
    backend = make_backend(cfg)
    try:
        load_config(environ={}, backend="nosuch")
        refused = ""
    except ConfigError as exc:
        refused = str(exc)
    print(json.dumps([type(backend).__name__, backend.health().ok, engine_names(), refused]))
    """
)


def test_a_package_adds_an_engine_by_entry_point(tmp_path: Path) -> None:
    site = tmp_path / "site"
    site.mkdir()
    (site / "memory_engine.py").write_text(ENGINE_MODULE)
    dist = site / "memory_engine-1.0.dist-info"
    dist.mkdir()
    (dist / "METADATA").write_text("Metadata-Version: 2.1\nName: memory-engine\nVersion: 1.0\n")
    (dist / "entry_points.txt").write_text(
        f"[{ENTRY_POINTS}]\nmemory = memory_engine:MemoryBackend\n"
    )
    repo = Path(__file__).resolve().parent.parent
    done = subprocess.run(
        [sys.executable, "-c", PROBE, str(tmp_path / "state")],
        env={"PYTHONPATH": f"{site}:{repo}", "PATH": "/usr/bin:/bin", "HOME": str(tmp_path)},
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert done.returncode == 0, done.stderr
    name, healthy, names, refused = json.loads(done.stdout)
    assert (name, healthy) == ("MemoryBackend", True)
    assert names[: len(ENGINES)] == list(ENGINES) and "memory" in names
    assert "'nosuch' is not an engine" in refused and "memory" in refused


def test_our_engines_are_named_once() -> None:
    assert tuple(BUILTIN) == ENGINES
    with pytest.raises(ConfigError) as err:
        load_config(environ={"SANDBOX_KERNEL_BACKEND": "dokcer"})
    assert "SANDBOX_KERNEL_BACKEND" in str(err.value) and "docker" in str(err.value)
    assert load_config(environ={"SANDBOX_KERNEL_BACKEND": " Docker "}).backend == "docker"


@pytest.mark.parametrize(
    ("stamp", "seconds"),
    [
        ("2026-11-26T12:00:00.123456789Z", 1795694400.123456),  # Docker: nanoseconds
        ("2026-11-26T12:00:00Z", 1795694400.0),  # Kubernetes
        ("2026-11-26 12:00:00.5+00:00", 1795694400.5),  # Daytona's SDK, as text
        ("2026-11-26T13:00:00+01:00", 1795694400.0),
        ("", 0.0),
        (None, 0.0),
        ("yesterday", 0.0),
    ],
)
def test_every_engines_times_read_the_same(stamp: str | None, seconds: float) -> None:
    """One reader of the engines' RFC 3339 times, whatever their fraction and zone."""
    assert epoch_of(stamp) == pytest.approx(seconds)
