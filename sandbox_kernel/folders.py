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
(the state folder, the workspaces, the home's dot-folders) are masked, a project's
own dot-entries (``.git`` and its hooks, ``.envrc``, CI files) are mounted read-only,
and the agent forbids making links, FIFOs, sockets and devices beneath it (Landlock).
"""

from __future__ import annotations

import hashlib
import os
from dataclasses import dataclass
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
    how: str  # "hide" (an empty folder / an empty file in its place) | "read-only"


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
    """What of ``folder`` the sandbox must not see, or not change.

    * ``never_shown`` (the state folder, the workspaces root, Jupyter's data and
      runtime folders) and, when the folder is a home or holds one, the home's
      dot-entries (``~/.ssh``, ``~/.bashrc`` ...): hidden;
    * the folder's own dot-entries otherwise (``.git`` with its hooks, ``.envrc``,
      ``.github``): read-only, since host tools act on what they say.
    """
    root = Path(folder)
    home = Path.home().resolve()
    found: list[Mask] = []
    for path in never_shown:
        p = Path(path).resolve()
        if p.exists() and root in p.parents:
            found.append(Mask(str(p), "hide"))
    homes = [home] if (home == root or root in home.parents) else []
    for base in homes:
        for entry in _entries(base):
            if entry.name.startswith("."):
                found.append(Mask(str(entry), "hide"))
    if not homes:
        for entry in _entries(root):
            if entry.name.startswith(".") and not entry.is_symlink():
                found.append(Mask(str(entry), "read-only"))
    # Outer masks first; a path inside one already hidden needs nothing more.
    found.sort(key=lambda m: m.path)
    kept: list[Mask] = []
    for mask in found:
        if not any(mask.path.startswith(k.path + "/") and k.how == "hide" for k in kept):
            kept.append(mask)
    return kept


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
    "folder_tag",
    "door_folder",
    "git_top",
    "jupyter_folders",
    "masks",
    "notebook_folder",
    "primary_folder",
    "resolve_work_folder",
    "server_root_dir",
    "under",
    "usable",
]
