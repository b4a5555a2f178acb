"""The program that runs inside the sandbox, and how to start it there.

Nothing is installed in the image: :func:`bootstrap_command` starts ``python3`` with a
few lines that read the agent's source from stdin and run it, so any image with
``python3`` works and an upgrade of sandbox-kernel reaches every sandbox at the next
kernel start.
"""

from __future__ import annotations

from functools import lru_cache
from pathlib import Path

# The start program: read the agent's source (N bytes) from stdin; then, given a spare's
# socket, hand our stdin/stdout to that warm interpreter and wait for it to end;
# without one (or if it does not answer) run the source here, cold. Both paths leave
# the channel in the same state, so the kernel cannot tell them apart but by speed.
_BOOT = (
    "import os,sys\n"
    "n=int(sys.argv[1]);b=b''\n"
    "while len(b)<n:\n"
    " c=os.read(0,n-len(b))\n"
    " if not c:sys.exit('sandbox agent: source cut short')\n"
    " b+=c\n"
    "if len(sys.argv)>2:\n"
    " import socket,array,json\n"
    " def oom():\n"
    "  for f in ('/sys/fs/cgroup/memory.events','/sys/fs/cgroup/memory/memory.oom_control'):\n"
    "   try:\n"
    "    for l in open(f):\n"
    "     if l.startswith('oom_kill '):return int(l.split()[1])\n"
    "   except OSError:pass\n"
    "  return 0\n"
    " try:\n"
    "  s=socket.socket(socket.AF_UNIX);s.connect(sys.argv[2])\n"
    "  e={k:v for k,v in os.environ.items() if k.startswith('SANDBOX_AGENT_')}\n"
    "  m=json.dumps({'env':e,'cwd':os.getcwd()}).encode()+b'\\n'\n"
    "  o=oom();s.sendmsg([m],[(socket.SOL_SOCKET,socket.SCM_RIGHTS,array.array('i',[0,1]))])\n"
    "  if s.recv(1)==b'k':\n"
    "   s.recv(1);os._exit(137 if oom()>o else 0)\n"
    " except OSError:pass\n"
    "exec(compile(b,'sandbox_agent.py','exec'),{'__name__':'__main__','AGENT_SOURCE':b})\n"
)

# Where an agent leaves a warm spare interpreter for the next kernel of its sandbox.
SPARE_SOCKET = "/tmp/.sandbox-kernel-spare.sock"


@lru_cache(maxsize=1)
def agent_source() -> bytes:
    """The agent's source, sent on the channel right after start."""
    return (Path(__file__).parent / "agent.py").read_bytes()


def bootstrap_command(python: str = "python3", spare: str = "") -> list[str]:
    """The command that starts the agent; send :func:`agent_source` on its stdin next.

    With ``spare`` (a socket path in the sandbox) a warm interpreter waiting there
    takes over the channel when there is one.
    """
    cmd = [python, "-u", "-c", _BOOT, str(len(agent_source()))]
    return [*cmd, spare] if spare else cmd
