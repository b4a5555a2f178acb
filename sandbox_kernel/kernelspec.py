"""What a ``sandbox`` kernelspec holds, in one place for the shipped file, ``install`` and tests."""

from __future__ import annotations

import subprocess
from typing import Any

DISPLAY_NAME = "Python 3 (sandbox)"

#: The entry point (group ``jupyter_client.kernel_provisioners``) of
#: :class:`sandbox_kernel.provisioner.SandboxProvisioner`.
PROVISIONER_NAME = "sandbox-kernel-provisioner"

#: What every kernel's environment carries: it starts in the notebook's folder, which a
#: sandbox can write, and Python 3.11+ then leaves that folder off its import path.
SAFE_PATH_ENV = {"PYTHONSAFEPATH": "1"}


def kernelspec(
    display_name: str,
    env: dict[str, str] | None,
    python: str = "python",
    flags: list[str] | None = None,
) -> dict[str, Any]:
    """The kernel.json content. The provisioner entry makes every client that starts
    kernels by name launch this kernel over IPC (see provisioner.py for why).

    ``flags`` go to the interpreter before ``-m``: :func:`safe_flags` says which keep
    the working folder off the kernel's import path."""
    spec: dict[str, Any] = {
        "argv": [python, *(flags or []), "-m", "sandbox_kernel", "-f", "{connection_file}"],
        "display_name": display_name,
        "language": "python",
        "interrupt_mode": "message",
        "metadata": {
            "debugger": False,
            "kernel_provisioner": {"provisioner_name": PROVISIONER_NAME},
        },
    }
    # The provisioner sets it too, for kernelspecs written before; this is for launchers
    # that skip provisioners.
    spec["env"] = {**SAFE_PATH_ENV, **(env or {})}
    return spec


def safe_flags(python: str) -> list[str]:
    """The flags that keep the working folder (the notebook's, which a sandbox may write)
    off the kernel's import path on every Python and with every launcher, not only where
    ``PYTHONSAFEPATH`` (3.11+) or the provisioner's start in ``/`` applies.

    ``-I`` when ``python -I`` imports this kernel (its packages are in the environment
    itself); else ``-P`` (3.11+), which keeps a user site and ``PYTHONPATH``; else none
    (Python 3.10 with the package only there)."""
    for flags in (["-I"], ["-P"]):
        if _imports_kernel(python, flags):
            return flags
    return []


def _imports_kernel(python: str, flags: list[str]) -> bool:
    try:
        done = subprocess.run(
            [python, *flags, "-c", "import sandbox_kernel.kernel"],
            cwd="/",
            stdin=subprocess.DEVNULL,
            capture_output=True,
            timeout=120,
        )
    except (OSError, subprocess.TimeoutExpired):
        return False
    return done.returncode == 0
