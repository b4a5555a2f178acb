"""sandbox-kernel agent: runs INSIDE the sandbox, one interpreter per kernel.

Standard library only (IPython is used when the image has it), Python >= 3.8, so it
works in any image with ``python3``. It is not installed: the kernel starts
``python3 -u -c BOOT N`` and sends these N bytes of source on stdin, then the
protocol follows on the same stdin.

Protocol: newline-delimited JSON, one object per line.

kernel -> agent (stdin)::

    {"op": "execute", "code", "silent", "store_history", "user_expressions", "allow_stdin", "cwd"?}
    {"op": "complete", "code", "cursor_pos"}   {"op": "inspect", "code", "cursor_pos", "detail_level"}
    {"op": "is_complete", "code"}              {"op": "history", ...history_request content}
    {"op": "interrupt"}     handled at once: SIGINT to the main thread (KeyboardInterrupt)
    {"op": "input_reply", "value"}             {"op": "shutdown"}

agent -> kernel (stdout)::

    {"ev": "ready", "python_version", "ipython", "pid"}        once, first
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

The real fds 0/1 are kept private for the protocol; fds 1/2 seen by user code are
pipes whose output (subprocesses, C extensions) is forwarded as ``stream``.
"""

import ast
import codeop
import errno
import json
import os
import select
import signal
import sys
import threading
import time
import traceback

OUTPUT_LIMIT = int(os.environ.get("SANDBOX_AGENT_OUTPUT_LIMIT") or 10_000_000)
CELL_TIMEOUT = float(os.environ.get("SANDBOX_AGENT_CELL_TIMEOUT") or 0)
FLUSH_DELAY = 0.02
# Seconds the flusher holds back the end of a line not finished yet (``print('a', n)``
# writes four times): a loaded machine must not split one printed line into two outputs
# (a notebook run by nbclient stores each as its own). ipykernel's whole interval.
PARTIAL_HOLD = 0.2
FLUSH_SIZE = 64 * 1024


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


class Output:
    """Per-cell stream buffering and the output limit, shared by both streams."""

    def __init__(self, wire):
        self.wire = wire
        self.lock = threading.Lock()
        self.parts = []  # [(name, text)]
        self.size = 0
        self.sent = 0
        self.truncated = False
        self.wake = threading.Event()
        self.captured = {}  # pipe read end -> CapturedFd, for fds 1 and 2
        self.poller = select.poll()

    def start(self):
        """Start the flusher thread: only once the process is restricted (main), since
        Landlock binds the thread that asks and the threads it starts after, not threads
        already running."""
        threading.Thread(target=self._flusher, daemon=True).start()

    def drain(self):
        """Take in what subprocesses wrote to fds 1/2 that the pumps have not read yet.

        Called before every Python-level write, so it costs one poll(2) when there is
        nothing (no exception, no lock).
        """
        if not self.captured:
            return
        for fd, _ in self.poller.poll(0):
            self.captured[fd].drain()

    def new_cell(self):
        with self.lock:
            self.sent = 0
            self.truncated = False

    def write(self, name, text):
        if not text:
            return
        with self.lock:
            if self.truncated:
                return
            if self.sent + self.size + len(text) > OUTPUT_LIMIT:
                room = max(0, OUTPUT_LIMIT - self.sent - self.size)
                if room:
                    self.parts.append((name, text[:room]))
                    self.size += room
                self.parts.append(("stderr", truncation_notice()))
                self.truncated = True
            else:
                self.parts.append((name, text))
                self.size += len(text)
            big = self.size >= FLUSH_SIZE
        if big:
            self.flush()
        else:
            self.wake.set()

    def allow(self, data):
        """Whether a display or result of this mime bundle fits in the cell's output limit.

        Rich output counts against the same budget as printed text, so no message kind
        can carry more than the limit to the browser; past it, one notice says so.
        """
        size = bundle_size(data)
        with self.lock:
            if self.truncated:
                return False
            if self.sent + self.size + size <= OUTPUT_LIMIT:
                self.sent += size
                return True
            self.parts.append(("stderr", truncation_notice()))
            self.truncated = True
        self.flush()
        return False

    def flush(self, whole_lines=False):
        """Send what the streams hold; with ``whole_lines``, keep an unfinished last line
        back. Returns (whether something was sent, whether something was kept)."""
        with self.lock:
            parts, self.parts = self.parts, []
            if whole_lines:
                parts, self.parts = unfinished_line(parts)
            kept = sum(len(text) for _, text in self.parts)
            self.sent += self.size - kept
            self.size = kept
            result = (bool(parts), kept > 0)
            # Consecutive writes to one stream become one message.
            merged = []
            for name, text in parts:
                if merged and merged[-1][0] == name:
                    merged[-1][1].append(text)
                else:
                    merged.append((name, [text]))
            for name, texts in merged:
                text = "".join(texts)
                if not self.wire.send_packed("stream", {"name": name, "text": text}):
                    self.wire.send(ev="stream", name=name, text=text)
        return result

    def _flusher(self):
        held_since = None  # when the flusher first kept an unfinished line back
        while True:
            self.wake.wait()
            time.sleep(FLUSH_DELAY)
            self.wake.clear()
            try:
                held_too_long = held_since is not None and (
                    time.monotonic() - held_since >= PARTIAL_HOLD
                )
                sent, kept = self.flush(whole_lines=not held_too_long)
                if kept:  # a line begun after what went out is held from now
                    held_since = time.monotonic() if sent or held_since is None else held_since
                    self.wake.set()  # look again: it goes out at the latest after the hold
                else:
                    held_since = None
            except Exception:
                pass


def unfinished_line(parts):
    """(what to send, what to keep): the last stream's text after its last newline stays."""
    if not parts or parts[-1][1].endswith("\n"):
        return parts, []
    name = parts[-1][0]
    i = len(parts)
    while i > 0 and parts[i - 1][0] == name and "\n" not in parts[i - 1][1]:
        i -= 1
    if i == 0 or parts[i - 1][0] != name:
        return parts[:i], parts[i:]
    head, newline, tail = parts[i - 1][1].rpartition("\n")
    return parts[: i - 1] + [(name, head + newline)], [(name, tail)] + parts[i:]


def truncation_notice():
    return (
        "\n[output truncated: this cell sent more than %.0f MB of output; the rest was discarded]\n"
        % (OUTPUT_LIMIT / 1e6)
    )


def tidy_bundle(data):
    """Binary images as one base64 line, as current IPython sends them (older IPython in
    an image wraps them every 76 characters; stored notebooks would differ)."""
    if isinstance(data, dict):
        for mime, value in data.items():
            if (
                mime.startswith("image/")
                and mime != "image/svg+xml"
                and isinstance(value, str)
                and "\n" in value
            ):
                data[mime] = value.replace("\n", "")
    return data


def bundle_size(data):
    """Bytes a mime bundle adds to a cell's output (text as characters, JSON as encoded)."""
    total = 0
    for value in (data or {}).values() if isinstance(data, dict) else ():
        if isinstance(value, (str, bytes)):
            total += len(value)
        else:
            total += len(json.dumps(value, default=repr))
    return total


class Stream:
    """sys.stdout / sys.stderr for user code."""

    encoding = "utf-8"
    errors = "replace"

    def __init__(self, output, name):
        self.output = output
        self.name = name

    def write(self, text):
        if not isinstance(text, str):
            raise TypeError("write() argument must be str, not %s" % type(text).__name__)
        # What a subprocess wrote to fd 1/2 before this write comes out before it.
        self.output.drain()
        self.output.write(self.name, text)
        return len(text)

    def writelines(self, lines):
        for line in lines:
            self.write(line)

    def flush(self):
        # Code that flushes wants what it wrote out now (ipywidgets' Output does before it
        # starts capturing): give it to the kernel.
        self.output.flush()

    def isatty(self):
        return False

    def fileno(self):
        return 1 if self.name == "stdout" else 2

    def readable(self):
        return False

    def writable(self):
        return True


class CapturedFd:
    """fd 1 or 2 of this process (and of the subprocesses user code starts) as a pipe
    whose output becomes a stream. A thread forwards it as it comes; at the end of a
    cell :meth:`drain` takes what is still in the pipe, so a subprocess's last line
    is never reported after the cell's reply."""

    def __init__(self, fd, name, output):
        import codecs

        self.name = name
        self.output = output
        self.lock = threading.Lock()
        self.decoder = codecs.getincrementaldecoder("utf-8")("replace")
        self.r, w = os.pipe()
        os.set_blocking(self.r, False)
        os.dup2(w, fd)
        os.close(w)
        threading.Thread(target=self._pump, daemon=True).start()

    def _read_available(self):
        """Forward whatever the pipe holds now; False once it is closed."""
        with self.lock:
            while True:
                try:
                    data = os.read(self.r, 65536)
                except BlockingIOError:
                    return True
                except OSError:
                    return False
                if not data:
                    return False
                self.output.write(self.name, self.decoder.decode(data))

    def _pump(self):
        while True:
            try:
                select.select([self.r], [], [])
            except (OSError, ValueError):
                return
            if not self._read_available():
                return

    def drain(self):
        self._read_available()


def capture_fd(fd, name, output):
    """Point fd at a pipe and forward what arrives (subprocesses, C code) as a stream."""
    captured = CapturedFd(fd, name, output)
    output.captured[captured.r] = captured
    output.poller.register(captured.r, select.POLLIN)


class Agent:
    def __init__(self, wire):
        self.wire = wire
        self.output = Output(wire)
        self.requests = []
        self.cond = threading.Condition()
        self.inputs = []
        self.running = False
        self.main_ident = threading.get_ident()
        self.execution_count = 0
        self.history = []  # (session, line, input)
        self.allow_stdin = False
        self.shell = None
        self.comms = None  # the comm manager, when the image has the comm package
        self.parent = {}  # the Jupyter request being handled (its msg_id), for ipywidgets' Output
        self.namespace = {"__name__": "__main__", "__builtins__": __builtins__}
        if not os.environ.get("SANDBOX_AGENT_NO_IPYTHON"):
            try:
                self.shell = make_shell(self)
            except ImportError:
                self.shell = None

    # -- the reader thread: requests queue up, interrupts and input replies act at once --
    def read_loop(self):
        while True:
            try:
                msg = self.wire.recv()
            except (OSError, ValueError):
                msg = None
            if msg is None:
                self.leave()  # the kernel is gone: never outlive it
            op = msg.get("op")
            if op == "interrupt":
                if self.running:
                    signal.pthread_kill(self.main_ident, signal.SIGINT)
            elif op == "input_reply":
                with self.cond:
                    self.inputs.append(msg.get("value", ""))
                    self.cond.notify_all()
            else:
                with self.cond:
                    self.requests.append(msg)
                    self.cond.notify_all()

    def leave(self):
        """End this interpreter and what its cells left running (background processes,
        daemons: they are all below us or our watcher, both subreapers)."""
        kill_tree(os.getpid(), include_root=False)
        os._exit(0)

    def serve(self):
        threading.Thread(target=self.read_loop, daemon=True).start()
        while True:
            with self.cond:
                while not self.requests:
                    self.cond.wait()
                msg = self.requests.pop(0)
            op = msg.get("op")
            if op == "shutdown":
                self.output.flush()
                self.wire.send(ev="reply", content={"status": "ok", "restart": False})
                self.leave()
            request_id = msg.get("id")
            self.wire.send(ev="begin", id=request_id)  # what follows belongs to this request
            handler = getattr(self, "do_" + str(op), None)
            try:
                content = (
                    handler(msg)
                    if handler
                    else {
                        "status": "error",
                        "ename": "ValueError",
                        "evalue": "unknown op %r" % op,
                        "traceback": [],
                    }
                )
            except KeyboardInterrupt:
                content = {
                    "status": "error",
                    "ename": "KeyboardInterrupt",
                    "evalue": "",
                    "traceback": [],
                }
            except Exception as exc:  # an agent bug must not kill the interpreter
                content = {
                    "status": "error",
                    "ename": type(exc).__name__,
                    "evalue": str(exc),
                    "traceback": traceback.format_exc().splitlines(),
                }
            self.output.flush()
            self.wire.send(ev="reply", id=request_id, content=content)

    # -- comms (ipywidgets and friends) -------------------------------------------
    def do_comm(self, msg):
        """A comm_open / comm_msg / comm_close from the frontend, for the comm manager."""
        if self.comms is None:
            return {"status": "ok"}
        import base64

        jmsg = {
            "header": {"msg_type": msg.get("msg_type")},
            "content": msg.get("content") or {},
            "metadata": msg.get("metadata") or {},
            "buffers": [base64.b64decode(b) for b in msg.get("buffers") or []],
        }
        handler = getattr(self.comms, str(msg.get("msg_type")), None)
        if msg.get("msg_type") in ("comm_open", "comm_msg", "comm_close") and handler is not None:
            handler(None, None, jmsg)
        return {"status": "ok"}

    def do_comm_info(self, msg):
        target = msg.get("target_name")
        comms = {}
        if self.comms is not None:
            for comm_id, comm in self.comms.comms.items():
                if target is None or comm.target_name == target:
                    comms[comm_id] = {"target_name": comm.target_name}
        return {"status": "ok", "comms": comms}

    # -- input() ---------------------------------------------------------------
    def read_input(self, prompt="", password=False):
        if not self.allow_stdin:
            raise StdinNotImplementedError(
                "raw_input was called, but this frontend does not support input requests."
            )
        self.output.flush()
        with self.cond:
            self.inputs = []
        self.wire.send(ev="input_request", prompt=str(prompt), password=bool(password))
        with self.cond:
            while not self.inputs:
                self.cond.wait(0.1)  # a timeout keeps KeyboardInterrupt deliverable
            value = self.inputs.pop(0)
        if value == "\x04":
            raise EOFError
        return value

    # -- execute -----------------------------------------------------------------
    def do_execute(self, msg):
        if msg.get("cwd"):
            try:
                os.chdir(msg["cwd"])
            except OSError as exc:
                self.output.write("stderr", "could not change to %s: %s\n" % (msg["cwd"], exc))
        code = msg.get("code", "")
        self.parent = {
            "header": {"msg_id": str(msg.get("msg_id") or ""), "msg_type": "execute_request"}
        }
        silent = bool(msg.get("silent"))
        store = bool(msg.get("store_history", True)) and not silent
        self.allow_stdin = bool(msg.get("allow_stdin"))
        self.output.new_cell()
        timer = None
        if CELL_TIMEOUT > 0:
            timer = threading.Timer(CELL_TIMEOUT, self._timeout)
            timer.daemon = True
            self.timed_out = False
            timer.start()
        self.running = True
        try:
            if self.shell is not None:
                ok, error = self.shell.run(code, store, silent)
                count = self.shell.cell_count
            else:
                if store:
                    self.execution_count += 1
                ok, error = self.run_plain(code, silent)
                count = self.execution_count
        finally:
            self.running = False
            if timer:
                timer.cancel()
            self.output.drain()
        if store:
            self.history.append((1, count, code))
        if not ok:
            if error is None:
                error = {"ename": "Error", "evalue": "", "traceback": []}
            if (
                CELL_TIMEOUT > 0
                and getattr(self, "timed_out", False)
                and error.get("ename") == "KeyboardInterrupt"
            ):
                error["evalue"] = (
                    "cell time limit of %g s reached (SANDBOX_KERNEL_CELL_TIMEOUT)" % CELL_TIMEOUT
                )
            if not silent:
                self.output.flush()
                self.wire.send(ev="error", **error)
            return dict(status="error", execution_count=count, **error)
        user_expressions = {}
        for name, expr in (msg.get("user_expressions") or {}).items():
            user_expressions[name] = self.user_expression(expr)
        payload = []
        if self.shell is not None:  # `obj?` and friends page through payloads, as in ipykernel
            payload = self.shell.payload_manager.read_payload()
            self.shell.payload_manager.clear_payload()
        return {
            "status": "ok",
            "execution_count": count,
            "user_expressions": user_expressions,
            "payload": payload,
        }

    def _timeout(self):
        if self.running:
            self.timed_out = True
            signal.pthread_kill(self.main_ident, signal.SIGINT)

    def user_expression(self, expr):
        try:
            if self.shell is not None:
                return self.shell.user_expressions({"x": expr})["x"]
            value = eval(expr, self.namespace)
            return {"status": "ok", "data": mime_bundle(value), "metadata": {}}
        except Exception as exc:
            return {
                "status": "error",
                "ename": type(exc).__name__,
                "evalue": str(exc),
                "traceback": [],
            }

    def run_plain(self, code, silent):
        """exec everything but a trailing expression, whose value becomes the result."""
        try:
            tree = ast.parse(code, "<cell-%d>" % self.execution_count)
            last = None
            if tree.body and isinstance(tree.body[-1], ast.Expr):
                last = ast.Expression(tree.body.pop().value)
            exec(compile(tree, "<cell-%d>" % self.execution_count, "exec"), self.namespace)
            if last is not None:
                value = eval(
                    compile(last, "<cell-%d>" % self.execution_count, "eval"), self.namespace
                )
                if value is not None and not silent:
                    self.namespace["_"] = value
                    self.output.flush()
                    data = mime_bundle(value)
                    if self.output.allow(data):
                        send_result(self.wire, self.execution_count, data, {})
            return True, None
        except BaseException as exc:  # SystemExit and KeyboardInterrupt included: the cell failed
            if isinstance(exc, SystemExit) and not exc.code:
                return True, None
            tb = traceback.format_exception(type(exc), exc, exc.__traceback__)
            # Drop the agent's own frame from the top of the traceback.
            tb = [line for i, line in enumerate(tb) if not (i == 1 and "sandbox_agent.py" in line)]
            return False, {
                "ename": type(exc).__name__,
                "evalue": str(exc),
                "traceback": [line.rstrip("\n") for line in tb],
            }

    # -- introspection -------------------------------------------------------------
    def do_complete(self, msg):
        code, pos = msg.get("code", ""), msg.get("cursor_pos")
        pos = len(code) if pos is None else pos
        if self.shell is not None:
            return self.shell.complete_content(code, pos)
        import rlcompleter

        start = pos
        while start > 0 and (code[start - 1].isalnum() or code[start - 1] in "_."):
            start -= 1
        token = code[start:pos]
        completer = rlcompleter.Completer(self.namespace)
        matches = []
        for i in range(1000):
            match = completer.complete(token, i)
            if match is None:
                break
            matches.append(match.rstrip("("))
        return {
            "status": "ok",
            "matches": sorted(set(matches)),
            "cursor_start": start,
            "cursor_end": pos,
            "metadata": {},
        }

    def do_inspect(self, msg):
        code, pos = msg.get("code", ""), msg.get("cursor_pos")
        pos = len(code) if pos is None else pos
        if self.shell is not None:
            return self.shell.inspect_content(code, pos, msg.get("detail_level", 0))
        start = end = min(pos, len(code))
        while start > 0 and (code[start - 1].isalnum() or code[start - 1] in "_."):
            start -= 1
        while end < len(code) and (code[end].isalnum() or code[end] == "_"):
            end += 1
        name = code[start:end]
        try:
            obj = eval(name, self.namespace) if name else None
        except Exception:
            obj = None
        if not name or obj is None and name not in self.namespace:
            return {"status": "ok", "found": False, "data": {}, "metadata": {}}
        import pydoc

        text = pydoc.plaintext.document(obj)
        return {"status": "ok", "found": True, "data": {"text/plain": text}, "metadata": {}}

    def do_is_complete(self, msg):
        code = msg.get("code", "")
        if self.shell is not None:
            return self.shell.is_complete_content(code)
        try:
            compiled = codeop.compile_command(code, "<cell>", "exec")
        except (SyntaxError, ValueError, OverflowError):
            return {"status": "invalid"}
        if (
            compiled is None
            or code.rstrip("\n").endswith(":")
            or (code.count("\n") and not code.endswith("\n"))
        ):
            if compiled is None:
                return {
                    "status": "incomplete",
                    "indent": "    " if code.rstrip().endswith(":") else "",
                }
        return {"status": "complete"}

    def do_history(self, msg):
        items = self.history
        kind = msg.get("hist_access_type", "tail")
        if kind == "search":
            import fnmatch

            pattern = msg.get("pattern") or "*"
            items = [h for h in items if fnmatch.fnmatch(h[2], pattern)]
            if msg.get("unique"):
                seen, unique = set(), []
                for h in reversed(items):
                    if h[2] not in seen:
                        seen.add(h[2])
                        unique.append(h)
                items = list(reversed(unique))
        elif kind == "range":
            start, stop = msg.get("start") or 0, msg.get("stop")
            items = [h for h in items if h[1] >= start and (stop is None or h[1] < stop)]
        n = msg.get("n")
        if n and kind in ("tail", "search"):
            items = items[-int(n) :]
        if msg.get("output"):
            history = [[s, line, [src, None]] for s, line, src in items]
        else:
            history = [list(h) for h in items]
        return {"status": "ok", "history": history}


class StdinNotImplementedError(RuntimeError):
    """Same name and meaning as IPython's: the frontend cannot answer input()."""


def mime_bundle(value):
    """text/plain plus whatever _repr_*_ methods the object offers."""
    data = {"text/plain": repr(value)}
    for method, mime in (
        ("_repr_html_", "text/html"),
        ("_repr_markdown_", "text/markdown"),
        ("_repr_svg_", "image/svg+xml"),
        ("_repr_png_", "image/png"),
        ("_repr_jpeg_", "image/jpeg"),
        ("_repr_latex_", "text/latex"),
        ("_repr_json_", "application/json"),
    ):
        fn = getattr(value, method, None)
        if callable(fn):
            try:
                out = fn()
            except Exception:
                continue
            if isinstance(out, tuple):
                out = out[0]
            if out is None:
                continue
            if isinstance(out, bytes):
                import base64

                out = base64.b64encode(out).decode("ascii")
            data[mime] = out
    return data


def plain_display(agent):
    """display(), update_display and clear_output for the stdlib path (no IPython)."""

    def display(*objs, display_id=None, update=False, raw=False, metadata=None, **_):
        agent.output.flush()
        transient = {"display_id": display_id} if display_id else {}
        for obj in objs:
            data = obj if raw else mime_bundle(obj)
            if not agent.output.allow(data):
                return
            send_display(agent.wire, data, metadata or {}, transient, update)

    def clear_output(wait=False):
        agent.output.flush()
        agent.wire.send(ev="clear", wait=bool(wait))

    return display, clear_output


def install_comms(agent):
    """Comms (ipywidgets, anything built on the ``comm`` package) talk to the frontend
    through our wire: the package lets a kernel supply its comm class and manager."""
    try:
        import comm
        from comm.base_comm import BaseComm, CommManager
    except ImportError:
        return None
    import base64

    class WireComm(BaseComm):
        def publish_msg(self, msg_type, data=None, metadata=None, buffers=None, **keys):
            agent.output.flush()
            content = dict(keys, data=data or {}, comm_id=self.comm_id)
            encoded = [base64.b64encode(bytes(b)).decode("ascii") for b in buffers or []]
            agent.wire.send(
                ev="comm",
                msg_type=msg_type,
                content=content,
                metadata=metadata or {},
                buffers=encoded,
            )

    manager = CommManager()
    comm.create_comm = WireComm
    comm.get_comm_manager = lambda: manager
    return manager


class ParentOnly:
    """Stands for ipykernel's kernel object where libraries only ask for the request
    being handled (``get_ipython().kernel.get_parent()``)."""

    def __init__(self, agent):
        self._agent = agent

    def get_parent(self, channel="shell"):
        return self._agent.parent


def import_ipython_core():
    """Import the part of IPython that a shell needs; the package's own ``__init__``
    (its terminal: prompt_toolkit, the embed machinery, a third of IPython's import
    time) waits until something asks the package for a name it has not got.

    Why: after a cold start says it is ready, the client's first cell waits for this
    import, which took longer than the client's own settling (270 ms against 200 ms
    here). Nothing changes for the user but when: ``get_ipython``, which IPython's own
    modules take from the package as they load, is served from where it lives; any
    other name (``IPython.__version__``, ``IPython.embed``, ``from IPython import
    display``, ``dir(IPython)``) first runs the real ``__init__``, once, so every name is
    there as after a plain ``import IPython``. IPython 7, whose ``__init__`` also puts
    its extensions folder on sys.path (``%load_ext autoreload``), is imported whole at
    once. A package imported already is left as it is; a failed import leaves nothing
    behind and raises ImportError, as the plain import would."""
    import importlib.util

    stub = None
    if "IPython" not in sys.modules:
        spec = importlib.util.find_spec("IPython")
        if spec is None or spec.loader is None or spec.submodule_search_locations is None:
            raise ImportError("No module named 'IPython'")
        stub, complete = lazy_ipython(spec)
        sys.modules["IPython"] = stub
    try:
        if stub is not None:
            from IPython.core import release

            if tuple(release.version_info[:1]) < (8,):
                complete()
        import IPython.core.displayhook  # noqa: F401
        import IPython.core.displaypub  # noqa: F401
        import IPython.core.interactiveshell  # noqa: F401
    except BaseException:
        if stub is not None and sys.modules.get("IPython") is stub:
            for name in [n for n in sys.modules if n == "IPython" or n.startswith("IPython.")]:
                del sys.modules[name]
        raise


def lazy_ipython(spec):
    """IPython's package made but not run, and the function that runs its ``__init__``
    (see :func:`import_ipython_core`), once: other threads wait for it, and the thread
    running it sees the package partial, as during any import. If the ``__init__``
    fails, names it would have made raise AttributeError saying why (``hasattr`` and
    pickle's search of sys.modules expect nothing else), and it is not run again."""
    import importlib.util

    package = importlib.util.module_from_spec(spec)
    lock = threading.RLock()
    state = []  # "running", then "done" or the exception the __init__ raised

    def complete():
        with lock:
            if "__version__" in package.__dict__ and not state:
                state.append("done")  # importlib.reload ran it meanwhile
            if not state:
                state.append("running")
                try:
                    spec.loader.exec_module(package)
                    state[0] = "done"
                except Exception as exc:
                    state[0] = exc
            if state[0] == "done":
                for name, hook in (("__getattr__", __getattr__), ("__dir__", __dir__)):
                    if package.__dict__.get(name) is hook:
                        del package.__dict__[name]

    def __getattr__(name):
        if name == "get_ipython":
            from IPython.core.getipython import get_ipython

            return get_ipython
        complete()
        if package.__dict__.get("__getattr__") is not __getattr__:
            return getattr(package, name)  # whole now (its own __getattr__, if it has one)
        failed = state[0] if isinstance(state[0], Exception) else None
        why = " (its __init__ failed: %r)" % failed if failed else " (partially initialized)"
        raise AttributeError("module 'IPython' has no attribute %r%s" % (name, why)) from failed

    def __dir__():
        complete()
        return sorted(package.__dict__)

    package.__getattr__ = __getattr__
    package.__dir__ = __dir__
    return package, complete


def make_shell(agent):
    """An IPython InteractiveShell whose display machinery speaks our protocol."""
    import_ipython_core()
    from IPython.core.displayhook import DisplayHook
    from IPython.core.displaypub import DisplayPublisher
    from IPython.core.interactiveshell import InteractiveShell

    class Publisher(DisplayPublisher):
        def publish(
            self, data, metadata=None, source=None, *, transient=None, update=False, **kwargs
        ):
            agent.output.flush()
            data = tidy_bundle(data)
            if not agent.output.allow(data):
                return
            send_display(agent.wire, data, metadata or {}, transient or {}, update)

        def clear_output(self, wait=False):
            agent.output.flush()
            agent.wire.send(ev="clear", wait=bool(wait))

    class Hook(DisplayHook):
        def start_displayhook(self):
            self.msg = {"data": {}, "metadata": {}}

        def write_output_prompt(self):
            pass

        def write_format_data(self, format_dict, md_dict=None):
            self.msg["data"] = tidy_bundle(format_dict)
            self.msg["metadata"] = md_dict or {}

        def finish_displayhook(self):
            agent.output.flush()
            if not agent.output.allow(self.msg["data"]):
                return
            send_result(agent.wire, self.shell.cell_count, self.msg["data"], self.msg["metadata"])

    from traitlets import Type

    class Shell(InteractiveShell):
        displayhook_class = Type(Hook)
        display_pub_class = Type(Publisher)
        cell_count = 0

        def init_io(self):
            pass

        def enable_gui(self, gui=None):
            pass

        def ask_exit(self):
            pass

        def run(self, code, store, silent):
            """Run a cell; return (ok, error content) like the Jupyter reply needs.

            ``cell_count`` is the number Jupyter shows for the cell: its own when stored,
            else the last stored one's, as ipykernel reports. IPython versions differ
            in when they count (before or after running), so it is fixed here, before.
            """
            self.last_error = None
            self.cell_count = self.execution_count if store else self.execution_count - 1
            result = self.run_cell(code, store_history=store, silent=silent)
            if result.success:
                return True, None
            return False, self.last_error or {
                "ename": "Error",
                "evalue": str(result.error_in_exec or result.error_before_exec),
                "traceback": [],
            }

        def _showtraceback(self, etype, evalue, stb):
            self.last_error = {
                "ename": getattr(etype, "__name__", str(etype)),
                "evalue": str(evalue),
                "traceback": stb,
            }

        def complete_content(self, code, pos):
            from IPython.core.completer import provisionalcompleter

            with provisionalcompleter():
                completions = list(self.Completer.completions(code, pos))
            if completions:
                start = min(c.start for c in completions)
                end = max(c.end for c in completions)
                matches = [code[start : c.start] + c.text + code[c.end : end] for c in completions]
            else:
                start = end = pos
                matches = []
            seen = []
            for m in matches:
                if m not in seen:
                    seen.append(m)
            return {
                "status": "ok",
                "matches": seen,
                "cursor_start": start,
                "cursor_end": end,
                "metadata": {},
            }

        def inspect_content(self, code, pos, detail_level):
            from IPython.utils.tokenutil import token_at_cursor

            name = token_at_cursor(code, pos)
            try:
                bundle = self.object_inspect_mime(name, detail_level=detail_level)
                if not self.enable_html_pager:
                    bundle.pop("text/html", None)
                return {"status": "ok", "found": True, "data": bundle, "metadata": {}}
            except KeyError:
                return {"status": "ok", "found": False, "data": {}, "metadata": {}}

        def is_complete_content(self, code):
            status, indent = self.input_transformer_manager.check_complete(code)
            content = {"status": status}
            if status == "incomplete":
                content["indent"] = " " * (indent or 0)
            return content

    from traitlets.config import Config

    config = Config()
    # The kernel keeps the history it serves; IPython's SQLite history only costs start-up time.
    config.HistoryManager.enabled = False
    shell = Shell.instance(
        config=config, colors="NoColor" if os.environ.get("SANDBOX_AGENT_NO_COLOR") else "Linux"
    )
    # What ipywidgets' Output widget asks ipykernel (the request whose outputs it takes).
    shell.kernel = ParentOnly(agent)
    shell.enable_html_pager = False
    from IPython.core import page, payloadpage

    shell.set_hook("show_in_pager", page.as_hook(payloadpage.page), 99)
    shell.readline_use = False
    shell.autoindent = False
    shell.has_readline = False
    import builtins

    builtins.input = lambda prompt="": agent.read_input(prompt)
    shell.raw_input_original = builtins.input
    return shell


def enable_user_site():
    """Put the user's site-packages on sys.path where Python would, before the system's,
    and run its ``.pth`` files; made first, so that a package the first ``%pip
    install`` of a fresh sandbox puts there is importable without a restart.

    The interpreter starts without it (``-s``): a cell can write there, and code of a
    ``.pth`` file runs at start-up, before this process is made non-dumpable and
    restricted. Here it runs after, as a cell would.
    """
    import site

    if os.getuid() != os.geteuid():
        return  # what Python itself does for a set-uid interpreter
    try:
        path = site.getusersitepackages()
        os.makedirs(path, exist_ok=True)
    except OSError:
        return
    if path in sys.path:
        return
    before = list(sys.path)
    site.addsitedir(path)
    added = [p for p in sys.path if p not in before]
    system = set(site.getsitepackages())
    at = next((i for i, p in enumerate(before) if p in system), len(before))
    sys.path[:] = before[:at] + added + before[at:]
    site.ENABLE_USER_SITE = True


SPARE_TTL = 600.0  # seconds a spare waits for a kernel before it ends (its memory is freed)
SPARE_MAX_AGE = 3600.0  # seconds a spare lives at most, however often kernels come
# Children of a spare at most that have not yet shown the host's secret: a burst of
# kernels (a CI matrix of twenty) has that many at once; connections that prove nothing
# cannot hold more pids than this, each for at most 5 s.
SPARE_UNPROVEN = 32
SUPERVISOR = 0  # for a spare's child: the kernel's start program, which stays as the channel

# -- hardening and process supervision ----------------------------------------------------
PR_SET_PDEATHSIG = 1
PR_SET_DUMPABLE = 4
PR_SET_CHILD_SUBREAPER = 36


def prctl(option, value):
    try:
        import ctypes

        return ctypes.CDLL(None, use_errno=True).prctl(option, value, 0, 0, 0)
    except Exception:  # not Linux, or no libc: nothing to harden with
        return -1


def number_after(path, label):
    """The number after ``label`` on its line of a /proc or cgroup file, or None."""
    try:
        with open(path) as fh:
            for line in fh:
                if line.startswith(label):
                    return int(line.split()[1])
    except (OSError, ValueError, IndexError):
        pass
    return None


def tracer_of(pid="self"):
    """The pid tracing a process (0: none), from /proc."""
    return number_after("/proc/%s/status" % pid, "TracerPid:") or 0


def harden():
    """Other processes of this sandbox (same uid, possibly planted by earlier cells) must
    not read or steer this interpreter: no ptrace, no /proc/<pid>/mem or fd, no core.
    The start program already made the process non-dumpable before reading anything;
    this repeats it and refuses to run when someone attached before that."""
    prctl(PR_SET_DUMPABLE, 0)
    if tracer_of() != 0:
        sys.stderr.write(
            "sandbox agent: another process traces this interpreter; refusing to run\n"
        )
        os._exit(70)


# The host's copy of python3 that starts non-dumpable (agent/__init__.py names it too).
UNREADABLE_PYTHON = ".sandbox-kernel-python3"


def show_python3():
    """Started from the host's unreadable copy of python3: cells see the python3 beside
    it as ``sys.executable`` (a copy they cannot read would fail ``venv --copies`` and
    puzzle whoever prints it); what they start from it is theirs, as before."""
    folder, name = os.path.split(sys.executable)
    if name != UNREADABLE_PYTHON:
        return
    sys.executable = os.path.join(folder, "python3")
    # In a virtual environment Python makes the base one from the name it started as.
    base = getattr(sys, "_base_executable", "")
    if base and os.path.basename(base) == UNREADABLE_PYTHON:
        sys._base_executable = os.path.join(os.path.dirname(base), "python3")


LANDLOCK_CREATE_RULESET = 444
LANDLOCK_ADD_RULE = 445
LANDLOCK_RESTRICT_SELF = 446
# Make a character device, a socket, a FIFO, a block device, a symbolic link.
LANDLOCK_MAKE_SPECIAL = (1 << 6) | (1 << 9) | (1 << 10) | (1 << 11) | (1 << 12)


def restrict_special_files(folders):
    """Landlock: beneath ``folders`` (host folders mounted in the sandbox), this process
    and all it starts may no longer make symlinks, FIFOs, sockets or device files.

    Host tools read those folders (JupyterLab's contents API, ``jupyter execute
    --inplace``, git): a link planted there would turn them against the host user, a
    FIFO would hang them. Landlock grants rights beneath the folders it is given, so
    the rights are granted on everything *but* the paths down to ``folders``. Returns
    whether it took effect (Linux >= 5.13 with Landlock; else nothing changes).
    """
    import ctypes
    import struct

    folders = [os.path.realpath(f) for f in folders if f]
    if not folders:
        return False
    if threading.active_count() != 1:  # one would stay free of the restriction
        sys.stderr.write(
            "sandbox agent: a thread started before the restriction; refusing to run\n"
        )
        os._exit(70)
    libc = ctypes.CDLL(None, use_errno=True)
    libc.syscall.restype = ctypes.c_long
    if libc.syscall(LANDLOCK_CREATE_RULESET, None, 0, 1) < 1:  # the ABI version
        return False
    attr = ctypes.create_string_buffer(struct.pack("Q", LANDLOCK_MAKE_SPECIAL))
    ruleset = libc.syscall(LANDLOCK_CREATE_RULESET, attr, 8, 0)
    if ruleset < 0:
        return False
    on_path = set()
    for folder in folders:
        probe = folder
        while True:
            on_path.add(probe)
            if probe == "/":
                break
            probe = os.path.dirname(probe)
    try:
        for parent in sorted(p for p in on_path if p not in folders):
            try:
                names = os.listdir(parent)
            except OSError:
                continue
            for name in names:
                path = os.path.join(parent, name)
                if path in on_path:
                    continue
                try:
                    fd = os.open(path, os.O_PATH | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC)
                except OSError:
                    continue  # a file, a link: no folder to grant beneath
                try:
                    rule = ctypes.create_string_buffer(
                        struct.pack("=Qi", LANDLOCK_MAKE_SPECIAL, fd)
                    )
                    libc.syscall(LANDLOCK_ADD_RULE, ruleset, 1, rule, 0)
                finally:
                    os.close(fd)
        prctl(38, 1)  # PR_SET_NO_NEW_PRIVS (Docker sets it already)
        return libc.syscall(LANDLOCK_RESTRICT_SELF, ruleset, 0) == 0
    finally:
        os.close(ruleset)


def use_user_path():
    """Put the user's ``~/.local/bin`` first on PATH for what cells start (``pip install
    --user`` puts scripts there), as user_command.py does for the user's commands. The
    sandbox's own PATH leaves it out: the host's programs must not find a ``python3`` a
    cell planted there."""
    mine = os.path.expanduser("~/.local/bin")
    path = os.environ.get("PATH", "")
    if mine not in path.split(os.pathsep):
        os.environ["PATH"] = mine + os.pathsep + path if path else mine


def run_restricted(argv):
    """``--restricted FOLDERS_JSON -- CMD...``: restrict, then become CMD (commands the
    host runs in a sandbox with host folders, e.g. `sandbox-kernel exec`)."""
    folders = json.loads(argv[1])
    command = argv[argv.index("--") + 1 :]
    restrict_special_files(folders)
    try:
        os.execvp(command[0], command)
    except OSError as exc:  # as a shell says it: 127 not found, 126 not runnable
        missing = exc.errno == errno.ENOENT
        what = "command not found in the sandbox" if missing else exc.strerror
        sys.stderr.write("%s: %s\n" % (command[0], what))
        sys.stderr.flush()
        os._exit(127 if missing else 126)


def socket_address(path):
    """ "@name" is an abstract unix socket (no file: nothing to unlink, nothing Landlock
    restricts in a shared /tmp); anything else a path."""
    return "\0" + path[1:] if path.startswith("@") else path


def start_time_of(pid):
    """Field 22 of /proc/<pid>/stat (clock ticks after boot): with the pid, it names one
    process for good, since a reused pid starts later."""
    try:
        with open("/proc/%d/stat" % pid, "rb") as fh:
            data = fh.read()
    except OSError:
        return ""
    return data[data.rfind(b")") + 2 :].split()[19].decode()


def process_table():
    """{pid: (parent pid, state, process group)} of every process this sandbox sees."""
    table = {}
    for name in os.listdir("/proc"):
        if not name.isdigit():
            continue
        try:
            with open("/proc/%s/stat" % name, "rb") as fh:
                data = fh.read()
        except OSError:
            continue
        rest = data[data.rfind(b")") + 2 :].split()
        table[int(name)] = (int(rest[1]), rest[0], int(rest[2]))
    return table


def descendants(root, table=None):
    """Live (not zombie) descendants of ``root`` (in ``table``, else as they are now)."""
    children = {}
    for pid, (ppid, state, _) in (table or process_table()).items():
        if state != b"Z":
            children.setdefault(ppid, []).append(pid)
    found, todo = [], [root]
    while todo:
        for child in children.get(todo.pop(), ()):
            found.append(child)
            todo.append(child)
    return found


def kill_tree(root, include_root, reap=False):
    """SIGKILL every descendant of ``root`` (and ``root`` itself when asked).

    ``root`` is stopped first so it cannot start more; descendants that fork while we
    kill are caught on the next pass (orphans stay under a subreaper: the watcher, or
    a spare's child). A cell that double-forks a daemon does not escape. Nor does one
    that forks and exits over and over, faster than a pass, in a process group of its
    own (a pid hopper): a group that holds nothing but descendants is killed whole,
    which takes a child being forked along. Not the interpreter's own group (ours or
    root's), nor one that also holds another process (another kernel, the spare): a
    hopper there, or one that leaves its group at every fork, can still outrun us.
    """
    spared = {os.getpgrp()}  # ours, and root's when root stays
    try:
        spared.add(os.getpgid(root))
    except OSError:
        pass
    if include_root:
        try:
            os.kill(root, signal.SIGSTOP)
        except OSError:
            include_root = False
    for _ in range(500):
        table = process_table()
        found = descendants(root, table)
        if not found:
            break
        members = {}
        for pid, (_, state, group) in table.items():
            if state != b"Z":
                members.setdefault(group, set()).add(pid)
        ours = set(found) | {root}
        for group in {table[pid][2] for pid in found} - spared:
            if group > 1 and members.get(group, set()) <= ours:
                try:
                    os.killpg(group, signal.SIGKILL)
                except OSError:
                    pass
        for pid in found:
            try:
                os.kill(pid, signal.SIGKILL)
            except OSError:
                pass
        if reap:
            reap_children()
        time.sleep(0.002)
    if include_root:
        try:
            os.kill(root, signal.SIGKILL)
        except OSError:
            pass


def reap_children():
    """Collect exited children without blocking; {pid: wait status}."""
    done = {}
    while True:
        try:
            pid, status = os.waitpid(-1, os.WNOHANG)
        except ChildProcessError:
            return done
        if pid == 0:
            return done
        done[pid] = status


def exit_code(status):
    """The exit code a shell would report for a wait status (137 for SIGKILL)."""
    if os.WIFSIGNALED(status):
        return 128 + os.WTERMSIG(status)
    return os.WEXITSTATUS(status)


def channel_hup_poller(extra=()):
    """A poll object that wakes when the kernel's side of the channel (fd 0) closes."""
    poller = select.poll()
    poller.register(0, getattr(select, "POLLRDHUP", 0))
    for fd in extra:
        poller.register(fd, select.POLLIN)
    return poller


def watch_child():
    """Fork: the child goes on to be the agent; this process stays as its watcher.

    The watcher holds no protocol data (it never reads fd 0, it closes fd 1) and waits
    for either the agent's end or the kernel's: when the channel closes (shutdown,
    restart, the kernel killed) it kills the agent and everything the cells started,
    even an interpreter stuck in C code with the GIL held, which could not act on an
    EOF by itself. It exits with the agent's status (137 after an out-of-memory kill),
    which is what the kernel reads to explain a death.
    """
    prctl(PR_SET_CHILD_SUBREAPER, 1)  # orphans of the cells stay ours to kill
    watcher = os.getpid()
    rfd, wfd = os.pipe()
    os.set_blocking(rfd, False)
    os.set_blocking(wfd, False)
    pid = os.fork()
    if pid == 0:
        os.close(rfd)
        os.close(wfd)
        prctl(PR_SET_PDEATHSIG, signal.SIGKILL)
        if os.getppid() != watcher:
            os._exit(1)  # the watcher died before we could ask to follow it
        return
    os.close(1)  # the agent's end of stdout must be the last: EOF tells the kernel it ended
    os.open(os.devnull, os.O_WRONLY)
    signal.set_wakeup_fd(wfd)
    signal.signal(signal.SIGCHLD, lambda *_: None)
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    poller = channel_hup_poller([rfd])
    status = None
    while status is None:
        hup = any(fd == 0 for fd, _ in poller.poll())
        try:
            while os.read(rfd, 512):
                pass
        except OSError:
            pass
        status = reap_children().get(pid)
        if hup and status is None:
            kill_tree(watcher, include_root=False, reap=True)
            while status is None:
                try:
                    status = os.waitpid(pid, 0)[1]
                except ChildProcessError:
                    status = 0
    kill_tree(watcher, include_root=False, reap=True)  # what the cells left running
    os._exit(exit_code(status))


def oom_kills():
    """The sandbox's count of out-of-memory kills so far (cgroup v2 or v1)."""
    for path in ("/sys/fs/cgroup/memory.events", "/sys/fs/cgroup/memory/memory.oom_control"):
        found = number_after(path, "oom_kill ")
        if found is not None:
            return found
    return 0


def read_stdin_line(limit=256):
    """The line the kernel sends after the source (and a spare's secret, which
    read_stdin_secret reads): its socket's offer (see connect_kernel).
    Byte by byte: what follows on fd 0 is not ours to read."""
    line, length = read_stdin_secret(limit)
    return bytes(line[:length]).strip().decode("ascii", "replace")


def hand_over(path, pid, start):
    """Give this kernel's channel (fds 0, 1 and 2) to the warm spare at ``path``, which
    forks a warmed interpreter for it and says the child's pid.

    Only to the spare the host started and recorded: the listener's pid (from the
    kernel, SO_PEERCRED) and its start time must be the ones the host read from its
    own /proc. A process that cells left listening at the same path gets nothing, not
    even a byte: the connection closes and we start cold. The child touches our fds
    only once we checked it and said go, so a failed check never leaves two
    interpreters on one channel. Returns "served" (not reached: we stay as the
    channel's process), "busy" (the spare closed on us at once: it stays recorded) or
    "gone" (no spare there, another process, or no answer in time: the kernel forgets
    it and a new one replaces it).
    """
    import array
    import socket
    import struct

    # In place, and wiped on every way out: a cold start forks its interpreter, where
    # cells run, from this process's memory.
    secret, length = read_stdin_secret()
    message = None
    deadline = time.monotonic() + 5
    conn = socket.socket(socket.AF_UNIX)
    conn.settimeout(5)
    outcome = "gone"
    try:
        conn.connect(socket_address(path))
        peer = struct.unpack(
            "3i", conn.getsockopt(socket.SOL_SOCKET, socket.SO_PEERCRED, struct.calcsize("3i"))
        )[0]
        if peer != pid or start_time_of(peer) != start or not length:
            conn.close()
            return outcome
        settings = json.dumps(
            {
                "env": {k: v for k, v in os.environ.items() if k.startswith("SANDBOX_AGENT_")},
                "cwd": os.getcwd(),
            }
        ).encode()
        before = oom_kills()
        # The secret on a line of its own, then the settings on one: the secret proves to
        # the spare that the host sent us (a cell cannot know it), and the spare's child
        # wipes it from its memory before any cell runs there (see take_channel).
        message = bytearray(length + len(settings) + 2)
        message[:length] = memoryview(secret)[:length]
        message[length] = 10
        message[length + 1 : -1] = settings
        message[-1] = 10
        conn.settimeout(left(deadline))
        sent = conn.sendmsg(
            [message], [(socket.SOL_SOCKET, socket.SCM_RIGHTS, array.array("i", [0, 1, 2]))]
        )
        if sent < len(message):
            conn.sendall(memoryview(message)[sent:])
        reply = b""
        while not reply.endswith(b"\n") and len(reply) < 32:
            conn.settimeout(left(deadline))
            chunk = conn.recv(32 - len(reply))
            if not chunk:
                break
            reply += chunk
        child = int(reply[1:-1]) if reply[:1] == b"K" and reply[1:-1].isdigit() else 0
        if not reply:
            outcome = "busy"  # it answered by closing: full, or about to end by itself
        if child <= 1 or parent_of(child) != pid:
            conn.close()
            return outcome
        conn.sendall(b"g")
    except OSError:
        conn.close()
        return outcome  # (a timeout: a spare that does not answer, frozen, is forgotten)
    finally:
        wipe(secret, length)
        if message is not None:
            wipe(message, length)
    supervise_spare(child, conn, before)
    return "served"  # not reached: supervise_spare ends the process


def parent_of(pid):
    """The parent pid of ``pid`` (0 when it is gone)."""
    try:
        with open("/proc/%d/stat" % pid, "rb") as fh:
            return int(fh.read().rsplit(b")", 1)[1].split()[1])
    except (OSError, ValueError, IndexError):
        return 0


def supervise_spare(pid, conn, oom_before):
    """Stay as the channel's process while the spare's child ``pid`` serves it: end when
    it ends, and kill it (and what its cells started) when the kernel closes the channel."""
    os.close(1)
    os.open(os.devnull, os.O_WRONLY)
    conn.settimeout(None)
    poller = channel_hup_poller([conn.fileno()])
    while True:
        events = dict(poller.poll())
        if 0 in events:
            # The child, a watcher, sees the same end of the channel and ends its
            # interpreter and what the cells left by itself, staying their subreaper
            # until none is left (killed from here, a process of a pid hopper between
            # two scans would be orphaned to init). One that does not end in time (a
            # cell stopped it) is killed here.
            try:
                os.kill(pid, signal.SIGCONT)
            except OSError:
                pass
            conn.settimeout(5)
            try:
                while conn.recv(1):
                    pass
            except OSError:
                kill_tree(pid, include_root=True)
            os._exit(0)
        if conn.fileno() in events:
            try:
                if conn.recv(1):
                    continue
            except OSError:
                pass
            os._exit(137 if oom_kills() > oom_before else 0)


def displace(path):
    """End the process listening at ``path``: an older spare the host no longer records
    (its kernel died before recording it), or a listener a cell planted there."""
    import socket
    import struct

    probe = socket.socket(socket.AF_UNIX)
    try:
        probe.settimeout(2)
        probe.connect(socket_address(path))
        pid = struct.unpack(
            "3i", probe.getsockopt(socket.SOL_SOCKET, socket.SO_PEERCRED, struct.calcsize("3i"))
        )[0]
        if pid > 1 and pid != os.getpid():
            os.kill(pid, signal.SIGKILL)
    except OSError:
        pass  # a stale socket file of a spare that ended
    finally:
        probe.close()


def wait_as_spare(path):
    """Listen at ``path`` with IPython imported; fork a warm interpreter for each kernel
    that hands over its channel, and return in that child (the spare itself never
    returns). Many kernels starting at once in one sandbox (a CI matrix) each take a
    child, so none pays for importing IPython.

    A spare is started by the host (never by a cell), reads a secret from the host on
    its stdin, and announces "listening" on its own stdout once bound (the host then
    records its pid, start time and the secret). It ends when no kernel it served came
    within SPARE_TTL, at SPARE_MAX_AGE in any case (that bounds how long its secret is
    worth stealing, and how old the modules it hands out get), and at once when the
    Python installation changed under it (a pip install): the next kernel starts cold
    and the host starts a new spare.
    """
    import socket

    os.environ.pop("SANDBOX_AGENT_SPARE_LISTEN", None)
    secret, length = read_stdin_secret()
    listener = socket.socket(socket.AF_UNIX)
    address = socket_address(path)
    try:
        listener.bind(address)
    except OSError:
        displace(path)  # the host records only us: whatever listens there is stale
        try:
            if not path.startswith("@"):
                os.unlink(path)
            time.sleep(0.05)  # the displaced process's socket closes with it
            listener.bind(address)
        except OSError:
            os._exit(0)
    listener.listen(64)
    os.write(1, b"listening\n")
    devnull = os.open(os.devnull, os.O_RDWR)
    for fd in (0, 1, 2):  # the host's attach ends now; nothing of ours depends on it
        os.dup2(devnull, fd)
    os.close(devnull)
    # Warm only when what we import is what a cold start would: it adds the user's site
    # folder first, and a package there (IPython, or one of its own) would win.
    useful = warm_up()
    installed = python_installation()
    proven_r, proven_w = os.pipe()  # children write their pid once their kernel proved itself
    unproven = set()

    def on_child_exit(*_):
        unproven.difference_update(reap_children())

    signal.signal(signal.SIGCHLD, on_child_exit)
    born = served = time.monotonic()
    while True:
        wait = min(served + SPARE_TTL, born + SPARE_MAX_AGE) - time.monotonic()
        if wait <= 0:
            os._exit(0)
        ready = select.select([listener, proven_r], [], [], wait)[0]
        if proven_r in ready:
            for word in os.read(proven_r, 4096).split():
                unproven.discard(int(word) if word.isdigit() else 0)
            served = time.monotonic()  # only a kernel the host sent keeps us
        if listener not in ready:
            continue
        try:
            conn, _ = listener.accept()
        except OSError:
            continue
        if python_installation() != installed:
            os._exit(0)  # the modules we hold are not what a cold start imports now
        if not useful or len(unproven) >= SPARE_UNPROVEN:
            conn.close()  # its kernel starts cold (flooded by connections that prove nothing)
            continue
        signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGCHLD})
        try:
            child = os.fork()
        except OSError:
            child = -1
        if child == 0:
            signal.signal(signal.SIGCHLD, signal.SIG_DFL)  # cells wait for their own
            signal.pthread_sigmask(signal.SIG_UNBLOCK, {signal.SIGCHLD})
            listener.close()
            os.close(proven_r)
            return take_channel(conn, secret, length, proven_w)
        if child > 0:
            unproven.add(child)
        signal.pthread_sigmask(signal.SIG_UNBLOCK, {signal.SIGCHLD})
        conn.close()  # (a failed fork: its kernel starts cold)


def python_installation():
    """What is installed where imports come from (and in the user's site folder, which a
    cold start adds): the names and times of the install records (``*.dist-info``,
    ``*.egg-info``, ``*.pth``, ``*.egg-link``) of each folder. A pip install or
    uninstall changes them; caches and a cell's own files do not."""
    import site

    state = []
    for folder in [*sys.path, site.getusersitepackages()]:
        try:
            with os.scandir(folder or ".") as entries:
                records = sorted(
                    (entry.name, entry.stat(follow_symlinks=False).st_mtime_ns)
                    for entry in entries
                    if entry.name.endswith((".dist-info", ".egg-info", ".pth", ".egg-link"))
                )
        except OSError:
            records = None
        state.append((folder, records))
    return state


def warm_up():
    """Import what every interpreter imports to build its shell (most of a cold start's
    time), without building one: a fork inherits modules, not threads or open files.
    Returns whether the spare is of use: not when the user's site folder holds a
    package we imported (a cold start would import the user's; the spare may not)."""
    import site

    if os.environ.get("SANDBOX_AGENT_NO_IPYTHON"):
        return True
    try:
        import_ipython_core()
    except ImportError:
        pass
    try:
        names = os.listdir(site.getusersitepackages())
    except OSError:
        return True
    theirs = {name.split(".")[0].split("-")[0] for name in names}
    return not theirs & {name.split(".")[0] for name in sys.modules}


def read_stdin_secret(size=128):
    """A line from stdin without its newline, read in place into a bytearray (no copies
    of it in freed memory: a secret can be wiped before cells run in this process or a
    fork of it), byte by byte (what follows on fd 0 is not ours); (buffer, length)."""
    import io

    secret = bytearray(size)
    view = memoryview(secret)
    raw = io.FileIO(0, "rb", closefd=False)
    length = 0
    while length < size and raw.readinto(view[length : length + 1]) == 1:
        if secret[length] == 10:
            secret[length] = 0
            break
        length += 1
    return secret, length


def wipe(buffer, length):
    buffer[:length] = bytes(length)  # in place: the same length


def left(deadline):
    """Seconds to a time.monotonic() deadline, for a socket timeout (never 0: blocking)."""
    return max(deadline - time.monotonic(), 0.01)


def take_channel(conn, secret, length, proven):
    """In a child of the spare: take the kernel's fds and settings if it proves it was
    sent by the host (its start program read the secret from the host), else end.

    The secret is wiped from this process, the one the kernel's cells run in, before it
    goes on: a cell that found it could have the spare fork interpreters of its own,
    outside its kernel's process tree, with settings of its choosing (no Landlock rule).
    Anything short of a whole, valid hand-over ends the child: nothing runs on defaults.
    Returns the connection the start program waits on: it ends when we do.
    """
    import array
    import hmac
    import socket
    import struct

    global OUTPUT_LIMIT, CELL_TIMEOUT, SUPERVISOR
    deadline = time.monotonic() + 5  # for the whole hand-over: a trickle cannot hold us
    conn.settimeout(5)
    message = bytearray(65536)
    view = memoryview(message)
    fds = array.array("i")
    size = 0
    try:
        got, ancdata, _, _ = conn.recvmsg_into([message], socket.CMSG_SPACE(3 * 4))
        for level, kind, data in ancdata:
            if level == socket.SOL_SOCKET and kind == socket.SCM_RIGHTS:
                fds.frombytes(data[: len(data) - len(data) % 4])
        size = got
        while got and message.count(b"\n", 0, size) < 2 and size < len(message):
            conn.settimeout(left(deadline))
            got = conn.recv_into(view[size:])
            size += got
    except OSError:
        size = 0
    end = message.find(b"\n", 0, size)
    proven_ok = (
        length > 0
        and end == length
        and hmac.compare_digest(view[:end], memoryview(secret)[:length])
    )
    wipe(secret, length)
    wipe(message, max(end, 0))
    settings = None
    if proven_ok and len(fds) >= 2 and message.count(b"\n", 0, size) >= 2:
        try:
            settings = json.loads(bytes(message[end + 1 : message.find(b"\n", end + 1)]))
        except ValueError:
            settings = None
    if (
        not isinstance(settings, dict)
        or not isinstance(settings.get("env"), dict)
        or not isinstance(settings.get("cwd"), str)
    ):
        os._exit(0)  # a probe, a hand-over from anyone but the host's kernel, or cut short
    try:
        os.chdir(settings["cwd"])  # where a cold start would run; if it cannot, neither do we
    except OSError:
        os._exit(0)
    SUPERVISOR = struct.unpack(
        "3i", conn.getsockopt(socket.SOL_SOCKET, socket.SO_PEERCRED, struct.calcsize("3i"))
    )[0]
    try:
        conn.settimeout(left(deadline))
        conn.sendall(b"K%d\n" % os.getpid())
        if conn.recv(1) != b"g":  # it found something wrong with us: it starts cold
            os._exit(0)
    except OSError:
        os._exit(0)
    try:
        os.write(proven, b"%d\n" % os.getpid())
    except OSError:
        pass  # the spare ended meanwhile: nothing to keep alive
    os.close(proven)
    os.environ.update(
        {k: str(v) for k, v in settings["env"].items() if str(k).startswith("SANDBOX_AGENT_")}
    )
    OUTPUT_LIMIT = int(os.environ.get("SANDBOX_AGENT_OUTPUT_LIMIT") or 10_000_000)
    CELL_TIMEOUT = float(os.environ.get("SANDBOX_AGENT_CELL_TIMEOUT") or 0)
    for target, fd in enumerate(fds[:3]):
        os.dup2(fd, target)
    for fd in fds:
        os.close(fd)
    conn.settimeout(None)
    return conn


def connect_kernel():
    """The kernel's socket, past the engine's exec stream (the host's agent_sockets), or
    None: stdin and stdout stay the channel. The environment only says that there is
    one; its path and the token that proves us to the kernel come on stdin, right after
    the source (and a spare's secret), never in argv or the environment. No other
    process of the sandbox can open our stdin once we are non-dumpable: from our first
    instruction when the host started us from its unreadable copy of python3, else from
    our first line (one that opened it in the moment before could read them). It cannot
    list the socket's folder either."""
    if os.environ.pop("SANDBOX_AGENT_CHANNEL", "") != "1":
        return None
    try:
        offer = json.loads(read_stdin_line(512) or "{}")
        path, token = offer.get("path"), offer.get("token")
    except (ValueError, AttributeError):
        return None
    if not isinstance(path, str) or not isinstance(token, str):
        return None
    if not token or any(c not in "0123456789abcdef" for c in token):
        return None
    import socket

    sock = socket.socket(socket.AF_UNIX)
    sock.settimeout(5)
    try:
        sock.connect(path)
        sock.sendall(token.encode("ascii") + b"\n")
    except OSError:
        sock.close()
        return None
    sock.settimeout(None)
    return sock


def send_ready(wire, channel=False, spare=""):
    """Tell the kernel we are here, before the slow part (building IPython's shell): the
    kernel answers kernel_info and its client settles meanwhile; requests wait in the pipe."""
    import importlib.util

    ipython = (
        not os.environ.get("SANDBOX_AGENT_NO_IPYTHON")
        and importlib.util.find_spec("IPython") is not None
    )
    # The processes that carry this kernel (interpreter, and its watcher or the spare's
    # supervisor), each with its start time: the host's reaper ends them if the kernel
    # dies and they do not end by themselves (a cell may have frozen the watcher).
    keepers = [os.getppid()] + ([SUPERVISOR] if SUPERVISOR else [])
    procs = [[pid, start_time_of(pid)] for pid in [os.getpid(), *keepers]]
    wire.send(
        ev="ready",
        python_version="%d.%d.%d" % sys.version_info[:3],
        ipython=ipython,
        pid=os.getpid(),
        procs=procs,
        channel=channel,  # True: all else goes over the kernel's socket
        spare=spare,  # served, busy (it stays), gone (forget it), or "" (none named)
    )


REAPER_LOCK = "@sandbox-kernel-reaper"  # held by the one reaper that may freeze the sandbox


def reaper_lock(wait):
    """The sandbox's reaper lock (an abstract socket: the kernel frees it when its holder
    dies, even by SIGKILL), or None after ``wait`` seconds.

    Two reapers that froze everything at once would each stop the other before either
    could resume anything, and every process of the sandbox would stay stopped for
    good. So only the holder freezes; a cell that squats the name only costs its own
    sandbox the freeze, never a hang.
    """
    import socket

    lock = socket.socket(socket.AF_UNIX)
    deadline = time.monotonic() + wait
    while True:
        try:
            lock.bind(socket_address(REAPER_LOCK))
            return lock
        except OSError:
            if time.monotonic() > deadline:
                lock.close()
                return None
            time.sleep(0.02)


def end_processes(argv):
    """``--end-processes JSON``: kill the trees of [pid, start time] pairs that still
    are those very processes (the host's reaper, after their kernel died)."""
    targets = [
        (pid, start)
        for pid, start in json.loads(argv[1])
        if isinstance(pid, int) and pid > 1 and start
    ]
    if not targets:
        os._exit(0)
    # Freeze every process of this user here first (all but us and init): a cell that
    # forks without pause cannot outrun the kill, and nothing of it runs meanwhile.
    # Other interpreters of the sandbox pause for these milliseconds, then go on.
    lock = reaper_lock(10.0)
    if lock is not None:
        try:
            os.kill(-1, signal.SIGSTOP)
        except OSError:
            pass
    try:
        for pid, start in targets:
            if start_time_of(pid) == start:
                kill_tree(pid, include_root=True)
    finally:
        if lock is not None:
            try:
                os.kill(-1, signal.SIGCONT)
            except OSError:
                pass
    os._exit(0)


def main():
    if sys.argv[1:2] == ["--restricted"]:
        run_restricted(sys.argv[1:])
    if sys.argv[1:2] == ["--end-processes"]:
        end_processes(sys.argv[1:])
    harden()
    show_python3()
    spare_link = None  # a spare's child: what its kernel's start program waits on
    outcome = ""  # what became of the spare the kernel named (see hand_over)
    if os.environ.get("SANDBOX_AGENT_SPARE_LISTEN"):
        spare_link = wait_as_spare(os.environ["SANDBOX_AGENT_SPARE_LISTEN"])
        outcome = "served"
    else:
        spare = sys.argv[2:5]  # [socket path, pid, start time] of a recorded spare, if any
        if len(spare) == 3 and spare[1].isdigit():
            outcome = hand_over(spare[0], int(spare[1]), spare[2])
    # A watcher for every interpreter, the cold one and the one a spare forked: it ends
    # what the cells left when the interpreter dies, whether or not the spare still lives.
    watch_child()
    kernel = connect_kernel()
    # The kernel's (or, for a spare, the taking kernel's) host folders: no links there.
    restrict_special_files(
        json.loads(os.environ.pop("SANDBOX_AGENT_NO_SPECIAL_FILES", "[]") or "[]")
    )
    wire = Wire()
    send_ready(wire, channel=kernel is not None, spare=outcome)
    if kernel is not None:
        wire.move_to(kernel)
    enable_user_site()
    use_user_path()
    # fd 0 and 1 now belong to the protocol; user code gets /dev/null and pipes.
    devnull = os.open(os.devnull, os.O_RDONLY)
    os.dup2(devnull, 0)
    os.close(devnull)
    agent = Agent(wire)
    agent.keep_alive = spare_link
    agent.output.start()
    capture_fd(1, "stdout", agent.output)
    capture_fd(2, "stderr", agent.output)
    sys.stdout = Stream(agent.output, "stdout")
    sys.stderr = Stream(agent.output, "stderr")
    sys.stdin = open(os.devnull)
    import builtins
    import getpass

    builtins.input = lambda prompt="": agent.read_input(prompt)
    getpass.getpass = lambda prompt="Password: ", stream=None: agent.read_input(
        prompt, password=True
    )
    agent.comms = install_comms(agent)
    if agent.shell is None:
        display, clear_output = plain_display(agent)
        builtins.display = display
        agent.namespace["display"] = display
        agent.namespace["clear_output"] = clear_output
    signal.signal(signal.SIGINT, signal.default_int_handler)
    # The working folder first, as ipykernel has it (cells import the notebook's modules);
    # the start left it out (see boot.py).
    sys.path.insert(0, "")
    agent.serve()


if __name__ == "__main__":
    main()
