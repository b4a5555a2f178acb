"""``sandbox-kernel uninstall``: what this installation left on the machine, removed.

``pip uninstall`` removes the package, its default kernelspec and the server
extension's switch (they live in the environment); it cannot remove what the
installation made elsewhere: kernelspecs installed with ``sandbox-kernel install
--user`` (pointing into a virtual environment that may be gone), this installation's
sandboxes and snapshots, the engine's network once nothing uses it, the idmapped
mounts' folder under ``/run/sandbox-kernel/``, its kernel guard pinned under
``/sys/fs/bpf/sandbox-kernel/``, the state folder, and (only when asked)
the users' workspaces. Run it first, ``--dry-run`` to see the list.

Nothing is ever followed into a mount point: the workspaces are mounted (idmapped)
beneath folders this removes, and a mount still in place is left, and said.
"""

from __future__ import annotations

import json
import os
import shutil
import stat
import sys
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from .backends import disks, lsm_guard
from .errors import NotSupported, SandboxError
from .service import SandboxService


@dataclass
class Step:
    """One thing to remove: what it is, and how."""

    what: str
    run: Callable[[], str | None]  # what it did otherwise than said, if anything
    last: bool = False  # done only when every step before it was (the state folder)


def kernelspecs() -> list[tuple[str, Path, str]]:
    """(name, folder, python) of the kernelspecs that start this installation's kernel
    (with this Python), and of yours (in your Jupyter data folder) whose Python is gone
    (a removed virtual environment); never those inside this environment, which go with
    it, nor another installation's."""
    from jupyter_client.kernelspec import KernelSpecManager
    from jupyter_core.paths import jupyter_data_dir

    yours = Path(jupyter_data_dir()).resolve()
    found = []
    for name, folder in sorted(KernelSpecManager().find_kernel_specs().items()):
        try:
            spec = json.loads((Path(folder) / "kernel.json").read_text("utf-8"))
            argv = [str(a) for a in spec.get("argv") or []]
        except (OSError, ValueError, AttributeError):
            continue
        if "sandbox_kernel" not in argv[1:4]:  # python [-I] -m sandbox_kernel
            continue
        python, where = argv[0], Path(folder).resolve()
        if where.is_relative_to(Path(sys.prefix).resolve()):
            continue
        if python == sys.executable or (not _runnable(python) and where.is_relative_to(yours)):
            found.append((name, Path(folder), python))
    return found


def _runnable(python: str) -> bool:
    """Whether a kernelspec's program is there (a bare name is looked up on PATH)."""
    return Path(python).exists() if os.path.isabs(python) else shutil.which(python) is not None


def plan(services: list[SandboxService], workspaces: bool) -> tuple[list[Step], list[str]]:
    """What to remove, in order, and what is kept (to say so)."""
    config = services[0].config
    steps: list[Step] = []
    for name, folder, python in kernelspecs():
        gone = "" if _runnable(python) else ", which no longer exists"
        steps.append(
            Step(f"kernelspec {name} ({folder}; runs {python}{gone})", _remover(folder, set()))
        )
    for service in services:
        steps += _sandboxes_and_snapshots(service)
    docker = next((s for s in services if s.backend.name == "docker"), None)
    if docker is not None:
        steps.append(
            Step(
                "the engine's network sandbox-kernel, unless other installations' sandboxes use it",
                lambda: _remove_network(docker),
            )
        )
    guard = lsm_guard.folder_of(services[0].installation)
    if os.path.isdir(guard):
        steps.append(
            Step(
                f"{guard} (the kernel's guard of protected names)",
                lambda: _unguard(services[0].installation),
            )
        )
    run = Path("/run/sandbox-kernel") / services[0].installation[:8]
    if run.exists():
        steps.append(Step(f"{run} (folders of idmapped mounts)", _remover(run, set())))
    kept = []
    workspace_root = Path(config.workspace_root)
    state = Path(config.state_dir)
    # A workspace bounded by a disk image keeps its files in the image (the state
    # folder's disks/workspace), mounted over its folder: kept with the workspaces.
    images = state / "disks" / disks.WORKSPACE
    if workspaces and workspace_root.exists():
        steps.append(
            Step(f"every workspace, in {workspace_root}", _workspaces_remover(workspace_root))
        )
    elif workspace_root.exists():
        kept.append(f"the workspaces in {workspace_root} (--workspaces removes them)")
    if images.exists() and not workspaces:
        kept.append(f"the workspaces' disk images in {images} (--workspaces removes them)")
    if state.exists():
        keep = set() if workspaces else {workspace_root, images}
        inside = "" if workspaces else " (its workspaces kept)"
        steps.append(Step(f"the state folder {state}{inside}", _remover(state, keep), last=True))
    return steps, kept


def _sandboxes_and_snapshots(service: SandboxService) -> list[Step]:
    backend = service.backend
    steps = []
    for info in [*backend.list(), *backend.files_sandboxes()]:
        steps.append(
            Step(f"sandbox {info.id} of {info.user} ({backend.name})", _destroyer(service, info.id))
        )
    try:
        snapshots = backend.list_snapshots()
    except NotSupported:
        snapshots = []
    for snap in snapshots:
        steps.append(
            Step(
                f"snapshot {snap.name} of {snap.user} ({backend.name})", _deleter(service, snap.ref)
            )
        )
    return steps


def _deleter(service: SandboxService, ref: str) -> Callable[[], str | None]:
    def run() -> None:
        service.backend.delete_snapshot(ref)

    return run


def _destroyer(service: SandboxService, sandbox_id: str) -> Callable[[], str | None]:
    def run() -> None:
        service.backend.destroy(sandbox_id)
        service.store.delete(service.backend.name, sandbox_id)

    return run


def _unguard(installation: str) -> str | None:
    lsm_guard.remove(installation)
    return None


def _remove_network(service: SandboxService) -> str | None:
    """The network all installations on the engine share, removed only when no sandbox
    of any installation is left (one that is stopped joins it again when it starts)."""
    from .backends.base import LABEL_MANAGED
    from .backends.docker.network import NETWORK

    client = service.backend.client  # type: ignore[attr-defined]
    try:
        network = client.networks.get(NETWORK)
    except Exception:  # not there: nothing to do
        return None
    others = client.containers.list(
        all=True, filters={"label": f"{LABEL_MANAGED}=1"}, ignore_removed=True
    )  # another installation may remove one of its own meanwhile
    network.reload()
    if others or network.attrs.get("Containers"):
        return f"kept the network {NETWORK}: other installations' sandboxes use it"
    network.remove()
    return None


def mount_points() -> set[str]:
    """Every mount point of this process's view (/proc/self/mountinfo)."""
    points = set()
    try:
        with open("/proc/self/mountinfo", encoding="utf-8", errors="surrogateescape") as f:
            for line in f:
                fields = line.split()
                if len(fields) > 4:
                    points.add(_unescape(fields[4]))
    except OSError:
        pass
    return points


def _unescape(text: str) -> str:
    """mountinfo writes space, tab, newline and backslash as octal escapes."""
    for code in ("040", "011", "012", "134"):
        text = text.replace("\\" + code, chr(int(code, 8)))
    return text


def _remover(top: Path, keep: set[Path]) -> Callable[[], str | None]:
    def run() -> None:
        left = remove_tree(top, {str(p) for p in keep}, mount_points())
        mounted = [p for p in left if p not in {str(k) for k in keep}]
        if mounted:
            raise SandboxError(
                f"left {', '.join(mounted)}: still mounted (unmount it, then run again)"
            )

    return run


def _workspaces_remover(root: Path) -> Callable[[], str | None]:
    """Remove every workspace, the disk images mounted over them taken off first."""
    remove = _remover(root, set())

    def run() -> None:
        disks.release_beneath(root)
        remove()

    return run


def remove_tree(path: Path, keep: set[str], mounts: set[str]) -> list[str]:
    """Remove ``path`` and everything beneath it, never a link's target, never beneath a
    mount point nor a path in ``keep``; what was left in place."""
    if str(path) in keep or str(path) in mounts:
        return [str(path)]
    try:
        info = os.lstat(path)
    except FileNotFoundError:
        return []
    if not stat.S_ISDIR(info.st_mode):
        path.unlink()
        return []
    left = []
    for child in sorted(path.iterdir()):
        left += remove_tree(child, keep, mounts)
    if not left:
        path.rmdir()
    return left


def run_steps(steps: list[Step]) -> tuple[list[tuple[str, str]], list[str]]:
    """Carry out every step: (step, what went wrong) of those that failed, and what the
    others said they did otherwise."""
    failed: list[tuple[str, str]] = []
    said = []
    for step in steps:
        if step.last and failed:
            failed.append((step.what, "kept, so that running this again can finish"))
            continue
        try:
            note = step.run()
        except (SandboxError, OSError) as exc:
            failed.append((step.what, str(exc)))
            continue
        if note:
            said.append(note)
    return failed, said
