"""The program that runs inside the sandbox, and how to start it there.

Nothing is installed in the image: :func:`bootstrap_command` starts ``python3`` with a
few lines that read the agent's source from stdin and run it, so any image with
``python3`` works and an upgrade of sandbox-kernel reaches every sandbox at the next
kernel start.
"""

from __future__ import annotations

from functools import lru_cache
from pathlib import Path

# Where the warm spare interpreter of a sandbox (started by the host) waits for a kernel.
SPARE_SOCKET = "@sandbox-kernel-spare"  # "@": an abstract unix socket, no file
# The sandbox's python3, copied beside itself as a file its user can execute but not
# read: a process started from it is non-dumpable from its first instruction (see
# backends/docker_python.py). agent.py knows the name too.
UNREADABLE_PYTHON = ".sandbox-kernel-python3"


@lru_cache(maxsize=1)
def agent_source() -> bytes:
    """The agent's source, sent on the channel right after start."""
    return (Path(__file__).parent / "agent.py").read_bytes()


# The first lines of every program of ours: non-dumpable at once, so that other processes
# of the sandbox (same uid, no capabilities) can neither ptrace it nor write its
# /proc/<pid>/mem to run their code in it (the kernel's interpreter does so in boot.py).
_HARDEN = "try:\n    import ctypes\n    ctypes.CDLL(None).prctl(4, 0, 0, 0, 0)\nexcept Exception:\n    pass\n"


def program(source: str, *args: str) -> list[str]:
    """How the host runs a program of ours in the sandbox (``python3 -c SOURCE ARGS``).

    Cells can write the user's site-packages (a ``.pth`` file there runs in every
    interpreter that reads it) and leave modules in any working folder: ``-I`` makes
    the interpreter read neither (nor ``PYTHON*`` variables). ``python3`` itself is
    found through the sandbox's own PATH, which the backends keep free of folders a
    cell can write (:func:`as_user` gives the user's commands their own PATH back).
    It makes itself non-dumpable first (:data:`_HARDEN`).
    """
    return ["python3", "-I", "-c", _HARDEN + source, *args]


def as_user(command: list[str], folders: list[str]) -> list[str]:
    """``command`` run as the user's own: their ``~/.local/bin`` first on PATH (see
    :mod:`.user_command`), and unable to make links, FIFOs, sockets or devices beneath
    ``folders`` (host folders mounted in the sandbox; see agent.restrict_special_files),
    which the agent restricts before the PATH is the user's."""
    mine = program(user_command_source(), *command)
    if not folders:
        return mine
    import json

    return program(agent_source().decode(), "--restricted", json.dumps(folders), "--", *mine)


@lru_cache(maxsize=None)
def source(name: str) -> str:
    """The source of the in-sandbox program ``name`` (a module of this package), for
    ``python3 -c``: nothing is installed in the image."""
    return (Path(__file__).parent / f"{name}.py").read_text(encoding="utf-8")


@lru_cache(maxsize=1)
def user_command_source() -> str:
    """The in-sandbox start of a user's command (:mod:`.user_command`), for ``python3 -c``."""
    return (Path(__file__).parent / "user_command.py").read_text()


@lru_cache(maxsize=1)
def boot_source() -> str:
    """The start program (:mod:`.boot`), passed with ``python3 -c``."""
    return (Path(__file__).parent / "boot.py").read_text()


@lru_cache(maxsize=1)
def command_source() -> str:
    """The in-sandbox runner of an agent's shell command (:mod:`.command`), for ``python3 -c``."""
    return (Path(__file__).parent / "command.py").read_text()


@lru_cache(maxsize=1)
def fs_helper_source() -> str:
    """The in-sandbox file helper (:mod:`.fs_helper`), passed with ``python3 -c``."""
    return (Path(__file__).parent / "fs_helper.py").read_text()


def bootstrap_command(
    python: str = "python3", spare: tuple[str, int, str] | None = None
) -> list[str]:
    """The command that starts the agent; send :func:`agent_source` on its stdin next.

    ``spare`` is (socket path, pid, start time) of a warm interpreter the host started
    and recorded: the agent hands the channel to it only if the listener at that path
    is that very process, else it starts cold.
    """
    # Not -I: the kernel's interpreter is the user's, with their PYTHON* variables. Their
    # site-packages and the notebook's folder come on sys.path as ipykernel has them, but
    # only once the agent has hardened and restricted itself (see boot.py).
    cmd = [python, "-s", "-u", "-c", boot_source(), str(len(agent_source()))]
    return [*cmd, spare[0], str(spare[1]), spare[2]] if spare else cmd
