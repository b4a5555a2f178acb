"""Run a command in the sandbox with a time limit: ``timeout_runner SECONDS CMD [ARG...]``.

Images need not have coreutils' ``timeout``, but every image we support has python3.
The command gets its own session, so on time-out its whole process group is killed,
not only the first process; the exit status is then 124, as ``timeout`` gives. A
command that cannot be started is said as a shell says it (127, 126), as the Docker
backend says it when there is no time limit.
"""

import os
import signal
import subprocess
import sys


def main() -> int:
    seconds, command = float(sys.argv[1]), sys.argv[2:]
    try:
        process = subprocess.Popen(command, start_new_session=True)
    except FileNotFoundError:
        print(f"{command[0]}: command not found in the sandbox", file=sys.stderr)
        return 127
    except PermissionError:
        print(f"{command[0]}: permission denied (not an executable file?)", file=sys.stderr)
        return 126
    try:
        code = process.wait(seconds)
    except subprocess.TimeoutExpired:
        os.killpg(process.pid, signal.SIGKILL)
        print("timed out after", sys.argv[1], "s", file=sys.stderr)
        return 124
    # Killed by a signal: 128 + its number, as a shell and `docker exec` report it.
    return 128 - code if code < 0 else code


if __name__ == "__main__":
    sys.exit(main())
