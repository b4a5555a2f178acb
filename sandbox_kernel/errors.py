"""Every error sandbox-kernel raises on purpose, in one place.

Each class is a kind of failure the caller can act on, and its message is written for
the user (what went wrong, what to do). The REST and WebDAV handlers map the classes
to HTTP statuses (:func:`http_status`, one table for both), the CLI to exit codes, the kernel to one line in the cell; nothing above
the backends needs to know which engine raised them.
"""

from __future__ import annotations


class SandboxError(Exception):
    """Base of every error we raise on purpose; the message is meant for the user."""


class EngineUnavailable(SandboxError):
    """The engine does not answer (not installed, not running, no permission): 503."""


class SandboxNotFound(SandboxError):
    """No sandbox (or snapshot) of ours has this id: 404."""


class FileMissing(SandboxError):
    """The path is inside the workspace but nothing is there: 404."""


class BadRequest(SandboxError):
    """The caller asked for something malformed or refused (a bad name, a path leading out): 400."""


class Forbidden(SandboxError):
    """The sandbox (or snapshot) belongs to another user: 403."""


class Conflict(SandboxError):
    """The request clashes with current state (a folder rewritten mid-upload, a taken or in-use snapshot): 409."""


class QuotaExceeded(SandboxError):
    """A new or restarted sandbox would pass a quota; the message names it and what to do: 409."""


class TooLarge(SandboxError):
    """An upload passed the size limit: 413."""


class NotSupported(SandboxError):
    """This backend cannot do that: 501."""


class SandboxFailed(SandboxError):
    """The sandbox could not be created or started (bad image, no python3, unknown runtime)."""


def shorten(text: str, limit: int = 80) -> str:
    """``text`` cut to ``limit`` characters for a message or a log line (names can be huge)."""
    text = str(text)
    return text if len(text) <= limit else text[: limit - 3] + "..."


class AlreadyExists(SandboxError):
    """Another process made the sandbox first (a lost create race); take theirs."""


_HTTP_STATUS: list[tuple[type[SandboxError], int]] = [
    (BadRequest, 400),
    (Forbidden, 403),
    (SandboxNotFound, 404),
    (FileMissing, 404),
    (QuotaExceeded, 409),
    (Conflict, 409),
    (TooLarge, 413),
    (NotSupported, 501),
    (EngineUnavailable, 503),
    (SandboxError, 500),
]


def http_status(exc: SandboxError, overrides: dict[type[SandboxError], int] | None = None) -> int:
    """The HTTP status of a domain error; ``overrides`` lets a protocol differ for a class
    (WebDAV answers a refused path with 403, as clients expect, where REST says 400)."""
    for kind, code in _HTTP_STATUS:
        if isinstance(exc, kind):
            return (overrides or {}).get(kind, code)
    return 500
