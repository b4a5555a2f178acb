"""The images sandboxes are made from: found on the engine, pulled when missing (with
progress lines), and listed for a user who needs another one.

A missing image that cannot be pulled (no registry here, a typo) becomes one line that
says what to do; snapshots (our own images, labelled) are never offered as images.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any

from ..base import BadRequest, Progress, SandboxFailed, SandboxNotFound
from .errors import engine_errors, engine_reason
from .info import LABEL_SNAPSHOT_REF, Inspected
from .wire import EngineCalls


def ensure_image(
    engine: EngineCalls, client: Callable[[], Any], name: str, say: Progress
) -> Inspected:
    """Image ``name`` (its attributes), pulled through ``client()`` (the SDK's, made only
    then: a kernel's start never needs it) when it is not here."""
    try:
        with engine_errors(f"use image {name!r}"):
            return Inspected(engine.inspect_image(name))
    except SandboxNotFound:
        pass
    except BadRequest as exc:  # not an image name at all (capitals, spaces...)
        raise SandboxFailed(
            f"bad image name {name!r}: {engine_reason(exc)}; set SANDBOX_KERNEL_IMAGE to a valid one"
        ) from None
    say(f"image {name} is not here; pulling it")
    repo, _, tag = name.rpartition(":") if ":" in name.rsplit("/", 1)[-1] else (name, "", "latest")
    try:
        with engine_errors(f"pull {name}", refused=SandboxFailed):
            _pull(client(), repo, tag, name, say)
            return Inspected(engine.inspect_image(name))
    except (SandboxFailed, SandboxNotFound) as exc:
        raise SandboxFailed(
            f"image {name} is not present and could not be pulled ({engine_reason(exc)}); "
            "load it (`docker load -i FILE`) or build it, or set SANDBOX_KERNEL_IMAGE to an "
            "image you have with python3 (`sandbox-kernel doctor` names some)"
        ) from None


def _pull(client: Any, repo: str, tag: str, name: str, say: Progress) -> None:
    """Pull, saying how it goes every few seconds; an error event fails it."""
    last = 0.0
    for event in client.api.pull(repo, tag=tag, stream=True, decode=True):
        if "error" in event:
            raise SandboxFailed(str(event["error"]))
        if time.monotonic() - last > 2 and event.get("status"):
            last = time.monotonic()
            say(f"pulling {name}: {event.get('status')} {event.get('progress', '')}".rstrip())


def image_present(engine: EngineCalls, name: str) -> bool:
    """Whether image ``name`` is on the engine (nothing is pulled)."""
    try:
        with engine_errors(f"use image {name!r}"):
            engine.inspect_image(name)
    except SandboxNotFound:
        return False
    except BadRequest:  # not an image name at all
        return False
    return True


def local_images(client: Any) -> list[str]:
    """Tagged images on the engine, newest first (what a user could start from)."""
    with engine_errors("list images"):
        images = client.api.images()
    images.sort(key=lambda i: i.get("Created", 0), reverse=True)
    return [
        tag
        for image in images
        if LABEL_SNAPSHOT_REF not in (image.get("Labels") or {})
        for tag in image.get("RepoTags") or []
        if tag != "<none>:<none>"
    ]
