"""The kernel's execute replies against ipykernel's KernelBase, in process (fast layer):
a real SandboxKernel and jupyter_client Session, with sockets that record what goes out
(no agent, no sandbox: the reply of the cell is given).

A failed cell aborts the cells queued behind it. KernelBase starts aborting only after
it has sent the error reply, so a client that answers the reply at once can have its
next cell aborted when the kernel is preempted between the two (an interrupted cell,
then ``print(kept)`` aborted: seen in CI on a loaded machine). The race needs a
preemption at one instruction, so it is tested as the order it depends on: aborting has
begun when the reply goes on the wire, and has ended once the loop turns.
"""

from __future__ import annotations

import asyncio
import json
import logging
from typing import Any

import pytest
from jupyter_client.session import Session
from tornado.ioloop import IOLoop

from sandbox_kernel.kernel import SandboxKernel

pytestmark = pytest.mark.fast


class RecordingSocket:
    """A socket that keeps (message type, whether the kernel aborts cells) per message."""

    def __init__(self, kernel: SandboxKernel, sent: list[tuple[str, bool]]) -> None:
        self.kernel, self.sent = kernel, sent

    def send_multipart(self, parts: list[Any], *args: Any, **kwargs: Any) -> None:
        frames = [bytes(p) for p in parts]
        header = json.loads(frames[frames.index(b"<IDS|MSG>") + 2])
        self.sent.append((header["msg_type"], bool(self.kernel._aborting)))


def execute(reply: dict[str, Any], **content: Any) -> list[tuple[str, bool]]:
    """What the kernel sends for one execute_request whose cell replies ``reply``, and
    whether it still aborts once the loop has turned (the last entry, "later")."""

    async def go() -> list[tuple[str, bool]]:
        kernel = SandboxKernel(session=Session(key=b""), log=logging.getLogger("test"))
        kernel.io_loop = IOLoop.current()
        sent: list[tuple[str, bool]] = []
        kernel.iopub_socket = RecordingSocket(kernel, sent)

        async def cell(*args: Any, **kwargs: Any) -> dict[str, Any]:
            return reply

        kernel.do_execute = cell  # type: ignore[method-assign]
        request = {
            "code": "import time; time.sleep(60)",
            "silent": False,
            "store_history": True,
            "user_expressions": {},
            "allow_stdin": False,
            **content,
        }
        parent = kernel.session.msg("execute_request", request)
        await kernel.execute_request(RecordingSocket(kernel, sent), [b"client"], parent)
        await asyncio.sleep(0.05)
        return [*sent, ("later", bool(kernel._aborting))]

    return asyncio.run(go())


INTERRUPTED = {
    "status": "error",
    "ename": "KeyboardInterrupt",
    "evalue": "",
    "traceback": [],
    "execution_count": 2,
}


def test_a_failed_cell_aborts_from_before_its_reply_until_the_loop_turns() -> None:
    sent = execute(INTERRUPTED)
    assert ("execute_reply", True) in sent, sent
    assert sent[-1] == ("later", False)


def test_nothing_is_aborted_when_the_client_asks_not_to() -> None:
    """nbclient's allow_errors sends stop_on_error false; a silent cell aborts nothing."""
    for content in ({"stop_on_error": False}, {"silent": True}):
        sent = execute(INTERRUPTED, **content)
        assert all(not aborting for _, aborting in sent), (content, sent)


def test_a_cell_that_ran_aborts_nothing() -> None:
    sent = execute({"status": "ok", "execution_count": 2, "user_expressions": {}, "payload": []})
    assert ("execute_reply", False) in sent and all(not a for _, a in sent), sent
