"""The environment of the processes the host starts in a Docker sandbox: the image's PATH
without the folders the sandbox's own processes can write, so a program the host runs
there is never one a cell planted."""

from __future__ import annotations

from typing import Any

from ..base import WORKSPACE

HOME = "/home/sandbox"
DEFAULT_PATH = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"
# Folders of a sandbox that its processes can write: never on the PATH that finds the
# host's programs (a cell could plant a `python3` there; see agent.program).
WRITABLE = (HOME, WORKSPACE, "/tmp", "/var/tmp", "/dev/shm")


def sandbox_path(path: str) -> str:
    """``path`` without the folders the sandbox's processes can write, nor relative
    entries (an empty one is the working folder): what finds the programs the host
    starts there. A sandbox made by an older version, or from a snapshot of one, has
    ``~/.local/bin`` first in its environment."""
    kept = [
        entry
        for entry in path.split(":")
        if entry.startswith("/")
        and not any(entry == top or entry.startswith(top + "/") for top in WRITABLE)
    ]
    return ":".join(kept) or DEFAULT_PATH


def exec_env(attrs: dict[str, Any], env: dict[str, str] | None = None) -> dict[str, str]:
    """The environment of a process the host starts in a container (``attrs``: its
    inspect): the container's PATH made safe (:func:`sandbox_path`), then ``env``."""
    return {"PATH": sandbox_path(env_of(attrs).get("PATH", DEFAULT_PATH)), **(env or {})}


def path_of(attrs: dict[str, Any]) -> str:
    """The PATH that finds an image's (or a container's) programs, made safe."""
    return sandbox_path(env_of(attrs).get("PATH", DEFAULT_PATH))


def env_of(attrs: dict[str, Any]) -> dict[str, str]:
    """The environment an image's or a container's inspect (``attrs``) declares."""
    items = (attrs.get("Config") or {}).get("Env") or []
    return dict(item.split("=", 1) for item in items if "=" in item)
