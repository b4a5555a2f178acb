"""The kernelspec's provisioner: launch the kernel over IPC in a private folder.

Why: jupyter_client picks five free TCP ports, closes them and hands their numbers to
the kernel, which binds them a moment later. Twenty clients starting kernels at once
(a CI matrix on one runner) race for the same numbers: a kernel dies with ``Address
already in use``, or a client connects to another kernel's port. Unix sockets in a
folder only this kernel's manager created cannot collide, and nobody else on the
machine can connect to them (the folder is 0700; TCP on loopback is open to every
local user, guarded only by the message key).

Every client that starts kernels by name (jupyter execute, nbclient, papermill, nbmake,
nbval, testbook, JupyterLab) reads ``metadata.kernel_provisioner`` from the kernelspec,
so none of them needs to change. Managers that ask for something other than TCP on a
loopback address (a kernel meant to be reached from another host, or an IPC folder of
their own) get exactly what they asked for, as does ``"config": {"transport": "tcp"}``
in the kernelspec's provisioner entry.

On a server with several users (``owner_from = "request"``) the provisioner also says
whose sandbox the kernel uses: the user of the request that started it (see
:func:`requesting_user`), passed on as ``KERNEL_USERNAME`` the way Enterprise
Gateway does, over anything the kernelspec's environment says.
"""

from __future__ import annotations

import os
import shutil
import tempfile
from typing import Any

from jupyter_client.localinterfaces import is_local_ip
from jupyter_client.provisioning import LocalProvisioner
from jupyter_core.paths import jupyter_runtime_dir
from traitlets import Float, Unicode

from .errors import Forbidden
from .folders import NOTEBOOK_DIR_ENV, door_folder, server_root_dir
from .identity import OWNER_FROM_ENV
from .kernelspec import SAFE_PATH_ENV

#: The longest ``{folder}/k-{n}`` a Unix socket address can hold (108 bytes on Linux,
#: less on macOS), with room for the socket number.
_SOCKET_PATH_ROOM = 90


def private_socket_folder() -> str:
    """A new 0700 folder for one kernel's sockets, in Jupyter's runtime folder if a
    socket path there fits, else in the temporary folder (pytest's or a CI runner's
    runtime folder can be long)."""
    for parent in (jupyter_runtime_dir(), tempfile.gettempdir()):
        if len(os.path.join(parent, "sk-xxxxxxxx", "k-99999")) > _SOCKET_PATH_ROOM:
            continue
        try:
            os.makedirs(parent, mode=0o700, exist_ok=True)
            return tempfile.mkdtemp(prefix="sk-", dir=parent)  # 0700, a name nobody had
        except OSError:
            continue
    raise RuntimeError(
        "no folder for the kernel's sockets: the Jupyter runtime folder and the temporary "
        "folder are not writable or their paths are too long; set JUPYTER_RUNTIME_DIR to "
        "a short writable folder"
    )


class SandboxProvisioner(LocalProvisioner):
    """A local provisioner that switches the kernel's transport from TCP to IPC."""

    transport = Unicode(
        "ipc",
        config=True,
        help="'ipc' (the default): sockets in a private folder; 'tcp': what the client asked for.",
    )

    shutdown_wait = Float(
        60.0,
        config=True,
        help=(
            "Seconds a kernel that copies its notebook's folder (a backend without host "
            "folders: Kubernetes, Daytona) has, once asked to shut down, to end by itself "
            "before it is stopped (after half of them) and killed: it first copies what the "
            "cells wrote beside the notebook back, through the engine. The client's own "
            "wait (shutdown_wait_time, 5 s by default, which would cut that copy short at "
            "2.5 s) wins when it is longer, and is all other kernels get."
        ),
    )

    _socket_folder: str | None = None
    _owner: str | None = None  # the user a server with several users started it for
    _copies_folder = False  # the kernel copies its notebook's folder back at shutdown

    async def pre_launch(self, **kwargs: Any) -> dict[str, Any]:
        """Point the manager at a private socket folder before LocalProvisioner writes
        the connection file. On a restart the manager still holds the folder and its
        socket numbers, so the kernel comes back at the same addresses."""
        km = self.parent
        if km is not None and self._wants_ipc(km):
            if self._socket_folder is None or not os.path.isdir(self._socket_folder):
                self._socket_folder = private_socket_folder()
            km.transport = "ipc"
            km.ip = os.path.join(self._socket_folder, "k")
            km.cache_ports = False  # the port cache binds TCP sockets on km.ip
        kwargs = await super().pre_launch(**kwargs)
        # `python -m` in the notebook's folder, which code in the sandbox can write, would
        # put that folder first on the kernel's import path: a `json.py` or a
        # `sandbox_kernel/` a cell left there would run on the host. The kernel starts in
        # "/" instead (no sandbox writes there) and learns its notebook's folder from the
        # environment; PYTHONSAFEPATH covers launchers that skip this provisioner.
        folder = self._notebook_folder(kwargs.get("cwd"))
        kwargs["env"].update(SAFE_PATH_ENV)
        kwargs["env"][NOTEBOOK_DIR_ENV] = folder
        kwargs["cwd"] = "/"
        if os.environ.get(OWNER_FROM_ENV) == "request":
            self._pin_owner(kwargs["env"])
        self._copies_folder = copies_folder(kwargs["env"])
        return kwargs

    @staticmethod
    def _notebook_folder(cwd: Any) -> str:
        """The folder the client asked the kernel to start in; started by a Jupyter server,
        it must lie inside that server's root folder (links resolved), as every folder its
        file browser opens does: ``POST /api/kernels`` takes any path, ``..`` included."""
        folder = os.path.realpath(str(cwd) if cwd else os.getcwd())
        root = server_root_dir()
        if root:
            try:
                folder = door_folder(folder, root)
            except Forbidden as exc:
                from tornado.web import HTTPError  # started by a Jupyter server

                raise HTTPError(403, reason=str(exc)) from None
        return folder

    def _pin_owner(self, env: dict[str, str]) -> None:
        """On a server with several users, the kernel's owner is the user whose request
        started it, written over whatever the kernelspec's env says (``pre_launch`` has
        merged it by now). A restart keeps the first owner: restarting someone else's
        kernel must not move their notebook into the restarter's sandbox, and the
        automatic restart after a crash has no request at all."""
        owner = self._owner or requesting_user()
        if not owner:
            raise RuntimeError(
                "sandbox-kernel: this server gives every user their own sandbox "
                "(owner_from = request), but this kernel start came with no signed-in user"
            )
        self._owner = owner
        env["SANDBOX_KERNEL_USER"] = env["KERNEL_USERNAME"] = owner

    def _wants_ipc(self, km: Any) -> bool:
        if self.transport != "ipc":
            return False
        if km.transport == "ipc":
            # ours from an earlier start (a restart) or the client's own choice
            return self._socket_folder is not None and km.ip.startswith(self._socket_folder)
        return km.transport == "tcp" and is_local_ip(km.ip) and _is_loopback(km.ip)

    def get_shutdown_wait_time(self, recommended: float = 5.0) -> float:
        """The time a shutting-down kernel has to end: enough to copy the notebook's
        folder back when it has one to copy."""
        return max(recommended, self.shutdown_wait) if self._copies_folder else recommended

    async def cleanup(self, restart: bool = False) -> None:
        """Remove the socket folder once the kernel is gone for good (the manager has
        already removed the sockets it knew of; a crashed kernel may leave others)."""
        await super().cleanup(restart=restart)
        if not restart and self._socket_folder is not None:
            shutil.rmtree(self._socket_folder, ignore_errors=True)
            self._socket_folder = None

    async def get_provisioner_info(self) -> dict[str, Any]:
        """Persist the socket folder with the rest, so a server that reconnects to a
        running kernel also removes the folder when it ends."""
        info = await super().get_provisioner_info()
        info["socket_folder"] = self._socket_folder
        info["owner"] = self._owner
        return info

    async def load_provisioner_info(self, provisioner_info: dict[str, Any]) -> None:
        """Counterpart of :meth:`get_provisioner_info`."""
        await super().load_provisioner_info(provisioner_info)
        self._socket_folder = provisioner_info.get("socket_folder")
        self._owner = provisioner_info.get("owner")


def copies_folder(env: dict[str, str]) -> bool:
    """Whether a kernel started with ``env`` copies its notebook's folder in and back: its
    backend has no host folders and work folders are not off (:func:`.sync.wanted`, which
    the kernel's session asks too). A setting that does not load is the kernel's to report."""
    from . import sync
    from .backends import backend_class
    from .config import load_config

    try:
        cfg = load_config(environ=env)
        return sync.wanted(cfg, backend_class(cfg.backend))
    except Exception:
        return False


def _is_loopback(ip: str) -> bool:
    return ip in ("localhost", "::1") or ip.startswith("127.")


def requesting_user() -> str | None:
    """The authenticated user of the request being served, on a server with several
    users (the extension's ``owner_from = "request"``); else None (no request, or a
    server that acts for its own user).

    jupyter_server keeps the handler of the request being served in a context variable
    (``CallContext``), which follows the request into the kernel manager and this
    provisioner, even into the task that finishes a kernel's start: that is how the
    request's user is known without a hook in every handler that starts kernels
    (sessions, kernels, restarts).
    """
    from jupyter_server.base.call_context import CallContext  # a server is running

    handler = CallContext.get(CallContext.JUPYTER_HANDLER)
    settings = getattr(handler, "settings", None) or {}
    if (
        handler is None
        or "sandbox_service" not in settings
        or settings.get("sandbox_owner") is not None
    ):
        return None
    name = getattr(getattr(handler, "current_user", None), "username", None)
    return name if isinstance(name, str) and name else None
