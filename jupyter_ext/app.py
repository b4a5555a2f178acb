"""The server extension: settings, one shared service object, handlers, the reaper."""

from __future__ import annotations

import asyncio
import os
from pathlib import Path
from typing import Any

from jupyter_server.extension.application import ExtensionApp
from traitlets import Bool, Enum, Float, Int, List, Unicode

from sandbox_kernel.config import ConfigError, load_config
from sandbox_kernel.identity import OWNER_FROM_ENV, resolve_user
from sandbox_kernel.lifecycle import gc
from sandbox_kernel.service import SandboxService

from .handlers import handlers
from .mcp import McpService, mcp_handlers
from .metrics import register
from .proxy import Grants, proxy_handlers
from .webdav import DavService, dav_handlers


class SandboxExtension(ExtensionApp):
    """REST API for the sandboxes of this server's users (see openapi.yaml)."""

    name = "jupyter_ext"

    owner_from = Enum(
        ["server", "request"],
        default_value="server",
        help=(
            "Whose sandboxes a request sees. server: the server's own user (single-user "
            "servers, JupyterHub single-user servers: every authenticated request acts for the "
            "owner, whatever name the identity provider invents). request: the request's "
            "Jupyter username (servers with several users)."
        ),
    ).tag(config=True)
    admin_users = List(
        Unicode(),
        default_value=[],
        help=(
            "Jupyter usernames of the administrators of this installation (who may run the MCP "
            "tool cleanup_orphan_sandboxes). Empty: on a single-user server (owner_from = "
            "server) its owner; on a server with several users, no one."
        ),
    ).tag(config=True)
    max_upload_size = Int(
        10 << 30, help="Largest file accepted by an upload, in bytes (larger is 413)."
    ).tag(config=True)
    gc_interval = Float(
        300.0, help="Seconds between runs of the lifecycle reaper in the server (0: never)."
    ).tag(config=True)
    terminals = Enum(
        ["sandbox", "host"],
        default_value="sandbox",
        help=(
            "Where JupyterLab's terminals run. sandbox: a login shell in the user's sandbox "
            "(`sandbox-kernel shell`), unless ServerApp.terminado_settings names a "
            "shell_command of the administrator's own. host: the server's own shell, as "
            "without this extension."
        ),
    ).tag(config=True)

    preview_isolation = Bool(
        True,
        help=(
            "Whether a browser opens a sandbox's preview (sandbox-kernel/proxy/...) in an "
            "origin of its own: sent to a signed preview path and served with "
            "Content-Security-Policy: sandbox, so the app's pages cannot use the user's "
            "Jupyter session (the sandbox's code is not trusted). False serves previews on "
            "the server's own origin, as jupyter-server-proxy does, and allows absolute/ "
            "previews: only for servers whose sandboxes run trusted code."
        ),
    ).tag(config=True)

    metrics_interval = Float(
        15.0,
        help=(
            "Seconds a listing of sandboxes behind the sandbox_kernel_sandboxes gauge in "
            "/metrics is used before a scrape starts the next one in the background (a "
            "scrape never waits for the engine)."
        ),
    ).tag(config=True)

    def initialize_settings(self) -> None:
        # Kernels and terminals this server starts inherit its environment: tell them the
        # server's root folder, the primary work folder mounted into sandboxes.
        assert self.serverapp is not None  # set before extensions initialize
        os.environ["SANDBOX_KERNEL_SERVER_ROOT"] = str(Path(self.serverapp.root_dir).resolve())
        # With several users, whose sandbox a kernel uses is the server's to say (see
        # provisioner.requesting_user); what it starts must never fall back to the server's own user.
        if self.owner_from == "request":
            os.environ[OWNER_FROM_ENV] = "request"
        else:
            os.environ.pop(OWNER_FROM_ENV, None)
        try:
            config = load_config(config=self.config)
        except ConfigError as exc:
            self.log.error("sandbox-kernel settings: %s", exc)
            raise
        service = SandboxService(config)
        if self.owner_from == "server":
            # This root folder's sandbox is the user's plain one, whichever door they use
            # (`sandbox-kernel exec` or `jupyter execute` in it too: service.primary_folder).
            try:
                service.remember_lab_root(resolve_user(config), self.serverapp.root_dir)
            except Exception as exc:  # a nicety for the CLI: never a reason not to start
                self.log.warning("sandbox-kernel: could not record the root folder: %s", exc)
        self.settings.update(
            sandbox_service=service,
            sandbox_owner=None if self.owner_from == "request" else resolve_user(config),
            sandbox_admin_users=tuple(self.admin_users),
            sandbox_max_upload=self.max_upload_size,
            sandbox_dav=DavService(self.serverapp.base_url),
            sandbox_preview_isolation=self.preview_isolation,
            sandbox_preview_grants=Grants(),
        )
        register(self.settings["sandbox_service"], self.metrics_interval)
        from .terminals import install as install_terminals

        self.log.info(
            "sandbox-kernel: %s",
            install_terminals(self.serverapp, self.terminals, self.owner_from == "request"),
        )
        # MCP for agents, acting for each request's user in their sandbox.
        self.settings["sandbox_mcp"] = McpService(
            self.settings["sandbox_service"], str(Path(self.serverapp.root_dir).resolve())
        )

    def initialize_handlers(self) -> None:
        self.handlers.extend(handlers())
        self.handlers.extend(dav_handlers())
        self.handlers.extend(mcp_handlers())
        self.handlers.extend(proxy_handlers())

    async def _start_jupyter_server_extension(self, serverapp: Any) -> None:
        if self.gc_interval > 0:
            self._reaper = asyncio.ensure_future(self._reap_forever())

    async def _reap_forever(self) -> None:
        service: SandboxService = self.settings["sandbox_service"]
        while True:
            await asyncio.sleep(self.gc_interval)
            try:
                actions = await asyncio.to_thread(gc, service.backend, service.config)
                for action in actions:
                    self.log.info(
                        "sandbox lifecycle: %s %s (%s)",
                        action.action,
                        action.sandbox_id,
                        action.reason,
                    )
            except Exception as exc:  # the reaper must never take the server down
                self.log.warning("sandbox lifecycle run failed: %s", exc)

    async def stop_extension(self) -> None:
        reaper = getattr(self, "_reaper", None)
        if reaper is not None:
            reaper.cancel()
        dav = self.settings.get("sandbox_dav")
        if dav is not None:
            dav.close()
        mcp = self.settings.get("sandbox_mcp")
        if mcp is not None:  # agents' interpreters end with the server
            await mcp.close()
