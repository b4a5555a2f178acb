"""The system-call policy (``sandbox_kernel/backends/seccomp.py``) as engines apply it.

Fast: Docker's JSON profile has the shape Docker 20.10 reads and never allows what our
rules take away; the x86_64 numbers match this machine's kernel headers. With engines:
one program run in a real sandbox (Docker with the test image; bubblewrap's local
backend) does what notebooks do (threads, processes, asyncio, sqlite3, ssl, mmap, git,
pip installing a wheel it builds) and tries what the policy refuses, and each engine
answers as the policy says. The bubblewrap program's answer to every call number is
checked without a sandbox in ``tests/test_local_parts.py``.
"""

from __future__ import annotations

import json
import re
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from sandbox_kernel.backends import seccomp, syscall_table
from sandbox_kernel.backends.docker.security import seccomp_profile
from sandbox_kernel.config import SandboxConfig
from sandbox_kernel.identity import ScopeKey
from sandbox_kernel.service import SandboxService

from .local_host import LocalHost

HEADER = Path("/usr/include/x86_64-linux-gnu/asm/unistd_64.h")

# What Docker 20.10 reads of a profile (moby's types.Seccomp of that release); anything
# else would be ignored without a word, so a rule spelled with it would silently not hold.
_PROFILE_KEYS = {"defaultAction", "defaultErrnoRet", "archMap", "syscalls"}
_SYSCALL_KEYS = {"names", "action", "errnoRet", "args", "includes", "excludes", "comment"}
_FILTER_KEYS = {"arches", "minKernel", "caps"}
_ARG_KEYS = {"index", "value", "valueTwo", "op"}
_OPS = {"SCMP_CMP_MASKED_EQ", "SCMP_CMP_EQ", "SCMP_CMP_LT"}


@pytest.mark.fast
def test_docker_profile_is_dockers_allowlist_with_ours_taken_away() -> None:
    profile = json.loads(seccomp_profile())
    assert set(profile) <= _PROFILE_KEYS, set(profile) - _PROFILE_KEYS
    assert profile["defaultAction"] == "SCMP_ACT_ERRNO" and profile["defaultErrnoRet"] == 1
    arches = {entry["architecture"]: entry["subArchitectures"] for entry in profile["archMap"]}
    assert arches == {
        "SCMP_ARCH_X86_64": ["SCMP_ARCH_X86", "SCMP_ARCH_X32"],
        "SCMP_ARCH_AARCH64": ["SCMP_ARCH_ARM"],
    }
    dockers = set(seccomp.DOCKER_ALLOWED) | set(seccomp.DOCKER_ALLOWED_FROM_4_8)
    dockers |= {"socket", "personality", "clone"}  # Docker allows them on conditions
    for _, names in seccomp.DOCKER_ALLOWED_ON:
        dockers |= set(names)
    taken = set(seccomp.REFUSED) | set(seccomp.NOT_IMPLEMENTED)
    allowed: set[str] = set()
    for entry in profile["syscalls"]:
        assert set(entry) <= _SYSCALL_KEYS, entry
        assert entry["names"] and all(isinstance(n, str) for n in entry["names"]), entry
        for key in ("includes", "excludes"):
            assert set(entry.get(key, {})) <= _FILTER_KEYS, entry
        if "minKernel" in entry.get("includes", {}):
            assert re.fullmatch(r"\d+\.\d+", entry["includes"]["minKernel"]), entry
        for arg in entry.get("args", []):
            assert set(arg) <= _ARG_KEYS and arg["op"] in _OPS, entry
            assert 0 <= arg["index"] < 6 and isinstance(arg["value"], int), entry
        if entry["action"] == "SCMP_ACT_ALLOW":
            assert "errnoRet" not in entry, entry
            allowed |= set(entry["names"])
            assert not taken & set(entry["names"]), taken & set(entry["names"])
        else:
            assert entry["action"] == "SCMP_ACT_ERRNO", entry
            assert entry["names"] == list(seccomp.NOT_IMPLEMENTED) and entry["errnoRet"] == 38
    assert allowed <= dockers, allowed - dockers  # ours only take away
    assert {"read", "write", "execve", "landlock_create_ruleset", "socket"} <= allowed
    # The conditions: setuid bits on every mode-setting call, clone's namespace flags.
    masks = {
        (e["names"][0], a["index"]): a["value"]
        for e in profile["syscalls"]
        for a in e.get("args", [])
        if a["op"] == "SCMP_CMP_MASKED_EQ"
    }
    for name, index in seccomp.MODE_ARGS:
        assert masks[(name, index)] == 0o6000, name
    assert masks[("clone", 0)] == masks[("clone", 1)] == 0x7E020000
    families = sorted(
        (a["op"], a["value"])
        for e in profile["syscalls"]
        if e["names"] == ["socket"]
        for a in e["args"]
    )
    assert families == [("SCMP_CMP_EQ", v) for v in (39, 41, 42, 43, 44, 45)] + [
        ("SCMP_CMP_LT", 38)
    ]


@pytest.mark.fast
def test_x86_64_numbers_match_this_machines_headers() -> None:
    if not HEADER.is_file():
        pytest.skip(f"{HEADER} is missing (apt-get install linux-libc-dev)")
    found = dict(re.findall(r"#define __NR_(\w+) (\d+)", HEADER.read_text()))
    header = {name: int(number) for name, number in found.items()}
    assert len(header) > 300
    differ = {
        name: (number, syscall_table.X86_64.get(name))
        for name, number in header.items()
        if syscall_table.X86_64.get(name) != number
    }
    assert not differ, f"(header, table): {differ}"
    newer = {n: v for n, v in syscall_table.X86_64.items() if n not in header}
    assert not set(newer.values()) & set(header.values()), newer  # newer calls, new numbers
    assert len(set(syscall_table.X86_64.values())) == len(syscall_table.X86_64)


# One program for both engines: what notebooks do, then what the policy refuses. It
# prints {check: result}; a refusal's result is the errno's name.
_PROBE = r"""
import asyncio, ctypes, errno, json, mmap, multiprocessing, os, socket, sqlite3, ssl
import subprocess, sys, tempfile, threading, time, zipfile
R = {}
def check(name, fn):
    try:
        R[name] = fn()
    except OSError as exc:
        R[name] = errno.errorcode.get(exc.errno, str(exc.errno))
    except Exception as exc:
        R[name] = 'failed: %s: %s' % (type(exc).__name__, exc)
work = tempfile.mkdtemp()
R['seccomp'] = [l.split()[1] for l in open('/proc/self/status') if l.startswith('Seccomp:')]

def threads():
    done = []
    ts = [threading.Thread(target=lambda i=i: done.append(sum(range(i * 1000)))) for i in range(8)]
    for t in ts: t.start()
    for t in ts: t.join()
    return len(done)
check('threads', threads)
def pool():
    with multiprocessing.Pool(2) as p:
        return p.map(abs, [-1, -2, -3])
check('multiprocessing', pool)
check('subprocess', lambda: subprocess.run(['sh', '-c', 'echo hi'], capture_output=True, check=True).stdout.decode())
def fork():
    pid = os.fork()
    if pid == 0:
        os._exit(7)
    return os.waitstatus_to_exitcode(os.waitpid(pid, 0)[1])
check('fork', fork)
async def main():
    proc = await asyncio.create_subprocess_exec('true')
    await asyncio.sleep(0.01)
    return await proc.wait()
check('asyncio', lambda: asyncio.run(main()))
def db():
    con = sqlite3.connect(os.path.join(work, 'n.db'))
    con.execute('pragma journal_mode=wal')
    con.execute('create table t (x)'); con.executemany('insert into t values (?)', [(1,), (2,)])
    con.commit()
    return con.execute('select sum(x) from t').fetchone()[0]
check('sqlite3', db)
def tls():
    ctx = ssl.create_default_context()
    return ctx.verify_mode == ssl.CERT_REQUIRED and len(ssl.RAND_bytes(16)) == 16
check('ssl', tls)
def maps():
    anon = mmap.mmap(-1, 1 << 20); anon[:5] = b'hello'
    with open(os.path.join(work, 'm'), 'wb+') as fh:
        fh.write(b'x' * 4096); fh.flush()
        mapped = mmap.mmap(fh.fileno(), 4096); mapped[0:1] = b'y'; mapped.flush()
    return anon[:5].decode() + open(os.path.join(work, 'm'), 'rb').read(2).decode()
check('mmap', maps)
def clocks():
    t0 = time.monotonic(); time.sleep(0.01)
    return time.monotonic() > t0 and time.time() > 1e9 and time.process_time() >= 0
check('time', clocks)
def git():
    repo = os.path.join(work, 'repo')
    g = ['git', '-c', 'user.name=n', '-c', 'user.email=n@example.invalid', '-C', repo]
    subprocess.run(['git', 'init', '-q', repo], check=True)
    open(os.path.join(repo, 'a.txt'), 'w').write('a\n')
    subprocess.run(g + ['add', 'a.txt'], check=True)
    subprocess.run(g + ['commit', '-q', '-m', 'first'], check=True)
    return subprocess.run(g + ['log', '--format=%s'], capture_output=True, check=True).stdout.decode()
check('git', git)
def pip():
    wheel = os.path.join(work, 'skdemo-1.0-py3-none-any.whl')
    with zipfile.ZipFile(wheel, 'w') as z:
        z.writestr('skdemo.py', 'VALUE = 42\n')
        z.writestr('skdemo-1.0.dist-info/METADATA', 'Metadata-Version: 2.1\nName: skdemo\nVersion: 1.0\n')
        z.writestr('skdemo-1.0.dist-info/WHEEL', 'Wheel-Version: 1.0\nGenerator: test\nRoot-Is-Purelib: true\nTag: py3-none-any\n')
        z.writestr('skdemo-1.0.dist-info/RECORD', '')
    done = subprocess.run([sys.executable, '-m', 'pip', 'install', '-q', '--no-index', '--no-deps',
                           '--disable-pip-version-check', '--no-cache-dir', wheel], capture_output=True)
    if done.returncode:
        return 'failed: ' + done.stderr.decode(errors='replace')[-600:]
    return subprocess.run([sys.executable, '-c', 'import skdemo; print(skdemo.VALUE)'],
                          capture_output=True, check=True).stdout.decode()
check('pip', pip)

libc = ctypes.CDLL(None, use_errno=True)
libc.syscall.restype = ctypes.c_long
NR = {'x86_64': dict(perf_event_open=298, kexec_load=246, io_uring_setup=425, socket=41, clone=56),
      'aarch64': dict(perf_event_open=241, kexec_load=104, io_uring_setup=425, socket=198, clone=220)}[os.uname().machine]
NR.update(clone3=435, openat2=437, open_tree_attr=467)
def raw(nr, *args):
    def call():
        got = libc.syscall(ctypes.c_long(nr), *[ctypes.c_ulong(a) for a in args])
        if nr == NR['clone'] and got == 0:
            os._exit(0)  # a child made after all: it must not go on with this program
        if nr == NR['clone'] and got > 0:
            os.waitpid(got, 0)
        if got < 0:
            raise OSError(ctypes.get_errno(), 'syscall %d' % nr)
        return 'done'
    return call
open(os.path.join(work, 'x'), 'w').write('#!/bin/sh\n')
check('chmod 0755', lambda: os.chmod(os.path.join(work, 'x'), 0o755) or 'done')
check('chmod 4755', lambda: os.chmod(os.path.join(work, 'x'), 0o4755) or 'done')
check('clone NEWUSER', raw(NR['clone'], 0x10000000 | 17, 0, 0, 0, 0))
check('unshare', lambda: raw(272 if os.uname().machine == 'x86_64' else 97, 0x10000000)())
check('perf_event_open', raw(NR['perf_event_open'], 0, 0, 0xFFFFFFFF, 0xFFFFFFFF, 0))
check('kexec_load', raw(NR['kexec_load'], 0, 0, 0, 0))
check('io_uring_setup', raw(NR['io_uring_setup'], 1, 0))
check('clone3', raw(NR['clone3'], 0, 0))
check('openat2', raw(NR['openat2'], 0xFFFFFF9C, 0, 0, 0))
check('open_tree_attr', raw(NR['open_tree_attr'], 0xFFFFFFFF, 0, 0, 0, 0))
check('socket AF_UNIX', lambda: socket.socket(socket.AF_UNIX).close() or 'done')
check('socket AF_ALG', lambda: socket.socket(38, socket.SOCK_SEQPACKET).close() or 'done')
check('socket AF_VSOCK', lambda: socket.socket(40, socket.SOCK_STREAM).close() or 'done')
check('socket 2**32+AF_ALG', raw(NR['socket'], (1 << 32) | 38, 5, 0))
check('personality query', lambda: libc.personality(ctypes.c_ulong(0xFFFFFFFF)) >= 0 or 'failed')
def no_randomize():
    if libc.personality(ctypes.c_ulong(0x0040000)) < 0:
        raise OSError(ctypes.get_errno(), 'personality')
    return 'done'
check('personality ADDR_NO_RANDOMIZE', no_randomize)
print(json.dumps(R))
"""

# What every engine answers. Without a filter (a container with seccomp=unconfined)
# every refusal here differs: the call succeeds, or fails with EFAULT, EINVAL, ENOSYS
# (kexec_load) or EAFNOSUPPORT (AF_ALG) instead.
EXPECTED: dict[str, Any] = {
    "seccomp": ["2"],
    "threads": 8,
    "multiprocessing": [1, 2, 3],
    "subprocess": "hi\n",
    "fork": 7,
    "asyncio": 0,
    "sqlite3": 3,
    "ssl": True,
    "mmap": "helloyx",
    "time": True,
    "git": "first\n",
    "pip": "42\n",
    "chmod 0755": "done",
    "chmod 4755": "EPERM",
    "unshare": "EPERM",
    "clone NEWUSER": "EPERM",
    "perf_event_open": "EPERM",
    "kexec_load": "EPERM",
    "io_uring_setup": "EPERM",
    "clone3": "ENOSYS",
    "openat2": "ENOSYS",
    "open_tree_attr": "ENOSYS",
    "socket AF_UNIX": "done",
    "socket AF_ALG": "EPERM",
    "socket AF_VSOCK": "EPERM",
    "socket 2**32+AF_ALG": "EPERM",
    "personality query": True,
    "personality ADDR_NO_RANDOMIZE": "EPERM",
}


def _answers(output: str) -> dict[str, Any]:
    said: dict[str, Any] = json.loads(output.strip().splitlines()[-1])
    return said


@pytest.mark.docker
@pytest.mark.usefixtures("docker_cleanup")
def test_docker_sandbox_runs_notebook_programs_and_refuses_the_rest(
    make_config: Callable[..., SandboxConfig], test_user: str
) -> None:
    service = SandboxService(make_config())
    info = service.ensure(ScopeKey(test_user)).info
    done = service.backend.exec(info.id, ["python3", "-c", _PROBE], timeout=180)
    output = done.output.decode(errors="replace")
    assert done.exit_code == 0, output
    assert _answers(output) == EXPECTED


@pytest.mark.bwrap
@pytest.mark.parametrize("local_host", ["user"], indirect=True)
def test_local_sandbox_runs_notebook_programs_and_refuses_the_rest(local_host: LocalHost) -> None:
    result = local_host.run(
        """
svc = service()
info = svc.ensure(ScopeKey("syscalls")).info
code, out = run(svc, info.id, ARGS["code"], timeout=180)
RESULT["said"] = last_json(out) if code == 0 else out
""",
        code=_PROBE,
    )
    assert result["said"] == EXPECTED
