"""Linux's numbers for the new mount API (``open_tree``, ``move_mount``, ``fsopen``,
``mount_setattr``) and its flags: the same on every architecture since Linux 5.2, and
not in Python's standard library. Used by everything that mounts by descriptor
(idmapped mounts, disk images, protected paths, the local backend's view).
"""

from __future__ import annotations

import os

SYS_OPEN_TREE = 428
SYS_MOVE_MOUNT = 429
SYS_FSOPEN = 430
SYS_FSCONFIG = 431
SYS_FSMOUNT = 432
SYS_MOUNT_SETATTR = 442

AT_FDCWD = -100
AT_EMPTY_PATH = 0x1000
AT_RECURSIVE = 0x8000
AT_SYMLINK_NOFOLLOW = 0x100
OPEN_TREE_CLONE = 1
OPEN_TREE_CLOEXEC = os.O_CLOEXEC
MOVE_MOUNT_F_EMPTY_PATH = 0x4
MOVE_MOUNT_T_EMPTY_PATH = 0x40
MOUNT_ATTR_RDONLY = 0x1
MOUNT_ATTR_NOSUID = 0x2
MOUNT_ATTR_NODEV = 0x4
MOUNT_ATTR_IDMAP = 0x00100000
MNT_DETACH = 2
UMOUNT_NOFOLLOW = 8
