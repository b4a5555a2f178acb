"""Run one shell command for an agent (MCP ``execute_command``), INSIDE the sandbox.

``python3 -c SOURCE LIMIT TIMEOUT CWD -- CMD [ARG...]``: standard library only, any
python3 >= 3.8. The host needs stdout and stderr apart and bounded, the exit status,
and a time limit that ends every process the command started; backends' ``exec``
merges the streams and, without a limit, waits for whatever the command left behind.
So this program:

* runs CMD in a new session with stdout and stderr on two pipes, keeping at most LIMIT
  bytes of output in all (the rest is counted, not kept), stdin from /dev/null;
* becomes a child subreaper, so a process that double-forks to escape its session
  still lands below us; on time-out every process below us is killed (frozen first, so
  a fork loop cannot outrun the kill), not only the first one's group;
* returns when CMD has exited and its pipes are closed, or shortly after CMD exits when
  a background process still holds them (it keeps running: it was asked for);
* writes one JSON line on its own stdout: exit_code, stdout/stderr (base64),
  stdout_dropped/stderr_dropped (bytes counted but not kept), timed_out, error.

Everything this prints is the command's own business: the host parses it as
untrusted (a process of the command could write to our stdout too).
"""

import base64
import json
import os
import select
import signal
import subprocess
import sys
import time

LINGER = 0.5  # seconds to keep reading after CMD exits, for output still in the pipes
PR_SET_CHILD_SUBREAPER = 36


def become_subreaper():
    try:
        import ctypes

        libc = ctypes.CDLL(None, use_errno=True)
        libc.prctl(PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0)
    except Exception:  # not Linux, no libc: the session kill still applies
        pass


def descendants(root):
    """Pids below ``root``, from /proc (children first found, then theirs)."""
    parents = {}
    for name in os.listdir("/proc"):
        if not name.isdigit():
            continue
        try:
            with open("/proc/%s/stat" % name, "rb") as f:
                stat = f.read()
        except OSError:
            continue
        fields = stat[stat.rfind(b")") + 2 :].split()
        if len(fields) > 1:
            parents.setdefault(int(fields[1]), []).append(int(name))
    found, todo = [], [root]
    while todo:
        for child in parents.get(todo.pop(), []):
            found.append(child)
            todo.append(child)
    return found


def kill_below(root):
    """SIGKILL everything below ``root``; repeated until nothing is left (bounded)."""
    for _ in range(200):
        found = descendants(root)
        if not found:
            return
        for sig in (signal.SIGSTOP, signal.SIGKILL):
            for pid in found:
                try:
                    os.kill(pid, sig)
                except OSError:
                    pass
        reap()
        time.sleep(0.005)


def reap():
    while True:
        try:
            pid, _ = os.waitpid(-1, os.WNOHANG)
        except ChildProcessError:
            return
        if pid == 0:
            return


def run(limit, timeout, cwd, command):
    result = {
        "exit_code": None,
        "stdout": "",
        "stderr": "",
        "stdout_dropped": 0,
        "stderr_dropped": 0,
        "timed_out": False,
        "error": "",
    }
    if cwd:
        try:
            os.chdir(cwd)
        except OSError as exc:
            result["error"] = "cannot work in %s: %s" % (cwd, exc.strerror)
            return result
    become_subreaper()
    try:
        proc = subprocess.Popen(
            command,
            stdin=subprocess.DEVNULL,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            start_new_session=True,
        )
    except OSError as exc:
        result["error"] = "cannot start %s: %s" % (command[0], exc.strerror)
        result["exit_code"] = 127
        return result
    kept = {"stdout": bytearray(), "stderr": bytearray()}
    fds = {proc.stdout.fileno(): "stdout", proc.stderr.fileno(): "stderr"}
    deadline = time.monotonic() + timeout
    exited_at = None
    while fds:
        now = time.monotonic()
        if now >= deadline:
            result["timed_out"] = True
            break
        if exited_at is None and proc.poll() is not None:
            exited_at = now
        if exited_at is not None and now - exited_at > LINGER:
            break  # a background process holds the pipes: it keeps running, we go
        ready, _, _ = select.select(list(fds), [], [], min(0.1, deadline - now))
        for fd in ready:
            chunk = os.read(fd, 65536)
            name = fds[fd]
            if not chunk:
                del fds[fd]
                continue
            room = max(0, limit - len(kept["stdout"]) - len(kept["stderr"]))
            kept[name] += chunk[:room]
            result[name + "_dropped"] += max(0, len(chunk) - room)
    if not result["timed_out"]:
        try:
            proc.wait(max(0.0, deadline - time.monotonic()))
        except subprocess.TimeoutExpired:
            result["timed_out"] = True
    if result["timed_out"]:
        try:
            os.killpg(proc.pid, signal.SIGKILL)
        except OSError:
            pass
        kill_below(os.getpid())
        proc.wait()
        result["exit_code"] = 124
    else:
        code = proc.returncode
        result["exit_code"] = 128 - code if code < 0 else code  # a signal, as a shell says it
    reap()
    for name in ("stdout", "stderr"):
        result[name] = base64.b64encode(bytes(kept[name])).decode("ascii")
    return result


def main():
    limit, timeout, cwd = int(sys.argv[1]), float(sys.argv[2]), sys.argv[3]
    command = sys.argv[5:]
    result = run(limit, timeout, cwd, command)
    out = ("\n" + json.dumps(result) + "\n").encode("ascii")
    view = memoryview(out)
    while view:
        view = view[os.write(1, view) :]


if __name__ == "__main__":
    main()
