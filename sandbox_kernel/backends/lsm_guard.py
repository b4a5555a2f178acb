"""The kernel's refusal of protected names made after a sandbox starts (a BPF LSM program).

The read-only mounts of ``protected_paths`` (see :mod:`.docker.protect`) hold only what
exists when a sandbox starts. A name made afterwards in a host folder the sandbox writes
(a new ``sub/.git`` carrying ``core.fsmonitor``, a ``.bashrc``, a ``.vscode``) would make
the host user's next ``git status`` or shell run the sandbox's command. This module has
the kernel refuse such names, by name, with no race: a small BPF program on the LSM hooks
that make a name (``path_mkdir``, ``path_mknod`` -- which ``open(O_CREAT)`` goes through
--, ``path_symlink``, ``path_link``, ``path_rename``: both names, so ``RENAME_EXCHANGE``
too) answers ``EPERM`` when

* the folder lies on a mount registered in the installation's map of mounts: the mounts
  a sandbox sees its writable host folders through (its own copies of them, in its own
  mount namespace; the host's view of the same folder is another mount and is never
  touched), keyed by the mount's 64-bit unique id (``STATX_MNT_ID_UNIQUE``, never reused
  before a reboot, so an old entry can never hit another mount; an LRU map, so bounded);
* and the name is a protected name: the first name of a protected path (``.git`` of
  ``.git/config``; a pattern with ``*`` as its prefix and suffix, ``?`` as any one byte),
  or the second name of one made in a folder named as its first (``config`` in a
  ``.git``).

Nothing here is compiled: the program is assembled below from a few dozen eBPF
instructions, with the offsets it needs (a dentry's name and parent, the mount around a
``struct vfsmount`` and its unique id) and the hooks' ids read from the kernel's own BTF
(``/sys/kernel/btf/vmlinux``), and loaded with ``bpf(2)`` through ctypes. What an
installation loads is pinned in bpffs under its own folder
(``/sys/fs/bpf/sandbox-kernel/<installation>/``: the map of mounts, the map of names, one
link per hook), so it outlives the server that loaded it and is found again by the next;
two installations each have their own and never see each other's mounts. Loading and
registering need root (``CAP_BPF``, ``CAP_MAC_ADMIN``, entering a container's mount
namespace): a root server does it at every start of a container (see
:mod:`.docker.protect`); elsewhere the listings say that the guard does not hold, and why.
"""

from __future__ import annotations

import contextlib
import ctypes
import errno
import fcntl
import os
import platform
import re
import struct
from dataclasses import dataclass
from functools import lru_cache
from pathlib import Path

from .mount_api import AT_EMPTY_PATH

#: Where every installation's guard is pinned (bpffs), one folder each.
PIN_ROOT = "/sys/fs/bpf/sandbox-kernel"
#: The version of the program and of its map of names: another one is replaced.
FORMAT = 1
MAX_RULES = 48  # names the program compares (the defaults make about 25)
MAX_MOUNTS = 16384  # mounts registered at once, least recently used forgotten first
_BTF = "/sys/kernel/btf/vmlinux"
_LSM_LIST = "/sys/kernel/security/lsm"
_BPF_FS_MAGIC = 0xCAFE4A11
_HOOKS = {
    # hook: the (folder, name) arguments whose name it makes (rename: both of them)
    "path_mkdir": (("dir", "dentry"),),
    "path_mknod": (("dir", "dentry"),),
    "path_symlink": (("dir", "dentry"),),
    "path_link": (("new_dir", "new_dentry"),),
    "path_rename": (("old_dir", "old_dentry"), ("new_dir", "new_dentry")),
}

# -- the bpf(2) system call --------------------------------------------------------
_SYSCALLS = {"x86_64": (321, 332), "aarch64": (280, 291)}  # bpf, statx
_MAP_CREATE, _MAP_LOOKUP, _MAP_UPDATE, _MAP_DELETE = 0, 1, 2, 3
_PROG_LOAD, _OBJ_PIN, _OBJ_GET, _LINK_CREATE = 5, 6, 7, 28
_MAP_HASH, _MAP_LRU_HASH = 1, 9
_PROG_TYPE_LSM, _LSM_MAC = 29, 27
_STATX_MNT_ID_UNIQUE = 0x4000


class GuardUnavailable(Exception):
    """The kernel cannot hold the guard here; the message says why, in one line."""


@lru_cache(maxsize=1)
def _libc() -> ctypes.CDLL:
    libc = ctypes.CDLL(None, use_errno=True)
    libc.syscall.restype = ctypes.c_long
    return libc


def _numbers() -> tuple[int, int]:
    machine = platform.machine()
    if machine not in _SYSCALLS:
        raise GuardUnavailable(f"no BPF guard on {machine} machines")
    return _SYSCALLS[machine]


def _bpf(cmd: int, attr: bytes | ctypes.Array[ctypes.c_char], what: str) -> int:
    buf = attr if isinstance(attr, ctypes.Array) else ctypes.create_string_buffer(attr, 128)
    result = _libc().syscall(_numbers()[0], cmd, buf, len(buf))
    if result < 0:
        code = ctypes.get_errno()
        raise OSError(code, f"{what}: {os.strerror(code)}")
    return int(result)


def _ptr(data: ctypes.Array[ctypes.c_char]) -> int:
    return ctypes.addressof(data)


def _create_map(kind: int, key: int, value: int, entries: int, name: bytes) -> int:
    attr = struct.pack("<IIIIIII16s", kind, key, value, entries, 0, 0, 0, name)
    return _bpf(_MAP_CREATE, attr, "create a BPF map")


def _update(fd: int, key: bytes, value: bytes) -> None:
    k, v = ctypes.create_string_buffer(key), ctypes.create_string_buffer(value)
    _bpf(_MAP_UPDATE, struct.pack("<IIQQQ", fd, 0, _ptr(k), _ptr(v), 0), "update a BPF map")


def _lookup(fd: int, key: bytes, size: int) -> bytes | None:
    k, v = ctypes.create_string_buffer(key), ctypes.create_string_buffer(size)
    try:
        _bpf(_MAP_LOOKUP, struct.pack("<IIQQQ", fd, 0, _ptr(k), _ptr(v), 0), "read a BPF map")
    except OSError as exc:
        if exc.errno == errno.ENOENT:
            return None
        raise
    return v.raw[:size]


def _pin(fd: int, path: str) -> None:
    name = ctypes.create_string_buffer(path.encode())
    _bpf(_OBJ_PIN, struct.pack("<QII", _ptr(name), fd, 0), f"pin {path}")


def _get(path: str) -> int:
    name = ctypes.create_string_buffer(path.encode())
    return _bpf(_OBJ_GET, struct.pack("<QII", _ptr(name), 0, 0), f"open {path}")


# -- what the kernel's BTF says ------------------------------------------------------
@dataclass(frozen=True)
class Layout:
    """What the program needs to know of this kernel: each hook's BTF id and the
    positions of its (folder, name) arguments, and byte offsets within its structures."""

    hooks: dict[str, tuple[int, tuple[tuple[int, int], ...]]]
    path_mnt: int  # struct path: mnt
    mount_mnt: int  # struct mount: mnt (the struct vfsmount a path points to)
    mount_unique: int  # struct mount: mnt_id_unique
    dentry_name: int  # struct dentry: d_name (struct qstr)
    dentry_parent: int  # struct dentry: d_parent
    qstr_len: int  # struct qstr: len
    qstr_name: int  # struct qstr: name


_KIND_EXTRA = {1: 4, 3: 12, 14: 4, 17: 4}  # int, array, var, decl_tag: bytes after the type
_KIND_MEMBERS = {4: 12, 5: 12, 6: 8, 13: 8, 15: 12, 19: 12}  # bytes per vlen item


@lru_cache(maxsize=1)
def kernel_layout() -> Layout:
    """Read this kernel's BTF; GuardUnavailable when it lacks what the guard needs."""
    try:
        data = Path(_BTF).read_bytes()
    except OSError as exc:
        raise GuardUnavailable(f"the kernel has no BTF ({_BTF}: {exc.strerror})") from None
    magic, _, _, hdr, type_off, type_len, str_off, _ = struct.unpack_from("<HBBIIIII", data)
    if magic != 0xEB9F:
        raise GuardUnavailable(f"{_BTF} is not BTF")
    strings = hdr + str_off

    def name_at(offset: int) -> str:
        start = strings + offset
        return data[start : data.index(b"\0", start)].decode()

    # Every type's (kind, name offset, info, size or type, where its items start).
    types: list[tuple[int, int, int, int, int]] = [(0, 0, 0, 0, 0)]
    structs: dict[str, int] = {}
    funcs: dict[str, int] = {}
    pos, end = hdr + type_off, hdr + type_off + type_len
    while pos < end:
        name_off, info, size = struct.unpack_from("<III", data, pos)
        kind, vlen = (info >> 24) & 0x1F, info & 0xFFFF
        types.append((kind, name_off, info, size, pos + 12))
        if kind == 4 and name_off:
            structs.setdefault(name_at(name_off), len(types) - 1)
        elif kind == 12 and name_off:
            funcs[name_at(name_off)] = len(types) - 1
        pos += 12 + _KIND_EXTRA.get(kind, 0) + _KIND_MEMBERS.get(kind, 0) * vlen

    def member(type_id: int, wanted: str) -> int | None:
        """The byte offset of ``wanted`` in a struct or union, through anonymous members."""
        kind, _, info, _, items = types[type_id]
        if kind not in (4, 5):
            return None
        for index in range(info & 0xFFFF):
            name_off, inner, offset = struct.unpack_from("<III", data, items + 12 * index)
            bits = offset & 0xFFFFFF if info >> 31 else offset
            if name_off and name_at(name_off) == wanted:
                return bits // 8
            if not name_off:
                while types[inner][0] in (8, 9, 10, 11, 18):  # typedef, qualifiers
                    inner = types[inner][3]
                found = member(inner, wanted)
                if found is not None:
                    return bits // 8 + found
        return None

    def offset(struct_name: str, wanted: str) -> int:
        found = member(structs[struct_name], wanted) if struct_name in structs else None
        if found is None:
            raise GuardUnavailable(f"this kernel's struct {struct_name} has no {wanted}")
        return found

    hooks: dict[str, tuple[int, tuple[tuple[int, int], ...]]] = {}
    for hook, pairs in _HOOKS.items():
        func = funcs.get(f"bpf_lsm_{hook}")
        if func is None:
            raise GuardUnavailable(f"this kernel has no LSM hook {hook} (CONFIG_SECURITY_PATH)")
        _, _, info, proto, items = types[types[func][3]]
        params = [
            name_at(struct.unpack_from("<II", data, items + 8 * i)[0]) for i in range(info & 0xFFFF)
        ]
        try:
            hooks[hook] = (func, tuple((params.index(d), params.index(n)) for d, n in pairs))
        except ValueError:
            raise GuardUnavailable(f"this kernel's hook {hook} takes {params}") from None
    return Layout(
        hooks=hooks,
        path_mnt=offset("path", "mnt"),
        mount_mnt=offset("mount", "mnt"),
        mount_unique=offset("mount", "mnt_id_unique"),
        dentry_name=offset("dentry", "d_name"),
        dentry_parent=offset("dentry", "d_parent"),
        qstr_len=offset("qstr", "len"),
        qstr_name=offset("qstr", "name"),
    )


# -- the protected names, as the program compares them ----------------------------------
_HEADER = 8  # u32 count, u32 format
_RULE = 176  # see Rule.pack
_NAME_MAX = 255


@dataclass(frozen=True)
class Rule:
    """One name the program refuses: its first bytes and last bytes under masks (a
    pattern's prefix and suffix; ``?`` a masked-out byte), its length bounds, and the
    exact name of the folder it must be made in ("" for any)."""

    head: bytes
    head_mask: bytes
    tail: bytes
    tail_mask: bytes
    min_len: int
    max_len: int
    parent: bytes = b""  # its first 31 bytes
    parent_len: int = 0

    def pack(self) -> bytes:
        def right(data: bytes) -> bytes:
            return data.rjust(32, b"\0")

        return struct.pack(
            "<IIII32s32s32s32s32s",
            self.min_len,
            self.max_len,
            self.parent_len,
            0,
            self.parent,
            self.head,
            self.head_mask,
            right(self.tail),
            right(self.tail_mask),
        )


def _tokens(pattern: str) -> list[bytes | None | str]:
    """A glob as bytes (literal), None (any one byte: ``?`` or a ``[...]`` class) and
    "*"."""
    out: list[bytes | None | str] = []
    raw, i = pattern.encode(), 0
    while i < len(raw):
        c = raw[i : i + 1]
        if c == b"*":
            out.append("*")
        elif c == b"?":
            out.append(None)
        elif c == b"[" and b"]" in raw[i + 2 :]:
            i = raw.index(b"]", i + 2)
            out.append(None)
        else:
            out.append(c)
        i += 1
    return out


def _bytes_and_mask(tokens: list[bytes | None | str]) -> tuple[bytes, bytes]:
    data = b"".join(t if isinstance(t, bytes) else b"\0" for t in tokens)
    mask = b"".join(b"\xff" if isinstance(t, bytes) else b"\0" for t in tokens)
    return data, mask


def rule_for(pattern: str, parent: str = "") -> Rule:
    """The rule refusing names that match ``pattern`` (made in a folder named
    ``parent``). A name the program cannot compare whole (longer than 63 bytes, a second
    ``*``) is over-approximated: more names are refused, never fewer."""
    tokens = _tokens(pattern)
    if "*" in tokens:
        first, last = tokens.index("*"), len(tokens) - 1 - tokens[::-1].index("*")
        prefix, suffix = tokens[:first][:31], tokens[last + 1 :][-32:]
        head, head_mask = _bytes_and_mask(prefix)
        tail, tail_mask = _bytes_and_mask(suffix)
        low, high = len(tokens[:first]) + len(tokens[last + 1 :]), _NAME_MAX
    else:
        head, head_mask = _bytes_and_mask(tokens[:31])
        tail, tail_mask = _bytes_and_mask(tokens[-32:])
        low = high = len(tokens)
    return Rule(
        head.ljust(32, b"\0"),
        head_mask.ljust(32, b"\0"),
        tail,
        tail_mask,
        low,
        high,
        parent.encode()[:31],
        len(parent.encode()),
    )


def rules_of(patterns: list[str]) -> list[Rule]:
    """The rules of ``protected_paths``: the first name of each path anywhere, and the
    second name of each in a folder named as the first (a path's deeper names live in
    a folder that existed at the start, protected by mounts)."""
    wanted: list[tuple[str, str]] = []
    for pattern in patterns:
        names = [n for n in pattern.split("/") if n]
        if not names:
            continue
        wanted.append((names[0], ""))
        if len(names) > 1 and not any(c in names[0] for c in "*?["):
            wanted.append((names[1], names[0]))
    unique = list(dict.fromkeys(wanted))
    if len(unique) > MAX_RULES:
        raise GuardUnavailable(
            f"protected_paths has {len(unique)} names; the kernel's guard compares at most "
            f"{MAX_RULES}"
        )
    return [rule_for(name, parent) for name, parent in unique]


def refused(name: str, parent: str, rules: list[Rule]) -> bool:
    """Whether the program refuses ``name`` made in a folder named ``parent`` (the same
    comparison in Python, for tests and for saying what a policy refuses)."""
    raw, up = name.encode(), parent.encode()
    head = raw[:31].ljust(32, b"\0")
    tail = raw[-32:].rjust(32, b"\0")
    for rule in rules:
        if not rule.min_len <= len(raw) <= rule.max_len:
            continue
        if rule.parent_len and (len(up) != rule.parent_len or up[:31] != rule.parent):
            continue
        if bytes(a & m for a, m in zip(head, rule.head_mask, strict=True)) != rule.head:
            continue
        masked = bytes(a & m for a, m in zip(tail, rule.tail_mask.rjust(32, b"\0"), strict=True))
        if masked != rule.tail.rjust(32, b"\0"):
            continue
        return True
    return False


def _names_value(rules: list[Rule]) -> bytes:
    body = b"".join(r.pack() for r in rules)
    return struct.pack("<II", len(rules), FORMAT) + body.ljust(_RULE * MAX_RULES, b"\0")


# -- the program ----------------------------------------------------------------------
# eBPF encodings (linux/bpf.h): classes, sizes, modes, operations.
_LDX, _ST, _STX, _ALU64, _JMP = 0x01, 0x02, 0x03, 0x07, 0x05
_W, _DW = 0x00, 0x18
_MEM, _K, _X = 0x60, 0x00, 0x08
_ADD, _AND, _MOV = 0x00, 0x50, 0xB0
_JEQ, _JGT, _JNE, _JLT, _JLE, _CALL, _EXIT = 0x10, 0x20, 0x50, 0xA0, 0xB0, 0x80, 0x90
_LOOKUP, _PROBE_READ, _PROBE_READ_STR = 1, 113, 115  # helpers
_FP = 10
# The program's stack, below the frame pointer.
_KEY, _SCRATCH, _QSTR, _HEAD, _TAIL, _PARENT, _PARENT_LEN, _ZERO = (
    -8,
    -16,
    -32,
    -64,
    -96,
    -128,
    -136,
    -144,
)


class _Assembler:
    """eBPF instructions with named jump targets, resolved by :meth:`code`."""

    def __init__(self) -> None:
        self.insns: list[tuple[int, int, int, int | str, int]] = []
        self.labels: dict[str, int] = {}

    def op(self, code: int, dst: int = 0, src: int = 0, off: int | str = 0, imm: int = 0) -> None:
        self.insns.append((code, dst, src, off, imm))

    def mov(self, dst: int, imm: int) -> None:
        self.op(_ALU64 | _MOV | _K, dst, imm=imm)

    def mov_reg(self, dst: int, src: int) -> None:
        self.op(_ALU64 | _MOV | _X, dst, src)

    def add(self, dst: int, imm: int) -> None:
        self.op(_ALU64 | _ADD | _K, dst, imm=imm)

    def load(self, size: int, dst: int, src: int, off: int) -> None:
        self.op(_LDX | _MEM | size, dst, src, off)

    def store(self, size: int, dst: int, off: int, imm: int) -> None:
        self.op(_ST | _MEM | size, dst, 0, off, imm)

    def store_reg(self, size: int, dst: int, off: int, src: int) -> None:
        self.op(_STX | _MEM | size, dst, src, off)

    def jump(self, operation: int, dst: int, target: str, imm: int = 0, src: int = -1) -> None:
        if src < 0:
            self.op(_JMP | operation | _K, dst, 0, target, imm)
        else:
            self.op(_JMP | operation | _X, dst, src, target)

    def call(self, helper: int) -> None:
        self.op(_JMP | _CALL, imm=helper)

    def map_fd(self, dst: int, fd: int) -> None:
        """``dst = map`` (a 16-byte load of the map's descriptor)."""
        self.op(0x18, dst, 1, 0, fd)
        self.op(0, 0, 0, 0, 0)

    def here(self, label: str) -> None:
        self.labels[label] = len(self.insns)

    def code(self) -> bytes:
        out = bytearray()
        for index, (code, dst, src, off, imm) in enumerate(self.insns):
            if isinstance(off, str):
                off = self.labels[off] - index - 1
            out += struct.pack("<BBhi", code, (src << 4) | dst, off, imm)
        return bytes(out)


def _read(asm: _Assembler, into: int, size: int, helper: int = _PROBE_READ) -> None:
    """``helper(fp + into, size, r3)``: read kernel memory at r3 onto the stack."""
    asm.mov_reg(1, _FP)
    asm.add(1, into)
    asm.mov(2, size)
    asm.call(helper)


def _check(
    asm: _Assembler, lay: Layout, mounts: int, names: int, folder: int, made: int, done: str
) -> None:
    """Refuse (return -EPERM) when the name made by dentry argument ``made`` in the folder
    of path argument ``folder`` is protected there; else go on at ``done``."""
    # The mount: container_of(path->mnt, struct mount, mnt)->mnt_id_unique, registered?
    asm.load(_DW, 3, 6, 8 * folder)
    asm.add(3, lay.path_mnt)
    _read(asm, _SCRATCH, 8)
    asm.jump(_JNE, 0, done, 0)
    asm.load(_DW, 3, _FP, _SCRATCH)
    asm.jump(_JEQ, 3, done, 0)
    asm.add(3, lay.mount_unique - lay.mount_mnt)
    _read(asm, _KEY, 8)
    asm.jump(_JNE, 0, done, 0)
    asm.map_fd(1, mounts)
    asm.mov_reg(2, _FP)
    asm.add(2, _KEY)
    asm.call(_LOOKUP)
    asm.jump(_JEQ, 0, done, 0)
    # The name: r7 its length, r8 where it is; its first and last 32 bytes on the stack.
    asm.load(_DW, 3, 6, 8 * made)
    asm.add(3, lay.dentry_name)
    _read(asm, _QSTR, 16)
    asm.jump(_JNE, 0, done, 0)
    asm.load(_W, 7, _FP, _QSTR + lay.qstr_len)
    asm.load(_DW, 8, _FP, _QSTR + lay.qstr_name)
    for off in range(_PARENT_LEN, _QSTR, 8):
        asm.store(_DW, _FP, off, 0)
    asm.mov_reg(3, 8)
    _read(asm, _HEAD, 32, _PROBE_READ_STR)
    asm.mov_reg(3, 8)
    asm.op(_ALU64 | _ADD | _X, 3, 7)
    asm.add(3, -32)
    _read(asm, _TAIL, 32)  # before a short name: bytes no rule looks at
    # The folder's name (the dentry's parent), its first 32 bytes and its length.
    parent_done = f"{done}-parent"
    asm.load(_DW, 3, 6, 8 * made)
    asm.add(3, lay.dentry_parent)
    _read(asm, _SCRATCH, 8)
    asm.jump(_JNE, 0, parent_done, 0)
    asm.load(_DW, 3, _FP, _SCRATCH)
    asm.add(3, lay.dentry_name)
    _read(asm, _QSTR, 16)
    asm.jump(_JNE, 0, parent_done, 0)
    asm.load(_W, 1, _FP, _QSTR + lay.qstr_len)
    asm.store_reg(_W, _FP, _PARENT_LEN, 1)
    asm.load(_DW, 3, _FP, _QSTR + lay.qstr_name)
    _read(asm, _PARENT, 32, _PROBE_READ_STR)
    asm.here(parent_done)
    # The rules (one map value): each compared in turn, up to their count.
    asm.store(_W, _FP, _ZERO, 0)
    asm.map_fd(1, names)
    asm.mov_reg(2, _FP)
    asm.add(2, _ZERO)
    asm.call(_LOOKUP)
    asm.jump(_JEQ, 0, done, 0)
    asm.mov_reg(9, 0)
    for index in range(MAX_RULES):
        base, other = _HEADER + index * _RULE, f"{done}-{index}"
        asm.load(_W, 1, 9, 0)
        asm.jump(_JLE, 1, done, index)  # count <= index: no more rules
        asm.load(_W, 1, 9, base)
        asm.jump(_JLT, 7, other, src=1)
        asm.load(_W, 1, 9, base + 4)
        asm.jump(_JGT, 7, other, src=1)
        asm.load(_W, 1, 9, base + 8)
        names_only = f"{other}-names"
        asm.jump(_JEQ, 1, names_only, 0)
        asm.load(_W, 2, _FP, _PARENT_LEN)
        asm.jump(_JNE, 2, other, src=1)
        for word in range(4):
            asm.load(_DW, 1, _FP, _PARENT + 8 * word)
            asm.load(_DW, 2, 9, base + 16 + 8 * word)
            asm.jump(_JNE, 1, other, src=2)
        asm.here(names_only)
        for buffer, at in ((_HEAD, 48), (_TAIL, 112)):
            for word in range(4):
                asm.load(_DW, 1, _FP, buffer + 8 * word)
                asm.load(_DW, 2, 9, base + at + 32 + 8 * word)
                asm.op(_ALU64 | _AND | _X, 1, 2)
                asm.load(_DW, 2, 9, base + at + 8 * word)
                asm.jump(_JNE, 1, other, src=2)
        asm.mov(0, -errno.EPERM)
        asm.op(_JMP | _EXIT)
        asm.here(other)
    asm.here(done)


def program(hook: str, lay: Layout, mounts: int, names: int) -> bytes:
    """The instructions of ``hook``'s program, for these maps' descriptors."""
    asm = _Assembler()
    asm.mov_reg(6, 1)  # the hook's arguments, 8 bytes each
    for number, (folder, made) in enumerate(lay.hooks[hook][1]):
        _check(asm, lay, mounts, names, folder, made, f"pair{number}")
    asm.mov(0, 0)
    asm.op(_JMP | _EXIT)
    return asm.code()


# -- loading, pinning, registering -------------------------------------------------------
def support() -> str:
    """Why the kernel cannot hold the guard here, in one line ("" when it can)."""
    try:
        _numbers()
        active = Path(_LSM_LIST).read_text().strip().split(",")
    except GuardUnavailable as exc:
        return str(exc)
    except OSError as exc:
        return f"cannot read {_LSM_LIST} ({exc.strerror}): which security modules run is unknown"
    if "bpf" not in active:
        return (
            f"the kernel does not run the BPF security module (its list: {','.join(active)}; "
            "boot with lsm=...,bpf)"
        )
    try:
        kernel_layout()
    except GuardUnavailable as exc:
        return str(exc)
    return ""


def folder_of(installation: str) -> str:
    """Where an installation's guard is pinned."""
    return f"{PIN_ROOT}/{installation}"


def _bpffs() -> None:
    """bpffs at /sys/fs/bpf (mounted, root-only, when it is not)."""
    buf = ctypes.create_string_buffer(256)
    target = os.path.dirname(PIN_ROOT).encode()
    if _libc().statfs(target, buf) == 0 and struct.unpack_from("<q", buf)[0] == _BPF_FS_MAGIC:
        return
    if _libc().mount(b"bpf", target, b"bpf", 0, b"mode=0700") != 0:
        code = ctypes.get_errno()
        raise OSError(code, f"mount bpffs at {target.decode()}: {os.strerror(code)}")


def _load(hook: str, lay: Layout, mounts: int, names: int) -> int:
    code = ctypes.create_string_buffer(program(hook, lay, mounts, names))
    license = ctypes.create_string_buffer(b"Dual BSD/GPL")
    name = f"sk_{hook}"[:15].encode()

    def attempt(log: ctypes.Array[ctypes.c_char] | None) -> int:
        attr = struct.pack(
            "<IIQQIIQII16sIIIIQIIQIII",
            _PROG_TYPE_LSM,
            (len(code) - 1) // 8,
            _ptr(code),
            _ptr(license),
            1 if log is not None else 0,
            len(log) if log is not None else 0,
            _ptr(log) if log is not None else 0,
            0,
            0,
            name,
            0,
            _LSM_MAC,
            0,
            0,
            0,
            0,
            0,
            0,
            0,
            lay.hooks[hook][0],
            0,
        )
        return _bpf(_PROG_LOAD, attr, f"load the program of {hook}")

    try:
        return attempt(None)
    except OSError as exc:
        if exc.errno not in (errno.EINVAL, errno.EACCES):
            raise
        log = ctypes.create_string_buffer(1 << 22)
        try:
            return attempt(log)
        except OSError as again:
            said = log.value.decode(errors="replace").strip().splitlines()[-3:]
            raise OSError(again.errno, f"{again.strerror}: {' / '.join(said)}") from None


def _attach(prog: int) -> int:
    return _bpf(_LINK_CREATE, struct.pack("<IIII", prog, 0, _LSM_MAC, 0), "attach a program")


def _existing(path: str) -> int | None:
    try:
        return _get(path)
    except FileNotFoundError:
        return None


def ensure(installation: str, patterns: list[str]) -> None:
    """The installation's guard loaded and pinned, refusing the names of ``patterns``
    (``protected_paths``); GuardUnavailable (why, in one line) when the kernel cannot
    hold it. Cheap when it is in place already; nothing is pinned by an attempt that
    fails."""
    why = support()
    if why:
        raise GuardUnavailable(why)
    value = _names_value(rules_of(patterns))
    try:
        _bpffs()
    except OSError as exc:
        raise GuardUnavailable(f"no BPF file system to keep the guard in: {exc}") from None
    folder = folder_of(installation)
    version = f"{folder}/v{FORMAT}"
    os.makedirs(version, mode=0o700, exist_ok=True)
    lock = os.open(folder, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
    opened: list[int] = [lock]
    try:
        fcntl.flock(lock, fcntl.LOCK_EX)
        made: list[tuple[int, str]] = []  # (descriptor, where to pin it) once all loaded
        mounts = _existing(f"{folder}/mounts")
        if mounts is None:
            mounts = _create_map(_MAP_LRU_HASH, 8, 8, MAX_MOUNTS, b"sk_mounts")
            made.append((mounts, f"{folder}/mounts"))
        opened.append(mounts)
        names = _existing(f"{version}/names")
        if names is None:
            names = _create_map(_MAP_HASH, 4, len(value), 1, b"sk_names")
            made.append((names, f"{version}/names"))
        opened.append(names)
        if _lookup(names, bytes(4), len(value)) != value:
            _update(names, bytes(4), value)
        for hook in _HOOKS:
            if os.path.exists(f"{version}/{hook}"):
                continue
            try:
                prog = _load(hook, kernel_layout(), mounts, names)
                opened.append(prog)
                link = _attach(prog)
            except OSError as exc:
                raise GuardUnavailable(
                    f"the kernel refuses BPF LSM programs ({exc.strerror})"
                ) from None
            opened.append(link)
            made.append((link, f"{version}/{hook}"))
        for fd, where in made:
            _pin(fd, where)
        for other in os.listdir(folder):  # an older version's programs
            if other.startswith("v") and other != f"v{FORMAT}":
                _unpin(f"{folder}/{other}")
    except GuardUnavailable:
        for empty in (version, folder, PIN_ROOT):  # only what this attempt left empty
            with contextlib.suppress(OSError):
                os.rmdir(empty)
        raise
    finally:
        for fd in opened:
            os.close(fd)


def _unpin(path: str) -> None:
    """Remove a pinned object or a folder of them (a pinned link detaches with its pin,
    once no process holds it)."""
    if os.path.isdir(path) and not os.path.islink(path):
        for name in os.listdir(path):
            _unpin(f"{path}/{name}")
        os.rmdir(path)
    else:
        os.unlink(path)


def remove(installation: str) -> bool:
    """Unpin the installation's guard (``sandbox-kernel uninstall``); whether there was one."""
    folder = folder_of(installation)
    if not os.path.isdir(folder):
        return False
    _unpin(folder)
    with contextlib.suppress(OSError):
        os.rmdir(PIN_ROOT)  # when no other installation has one
    return True


def held(installation: str) -> bool:
    """Whether the installation's guard is pinned (every hook's program attached)."""
    version = f"{folder_of(installation)}/v{FORMAT}"
    return all(os.path.exists(f"{version}/{hook}") for hook in _HOOKS)


def open_mounts(installation: str) -> int:
    """A descriptor of the installation's map of mounts (to register mounts with)."""
    return _get(f"{folder_of(installation)}/mounts")


def register(mounts: int, ids: list[int]) -> None:
    """Have the guard refuse protected names made on the mounts of unique ids ``ids``."""
    for unique in ids:
        _update(mounts, struct.pack("<Q", unique), struct.pack("<Q", 1))


def mount_id(fd: int) -> int:
    """The unique id (``STATX_MNT_ID_UNIQUE``) of the mount descriptor ``fd`` lies on."""
    buf = ctypes.create_string_buffer(256)
    result = _libc().syscall(_numbers()[1], fd, b"", AT_EMPTY_PATH, _STATX_MNT_ID_UNIQUE, buf)
    if result < 0:
        code = ctypes.get_errno()
        raise OSError(code, f"statx: {os.strerror(code)}")
    mask, unique = struct.unpack_from("<I", buf, 0)[0], struct.unpack_from("<Q", buf, 0x90)[0]
    if not mask & _STATX_MNT_ID_UNIQUE:
        raise OSError(errno.ENOSYS, "the kernel gives no unique mount ids (Linux 6.8 or newer)")
    return int(unique)


def mount_points(mountinfo: str, folders: list[str]) -> list[str]:
    """The mount points of a mount table (``/proc/PID/mountinfo``) at or beneath any of
    ``folders``: the mounts a sandbox sees those folders through."""
    found = []
    for line in mountinfo.splitlines():
        fields = line.split(" ")
        if len(fields) < 5:
            continue
        point = re.sub(r"\\([0-7]{3})", lambda m: chr(int(m.group(1), 8)), fields[4])
        if any(point == f or point.startswith(f.rstrip("/") + "/") for f in folders):
            found.append(point)
    return list(dict.fromkeys(found))


_STATUS = "kernel-guard"  # in the state folder: why the guard did not hold at the last start


def remember(state_dir: str, why: str) -> None:
    """Keep what the last start found (``why`` the guard does not hold, "" when it
    does) for listings and the doctor; never fails the start."""
    with contextlib.suppress(OSError):
        Path(state_dir, _STATUS).write_text(why + "\n")


def remembered(state_dir: str) -> str | None:
    """Why the guard did not hold at the last start ("" when it did; None: no start yet)."""
    if not state_dir:
        return None
    try:
        return Path(state_dir, _STATUS).read_text().strip()
    except OSError:
        return None
