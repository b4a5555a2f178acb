"""The environment of the processes the host starts in a Docker sandbox: the image's PATH
without the folders the sandbox's own processes can write, so a program the host runs
there is never one a cell planted."""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

from ...trust import named_env, trust_env
from ..base import WORKSPACE
from .info import LABEL_TRUST

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


def sandbox_environment(path: str, trusted: bool) -> dict[str, str]:
    """The environment a new container declares: its user, ``path`` (made safe), and,
    when it gets the certificate bundle (``trusted``), the variables that name it."""
    return {
        "HOME": HOME,
        "USER": "sandbox",
        "LOGNAME": "sandbox",
        # The user's ~/.local/bin is put first by what runs their code (the agent for
        # cells; agent.as_user for their commands), never here.
        "PATH": path,
        # pip falls back to a user install (HOME, kept until destroy) as non-root;
        # Debian-based images refuse even that without this switch.
        "PIP_BREAK_SYSTEM_PACKAGES": "1",
        "PYTHONUNBUFFERED": "1",
        # The certificates sandboxes trust (see trust.py), for every program there.
        **(trust_env() if trusted else {}),
    }


def process_env(
    attrs: dict[str, Any],
    passed: Iterable[tuple[str, str]],
    ca_bundle: str,
    env: dict[str, str] | None,
) -> dict[str, str]:
    """What a process started in a container (``attrs``: its inspect) gets besides the
    container's own environment: the variables sandboxes inherit (``passed``, from
    ``pass_env``) and, where an administrator named a ``ca_bundle``, those that make it
    the trust store of pip, requests, curl and git; never one the container sets itself
    (an egress sandbox's proxy is its only way out); then ``env``."""
    own = env_of(attrs)
    inherited = dict(passed)
    labels = (attrs.get("Config") or {}).get("Labels") or {}
    if labels.get(LABEL_TRUST) and ca_bundle not in ("", "none"):
        inherited.update(named_env())  # an administrator's bundle: the store, over all else
    return {**{k: v for k, v in inherited.items() if k not in own}, **(env or {})}
