"""JupyterLab's terminals open a shell in the user's sandbox, not on the host.

jupyter_server_terminals starts every terminal with terminado's ``shell_command``,
read once when that extension loads, and a client's ``POST /api/terminals`` body is
passed on to terminado as keyword arguments, where it may set ``shell_command`` and
``extra_env`` itself. So the command is forced where the terminal is made: the
terminal manager gets :class:`SandboxTerminals` mixed in (its class is swapped before
jupyter_server_terminals makes it; extensions load in alphabetical order, and
``jupyter_ext`` comes first), and every terminal runs ``sandbox-kernel shell``.

With ``owner_from = "request"`` (several users on one server) terminals are named and
shared server-wide, and jupyter_server_terminals authorizes on the resource
"terminals" alone. The mixin therefore records who made each terminal, runs that
user's shell (``SANDBOX_KERNEL_USER``), and hides every other user's terminals from
them: not listed, and 404 to get, delete or attach to (the websocket checks the name
before its upgrade). The check reads the request's handler from jupyter_server's
``CallContext``; the terminals' own callbacks (output, culling, shutdown) are made to
run outside any request, so they see every terminal.
"""

from __future__ import annotations

import contextvars
import os
from typing import Any

from jupyter_server.base.call_context import CallContext
from tornado import web

from sandbox_kernel.errors import Forbidden
from sandbox_kernel.folders import door_folder
from sandbox_kernel.host_python import python_command

#: What a terminal runs: the shell command of the server's own Python (started in the
#: terminal's folder, which a sandbox may write: see host_python).
SHELL_COMMAND = python_command("from sandbox_kernel.cli import main\nsys.exit(main())", "shell")
TERMINALS_EXTENSION = "jupyter_server_terminals"


def _requester() -> tuple[bool, str | None]:
    """(whether a request is being served, its user's name)."""
    handler = CallContext.get(CallContext.JUPYTER_HANDLER)
    if handler is None:
        return False, None
    name = getattr(getattr(handler, "current_user", None), "username", None)
    return True, name if isinstance(name, str) and name else None


class _Owned(dict):
    """Terminal name -> terminal, where a request sees only its own user's terminals.

    ``in`` is how jupyter_server_terminals asks whether a terminal exists (the REST
    handlers and the websocket, before it upgrades), so answering there is enough to
    make another user's terminal not found everywhere."""

    def __init__(self, terminals: dict[str, Any], per_user: bool) -> None:
        super().__init__(terminals)
        self.per_user = per_user

    def __contains__(self, name: object) -> bool:
        if not dict.__contains__(self, name):
            return False
        if not self.per_user:
            return True
        serving, user = _requester()
        return not serving or getattr(dict.__getitem__(self, name), "sandbox_user", None) == user


class SandboxTerminals:
    """Mixed into jupyter_server_terminals' TerminalManager (see the module's doc)."""

    #: The command every terminal runs (None: the administrator's own shell_command).
    sandbox_command: list[str] | None = None
    #: Whether each request's user has their own terminals (owner_from = "request").
    per_user: bool = False
    #: The server's root folder: a terminal's folder must lie inside it ("" for no check).
    server_root: str = ""

    terminals: dict[str, Any]

    def __init__(self, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.terminals = _Owned(self.terminals, self.per_user)

    def new_terminal(self, **kwargs: Any) -> Any:
        # A client's POST body arrives here: it may not pick the command or its environment,
        # and its folder (mounted into the sandbox) must be one the server's file browser
        # may open: inside the root folder, links resolved. No folder: the root folder.
        kwargs.pop("shell_command", None)
        kwargs.pop("extra_env", None)
        if self.server_root:
            try:
                kwargs["cwd"] = door_folder(
                    str(kwargs.get("cwd") or self.server_root), self.server_root
                )
            except Forbidden as exc:
                raise web.HTTPError(403, reason=str(exc)) from None
        user = kwargs.pop("sandbox_user", None)
        env: dict[str, str] = {}
        if self.per_user:
            if not user:
                raise web.HTTPError(403, "a terminal is opened for a signed-in user only")
            env["SANDBOX_KERNEL_USER"] = user
        if self.sandbox_command:
            kwargs["shell_command"] = list(self.sandbox_command)
        term = super().new_terminal(extra_env=env, **kwargs)  # type: ignore[misc]
        term.sandbox_user = user
        return term

    def create(self, **kwargs: Any) -> dict[str, Any]:
        _serving, user = _requester()
        if self.per_user and not user:
            raise web.HTTPError(403, "a terminal is opened for a signed-in user only")
        name = kwargs.get("name")
        if name is not None and dict.__contains__(self.terminals, name):
            # terminado would replace the running terminal of that name, whoever's it is.
            raise web.HTTPError(409, f"a terminal named {name} exists")
        kwargs["sandbox_user"] = user
        # Outside the request: the terminal's callbacks (its output, the culler) would
        # otherwise keep this request's context, and with it its user.
        created: dict[str, Any] = contextvars.Context().run(
            super().create,  # type: ignore[misc]
            **kwargs,
        )
        return created

    def list(self) -> list[dict[str, Any]]:
        return [
            self.get_terminal_model(name)  # type: ignore[attr-defined]
            for name in list(self.terminals)
            if name in self.terminals
        ]

    def get_terminal(self, term_name: str) -> Any:
        if dict.__contains__(self.terminals, term_name) and term_name not in self.terminals:
            raise web.HTTPError(404, f"Terminal not found: {term_name}")
        return super().get_terminal(term_name)  # type: ignore[misc]

    async def terminate_all(self) -> None:
        # At shutdown, perhaps from a user's request: every terminal, not that user's.
        await contextvars.Context().run(super().terminate_all)  # type: ignore[misc]


def manager_class(
    base: type, command: list[str] | None, per_user: bool, server_root: str = ""
) -> type:
    """``base`` (the configured terminal manager class) with :class:`SandboxTerminals`."""
    if issubclass(base, SandboxTerminals):
        base = next(b for b in base.__mro__[1:] if not issubclass(b, SandboxTerminals))
    return type(
        f"Sandbox{base.__name__}",
        (SandboxTerminals, base),
        {"sandbox_command": command, "per_user": per_user, "server_root": server_root},
    )


def install(serverapp: Any, mode: str, per_user: bool) -> str:
    """Make the server's terminals sandbox terminals (``mode`` "sandbox") or leave them
    on the host ("host"); returns what was done, for the log."""
    if mode == "host":
        return "terminals run on the host (SandboxExtension.terminals = 'host')"
    apps = serverapp.extension_manager.extension_apps.get(TERMINALS_EXTENSION) or set()
    app = next(iter(apps), None)
    if app is None or not serverapp.terminals_enabled:
        return "terminals are off on this server"
    admin_command = (serverapp.terminado_settings or {}).get("shell_command")
    command = None if admin_command else SHELL_COMMAND
    root = os.path.realpath(serverapp.root_dir)
    manager = getattr(app, "terminal_manager", None)
    if manager is None:  # not made yet (the usual order): it is made from our class
        app.terminal_manager_class = manager_class(
            app.terminal_manager_class, command, per_user, root
        )
    else:  # made already: give it our methods (they add no state but the owned dict)
        manager.__class__ = manager_class(type(manager), command, per_user, root)
        manager.terminals = _Owned(manager.terminals, per_user)
    if admin_command:
        return (
            f"terminals run the administrator's ServerApp.terminado_settings shell_command "
            f"{admin_command!r}, not the sandbox's shell"
            + ("; each user sees only their own" if per_user else "")
        )
    return "terminals open a shell in the user's sandbox" + (
        " (each user's own, unseen by other users)" if per_user else ""
    )
