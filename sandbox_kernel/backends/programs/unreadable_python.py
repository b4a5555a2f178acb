"""Make the sandbox's python3 startable without a moment's exposure: run AS ROOT in the
sandbox, ``unreadable_python NAME``, once per container.

A process of ours starts as ``python3`` and makes itself non-dumpable a few milliseconds
later (boot.py). Until then any process of the same uid, such as a cell, may open its
``/proc/<pid>/fd/0`` and copy what the host sends after (``tee(2)`` takes it without
taking it away), or ptrace it and keep control after. Linux starts a process
non-dumpable when the file it executes is not readable by it. So this copies the
python3 that the sandbox's PATH finds, into the same folder (a virtual environment's
``pyvenv.cfg`` is found from there, as for python3 itself) as NAME, owned by root and
mode 0711: executable by the sandbox's user, not readable.

Only where the user cannot change what we copy, nor the copy: the folder and the file
owned by root and writable by nobody else, the file a regular file and an ELF program
(a script would need to be read). Prints the copy's path, or nothing (the host then
keeps starting python3). Standard library only, any python3 >= 3.8.
"""

import os
import shutil
import stat
import sys

LIMIT = 1 << 30  # a python3 larger than this is not one we copy


def root_only(st):
    return st.st_uid == 0 and not st.st_mode & (stat.S_IWGRP | stat.S_IWOTH)


def copy_unreadable(name):
    found = shutil.which("python3")
    if not found:
        return ""
    folder = os.path.dirname(os.path.abspath(found))
    real = os.path.realpath(found)
    if not all(root_only(os.stat(path)) for path in (folder, os.path.dirname(real))):
        return ""
    source = os.open(real, os.O_RDONLY | os.O_NONBLOCK | os.O_NOFOLLOW)
    try:
        st = os.fstat(source)
        if not stat.S_ISREG(st.st_mode) or not root_only(st) or st.st_size > LIMIT:
            return ""
        if os.pread(source, 4, 0) != b"\x7fELF":
            return ""
        target = os.path.join(folder, name)
        try:
            have = os.lstat(target)
        except FileNotFoundError:
            have = None
        if (
            have is not None
            and stat.S_ISREG(have.st_mode)
            and have.st_uid == 0
            and stat.S_IMODE(have.st_mode) == 0o711
            and have.st_size == st.st_size
            and have.st_mtime_ns == st.st_mtime_ns
        ):
            return target  # made before, by this program (same size and time)
        temporary = f"{target}.{os.getpid()}"
        out = os.open(temporary, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, 0o700)
        try:
            done = 0
            while done < st.st_size:
                sent = os.sendfile(out, source, done, st.st_size - done)
                if not sent:
                    raise OSError(f"{real} shrank while it was copied")
                done += sent
            os.fchown(out, 0, 0)
            os.fchmod(out, 0o711)
            os.utime(out, ns=(st.st_atime_ns, st.st_mtime_ns))
            os.fsync(out)
            # Out of the page cache, which counts in the sandbox's memory: an interpreter
            # brings back only the pages it runs.
            os.posix_fadvise(out, 0, 0, os.POSIX_FADV_DONTNEED)
        except BaseException:
            os.unlink(temporary)
            raise
        finally:
            os.close(out)
        os.rename(temporary, target)
        return target
    finally:
        os.close(source)


if __name__ == "__main__":
    if os.geteuid() != 0:
        sys.exit("unreadable_python: must run as root")
    print(copy_unreadable(sys.argv[1]))
