"""Which host folder a kernel works in, and what of it a sandbox may see.

Cells run in the folder the user works in: the notebook's folder is mounted into the
sandbox at the same absolute path, so ``open('data.csv')`` next to the notebook works,
what a cell writes appears beside the notebook (in the file browser too), and
``os.getcwd()`` is the notebook's folder. The mounted tree, the *work folder*, is:

* the *primary* work folder when the notebook lies in it: ``work_root`` (a setting),
  or the root folder of the Jupyter server that started the kernel (the server
  extension passes it on), so one sandbox serves every notebook of a JupyterLab;
* else the git repository around the notebook (a CI checkout), else its folder.

A sandbox is made with one work folder (Docker cannot add mounts to a container), so
the primary folder's sandbox keeps the plain id ``sk-<user>`` and any other folder
gets a sandbox of its own, ``sk-<user>--w<hash>``, sharing the user's workspace.

The work folder is hostile ground afterwards (every host tool that reads it: the
contents API, ``jupyter execute --inplace``, git): folders that are never shown
(the state folder, the workspaces, the home's dot-folders, this installation's own
Python) are masked, what host tools run or trust there (``protected_paths``: git's
config and hooks, shell and editor settings, at any depth) is mounted read-only with
the folders on its way pinned, and the agent forbids making links, FIFOs, sockets and
devices beneath it (Landlock).
"""

from __future__ import annotations

import fnmatch
import hashlib
import os
import time
from dataclasses import dataclass, field
from pathlib import Path

# Folders that are never a work folder: the system's, and the parents of homes.
_REFUSED = {
    "/",
    "/bin",
    "/boot",
    "/dev",
    "/etc",
    "/home",
    "/lib",
    "/lib64",
    "/media",
    "/mnt",
    "/opt",
    "/proc",
    "/run",
    "/sbin",
    "/srv",
    "/sys",
    "/tmp",
    "/usr",
    "/var",
    "/Users",
}


@dataclass(frozen=True)
class Mask:
    """One path inside a work folder that the sandbox sees differently."""

    path: str
    # "hide" (an empty folder / an empty file in its place), "read-only", or "pin" (the
    # folder mounted onto itself: it cannot be renamed, removed or swapped, so what is
    # protected inside it stays where host tools look for it)
    how: str


# Bounds of a scan for protected paths: a work folder may hold millions of files.
SCAN_ENTRIES = 200_000
SCAN_SECONDS = 3.0
MAX_PROTECTED = 200  # masks at most (each is a mount)


@dataclass
class Protection:
    """What of a work folder's protected paths (``protected_paths``) a sandbox gets
    read-only, with the folders on their way pinned; ``complete`` is False when the scan
    stopped at its bounds (a huge folder): deeper matches are then not protected."""

    masks: list[Mask] = field(default_factory=list)
    complete: bool = True
    why: str = ""


def protect(folder: str, patterns: list[str], skip: list[str] | None = None) -> Protection:
    """Find ``patterns`` (see config.PROTECTED_PATHS) at any depth of ``folder`` as it is
    now: each match becomes a read-only mask, and every folder between ``folder`` and it
    a pin (so a match cannot be moved away and replaced). Links are never followed;
    ``skip`` (hidden masks) is not walked; a folder named ``.git`` is entered only along
    the patterns (its objects are not host tools' business)."""
    split = [p.split("/") for p in patterns]
    found: list[str] = []
    protection = Protection()
    skipped = {os.path.normpath(s) for s in skip or []}
    deadline = time.monotonic() + SCAN_SECONDS
    seen = 0
    # (folder, the patterns' states there: (pattern index, names of it matched so far))
    todo: list[tuple[str, frozenset[tuple[int, int]]]] = [(os.path.normpath(folder), frozenset())]
    while todo:
        where, states = todo.pop()
        try:
            entries = list(os.scandir(where))
        except OSError:
            continue
        for entry in entries:
            seen += 1
            if seen > SCAN_ENTRIES or time.monotonic() > deadline:
                protection.complete = False
                protection.why = f"stopped after {seen - 1} entries"
                todo.clear()
                break
            path = os.path.join(where, entry.name)
            matched, next_states = _step(split, states, entry.name)
            if matched:
                found.append(path)
                continue
            if path in skipped or not entry.is_dir(follow_symlinks=False):
                continue
            if entry.name == ".git" and not next_states:
                continue
            todo.append((path, next_states))
    found.sort()
    pins = sorted({a for path in found for a in _between(folder, path)})
    masks = [Mask(p, "pin") for p in pins] + [Mask(p, "read-only") for p in found]
    masks.sort(key=lambda m: m.path)
    if len(masks) > MAX_PROTECTED:
        protection.complete = False
        protection.why = f"more than {MAX_PROTECTED} protected paths"
        masks = masks[:MAX_PROTECTED]
    protection.masks = masks
    return protection


def _step(
    patterns: list[list[str]], states: frozenset[tuple[int, int]], name: str
) -> tuple[bool, frozenset[tuple[int, int]]]:
    """Whether ``name`` completes a pattern here, and the patterns' states beneath it."""
    matched = False
    after: set[tuple[int, int]] = set()
    candidates = {(i, 0) for i in range(len(patterns))} | set(states)
    for index, done in candidates:
        parts = patterns[index]
        if done == len(parts) - 1:
            if fnmatch.fnmatchcase(name, parts[-1]):
                matched = True
        elif name == parts[done]:
            after.add((index, done + 1))
    return matched, frozenset(after)


def _between(folder: str, path: str) -> list[str]:
    """The folders strictly between ``folder`` and ``path``."""
    root = os.path.normpath(folder)
    found = []
    parent = os.path.dirname(path)
    while parent != root and parent.startswith(root + "/"):
        found.append(parent)
        parent = os.path.dirname(parent)
    return found


def resolve_work_folder(setting: str, cwd: str, server_root: str = "") -> str:
    """The work folder for a kernel whose notebook folder is ``cwd`` ("" for none).

    ``setting`` is ``work_root``: "none", "auto" or a folder; ``server_root`` the root
    folder of the Jupyter server that started the kernel, if any.
    """
    if setting == "none":
        return ""
    here = Path(cwd).resolve()
    primary = "" if setting == "auto" else setting
    primary = primary or server_root
    if primary:
        root = Path(primary).expanduser().resolve()
        if here == root or root in here.parents:
            return str(root) if usable(root) else ""
    candidate = git_top(here) or here
    return str(candidate) if usable(candidate) else ""


def primary_folder(setting: str, server_root: str = "") -> str:
    """The folder whose sandbox keeps the plain id ("" when none is known)."""
    if setting == "none":
        return ""
    folder = server_root if setting == "auto" else setting
    return str(Path(folder).expanduser().resolve()) if folder else ""


def usable(folder: Path) -> bool:
    """Not a system folder, not a parent of homes: mounting it would expose too much."""
    if str(folder) in _REFUSED:
        return False
    home = Path.home().resolve()
    return not (folder != home and folder in home.parents)


def git_top(folder: Path) -> Path | None:
    """The top of the git work tree holding ``folder``, found by walking up (no git needed)."""
    for probe in (folder, *folder.parents):
        if (probe / ".git").exists():
            return probe if usable(probe) else None
        if probe == Path.home():
            break
    return None


def folder_tag(folder: str) -> str:
    """The short hash that tells a work folder's sandbox apart (``sk-alice--w<tag>``)."""
    return hashlib.sha256(folder.encode("utf-8", "surrogateescape")).hexdigest()[:8]


def masks(folder: str, never_shown: list[str]) -> list[Mask]:
    """What of ``folder`` the sandbox must not see: ``never_shown`` (the state folder,
    the workspaces root, Jupyter's own folders, this installation's Python and package)
    and, when the folder is a home or holds one, the home's dot-entries (``~/.ssh``,
    ``~/.bashrc`` ...): hidden. What it may see but not change (``protected_paths``) is
    found when the sandbox starts (:func:`protect`)."""
    root = Path(folder)
    home = Path.home().resolve()
    found: list[Mask] = []
    for path in never_shown:
        p = Path(path).resolve()
        if p.exists() and root in p.parents:
            found.append(Mask(str(p), "hide"))
    if home == root or root in home.parents:
        for entry in _entries(home):
            if entry.name.startswith("."):
                found.append(Mask(str(entry), "hide"))
    # Outer masks first; a path inside one already hidden needs nothing more.
    found.sort(key=lambda m: m.path)
    kept: list[Mask] = []
    for mask in found:
        if not any(mask.path.startswith(k.path + "/") and k.how == "hide" for k in kept):
            kept.append(mask)
    return kept


def installation_folders() -> list[str]:
    """This installation's own Python environment and packages: the server and its
    kernels run them, so a sandbox must never change them (they are hidden when a work
    folder holds them, as a checkout with its own .venv or an editable install does)."""
    import sys
    from importlib.util import find_spec

    import sandbox_kernel

    found = [sys.prefix, os.path.dirname(os.path.abspath(sandbox_kernel.__file__))]
    extension = find_spec("jupyter_ext")  # where it is, without importing it (a layer above)
    if extension is not None and extension.submodule_search_locations:
        found.extend(extension.submodule_search_locations)
    return found


def _entries(folder: Path) -> list[Path]:
    try:
        return sorted(folder.iterdir())
    except OSError:
        return []


def jupyter_folders() -> list[str]:
    """Jupyter's own configuration, data and runtime folders (config files a server or
    kernel runs at its next start, kernelspecs, tokens, connection files): never shown."""
    from jupyter_core.paths import jupyter_config_path, jupyter_data_dir, jupyter_runtime_dir

    return [*jupyter_config_path(), jupyter_data_dir(), jupyter_runtime_dir()]


def door_folder(requested: str, server_root: str) -> str:
    """The host folder a request to the Jupyter server may give a sandbox (a kernel's
    folder from its notebook path, a terminal's ``cwd``): ``requested`` with every link
    resolved, which must be the server's root folder or lie inside it (resolved too), as
    everything the server's own file browser may open does.

    Raises :class:`~sandbox_kernel.errors.Forbidden` naming both folders otherwise.
    """
    from .errors import Forbidden

    root = os.path.realpath(server_root)
    here = os.path.realpath(requested)
    if here != root and not here.startswith(root.rstrip("/") + "/"):
        raise Forbidden(
            f"{requested} is outside the Jupyter server's root folder {root}: a sandbox "
            "opened from this server may only mount folders inside it"
        )
    return here


#: Where a kernel started by the provisioner finds its notebook's folder (it runs from
#: "/", never from a folder a sandbox can write: see provisioner.py).
NOTEBOOK_DIR_ENV = "SANDBOX_KERNEL_NOTEBOOK_DIR"


def notebook_folder() -> str:
    """The host folder of this kernel's notebook: what the provisioner passed, else the
    working folder (a kernel started without the provisioner, the CLI)."""
    return os.environ.get(NOTEBOOK_DIR_ENV) or os.getcwd()


def under(path: str, folder: str) -> bool:
    return bool(folder) and (path == folder or path.startswith(folder.rstrip("/") + "/"))


def server_root_dir() -> str:
    """The root folder of the Jupyter server that started this process, if it said so."""
    return os.environ.get("SANDBOX_KERNEL_SERVER_ROOT", "")


__all__ = [
    "NOTEBOOK_DIR_ENV",
    "Mask",
    "Protection",
    "folder_tag",
    "door_folder",
    "git_top",
    "installation_folders",
    "jupyter_folders",
    "masks",
    "notebook_folder",
    "primary_folder",
    "protect",
    "resolve_work_folder",
    "server_root_dir",
    "under",
    "usable",
]
