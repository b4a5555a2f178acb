"""Disk images that bound a folder: sparse ext4 files the host mounts over it.

A flavor's ``disk`` needs a real bound where the host file system has none to give (no
project quotas on ext4 as mounted, no quota-capable storage driver), for the workspace
folder and for a container's own files. Here a bound is a file system of its own: a
sparse file of the flavor's size in ``<state_dir>/disks`` (a root-only folder no
sandbox sees), formatted ext4 (``mkfs.ext4``), attached to a loop device and mounted
over the folder by this host, ``nosuid,nodev``. A write past it fails with ENOSPC in
the sandbox, and the host's disk gains at most the image's size: the file is sparse
(``noinit_itable``, lazy journal), and ``discard`` gives freed blocks back to the host.

Every step avoids following what a sandbox could have planted: the image is created
``O_EXCL | O_NOFOLLOW`` beneath the state folder, the folder to mount over is opened
``O_NOFOLLOW`` beneath its parent and the mount is attached to that descriptor
(``move_mount``), the loop device is set up by ``ioctl`` on the image's descriptor, and
a mount found there counts as ours only when its loop device's backing file is our
image.

An image never shrinks. It grows online (``LOOP_SET_CAPACITY``, then ``resize2fs`` on
the mounted file system) where the server may resize a mounted file system (root with
CAP_SYS_RESOURCE); elsewhere the file is made larger at once and the file system
follows offline (``e2fsck``, ``resize2fs``) the next time nothing has it mounted: a
sandbox's own disk at its next start, a workspace when none of its user's sandboxes
runs. Only root can do any of this: :func:`support` says whether this host can, and
why not.
"""

from __future__ import annotations

import ctypes
import errno
import fcntl
import os
import shutil
import stat
import struct
import subprocess
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from functools import lru_cache
from pathlib import Path

from .mount_api import (
    MNT_DETACH,
    MOUNT_ATTR_NODEV,
    MOUNT_ATTR_NOSUID,
    MOVE_MOUNT_F_EMPTY_PATH,
    MOVE_MOUNT_T_EMPTY_PATH,
    SYS_FSCONFIG,
    SYS_FSMOUNT,
    SYS_FSOPEN,
    SYS_MOVE_MOUNT,
    UMOUNT_NOFOLLOW,
)

# fsopen, fsconfig and fsmount flags (the numbers are in mount_api.py).
_FSOPEN_CLOEXEC = 1
_FSCONFIG_SET_FLAG = 0
_FSCONFIG_SET_STRING = 1
_FSCONFIG_CMD_CREATE = 6
_FSMOUNT_CLOEXEC = 1
# Loop devices (linux/loop.h).
_LOOP_SET_FD = 0x4C00
_LOOP_SET_STATUS64 = 0x4C04
_LOOP_SET_CAPACITY = 0x4C07
_LOOP_CONFIGURE = 0x4C0A
_LOOP_CTL_GET_FREE = 0x4C82
_LO_FLAGS_AUTOCLEAR = 4
_LOOP_MAJOR = 7
_CAP_SYS_RESOURCE = 24
_LOOP_INFO64 = struct.Struct("QQQQQIIII64s64s32sQQ")
_LOOP_CONFIG = struct.Struct(f"II{_LOOP_INFO64.size}s64x")

_DIR_FLAGS = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC
PROGRAMS = "/usr/sbin:/sbin:/usr/bin:/bin"  # where e2fsprogs lives, never a PATH a user set
# Kinds of image: a user's workspace (kept as long as the workspace), a sandbox's own
# files (gone with the sandbox).
WORKSPACE = "workspace"
SANDBOX = "sandbox"
FRESH = 600.0  # seconds a new image is spared by a sweep (its sandbox may be being made)


class DiskError(OSError):
    """A disk image could not be made, mounted or grown; the message says why."""


@dataclass(frozen=True)
class Support:
    """Whether this host can bound folders with disk images, and if not why."""

    ok: bool
    reason: str = ""


@lru_cache(maxsize=1)
def support() -> Support:
    """Root, loop devices, the mount API and e2fsprogs: what disk images need here."""
    if not os.uname().sysname == "Linux":
        return Support(False, "disk images need Linux")
    if os.geteuid() != 0:
        return Support(
            False,
            "the server does not run as root, and only root can mount the disk images "
            "that bound it; the host file system's own quota is the only bound",
        )
    if not Path("/dev/loop-control").exists():
        return Support(False, "this host has no loop devices (/dev/loop-control; modprobe loop)")
    for program in ("mkfs.ext4", "e2fsck", "resize2fs"):
        if not shutil.which(program, path=PROGRAMS):
            return Support(False, f"{program} is missing (apt-get install e2fsprogs)")
    try:
        with open("/proc/filesystems", encoding="ascii") as fh:
            if not any(line.split()[-1:] == ["ext4"] for line in fh):
                return Support(False, "this kernel has no ext4 (modprobe ext4)")
    except OSError as exc:
        return Support(False, f"cannot read /proc/filesystems ({exc.strerror})")
    probe = _libc().syscall(SYS_FSOPEN, b"ext4", _FSOPEN_CLOEXEC)
    if probe < 0:
        err = ctypes.get_errno()
        return Support(False, f"this kernel cannot mount by descriptor ({os.strerror(err)})")
    os.close(probe)
    return Support(True)


def _libc() -> ctypes.CDLL:
    return ctypes.CDLL(None, use_errno=True)


def _check(result: int, what: str) -> int:
    if result < 0:
        err = ctypes.get_errno()
        raise DiskError(err, f"{what}: {os.strerror(err)}")
    return result


@dataclass(frozen=True)
class Usage:
    """Bytes used and the size of a mounted image (what the sandbox can fill)."""

    used: int
    total: int


class DiskImages:
    """One installation's disk images, in ``<state_dir>/disks/<kind>/<name>.img``."""

    def __init__(self, state_dir: str) -> None:
        self.folder = Path(state_dir) / "disks"

    def image(self, kind: str, name: str) -> Path:
        """Where image ``name`` of ``kind`` lives (it may not exist)."""
        if not name or "/" in name or name.startswith("."):
            raise DiskError(errno.EINVAL, f"bad disk image name {name!r}")
        return self.folder / kind / f"{name}.img"

    def size(self, kind: str, name: str) -> int:
        """The image's size in bytes (0: there is none)."""
        try:
            st = os.lstat(self.image(kind, name))
        except OSError:
            return 0
        return st.st_size if stat.S_ISREG(st.st_mode) else 0

    def names(self, kind: str) -> list[str]:
        """The images of one kind, by name."""
        try:
            return sorted(p.stem for p in (self.folder / kind).glob("*.img"))
        except OSError:
            return []

    @contextmanager
    def _locked(self, kind: str, name: str) -> Iterator[None]:
        """One process at a time makes, mounts or grows one image."""
        folder = self._kind_folder(kind)
        fd = os.open(folder / f"{name}.lock", os.O_RDWR | os.O_CREAT | os.O_NOFOLLOW, 0o600)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX)
            yield
        finally:
            os.close(fd)

    def _kind_folder(self, kind: str) -> Path:
        folder = self.folder / kind
        folder.mkdir(parents=True, exist_ok=True, mode=0o700)
        for level in (self.folder, folder):  # root's alone, whatever made it before
            st = os.lstat(level)
            if not stat.S_ISDIR(st.st_mode) or st.st_uid != os.geteuid():
                raise DiskError(errno.EPERM, f"{level} is not a folder of ours: no disk kept there")
            if st.st_mode & 0o077:
                os.chmod(level, 0o700)
        return folder

    # -- mounting ----------------------------------------------------------------------
    def mount(
        self,
        kind: str,
        name: str,
        size: int,
        target: Path,
        *,
        fill: Callable[[str], None] | None = None,
        owner: tuple[int, int] | None = None,
        only_if_empty: bool = False,
    ) -> bool:
        """Mount image ``name`` (made at ``size`` bytes when it does not exist yet; grown
        to ``size`` when smaller) over the folder ``target``; True when it is mounted
        there now. ``fill(path)`` fills a new image before it is attached (``path`` is
        its root); ``owner`` owns a new image's root; with ``only_if_empty``, a folder
        that holds files and has no image yet is left as it is (False): mounting would
        hide them. Another image mounted there (another installation's, sharing the
        folder) is left as it is and bounds it (True, never grown); raises
        :class:`DiskError` when another kind of file system is mounted there."""
        with self._locked(kind, name):
            image = self.image(kind, name)
            with _folder(target) as (parent_fd, target_fd):
                mounted = _mounted_image(parent_fd, target_fd)
                if mounted == "":
                    raise DiskError(errno.EBUSY, f"{target} has another file system mounted on it")
                if mounted is not None and mounted != str(image):
                    return True
                if mounted is None:
                    exists = _exists(image)
                    if not exists and only_if_empty and _has_entries(target_fd):
                        return False
                    if not exists:
                        _make_image(image, size, owner)
                    elif not _loop_devices_of(image):  # mounted nowhere: grow it offline now
                        _grow_offline(image, size)
                    _attach(image, target_fd, fill if not exists else None)
            if size > fs_size(image):
                self._grow(kind, name, size)
        return True

    def pending(self, kind: str, name: str) -> bool:
        """Whether the image was made larger than its file system is yet (growing it
        waits for a moment when nothing has it mounted: see :meth:`settle`)."""
        image = self.image(kind, name)
        return _exists(image) and fs_size(image) < self.size(kind, name)

    def settle(self, kind: str, name: str, target: Path) -> bool:
        """Give a grown image's file system its new size, offline, when the caller knows
        that nothing else uses it: take it off ``target``, grow it, mount it again.
        False (and still mounted) when it is still in use after all."""
        with self._locked(kind, name):
            image = self.image(kind, name)
            if not _exists(image) or fs_size(image) >= self.size(kind, name):
                return True
            if _libc().umount2(os.fsencode(target), UMOUNT_NOFOLLOW) != 0:
                return False  # busy: a process of this host works in it
            held = any(mounted == str(image) for mounted, _ in mount_points())
            deadline = time.monotonic() + (0 if held else 5)
            while _loop_devices_of(image) and time.monotonic() < deadline:
                time.sleep(0.02)  # the device detaches itself once its last user is gone
            with _folder(target) as (parent_fd, target_fd):
                if not _loop_devices_of(image):
                    _grow_offline(image, self.size(kind, name))
                # Still attached: mounted elsewhere (a container's bind), so only the same
                # device may be mounted again here, as it is.
                _attach(image, target_fd, None)
            return fs_size(image) >= self.size(kind, name)

    def mounted_at(self, kind: str, name: str, target: Path) -> bool:
        """Whether image ``name`` is what is mounted over ``target`` now."""
        try:
            with _folder(target, create=False) as (parent_fd, target_fd):
                return _mounted_image(parent_fd, target_fd) == str(self.image(kind, name))
        except OSError:
            return False

    def grow(self, kind: str, name: str, size: int) -> bool:
        """Make an image ``size`` bytes large, never smaller: its file system grows at
        once where it can be grown mounted, else at the next :meth:`settle` or mount.
        Whether the file system has the new size now."""
        with self._locked(kind, name):
            return self._grow(kind, name, size)

    def _grow(self, kind: str, name: str, size: int) -> bool:
        image = self.image(kind, name)
        fd = _open_image(image, os.O_RDWR)
        try:
            if os.fstat(fd).st_size < size:
                os.ftruncate(fd, size)
        finally:
            os.close(fd)
        size = self.size(kind, name)
        if fs_size(image) >= size:
            return True
        devices = _loop_devices_of(image)
        if not devices:
            _grow_offline(image, size)
            return True
        if not grows_online():
            return False  # see settle
        for device in devices:
            loop = os.open(device, os.O_RDONLY | os.O_CLOEXEC)
            try:
                fcntl.ioctl(loop, _LOOP_SET_CAPACITY, 0)
            finally:
                os.close(loop)
        ran = subprocess.run(
            [_program("resize2fs"), devices[0]], capture_output=True, text=True, check=False
        )
        if ran.returncode != 0:
            raise DiskError(
                errno.EIO, f"resize2fs {devices[0]} failed: {ran.stderr.strip()[-300:]}"
            )
        return fs_size(image) >= size

    def remove(self, kind: str, name: str) -> None:
        """Delete an image that nothing mounts any more."""
        with self._locked(kind, name):
            image = self.image(kind, name)
            if _loop_devices_of(image):
                raise DiskError(errno.EBUSY, f"{image} is still mounted")
            image.unlink(missing_ok=True)
        (self.folder / kind / f"{name}.lock").unlink(missing_ok=True)

    def sweep(self, kind: str, live: set[str]) -> list[str]:
        """Remove the images of ``kind`` not named in ``live`` and not in use, sparing
        those made in the last FRESH seconds; the names removed."""
        gone = []
        for name in self.names(kind):
            image = self.image(kind, name)
            try:
                young = time.time() - os.lstat(image).st_mtime < FRESH
            except OSError:
                continue
            if name in live or young or _loop_devices_of(image):
                continue
            self.remove(kind, name)
            gone.append(name)
        return gone


def unmount(target: Path) -> None:
    """Take whatever is mounted over ``target`` off it (detached: a process still inside
    keeps it until it leaves); an image's loop device then goes by itself."""
    _libc().umount2(os.fsencode(target), MNT_DETACH | UMOUNT_NOFOLLOW)


def release_beneath(folder: str | Path) -> list[str]:
    """Unmount every disk image kept or mounted beneath ``folder`` (a state folder, a
    workspace root), wherever it is mounted: what removing such a folder needs first
    (``rm -rf`` stops at a mount); the folders unmounted."""
    root = os.path.realpath(folder)
    done = []
    for image, target in mount_points():
        if any(path == root or path.startswith(root + "/") for path in (image, target)):
            unmount(Path(target))
            done.append(target)
    return done


def mounted() -> dict[str, str]:
    """{image file: a folder it is mounted on} for every loop-mounted image of this host's
    mount table (one read of it and of the loop devices, however many images)."""
    found: dict[str, str] = {}
    for image, folder in mount_points():
        found.setdefault(image, folder)
    return found


def mount_points() -> list[tuple[str, str]]:
    """(image file, folder) for every mount of a loop-mounted image on this host."""
    devices = {}
    for entry in Path("/sys/block").glob("loop*"):
        try:
            backing = (entry / "loop" / "backing_file").read_text(errors="surrogateescape")
            number = (entry / "dev").read_text().strip()
        except OSError:
            continue
        devices[number] = backing.rstrip("\n")
    found = []
    try:
        with open("/proc/self/mountinfo", encoding="utf-8", errors="surrogateescape") as fh:
            for line in fh:
                fields = line.split(" ")
                if len(fields) > 4 and fields[2] in devices and fields[3] == "/":
                    found.append((devices[fields[2]], _unescape(fields[4])))
    except OSError:
        pass
    return found


def _unescape(field: str) -> str:
    """mountinfo escapes space, tab, newline and backslash as octal."""
    for code, char in (("\\040", " "), ("\\011", "\t"), ("\\012", "\n"), ("\\134", "\\")):
        field = field.replace(code, char)
    return field


def usage(target: str | Path) -> Usage | None:
    """Use and size of the file system mounted over ``target`` when it is a disk image
    (a loop device's), else None (a plain folder of the host: nothing bounds it)."""
    try:
        with _folder(Path(target), create=False) as (parent_fd, target_fd):
            if _mounted_image(parent_fd, target_fd) is None:
                return None
            st = os.fstatvfs(target_fd)
    except OSError:
        return None
    return Usage(used=(st.f_blocks - st.f_bfree) * st.f_frsize, total=st.f_blocks * st.f_frsize)


@contextmanager
def _folder(target: Path, create: bool = True) -> Iterator[tuple[int, int]]:
    """(parent, folder) descriptors of ``target``, the folder opened without following a
    link (made when ``create``): what a mount is attached to and checked on."""
    parent = target.parent
    if create:
        parent.mkdir(parents=True, exist_ok=True)
    parent_fd = os.open(parent, _DIR_FLAGS)
    try:
        if create:
            try:
                os.mkdir(target.name, 0o755, dir_fd=parent_fd)
            except FileExistsError:
                pass
        try:
            target_fd = os.open(target.name, _DIR_FLAGS, dir_fd=parent_fd)
        except OSError as exc:
            if exc.errno in (errno.ELOOP, errno.ENOTDIR):
                raise DiskError(
                    exc.errno, f"{target} is not a folder (a link?): not mounted on"
                ) from None
            raise
        try:
            yield parent_fd, target_fd
        finally:
            os.close(target_fd)
    finally:
        os.close(parent_fd)


def _mounted_image(parent_fd: int, target_fd: int) -> str | None:
    """The backing file of the loop device mounted over the folder ``target_fd`` (a
    child of ``parent_fd``), "" for a mount of anything else, None for no mount."""
    here, above = os.fstat(target_fd), os.fstat(parent_fd)
    if here.st_dev == above.st_dev and here.st_ino != above.st_ino:
        return None  # the same file system as its parent: a plain folder
    if os.major(here.st_dev) != _LOOP_MAJOR:
        return ""
    return _backing_file(os.minor(here.st_dev))


@lru_cache(maxsize=1)
def grows_online() -> bool:
    """Whether this process may resize a mounted ext4 file system (CAP_SYS_RESOURCE:
    root has it, unless its host took it away)."""
    try:
        with open("/proc/self/status", encoding="ascii") as fh:
            for line in fh:
                if line.startswith("CapEff:"):
                    return bool(int(line.split()[1], 16) >> _CAP_SYS_RESOURCE & 1)
    except (OSError, ValueError):
        pass
    return False


def fs_size(image: Path) -> int:
    """Bytes the ext4 file system in ``image`` spans, from its superblock (0: no image)."""
    try:
        fd = _open_image(image, os.O_RDONLY)
    except OSError:
        return 0
    try:
        block = os.pread(fd, 1024, 1024)
    finally:
        os.close(fd)
    if len(block) < 1024 or block[0x38:0x3A] != b"\x53\xef":  # ext4's magic
        return 0
    low, log_size = struct.unpack_from("<I", block, 4)[0], struct.unpack_from("<I", block, 24)[0]
    incompat = struct.unpack_from("<I", block, 0x60)[0]
    high = struct.unpack_from("<I", block, 0x150)[0] if incompat & 0x80 else 0  # 64bit
    return ((high << 32) | low) * (1024 << log_size)


def _grow_offline(image: Path, size: int) -> None:
    """Grow the file system of an image that nothing mounts to ``size`` bytes."""
    fd = _open_image(image, os.O_RDWR)
    try:
        if os.fstat(fd).st_size < size:
            os.ftruncate(fd, size)
        whole = os.fstat(fd).st_size
    finally:
        os.close(fd)
    if fs_size(image) >= whole:
        return
    # resize2fs insists on a freshly checked file system; -p repairs only what is safe.
    checked = subprocess.run(
        [_program("e2fsck"), "-f", "-p", str(image)], capture_output=True, text=True, check=False
    )
    if checked.returncode >= 4:
        raise DiskError(errno.EIO, f"e2fsck {image} failed: {checked.stdout.strip()[-300:]}")
    ran = subprocess.run(
        [_program("resize2fs"), str(image)], capture_output=True, text=True, check=False
    )
    if ran.returncode != 0:
        raise DiskError(errno.EIO, f"resize2fs {image} failed: {ran.stderr.strip()[-300:]}")


def _open_image(image: Path, flags: int) -> int:
    """A descriptor of the image file at ``image``, only if that is a regular file of
    root's: never through a link, never blocking on a FIFO planted in its place."""
    fd = os.open(image, flags | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC)
    st = os.fstat(fd)
    if not stat.S_ISREG(st.st_mode) or st.st_uid != 0:
        os.close(fd)
        raise DiskError(errno.EPERM, f"{image} is not a disk image made here: not used")
    return fd


def _exists(image: Path) -> bool:
    """Whether something is at the image's path (a link or anything else counts: it is
    then refused when opened, never replaced)."""
    try:
        os.lstat(image)
    except FileNotFoundError:
        return False
    return True


def image_of(device: int) -> str:
    """The image file behind ``device`` (a file's ``st_dev``) when it is a loop device,
    else "" (what a folder's file system is, as a check of what a path holds)."""
    return _backing_file(os.minor(device)) if os.major(device) == _LOOP_MAJOR else ""


def _backing_file(minor: int) -> str:
    try:
        return (
            Path(f"/sys/dev/block/{_LOOP_MAJOR}:{minor}/loop/backing_file")
            .read_text(errors="surrogateescape")
            .rstrip("\n")
        )
    except OSError:
        return ""


def _loop_devices_of(image: Path) -> list[str]:
    """The loop devices whose backing file is ``image`` (a path root's alone: no one
    else can put another file at it)."""
    found = []
    for entry in Path("/sys/block").glob("loop*"):
        try:
            backing = (entry / "loop" / "backing_file").read_text(errors="surrogateescape")
        except OSError:
            continue
        if backing.rstrip("\n") == str(image):
            found.append(f"/dev/{entry.name}")
    return sorted(found)


def _has_entries(fd: int) -> bool:
    """Whether the folder open as ``fd`` holds anything (``lost+found`` of a file system
    that is no longer mounted there counts as nothing)."""
    with os.scandir(fd) as entries:
        return any(entry.name != "lost+found" for entry in entries)


def _program(name: str) -> str:
    found = shutil.which(name, path=PROGRAMS)
    if not found:
        raise DiskError(errno.ENOENT, f"{name} is missing (apt-get install e2fsprogs)")
    return found


def _make_image(image: Path, size: int, owner: tuple[int, int] | None) -> None:
    """A new sparse file of ``size`` bytes with an empty ext4 file system in it."""
    fd = os.open(image, os.O_RDWR | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC, 0o600)
    try:
        os.ftruncate(fd, size)
    finally:
        os.close(fd)
    uid, gid = owner or (0, 0)
    cmd = [
        _program("mkfs.ext4"),
        "-F",
        "-q",
        "-m",
        "0",  # no blocks kept for root: the sandbox's user gets the whole size
        "-E",
        f"lazy_itable_init=1,lazy_journal_init=1,nodiscard,root_owner={uid}:{gid}",
        str(image),
    ]
    made = subprocess.run(cmd, capture_output=True, text=True, check=False)
    if made.returncode != 0:
        image.unlink(missing_ok=True)
        raise DiskError(errno.EIO, f"mkfs.ext4 failed: {made.stderr.strip()[-300:]}")


def _attach(image: Path, target_fd: int, fill: Callable[[str], None] | None) -> None:
    """Loop device for ``image``, its file system mounted over the folder ``target_fd``.
    An image already on a loop device (mounted elsewhere too) is mounted from that one:
    two devices on one file would be two file systems writing one disk."""
    attached = _loop_devices_of(image)
    if attached:
        loop_fd, device = os.open(attached[0], os.O_RDONLY | os.O_CLOEXEC), attached[0]
    else:
        image_fd = _open_image(image, os.O_RDWR)
        try:
            loop_fd, device = _loop_device(image_fd)
        finally:
            os.close(image_fd)
    try:
        mount_fd = _mount_fd(device)
    finally:
        os.close(loop_fd)  # the mount holds the device now; unmounted, it goes (autoclear)
    try:
        root = f"/proc/{os.getpid()}/fd/{mount_fd}"  # for a helper program too
        try:
            os.rmdir(f"{root}/lost+found")  # (when empty) e2fsck makes it again when needed
        except OSError:
            pass
        if fill is not None:
            fill(root)
        _check(
            _libc().syscall(
                SYS_MOVE_MOUNT,
                mount_fd,
                b"",
                target_fd,
                b"",
                MOVE_MOUNT_F_EMPTY_PATH | MOVE_MOUNT_T_EMPTY_PATH,
            ),
            "move_mount",
        )
    finally:
        os.close(mount_fd)


def _loop_device(image_fd: int) -> tuple[int, str]:
    """A free loop device set up on ``image_fd`` to detach itself once unused: (its
    descriptor, its path)."""
    control = os.open("/dev/loop-control", os.O_RDWR | os.O_CLOEXEC)
    try:
        for _ in range(64):  # another process may take the free one first
            number = fcntl.ioctl(control, _LOOP_CTL_GET_FREE)
            device = f"/dev/loop{number}"
            try:
                loop_fd = os.open(device, os.O_RDWR | os.O_CLOEXEC)
            except FileNotFoundError:
                time.sleep(0.01)  # udev has not made the node yet
                continue
            try:
                _configure(loop_fd, image_fd)
            except OSError as exc:
                os.close(loop_fd)
                if exc.errno == errno.EBUSY:
                    continue
                raise DiskError(exc.errno or errno.EIO, f"cannot set up {device}: {exc}") from None
            return loop_fd, device
    finally:
        os.close(control)
    raise DiskError(errno.EBUSY, "no free loop device")


def _configure(loop_fd: int, image_fd: int) -> None:
    info = _LOOP_INFO64.pack(0, 0, 0, 0, 0, 0, 0, 0, _LO_FLAGS_AUTOCLEAR, b"", b"", b"", 0, 0)
    try:
        fcntl.ioctl(loop_fd, _LOOP_CONFIGURE, _LOOP_CONFIG.pack(image_fd, 0, info))
        return
    except OSError as exc:
        if exc.errno not in (errno.EINVAL, errno.ENOTTY):
            raise
    fcntl.ioctl(loop_fd, _LOOP_SET_FD, image_fd)  # before Linux 5.8
    try:
        fcntl.ioctl(loop_fd, _LOOP_SET_STATUS64, info)
    except OSError:
        fcntl.ioctl(loop_fd, 0x4C01)  # LOOP_CLR_FD: not left attached without autoclear
        raise


def _mount_fd(device: str) -> int:
    """A detached mount of the ext4 file system on ``device``: nosuid, nodev, discard
    (freed blocks go back to the host), noinit_itable (the image stays sparse)."""
    libc = _libc()
    fs_fd = _check(libc.syscall(SYS_FSOPEN, b"ext4", _FSOPEN_CLOEXEC), "fsopen(ext4)")
    try:
        _check(
            libc.syscall(
                SYS_FSCONFIG, fs_fd, _FSCONFIG_SET_STRING, b"source", os.fsencode(device), 0
            ),
            f"fsconfig(source={device})",
        )
        for flag in (b"discard", b"noinit_itable"):
            _check(
                libc.syscall(SYS_FSCONFIG, fs_fd, _FSCONFIG_SET_FLAG, flag, None, 0),
                f"fsconfig({flag.decode()})",
            )
        _check(
            libc.syscall(SYS_FSCONFIG, fs_fd, _FSCONFIG_CMD_CREATE, None, None, 0),
            f"mount {device}",
        )
        return _check(
            libc.syscall(
                SYS_FSMOUNT, fs_fd, _FSMOUNT_CLOEXEC, MOUNT_ATTR_NOSUID | MOUNT_ATTR_NODEV
            ),
            "fsmount",
        )
    finally:
        os.close(fs_fd)
