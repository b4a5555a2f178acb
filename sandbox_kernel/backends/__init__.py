"""Sandbox engines behind one interface (:mod:`.base`); :func:`make_backend` picks one.

Engine modules are imported only when chosen, so a user of the local backend never
pays for the docker or daytona SDKs.
"""

from __future__ import annotations

import contextlib
import importlib

from ..config import ENGINE_ENTRY_POINTS, ENGINES, SandboxConfig
from ..trust import passed_env
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
    "backend_class",
    "engine_names",
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
        protected_paths=tuple(config.protected_paths),
        kubernetes_namespace=config.kubernetes_namespace,
        kubernetes_storage_class=config.kubernetes_storage_class,
        kubernetes_workspace_size=config.kubernetes_workspace_size,
        ca_bundle=config.ca_bundle,
        env=tuple(sorted(passed_env(config).items())),
    )


#: The engines this package brings (config.ENGINES), by the name ``backend`` takes.
BUILTIN = {
    "docker": "sandbox_kernel.backends.docker:DockerBackend",
    "local": "sandbox_kernel.backends.local:LocalBackend",
    "daytona": "sandbox_kernel.backends.daytona:DaytonaBackend",
    "kubernetes": "sandbox_kernel.backends.kubernetes:KubernetesBackend",
}
assert tuple(BUILTIN) == ENGINES
#: The entry-point group through which another package adds an engine: a name and a
#: :class:`~.base.Backend` subclass (``mypkg.engine:MyBackend``), made with an
#: :class:`~.base.EngineSettings`.
ENTRY_POINTS = ENGINE_ENTRY_POINTS
#: What an engine's missing SDK should say to install.
_EXTRAS = {
    "daytona": "pip install 'sandbox-kernel[daytona]'",
    "kubernetes": "pip install 'sandbox-kernel[kubernetes]'",
}


def engine_names() -> list[str]:
    """Every engine ``backend`` may name: ours, then those other packages register."""
    from importlib.metadata import entry_points

    others = sorted(ep.name for ep in entry_points(group=ENTRY_POINTS) if ep.name not in BUILTIN)
    return [*BUILTIN, *others]


def _target(name: str) -> str:
    """ "module:class" of engine ``name`` (ours without reading package metadata, which
    costs a kernel's start 10-20 ms)."""
    if name in BUILTIN:
        return BUILTIN[name]
    from importlib.metadata import entry_points

    for ep in entry_points(group=ENTRY_POINTS, name=name):
        return str(ep.value)
    raise SandboxError(
        f"unknown backend {name!r}: use auto or one of {', '.join(engine_names())} "
        f"(other packages add engines through the {ENTRY_POINTS!r} entry points)"
    )


def backend_class(name: str) -> type[Backend]:
    """The adapter class of engine ``name``; a missing SDK is one line saying what to install."""
    module_name, _, class_name = _target(name).partition(":")
    try:
        module = importlib.import_module(module_name)
    except ImportError as exc:
        hint = _EXTRAS.get(name, f"install the package that provides the {name} engine")
        raise EngineUnavailable(f"the {name} backend cannot be loaded ({exc}): {hint}") from exc
    found = getattr(module, class_name, None)
    if not (isinstance(found, type) and issubclass(found, Backend)):
        raise SandboxError(f"the {name} engine ({_target(name)}) is not a sandbox-kernel Backend")
    return found


def make_backend(config: SandboxConfig) -> Backend:
    """The backend ``config.backend`` names; ``auto`` is docker when an engine answers, else local."""
    settings = engine_settings(config)
    if config.backend != "auto":
        return backend_class(config.backend)(settings)
    docker_backend = backend_class("docker")(settings)
    try:
        docker_backend.client  # type: ignore[attr-defined]  # noqa: B018 - connects and pings once
        return docker_backend
    except SandboxError as exc:
        local = backend_class("local")(settings)
        local.fallback = _first_words(str(exc))
        return local


def _first_words(message: str) -> str:
    """The reason of an engine's one-line error, without its advice (after a ';')."""
    return message.splitlines()[0].split(";")[0].strip() if message else "no answer"


def load_adapter(config: SandboxConfig) -> None:
    """Import the adapter ``config.backend`` names, without connecting to anything.

    A kernel's start imports ipykernel in its main thread while another thread reaches
    the sandbox; the engine's own work (a container start) overlaps the first, but
    importing the adapter in that thread competes with it for the interpreter's lock,
    and that delays every engine call after it. Whatever fails here (a missing or
    broken SDK) is left for :func:`make_backend` to report, where the first cell says it.
    """
    with contextlib.suppress(Exception):
        backend_class("docker" if config.backend == "auto" else config.backend)
