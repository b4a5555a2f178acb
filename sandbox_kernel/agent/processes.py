"""An interpreter never outlives its kernel (runs INSIDE the sandbox, stdlib only).

The engine does not end a process when the kernel's channel to it closes (``docker
exec`` keeps running), and an interpreter stuck in C code with the GIL held could not
act on the end of its input by itself. So every interpreter runs below a small watcher
(:func:`watch_child`): a child subreaper that, when the channel closes, kills the
interpreter and everything its cells started, and otherwise exits with the
interpreter's status (137 after an out-of-memory kill), which the kernel reads to say
why an interpreter died.
"""

import os
import select
import signal
import time

PR_SET_PDEATHSIG = 1
PR_SET_NO_NEW_PRIVS = 38
PR_SET_CHILD_SUBREAPER = 36
# Where the watcher reports the interpreter's exit status, when an interpreter forked by
# the warm spare serves a channel whose process is the kernel's start program (spare.py).
STATUS_FD = None


def prctl(option, value):
    """prctl(2) through libc; -1 where there is none (not Linux)."""
    try:
        import ctypes

        return ctypes.CDLL(None, use_errno=True).prctl(option, value, 0, 0, 0)
    except Exception:
        return -1


def number_after(path, label):
    """The number after ``label`` on its line of a /proc or cgroup file, or None."""
    try:
        with open(path) as fh:
            for line in fh:
                if line.startswith(label):
                    return int(line.split()[1])
    except (OSError, ValueError, IndexError):
        pass
    return None


def oom_kills():
    """The sandbox's count of out-of-memory kills so far (cgroup v2 or v1)."""
    for path in ("/sys/fs/cgroup/memory.events", "/sys/fs/cgroup/memory/memory.oom_control"):
        found = number_after(path, "oom_kill ")
        if found is not None:
            return found
    return 0


def descendants(root):
    """Live (not zombie) descendants of ``root``, from /proc."""
    children = {}
    for name in os.listdir("/proc"):
        if not name.isdigit():
            continue
        try:
            with open("/proc/%s/stat" % name, "rb") as fh:
                data = fh.read()
        except OSError:
            continue
        rest = data[data.rfind(b")") + 2 :].split()
        if len(rest) > 1 and rest[0] != b"Z":
            children.setdefault(int(rest[1]), []).append(int(name))
    found, todo = [], [root]
    while todo:
        for child in children.get(todo.pop(), ()):
            found.append(child)
            todo.append(child)
    return found


def kill_tree(root):
    """SIGKILL every descendant of ``root``, pass after pass until none is left (orphans
    stay below us: the watcher is a subreaper), at most a few hundred passes."""
    for _ in range(300):
        found = descendants(root)
        if not found:
            return
        for pid in found:
            try:
                os.kill(pid, signal.SIGKILL)
            except OSError:
                pass
        reap_children()
        time.sleep(0.002)


def reap_children():
    """Collect exited children without blocking; {pid: wait status}."""
    done = {}
    while True:
        try:
            pid, status = os.waitpid(-1, os.WNOHANG)
        except ChildProcessError:
            return done
        if pid == 0:
            return done
        done[pid] = status


def exit_code(status):
    """The exit code a shell would report for a wait status (137 for SIGKILL)."""
    if os.WIFSIGNALED(status):
        return 128 + os.WTERMSIG(status)
    return os.WEXITSTATUS(status)


def channel_hup_poller(extra=()):
    """A poll object that wakes when the kernel's side of the channel (fd 0) closes."""
    poller = select.poll()
    poller.register(0, getattr(select, "POLLRDHUP", 0))
    for fd in extra:
        poller.register(fd, select.POLLIN)
    return poller


def watch_child():
    """Fork: the child goes on to be the interpreter; this process stays as its watcher.

    The watcher never reads fd 0 and closes fd 1; it waits for the interpreter's end or
    the kernel's. When the channel closes (shutdown, restart, the kernel killed) it kills
    the interpreter and everything its cells started. It exits with the interpreter's
    status.
    """
    prctl(PR_SET_CHILD_SUBREAPER, 1)  # orphans of the cells stay ours to kill
    watcher = os.getpid()
    rfd, wfd = os.pipe()
    os.set_blocking(rfd, False)
    os.set_blocking(wfd, False)
    pid = os.fork()
    if pid == 0:
        os.close(rfd)
        os.close(wfd)
        if STATUS_FD is not None:
            os.close(STATUS_FD)
        prctl(PR_SET_PDEATHSIG, signal.SIGKILL)
        if os.getppid() != watcher:
            os._exit(1)  # the watcher died before we could ask to follow it
        return
    os.close(1)  # the interpreter's end of stdout must be the last: EOF tells the kernel
    os.open(os.devnull, os.O_WRONLY)
    signal.set_wakeup_fd(wfd)
    signal.signal(signal.SIGCHLD, lambda *_: None)
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    poller = channel_hup_poller([rfd])
    status = None
    while status is None:
        hup = any(fd == 0 for fd, _ in poller.poll())
        try:
            while os.read(rfd, 512):
                pass
        except OSError:
            pass
        status = reap_children().get(pid)
        if hup and status is None:
            kill_tree(watcher)
            while status is None:
                try:
                    status = os.waitpid(pid, 0)[1]
                except ChildProcessError:
                    status = 0
    kill_tree(watcher)  # what the cells left running
    code = exit_code(status)
    if STATUS_FD is not None:
        try:
            os.write(STATUS_FD, b"%d\n" % code)
        except OSError:
            pass
    os._exit(code)
