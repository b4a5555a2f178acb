"""What sandboxed code may ask of the kernel: one system-call policy for every engine.

The policy is Docker's own default profile for a container without capabilities, an
allowlist (a call it does not name is refused), with our stricter rules taken away from
it, never added to it:

- the set-user-ID and set-group-ID bits are refused on every call that makes or changes
  a file mode (``chmod``, ``open(O_CREAT)``, ``mknod`` ...): a sandbox writes host
  folders, and a setuid file made there would be a setuid program on the host;
- no new namespaces (Docker's own ``clone`` condition, no ``unshare``/``setns``), mounts,
  keyrings, BPF, io_uring (its operations bypass seccomp), module, clock and reboot
  calls (:data:`REFUSED`, refused whatever the allowlist says);
- calls whose arguments seccomp cannot read (``clone3``, ``openat2``, ``fchmodat2``,
  32-bit x86's ``socketcall``: their modes, flags and families sit in memory) answer
  ``ENOSYS`` (:data:`NOT_IMPLEMENTED`);
- ``socket(2)``'s families compared so that no value the kernel reads as ``AF_ALG`` or
  ``AF_VSOCK`` passes (:data:`SOCKET_FAMILIES`).

What a refused call answers: ``EPERM`` for a call the policy knows, as Docker's default
does; ``ENOSYS`` ("not implemented") for the calls above and for every call newer than
the newest the rules name, as a kernel without it would. ``ENOSYS`` is what makes the C
library and Python fall back to an older call they can be filtered on (glibc's
``clone3`` to ``clone``, ``fchmodat2`` to ``fchmodat``); ``EPERM`` from a call a library
only knows as new would be a hard failure, the trouble Docker's ``faccessat2`` once
caused. Docker's profile says ``defaultErrnoRet: 1`` (``EPERM``, what engines that do
not read the field answer anyway) and runc answers ``ENOSYS`` above the highest call the
profile names (also where its seccomp library does not know a newer call the allowlist
has); the bubblewrap program below does the same.

Engines render :data:`RULES`: Docker as its JSON profile (:mod:`.docker.security`),
bubblewrap as a classic-BPF program (:func:`bpf_program`, ``bwrap --seccomp FD``), whose
numbers come from :mod:`.syscall_table`. The program allows only this machine's own
system-call ABI: 32-bit x86 and x32 calls on x86_64 (and 32-bit arm calls on aarch64)
end the process, so no other ABI is a way around the rules. Kubernetes pods use their
runtime's own default profile (``RuntimeDefault``).
"""

from __future__ import annotations

import errno
import os
import re
import struct
from dataclasses import dataclass
from functools import lru_cache

from . import syscall_table

S_ISUID = 0o4000
S_ISGID = 0o2000
# Namespace flags of clone(2): CLONE_NEWNS, NEWCGROUP, NEWUTS, NEWIPC, NEWUSER, NEWPID,
# NEWNET (Docker's mask 2114060288).
CLONE_NS_FLAGS = 0x7E020000

# Docker's default seccomp profile, transcribed from github.com/moby/profiles/seccomp
# v0.2.3 (the module Docker's engine takes its default profile from; ``default.json`` is
# generated from its ``default_linux.go``): the rules that apply to a container without
# capabilities.
# Its rules for containers given CAP_SYS_ADMIN, CAP_SYS_PTRACE ... are left out on
# purpose: sandboxes have none.
# The calls it allows every container, in its order (names of every ABI: chown32 is i386's).
DOCKER_ALLOWED = tuple(
    """
accept accept4 access adjtimex alarm bind brk cachestat capget capset chdir chmod chown chown32
clock_adjtime clock_adjtime64 clock_getres clock_getres_time64 clock_gettime clock_gettime64
clock_nanosleep clock_nanosleep_time64 close close_range connect copy_file_range creat dup dup2
dup3 epoll_create epoll_create1 epoll_ctl epoll_ctl_old epoll_pwait epoll_pwait2 epoll_wait
epoll_wait_old eventfd eventfd2 execve execveat exit exit_group faccessat faccessat2 fadvise64
fadvise64_64 fallocate fanotify_mark fchdir fchmod fchmodat fchmodat2 fchown fchown32 fchownat
fcntl fcntl64 fdatasync fgetxattr flistxattr flock fork fremovexattr fsetxattr fstat fstat64
fstatat64 fstatfs fstatfs64 fsync ftruncate ftruncate64 futex futex_requeue futex_time64
futex_wait futex_waitv futex_wake futimesat getcpu getcwd getdents getdents64 getegid getegid32
geteuid geteuid32 getgid getgid32 getgroups getgroups32 getitimer getpeername getpgid getpgrp
getpid getppid getpriority getrandom getresgid getresgid32 getresuid getresuid32 getrlimit
get_robust_list getrusage getsid getsockname getsockopt get_thread_area gettid gettimeofday
getuid getuid32 getxattr getxattrat inotify_add_watch inotify_init inotify_init1
inotify_rm_watch io_cancel ioctl io_destroy io_getevents io_pgetevents io_pgetevents_time64
ioprio_get ioprio_set io_setup io_submit ipc kill landlock_add_rule landlock_create_ruleset
landlock_restrict_self lchown lchown32 lgetxattr link linkat listen listmount listxattr
listxattrat llistxattr _llseek lremovexattr lseek lsetxattr lstat lstat64 madvise
map_shadow_stack membarrier memfd_create memfd_secret mincore mkdir mkdirat mknod mknodat mlock
mlock2 mlockall mmap mmap2 mprotect mq_getsetattr mq_notify mq_open mq_timedreceive
mq_timedreceive_time64 mq_timedsend mq_timedsend_time64 mq_unlink mremap mseal msgctl msgget
msgrcv msgsnd msync munlock munlockall munmap name_to_handle_at nanosleep newfstatat _newselect
open openat openat2 pause pidfd_open pidfd_send_signal pipe pipe2 pkey_alloc pkey_free
pkey_mprotect poll ppoll ppoll_time64 prctl pread64 preadv preadv2 prlimit64 process_mrelease
pselect6 pselect6_time64 pwrite64 pwritev pwritev2 read readahead readlink readlinkat readv recv
recvfrom recvmmsg recvmmsg_time64 recvmsg remap_file_pages removexattr removexattrat rename
renameat renameat2 restart_syscall riscv_hwprobe rmdir rseq rt_sigaction rt_sigpending
rt_sigprocmask rt_sigqueueinfo rt_sigreturn rt_sigsuspend rt_sigtimedwait rt_sigtimedwait_time64
rt_tgsigqueueinfo sched_getaffinity sched_getattr sched_getparam sched_get_priority_max
sched_get_priority_min sched_getscheduler sched_rr_get_interval sched_rr_get_interval_time64
sched_setaffinity sched_setattr sched_setparam sched_setscheduler sched_yield seccomp select
semctl semget semop semtimedop semtimedop_time64 send sendfile sendfile64 sendmmsg sendmsg
sendto setfsgid setfsgid32 setfsuid setfsuid32 setgid setgid32 setgroups setgroups32 setitimer
setpgid setpriority setregid setregid32 setresgid setresgid32 setresuid setresuid32 setreuid
setreuid32 setrlimit set_robust_list setsid setsockopt set_thread_area set_tid_address setuid
setuid32 setxattr setxattrat shmat shmctl shmdt shmget shutdown sigaltstack signalfd signalfd4
sigprocmask sigreturn socketcall socketpair splice stat stat64 statfs statfs64 statmount statx
symlink symlinkat sync sync_file_range syncfs sysinfo tee tgkill time timer_create timer_delete
timer_getoverrun timer_gettime timer_gettime64 timer_settime timer_settime64 timerfd_create
timerfd_gettime timerfd_gettime64 timerfd_settime timerfd_settime64 times tkill truncate
truncate64 ugetrlimit umask uname unlink unlinkat uretprobe utime utimensat utimensat_time64
utimes vfork vmsplice wait4 waitid waitpid write writev
""".split()
)
# ... from Linux 4.8 on (before it, a tracer could get round seccomp).
DOCKER_ALLOWED_FROM_4_8 = ("process_vm_readv", "process_vm_writev", "ptrace")
# ... on some architectures only (libseccomp's names of them, as Docker's "arches").
DOCKER_ALLOWED_ON: tuple[tuple[tuple[str, ...], tuple[str, ...]], ...] = (
    (("ppc64le",), ("sync_file_range2", "swapcontext")),
    (
        ("arm", "arm64"),
        (
            "arm_fadvise64_64",
            "arm_sync_file_range",
            "sync_file_range2",
            "breakpoint",
            "cacheflush",
            "set_tls",
        ),
    ),
    (("amd64", "x32"), ("arch_prctl",)),
    (("amd64", "x32", "x86"), ("modify_ldt",)),
    (("s390", "s390x"), ("s390_pci_mmio_read", "s390_pci_mmio_write", "s390_runtime_instr")),
    (("riscv64",), ("riscv_flush_icache",)),
)
# socket(2) only for families below AF_ALG (38), AF_NFC (39) or above AF_VSOCK (40): see
# SOCKET_FAMILIES below.
# personality(2) only to PER_LINUX, PER_LINUX32, UNAME26, UNAME26|PER_LINUX32, or the query.
DOCKER_PERSONALITIES = (0x0, 0x8, 0x20000, 0x20008, 0xFFFFFFFF)
# clone(2) only without namespace flags (its first argument; the second on s390).
S390 = ("s390", "s390x")

# Our rules, stricter than Docker's. Refused whatever the allowlist says: administration
# of the kernel and its namespaces, and interfaces that give unprivileged code a large
# kernel attack surface.
REFUSED = (
    "acct",
    "add_key",
    "bpf",
    "clock_adjtime",
    "clock_adjtime64",
    "clock_settime",
    "create_module",
    "delete_module",
    "finit_module",
    "fsconfig",
    "fsmount",
    "fsopen",
    "fspick",
    "get_kernel_syms",
    "init_module",
    "io_uring_enter",
    "io_uring_register",
    "io_uring_setup",
    "ioperm",
    "iopl",
    "kexec_file_load",
    "kexec_load",
    "keyctl",
    "lookup_dcookie",
    "mount",
    "mount_setattr",
    "move_mount",
    "name_to_handle_at",
    "nfsservctl",
    "open_by_handle_at",
    "open_tree",
    "perf_event_open",
    "pivot_root",
    "query_module",
    "quotactl",
    "quotactl_fd",
    "reboot",
    "request_key",
    "setns",
    "settimeofday",
    "stime",
    "swapoff",
    "swapon",
    "_sysctl",
    "sysfs",
    "syslog",
    "umount",
    "umount2",
    "unshare",
    "uselib",
    "userfaultfd",
    "ustat",
    "vhangup",
    "vm86",
    "vm86old",
)
# Answered "not implemented": callers (glibc, Python) fall back to calls we can filter.
# socketcall is 32-bit x86's way to every socket call, socket(AF_ALG) included, with its
# arguments in memory (Docker allows it; a 32-bit program has socket(2) since Linux 4.3).
NOT_IMPLEMENTED = ("clone3", "fchmodat2", "openat2", "socketcall")
# socket(2)'s families: Docker's, with "above AF_VSOCK" spelled out as the families Linux
# has there (AF_KCM 41 ... AF_MCTP 45): Docker's profile compares all 64 bits of the
# argument, and the kernel reads an int, so "above 40" would also pass 2**32 + 38, AF_ALG.
SOCKET_FAMILIES = (("lt", 38), ("eq", 39), *(("eq", family) for family in range(41, 46)))
# (syscall, index of its mode argument): the mode may not carry S_ISUID or S_ISGID.
MODE_ARGS = (
    ("chmod", 1),
    ("fchmod", 1),
    ("fchmodat", 2),
    ("creat", 1),
    ("open", 2),
    ("openat", 3),
    ("mknod", 1),
    ("mknodat", 2),
)

ALLOW = 0


@dataclass(frozen=True)
class Rule:
    """What ``names`` answer (``errno``, or :data:`ALLOW`), when argument ``arg``
    passes ``op`` against ``value`` (always when ``arg`` is -1), on the architectures
    ``arches`` (libseccomp's names; every one when empty) but not ``not_arches``, on
    kernels from ``min_kernel`` on. Calls with several allowing rules are allowed when
    any of them holds. ``op`` is ``clear`` (``arg & value == 0``), ``eq`` or ``lt``."""

    names: tuple[str, ...]
    errno: int = ALLOW
    arg: int = -1
    op: str = ""
    value: int = 0
    arches: tuple[str, ...] = ()
    not_arches: tuple[str, ...] = ()
    min_kernel: tuple[int, int] = (0, 0)

    def applies(self, arch: str, kernel: tuple[int, int]) -> bool:
        """Whether the rule is in force on ``arch`` (libseccomp's name) and ``kernel``."""
        if self.arches and arch not in self.arches:
            return False
        return arch not in self.not_arches and kernel >= self.min_kernel


def _rules() -> tuple[Rule, ...]:
    """The policy: Docker's allowlist with ours taken away (see the module's text)."""
    taken = set(REFUSED) | set(NOT_IMPLEMENTED)
    checked = {name for name, _ in MODE_ARGS} | {"clone", "personality", "socket"}

    def kept(names: tuple[str, ...]) -> tuple[str, ...]:
        return tuple(n for n in names if n not in taken and n not in checked)

    rules = [Rule(kept(DOCKER_ALLOWED)), Rule(kept(DOCKER_ALLOWED_FROM_4_8), min_kernel=(4, 8))]
    rules += [Rule(kept(names), arches=arches) for arches, names in DOCKER_ALLOWED_ON]
    rules += [Rule(("socket",), arg=0, op=op, value=v) for op, v in SOCKET_FAMILIES]
    rules += [Rule(("personality",), arg=0, op="eq", value=v) for v in DOCKER_PERSONALITIES]
    rules.append(Rule(("clone",), arg=0, op="clear", value=CLONE_NS_FLAGS, not_arches=S390))
    rules.append(Rule(("clone",), arg=1, op="clear", value=CLONE_NS_FLAGS, arches=S390))
    for name, index in MODE_ARGS:  # Docker allows them with any mode
        rules.append(Rule((name,), arg=index, op="clear", value=S_ISUID | S_ISGID))
    rules.append(Rule(NOT_IMPLEMENTED, errno=errno.ENOSYS))
    return tuple(rules)


RULES = _rules()

# uname's machine -> (libseccomp's name, AUDIT_ARCH_* of the native ABI, its numbers,
# first number of a foreign ABI sharing the architecture (x32), or 0).
_ARCHES = {
    "x86_64": ("amd64", 0xC000003E, syscall_table.X86_64, 0x40000000),
    "aarch64": ("arm64", 0xC00000B7, syscall_table.AARCH64, 0),
}

# Classic BPF, as seccomp runs it (linux/filter.h, linux/seccomp.h).
_LD_W_ABS = 0x20
_JA = 0x05
_JEQ_K = 0x15
_JGE_K = 0x35
_JSET_K = 0x45
_RET_K = 0x06
_RET_ALLOW = 0x7FFF0000
_RET_ERRNO = 0x00050000
_RET_KILL_PROCESS = 0x80000000
_NR = 0  # offsets in struct seccomp_data
_ARCH = 4
_ARG0 = 16  # args[i] at 16 + 8 * i; the low 32 bits first on little-endian machines
_FAR = 255  # the longest jump a conditional instruction takes


def _insn(code: int, k: int, jt: int = 0, jf: int = 0) -> bytes:
    return struct.pack("<HBBI", code, jt, jf, k)


def _ret(answer: int) -> bytes:
    return _insn(_RET_K, _RET_ALLOW if answer == ALLOW else _RET_ERRNO | answer)


def kernel_version(release: str = "") -> tuple[int, int]:
    """``(major, minor)`` of a kernel release (``uname -r``; this one when empty)."""
    found = re.match(r"(\d+)\.(\d+)", release or os.uname().release)
    return (int(found.group(1)), int(found.group(2))) if found else (0, 0)


def supported(machine: str = "") -> bool:
    """Whether :func:`bpf_program` knows this machine's architecture."""
    return (machine or os.uname().machine) in _ARCHES


def _checks(rules: list[Rule]) -> list[bytes]:
    """A call's argument tests: allowed when one holds, else EPERM. Each test loads its
    argument's low 32 bits: every argument tested is an int, a mode or flags whose
    tested bits are all there."""
    code = [_ret(errno.EPERM), _ret(ALLOW)]
    for rule in reversed(rules):
        to_allow = len(code) - 1  # from the test's jump to the final ALLOW
        if rule.op == "clear":
            test = _insn(_JSET_K, rule.value, 0, to_allow)
        elif rule.op == "eq":
            test = _insn(_JEQ_K, rule.value, to_allow, 0)
        elif rule.op == "lt":
            test = _insn(_JGE_K, rule.value, 0, to_allow)
        else:
            raise ValueError(f"unknown argument test {rule.op!r}")
        code[:0] = [_insn(_LD_W_ABS, _ARG0 + 8 * rule.arg), test]
    return code


def _search(ranges: list[tuple[int, list[bytes]]]) -> list[bytes]:
    """A binary search on the call number (in A) over ``(first number, code)`` ranges,
    each range's code running for the numbers up to the next range's first."""
    if len(ranges) == 1:
        return ranges[0][1]
    middle = len(ranges) // 2
    left, right = _search(ranges[:middle]), _search(ranges[middle:])
    first = ranges[middle][0]
    if len(left) <= _FAR:
        return [_insn(_JGE_K, first, len(left), 0), *left, *right]
    return [_insn(_JGE_K, first, 0, 1), _insn(_JA, len(left)), *left, *right]


@lru_cache(maxsize=8)
def bpf_program(machine: str = "", release: str = "") -> bytes:
    """The policy as a seccomp classic-BPF program (an array of ``struct sock_filter``)
    for ``machine`` (``uname -m``) and kernel ``release`` (``uname -r``; this machine's
    when empty). Raises ValueError for an architecture it does not know (:func:`supported`)."""
    machine = machine or os.uname().machine
    if machine not in _ARCHES:
        raise ValueError(f"no system-call table for {machine}")
    arch, audit_arch, numbers, foreign = _ARCHES[machine]
    kernel = kernel_version(release)
    by_number: dict[int, list[Rule]] = {}
    for rule in RULES:
        if rule.applies(arch, kernel):
            for name in rule.names:
                if name in numbers:
                    by_number.setdefault(numbers[name], []).append(rule)
    answers: dict[int, list[bytes]] = {}
    for number, rules in by_number.items():
        if len(rules) == 1 and rules[0].arg < 0:
            answers[number] = [_ret(rules[0].errno)]
        elif all(r.arg >= 0 and r.errno == ALLOW for r in rules):
            answers[number] = _checks(rules)
        else:
            raise ValueError(f"rules for {sorted(r.names for r in rules)} mix answers")
    for name in REFUSED:  # whatever else said, and also past the newest call allowed
        if name in numbers:
            answers[numbers[name]] = [_ret(errno.EPERM)]
    last = max(answers)  # the newest call the rules name: newer ones answer ENOSYS
    ranges: list[tuple[int, list[bytes]]] = []
    for number in range(last + 2):
        code = answers.get(number, [_ret(errno.EPERM if number <= last else errno.ENOSYS)])
        if not ranges or ranges[-1][1] != code:  # neighbours with one answer share a range
            ranges.append((number, code))
    prog = [
        _insn(_LD_W_ABS, _ARCH),
        _insn(_JEQ_K, audit_arch, 1, 0),
        _insn(_RET_K, _RET_KILL_PROCESS),
        _insn(_LD_W_ABS, _NR),
    ]
    if foreign:
        prog += [_insn(_JGE_K, foreign, 0, 1), _insn(_RET_K, _RET_KILL_PROCESS)]
    prog += _search(ranges)
    return b"".join(prog)
