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
    display_name: str, env: dict[str, str] | None, python: str = "python", isolated: bool = False
) -> dict[str, Any]:
    """The kernel.json content. The provisioner entry makes every client that starts
    kernels by name launch this kernel over IPC (see provisioner.py for why).

    ``isolated`` starts the interpreter with ``-I`` (no user site, no ``PYTHON*``
    variables, no working folder on the path): for an environment that holds the package
    itself (see :func:`runs_isolated`); a ``pip install --user`` needs the user site."""
    flags = ["-I"] if isolated else []
    spec: dict[str, Any] = {
        "argv": [python, *flags, "-m", "sandbox_kernel", "-f", "{connection_file}"],
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


def runs_isolated(python: str) -> bool:
    """Whether ``python -I`` imports this kernel: its packages are in the environment
    itself, not only in a user site or on ``PYTHONPATH``, which ``-I`` leaves out.

    A kernelspec that can say ``-I`` should: the notebook's folder, which a sandbox may
    write, then stays off the kernel's import path on every Python and with every
    launcher, not only where ``PYTHONSAFEPATH`` (3.11+) or the provisioner's start in
    ``/`` applies.
    """
    try:
        done = subprocess.run(
            [python, "-I", "-c", "import sandbox_kernel.kernel"],
            cwd="/",
            stdin=subprocess.DEVNULL,
            capture_output=True,
            timeout=120,
        )
    except (OSError, subprocess.TimeoutExpired):
        return False
    return done.returncode == 0
