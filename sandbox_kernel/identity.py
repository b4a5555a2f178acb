"""Who owns a sandbox and which notebook a kernel belongs to.

Every process (kernel, CLI, server extension) derives the same :class:`ScopeKey` from
the same inputs, and the backends find sandboxes again by it; that is what lets them
agree without a shared process.

Engine names must be short and ASCII, but user names and notebook paths are not:
:func:`safe_id` maps any name to an id that is stable, engine-safe and injective
(a name that is already safe is kept as is, any other gets a hash suffix marked by
``--``, which a kept name can never contain).
"""

from __future__ import annotations

import getpass
import hashlib
import json
import os
import re
import unicodedata
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from .config import ConfigError, SandboxConfig

_SAFE = re.compile(r"[a-z0-9][a-z0-9_.-]{0,39}")
NAME_PREFIX = "sk-"


def _digest(text: str, length: int = 12) -> str:
    return hashlib.sha256(text.encode("utf-8", "surrogatepass")).hexdigest()[:length]


def safe_id(name: str) -> str:
    """An engine-safe, stable id for ``name``; different names never share one."""
    if _SAFE.fullmatch(name) and "--" not in name and not name.endswith((".", "-")):
        return name
    ascii_name = unicodedata.normalize("NFKD", name).encode("ascii", "ignore").decode().lower()
    slug = re.sub(r"[^a-z0-9]+", "-", ascii_name).strip("-")[:20].strip("-") or "x"
    return f"{slug}--{_digest(name)}"


def thread_id(thread: str) -> str:
    """A short id of a notebook identity; always a hash so paths of any length fit."""
    return "t" + _digest(thread)


#: Set by the server extension in its own environment when it gives each request's user
#: their own sandboxes (``owner_from = "request"``); its kernels and terminals inherit it.
OWNER_FROM_ENV = "SANDBOX_KERNEL_OWNER_FROM"


def resolve_user(cfg: SandboxConfig) -> str:
    """The owner: SANDBOX_KERNEL_USER (cfg.user), else KERNEL_USERNAME (the user a kernel
    gateway or our provisioner started the kernel for), else JUPYTERHUB_USER, else the
    OS user.

    On a server with several users the OS user is the server's own, shared by all of
    them: a process started there without a user (a kernelspec that does not use our
    provisioner, a host terminal) must not fall back to it, or every user would land in
    one sandbox.
    """
    if cfg.user:
        return cfg.user
    for name in ("KERNEL_USERNAME", "JUPYTERHUB_USER"):
        if os.environ.get(name):
            return os.environ[name]
    if os.environ.get(OWNER_FROM_ENV) == "request":
        raise ConfigError(
            "this server gives every user their own sandbox, but this process was started "
            "without one: start kernels through the server with the 'sandbox' kernelspec (its "
            "provisioner passes the user on), or set SANDBOX_KERNEL_USER"
        )
    try:
        return getpass.getuser()
    except Exception:  # no passwd entry (containers): the uid still names someone
        return f"uid{os.getuid()}"


def _session_path(session_name: str) -> Path:
    """The notebook JPY_SESSION_NAME names: a path relative to the server's root folder
    when the server had no notebook name to join it with."""
    path = Path(session_name).expanduser()
    root = os.environ.get("SANDBOX_KERNEL_SERVER_ROOT", "")
    return path if path.is_absolute() or not root else Path(root, path)


def notebook_metadata(session_name: str | None) -> dict[str, Any]:
    """``metadata.sandbox`` of the notebook JPY_SESSION_NAME points to ({} if none)."""
    if not session_name:
        return {}
    path = _session_path(session_name)
    try:
        if path.suffix == ".ipynb" and path.is_file() and path.stat().st_size < 64 << 20:
            meta = json.loads(path.read_text("utf-8")).get("metadata", {}).get("sandbox") or {}
            return meta if isinstance(meta, dict) else {}
    except (OSError, ValueError, AttributeError):
        pass
    return {}


def notebook_thread(session_name: str | None) -> str | None:
    """The stable notebook identity for ``scope=thread``, if one can be found.

    A notebook may carry ``metadata.sandbox.thread`` (stable across renames and
    copies that keep it); otherwise its resolved path stands in. JPY_SESSION_NAME is
    only a hint (it can be a temporary path and goes stale on rename), so we read the
    notebook it points to rather than trusting the name alone.
    """
    if not session_name:
        return None
    path = _session_path(session_name)
    thread = notebook_metadata(session_name).get("thread")
    if isinstance(thread, str) and thread:
        return thread
    return str(path.resolve()) if path.exists() else session_name


def resolve_thread(cfg: SandboxConfig, kernel_id: str | None = None) -> str:
    """SANDBOX_KERNEL_THREAD, else the notebook's stable identity, else the kernel id."""
    if cfg.thread:
        return cfg.thread
    found = notebook_thread(os.environ.get("JPY_SESSION_NAME"))
    if found:
        return found
    if kernel_id:
        return kernel_id
    return f"pid{os.getpid()}"


@dataclass(frozen=True)
class ScopeKey:
    """Which sandbox a caller means: a user's, or one notebook of a user's."""

    user: str
    scope: str = "user"
    thread: str = ""

    @property
    def user_id(self) -> str:
        """Engine-safe id of the owner; also the name of the user's workspace folder."""
        return safe_id(self.user)

    @property
    def name(self) -> str:
        """The deterministic sandbox name every process computes the same way."""
        if self.scope == "thread":
            return f"{NAME_PREFIX}{self.user_id}--{thread_id(self.thread)}"
        return f"{NAME_PREFIX}{self.user_id}"


def scope_key(cfg: SandboxConfig, kernel_id: str | None = None) -> ScopeKey:
    """The scope key of the current process under ``cfg``."""
    user = resolve_user(cfg)
    if cfg.scope == "thread":
        return ScopeKey(user=user, scope="thread", thread=resolve_thread(cfg, kernel_id))
    return ScopeKey(user=user)
