"""Sandbox engines behind one interface (:mod:`.base`); :func:`make_backend` picks one.

Engine modules are imported only when chosen, so a user of the local backend never
pays for the docker or daytona SDKs.
"""

from __future__ import annotations

from ..config import SandboxConfig
from .base import (
    Backend,
    Channel,
    EngineUnavailable,
    Ensured,
    ExecResult,
    Health,
    NotSupported,
    SandboxError,
    SandboxFailed,
    SandboxInfo,
    SandboxNotFound,
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
    "make_backend",
]


def make_backend(config: SandboxConfig) -> Backend:
    """The backend ``config.backend`` names; ``auto`` is docker when an engine answers, else local."""
    choice = config.backend
    if choice == "auto":
        from .docker import DockerBackend

        docker_backend = DockerBackend(config)
        if docker_backend.health().ok:
            return docker_backend
        choice = "local"
    if choice == "docker":
        from .docker import DockerBackend

        return DockerBackend(config)
    if choice == "local":
        from .local import LocalBackend

        return LocalBackend(config)
    if choice == "daytona":
        try:
            from .daytona import DaytonaBackend
        except ImportError as exc:
            raise EngineUnavailable(
                "the daytona backend needs the daytona SDK: pip install 'sandbox-kernel[daytona]'"
                f" ({exc})"
            ) from exc
        return DaytonaBackend(config)
    raise SandboxError(f"unknown backend {choice!r}")
