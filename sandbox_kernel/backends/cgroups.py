"""Live memory and CPU of a container, read from this host's cgroup files when visible.

Reading files costs no engine round trip, so listing a hundred sandboxes stays fast;
when the engine runs elsewhere (or cgroups are hidden) callers fall back to the
engine's stats call.
"""

from __future__ import annotations

from pathlib import Path


def cgroup_usage(container_id: str) -> dict[str, float] | None:
    """Memory use and CPU seconds of a container from this host's cgroup files, if visible."""
    memory = cgroup_memory(container_id)
    if memory is None:
        return None
    found: dict[str, float] = {"memory": memory}
    for path, scale in (
        (f"/sys/fs/cgroup/cpuacct/docker/{container_id}/cpuacct.usage", 1e-9),
        (f"/sys/fs/cgroup/cpu,cpuacct/docker/{container_id}/cpuacct.usage", 1e-9),
    ):
        try:
            found["cpu_seconds"] = int(Path(path).read_text()) * scale
            return found
        except (OSError, ValueError):
            continue
    for base in (
        f"/sys/fs/cgroup/system.slice/docker-{container_id}.scope",
        f"/sys/fs/cgroup/docker/{container_id}",
    ):
        try:
            for line in Path(base, "cpu.stat").read_text().splitlines():
                if line.startswith("usage_usec "):
                    found["cpu_seconds"] = int(line.split()[1]) * 1e-6
                    return found
        except (OSError, ValueError):
            continue
    return found


def cgroup_memory(container_id: str) -> int | None:
    """Memory use of a container from cgroup v1 or v2 files on this host, if visible."""
    candidates = [
        (
            f"/sys/fs/cgroup/memory/docker/{container_id}/memory.usage_in_bytes",
            "total_inactive_file",
        ),
        (
            f"/sys/fs/cgroup/memory/system.slice/docker-{container_id}.scope/memory.usage_in_bytes",
            "total_inactive_file",
        ),
        (
            f"/sys/fs/cgroup/system.slice/docker-{container_id}.scope/memory.current",
            "inactive_file",
        ),
        (f"/sys/fs/cgroup/docker/{container_id}/memory.current", "inactive_file"),
    ]
    for usage_file, inactive_key in candidates:
        try:
            usage = int(Path(usage_file).read_text())
        except (OSError, ValueError):
            continue
        inactive = 0
        try:
            for line in Path(usage_file).with_name("memory.stat").read_text().splitlines():
                key, _, value = line.partition(" ")
                if key == inactive_key:
                    inactive = int(value)
        except (OSError, ValueError):
            pass
        return max(0, usage - inactive)
    return None
