"""Python programs the host starts for itself (a terminal's shell command, helpers).

They often start in a folder code in a sandbox can write: a notebook's folder, a
checkout mounted as a work folder, the folder a user ran `sandbox-kernel exec` in.
Python puts the working folder first on the import path of ``python -c`` and
``python -m``, so a ``json.py`` or a ``sandbox_kernel/`` a cell left there would run on
the host, as root on a root server. So every one of them runs isolated (``-I``: no
working folder, no user site, no ``PYTHON*`` variables), and finds this package where
the running process found it (appended, after the standard library and site-packages).
"""

from __future__ import annotations

import os
import sys

import sandbox_kernel

#: The folder this package was imported from (a venv's site-packages, a user site, a
#: source checkout): appended to an isolated interpreter's path so it finds us there.
PACKAGE_PARENT = os.path.dirname(os.path.dirname(os.path.abspath(sandbox_kernel.__file__)))


def python_command(code: str, *args: str) -> list[str]:
    """``python -I -c code args`` with this interpreter, able to import this package and
    never anything from the working folder."""
    first = f"import sys\nsys.path.append({PACKAGE_PARENT!r})\n"
    return [sys.executable, "-I", "-c", first + code, *args]


def python_module(module: str, *args: str) -> list[str]:
    """``python -m module args``, isolated as :func:`python_command` is."""
    return python_command(f"import runpy\nrunpy.run_module({module!r}, run_name='__main__')", *args)
