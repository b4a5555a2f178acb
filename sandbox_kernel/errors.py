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


class DiskFull(SandboxError):
    """A disk (the workspace's, bounded by the flavor, or the host's) has no room left."""


class NotSupported(SandboxError):
    """This backend cannot do that: 501."""


class SandboxFailed(SandboxError):
    """The sandbox could not be created or started (bad image, no python3, unknown runtime)."""


def shorten(text: str, limit: int = 80) -> str:
    """``text`` cut to ``limit`` characters for a message or a log line (names can be huge)."""
    text = str(text)
    if len(text) <= limit:
        return text
    cut = text[: limit - 3]
    word = cut.rsplit(" ", 1)[0]  # at a word's end, unless that loses much
    return (word if len(word) > limit * 3 // 4 else cut) + "..."


class AlreadyExists(SandboxError):
    """Another process made the sandbox first (a lost create race); take theirs."""


# Each domain error, most specific first: its HTTP status (REST, WebDAV) and the word an
# agent reads before the message (MCP). One table, so the doors never disagree.
_KINDS: list[tuple[type[SandboxError], int, str]] = [
    (BadRequest, 400, "bad argument"),
    (Forbidden, 403, "not allowed"),
    (SandboxNotFound, 404, "not found"),
    (FileMissing, 404, "no such file"),
    (QuotaExceeded, 409, "quota"),
    (Conflict, 409, "conflict"),
    (TooLarge, 413, "too large"),
    (DiskFull, 507, "disk full"),
    (NotSupported, 501, "not supported"),
    (EngineUnavailable, 503, "engine unavailable"),
    (SandboxError, 500, "sandbox error"),
]


def _kind(exc: SandboxError) -> tuple[type[SandboxError], int, str]:
    return next(row for row in _KINDS if isinstance(exc, row[0]))


def http_status(exc: SandboxError, overrides: dict[type[SandboxError], int] | None = None) -> int:
    """The HTTP status of a domain error; ``overrides`` lets a protocol differ for a class
    (WebDAV answers a refused path with 403, as clients expect, where REST says 400)."""
    kind, code, _ = _kind(exc)
    return (overrides or {}).get(kind, code)


def error_label(exc: SandboxError) -> str:
    """A word or two on what kind of error it is, for readers without a status code."""
    return _kind(exc)[2]
