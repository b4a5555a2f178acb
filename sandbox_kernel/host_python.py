"""Python programs the host starts for itself (a terminal's shell command, helpers).

They often start in a folder code in a sandbox can write: a notebook's folder, a
checkout mounted as a work folder, the folder a user ran `sandbox-kernel exec` in. Python
puts the working folder first on the import path of ``python -c`` and ``python -m``,
so a ``ctypes.py`` or a ``sandbox_kernel/`` a cell left there would run on the host,
as root on a root server. ``-P`` would say so but needs Python 3.11; deleting the entry
before the first import works on every version (``sys`` is built in). Under
``PYTHONSAFEPATH`` (the kernel's environment has it) there is no such entry to delete.
"""

from __future__ import annotations

import sys


def python_command(code: str, *args: str) -> list[str]:
    """``python -c code args`` with this interpreter, never importing from the working folder."""
    first = "import sys\nif not getattr(sys.flags, 'safe_path', False):\n    del sys.path[0]\n"
    return [sys.executable, "-c", first + code, *args]
