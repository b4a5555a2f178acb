"""The programs that run inside a sandbox, and how the host starts them there.

Nothing is installed in the image: the host starts ``python3 -c BOOT`` (:mod:`.boot`)
with a *bundle* of this package's modules, which become the package ``sandbox_agent``
in the sandbox, and runs one module's ``main()``. So any image with ``python3`` >= 3.8
works, and an upgrade of sandbox-kernel reaches every sandbox at the next start. The
modules run there are standard library only (IPython is used when the image has it):

* ``start``: a kernel's start program; the warm spare takes the channel
  (:mod:`.spare`), else a cold interpreter (:mod:`.interpreter`, with :mod:`.wire`,
  :mod:`.output`, :mod:`.shell`, :mod:`.processes`, :mod:`.restrict`);
* ``spare``: the warm interpreter that waits for the next kernel;
* ``restrict``: a user's command under the rules of host folders (no links, FIFOs);
* ``user_command``, ``command`` (an agent's shell command), ``fs_helper`` (files the
  host cannot reach directly), ``hangup`` (a terminal's end), ``timeout_runner``;
* ``egress_forward`` (the main process of a Docker sandbox with an egress allowlist) and
  ``egress_proxy`` (the proxy it reaches: a container of its own on Docker, a process of
  the host on the local backend; :mod:`.egress_rules`).

Programs the host runs for itself start isolated (``-I``): the user's site-packages
and any working folder are the sandbox user's to write. The kernel's interpreter is the
user's own (their site-packages come on ``sys.path`` once it has restricted itself).
"""

from __future__ import annotations

import hashlib
import json
from functools import cache
from pathlib import Path

__all__ = [
    "as_user",
    "bootstrap_command",
    "bundle",
    "inline",
    "program",
    "source",
    "version",
]

_INTERPRETER = ("processes", "wire", "output", "shell", "restrict", "interpreter", "spare", "start")
#: The modules each program needs (its own last); they are imported in the sandbox on use.
PROGRAMS: dict[str, tuple[str, ...]] = {
    "start": _INTERPRETER,
    "spare": _INTERPRETER,
    "restrict": ("processes", "restrict"),
    "user_command": ("user_command",),
    "command": ("command",),
    "fs_helper": ("beneath", "fs_helper"),
    "hangup": ("hangup",),
    "timeout_runner": ("timeout_runner",),
    "egress_forward": ("egress_forward",),
    "egress_proxy": ("egress_rules", "egress_proxy"),
}


@cache
def source(name: str) -> str:
    """The source of module ``name`` of this package."""
    return (Path(__file__).parent / f"{name}.py").read_text(encoding="utf-8")


@cache
def version() -> str:
    """A digest of every module sent into sandboxes: a warm spare serves only kernels of
    its own version."""
    digest = hashlib.sha256()
    for name in sorted({n for modules in PROGRAMS.values() for n in modules} | {"boot"}):
        digest.update(name.encode() + b"\0" + source(name).encode() + b"\0")
    return digest.hexdigest()[:16]


@cache
def bundle(main: str) -> bytes:
    """What :mod:`.boot` reads to run program ``main``: its modules, as JSON."""
    modules = [[name, source(name)] for name in PROGRAMS[main]]
    return json.dumps({"version": version(), "main": main, "modules": modules}).encode()


def bootstrap_command(main: str = "start", python: str = "python3") -> list[str]:
    """The command that starts program ``main`` reading its bundle from stdin: send
    :func:`bundle` first, then whatever the program reads (the kernel's protocol).

    Not ``-I``: the kernel's interpreter is the user's, with their ``PYTHON*``
    variables. Their site-packages come on ``sys.path`` (``-s`` leaves them out at
    start) only once it has restricted itself; the working folder is taken off before
    the first import (see boot.py).
    """
    return [python, "-s", "-u", "-c", source("boot"), str(len(bundle(main)))]


def program(main: str, *args: str) -> list[str]:
    """How the host runs program ``main`` of this package in a sandbox, for a command
    that has no stdin to read a bundle from: the bundle is part of ``-c``'s code.

    ``-I`` makes the interpreter read no user site-packages (a ``.pth`` file there runs
    in every interpreter that reads it), no ``PYTHON*`` variable and no module of the
    working folder. ``python3`` is found through the sandbox's own PATH, which the
    backends keep free of folders a cell can write.
    """
    return ["python3", "-I", "-c", _embedded(main), *args]


@cache
def _embedded(main: str) -> str:
    """The start program with program ``main``'s bundle written into it."""
    return f"BUNDLE = {json.loads(bundle(main))!r}\n{source('boot')}"


def inline(code: str, *args: str) -> list[str]:
    """A few lines of Python run as the host's own program in the sandbox (``-I``)."""
    return ["python3", "-I", "-c", code, *args]


def as_user(command: list[str], folders: list[str]) -> list[str]:
    """``command`` run as the user's own: their ``~/.local/bin`` first on PATH (see
    :mod:`.user_command`), and unable to make links, FIFOs, sockets or devices beneath
    ``folders`` (host folders mounted in the sandbox; see :mod:`.restrict`), which is
    applied before the PATH is the user's."""
    mine = program("user_command", *command)
    if not folders:
        return mine
    return program("restrict", json.dumps(folders), "--", *mine)
