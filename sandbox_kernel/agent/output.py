"""What a cell prints and displays, on its way to the kernel (runs INSIDE the sandbox,
stdlib only): per-cell buffering of both streams, fds 1 and 2 as pipes (subprocesses and
C code print there too), and the cell's output limit, which every kind of output counts
against.
"""

import json
import os
import select
import threading
import time

FLUSH_DELAY = 0.02
# Seconds the flusher holds back the end of a line not finished yet (``print('a', n)``
# writes four times): a loaded machine must not split one printed line into two outputs
# (a notebook run by nbclient stores each as its own). ipykernel's whole interval.
PARTIAL_HOLD = 0.2
FLUSH_SIZE = 64 * 1024


class Output:
    """Per-cell stream buffering and the output limit, shared by both streams."""

    def __init__(self, wire, limit):
        self.wire = wire
        self.limit = limit  # bytes of output one cell may send
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
            if self.sent + self.size + len(text) > self.limit:
                room = max(0, self.limit - self.sent - self.size)
                if room:
                    self.parts.append((name, text[:room]))
                    self.size += room
                self.parts.append(("stderr", truncation_notice(self.limit)))
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
            if self.sent + self.size + size <= self.limit:
                self.sent += size
                return True
            self.parts.append(("stderr", truncation_notice(self.limit)))
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


def truncation_notice(limit):
    return (
        "\n[output truncated: this cell sent more than %.0f MB of output; the rest was discarded]\n"
        % (limit / 1e6)
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
