# Started as `python3 -s -u -c <this file> N [spare socket, pid, start time]`: small
# enough for argv. A cell can write the working folder and the user's site-packages,
# so nothing is imported from either before the agent has hardened and restricted
# itself: `-s` leaves the user's site out (the agent adds it later), and the working
# folder, which `-c` puts first on sys.path, goes before the first import (os and sys
# are loaded already). Then this process is made non-dumpable (other processes of the
# sandbox, same uid, can then neither ptrace it nor open its /proc/<pid>/fd and mem;
# started from the host's unreadable copy of python3, it is so from its exec on), and
# the agent's source (N bytes) is read from stdin and run. The agent decides between
# taking a warm spare and a cold start (see agent.main). Python 3.8 syntax, stdlib only.
import os
import sys

if sys.path and sys.path[0] in ("", os.getcwd()):
    del sys.path[0]
try:
    import ctypes

    ctypes.CDLL(None).prctl(4, 0, 0, 0, 0)  # PR_SET_DUMPABLE, 0
except Exception:
    pass
size = int(sys.argv[1])
source = b""
while len(source) < size:
    chunk = os.read(0, size - len(source))
    if not chunk:
        sys.exit("sandbox agent: source cut short")
    source += chunk
exec(compile(source, "sandbox_agent.py", "exec"), {"__name__": "__main__"})
