"""File operations run INSIDE a sandbox, on its own files, with its own rights.

Used where the host cannot (or must not) touch the files itself: a Daytona volume is
not on the host at all, and a container's own filesystem (outside the workspace) is
reached through ``docker exec`` rather than the engine's archive API, whose path
resolution is CVE-2018-15664's class. Running as the sandbox user, inside the
sandbox, whatever this program follows stays within what the sandbox may see; it
still refuses paths that lead out of ``root`` so the REST API means the same thing on
every backend.

The workspace operations (everything but ``read``, ``write`` and ``walk``) also hold
where other code rewrites the folder while we work (a Daytona volume, shared with the
user's code sandbox): a path is first refused when its real path leads out of
``root``, then walked one component at a time beneath an open folder, each opened
``O_NOFOLLOW``, so a link swapped in meanwhile is an error, never a detour. Files are
written to an ``O_EXCL`` temporary and renamed into place; folders are removed through
their descriptors, never following a link. The files sandbox moves bytes in and out
of the workspace through ``STAGE``, a folder of its own no other code can reach, so
the engine's file API never resolves a path in the hostile folder.

Standard library only, Python >= 3.8. Invoked as ``python3 -I -c SOURCE OP ROOT REL
[ARG...]`` (``-I``: nothing from the current folder or the environment is imported):

* ``entry``, ``list``, ``delete``, ``mkdir``, ``remove``, ``move DST``, ``copy DST``,
  ``check-upload``, ``stage-out TOKEN``, ``stage-in TOKEN SIZE``, ``unstage TOKEN``,
  ``walk``: one JSON line on stdout; a refusal is ``{"error": CODE, "which": "src" |
  "dst", ...}`` with CODE an errno name (``ENOENT``) or one of ours (``outside``,
  ``notfile``, ``inway``, ``changed``, ``filling``, ``deep``, ``shrank``,
  ``interfered``, ``incomplete``);
* ``read``: a JSON line ``{"size": N}`` (or ``{"error": ...}``), then exactly N bytes;
* ``write`` (with the expected size as a fifth argument): stdin to a temporary beside
  the target (parents made), renamed into place only when exactly that many bytes
  came; then one JSON line ``{"size": N}`` or ``{"error": ...}``.
"""

import contextlib
import errno
import json
import os
import stat
import sys
import time

MAX_ENTRIES = 10000
MAX_DEPTH = 256  # folders deep a removal goes (each level holds a descriptor)
REMOVE_ROUNDS = 8  # passes over a folder that keeps filling while it is removed
CHUNK = 1 << 20
TEMP_PREFIX = ".sk-upload-"
# The files sandbox's own folder for bytes on their way in or out (never the volume).
STAGE = "/tmp/.sk-files-stage"
STAGE_MAX_AGE = 24 * 3600  # seconds before a forgotten staged file is swept
DIR_FLAGS = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC
READ_FLAGS = os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC | os.O_NOCTTY


def out(**kw):
    sys.stdout.write(json.dumps(kw) + "\n")
    sys.stdout.flush()
    sys.exit(0)


class Refused(Exception):
    """A refusal to report: ``code``, about ``which`` path (src or dst), and details."""

    def __init__(self, code, which="src", **details):
        Exception.__init__(self, code)
        self.answer = dict(details, error=code, which=which)


def refusal(exc, which="src"):
    """The refusal reporting an OSError (its errno's name) about ``which`` path."""
    return Refused(errno.errorcode.get(exc.errno or 0, "EIO"), which, message=exc.strerror)


def on(which, fn, *args, **kwargs):
    """``fn(...)``, with an OSError reported as a refusal about ``which`` path."""
    try:
        return fn(*args, **kwargs)
    except OSError as exc:
        raise refusal(exc, which) from None


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


# -- paths beneath the root, walked without following links ---------------------------
def parts_of(root, rel, which, enter, named):
    """The components of ``rel``, refused when its real path leads out of ``root``.

    ``enter``: the operation goes into the item (list, read), so a link at the end
    counts too; else only the folders on the way do (the item itself is never followed).
    ``named``: the path must name an item, not the workspace itself.
    """
    parts = [p for p in rel.split("/") if p not in ("", ".")]
    if ".." in parts:
        raise Refused("outside", which)
    if named and not parts:
        raise Refused("workspace", which)
    path = os.path.join(root, *parts)
    if not inside(root, path if enter or not parts else os.path.dirname(path)):
        raise Refused("outside", which)
    return parts


@contextlib.contextmanager
def held(fd):
    """``fd``, closed when the block ends however it ends (every op opens folders and
    files by descriptor, and a helper that leaks them on a refusal runs out)."""
    try:
        yield fd
    finally:
        os.close(fd)


def folder(root, parts, which, create=False):
    """A descriptor of the folder ``parts`` beneath ``root`` (made when ``create``)."""
    fd = on(which, os.open, root, DIR_FLAGS)
    try:
        for name in parts:
            if create:
                try:
                    os.mkdir(name, 0o755, dir_fd=fd)
                except FileExistsError:
                    pass
                except OSError:
                    pass  # the open below says what is wrong
            nxt = on(which, os.open, name, DIR_FLAGS, dir_fd=fd)
            os.close(fd)
            fd = nxt
    except BaseException:
        os.close(fd)
        raise
    return fd


def lstat_at(dir_fd, name, which):
    """lstat of ``name`` beneath ``dir_fd``, or None when there is nothing."""
    try:
        return os.stat(name, dir_fd=dir_fd, follow_symlinks=False)
    except FileNotFoundError:
        return None
    except OSError as exc:
        raise refusal(exc, which) from None


def open_regular(dir_fd, name, which):
    """(descriptor, stat) of the regular file ``name``: links and special files refused."""
    before = lstat_at(dir_fd, name, which)
    if before is None:
        raise Refused("ENOENT", which, message="No such file or directory")
    if not stat.S_ISREG(before.st_mode):
        raise Refused("notfile", which, kind=kind(before))
    fd = on(which, os.open, name, READ_FLAGS, dir_fd=dir_fd)
    st = os.fstat(fd)
    if not stat.S_ISREG(st.st_mode):  # swapped between the look and the open
        os.close(fd)
        raise Refused("notfile", which, kind=kind(st))
    os.set_blocking(fd, True)
    return fd, st


def same_file(dir_fd, name, ino):
    st = lstat_at(dir_fd, name, "dst")
    return st is not None and stat.S_ISREG(st.st_mode) and st.st_ino == ino


def place(dir_fd, name, source_fd, size):
    """Copy ``size`` bytes of ``source_fd`` to ``name`` beneath ``dir_fd``, whole or not at all."""
    for _ in range(8):
        tmp = TEMP_PREFIX + os.urandom(8).hex()
        try:
            fd = os.open(
                tmp,
                os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC,
                0o600,
                dir_fd=dir_fd,
            )
        except FileExistsError:
            continue
        except OSError as exc:
            raise refusal(exc, "dst") from None
        break
    else:
        raise Refused("interfered", "dst")
    ino = os.fstat(fd).st_ino
    done = False
    try:
        left = size
        while left > 0:
            chunk = os.read(source_fd, min(CHUNK, left))
            if not chunk:
                raise Refused("shrank", "src")
            view = memoryview(chunk)
            while view:
                view = view[os.write(fd, view) :]
            left -= len(chunk)
        os.fchmod(fd, 0o644)
        if not same_file(dir_fd, tmp, ino):
            raise Refused("interfered", "dst")
        try:
            os.rename(tmp, name, src_dir_fd=dir_fd, dst_dir_fd=dir_fd)
        except OSError as exc:
            raise refusal(exc, "dst") from None
        if not same_file(dir_fd, name, ino):
            raise Refused("interfered", "dst", landed=True)
        done = True
    finally:
        os.close(fd)
        if not done and same_file(dir_fd, tmp, ino):
            try:
                os.unlink(tmp, dir_fd=dir_fd)
            except OSError:
                pass


def check_target(dir_fd, name):
    """A file may only replace a regular file (or nothing)."""
    existing = lstat_at(dir_fd, name, "dst")
    if existing is not None and not stat.S_ISREG(existing.st_mode):
        raise Refused("notfile", "dst", kind=kind(existing))
    return existing


# -- the operations -----------------------------------------------------------------
def op_entry(root, rel):
    parts = parts_of(root, rel, "src", enter=False, named=False)
    if not parts:
        with held(folder(root, [], "src")) as fd:
            st = os.fstat(fd)
    else:
        with held(folder(root, parts[:-1], "src")) as fd:
            st = lstat_at(fd, parts[-1], "src")
        if st is None:
            raise Refused("ENOENT", message="No such file or directory")
    out(type=kind(st), size=st.st_size, modified=st.st_mtime)


def op_list(root, rel):
    items = []
    with held(folder(root, parts_of(root, rel, "src", enter=True, named=False), "src")) as fd:
        with os.scandir(fd) as found:
            for item in found:
                if len(items) >= MAX_ENTRIES:
                    out(items=items, truncated=True)
                try:
                    st = item.stat(follow_symlinks=False)
                except OSError:
                    continue  # removed while we looked
                items.append([item.name, kind(st), st.st_size, st.st_mtime])
    out(items=items)


def op_delete(root, rel):
    """A file, link or special file; a folder is refused (the REST route's delete)."""
    parts = parts_of(root, rel, "src", enter=False, named=True)
    with held(folder(root, parts[:-1], "src")) as fd:
        st = lstat_at(fd, parts[-1], "src")
        if st is None:
            raise Refused("ENOENT", message="No such file or directory")
        if stat.S_ISDIR(st.st_mode):
            raise Refused("EISDIR")
        on("src", os.unlink, parts[-1], dir_fd=fd)
    out(ok=True)


def op_mkdir(root, rel):
    parts = parts_of(root, rel, "src", enter=False, named=True)
    with held(folder(root, parts[:-1], "src")) as fd:
        on("src", os.mkdir, parts[-1], 0o755, dir_fd=fd)
    out(ok=True)


def op_remove(root, rel):
    parts = parts_of(root, rel, "src", enter=False, named=True)
    with held(folder(root, parts[:-1], "src")) as fd:
        st = lstat_at(fd, parts[-1], "src")
        if st is None:
            raise Refused("ENOENT", message="No such file or directory")
        remove_item(fd, parts[-1], stat.S_ISDIR(st.st_mode), "/".join(parts), 0)
    out(ok=True)


def remove_item(dir_fd, name, is_dir, shown, depth):
    """Remove ``name`` beneath ``dir_fd``: unlink it, or empty it first if it is a folder."""
    try:
        if is_dir:
            empty_folder(dir_fd, name, shown, depth + 1)
            os.rmdir(name, dir_fd=dir_fd)
        else:
            os.unlink(name, dir_fd=dir_fd)
    except FileNotFoundError:
        return  # gone already: the goal is met
    except OSError as exc:
        if exc.errno in (errno.ENOTEMPTY, errno.ENOTDIR, errno.ELOOP, errno.EISDIR):
            raise Refused("changed", shown=shown) from None
        raise refusal(exc) from None


def empty_folder(parent_fd, name, shown, depth):
    if depth > MAX_DEPTH:
        raise Refused("deep", limit=MAX_DEPTH)
    # ELOOP/ENOTDIR if swapped for a link
    with held(os.open(name, DIR_FLAGS, dir_fd=parent_fd)) as fd:
        for _ in range(REMOVE_ROUNDS):
            with os.scandir(fd) as found:
                items = [(item.name, item.is_dir(follow_symlinks=False)) for item in found]
            if not items:
                return
            for child, is_dir in items:
                remove_item(fd, child, is_dir, shown + "/" + child, depth)
        raise Refused("filling")


def op_move(root, rel, dst):
    src_parts = parts_of(root, rel, "src", enter=False, named=True)
    dst_parts = parts_of(root, dst, "dst", enter=False, named=True)
    with held(folder(root, src_parts[:-1], "src")) as src_fd:
        with held(folder(root, dst_parts[:-1], "dst")) as dst_fd:
            try:
                os.rename(src_parts[-1], dst_parts[-1], src_dir_fd=src_fd, dst_dir_fd=dst_fd)
            except OSError as exc:
                if exc.errno == errno.EINVAL:
                    raise Refused("intoself") from None
                if exc.errno in (errno.EISDIR, errno.ENOTEMPTY, errno.EEXIST):
                    raise Refused("inway", "dst") from None
                which = "src" if exc.errno == errno.ENOENT else "dst"
                raise refusal(exc, which) from None
    out(ok=True)


def op_copy(root, rel, dst):
    src_parts = parts_of(root, rel, "src", enter=True, named=True)
    dst_parts = parts_of(root, dst, "dst", enter=False, named=True)
    with held(folder(root, src_parts[:-1], "src")) as src_dir:
        fd, st = open_regular(src_dir, src_parts[-1], "src")
    with held(fd), held(folder(root, dst_parts[:-1], "dst", create=True)) as dst_dir:
        check_target(dst_dir, dst_parts[-1])
        place(dst_dir, dst_parts[-1], fd, st.st_size)
    out(size=st.st_size)


def op_check_upload(root, rel):
    """Before an upload's bytes come: its folders are real folders (or missing: they
    will be made), the target a regular file or nothing; the stage is ready."""
    parts = parts_of(root, rel, "dst", enter=False, named=True)
    fd = on("dst", os.open, root, DIR_FLAGS)
    try:
        for name in parts[:-1]:
            try:
                nxt = os.open(name, DIR_FLAGS, dir_fd=fd)
            except FileNotFoundError:
                break
            except OSError as exc:
                raise refusal(exc, "dst") from None
            os.close(fd)
            fd = nxt
        else:
            check_target(fd, parts[-1])
    finally:
        os.close(fd)
    os.close(stage_folder())
    out(ok=True)


def stage_folder():
    """A descriptor of STAGE, ours alone (made on first use)."""
    try:
        os.mkdir(STAGE, 0o700)
    except FileExistsError:
        pass
    fd = os.open(STAGE, DIR_FLAGS)
    st = os.fstat(fd)
    if st.st_uid != os.getuid() or st.st_mode & 0o077:
        os.close(fd)
        raise Refused("stage", message="%s is not a private folder of ours" % STAGE)
    return fd


def staged_name(prefix, token):
    if len(token) != 32 or any(c not in "0123456789abcdef" for c in token):
        raise Refused("stage", message="bad stage token")
    return prefix + token


def op_stage_out(root, rel, token):
    """Copy a workspace file to the stage (at most its size when opened), for download."""
    name = staged_name("out-", token)
    parts = parts_of(root, rel, "src", enter=True, named=True)
    with held(folder(root, parts[:-1], "src")) as src_dir:
        fd, st = open_regular(src_dir, parts[-1], "src")
    with held(fd), held(stage_folder()) as stage:
        sweep(stage)
        place(stage, name, fd, st.st_size)
    out(size=st.st_size, modified=st.st_mtime, staged=STAGE + "/" + name)


def op_stage_in(root, rel, token, size):
    """Put an uploaded file from the stage in place (parents made), whole or not at all;
    the staged file is gone afterwards, whatever happened."""
    name = staged_name("in-", token)
    stage = stage_folder()
    try:
        parts = parts_of(root, rel, "dst", enter=False, named=True)
        try:
            fd, st = open_regular(stage, name, "stage")
        except Refused:
            raise Refused("incomplete", "dst") from None
        with held(fd):
            if st.st_size != int(size):
                raise Refused("incomplete", "dst")
            with held(folder(root, parts[:-1], "dst", create=True)) as dst_dir:
                check_target(dst_dir, parts[-1])
                place(dst_dir, parts[-1], fd, st.st_size)
    finally:
        try:
            os.unlink(name, dir_fd=stage)
        except OSError:
            pass
        os.close(stage)
    out(size=int(size))


def op_unstage(root, rel, token):
    with held(stage_folder()) as stage:
        for prefix in ("in-", "out-"):
            try:
                os.unlink(staged_name(prefix, token), dir_fd=stage)
            except FileNotFoundError:
                pass
    out(ok=True)


def sweep(stage):
    """Forget staged files a broken request left behind."""
    now = time.time()
    for item in os.scandir(stage):
        try:
            if now - item.stat(follow_symlinks=False).st_mtime > STAGE_MAX_AGE:
                os.unlink(item.name, dir_fd=stage)
        except OSError:
            pass


WORKSPACE_OPS = {
    "entry": op_entry,
    "list": op_list,
    "delete": op_delete,
    "mkdir": op_mkdir,
    "remove": op_remove,
    "move": op_move,
    "copy": op_copy,
    "check-upload": op_check_upload,
    "stage-out": op_stage_out,
    "stage-in": op_stage_in,
    "unstage": op_unstage,
}


def main():
    op, root, rel = sys.argv[1], os.path.realpath(sys.argv[2]), sys.argv[3]
    path = os.path.join(root, rel) if rel else root
    if op in WORKSPACE_OPS:
        try:
            WORKSPACE_OPS[op](root, rel, *sys.argv[4:])
        except Refused as refused:
            out(**refused.answer)
        except OSError as exc:
            out(**refusal(exc).answer)
    if op == "write":
        if not inside(root, nearest_existing(root, os.path.dirname(path))):
            out(error="outside")
        write_file(path, int(sys.argv[4]))
    elif not inside(root, path):
        out(error="outside")
    elif not os.path.lexists(path):
        out(error="missing")
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
    if op == "read":
        read_file(path)
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
