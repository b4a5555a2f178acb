"""The agent's half of the kernel protocol: newline-delimited JSON (runs INSIDE the
sandbox, stdlib only, Python 3.8+).

kernel -> agent::

    {"op": "execute", "code", "silent", "store_history", "user_expressions", "allow_stdin", "cwd"?}
    {"op": "complete", "code", "cursor_pos"}   {"op": "inspect", "code", "cursor_pos", "detail_level"}
    {"op": "is_complete", "code"}              {"op": "history", ...history_request content}
    {"op": "interrupt"}     handled at once: SIGINT to the main thread (KeyboardInterrupt)
    {"op": "input_reply", "value"}             {"op": "shutdown"}

agent -> kernel::

    {"ev": "ready", "python_version", "ipython", "pid", "channel", "spare"}   once, first
    {"ev": "stream", "name", "text"}
    {"ev": "display", "data", "metadata", "transient", "update"}
    {"ev": "clear", "wait"}
    {"ev": "result", "execution_count", "data", "metadata"}
    {"ev": "error", "ename", "evalue", "traceback"}
    {"ev": "input_request", "prompt", "password"}
    {"ev": "reply", "content"}       exactly one per request, the Jupyter reply content
    >TYPE {content}                  output (stream, display_data, update_display_data,
                                     execute_result) as Jupyter content, packed once here;
                                     the kernel checks it and forwards the bytes (the
                                     plain events above when content cannot be packed so)

The kernel trusts none of it (a cell can write to this channel directly): it bounds
lines and rebuilds events from the fields Jupyter defines.
"""

import json
import os
import threading


class Wire:
    """The protocol: private copies of fds 0 and 1, one JSON object per line."""

    def __init__(self):
        self.lock = threading.Lock()
        self._speak_over(os.dup(0), os.dup(1))

    def _speak_over(self, rfd, wfd):
        self.rfd, self.wfd = rfd, wfd
        self.reader = os.fdopen(rfd, "rb", buffering=1 << 16)

    def send(self, **msg):
        # Each message starts with a newline too: whatever a cell left half-written on
        # this fd ends there (the kernel drops the broken line), instead of swallowing
        # the next message, a reply above all.
        self.write(("\n" + json.dumps(msg, default=repr) + "\n").encode("utf-8", "surrogatepass"))

    def send_packed(self, msg_type, content):
        """Output content packed here, once, as JSON any Jupyter client reads
        (``>TYPE {json}``): the kernel checks it and forwards these bytes instead of
        decoding and packing them again. False when it cannot be packed that way (NaN):
        the caller sends the plain event, as before. ASCII with escapes, not raw UTF-8:
        CPython encodes a large string five times faster so (a 1 MB image: 3 ms, not 13)."""
        try:
            packed = json.dumps(content, allow_nan=False, default=repr)
        except ValueError:
            return False
        # In three writes, not joined first: a large output is copied once less.
        self.write(b"\n>" + msg_type.encode() + b" ", packed.encode("ascii"), b"\n")
        return True

    def write(self, *parts):
        """Write ``parts`` whole, one after the other, with no other message between."""
        with self.lock:
            for part in parts:
                view = memoryview(part)
                while view:
                    view = view[os.write(self.wfd, view) :]

    def move_to(self, sock):
        """Speak over the kernel's socket from now on (see connect_kernel). The exec's
        stdout stays open, carrying nothing more: the kernel learns of our end by it."""
        with self.lock:
            self.exec_out, old = self.wfd, self.reader
            self._speak_over(os.dup(sock.fileno()), os.dup(sock.fileno()))
            old.close()
        sock.close()

    def recv(self):
        line = self.reader.readline()
        if not line:
            return None
        return json.loads(line.decode("utf-8", "surrogatepass"))


def send_display(wire, data, metadata, transient, update):
    """display_data (or update_display_data), packed once when it can be."""
    content = {"data": data, "metadata": metadata, "transient": transient}
    msg_type = "update_display_data" if update else "display_data"
    if not wire.send_packed(msg_type, content):
        wire.send(ev="display", update=bool(update), **content)


def send_result(wire, execution_count, data, metadata):
    """execute_result, packed once when it can be."""
    content = {"data": data, "metadata": metadata, "execution_count": execution_count}
    if not wire.send_packed("execute_result", content):
        wire.send(ev="result", **content)
