"""The main process of a sandbox with an egress allowlist: ``egress_forward PORT SOCKET``.

Such a sandbox has no network but its own loopback; its processes find the egress
proxy at ``http://127.0.0.1:PORT`` (``HTTPS_PROXY`` and ``HTTP_PROXY`` say so), and
this program carries each connection made there to the proxy's Unix socket
``SOCKET`` (a read-only mount of the proxy's volume), byte for byte. It decides
nothing: the proxy, outside the sandbox, does. When the proxy is not there a
connection is closed at once. Between connections it only waits, as the main process
of every sandbox does. Standard library only, Python 3.8.
"""

import select
import socket
import sys
import threading

IDLE_TIMEOUT = 3600.0


def carry(client, path):
    upstream = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    try:
        upstream.connect(path)
    except OSError:
        client.close()
        upstream.close()
        return
    ends = {client: upstream, upstream: client}
    try:
        while ends:
            readable, _, _ = select.select(list(ends), [], [], IDLE_TIMEOUT)
            if not readable:
                break
            for sock in readable:
                try:
                    chunk = sock.recv(65536)
                except OSError:
                    chunk = b""
                other = ends[sock]
                if chunk:
                    try:
                        other.sendall(chunk)
                        continue
                    except OSError:
                        ends.clear()
                        break
                ends.pop(sock, None)
                try:
                    other.shutdown(socket.SHUT_WR)
                except OSError:
                    pass
    finally:
        client.close()
        upstream.close()


def main():
    port, path = int(sys.argv[1]), sys.argv[2]
    server = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    server.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    server.bind(("127.0.0.1", port))
    server.listen(128)
    while True:
        try:
            client, _ = server.accept()
        except OSError:
            continue
        try:
            threading.Thread(target=carry, args=(client, path), daemon=True).start()
        except RuntimeError:  # no thread to be had (the sandbox's process limit)
            client.close()
