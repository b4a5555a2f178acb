"""The egress proxy: what sandboxes with an allowlist reach the network through.

On Docker it runs in a container of its own (see the Docker backend's ``egress``
module), one per allowlist and installation, on a network that reaches out, and listens
on a Unix socket in a volume that those sandboxes mount read-only. On the local backend
it is a bubblewrap'd process of the host, one per sandbox, listening on the sandbox's
own loopback through a socket made there (see that backend's ``egress`` module). The
sandboxes themselves have no network at all. It speaks the HTTP proxy protocol that pip, git, curl and most
clients use when ``HTTPS_PROXY`` / ``HTTP_PROXY`` are set:

* ``CONNECT host:port``: the host and port are checked against the list (see
  :mod:`.egress_rules`), the proxy resolves the name itself and connects only to an
  address the list allows; when the client then opens TLS, the name in its
  ClientHello (SNI) must be the CONNECT host;
* ``GET http://host/...`` (any method, absolute URL): the same check, the request sent
  on with its Host set to that host and ``Connection: close`` (one request per
  connection, so no second Host rides on it);
* anything else: 400.

A refusal is answered at once (403, its reason in the status line, which pip and curl
print) and counted; the counts are written to a small file the host reads.
Standard library only, Python 3.8.
"""

import errno
import json
import os
import select
import socket
import sys
import threading
import time

from .egress_rules import Rules, address_of, host_and_port, normal_name

HEAD_LIMIT = 32 * 1024
HEAD_TIMEOUT = 30.0
FIRST_BYTES_WAIT = 10.0  # seconds for a client's first bytes after CONNECT
CONNECT_TIMEOUT = 10.0
IDLE_TIMEOUT = 600.0  # a relayed connection silent both ways this long is closed
MAX_CONNECTIONS = 512
HELLO_LIMIT = 64 * 1024
LOG_PER_SECOND = 20
# accept() errors that pass (the proxy's limits, a client gone before it was taken).
PASSING = (errno.EMFILE, errno.ENFILE, errno.ENOBUFS, errno.ENOMEM, errno.ECONNABORTED)
HOP_HEADERS = {
    "connection",
    "keep-alive",
    "proxy-connection",
    "proxy-authorization",
    "proxy-authenticate",
    "te",
    "trailer",
    "upgrade",
    "host",
}


class Denied(Exception):
    """A refusal: ``kind`` is its label in the counts, the message its reason."""

    def __init__(self, kind, reason, status=403):
        super().__init__(reason)
        self.kind = kind
        self.status = status


class Counts:
    """Refusals by kind, written to ``path`` (at most once every ``every`` seconds)."""

    every = 0.5

    def __init__(self, path):
        self.path = path
        self.lock = threading.Lock()
        self.denied = {}
        self.started = time.time()
        self.dirty = True
        self.logged = [0.0, 0]  # second, lines in it
        threading.Thread(target=self._writer, daemon=True).start()

    def add(self, kind, line):
        with self.lock:
            self.denied[kind] = self.denied.get(kind, 0) + 1
            self.dirty = True
            now = int(time.monotonic())
            if self.logged[0] != now:
                self.logged = [now, 0]
            self.logged[1] += 1
            show = self.logged[1] <= LOG_PER_SECOND
        if show:
            try:
                sys.stderr.write(line + "\n")
                sys.stderr.flush()
            except OSError:  # a log that may not grow further: the count holds all the same
                pass

    def _writer(self):
        while True:
            time.sleep(self.every)
            with self.lock:
                if not self.dirty:
                    continue
                data = json.dumps({"started": self.started, "denied": self.denied})
                self.dirty = False
            try:
                temporary = self.path + ".new"
                with open(temporary, "w") as handle:
                    handle.write(data)
                os.replace(temporary, self.path)
            except OSError as exc:
                try:
                    sys.stderr.write("cannot write the counts: %s\n" % exc)
                except OSError:
                    pass


def read_head(conn):
    """(request head, bytes after it) from ``conn``; Denied when it is not one."""
    data = b""
    while b"\r\n\r\n" not in data:
        if len(data) > HEAD_LIMIT:
            raise Denied("request", "request head too large", 431)
        chunk = conn.recv(8192)
        if not chunk:
            raise Denied("request", "connection closed before a request", 400)
        data += chunk
    head, _, rest = data.partition(b"\r\n\r\n")
    return head.decode("latin-1"), rest


def parse_head(head):
    lines = head.split("\r\n")
    parts = lines[0].split(" ")
    if len(parts) != 3 or not parts[2].startswith("HTTP/1."):
        raise Denied("request", "not an HTTP/1 request", 400)
    headers = []
    for line in lines[1:]:
        name, sep, value = line.partition(":")
        if not sep or not name.strip() or name != name.strip():
            raise Denied("request", "bad header line", 400)
        headers.append((name, value.strip()))
    return parts[0], parts[1], parts[2], headers


class Proxy:
    def __init__(self, config):
        self.rules = Rules(
            config["allow"],
            config.get("never", ()),
            config.get("never_why", "the sandboxes' own network"),
        )
        self.counts = Counts(config["counts"])
        self.slots = threading.BoundedSemaphore(config.get("max_connections", MAX_CONNECTIONS))

    # -- deciding ----------------------------------------------------------------------
    def connect(self, host, port):
        """A socket to ``host``:``port`` at an address the list allows; Denied else."""
        address = address_of(host)
        if address is not None:
            if not self.rules.networks_for(port):
                raise Denied("address", "%s:%d is not in the allowlist" % (host, port))
            named = []
            candidates = [address]
            kind, unlisted = "address", ""
        else:
            try:
                name = normal_name(host)
            except ValueError:
                raise Denied("request", "%r is not a host name" % host, 400) from None
            named = self.rules.names_for(name, port)
            if named:
                kind, unlisted = "address", ""
            elif any(e.matches(name) for e in self.rules.entries if e.kind != "network"):
                kind, unlisted = "port", "port %d of %s is not in the allowlist" % (port, name)
            else:
                kind, unlisted = "name", "%s is not in the allowlist" % name
            if not self.rules.needs_lookup(name, port):
                raise Denied(kind, unlisted)
            try:
                infos = socket.getaddrinfo(name, port, 0, socket.SOCK_STREAM)
            except socket.gaierror as exc:
                if unlisted:
                    raise Denied(kind, unlisted) from None
                raise Denied("dns", "cannot resolve %s: %s" % (name, exc.strerror), 502) from None
            candidates = [address_of(info[4][0]) for info in infos]
        policy, failures = [], []
        for candidate in candidates:
            why = self.rules.address_allowed(candidate, port, named)
            if why:
                policy.append(why)
                continue
            try:
                return socket.create_connection((str(candidate), port), CONNECT_TIMEOUT)
            except OSError as exc:
                failures.append("%s: %s" % (candidate, exc.strerror or exc))
        if failures:
            raise Denied(
                "unreachable", "cannot connect to %s:%d (%s)" % (host, port, failures[-1]), 502
            )
        why = policy[0] if policy else "no address"
        if unlisted:  # a name (or port) not listed, whose address no listed network holds
            raise Denied(kind, "%s, nor its address (%s)" % (unlisted, why))
        raise Denied(kind, "%s:%d: %s" % (host, port, why))

    # -- serving -----------------------------------------------------------------------
    def handle(self, conn):
        upstream = None
        what = "?"
        try:
            conn.settimeout(HEAD_TIMEOUT)
            head, rest = read_head(conn)
            method, target, version, headers = parse_head(head)
            what = "%s %s" % (method, target[:200])
            if method == "CONNECT":
                host, port = host_and_port(target, 443)
                upstream = self.connect(host, port)
                conn.sendall(b"HTTP/1.1 200 Connection established\r\n\r\n")
                first = rest or self.first_bytes(conn, upstream)
                if first and first[:1] == b"\x16":
                    first = self.check_hello(conn, first, host)
                if first:
                    upstream.sendall(first)
            elif target.lower().startswith("http://"):
                authority, _, path = target[7:].partition("/")
                host, port = host_and_port(authority.rpartition("@")[2], 80)
                upstream = self.connect(host, port)
                kept = [(n, v) for n, v in headers if n.lower() not in HOP_HEADERS]
                lines = [
                    "%s /%s %s" % (method, path, version),
                    "Host: %s" % authority.rpartition("@")[2],
                ]
                lines += ["%s: %s" % (n, v) for n, v in kept] + ["Connection: close", "", ""]
                upstream.sendall("\r\n".join(lines).encode("latin-1") + rest)
            else:
                raise Denied(
                    "request",
                    "this is an egress proxy: use it through HTTPS_PROXY / HTTP_PROXY",
                    400,
                )
            relay(conn, upstream)
        except Denied as exc:
            self.refuse(conn, exc, what)
        except ValueError as exc:
            self.refuse(conn, Denied("request", str(exc), 400), what)
        except OSError:
            pass
        finally:
            for sock in (conn, upstream):
                if sock is not None:
                    try:
                        sock.close()
                    except OSError:
                        pass

    def refuse(self, conn, exc, what):
        reason = " ".join(str(exc).split())[:300]
        if exc.status == 403 or exc.kind == "sni":
            self.counts.add(exc.kind, "denied %s: %s" % (what, reason))
        if exc.kind == "sni":
            return  # the tunnel is open: closing it is the refusal
        phrase = "egress denied: %s (egress_allow)" % reason if exc.status == 403 else reason
        body = phrase + "\n"
        try:
            conn.sendall(
                (
                    "HTTP/1.1 %d %s\r\nContent-Type: text/plain\r\nContent-Length: %d\r\n"
                    "X-Sandbox-Kernel-Egress: %s\r\nConnection: close\r\n\r\n%s"
                    % (exc.status, phrase, len(body), exc.kind, body)
                ).encode("latin-1", "replace")
            )
        except OSError:
            pass

    def first_bytes(self, conn, upstream):
        """The client's first bytes after CONNECT ('' when the server speaks first)."""
        readable, _, _ = select.select([conn, upstream], [], [], FIRST_BYTES_WAIT)
        if conn in readable:
            return conn.recv(65536)
        return b""

    def check_hello(self, conn, data, host):
        """The whole ClientHello (read on as needed); Denied when its SNI is another
        name than ``host`` (an address as host takes any)."""
        while True:
            found = server_name(data)
            if found is not None:
                break
            if len(data) > HELLO_LIMIT:
                raise Denied("sni", "CONNECT %s: a TLS ClientHello too large to read" % host)
            chunk = conn.recv(65536)
            if not chunk:
                return data
            data += chunk
        name = found[0]
        if address_of(host) is not None:
            return data
        try:
            want = normal_name(host)
            got = normal_name(name) if name else ""
        except ValueError:
            got, want = name, host
        if got != want:
            raise Denied("sni", "CONNECT %s: TLS asks for %r, not the CONNECT host" % (host, name))
        return data

    def serve(self, path):
        """Serve on a Unix socket at ``path`` (made here, for any uid of a sandbox)."""
        try:
            os.unlink(path)
        except FileNotFoundError:
            pass
        server = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        server.bind(path + ".new")
        os.chmod(path + ".new", 0o666)  # any uid of a sandbox may connect
        server.listen(256)
        os.replace(path + ".new", path)
        self.serve_on(server)

    def serve_on(self, server):
        """Serve on the listening socket ``server`` (its clients are sandboxes')."""
        sys.stderr.write(
            "egress proxy listening; allowed: %s\n" % ", ".join(e.text for e in self.rules.entries)
        )
        sys.stderr.flush()
        while True:
            try:
                conn, _ = server.accept()
            except OSError as exc:
                if exc.errno not in PASSING:
                    raise
                time.sleep(0.05)  # out of descriptors or memory, for a moment
                continue
            if not self.slots.acquire(blocking=False):
                self.refuse(conn, Denied("busy", "the egress proxy is busy; try again", 503), "?")
                conn.close()
                continue
            try:
                threading.Thread(target=self._run, args=(conn,), daemon=True).start()
            except RuntimeError:  # no thread to be had (the processes limit it shares)
                self.slots.release()
                self.refuse(conn, Denied("busy", "the egress proxy is busy; try again", 503), "?")
                conn.close()

    def _run(self, conn):
        try:
            self.handle(conn)
        finally:
            self.slots.release()


def server_name(data):
    """(SNI or '',) of a complete TLS ClientHello at the start of ``data``; None while
    it is incomplete. Anything that is not a ClientHello gives ('',)."""
    body = b""
    at = 0
    while True:  # gather handshake records until the ClientHello's length is there
        if len(data) < at + 5:
            return None
        if data[at] != 0x16:
            return ("",)
        size = int.from_bytes(data[at + 3 : at + 5], "big")
        if len(data) < at + 5 + size:
            return None
        body += data[at + 5 : at + 5 + size]
        at += 5 + size
        if len(body) >= 4:
            if body[0] != 0x01:
                return ("",)
            if len(body) >= 4 + int.from_bytes(body[1:4], "big"):
                break
    try:
        return (_sni(body[4 : 4 + int.from_bytes(body[1:4], "big")]),)
    except (IndexError, ValueError):
        return ("",)


def _sni(hello):
    at = 2 + 32  # version, random
    at += 1 + hello[at]  # session id
    at += 2 + int.from_bytes(hello[at : at + 2], "big")  # cipher suites
    at += 1 + hello[at]  # compression methods
    if at >= len(hello):
        return ""
    end = at + 2 + int.from_bytes(hello[at : at + 2], "big")
    at += 2
    while at + 4 <= end:
        kind = int.from_bytes(hello[at : at + 2], "big")
        size = int.from_bytes(hello[at + 2 : at + 4], "big")
        if kind == 0:  # server_name: list length, then (type 0, length, name)
            entry = hello[at + 4 : at + 4 + size]
            if len(entry) >= 5 and entry[2] == 0:
                length = int.from_bytes(entry[3:5], "big")
                return entry[5 : 5 + length].decode("ascii")
            raise ValueError("bad server_name")
        at += 4 + size
    return ""


def relay(a, b):
    """Bytes both ways until both sides are done, or silent for IDLE_TIMEOUT."""
    for sock in (a, b):
        sock.setblocking(True)
        sock.settimeout(None)
    open_ends = {a: b, b: a}
    while open_ends:
        readable, _, _ = select.select(list(open_ends), [], [], IDLE_TIMEOUT)
        if not readable:
            return
        for sock in readable:
            try:
                chunk = sock.recv(65536)
            except OSError:
                chunk = b""
            other = open_ends[sock]
            if chunk:
                try:
                    other.sendall(chunk)
                    continue
                except OSError:
                    return
            del open_ends[sock]
            try:
                other.shutdown(socket.SHUT_WR)
            except OSError:
                pass


def end_with(fd):
    """End this process once the pipe ``fd`` reads end of file: its other end is held by
    what the proxy serves (a local sandbox's holder), which has ended."""
    try:
        while os.read(fd, 4096):
            pass
    finally:
        os._exit(0)


def main():
    """``egress_proxy CONFIG``: CONFIG is JSON with ``allow`` (the list), ``never`` and
    ``never_why`` (networks never reached), ``counts`` (where refusals are counted), and
    ``socket`` (a Unix socket to make) or ``listen_fd`` (a listening socket it was
    given); with ``exit_fd`` it ends when that pipe closes."""
    config = json.loads(sys.argv[1])
    if config.get("exit_fd") is not None:
        threading.Thread(target=end_with, args=(int(config["exit_fd"]),), daemon=True).start()
    proxy = Proxy(config)
    if config.get("listen_fd") is not None:
        proxy.serve_on(socket.socket(fileno=int(config["listen_fd"])))
    else:
        proxy.serve(config["socket"])
