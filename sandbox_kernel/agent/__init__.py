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


@lru_cache(maxsize=1)
def agent_source() -> bytes:
    """The agent's source, sent on the channel right after start."""
    return (Path(__file__).parent / "agent.py").read_bytes()


def restricted(command: list[str], folders: list[str]) -> list[str]:
    """``command`` run so that it cannot make links, FIFOs, sockets or devices beneath
    ``folders`` (host folders mounted in the sandbox; see agent.restrict_special_files)."""
    if not folders:
        return command
    import json

    return [
        "python3",
        "-c",
        agent_source().decode(),
        "--restricted",
        json.dumps(folders),
        "--",
        *command,
    ]


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
    cmd = [python, "-u", "-c", boot_source(), str(len(agent_source()))]
    return [*cmd, spare[0], str(spare[1]), spare[2]] if spare else cmd
