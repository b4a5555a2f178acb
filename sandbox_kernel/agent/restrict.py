"""Host folders mounted in a sandbox stay plain ground for host tools (runs INSIDE the
sandbox, stdlib only).

Beneath a host folder mounted into the sandbox (the notebook's work folder), no
process of the sandbox may make a symbolic link, a FIFO, a socket or a device file:
host tools read those folders (JupyterLab's contents API, ``jupyter execute
--inplace``, git), and a link planted there would turn them against the host user, a
FIFO would hang them. Landlock (Linux >= 5.13) enforces it for the process that asks
and everything it starts; the interpreter asks before any user code runs, and the
host's commands run through :func:`main`.
"""

import errno
import json
import os
import sys
import threading

from .processes import PR_SET_NO_NEW_PRIVS, prctl

LANDLOCK_CREATE_RULESET = 444
LANDLOCK_ADD_RULE = 445
LANDLOCK_RESTRICT_SELF = 446
# Make a character device, a socket, a FIFO, a block device, a symbolic link.
LANDLOCK_MAKE_SPECIAL = (1 << 6) | (1 << 9) | (1 << 10) | (1 << 11) | (1 << 12)


def restrict_special_files(folders):
    """Landlock: beneath ``folders`` (host folders mounted in the sandbox), this process
    and all it starts may no longer make symlinks, FIFOs, sockets or device files.

    Host tools read those folders (JupyterLab's contents API, ``jupyter execute
    --inplace``, git): a link planted there would turn them against the host user, a
    FIFO would hang them. Landlock grants rights beneath the folders it is given, so
    the rights are granted on everything *but* the paths down to ``folders``. Returns
    whether it took effect (Linux >= 5.13 with Landlock; else nothing changes).
    """
    import ctypes
    import struct

    folders = [os.path.realpath(f) for f in folders if f]
    if not folders:
        return False
    if threading.active_count() != 1:  # one would stay free of the restriction
        sys.stderr.write(
            "sandbox agent: a thread started before the restriction; refusing to run\n"
        )
        os._exit(70)
    libc = ctypes.CDLL(None, use_errno=True)
    libc.syscall.restype = ctypes.c_long
    if libc.syscall(LANDLOCK_CREATE_RULESET, None, 0, 1) < 1:  # the ABI version
        return False
    attr = ctypes.create_string_buffer(struct.pack("Q", LANDLOCK_MAKE_SPECIAL))
    ruleset = libc.syscall(LANDLOCK_CREATE_RULESET, attr, 8, 0)
    if ruleset < 0:
        return False
    on_path = set()
    for folder in folders:
        probe = folder
        while True:
            on_path.add(probe)
            if probe == "/":
                break
            probe = os.path.dirname(probe)
    try:
        for parent in sorted(p for p in on_path if p not in folders):
            try:
                names = os.listdir(parent)
            except OSError:
                continue
            for name in names:
                path = os.path.join(parent, name)
                if path in on_path:
                    continue
                try:
                    fd = os.open(path, os.O_PATH | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC)
                except OSError:
                    continue  # a file, a link: no folder to grant beneath
                try:
                    rule = ctypes.create_string_buffer(
                        struct.pack("=Qi", LANDLOCK_MAKE_SPECIAL, fd)
                    )
                    libc.syscall(LANDLOCK_ADD_RULE, ruleset, 1, rule, 0)
                finally:
                    os.close(fd)
        prctl(PR_SET_NO_NEW_PRIVS, 1)  # (Docker sets it already)
        return libc.syscall(LANDLOCK_RESTRICT_SELF, ruleset, 0) == 0
    finally:
        os.close(ruleset)


def main():
    """``FOLDERS_JSON -- CMD...``: restrict, then become CMD (commands the host runs in a
    sandbox with host folders, e.g. `sandbox-kernel exec`)."""
    argv = sys.argv[1:]
    folders = json.loads(argv[0])
    command = argv[argv.index("--") + 1 :]
    restrict_special_files(folders)
    try:
        os.execvp(command[0], command)
    except OSError as exc:  # as a shell says it: 127 not found, 126 not runnable
        missing = exc.errno == errno.ENOENT
        what = "command not found in the sandbox" if missing else exc.strerror
        sys.stderr.write("%s: %s\n" % (command[0], what))
        sys.stderr.flush()
        os._exit(127 if missing else 126)


if __name__ == "__main__":
    main()
