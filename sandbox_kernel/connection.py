"""The kernel's end of the channel to one agent, which it must not trust.

The agent runs in the same process as the cells, so anything the agent may send, a
cell may send too: it can write raw protocol lines to the agent's private fds, forge
events, send a line of gigabytes without a newline, or flood faster than Jupyter can
publish. This side therefore bounds everything by itself:

* a line longer than ``max_line`` is dropped while it streams in (never buffered whole)
  and reported as an ``overflow`` event;
* lines that are not JSON objects are dropped;
* at most ``max_queued`` bytes wait for the kernel: past that the reader stops reading,
  the pipe fills and the agent blocks, so a flood costs the host no memory;
* every event carries its size on the wire, so the kernel can hold each cell to the
  output limit whatever the agent claims.
"""

from __future__ import annotations

import asyncio
import json
import threading
from typing import Any

from .backends import Channel
from .errors import SandboxError


class AgentGone(Exception):
    """The channel ended: the interpreter (or the whole sandbox) is gone."""


OVERFLOW = "overflow"  # the event the reader makes of a line too long to keep


class AgentConnection:
    """One agent process: framed writes, and a reader thread feeding an asyncio queue."""

    def __init__(self, channel: Channel, max_line: int, max_queued: int = 32 << 20) -> None:
        self.channel = channel
        self.max_line = max_line
        self.loop: asyncio.AbstractEventLoop | None = None
        self.queue: asyncio.Queue[tuple[dict[str, Any], int] | None] = asyncio.Queue()
        self.lock = threading.Lock()
        self.ready: dict[str, Any] = {}
        self.alive = True
        self._pending = b""
        # 64 KiB credits; always room for the largest line we keep, so one line never waits forever.
        self._room = threading.Semaphore(max(max_queued, 2 * max_line) // 65536 + 1)

    def start(self, source: bytes, timeout_hint: str = "") -> dict[str, Any]:
        """Send the agent's source and wait for its ``ready`` (runs in a worker thread)."""
        self.channel.write(source)
        buf = bytearray()
        while b"\n" not in buf:
            chunk = self.channel.read()
            if not chunk or len(buf) > 1 << 20:
                tail = getattr(self.channel, "stderr_tail", "").strip()
                raise SandboxError(
                    "the interpreter in the sandbox did not start"
                    + (f": {tail[-300:]}" if tail else " (does the image have python3?)")
                    + timeout_hint
                )
            buf += chunk
        line, _, self._pending = bytes(buf).partition(b"\n")
        try:
            ready = json.loads(line)
        except ValueError:
            ready = None
        if not isinstance(ready, dict) or ready.get("ev") != "ready":
            raise SandboxError("the interpreter in the sandbox answered something unexpected at start")
        self.ready = ready
        return ready

    def attach(self, loop: asyncio.AbstractEventLoop) -> None:
        """Start relaying to ``loop`` (the connection may be made before the loop runs)."""
        self.loop = loop
        threading.Thread(target=self._read_loop, args=(self._pending,), daemon=True).start()

    def _deliver(self, msg: dict[str, Any], size: int) -> None:
        assert self.loop is not None
        for _ in range(max(1, size // 65536)):
            self._room.acquire()
        self.loop.call_soon_threadsafe(self.queue.put_nowait, (msg, size))

    def _read_loop(self, pending: bytes) -> None:
        buf = bytearray(pending)
        discarding = False
        try:
            while True:
                while (nl := buf.find(b"\n")) >= 0:
                    line = bytes(buf[:nl])
                    del buf[: nl + 1]
                    if discarding:
                        discarding = False
                        continue
                    self._decode(line)
                if len(buf) > self.max_line:
                    if not discarding:
                        self._deliver({"ev": OVERFLOW}, 0)
                    discarding = True
                    buf.clear()
                chunk = self.channel.read()
                if not chunk:
                    break
                buf += chunk
        finally:
            self.alive = False
            if self.loop is not None:
                self.loop.call_soon_threadsafe(self.queue.put_nowait, None)

    def _decode(self, line: bytes) -> None:
        try:
            msg = json.loads(line)
        except (ValueError, RecursionError):
            return
        if isinstance(msg, dict):
            self._deliver(msg, len(line))

    def send(self, **msg: Any) -> None:
        with self.lock:
            self.channel.write(json.dumps(msg).encode() + b"\n")

    async def next(self) -> tuple[dict[str, Any], int]:
        """The next event and its size on the wire; :class:`AgentGone` at the end."""
        item = await self.queue.get()
        if item is None:
            self.queue.put_nowait(None)  # every later caller learns it too
            raise AgentGone()
        for _ in range(max(1, item[1] // 65536)):
            self._room.release()
        return item

    def close(self) -> None:
        self.alive = False
        self.channel.close()
