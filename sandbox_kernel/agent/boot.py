# Started as `python3 -u -c <this file> N [spare socket, pid, start time]`: small enough
# for argv. It first makes this process non-dumpable (other processes of the sandbox,
# same uid, can then neither ptrace it nor open its /proc/<pid>/fd and mem), then reads
# the agent's source (N bytes) from stdin and runs it. The agent decides between taking
# a warm spare and a cold start (see agent.main). Python 3.8 syntax, stdlib only.
import os
import sys

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
