"""File operations run INSIDE a sandbox, on its own files, with its own rights.

Used where the host cannot (or must not) touch the files itself: a Daytona volume is
not on the host at all, and a container's own filesystem (outside the workspace) is
reached through ``docker exec`` rather than the engine's archive API, whose path
resolution is CVE-2018-15664's class. Running as the sandbox user, inside the
sandbox, whatever this program follows stays within what the sandbox may see; it
still refuses paths that lead out of ``root`` so the REST API means the same thing on
every backend.

Standard library only, Python >= 3.8. Invoked as ``python3 -c SOURCE OP ROOT REL``:

* ``stat``, ``list``, ``walk``, ``check-upload``, ``delete``: one JSON line on stdout;
* ``read``: a JSON line ``{"size": N}`` (or ``{"error": ...}``), then exactly N bytes;
* ``write`` (with the expected size as a fifth argument): stdin to a temporary beside
  the target (parents made), renamed into place only when exactly that many bytes
  came; then one JSON line ``{"size": N}`` or ``{"error": ...}``.
"""

import json
import os
import stat
import sys

MAX_ENTRIES = 10000


def out(**kw):
    sys.stdout.write(json.dumps(kw) + "\n")
    sys.stdout.flush()
    sys.exit(0)


def inside(root, path):
    real = os.path.realpath(path)
    return real == root or real.startswith(root.rstrip("/") + "/")


def kind(st):
    mode = st.st_mode
    if stat.S_ISLNK(mode):
        return "symlink"
    if stat.S_ISDIR(mode):
        return "directory"
    if stat.S_ISREG(mode):
        return "file"
    return "other"


def nearest_existing(root, path):
    probe = path
    while not os.path.lexists(probe) and probe != root and probe != "/":
        probe = os.path.dirname(probe)
    return probe


def main():
    op, root, rel = sys.argv[1], os.path.realpath(sys.argv[2]), sys.argv[3]
    path = os.path.join(root, rel) if rel else root
    writing = op in ("check-upload", "write")
    if writing:
        if not inside(root, nearest_existing(root, os.path.dirname(path))):
            out(error="outside")
    elif not inside(root, path):
        out(error="outside")
    elif not os.path.lexists(path):
        out(error="missing")
    if op == "stat":
        st = os.lstat(path)
        out(type=kind(st), size=st.st_size)
    if op == "check-upload":
        out(type=kind(os.lstat(path)) if os.path.lexists(path) else "none")
    if op == "list":
        if not os.path.isdir(path):
            out(error="notdir")
        items = []
        for name in os.listdir(path):
            if len(items) >= MAX_ENTRIES:
                out(items=items, truncated=True)
            try:
                st = os.lstat(os.path.join(path, name))
            except OSError:
                continue
            items.append([name, kind(st), st.st_size, st.st_mtime])
        out(items=items)
    if op == "walk":
        # Regular files below a folder (no link followed, dot-entries skipped): a sync's view.
        files = []
        for top, dirs, names in os.walk(path):
            dirs[:] = [
                d
                for d in dirs
                if not d.startswith(".") and not os.path.islink(os.path.join(top, d))
            ]
            for name in names:
                if name.startswith("."):
                    continue
                full = os.path.join(top, name)
                st = os.lstat(full)
                if stat.S_ISREG(st.st_mode):
                    files.append([os.path.relpath(full, path), st.st_size, st.st_mtime])
                if len(files) >= MAX_ENTRIES:
                    out(files=files, truncated=True)
        out(files=files)
    if op == "delete":
        if os.path.isdir(path) and not os.path.islink(path):
            out(error="isdir")
        os.unlink(path)
        out(ok=True)
    if op == "read":
        read_file(path)
    if op == "write":
        write_file(path, int(sys.argv[4]))
    out(error="unknown operation %r" % op)


def read_file(path):
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK)
    except OSError as exc:
        out(error="cannot read: %s" % exc.strerror)
    st = os.fstat(fd)
    if not stat.S_ISREG(st.st_mode):
        out(error="not a regular file")
    os.set_blocking(fd, True)
    sys.stdout.write(json.dumps({"size": st.st_size}) + "\n")
    sys.stdout.flush()
    left = st.st_size
    sink = sys.stdout.buffer
    while left > 0:
        chunk = os.read(fd, min(1 << 20, left))
        if not chunk:
            break  # it shrank: the reader sees fewer bytes than announced and fails
        sink.write(chunk)
        left -= len(chunk)
    sink.flush()
    sys.exit(0)


def write_file(path, expected):
    folder = os.path.dirname(path)
    try:
        os.makedirs(folder, exist_ok=True)
    except OSError as exc:
        out(error="cannot create the folder: %s" % exc.strerror)
    if os.path.lexists(path) and not stat.S_ISREG(os.lstat(path).st_mode):
        out(error="not a regular file")
    tmp = os.path.join(folder, ".sk-upload-%d-%s" % (os.getpid(), os.urandom(4).hex()))
    size = 0
    try:
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o644)
        with os.fdopen(fd, "wb") as fh:
            source = sys.stdin.buffer
            while True:
                chunk = source.read1(1 << 20) if hasattr(source, "read1") else source.read(1 << 20)
                if not chunk:
                    break
                fh.write(chunk)
                size += len(chunk)
        if size != expected:
            os.unlink(tmp)
            out(
                error="the upload ended after %d of %d bytes; nothing was written"
                % (size, expected)
            )
        os.replace(tmp, path)
    except OSError as exc:
        try:
            os.unlink(tmp)
        except OSError:
            pass
        out(error="cannot write: %s" % exc.strerror)
    out(size=size)


if __name__ == "__main__":
    main()
