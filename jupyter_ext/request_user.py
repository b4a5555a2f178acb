"""Whose sandbox a process started by this server for a request belongs to.

With ``owner_from = "request"`` one server serves several users, all of them under the
server's OS user. The server, not the kernel's environment, must then say whose sandbox
a kernel (or a terminal) uses: a kernelspec's ``env``, a notebook's metadata or a
variable the user sets are the user's to choose, and would let them name another user.

jupyter_server keeps the handler of the request being served in a context variable
(``CallContext``), which follows the request into the kernel manager and the
provisioner, even into the task that finishes a kernel's start. That is how the
provisioner learns the request's user without a hook in every handler that starts
kernels (sessions, kernels, restarts).
"""

from __future__ import annotations

from typing import Any

from jupyter_server.base.call_context import CallContext


def request_mode(settings: dict[str, Any]) -> bool:
    """Whether the server extension runs with ``owner_from = "request"``."""
    return "sandbox_service" in settings and settings.get("sandbox_owner") is None


def requesting_user() -> str | None:
    """The authenticated user of the request being served, in request mode; else None
    (no request, or a server that acts for its own user)."""
    handler = CallContext.get(CallContext.JUPYTER_HANDLER)
    if handler is None or not request_mode(handler.settings):
        return None
    user = getattr(handler, "current_user", None)
    name = getattr(user, "username", None)
    return name if isinstance(name, str) and name else None
