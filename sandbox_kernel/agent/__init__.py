"""The program that runs inside the sandbox, and how to start it there.

Nothing is installed in the image: :func:`bootstrap_command` starts ``python3`` with a
few lines that read the agent's source from stdin and run it, so any image with
``python3`` works and an upgrade of sandbox-kernel reaches every sandbox at the next
kernel start.
"""

from __future__ import annotations

from functools import lru_cache
from pathlib import Path

_BOOT = (
    "import os,sys\n"
    "n=int(sys.argv[1]);b=b''\n"
    "while len(b)<n:\n"
    " c=os.read(0,n-len(b))\n"
    " if not c:sys.exit('sandbox agent: source cut short')\n"
    " b+=c\n"
    "del n,c\n"
    "exec(compile(b,'sandbox_agent.py','exec'))\n"
)


@lru_cache(maxsize=1)
def agent_source() -> bytes:
    """The agent's source, sent on the channel right after start."""
    return (Path(__file__).parent / "agent.py").read_bytes()


def bootstrap_command(python: str = "python3") -> list[str]:
    """The command that starts the agent; send :func:`agent_source` on its stdin next."""
    return [python, "-u", "-c", _BOOT, str(len(agent_source()))]
