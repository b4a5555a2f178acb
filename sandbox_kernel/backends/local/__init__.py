"""The embedded local backend: sandboxes as host folders and bubblewrap'd processes.

:mod:`.backend` is the engine adapter; :mod:`.view` what a process sees, :mod:`.holder`
the namespaces and network a sandbox's processes share, :mod:`.cgroup` its limits and
:mod:`.launch` how each process is started into all of them.
"""

from __future__ import annotations

from .backend import LocalBackend
from .status import PLAIN_ISOLATION, bwrap_works, limits_report

__all__ = ["PLAIN_ISOLATION", "LocalBackend", "bwrap_works", "limits_report"]
