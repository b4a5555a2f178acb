"""Parts of the local backend that need no sandbox: the seccomp program and cgroup files.

The seccomp program is run here by a small interpreter of classic BPF against the
calls an attacker makes (the hostile tests check the kernel's own verdict). The cgroup
v2 layout is written into a folder standing in for ``/sys/fs/cgroup``: this machine
has the v1 layout, and its unified hierarchy has no controllers, so a real v2 tree
cannot exist here (the v1 code is exercised for real by the hostile tests).
"""

from __future__ import annotations

import errno
import os
import struct
from pathlib import Path

import pytest

from sandbox_kernel.backends import seccomp
from sandbox_kernel.backends.local import cgroup
from sandbox_kernel.backends.local.view import assemble_etc, generated_etc, shared_etc

pytestmark = pytest.mark.fast

X86_64, I386, AARCH64 = 0xC000003E, 0x40000003, 0xC00000B7
ALLOW, KILL = 0x7FFF0000, 0x80000000


def verdict(program: bytes, arch: int, nr: int, *args: int) -> int:
    """What the seccomp program answers to one call (a classic-BPF interpreter for the
    instructions it uses)."""
    data = struct.pack("<iI Q 6Q", nr, arch, 0, *(list(args) + [0] * (6 - len(args))))
    insns = [struct.unpack_from("<HBBI", program, i) for i in range(0, len(program), 8)]
    acc, pc = 0, 0
    while True:
        code, jt, jf, k = insns[pc]
        pc += 1
        if code == 0x20:  # ld [k]
            acc = struct.unpack_from("<I", data, k)[0]
        elif code == 0x15:  # jeq
            pc += jt if acc == k else jf
        elif code == 0x35:  # jge
            pc += jt if acc >= k else jf
        elif code == 0x45:  # jset
            pc += jt if acc & k else jf
        elif code == 0x06:  # ret
            return k
        else:
            raise AssertionError(f"unknown instruction {code:#x}")


def eperm(value: int) -> bool:
    return value == 0x00050000 | errno.EPERM


def enosys(value: int) -> bool:
    return value == 0x00050000 | errno.ENOSYS


MACHINES = {  # uname -m: (AUDIT_ARCH_*, libseccomp's name, the numbers)
    "x86_64": (X86_64, "amd64", seccomp.syscall_table.X86_64),
    "aarch64": (AARCH64, "arm64", seccomp.syscall_table.AARCH64),
}


@pytest.mark.parametrize("machine", sorted(MACHINES))
def test_seccomp_program_follows_the_policy(machine: str) -> None:
    """Allowed calls allowed, refused ones EPERM, argument-less ones and newer numbers
    ENOSYS, namespace flags of clone, setuid bits, AF_ALG/AF_VSOCK sockets and odd
    personalities refused, on the machine's own ABI."""
    arch, _, nr = MACHINES[machine]
    prog = seccomp.bpf_program(machine, "6.18.0")

    def answer(name: str, *args: int) -> int:
        return verdict(prog, arch, nr[name], *args)

    for name in ("read", "write", "futex", "rseq", "execve", "wait4", "getrandom", "statx"):
        assert answer(name) == ALLOW, name
    assert answer("landlock_create_ruleset") == ALLOW  # the agent's
    assert answer("ptrace") == ALLOW  # Docker's, from Linux 4.8 on
    for name in ("perf_event_open", "kexec_load", "mount", "bpf", "io_uring_setup", "keyctl"):
        assert eperm(answer(name)), name
    for name in ("chroot", "sethostname", "kcmp", "mbind", "pidfd_getfd", "open_by_handle_at"):
        assert eperm(answer(name)), name  # not on Docker's list for an unprivileged container
    for name in ("clone3", "openat2", "fchmodat2"):
        assert enosys(answer(name)), name
    for number in (nr["open_tree_attr"], nr["rseq_slice_yield"], 600, 1000):
        assert enosys(verdict(prog, arch, number)), number  # newer than any rule names
    # clone: fork's and threads' flags, never a namespace flag.
    assert answer("clone", 0x01200011) == ALLOW  # fork
    assert answer("clone", 0x003D0F00) == ALLOW  # pthread_create
    for bit in (17, 25, 26, 27, 28, 29, 30):  # CLONE_NEWNS, NEWCGROUP ... NEWNET
        assert eperm(answer("clone", (1 << bit) | 17)), bit
    assert eperm(answer("unshare", 0x10000000)) and eperm(answer("setns", 3, 0))
    # Every call that makes or changes a mode: plain modes pass, setuid/setgid bits do not.
    for name, index in seccomp.MODE_ARGS:
        if name not in nr:
            continue  # open, creat, chmod, mknod: x86_64 only
        plain = [0] * index + [0o100644 if name.startswith("mknod") else 0o755]
        assert answer(name, *plain) == ALLOW, name
        for bits in (0o4000, 0o2000, 0o6000):
            assert eperm(answer(name, *plain[:-1], plain[-1] | bits)), (name, oct(bits))
    # socket: every family but AF_ALG (38) and AF_VSOCK (40), however the int is passed.
    for family in (1, 2, 10, 16, 17, 39, 41, 44, 45):
        assert answer("socket", family, 1) == ALLOW, family
    for family in (38, 40, (1 << 32) | 38, (1 << 32) | 40, 46, 0xFFFFFFFF):
        assert eperm(answer("socket", family, 1)), hex(family)
    # personality: Docker's four values and the query, nothing else.
    for persona in (0, 8, 0x20000, 0x20008, 0xFFFFFFFF):
        assert answer("personality", persona) == ALLOW, hex(persona)
    for persona in (0x0040000, 0x0400000, 0x1):  # ADDR_NO_RANDOMIZE, READ_IMPLIES_EXEC
        assert eperm(answer("personality", persona)), hex(persona)


def test_seccomp_program_kills_other_abis_and_knows_its_machines() -> None:
    prog = seccomp.bpf_program("x86_64")
    assert verdict(prog, I386, 15, 0, 0o4755) == KILL  # a 32-bit chmod
    assert verdict(prog, I386, 102, 1) == KILL  # 32-bit socketcall
    assert verdict(prog, X86_64, 0x40000000 | 90, 0, 0o4755) == KILL  # x32
    arm = seccomp.bpf_program("aarch64")
    assert verdict(arm, X86_64, 53) == KILL
    assert verdict(arm, 0x40000028, 15) == KILL  # 32-bit arm
    with pytest.raises(ValueError, match="no system-call table"):
        seccomp.bpf_program("sparc64")
    assert not seccomp.supported("sparc64") and seccomp.supported("aarch64")


def test_ptrace_is_refused_before_linux_4_8() -> None:
    """Docker's own condition: before 4.8 a tracer could get round seccomp."""
    arch, _, nr = MACHINES["x86_64"]
    assert eperm(verdict(seccomp.bpf_program("x86_64", "4.4.0"), arch, nr["ptrace"]))
    assert verdict(seccomp.bpf_program("x86_64", "4.8.0"), arch, nr["ptrace"]) == ALLOW


@pytest.mark.parametrize("machine", sorted(MACHINES))
def test_every_call_the_table_knows_gets_the_policys_answer(machine: str) -> None:
    """Each number of the table, against the policy worked out here from its data:
    Docker's allowlist minus ours; argument-checked calls are the test above's."""
    arch, libseccomp_arch, nr = MACHINES[machine]
    prog = seccomp.bpf_program(machine, "6.18.0")
    allowed = set(seccomp.DOCKER_ALLOWED) | set(seccomp.DOCKER_ALLOWED_FROM_4_8)
    for arches, names in seccomp.DOCKER_ALLOWED_ON:
        if libseccomp_arch in arches:
            allowed |= set(names)
    allowed -= set(seccomp.REFUSED) | set(seccomp.NOT_IMPLEMENTED)
    checked = {name for name, _ in seccomp.MODE_ARGS} | {"clone", "personality", "socket"}
    newest = max(nr[n] for n in allowed | set(seccomp.NOT_IMPLEMENTED) | checked if n in nr)
    for name, number in nr.items():
        if name in checked:
            continue
        got = verdict(prog, arch, number)
        if name in seccomp.REFUSED:
            assert eperm(got), name
        elif name in seccomp.NOT_IMPLEMENTED or number > newest:
            assert enosys(got), name
        elif name in allowed:
            assert got == ALLOW, name
        else:
            assert eperm(got), name


def fake_v2(root: Path, controllers: str = "cpuset cpu io memory pids") -> Path:
    """A folder laid out as a cgroup v2 mount, with the folders the backend makes for
    installation "inst1234" (the kernel makes a cgroup's files when it is made)."""
    for folder in (root, root / "sandbox-kernel", root / "sandbox-kernel" / "inst1234"):
        folder.mkdir()
        (folder / "cgroup.controllers").write_text(controllers + "\n")
        (folder / "cgroup.subtree_control").write_text("")
    return root


def test_cgroup_v2_hands_controllers_down_and_limits(tmp_path: Path) -> None:
    mount = fake_v2(tmp_path / "cg")
    place = cgroup._place_v2(mount, "/", {"cpu", "memory", "pids", "io"}, "inst1234")
    assert place.version == 2 and place.controllers == ("memory", "pids", "cpu")
    base = mount / "sandbox-kernel" / "inst1234"
    assert place.parents == {"": base}
    for level in (mount, mount / "sandbox-kernel", base):
        assert (level / "cgroup.subtree_control").read_text() == "+memory +pids +cpu"
    (base / "sk-ann").mkdir()  # the kernel makes a cgroup's files: stand them in
    for name in ("memory.max", "memory.swap.max", "pids.max", "cpu.max", "cgroup.procs"):
        (base / "sk-ann" / name).write_text("")
    files = place.make("sk-ann", 1 << 30, 128, 1.5)
    assert files == [base / "sk-ann" / "cgroup.procs"]
    said = {
        n: (base / "sk-ann" / n).read_text()
        for n in ("memory.max", "memory.swap.max", "pids.max", "cpu.max")
    }
    assert said == {
        "memory.max": str(1 << 30),
        "memory.swap.max": "0",
        "pids.max": "128",
        "cpu.max": "150000 100000",
    }
    assert "cgroup v2 (memory/pids/cpu)" in place.describe()


def test_cgroup_v2_without_cpu_says_so(tmp_path: Path) -> None:
    mount = fake_v2(tmp_path / "cg", "memory pids")
    place = cgroup._place_v2(mount, "/", {"memory", "pids"}, "inst1234")
    assert place.controllers == ("memory", "pids")
    assert "CPU is not limited" in place.describe()


def test_cgroup_v2_delegated_to_an_ordinary_user(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """An ordinary user's sandboxes go under the highest cgroup delegated to them above
    their own (systemd's user manager), with what that level may hand down."""
    mount = tmp_path / "cg"
    own = "/user.slice/user-12345.slice/user@12345.service/app.slice/term.scope"
    path = mount
    for part in ["", *own.strip("/").split("/")]:
        path = path / part if part else path
        path.mkdir(exist_ok=True)
        (path / "cgroup.controllers").write_text("memory pids\n")
        (path / "cgroup.subtree_control").write_text("")
        if "12345.service" in str(path):
            os.chown(path, 12345, 12345)  # what systemd delegates to the user
    delegated = mount / "user.slice" / "user-12345.slice" / "user@12345.service"
    for folder in (delegated / "sandbox-kernel", delegated / "sandbox-kernel" / "inst1234"):
        folder.mkdir()
        (folder / "cgroup.subtree_control").write_text("")  # the kernel's file
    monkeypatch.setattr(cgroup.os, "geteuid", lambda: 12345)
    place = cgroup._place_v2(mount, own, {"memory", "pids", "cpu"}, "inst1234")
    assert place.parents == {"": delegated / "sandbox-kernel" / "inst1234"}
    assert place.controllers == ("memory", "pids")
    assert "CPU is not limited" in place.reason
    assert (delegated / "cgroup.subtree_control").read_text() == "+memory +pids"
    assert (mount / "user.slice" / "cgroup.subtree_control").read_text() == ""  # root's


def test_no_cgroup_says_why(tmp_path: Path) -> None:
    place = cgroup._place_v2(tmp_path / "missing", "/", {"memory", "pids"}, "inst1234")
    assert not place and "cannot enable" in place.reason
    assert place.describe().startswith("no cgroup (")


def test_the_sandboxs_etc_holds_only_what_anyone_may_read(tmp_path: Path) -> None:
    """Its /etc is copied from the host's: what the sandbox needs, never a root-only
    file, links kept as links, and its own passwd naming its user; made once per host
    /etc and network, and made anew when the host's files change."""
    cache = tmp_path / "etc-cache"
    folder = shared_etc(cache, "slirp4netns")
    assert "sandbox:x:1000:1000:sandbox:/home/sandbox:" in (folder / "passwd").read_text()
    assert (folder / "resolv.conf").read_text() == "nameserver 10.0.2.3\n"
    assert (folder / "hostname").read_text() == "sandbox\n"
    for secret in ("shadow", "gshadow", "sudoers", "ssl/private", "ssh"):
        assert not os.path.lexists(folder / secret), secret
    if os.path.exists("/etc/ssl/certs"):
        assert (folder / "ssl" / "certs").is_dir()
    if os.path.islink("/etc/localtime"):
        assert os.readlink(folder / "localtime") == os.readlink("/etc/localtime")
    for path in folder.rglob("*"):
        if not path.is_symlink():
            assert path.lstat().st_mode & 0o004, path
    assert shared_etc(cache, "slirp4netns") == folder  # kept while the host's is unchanged
    offline = shared_etc(cache, "none")
    assert offline != folder and (offline / "resolv.conf").read_text() == ""
    assemble_etc(folder, generated_etc(""))  # made again in place
    assert (folder / "resolv.conf").read_text() == ""
    assert not list(cache.glob(".*-new")) and not list(cache.glob(".*-old"))
