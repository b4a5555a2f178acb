"""What the orchestrator tells a user about their sandbox, one line each: it restarted
after running out of memory, it got fewer CPUs than its flavor, its disk after a resize,
what a remake keeps, and why it is outdated and what to do.
"""

from __future__ import annotations

from .backends import Backend
from .backends.base import LOST_NOTICE, SandboxInfo, Spec, mapped_volumes
from .units import cpus_words, format_size
from .volumes import described


def stopped(info: SandboxInfo) -> str:
    """What a user must hear when their stopped sandbox starts again ("": nothing)."""
    previous = info.exit_reason
    if previous.startswith("out of memory"):
        return f"sandbox restarted: {LOST_NOTICE} ({info.id} had stopped: {previous})"
    return ""


def remake_words(backend: Backend) -> str:
    """What a remake keeps, as listings promise it before it happens."""
    if backend.keeps_files_on_remake:
        return "its files and installed packages are kept"
    return (
        f"its own files (installed packages) are not kept: the {backend.name} backend "
        "cannot add folders to a sandbox; /workspace is kept"
    )


def clamped(info: SandboxInfo, spec: Spec) -> str:
    """What a sandbox got less of than its flavor says (the engine's machine has
    fewer CPUs), in one line; "" when it got all of it."""
    cpus = float(info.limits.get("cpus") or spec.cpus)
    if cpus >= spec.cpus:
        return ""
    return (
        f"flavor {spec.flavor} asks for {cpus_words(spec.cpus)}, but the engine's machine has "
        f"{cpus:g}: {info.id} gets {cpus:g}"
    )


def resized(now: SandboxInfo, spec: Spec, had: str) -> str:
    """What a sandbox got from a resize to ``spec``'s flavor (``now``: as it is after it;
    ``had``: its flavor before), in one line."""
    cpus = float(now.limits.get("cpus") or spec.cpus)
    got = cpus_words(cpus) + (
        f" (flavor {spec.flavor} asks for {spec.cpus:g}; the engine's machine has {cpus:g})"
        if cpus < spec.cpus
        else ""
    )
    return (
        f"sandbox {now.id} now has flavor {spec.flavor} ({got}, {format_size(spec.memory)}"
        f"{disk_words(now, spec)}; it had {had})"
    )


def disk_words(info: SandboxInfo, spec: Spec) -> str:
    """What a resize did to the sandbox's disk, in a few words."""
    disk = int(info.limits.get("disk") or 0)
    if not disk or not spec.disk:
        return ""  # not bounded: listings say why
    if disk >= spec.disk:
        kept = (
            f"; its disk stays {format_size(disk)}: disks never shrink" if disk > spec.disk else ""
        )
        return f", {format_size(spec.disk)} of disk{kept}"
    if "grows" in info.disk_note:
        return f"; {info.disk_note}"
    return f"; its disk stays {format_size(disk)}: the engine cannot grow it"


def outdated(info: SandboxInfo, spec: Spec, remade_at_start: bool, backend: Backend) -> str:
    """Why the sandbox ``info`` is not what ``spec`` would make now, and what to do: it is
    made anew at its next start (``remade_at_start``: only its mapped folders differ),
    it lacks the work folder, or it was made from other settings."""
    if info.state == "running" and remade_at_start:
        return (
            f"sandbox {info.id} maps {described(mapped_volumes(info))}; the folders mapped now "
            f"are {described(spec.volumes)}: it is made anew with them at its next start "
            f"({remake_words(backend)}); `sandbox-kernel stop {info.id}` to get there sooner"
        )
    if spec.work_folder and info.work_folder != spec.work_folder:
        return (
            f"sandbox {info.id} was made without your folder {spec.work_folder}, so cells run in "
            f"/workspace; to work beside your notebook, destroy it (`sandbox-kernel destroy {info.id}`, "
            "the workspace is kept) and restart the kernel"
        )
    return (
        f"sandbox {info.id} was made from {info.image or 'other settings'}; your settings now make "
        f"{spec.source}: files and packages stay until you destroy it (`sandbox-kernel destroy {info.id}`, "
        "the workspace is kept)"
    )
