"""Small test utilities shared by several test modules."""

from __future__ import annotations

import asyncio
import base64
import hashlib
import json
import uuid
import zipfile
from pathlib import Path
from typing import Any


def make_wheel(folder: Path, name: str = "sk_demo_pkg", version: str = "1.0") -> Path:
    """Write a minimal pure-Python wheel: installing it needs no network (no registry here)."""
    dist = f"{name}-{version}.dist-info"
    files = {
        f"{name}/__init__.py": f"VALUE = {version!r}\n",
        f"{dist}/METADATA": f"Metadata-Version: 2.1\nName: {name}\nVersion: {version}\n",
        f"{dist}/WHEEL": "Wheel-Version: 1.0\nGenerator: tests\nRoot-Is-Purelib: true\nTag: py3-none-any\n",
    }
    record = []
    for path, text in files.items():
        digest = (
            base64.urlsafe_b64encode(hashlib.sha256(text.encode()).digest()).rstrip(b"=").decode()
        )
        record.append(f"{path},sha256={digest},{len(text.encode())}")
    record.append(f"{dist}/RECORD,,")
    files[f"{dist}/RECORD"] = "\n".join(record) + "\n"
    folder.mkdir(parents=True, exist_ok=True)
    wheel = folder / f"{name}-{version}-py3-none-any.whl"
    with zipfile.ZipFile(wheel, "w") as zf:
        for path, text in files.items():
            zf.writestr(path, text)
    return wheel


async def run_over_websocket(
    ws: Any, code: str, timeout: float = 120.0
) -> tuple[str, dict[str, Any]]:
    """Run ``code`` in the kernel behind a Jupyter kernel websocket (the JSON protocol a
    browser speaks): its stdout and the execute_reply's content."""
    msg_id = uuid.uuid4().hex
    ws.write_message(
        json.dumps(
            {
                "header": {
                    "msg_id": msg_id,
                    "msg_type": "execute_request",
                    "username": "test",
                    "session": uuid.uuid4().hex,
                    "version": "5.3",
                },
                "parent_header": {},
                "metadata": {},
                "content": {"code": code, "silent": False, "allow_stdin": False},
                "channel": "shell",
                "buffers": [],
            }
        )
    )
    out: list[str] = []
    reply: dict[str, Any] | None = None
    idle = False
    deadline = asyncio.get_running_loop().time() + timeout
    # The reply comes on the shell channel and the output on iopub: the websocket merges
    # them in no fixed order, so the cell is over only once both the reply and iopub's
    # idle have come (what nbclient waits for too).
    while reply is None or not idle:
        left = deadline - asyncio.get_running_loop().time()
        raw = await asyncio.wait_for(ws.read_message(), max(left, 0.1))
        if raw is None:
            raise AssertionError(f"the kernel websocket closed; output so far: {''.join(out)!r}")
        msg = json.loads(raw)
        if msg.get("parent_header", {}).get("msg_id") != msg_id:
            continue
        kind = msg["header"]["msg_type"]
        if kind == "stream":
            out.append(msg["content"]["text"])
        elif kind == "error":
            out.append("\n".join(msg["content"]["traceback"]))
        elif kind == "execute_reply":
            reply = msg["content"]
        elif kind == "status" and msg["content"]["execution_state"] == "idle":
            idle = True
    assert reply is not None
    return "".join(out), reply


# Cell code that defines grandparent(): the parent of the interpreter's watcher, which
# is the warm spare that forked the interpreter when it came from one.
GRANDPARENT = (
    "import os\n"
    "def grandparent():\n"
    "    stat = open('/proc/%d/stat' % os.getppid()).read()\n"
    "    return int(stat.rsplit(')', 1)[1].split()[1])\n"
)


# Cell or `python3 -c` code that prints the pid of the process listening on the warm
# spare's abstract socket (0 when none), read from /proc, never by connecting to it (a
# connection would make the spare fork a child for it).
SPARE_PID_PROBE = r"""
import os, sys
inodes = set()
for line in open('/proc/net/unix').read().splitlines()[1:]:
    fields = line.split()
    if len(fields) >= 8 and fields[7] == '@sandbox-kernel-spare' and fields[3] == '00010000':
        inodes.add(fields[6])
found = 0
for pid in (p for p in os.listdir('/proc') if p.isdigit() and inodes):
    try:
        targets = [os.readlink('/proc/%s/fd/%s' % (pid, fd)) for fd in os.listdir('/proc/%s/fd' % pid)]
    except OSError:
        continue
    if any(t.startswith('socket:[') and t[8:-1] in inodes for t in targets):
        found = int(pid)
        break
print(found)
"""
