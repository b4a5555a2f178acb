"""Jupyter server extension for sandbox-kernel: REST handlers, thin over sandbox_kernel."""

from __future__ import annotations

from typing import Any


def _jupyter_server_extension_points() -> list[dict[str, Any]]:
    from .app import SandboxExtension

    return [{"module": "jupyter_ext", "app": SandboxExtension}]
