"""A warm interpreter waiting in the sandbox for the next kernel (runs INSIDE the
sandbox, stdlib only).

Most of an interpreter's start is importing IPython. So after a kernel starts, the host
starts one *spare* per sandbox (:func:`main`): it imports what every interpreter
imports, listens on an abstract Unix socket, and for each kernel that connects forks a
child, which takes that kernel's channel (its fds 0, 1 and 2, passed over the socket)
and settings and becomes its interpreter. A kernel's start program tries the spare
first (:func:`hand_over`) and starts cold when none answers, or the one that answers
runs another version of this agent.

The spare ends after ``SPARE_TTL`` seconds without a kernel, after ``SPARE_MAX_AGE`` in
any case, and at once when the Python installation changed under it (a ``pip
install``), since a cold start would then import other modules; it serves nobody while
the user's site folder holds a package it imported.
"""

import array
import json
import os
import select
import signal
import socket
import sys
import time

from . import processes

SOCKET = "@sandbox-kernel-spare"  # "@": an abstract socket, no file to plant or remove
SPARE_TTL = 600.0
SPARE_MAX_AGE = 3600.0
HANDSHAKE = 5.0  # seconds a hand-over may take, either side


def socket_address(path):
    """ "@name" is an abstract Unix socket; anything else a path."""
    return "\0" + path[1:] if path.startswith("@") else path


def version():
    """This agent's version (the host puts it in the bundle, see boot.py)."""
    return getattr(sys.modules.get(__package__), "VERSION", "")


# -- the start program's side ---------------------------------------------------------------
def hand_over():
    """Give this kernel's channel to the sandbox's spare, if one of this version waits,
    and stay as the channel's process until its interpreter ends (never returns then).
    Returns False when no spare took it: start cold."""
    conn = socket.socket(socket.AF_UNIX)
    conn.settimeout(HANDSHAKE)
    try:
        conn.connect(socket_address(SOCKET))
        settings = {
            "version": version(),
            "env": {k: v for k, v in os.environ.items() if k.startswith("SANDBOX_AGENT_")},
            "cwd": os.getcwd(),
        }
        message = json.dumps(settings).encode() + b"\n"
        fds = array.array("i", [0, 1, 2])
        sent = conn.sendmsg([message], [(socket.SOL_SOCKET, socket.SCM_RIGHTS, fds)])
        if sent < len(message):
            conn.sendall(message[sent:])
        reply = read_line(conn, 32)
        if not reply.startswith(b"K"):
            conn.close()
            return False
        conn.sendall(b"g")  # the child takes the fds only now: never two on one channel
    except OSError:
        conn.close()
        return False
    supervise(conn)
    return True  # not reached


def supervise(conn):
    """Stay as the channel's process (the engine's exec) while the spare's child serves
    it; exit with the status its watcher reports (137 after an out-of-memory kill)."""
    os.close(1)
    os.open(os.devnull, os.O_WRONLY)
    conn.settimeout(None)
    poller = processes.channel_hup_poller([conn.fileno()])
    deadline = None
    while True:
        events = dict(poller.poll(1000))
        if conn.fileno() in events:
            status = read_line(conn, 16)
            os._exit(int(status) if status.isdigit() else 0)
        if 0 in events and deadline is None:
            deadline = time.monotonic() + HANDSHAKE  # the child's watcher ends it now
        if deadline is not None and time.monotonic() > deadline:
            os._exit(0)


def read_line(conn, limit):
    """Up to ``limit`` bytes of one line from ``conn``, without its newline."""
    line = b""
    while not line.endswith(b"\n") and len(line) < limit:
        chunk = conn.recv(1)
        if not chunk:
            break
        line += chunk
    return line.strip()


# -- the spare -------------------------------------------------------------------------------
def main():
    """The spare program: listen, warm up, and fork a child for each kernel that comes."""
    listener = socket.socket(socket.AF_UNIX)
    try:
        listener.bind(socket_address(SOCKET))
    except OSError:
        os._exit(0)  # a spare waits already: one per sandbox
    listener.listen(64)
    os.write(1, b"listening\n")
    devnull = os.open(os.devnull, os.O_RDWR)
    for fd in (0, 1, 2):  # the host's exec ends now; nothing of ours depends on it
        os.dup2(devnull, fd)
    os.close(devnull)
    useful = warm_up()
    installed = python_installation()
    signal.signal(signal.SIGCHLD, lambda *_: processes.reap_children())
    born = served = time.monotonic()
    while True:
        wait = min(served + SPARE_TTL, born + SPARE_MAX_AGE) - time.monotonic()
        if wait <= 0:
            os._exit(0)
        try:
            ready = select.select([listener], [], [], wait)[0]
        except InterruptedError:
            continue
        if not ready:
            continue
        try:
            conn, _ = listener.accept()
        except OSError:
            continue
        if python_installation() != installed:
            os._exit(0)  # the modules we hold are not what a cold start imports now
        if not useful:
            conn.close()  # its kernel starts cold
            continue
        served = time.monotonic()
        try:
            child = os.fork()
        except OSError:
            child = -1
        if child == 0:
            listener.close()
            signal.signal(signal.SIGCHLD, signal.SIG_DFL)
            take_channel(conn)
            return
        conn.close()


def take_channel(conn):
    """In a child of the spare: take the kernel's fds and settings, then become its
    interpreter. Anything short of a whole hand-over of this version ends the child."""
    conn.settimeout(HANDSHAKE)
    buffer = bytearray(65536)
    fds = array.array("i")
    try:
        size, ancdata, _, _ = conn.recvmsg_into([buffer], socket.CMSG_SPACE(3 * 4))
        for level, kind, data in ancdata:
            if level == socket.SOL_SOCKET and kind == socket.SCM_RIGHTS:
                fds.frombytes(data[: len(data) - len(data) % 4])
        while size and b"\n" not in buffer[:size] and size < len(buffer):
            got = conn.recv_into(memoryview(buffer)[size:])
            if not got:
                break
            size += got
        settings = json.loads(bytes(buffer[: buffer.find(b"\n")]))
        if len(fds) != 3 or settings.get("version") != version():
            if settings.get("version") != version():
                os.kill(os.getppid(), signal.SIGTERM)  # an older spare: a new one replaces it
            os._exit(0)
        os.chdir(settings["cwd"])  # where a cold start would run; if it cannot, neither do we
        conn.sendall(b"K%d\n" % os.getpid())
        if conn.recv(1) != b"g":
            os._exit(0)
    except (OSError, ValueError, KeyError, TypeError, AttributeError):
        os._exit(0)
    os.environ.update(
        {k: str(v) for k, v in settings["env"].items() if k.startswith("SANDBOX_AGENT_")}
    )
    for target, fd in enumerate(fds):
        os.dup2(fd, target)
        os.close(fd)
    conn.settimeout(None)
    processes.STATUS_FD = conn.detach()  # the watcher reports the interpreter's end there
    from .interpreter import main as interpret

    interpret(spare=True)


def python_installation():
    """What is installed where imports come from (and in the user's site folder, which a
    cold start adds): the names and times of the install records (``*.dist-info``,
    ``*.egg-info``, ``*.pth``, ``*.egg-link``) of each folder. A pip install or
    uninstall changes them; caches and a cell's own files do not."""
    import site

    state = []
    for folder in [*sys.path, site.getusersitepackages()]:
        try:
            with os.scandir(folder or ".") as entries:
                records = sorted(
                    (entry.name, entry.stat(follow_symlinks=False).st_mtime_ns)
                    for entry in entries
                    if entry.name.endswith((".dist-info", ".egg-info", ".pth", ".egg-link"))
                )
        except OSError:
            records = None
        state.append((folder, records))
    return state


def warm_up():
    """Import what every interpreter imports to build its shell, without building one (a
    fork inherits modules, not threads or open files). Returns whether the spare is of
    use: not when the user's site folder holds a package we imported (a cold start
    would import the user's)."""
    import site

    from .shell import import_ipython_core

    if os.environ.get("SANDBOX_AGENT_NO_IPYTHON"):
        return True
    try:
        import_ipython_core()
    except ImportError:
        pass
    try:
        names = os.listdir(site.getusersitepackages())
    except OSError:
        return True
    theirs = {name.split(".")[0].split("-")[0] for name in names}
    return not theirs & {name.split(".")[0] for name in sys.modules}
