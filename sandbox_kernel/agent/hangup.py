"""Hang up a terminal session in the sandbox: ``hangup SESSION_ID``.

Docker keeps an exec's terminal open after its client has gone, so a shell whose user
closed the window would run on. This does what closing a real terminal does: SIGHUP
to every process of the session (the shell, its jobs), then, after a grace period,
SIGKILL to the shell if it ignored that; a job started with ``nohup`` lives on, as it
would after closing any terminal. The session id is the shell's pid, read by the host
from the shell's first output before any user code ran.
"""

import os
import signal
import sys
import time


def members(session):
    found = []
    for name in os.listdir("/proc"):
        if not name.isdigit():
            continue
        try:
            with open("/proc/" + name + "/stat", "rb") as fh:
                data = fh.read()
        except OSError:
            continue
        fields = data[data.rfind(b")") + 2 :].split()
        if len(fields) > 3 and int(fields[3]) == session:
            found.append(int(name))
    return found


def main():
    session = int(sys.argv[1])
    for pid in members(session):
        try:
            os.kill(pid, signal.SIGHUP)
            os.kill(pid, signal.SIGCONT)  # a stopped job must wake to take it
        except OSError:
            pass
    deadline = time.monotonic() + 3.0
    while session in members(session) and time.monotonic() < deadline:
        time.sleep(0.05)
    if session in members(session):
        try:
            os.kill(session, signal.SIGKILL)
        except OSError:
            pass


if __name__ == "__main__":
    main()
