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
``root``, then walked by :mod:`.beneath`, the walk the host uses on its own folders:
one component at a time beneath an open folder, never following a link, files placed
whole through an ``O_EXCL`` temporary, trees removed through descriptors. The files
sandbox moves bytes in and out of the workspace through ``STAGE``, a folder of its own
no other code can reach, so the engine's file API never resolves a path in the hostile
folder.

Standard library only, Python >= 3.8. Invoked as ``python3 -I -c SOURCE OP ROOT REL
[ARG...]`` (``-I``: nothing from the current folder or the environment is imported):

* ``entry``, ``list``, ``delete``, ``mkdir``, ``remove``, ``move DST``, ``copy DST``,
  ``check-upload``, ``stage-out TOKEN``, ``stage-in TOKEN SIZE``, ``unstage TOKEN``,
  ``walk``: one JSON line on stdout; a refusal is ``{"error": CODE, "which": "src" |
  "dst", ...}`` (:class:`.beneath.Refused`) with CODE an errno name (``ENOENT``), one
  of the walk's (``notfile``, ``target``, ``folder``, ``inway``, ``changed``, ...) or
  one of ours (``outside``, ``workspace``, ``stage``, ``incomplete``);
* ``read``: a JSON line ``{"size": N}`` (or ``{"error": ...}``), then exactly N bytes;
* ``write`` (with the expected size as a fifth argument): stdin to a temporary beside
  the target (parents made), renamed into place only when exactly that many bytes
  came; then one JSON line ``{"size": N}`` or ``{"error": ...}``.
"""

import json
import os
import stat
import sys
import time

from . import beneath
from .beneath import DIR_FLAGS, MAX_ENTRIES, Refused, held, kind, refusal

# The files sandbox's own folder for bytes on their way in or out (never the volume).
STAGE = "/tmp/.sk-files-stage"
STAGE_MAX_AGE = 24 * 3600  # seconds before a forgotten staged file is swept


def out(**kw):
    sys.stdout.write(json.dumps(kw) + "\n")
    sys.stdout.flush()
    sys.exit(0)


def inside(root, path):
    real = os.path.realpath(path)
    return real == root or real.startswith(root.rstrip("/") + "/")


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


def open_root(root, which="src"):
    """A descriptor of the workspace folder ``root``."""
    try:
        return os.open(root, DIR_FLAGS)
    except OSError as exc:
        raise refusal(exc, which) from None


def folder(root, parts, which="src", create=False):
    """A descriptor of the folder ``parts`` beneath ``root`` (made when ``create``)."""
    with held(open_root(root, which)) as root_fd:
        return beneath.walk(root_fd, parts, which, create)


# -- the operations -----------------------------------------------------------------
def op_entry(root, rel):
    parts = parts_of(root, rel, "src", enter=False, named=False)
    with held(open_root(root)) as fd:
        st = beneath.stat_beneath(fd, parts)
    out(type=kind(st.st_mode), size=st.st_size, modified=st.st_mtime)


def op_list(root, rel):
    with held(folder(root, parts_of(root, rel, "src", enter=True, named=False))) as fd:
        items, truncated = beneath.scan(fd)
    listed = [[name, kind(st.st_mode), st.st_size, st.st_mtime] for name, st in items]
    out(items=listed, truncated=truncated)


def op_delete(root, rel):
    """A file, link or special file; a folder is refused (the REST route's delete)."""
    parts = parts_of(root, rel, "src", enter=False, named=True)
    with held(folder(root, parts[:-1])) as fd:
        beneath.delete(fd, parts[-1])
    out(ok=True)


def op_mkdir(root, rel):
    parts = parts_of(root, rel, "src", enter=False, named=True)
    with held(folder(root, parts[:-1])) as fd:
        beneath.make_folder_at(fd, parts[-1], exist_ok=False)
    out(ok=True)


def op_remove(root, rel):
    parts = parts_of(root, rel, "src", enter=False, named=True)
    with held(folder(root, parts[:-1])) as fd:
        beneath.remove(fd, parts[-1], "/".join(parts))
    out(ok=True)


def op_move(root, rel, dst):
    src_parts = parts_of(root, rel, "src", enter=False, named=True)
    dst_parts = parts_of(root, dst, "dst", enter=False, named=True)
    with held(folder(root, src_parts[:-1])) as src_fd:
        with held(folder(root, dst_parts[:-1], "dst")) as dst_fd:
            beneath.move(src_fd, src_parts[-1], dst_fd, dst_parts[-1])
    out(ok=True)


def op_copy(root, rel, dst):
    src_parts = parts_of(root, rel, "src", enter=True, named=True)
    dst_parts = parts_of(root, dst, "dst", enter=False, named=True)
    with held(folder(root, src_parts[:-1])) as src_dir:
        fd, st = beneath.open_regular(src_dir, src_parts[-1])
    with held(fd), held(folder(root, dst_parts[:-1], "dst", create=True)) as dst_dir:
        beneath.check_target(dst_dir, dst_parts[-1])
        beneath.place(dst_dir, dst_parts[-1], fd, st.st_size)
    out(size=st.st_size)


def op_check_upload(root, rel):
    """Before an upload's bytes come: its folders are real folders (or missing: they
    will be made), the target a regular file or nothing; the stage is ready."""
    parts = parts_of(root, rel, "dst", enter=False, named=True)
    fd = open_root(root, "dst")
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
            beneath.check_target(fd, parts[-1])
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
    with held(folder(root, parts[:-1])) as src_dir:
        fd, st = beneath.open_regular(src_dir, parts[-1])
    with held(fd), held(stage_folder()) as stage:
        sweep(stage)
        beneath.place(stage, name, fd, st.st_size)
    out(size=st.st_size, modified=st.st_mtime, staged=STAGE + "/" + name)


def op_stage_in(root, rel, token, size):
    """Put an uploaded file from the stage in place (parents made), whole or not at all;
    the staged file is gone afterwards, whatever happened."""
    name = staged_name("in-", token)
    stage = stage_folder()
    try:
        parts = parts_of(root, rel, "dst", enter=False, named=True)
        try:
            fd, st = beneath.open_regular(stage, name, "stage")
        except Refused:
            raise Refused("incomplete", "dst") from None
        with held(fd):
            if st.st_size != int(size):
                raise Refused("incomplete", "dst")
            with held(folder(root, parts[:-1], "dst", create=True)) as dst_dir:
                beneath.check_target(dst_dir, parts[-1])
                beneath.place(dst_dir, parts[-1], fd, st.st_size)
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
            out(**refused.answer())
        except OSError as exc:
            out(**refusal(exc).answer())
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
    """stdin to ``path`` (parents made), put in place only when exactly ``expected``
    bytes came. Outside the workspace, as the sandbox user: links are followed here."""
    folder_path, name = os.path.split(path)
    try:
        os.makedirs(folder_path, exist_ok=True)
        dir_fd = os.open(folder_path, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
    except OSError as exc:
        out(error="cannot create the folder: %s" % exc.strerror)
    with held(dir_fd):
        try:
            beneath.check_target(dir_fd, name)
            with beneath.Temporary(dir_fd) as temporary:
                copy_stdin(temporary)
                if temporary.size != expected:
                    out(
                        error="the upload ended after %d of %d bytes; nothing was written"
                        % (temporary.size, expected)
                    )
                temporary.land(name)
        except Refused as refused:
            if refused.code == "target":
                out(error="not a regular file")
            out(error="cannot write: %s" % refused.details.get("message", refused.code))
        except OSError as exc:
            out(error="cannot write: %s" % exc.strerror)
    out(size=expected)


def copy_stdin(temporary):
    """All of stdin, appended to ``temporary``."""
    source = sys.stdin.buffer
    while True:
        chunk = source.read1(1 << 20) if hasattr(source, "read1") else source.read(1 << 20)
        if not chunk:
            return
        temporary.write(chunk)


if __name__ == "__main__":
    main()
