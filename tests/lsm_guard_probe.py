"""Runs the guard's own program on real kernel objects, where the kernel will not attach
it as an LSM program (a test's helper, run as root in a mount namespace of its own).

The program reads only what its hook's arguments point to (a folder's ``struct path``
and a name's ``struct dentry``), through ``bpf_probe_read_kernel``; so the very same
instructions load as a raw tracepoint program, and ``BPF_PROG_TEST_RUN`` runs them with
arguments of our choosing. To have real objects, a second small program on the
``sys_enter`` tracepoint records, for this thread only, where its working folder's
``struct path`` is (``current->fs->pwd``) and the dentry it names. Run with the working
folder at ``F``, the guard program answers for "make the name of F in F's parent, on
F's mount": the mount lookup, the name, the parent's name and the rules, as the hook
would.

Prints, as JSON, the program's answer (0 or -EPERM) for each folder given.
"""

from __future__ import annotations

import ctypes
import json
import os
import struct
import sys
import threading

from sandbox_kernel.backends import lsm_guard as g

_RAW_TRACEPOINT, _TEST_RUN, _RAW_TP_OPEN = 17, 10, 17
_GET_PID_TGID, _GET_TASK, _UPDATE = 14, 35, 2


def _task_offsets() -> tuple[int, int]:
    """Offsets of task_struct.fs and fs_struct.pwd, from the kernel's BTF."""
    data = open("/sys/kernel/btf/vmlinux", "rb").read()
    _, _, _, hdr, type_off, type_len, str_off, _ = struct.unpack_from("<HBBIIIII", data)

    def name_at(offset: int) -> str:
        start = hdr + str_off + offset
        return data[start : data.index(b"\0", start)].decode()

    wanted = {"task_struct": "fs", "fs_struct": "pwd"}
    found: dict[str, int] = {}
    pos, end = hdr + type_off, hdr + type_off + type_len
    while pos < end:
        name_off, info, _ = struct.unpack_from("<III", data, pos)
        kind, vlen = (info >> 24) & 0x1F, info & 0xFFFF
        if kind == 4 and name_off and name_at(name_off) in wanted:
            for i in range(vlen):
                m_name, _, offset = struct.unpack_from("<III", data, pos + 12 + 12 * i)
                bits = offset & 0xFFFFFF if info >> 31 else offset
                if m_name and name_at(m_name) == wanted[name_at(name_off)]:
                    found.setdefault(name_at(name_off), bits // 8)
        pos += 12 + g._KIND_EXTRA.get(kind, 0) + g._KIND_MEMBERS.get(kind, 0) * vlen
    return found["task_struct"], found["fs_struct"]


def _load_raw(code: bytes) -> int:
    insns = ctypes.create_string_buffer(code)
    license = ctypes.create_string_buffer(b"Dual BSD/GPL")
    attr = struct.pack(
        "<IIQQIIQ", _RAW_TRACEPOINT, len(code) // 8, g._ptr(insns), g._ptr(license), 0, 0, 0
    )
    return g._bpf(g._PROG_LOAD, attr, "load a raw tracepoint program")


def _capture(seen: int, tid: int, lay: g.Layout) -> int:
    """The sys_enter program: for thread ``tid``, (&current->fs->pwd, its dentry) into
    the array map ``seen``."""
    task_fs, fs_pwd = _task_offsets()
    asm = g._Assembler()
    asm.call(_GET_PID_TGID)
    asm.op(g._ALU64 | 0x60 | g._K, 0, imm=32)  # r0 <<= 32
    asm.op(g._ALU64 | 0x70 | g._K, 0, imm=32)  # r0 >>= 32: the thread's id
    asm.jump(g._JNE, 0, "out", tid)
    asm.call(_GET_TASK)
    asm.mov_reg(3, 0)
    asm.add(3, task_fs)
    g._read(asm, -8, 8)  # fs
    asm.load(g._DW, 3, g._FP, -8)
    asm.add(3, fs_pwd)
    asm.store_reg(g._DW, g._FP, -32, 3)  # the path's address
    asm.add(3, 8)  # struct path: { mnt, dentry }
    g._read(asm, -24, 8)
    asm.store(g._W, g._FP, -40, 0)
    asm.map_fd(1, seen)
    asm.mov_reg(2, g._FP)
    asm.add(2, -40)
    asm.mov_reg(3, g._FP)
    asm.add(3, -32)
    asm.mov(4, 0)
    asm.call(_UPDATE)
    asm.here("out")
    asm.mov(0, 0)
    asm.op(g._JMP | g._EXIT)
    return _load_raw(asm.code())


def main() -> None:
    folders = sys.argv[1:]
    lay = g.kernel_layout()
    value = g._names_value(g.rules_of(json.loads(os.environ["SK_PATTERNS"])))
    mounts = g._create_map(g._MAP_LRU_HASH, 8, 8, 64, b"t_mounts")
    names = g._create_map(g._MAP_HASH, 4, len(value), 1, b"t_names")
    g._update(names, bytes(4), value)
    for point in json.loads(os.environ["SK_REGISTER"]):
        fd = os.open(point, os.O_PATH | os.O_DIRECTORY)
        g.register(mounts, [g.mount_id(fd)])
        os.close(fd)
    seen = g._create_map(2, 4, 16, 1, b"t_seen")  # an array: (path, dentry)
    guard = _load_raw(g.program("path_mkdir", lay, mounts, names))
    capture = _capture(seen, threading.get_native_id(), lay)
    name = ctypes.create_string_buffer(b"sys_enter")
    link = g._bpf(_RAW_TP_OPEN, struct.pack("<QI", g._ptr(name), capture), "attach sys_enter")
    answers = {}
    try:
        for folder in folders:
            os.chdir(folder)
            os.getppid()  # a system call: the capture runs
            got = g._lookup(seen, bytes(4), 16)
            ctx = ctypes.create_string_buffer((got or bytes(16)) + bytes(8 * 6))
            attr = ctypes.create_string_buffer(128)
            struct.pack_into("<I", attr, 0, guard)
            struct.pack_into("<IIQQ", attr, 40, len(ctx), 0, g._ptr(ctx), 0)
            g._bpf(_TEST_RUN, attr, "run the guard program")
            answers[folder] = struct.unpack_from("<i", attr, 4)[0]
    finally:
        os.close(link)
    print(json.dumps(answers))


if __name__ == "__main__":
    main()
