"""Sockets made in a local sandbox's network namespace, for the host to use.

A socket belongs to the network namespace it was made in, whoever holds it afterwards.
So the host reaches a sandbox's ports (preview URLs) with a socket made in the
sandbox's namespace and connected to the sandbox's own loopback, and the sandbox's
egress proxy, a process of the host, listens on the sandbox's loopback through a
socket made there. Nothing is published on the host: no port, no socket file, nothing
another user of the machine, or the sandbox, could connect to in the host's network.

The sockets are made by a small helper process (:data:`HELPER`) that enters the
namespace: as root, the network namespace alone, then it becomes the sandbox's uid
(so the end of the sandbox ends it too); as an ordinary user, the holder's user
namespace first (that user owns it: the only way in for them). It makes the sockets
asked of it and hands each back over a socket pair (``SCM_RIGHTS``); it runs nothing
else, reads nothing of the sandbox but its own TCP tables, and ends when the holder
does or when the host closes its end of the pair.
"""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
import threading
from pathlib import Path
from typing import Any

from ..base import SandboxFailed
from .holder import Holder, load, start_time
from .launch import CLONE_NEWNET, Launch, close_all, pass_fds, start

ASK_SECONDS = 10.0

# Run by the host's Python (-I -S: nothing of any folder a sandbox can write), inside
# the sandbox's network namespace: argv is the socket pair's end, a pidfd of the
# holder, and the uid and gid to become (-1: stay).
HELPER = r"""
import json, os, select, socket, sys

control = socket.socket(fileno=int(sys.argv[1]))
holder = int(sys.argv[2])
uid, gid = int(sys.argv[3]), int(sys.argv[4])
if uid >= 0:
    os.setgroups([])
    os.setresgid(gid, gid, gid)
    os.setresuid(uid, uid, uid)
WILD = {"0.0.0.0", "::"}


def address(text, six):
    raw = bytes.fromhex(text)
    if not six:
        return socket.inet_ntop(socket.AF_INET, raw[::-1])
    words = b"".join(raw[i:i + 4][::-1] for i in range(0, 16, 4))
    if words[:12] == b"\0" * 10 + b"\xff\xff":
        return socket.inet_ntop(socket.AF_INET, words[12:])
    return socket.inet_ntop(socket.AF_INET6, words)


def listening(port):
    found = []
    for name, six in (("/proc/self/net/tcp", False), ("/proc/self/net/tcp6", True)):
        try:
            with open(name) as table:
                lines = table.read(1 << 22).splitlines()[1:]
        except OSError:
            continue
        for line in lines:
            fields = line.split()
            if len(fields) < 4 or fields[3] != "0A":
                continue
            where, _, hexport = fields[1].partition(":")
            try:
                if int(hexport, 16) == port:
                    found.append(address(where, six))
            except ValueError:
                continue
    return found


def target(port):
    found = listening(port)
    if not found:
        raise LookupError("nothing listens on port %d in the sandbox" % port)
    for wild, to in (("0.0.0.0", "127.0.0.1"), ("::", "::1")):
        if wild in found:
            return to
    raise LookupError(
        "port %d of the sandbox listens on %s only: make the app listen on 0.0.0.0"
        % (port, found[0])
    )


def make(ask):
    if "listen" in ask:
        host, port = ask["listen"]
        made = socket.socket(socket.AF_INET6 if ":" in host else socket.AF_INET)
        made.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        made.bind((host, port))
        made.listen(256)
        return made, [host, port]
    port = int(ask["connect"])
    host = target(port)
    return socket.socket(socket.AF_INET6 if ":" in host else socket.AF_INET), [host, port]


while True:
    ready, _, _ = select.select([control, holder], [], [])
    if holder in ready:
        break
    try:
        request = control.recv(4096)
    except OSError:
        break
    if not request:
        break
    try:
        made, where = make(json.loads(request))
    except (LookupError, OSError, ValueError, KeyError, TypeError) as exc:
        control.send(json.dumps({"error": str(exc) or type(exc).__name__}).encode())
        continue
    socket.send_fds(control, [json.dumps({"at": where}).encode()], [made.fileno()])
    made.close()
"""


class SandboxNetwork:
    """A helper in one sandbox's network namespace (see the module), for as long as the
    sandbox's holder lives or :meth:`close` is called."""

    def __init__(self, holder: Holder, what: str) -> None:
        self.holder = holder
        self._lock = threading.Lock()
        root = os.geteuid() == 0
        namespaces = holder.namespaces()  # (user, net): checked to be the holder's
        opened = [fd for fd, _ in namespaces]
        pidfd = -1
        mine, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)
        try:
            pidfd = os.pidfd_open(holder.pid)
            if start_time(holder.pid) != holder.start:
                raise OSError(f"the holder of {what} has ended")
            # Root enters the network namespace straight from the host's user namespace;
            # anyone else only through the holder's user namespace, which they own.
            enter = [(fd, kind) for fd, kind in namespaces if kind == CLONE_NEWNET or not root]
            become = (holder.uid, holder.gid) if root else (-1, -1)
            argv = [
                sys.executable,
                "-I",
                "-S",
                "-c",
                HELPER,
                str(theirs.fileno()),
                str(pidfd),
                str(become[0]),
                str(become[1]),
            ]
            self._proc = start(
                argv,
                Launch(namespaces=enter),
                f"a helper in the network of {what}",
                cwd="/",
                env={"PATH": "/usr/bin:/bin"},
                stdin=subprocess.DEVNULL,
                stdout=subprocess.DEVNULL,
                start_new_session=True,
                pass_fds=pass_fds([theirs.fileno(), pidfd]),
            )
        except BaseException:
            mine.close()
            raise
        finally:
            theirs.close()
            close_all([*opened, pidfd])
        self._control = mine
        self._control.settimeout(ASK_SECONDS)

    def serves(self, holder: Holder | None) -> bool:
        """Whether this helper is in ``holder``'s namespace and still running."""
        return (
            holder is not None
            and (holder.pid, holder.start) == (self.holder.pid, self.holder.start)
            and self._proc.poll() is None
        )

    def _ask(self, request: dict[str, Any]) -> tuple[socket.socket, tuple[str, int]]:
        with self._lock:
            try:
                self._control.send(json.dumps(request).encode())
                said, fds, _, _ = socket.recv_fds(self._control, 4096, 1)
            except OSError as exc:
                raise ConnectionRefusedError(
                    f"the sandbox's network is gone ({exc.strerror or exc})"
                ) from None
        try:
            answer = json.loads(said or b"{}")
        except ValueError:
            answer = {}
        if not fds:
            raise ConnectionRefusedError(answer.get("error") or "the sandbox's network is gone")
        made = socket.socket(fileno=fds[0])
        for extra in fds[1:]:
            os.close(extra)
        host, port = answer.get("at") or ["", 0]
        return made, (str(host), int(port))

    def listener(self, host: str, port: int) -> socket.socket:
        """A socket listening on ``host``:``port`` in the sandbox's network."""
        return self._ask({"listen": [host, port]})[0]

    def connectable(self, port: int) -> tuple[socket.socket, tuple[str, int]]:
        """An unconnected socket in the sandbox's network, and the address of ``port``
        there to connect it to, for an app that listens on every address (0.0.0.0 or
        ::): the sandbox's own loopback, which nothing can route elsewhere. An app on
        one address only (its loopback, or an address it bound without owning it) is
        not reached: ConnectionRefusedError saying why."""
        return self._ask({"connect": port})

    def close(self) -> None:
        self._control.close()
        try:
            self._proc.wait(timeout=ASK_SECONDS)
        except subprocess.TimeoutExpired:
            self._proc.kill()
            self._proc.wait()


class PortOpeners:
    """Each running sandbox's helper, kept by the process that serves previews (the
    server), and the sockets of their connections (see :meth:`open`)."""

    def __init__(self, root: Path) -> None:
        self.root = root  # the records' folder: <root>/<id>/holder.json
        self._helpers: dict[str, SandboxNetwork] = {}
        self._lock = threading.Lock()

    def open(self, sandbox_id: str, port: int) -> tuple[socket.socket, tuple[str, int]]:
        """A socket for a connection to ``port`` of the sandbox (an app listening on
        every address) and the address to connect it to; ConnectionRefusedError saying
        why where there is none."""
        found = load(self.root / sandbox_id)
        if found is None:
            raise ConnectionRefusedError(
                f"no process of sandbox {sandbox_id} runs, so nothing listens on port {port}"
            )
        with self._lock:
            for other, helper in list(self._helpers.items()):  # the ended ones go
                if other != sandbox_id and not helper.serves(load(self.root / other)):
                    helper.close()
                    del self._helpers[other]
            kept = self._helpers.pop(sandbox_id, None)
            if kept is not None and not kept.serves(found):
                kept.close()
                kept = None
            try:
                helper = kept or SandboxNetwork(found, sandbox_id)
            except (OSError, SandboxFailed) as exc:
                raise ConnectionRefusedError(str(exc)) from None
            self._helpers[sandbox_id] = helper
        return helper.connectable(port)
