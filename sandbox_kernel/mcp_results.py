"""Tool results an agent can read: each one bounded well under what MCP clients accept.

The official MCP client refuses a server-sent event over 1 MiB, so a tool that returned
a cell's whole output (up to ``output_limit``, 10 MB) failed as a whole. Every result
is held to ``mcp_result_limit`` bytes as the client receives it (its JSON, text and
structured content together). A run's output that does not fit keeps its head and
tail, with a notice of what was cut; the whole of it is written to a file in the
workspace, ``.sandbox-kernel/outputs/<when>-<tool>-<id>.txt`` (images beside it), whose
path the notice names, through the same hardened file layer as every other host write
there (no link the sandbox planted is followed). The newest KEEP such files are kept.
"""

from __future__ import annotations

import base64
import json
import secrets
import time
from collections.abc import Callable
from dataclasses import dataclass, field, replace
from typing import Any

from mcp.types import CallToolResult

from .agent_sessions import CommandResult, Outcome
from .errors import SandboxError
from .files import RemoteWorkspace, Workspace
from .units import format_size

OUTPUTS = ".sandbox-kernel/outputs"  # beneath the workspace
KEEP = 20  # whole outputs kept there; older ones go as new ones come
SHRINK_ROUNDS = 6  # tries at a smaller share before the texts are left out whole


def result_size(result: CallToolResult) -> int:
    """Bytes of ``result`` as the client receives it (the JSON of the tool's result)."""
    return len(result.model_dump_json(by_alias=True, exclude_none=True).encode("utf-8"))


def json_size(text: str) -> int:
    """Bytes of ``text`` as a JSON string (escapes and UTF-8 counted)."""
    return len(json.dumps(text, ensure_ascii=False).encode("utf-8", "surrogatepass")) - 2


def fitting_prefix(text: str, budget: int) -> str:
    """The longest start of ``text`` whose JSON is at most ``budget`` bytes (every
    character costs at least a byte, so a prefix of ``budget`` characters is the most)."""
    if budget <= 0:
        return ""
    cut = text[:budget]
    while cut and json_size(cut) > budget:
        cut = cut[: max(0, len(cut) * budget // json_size(cut) - 1)]
    return cut


def head_and_tail(text: str, budget: int) -> tuple[str, int]:
    """``text`` within ``budget`` JSON bytes: whole when it fits, else its first and
    last parts around a marker line; (the text kept, characters left out)."""
    if json_size(text) <= budget:
        return text, 0
    half = max(0, budget // 2 - 40)
    head = fitting_prefix(text, half)
    tail = fitting_prefix(text[len(head) :][::-1], half)[::-1]
    left_out = len(text) - len(head) - len(tail)
    return f"{head}\n[... {left_out} characters cut here ...]\n{tail}", left_out


@dataclass
class Cut:
    """What was left out of a result, and where the whole output is."""

    limit: int
    fields: dict[str, int] = field(default_factory=dict)  # name: characters left out
    images: int = 0  # images left out (their files are beside the output's)
    saved: str = ""  # the whole output's path inside the sandbox
    unsaved: str = ""  # why it could not be written, if it could not

    def notice(self) -> str:
        cut = ", ".join(f"{n} characters of {name}" for name, n in self.fields.items() if n)
        if self.images:
            cut += (", " if cut else "") + f"{self.images} image(s)"
        where = (
            f"the whole output is in {self.saved} (read_file path={self.saved.removeprefix('/workspace/')} "
            "with offset and limit)"
            if self.saved
            else f"the whole output could not be kept: {self.unsaved}"
        )
        return (
            f"output cut to fit one result of {format_size(self.limit)} (mcp_result_limit): "
            f"left out {cut}; {where}"
        )

    def to_dict(self) -> dict[str, Any]:
        return {"left_out": self.fields, "images_left_out": self.images, "output_file": self.saved}


def fit(build: Callable[[int], tuple[CallToolResult, Cut]], limit: int) -> CallToolResult | None:
    """The result ``build(share)`` makes for the largest share of ``limit`` that fits
    (``share``: JSON bytes all of its long texts together may take); None if none does."""
    share = limit // 2
    for _ in range(SHRINK_ROUNDS):
        result, _cut = build(share)
        size = result_size(result)
        if size <= limit:
            return result
        share = max(0, share - (size - limit) - limit // 20)
    result, _cut = build(0)
    return result if result_size(result) <= limit else None


def shares(texts: dict[str, str], budget: int) -> dict[str, int]:
    """``budget`` split among ``texts``: a short one keeps all it needs, long ones share
    the rest evenly."""
    need = {name: json_size(text) for name, text in texts.items()}
    left, out = budget, dict[str, int]()
    for name in sorted(need, key=need.__getitem__):
        share = left // max(1, len(need) - len(out))
        out[name] = min(need[name], share)
        left -= out[name]
    return out


# -- execute_code ------------------------------------------------------------------------
def whole_code_output(outcome: Outcome) -> tuple[str, list[tuple[str, bytes]]]:
    """The text of everything a run printed, and its images, for the output file."""
    parts = [outcome.stdout]
    if outcome.stderr:
        parts.append(f"\n[stderr]\n{outcome.stderr}")
    images = []
    for number, item in enumerate(outcome.outputs, 1):
        if item["kind"] == "image":
            images.append((item["mime"], base64.b64decode(item["data"])))
        else:
            parts.append(f"\n[output {number}: {item['mime']}]\n{item['data']}")
    if outcome.error:
        err = outcome.error
        parts.append(f"\n[error] {err['ename']}: {err['evalue']}\n" + "\n".join(err["traceback"]))
    return "".join(parts), images


def cut_outcome(outcome: Outcome, share: int, cut: Cut) -> Outcome:
    """``outcome`` with its texts within ``share`` JSON bytes together (head and tail
    of each long one kept) and images that do not fit left out; ``cut`` says what."""
    texts = {"stdout": outcome.stdout, "stderr": outcome.stderr}
    images = [i for i, item in enumerate(outcome.outputs) if item["kind"] == "image"]
    for i, item in enumerate(outcome.outputs):
        if item["kind"] == "text":
            texts[f"output {i + 1}"] = item["data"]
    if outcome.error:
        texts["traceback"] = "\n".join(outcome.error["traceback"])
    image_share = share // 4 if images else 0
    budget = shares(texts, share - image_share)
    kept: dict[str, str] = {}
    cut.fields = {}
    for name, text in texts.items():
        kept[name], cut.fields[name] = head_and_tail(text, budget[name])
    outputs, spent, cut.images = [], 0, 0
    for i, item in enumerate(outcome.outputs):
        if item["kind"] == "image":
            if spent + len(item["data"]) > image_share:
                cut.images += 1
                continue
            spent += len(item["data"])
            outputs.append(item)
        else:
            outputs.append({**item, "data": kept[f"output {i + 1}"]})
    error = outcome.error
    if error is not None:
        error = {**error, "traceback": kept["traceback"].split("\n") if kept["traceback"] else []}
    return replace(
        outcome, stdout=kept["stdout"], stderr=kept["stderr"], outputs=outputs, error=error
    )


# -- execute_command ---------------------------------------------------------------------
def whole_command_output(result: CommandResult) -> str:
    return result.stdout + (f"\n[stderr]\n{result.stderr}" if result.stderr else "")


def cut_command(result: CommandResult, share: int, cut: Cut) -> CommandResult:
    texts = {"stdout": result.stdout, "stderr": result.stderr}
    budget = shares(texts, share)
    kept = {}
    for name, text in texts.items():
        kept[name], cut.fields[name] = head_and_tail(text, budget[name])
    return replace(result, stdout=kept["stdout"], stderr=kept["stderr"])


# -- the whole output, in the workspace -----------------------------------------------
def keep_whole_output(
    workspace: Workspace | RemoteWorkspace,
    tool: str,
    text: str,
    images: list[tuple[str, bytes]] | None = None,
) -> str:
    """Write ``text`` (and ``images`` beside it) to a new file of OUTPUTS, leaving only
    the newest KEEP outputs there; its path as the sandbox sees it. Raises
    :class:`SandboxError` (a full disk, a folder the sandbox replaced by a link)."""
    stem = f"{time.strftime('%Y%m%d-%H%M%S', time.gmtime())}-{tool}-{secrets.token_hex(4)}"
    path = f"{OUTPUTS}/{stem}.txt"
    _write(workspace, path, text.encode("utf-8", "surrogateescape"))
    for number, (mime, data) in enumerate(images or [], 1):
        _write(workspace, f"{OUTPUTS}/{stem}-image-{number}.{mime.rsplit('/', 1)[-1]}", data)
    _prune(workspace)
    return f"/workspace/{path}"


def _write(workspace: Workspace | RemoteWorkspace, path: str, data: bytes) -> None:
    upload = workspace.start_upload(path)
    try:
        upload.write(data)
        upload.commit()
    finally:
        upload.abort()  # after a commit: nothing; after a failure: no temporary left


def _prune(workspace: Workspace | RemoteWorkspace) -> None:
    """Only the newest KEEP outputs stay (names start with their time); a file the
    sandbox put there is any other file of its own: left alone unless it looks like ours."""
    try:
        entries, _ = workspace.list(OUTPUTS)
    except SandboxError:
        return
    runs = sorted(
        {e.name.split("-image-")[0].removesuffix(".txt") for e in entries if e.type == "file"}
    )
    for stale in runs[:-KEEP]:
        for entry in entries:
            if entry.type == "file" and entry.name.startswith(stale):
                try:
                    workspace.delete(f"{OUTPUTS}/{entry.name}")
                except SandboxError:
                    pass
