"""Sandbox engines behind one interface (:mod:`.base`); :func:`make_backend` picks one.

Engine modules are imported only when chosen, so a user of the local backend never
pays for the docker or daytona SDKs.
"""

from __future__ import annotations

import contextlib
import importlib

from ..config import SandboxConfig
from .base import (
    Backend,
    Channel,
    EngineSettings,
    EngineUnavailable,
    Ensured,
    ExecResult,
    Health,
    NotSupported,
    SandboxError,
    SandboxFailed,
    SandboxInfo,
    SandboxNotFound,
    installation_id,
)

__all__ = [
    "Backend",
    "Channel",
    "EngineUnavailable",
    "Ensured",
    "ExecResult",
    "Health",
    "NotSupported",
    "SandboxError",
    "SandboxFailed",
    "SandboxInfo",
    "SandboxNotFound",
    "engine_settings",
    "load_adapter",
    "make_backend",
]


def engine_settings(config: SandboxConfig) -> EngineSettings:
    """The part of the installation's settings an engine adapter is given."""
    return EngineSettings(
        installation=installation_id(config.state_dir),
        workspace_root=config.workspace_root,
        state_dir=config.state_dir,
        start_timeout=config.start_timeout,
        idle_stop=config.idle_stop,
        idle_delete=config.idle_delete,
        files_idle_stop=config.files_idle_stop,
    )


def make_backend(config: SandboxConfig) -> Backend:
    """The backend ``config.backend`` names; ``auto`` is docker when an engine answers, else local."""
    choice = config.backend
    settings = engine_settings(config)
    if choice == "auto":
        from .docker import DockerBackend

        docker_backend = DockerBackend(settings)
        try:
            docker_backend.client  # noqa: B018 - connects and pings: one round trip, not health()'s two
            return docker_backend
        except SandboxError:
            choice = "local"
    if choice == "docker":
        from .docker import DockerBackend

        return DockerBackend(settings)
    if choice == "local":
        from .local import LocalBackend

        return LocalBackend(settings)
    if choice == "daytona":
        try:
            from .daytona import DaytonaBackend
        except ImportError as exc:
            raise EngineUnavailable(
                "the daytona backend needs the daytona SDK: pip install 'sandbox-kernel[daytona]'"
                f" ({exc})"
            ) from exc
        return DaytonaBackend(settings)
    raise SandboxError(f"unknown backend {choice!r}")


#: The module of each engine adapter, by the setting that names it (auto tries docker first).
_ADAPTERS = {"auto": "docker", "docker": "docker", "local": "local", "daytona": "daytona"}


def load_adapter(config: SandboxConfig) -> None:
    """Import the adapter ``config.backend`` names, without connecting to anything.

    A kernel's start imports ipykernel in its main thread while another thread reaches
    the sandbox; the engine's own work (a container start) overlaps the first, but
    importing the adapter in that thread competes with it for the interpreter's lock,
    and that delays every engine call after it. Imported first, before the thread, it
    took 30 to 50 ms off a start with no sandbox yet (``benchmarks/run.py``). Whatever
    fails here (a missing or broken SDK) is left for :func:`make_backend` to report,
    where the first cell says it.
    """
    module = _ADAPTERS.get(config.backend)
    if module is not None:
        with contextlib.suppress(Exception):
            importlib.import_module(f"{__name__}.{module}")
