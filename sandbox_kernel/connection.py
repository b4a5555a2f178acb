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

Several requests can be in flight (ipykernel hands the kernel a widget's comm message
while a cell runs), so one pump reads the agent and routes each event to the request
the agent says it is working on (``begin`` with the request's id, then its events,
then ``reply`` with the id); nothing else reads the queue.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import threading
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from .backends import Channel
from .errors import SandboxError


class AgentGone(Exception):
    """The channel ended: the interpreter (or the whole sandbox) is gone."""


START_TIMEOUT = 60.0  # seconds an interpreter may take to say ready
OVERFLOW = "overflow"  # the event the reader makes of a line too long to keep

# Output content the agent packs once, as Jupyter's session would: ``>TYPE {content}``.
# The reader checks it (valid JSON, the fields Jupyter defines and no others) and hands
# the kernel the event plus these very bytes, which it forwards without packing them
# again: for a large output, packing is most of what a relay costs.
PACKED_MARK = b">"
_PACKED_EVENTS = {
    "stream": "stream",
    "display_data": "display",
    "update_display_data": "display",
    "execute_result": "result",
}
_PACKED_FIELDS = {
    "stream": {"name", "text"},
    "display_data": {"data", "metadata", "transient"},
    "update_display_data": {"data", "metadata", "transient"},
    "execute_result": {"data", "metadata", "execution_count"},
}


_LONGEST_TYPE = max(len(t) for t in _PACKED_FIELDS)


def _no_constant(name: str) -> Any:
    raise ValueError(f"{name} is not JSON")  # NaN and Infinity: clients refuse them


def unpacked(line: bytes | memoryview) -> dict[str, Any] | None:
    """The event of a packed line, with ``packed`` (the content's bytes, checked) and
    ``msg_type``; None when anything about it is off (it is dropped, as a bad line is).

    A line may be megabytes: the content is copied out of it once (the bytes that are
    forwarded), not sliced and partitioned into copies."""
    space = bytes(line[: _LONGEST_TYPE + 2]).find(b" ")
    msg_type = bytes(line[1:space]).decode("ascii", "replace") if space > 0 else ""
    fields = _PACKED_FIELDS.get(msg_type)
    if fields is None:
        return None
    packed = bytes(line[space + 1 :])
    try:
        content = json.loads(packed, parse_constant=_no_constant)
    except (ValueError, RecursionError):  # UnicodeDecodeError is a ValueError
        return None
    if not isinstance(content, dict) or set(content) != fields:
        return None
    if msg_type == "stream":
        if content["name"] not in ("stdout", "stderr") or not isinstance(content["text"], str):
            return None
    elif not all(
        isinstance(content[f], dict) for f in fields if f != "execution_count"
    ) or not isinstance(content.get("execution_count", 0), int | None):
        return None
    event = dict(content, ev=_PACKED_EVENTS[msg_type], msg_type=msg_type, packed=packed)
    if msg_type == "update_display_data":
        event["update"] = True
    return event


@dataclass
class Request:
    """One request to the agent: its events go to ``on_event``, its reply to ``reply``."""

    on_event: Callable[[dict[str, Any], int], None]
    reply: asyncio.Future[dict[str, Any]] = field(
        default_factory=lambda: asyncio.get_running_loop().create_future()
    )
    id: str = ""


def not_started(within: float) -> SandboxError:
    """The error for an interpreter that did not say ready within ``within`` seconds."""
    return SandboxError(
        f"the interpreter in the sandbox did not start within {within:g} s"
        " (is the sandbox overloaded, or are its processes stopped?)"
    )


class _LoopClosed(Exception):
    """The event loop a connection relays to has closed."""


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
        self._requests: dict[str, Request] = {}
        self._current: Request | None = None  # the request whose events come now
        self._next_id = 0
        self.pump: asyncio.Task[None] | None = None
        self.reader: threading.Thread | None = None
        # 64 KiB credits; always room for the largest line we keep, so one line never waits forever.
        self._room = threading.Semaphore(max(max_queued, 2 * max_line) // 65536 + 1)

    def start(
        self, source: bytes, timeout_hint: str = "", within: float = START_TIMEOUT
    ) -> dict[str, Any]:
        """Send the agent's source and wait for its ``ready`` (runs in a worker thread).

        Not for ever: a process of the sandbox can stop the interpreter (or the engine's
        start of it) before it says ready; the channel is closed after ``within``
        seconds and the caller hears why.
        """
        expired = threading.Event()

        def expire() -> None:
            expired.set()
            self.channel.close()

        timer = threading.Timer(within, expire)
        timer.daemon = True
        timer.start()
        try:
            try:
                self.channel.write(source)
            except SandboxError:
                if expired.is_set():  # closed by the timer, in the middle of the write
                    raise not_started(within) from None
                raise
            buf = bytearray()
            while b"\n" not in buf.lstrip(b"\n"):
                chunk = self.channel.read()
                if expired.is_set():
                    raise not_started(within)
                if not chunk or len(buf) > 1 << 20:
                    tail = getattr(self.channel, "stderr_tail", "").strip()
                    raise SandboxError(
                        "the interpreter in the sandbox did not start"
                        + (f": {tail[-300:]}" if tail else " (does the image have python3?)")
                        + timeout_hint
                    )
                buf += chunk
        finally:
            timer.cancel()
        if expired.is_set():  # it fired after the last read: the channel is closed now
            raise not_started(within)
        line, _, self._pending = bytes(buf).lstrip(b"\n").partition(b"\n")
        try:
            ready = json.loads(line)
        except ValueError:
            ready = None
        if not isinstance(ready, dict) or ready.get("ev") != "ready":
            raise SandboxError(
                "the interpreter in the sandbox answered something unexpected at start"
            )
        self.ready = ready
        return ready

    def move_to(self, channel: Channel) -> None:
        """Speak over ``channel`` from now on: the interpreter said ready on the channel
        it was started by and then connected to its kernel's socket (see
        backends.agent_sockets). Only before :meth:`attach`, while nothing reads."""
        if self.loop is not None:
            raise RuntimeError("the connection is relaying already: too late to move it")
        self.channel = channel

    def attach(self, loop: asyncio.AbstractEventLoop) -> None:
        """Start relaying to ``loop`` (the connection may be made before the loop runs);
        call from the loop: the pump is a task of it."""
        self.loop = loop
        self.reader = threading.Thread(target=self._read_loop, args=(self._pending,), daemon=True)
        self.reader.start()
        self.pump = loop.create_task(self._pump())

    def request(
        self, op: str, on_event: Callable[[dict[str, Any], int], None], **fields: Any
    ) -> Request:
        """Send a request; its events go to ``on_event`` as they come, its reply content
        resolves ``Request.reply`` (AgentGone when the agent ends first)."""
        self._next_id += 1
        req = Request(on_event=on_event, id=str(self._next_id))
        if not self.alive:
            req.reply.set_exception(AgentGone())
            return req
        self._requests[req.id] = req
        try:
            self.send(op=op, id=req.id, **fields)
        except SandboxError:
            self._requests.pop(req.id, None)
            req.reply.set_exception(AgentGone())
        return req

    async def _pump(self) -> None:
        """The one reader of the queue: events to their request, replies to their waiter."""
        try:
            while True:
                msg, size = await self.next()
                kind = msg.get("ev")
                if kind == "begin":
                    self._current = self._requests.get(str(msg.get("id")))
                elif kind == "reply":
                    req = self._requests.pop(str(msg.get("id")), None)
                    if req is not None and not req.reply.done():
                        content = msg.get("content")
                        req.reply.set_result(
                            content
                            if isinstance(content, dict)
                            else {
                                "status": "error",
                                "ename": "SandboxError",
                                "evalue": "malformed reply",
                                "traceback": [],
                            }
                        )
                    if req is self._current:
                        self._current = None
                elif self._current is not None:
                    self._current.on_event(msg, size)
        except AgentGone:
            pass
        finally:
            for req in self._requests.values():
                if not req.reply.done():
                    req.reply.set_exception(AgentGone())
            self._requests.clear()

    def _deliver(self, msg: dict[str, Any], size: int) -> None:
        for _ in range(max(1, size // 65536)):
            self._room.acquire()
        self._to_loop((msg, size))

    def _to_loop(self, item: tuple[dict[str, Any], int] | None) -> None:
        """Queue ``item`` for the pump; :class:`_LoopClosed` once the loop has closed
        (its program is ending: nothing reads any more)."""
        assert self.loop is not None
        try:
            self.loop.call_soon_threadsafe(self.queue.put_nowait, item)
        except RuntimeError as e:  # asyncio's "Event loop is closed"
            raise _LoopClosed from e

    def _read_loop(self, pending: bytes) -> None:
        buf = bytearray(pending)
        discarding = False
        scanned = 0  # bytes of buf known to hold no newline: a long line is searched once
        try:
            while True:
                while (nl := buf.find(b"\n", scanned)) >= 0:
                    if discarding:
                        discarding = False
                    elif nl:  # (empty: the newline each message starts with)
                        with memoryview(buf) as whole, whole[:nl] as line:
                            self._decode(line)  # copies what it keeps: buf may change after
                    del buf[: nl + 1]
                    scanned = 0
                scanned = len(buf)
                if len(buf) > self.max_line:
                    if not discarding:
                        self._deliver({"ev": OVERFLOW}, 0)
                    discarding = True
                    buf.clear()
                    scanned = 0
                chunk = self.channel.read()
                if not chunk:
                    break
                buf += chunk
        except _LoopClosed:
            pass
        finally:
            self.alive = False
            if self.loop is not None:
                with contextlib.suppress(_LoopClosed):
                    self._to_loop(None)

    def _decode(self, line: memoryview) -> None:
        if line[:1] == PACKED_MARK:
            msg = unpacked(line)
        else:
            try:
                msg = json.loads(bytes(line))
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
        if self.pump is not None and self.loop is not None:
            with contextlib.suppress(RuntimeError):  # a closed loop's pump has ended
                self.loop.call_soon_threadsafe(self.pump.cancel)
