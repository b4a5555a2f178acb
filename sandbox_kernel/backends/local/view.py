"""What a process of a local sandbox sees: the bubblewrap command line.

The host's programs read-only (``/usr``, and ``/bin``, ``/lib``... as the host has them),
of ``/etc`` only what programs need to run (the loader's cache, CA certificates, time
zone, name service and terminal settings; never ``shadow``, ``sudoers``, SSH or TLS
keys) plus files made for the sandbox (a ``passwd`` naming its user ``sandbox``,
``group``, ``hosts``, ``hostname``, ``resolv.conf``), its own ``/proc``, a minimal
``/dev`` with a ``/dev/shm`` of its own (tmpfs, as large as its memory), the
interpreter's installation read-only, and the sandbox's folders: the workspace, the
home, ``/tmp`` (shared by the sandbox's processes, kept until it is destroyed, as a
container's), the shared folder (read-only) and the work folder with its masks.

The folders come as :class:`Bind` entries; where bubblewrap finds them (a host path,
or a folder staged for it by :mod:`.launch`) is the backend's decision.
"""

from __future__ import annotations

import fcntl
import glob
import hashlib
import os
import shutil
import stat
import subprocess
from dataclasses import dataclass
from functools import lru_cache
from pathlib import Path

HOME = "/home/sandbox"
SLIRP_DNS = "10.0.2.3"
SANDBOX_UID = 1000
HOSTNAME = "sandbox"  # as a Docker sandbox's

# What of /etc a sandbox sees (when the host has it): what programs need to start,
# resolve names, verify TLS, tell the time and draw a terminal.
ETC = (
    "alternatives",
    "bash.bashrc",
    "ca-certificates",
    "ca-certificates.conf",
    "debian_version",
    "fonts",
    "gai.conf",
    "host.conf",
    "inputrc",
    "ld.so.cache",
    "ld.so.conf",
    "ld.so.conf.d",
    "locale.alias",
    "locale.conf",
    "localtime",
    "lsb-release",
    "magic",
    "mailcap",
    "matplotlibrc",
    "mime.types",
    "nsswitch.conf",
    "os-release",
    "pip.conf",
    "pki/ca-trust",
    "pki/tls/certs",
    "profile",
    "profile.d",
    "protocols",
    "python3*",
    "rpc",
    "services",
    "ssl/cert.pem",
    "ssl/certs",
    "ssl/openssl.cnf",
    "terminfo",
    "timezone",
    "vim",
    "xdg",
)


@dataclass(frozen=True)
class Bind:
    """A host folder or file shown at ``dest``: ``source`` is where bubblewrap finds it
    (a path, or ``fd:N`` for a descriptor it binds, checking it is that very file)."""

    source: str
    dest: str
    writable: bool = False


@lru_cache(maxsize=1)
def bwrap_features() -> frozenset[str]:
    """The options this bubblewrap knows of those not every version has."""
    try:
        said = subprocess.run(["bwrap", "--help"], capture_output=True, text=True, timeout=10)
    except (OSError, subprocess.TimeoutExpired):
        return frozenset()
    return frozenset(o for o in ("--size", "--bind-fd", "--ro-bind-fd") if o in said.stdout)


def system_args() -> list[str]:
    """The host's programs and libraries, read-only, as the host lays them out."""
    args: list[str] = []
    for top in ("/usr", "/bin", "/lib", "/lib32", "/lib64", "/libx32", "/sbin"):
        if os.path.islink(top):
            args += ["--symlink", os.readlink(top), top]
        elif os.path.isdir(top):
            args += ["--ro-bind", top, top]
    return args


def shared_etc(cache: Path, network: str) -> Path:
    """The /etc of this installation's sandboxes with ``network`` ("slirp4netns" or
    "none"), made when the host's files it copies have changed (:func:`assemble_etc`);
    one folder per variant, bound whole: one mount per process, not one per entry, and
    no copy at each start."""
    fingerprint = hashlib.sha256()
    for pattern in ETC:
        for path in sorted(glob.glob(os.path.join("/etc", pattern))):
            try:
                st = os.lstat(path)
            except OSError:
                continue
            fingerprint.update(f"{path} {st.st_ino} {st.st_size} {st.st_mtime_ns}\n".encode())
    folder = cache / f"{network}-{fingerprint.hexdigest()[:16]}"
    if (folder / "passwd").exists():
        return folder
    cache.mkdir(parents=True, exist_ok=True)
    with open(cache / ".lock", "a") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        if not (folder / "passwd").exists():
            assemble_etc(folder, generated_etc(resolv_conf(network)))
    return folder


def resolv_conf(network: str) -> str:
    """The sandbox's /etc/resolv.conf: slirp4netns forwards DNS from its own address."""
    return f"nameserver {SLIRP_DNS}\n" if network == "slirp4netns" else ""


def assemble_etc(folder: Path, generated: dict[str, str]) -> None:
    """Make ``folder`` a sandbox's /etc: copies of what :data:`ETC` names (links as
    links, and only what anyone may read), and the ``generated`` files."""
    new = folder.with_name(f".{folder.name}-new")
    shutil.rmtree(new, ignore_errors=True)
    new.mkdir(mode=0o755)
    for pattern in ETC:
        for path in sorted(glob.glob(os.path.join("/etc", pattern))):
            target = new / os.path.relpath(path, "/etc")
            target.parent.mkdir(parents=True, exist_ok=True)
            _copy_public(path, target)
    for name, text in generated.items():
        (new / name).write_text(text)
        os.chmod(new / name, 0o644)
    old = folder.with_name(f".{folder.name}-old")
    shutil.rmtree(old, ignore_errors=True)
    if folder.exists():
        folder.rename(old)
    new.rename(folder)
    shutil.rmtree(old, ignore_errors=True)


def _copy_public(source: str, target: Path) -> None:
    """Copy a file, link or folder that anyone may read (others are left out)."""
    try:
        st = os.lstat(source)
    except OSError:
        return
    if stat.S_ISLNK(st.st_mode):
        os.symlink(os.readlink(source), target)
    elif stat.S_ISDIR(st.st_mode) and st.st_mode & 0o005 == 0o005:
        target.mkdir(mode=0o755)
        for name in sorted(os.listdir(source)):
            _copy_public(os.path.join(source, name), target / name)
    elif stat.S_ISREG(st.st_mode) and st.st_mode & 0o004:
        shutil.copyfile(source, target)
        os.chmod(target, 0o644)


def generated_etc(resolv: str) -> dict[str, str]:
    """The files of /etc made for a sandbox: its user is ``sandbox`` (uid 1000) with its
    home, so a prompt or ``getpass.getuser()`` names it; names resolve as its network
    allows."""
    shell = "/bin/bash" if shutil.which("bash", path="/usr/bin:/bin") else "/bin/sh"
    return {
        "passwd": (
            "root:x:0:0:root:/root:/usr/sbin/nologin\n"
            f"sandbox:x:{SANDBOX_UID}:{SANDBOX_UID}:sandbox:{HOME}:{shell}\n"
            "nobody:x:65534:65534:nobody:/nonexistent:/usr/sbin/nologin\n"
        ),
        "group": f"root:x:0:\nsandbox:x:{SANDBOX_UID}:\nnogroup:x:65534:\n",
        "hosts": (
            "127.0.0.1\tlocalhost\n::1\tlocalhost ip6-localhost ip6-loopback\n"
            f"127.0.1.1\t{HOSTNAME}\n"
        ),
        "hostname": f"{HOSTNAME}\n",
        "resolv.conf": resolv,
    }


def bwrap_command(
    cmd: list[str],
    *,
    binds: list[Bind],
    etc_folder: str,
    masks: list[tuple[str, str, str]],
    cwd: str,
    env: dict[str, str],
    tmp_size: int,
    seccomp_fd: int,
    new_session: bool,
) -> list[str]:
    """The bubblewrap command that runs ``cmd`` as the sandbox user (uid 1000 in a user
    namespace of its own, inside the sandbox's, whose network it keeps), with its own
    mounts, processes, IPC and host name.

    ``etc_folder`` is its /etc (see :func:`assemble_etc`); ``masks`` are (path, how,
    source) for the work folder's masked paths: "hide", or "read-only" or "pin" (a
    folder mounted onto itself, writable) shown from ``source``; ``tmp_size`` bounds ``/dev/shm`` (0: no bound)."""
    features = bwrap_features()
    size = ["--size", str(tmp_size)] if "--size" in features and tmp_size else []
    argv = [
        "bwrap",
        "--unshare-user",
        "--uid",
        str(SANDBOX_UID),
        "--gid",
        str(SANDBOX_UID),
        "--unshare-pid",
        "--unshare-ipc",
        "--unshare-uts",
        "--unshare-cgroup-try",
        "--hostname",
        HOSTNAME,
    ]
    if new_session:
        argv.append("--new-session")
    argv += system_args()
    argv += ["--ro-bind", etc_folder, "/etc"]
    argv += [
        "--proc",
        "/proc",
        "--dev",
        "/dev",
        *size,
        "--tmpfs",
        "/dev/shm",
    ]
    for bind in binds:
        argv += bind_args(bind)
    for path, how, source in masks:
        if how in ("read-only", "pin"):  # a pin: onto itself, so it cannot be moved
            argv += bind_args(Bind(source, path, writable=how == "pin"))
        elif os.path.isdir(path) and not os.path.islink(path):
            argv += [*(["--size", str(1 << 20)] if size else []), "--tmpfs", path]
        else:
            argv += ["--ro-bind", "/dev/null", path]
    if seccomp_fd >= 0:
        argv += ["--seccomp", str(seccomp_fd)]
    argv += ["--chdir", cwd, "--clearenv"]
    for name, value in env.items():
        argv += ["--setenv", name, value]
    return [*argv, "--", *cmd]


def bind_args(bind: Bind) -> list[str]:
    """bubblewrap's options that show ``bind``."""
    if bind.source.startswith("fd:"):
        return ["--bind-fd" if bind.writable else "--ro-bind-fd", bind.source[3:], bind.dest]
    return ["--bind" if bind.writable else "--ro-bind", bind.source, bind.dest]
