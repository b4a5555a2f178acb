"""An administrator's folders in every sandbox: the mappings of ``c.SandboxConfig.volumes``.

A mapping is ``SOURCE:TARGET`` or ``SOURCE:TARGET:MODE``:

* ``SOURCE`` is a host folder (an absolute path: Docker and the local backend bind it)
  or an engine's own volume by name (Daytona, which cannot mount this host's folders);
* ``TARGET`` is where every sandbox sees it (an absolute path);
* ``MODE`` is ``ro`` (the default) or ``rw``.

A writable mapping is hostile ground like the work folder: every sandbox it is mapped
into writes it, and host tools read it. The engines give it the work folder's
protections (no links, FIFOs, sockets or devices made beneath it, no setuid bits, the
protected paths read-only, idmapped for a root server), and only the host file system's
own quota bounds it. Mappings that would expose what no sandbox may see (the state
folder, the workspaces, Jupyter's own folders, the server user's home) or hide what a
sandbox needs (its system folders, ``/workspace``, its home) are refused here, each in
one line naming the mapping.

Nothing here imports the rest of sandbox-kernel: the settings (``config``) check their
values with it, and everything above reads :class:`Volume`.
"""

from __future__ import annotations

import json
import os
import re
import sys
from collections.abc import Iterable
from dataclasses import dataclass
from importlib.util import find_spec

READ_ONLY, WRITABLE = "ro", "rw"
MODES = (READ_ONLY, WRITABLE)
#: An engine's volume by name (Daytona): letters, digits, '.', '_', '-'.
VOLUME_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.-]{0,62}")
EXAMPLE = "/data/corpora:/data:ro"

# Where a mapping may not appear in a sandbox: its system folders (and anything beneath
# them), and folders it needs as they are.
SYSTEM_TARGETS = (
    "/bin",
    "/boot",
    "/dev",
    "/etc",
    "/lib",
    "/lib32",
    "/lib64",
    "/libx32",
    "/proc",
    "/run",
    "/sbin",
    "/sys",
    "/usr",
    "/var",
)
EXACT_TARGETS = {
    "/": "the sandbox's root",
    "/home": "the folder of the sandbox's home",
    "/home/sandbox": "the sandbox's home (its installed packages live there)",
    "/tmp": "the sandbox's own scratch folder",
}
WORKSPACE = "/workspace"
SHARED = "/shared"

# Host folders no mapping may show, whatever its mode (a read-only mount still lets a
# sandbox connect to a socket in it, such as the engine's own), and why.
HOST_SOURCES = {
    "/proc": "the kernel's interfaces",
    "/sys": "the kernel's interfaces",
    "/dev": "the host's devices",
    "/run": "the host's runtime folder (the engine's socket)",
    "/var/run": "the host's runtime folder (the engine's socket)",
    "/boot": "the host's boot files",
    "/etc": "the host's configuration",
    "/var/lib": "the state of the host's services (the engine's containers)",
}
# ... and those no sandbox may write: the host's programs.
PROGRAM_SOURCES = ("/usr", "/bin", "/sbin", "/lib", "/lib32", "/lib64", "/libx32")


class VolumeError(ValueError):
    """A mapping that cannot be used; the message names it and says what to do."""


@dataclass(frozen=True)
class Volume:
    """One mapping: ``source`` (a host folder, or an engine's volume by name) seen at
    ``target`` in every sandbox, ``ro`` or ``rw``."""

    source: str
    target: str
    mode: str = READ_ONLY

    @property
    def writable(self) -> bool:
        return self.mode == WRITABLE

    @property
    def on_host(self) -> bool:
        """A host folder (else an engine's volume by name)."""
        return self.source.startswith("/")

    def __str__(self) -> str:
        return f"{self.source}:{self.target}:{self.mode}"

    def to_dict(self) -> dict[str, str]:
        """As listings carry it: where it comes from, where it is seen, and how."""
        return {
            "source": self.source,
            "target": self.target,
            "mode": self.mode,
            "kind": "host folder" if self.on_host else "volume",
        }


def _under(path: str, folder: str) -> bool:
    """``path`` is ``folder`` or lies beneath it."""
    return path == folder or path.startswith(folder.rstrip("/") + "/")


def _overlap(one: str, two: str) -> bool:
    """One of the two is the other or lies beneath it."""
    return _under(one, two) or _under(two, one)


def _clean_path(text: str, what: str, shown: str) -> str:
    if not text.startswith("/"):
        raise VolumeError(f"mapping {shown!r}: {what} {text!r} is not an absolute path")
    if any(part in (".", "..") for part in text.split("/")) or "\0" in text:
        raise VolumeError(f"mapping {shown!r}: write {what} {text!r} without '.' or '..'")
    return os.path.normpath(text).replace("//", "/")


def parse(text: object) -> Volume:
    """One mapping as written (``SOURCE:TARGET[:MODE]``), checked alone: its syntax, its
    mode, where it appears in the sandbox, and what of this host it shows. A host
    folder must exist; it is given with every link resolved. Raises
    :class:`VolumeError` naming the mapping."""
    if not isinstance(text, str):
        raise VolumeError(f"mapping {text!r} is not text: write it as '{EXAMPLE}'")
    shown = text
    parts = text.strip().split(":")
    if len(parts) not in (2, 3) or not all(parts):
        raise VolumeError(
            f"mapping {shown!r} is not host_dir:sandbox_dir[:ro|rw] (e.g. '{EXAMPLE}')"
        )
    mode = parts[2] if len(parts) == 3 else READ_ONLY
    if mode not in MODES:
        raise VolumeError(f"mapping {shown!r}: mode {mode!r} is neither ro nor rw")
    target = _clean_path(parts[1], "sandbox folder", shown)
    if target in EXACT_TARGETS:
        raise VolumeError(
            f"mapping {shown!r}: {target} is {EXACT_TARGETS[target]}; map it elsewhere (e.g. /data)"
        )
    for folder in SYSTEM_TARGETS:
        if _under(target, folder):
            raise VolumeError(
                f"mapping {shown!r}: {target} is in {folder}, a system folder of the sandbox; "
                "map it elsewhere (e.g. /data)"
            )
    if _under(target, WORKSPACE):
        raise VolumeError(
            f"mapping {shown!r}: {target} is in /workspace, the user's own workspace; map it "
            "elsewhere (e.g. /data)"
        )
    source = parts[0]
    if not source.startswith("/"):
        if not VOLUME_NAME.fullmatch(source):
            raise VolumeError(
                f"mapping {shown!r}: {source!r} is neither a host folder (an absolute path) nor "
                "a volume name (letters, digits, '.', '_', '-')"
            )
        return Volume(source, target, mode)
    source = _clean_path(source, "host folder", shown)
    if not os.path.isdir(source):
        raise VolumeError(
            f"mapping {shown!r}: host folder {source} does not exist; create it or remove the mapping"
        )
    source = os.path.realpath(source)
    if source == "/":
        raise VolumeError(f"mapping {shown!r}: / is the whole host; map one of its folders")
    refused = dict(HOST_SOURCES)
    if mode == WRITABLE:
        refused.update(
            {f: "the host's programs, which no sandbox may write" for f in PROGRAM_SOURCES}
        )
    for folder, what in refused.items():
        if _overlap(source, folder):
            where = "is" if source == folder else "is in" if _under(source, folder) else "holds"
            raise VolumeError(f"mapping {shown!r}: {source} {where} {folder}, {what}")
    return Volume(source, target, mode)


@dataclass(frozen=True)
class Guard:
    """A host folder no mapping may show (be, lie in or hold), and why."""

    folder: str
    why: str
    writable_only: bool = False  # only writable mappings are refused
    beneath_ok: bool = False  # a mapping beneath it is fine (a home: only its dot-entries)


def guards(state_dir: str, workspace_root: str) -> list[Guard]:
    """What no mapping may show on this host: the state folder, the workspaces root (and
    every user's workspace in it), Jupyter's own folders, the server user's home (its
    dot-folders hold its keys), and, for a writable mapping, this installation's Python."""
    from jupyter_core.paths import jupyter_config_path, jupyter_data_dir, jupyter_runtime_dir

    found = [
        Guard(state_dir, "the state folder (every sandbox's records and disks)"),
        Guard(workspace_root, "the workspaces root (every user's workspace)"),
    ]
    for folder in [*jupyter_config_path(), jupyter_data_dir(), jupyter_runtime_dir()]:
        found.append(Guard(folder, "a folder of Jupyter's own (its config, kernels, tokens)"))
    home = os.path.expanduser("~")
    if home not in ("/", ""):
        found.append(Guard(home, "the server user's home", beneath_ok=True))
    installation = [sys.prefix, os.path.dirname(os.path.abspath(__file__))]
    extension = find_spec("jupyter_ext")
    if extension is not None and extension.submodule_search_locations:
        installation.extend(extension.submodule_search_locations)
    for folder in installation:
        found.append(Guard(folder, "this installation's own Python", writable_only=True))
    return [Guard(os.path.realpath(g.folder), g.why, g.writable_only, g.beneath_ok) for g in found]


def check(volumes: Iterable[Volume], guarded: list[Guard], shared_folder: str = "") -> None:
    """The mappings together, against what this host guards: none shows a guarded
    folder, no two appear at overlapping places, no writable one overlaps another's
    source (a read-only mapping would not be read-only in effect), none clashes with
    the shared folder. Raises :class:`VolumeError` naming the mapping."""
    given = list(volumes)
    for volume in given:
        if not volume.on_host:
            continue
        for guard in guarded:
            if guard.writable_only and not volume.writable:
                continue
            if guard.beneath_ok:
                inside = volume.source.startswith(guard.folder.rstrip("/") + "/")
                dot = inside and volume.source[len(guard.folder.rstrip("/")) + 1 :].startswith(".")
                if not _under(guard.folder, volume.source) and not dot:
                    continue
            elif not _overlap(volume.source, guard.folder):
                continue
            seen = (
                f"is in the dot-folders of {guard.folder}, {guard.why} (its keys and tokens)"
                if guard.beneath_ok and not _under(guard.folder, volume.source)
                else f"shows {guard.folder}, {guard.why}"
            )
            raise VolumeError(
                f"mapping '{volume}': {volume.source} {seen}, which no sandbox may see; map a "
                "folder apart from it"
            )
        if shared_folder and volume.writable and _overlap(volume.source, shared_folder):
            raise VolumeError(
                f"mapping '{volume}' is writable and overlaps the read-only shared folder "
                f"{shared_folder}; map folders apart"
            )
        if shared_folder and _overlap(volume.target, SHARED):
            raise VolumeError(
                f"mapping '{volume}': {volume.target} overlaps {SHARED}, where the shared folder "
                "is mounted; map it elsewhere"
            )
    for index, one in enumerate(given):
        for two in given[index + 1 :]:
            if _overlap(one.target, two.target):
                raise VolumeError(
                    f"mappings '{one}' and '{two}' appear at overlapping places; give each a "
                    "folder of its own"
                )
            if (
                one.on_host
                and two.on_host
                and (one.writable or two.writable)
                and _overlap(one.source, two.source)
            ):
                raise VolumeError(
                    f"mappings '{one}' and '{two}' show overlapping host folders and one is "
                    "writable; map folders apart"
                )


def check_work_folder(volumes: Iterable[Volume], work_folder: str) -> None:
    """The mappings against a kernel's work folder (mounted at its own path): none
    appears over or inside it, and no writable one shows it (it would write a work
    folder mounted read-only, or its protected paths elsewhere). Raises
    :class:`VolumeError` naming the mapping."""
    if not work_folder:
        return
    for volume in volumes:
        if _overlap(volume.target, work_folder):
            raise VolumeError(
                f"mapping '{volume}': {volume.target} overlaps your work folder {work_folder}, "
                "mounted at its own path; ask the administrator to map it elsewhere, or work "
                "from another folder"
            )
        if volume.on_host and volume.writable and _overlap(volume.source, work_folder):
            raise VolumeError(
                f"mapping '{volume}' is writable and shows your work folder {work_folder}; "
                "work from another folder, or ask the administrator to map it read-only"
            )


def to_label(volumes: Iterable[Volume]) -> str:
    """The mappings as a sandbox's label carries them ("" for none)."""
    given = [str(v) for v in volumes]
    return json.dumps(given) if given else ""


def from_label(text: str) -> tuple[Volume, ...]:
    """The mappings a sandbox's label says it was made with (none when unreadable)."""
    if not text:
        return ()
    try:
        items = json.loads(text)
    except ValueError:
        return ()
    found = []
    for item in items if isinstance(items, list) else []:
        parts = str(item).rsplit(":", 2)
        if len(parts) == 3 and parts[2] in MODES:
            found.append(Volume(parts[0], parts[1], parts[2]))
    return tuple(found)


def described(volumes: Iterable[Volume]) -> str:
    """The mappings in a few words, for messages ("none" when there are none)."""
    return ", ".join(f"{v.target} ({v.mode})" for v in volumes) or "none"
