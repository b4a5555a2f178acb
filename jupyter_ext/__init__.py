"""Jupyter server extension for sandbox-kernel: REST handlers, thin over sandbox_kernel.

The JupyterLab panel (TypeScript in ../labextension) is built into ./labextension by
``pip install`` and shipped in the wheel's shared data.
"""

from __future__ import annotations

from typing import Any


def _jupyter_server_extension_points() -> list[dict[str, Any]]:
    from .app import SandboxExtension

    return [{"module": "jupyter_ext", "app": SandboxExtension}]


def _jupyter_labextension_paths() -> list[dict[str, str]]:
    return [{"src": "labextension", "dest": "sandbox-kernel-labextension"}]
