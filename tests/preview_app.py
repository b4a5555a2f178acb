"""A small web app for preview tests, run INSIDE a sandbox: standard library only.

``python3 preview_app.py PORT`` serves, on 0.0.0.0:PORT:

* ``GET /headers``: the request's path and headers as JSON, setting two cookies (one
  named like Jupyter's XSRF cookie, which the proxy must not let through);
* ``POST /echo``: the body back (Content-Length or chunked);
* ``GET /redirect?to=URL``: a 302 to URL;
* ``GET /stream?n=N``: N bytes, chunked, in pieces;
* ``GET /ws``: a WebSocket that answers each text message with "echo:" + it, and
  each binary message with its bytes reversed;
* ``GET /``: a page whose script opens that WebSocket (a relative URL, as an app behind
  a prefix must), sends "hello from the page" and shows the answer in ``#answer``.
"""

import base64
import hashlib
import json
import struct
import sys
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from urllib.parse import parse_qs, urlsplit

GUID = "258EAFA5-E914-47DA-95CA-C5AB0DC85B11"
PAGE = b"""<!doctype html>
<title>preview app</title>
<p id="answer">waiting</p>
<script>
const url = new URL("ws", location.href);
url.protocol = url.protocol === "https:" ? "wss:" : "ws:";
const ws = new WebSocket(url);
const show = text => { document.getElementById("answer").textContent = text; };
ws.onopen = () => ws.send("hello from the page");
ws.onmessage = event => show(event.data);
ws.onerror = () => show("the WebSocket failed");
</script>
"""


class App(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"

    def log_message(self, *args):
        pass

    def _send(self, code, body, kind="application/json", extra=()):
        self.send_response(code)
        self.send_header("Content-Type", kind)
        self.send_header("Content-Length", str(len(body)))
        for name, value in extra:
            self.send_header(name, value)
        self.end_headers()
        self.wfile.write(body)

    def do_GET(self):
        url = urlsplit(self.path)
        query = parse_qs(url.query)
        if url.path.endswith("/headers"):
            seen = {"path": self.path, "headers": {k.lower(): v for k, v in self.headers.items()}}
            self._send(
                200,
                json.dumps(seen).encode(),
                extra=[("Set-Cookie", "_xsrf=planted; Path=/"), ("Set-Cookie", "app=1; Path=/")],
            )
        elif url.path.endswith("/redirect"):
            self._send(302, b"", extra=[("Location", query["to"][0])])
        elif url.path.endswith("/stream"):
            left = int(query["n"][0])
            self.send_response(200)
            self.send_header("Content-Type", "application/octet-stream")
            self.send_header("Transfer-Encoding", "chunked")
            self.end_headers()
            while left:
                piece = min(left, 65536)
                self.wfile.write(b"%x\r\n" % piece + b"x" * piece + b"\r\n")
                left -= piece
            self.wfile.write(b"0\r\n\r\n")
        elif url.path.endswith("/ws"):
            self._websocket()
        elif url.path == "/":
            self._send(200, PAGE, kind="text/html; charset=utf-8")
        else:
            self._send(404, b'{"app": "not found"}')

    def do_POST(self):
        if self.headers.get("Transfer-Encoding", "").lower() == "chunked":
            body = b""
            while True:
                size = int(self.rfile.readline().strip() or b"0", 16)
                if not size:
                    self.rfile.readline()
                    break
                body += self.rfile.read(size)
                self.rfile.readline()
        else:
            body = self.rfile.read(int(self.headers.get("Content-Length") or 0))
        self._send(200, body, kind="application/octet-stream")

    def _websocket(self):
        key = self.headers["Sec-WebSocket-Key"]
        accept = base64.b64encode(hashlib.sha1((key + GUID).encode()).digest()).decode()
        self.send_response(101)
        self.send_header("Upgrade", "websocket")
        self.send_header("Connection", "Upgrade")
        self.send_header("Sec-WebSocket-Accept", accept)
        self.end_headers()
        self.wfile.flush()
        while True:
            head = self.rfile.read(2)
            if len(head) < 2:
                return
            opcode, length = head[0] & 0x0F, head[1] & 0x7F
            if length == 126:
                length = struct.unpack(">H", self.rfile.read(2))[0]
            elif length == 127:
                length = struct.unpack(">Q", self.rfile.read(8))[0]
            mask = self.rfile.read(4) if head[1] & 0x80 else b"\0\0\0\0"
            data = bytes(b ^ mask[i % 4] for i, b in enumerate(self.rfile.read(length)))
            if opcode == 8:
                self._frame(8, b"")
                return
            if opcode == 1:
                self._frame(1, b"echo:" + data)
            elif opcode == 2:
                self._frame(2, data[::-1])

    def _frame(self, opcode, data):
        size = len(data)
        if size < 126:
            head = bytes([0x80 | opcode, size])
        elif size < 65536:
            head = bytes([0x80 | opcode, 126]) + struct.pack(">H", size)
        else:
            head = bytes([0x80 | opcode, 127]) + struct.pack(">Q", size)
        self.wfile.write(head + data)
        self.wfile.flush()


if __name__ == "__main__":
    ThreadingHTTPServer(("0.0.0.0", int(sys.argv[1])), App).serve_forever()
