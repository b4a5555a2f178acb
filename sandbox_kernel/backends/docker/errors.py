"""The one place where what the Docker engine says goes wrong becomes our errors.

The docker SDK raises its own classes (``docker.errors.APIError`` with the engine's
HTTP status, ``requests`` errors for a socket that does not answer, a few plain
``DockerException``); :mod:`.wire`, which makes a kernel's start calls without
the SDK, raises two of its own with the same meaning. Above the backends nobody knows them: the REST API would answer
500 with a traceback in the log, the CLI and the kernel would print a traceback. So
every SDK call in the Docker backend runs inside :func:`engine_errors`, and
:func:`translate` decides, in one table, what each means for the user:

* 404 -> :class:`SandboxNotFound`, naming the sandbox when the call was about one
  (it was removed behind our back: ``docker rm -f`` while we worked on it);
* 409 -> :class:`Conflict` (removal already in progress, not running, image in use);
* no answer (no socket, a refused connection, a timeout) -> :class:`EngineUnavailable`
  saying what to do: the message the kernel's first cell shows;
* any other refusal -> the class the caller names for it, when it names one (creating
  and starting name :class:`SandboxFailed`, as the backend interface promises);
  else 400 and the SDK's own argument checks -> :class:`BadRequest`, 5xx ->
  :class:`EngineUnavailable` (the engine is unwell, as Daytona's 5xx are), and any
  other status -> :class:`SandboxError`.

Docker's explanation is kept but cleaned to one line (it can hold newlines and
64-digit ids), because every message here ends up as one line in a cell, a CLI error
or a JSON ``message``.

Also here: :func:`exec_failure`, for the one engine failure that arrives as process
output rather than an exception (``docker exec`` of a missing command).
"""

from __future__ import annotations

import os
import re
import sys
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

from ...errors import (
    BadRequest,
    Conflict,
    EngineUnavailable,
    SandboxError,
    SandboxFailed,
    SandboxNotFound,
    shorten,
)
from ..base import ExecResult
from .wire import EngineRefused, EngineSilent

REASON_LIMIT = 300  # characters of Docker's explanation kept in a message

_LONG_ID = re.compile(r"\b([0-9a-f]{12})[0-9a-f]{52}\b")


@contextmanager
def engine_errors(
    what: str, sandbox_id: str = "", refused: type[SandboxError] | None = None
) -> Iterator[None]:
    """Run engine calls (the SDK's or the wire's), raising our error for whatever the
    engine says.

    ``what`` is the action as a verb phrase, and when ``sandbox_id`` is given it takes
    the sandbox as its object ("stop" + "sk-alice"), so that one phrase serves both
    "Docker could not stop sk-alice: ..." and "sandbox sk-alice was removed while we
    tried to stop it". ``sandbox_id`` is given only when the call acts on that
    sandbox's container: a 404 then means the container is gone. ``refused`` is the
    class for every other refusal, for callers whose interface names one.
    """
    try:
        yield
    except Exception as exc:
        error = translate(exc, what, sandbox_id, refused)
        if error is None:
            raise
        raise error from None


def _sdk_errors() -> tuple[Any, Any] | None:
    """The SDK's error modules when it is loaded; when it is not, none of its errors
    can be in flight (and a kernel that never needed it does not load it for this)."""
    if "docker.errors" not in sys.modules or "requests" not in sys.modules:
        return None
    import docker.errors
    import requests

    return docker.errors, requests.exceptions


def translate(
    exc: Exception, what: str, sandbox_id: str = "", refused: type[SandboxError] | None = None
) -> SandboxError | None:
    """Our error for ``exc``, raised by the engine's client while we tried to ``what``;
    None when ``exc`` is no engine error at all."""
    target = f"{what} {sandbox_id}" if sandbox_id else what
    if isinstance(exc, EngineRefused):
        return _refusal(exc.status_code, exc.explanation, what, target, sandbox_id, refused)
    if isinstance(exc, EngineSilent):
        return _too_slow(target) if exc.timed_out else EngineUnavailable(unreachable(exc))
    sdk = _sdk_errors()
    if sdk is None:
        return None
    errors, http = sdk
    if isinstance(exc, errors.APIError):
        return _refusal(exc.status_code or 0, explanation(exc), what, target, sandbox_id, refused)
    if isinstance(exc, errors.NullResource | errors.InvalidArgument | errors.InvalidRepository):
        return BadRequest(f"cannot {target}: {one_line(str(exc))}")
    if isinstance(exc, http.Timeout) and not isinstance(exc, http.ConnectionError):
        return _too_slow(target)
    if isinstance(exc, errors.DockerException | http.RequestException):
        return EngineUnavailable(unreachable(exc))
    return None


def _too_slow(target: str) -> EngineUnavailable:
    return EngineUnavailable(
        f"the Docker engine did not answer in time when we tried to {target}; it may be "
        "overloaded: try again in a moment"
    )


def _refusal(
    status: int,
    reason: str,
    what: str,
    target: str,
    sandbox_id: str,
    refused: type[SandboxError] | None,
) -> SandboxError:
    """What an engine's HTTP error status means for the user (``reason``: its words)."""
    reason = one_line(reason)
    if status == 404 and sandbox_id:
        return SandboxNotFound(
            f"sandbox {sandbox_id} was removed while we tried to {what} it; "
            "`sandbox-kernel list` shows the ids you have"
        )
    if status == 404:
        return SandboxNotFound(f"Docker could not {target}: {reason}")
    if status == 409:
        return Conflict(f"Docker could not {target}: {reason}")
    if refused is not None:
        return refused(f"Docker could not {target}: {reason}")
    if status == 400:
        return BadRequest(f"Docker refused to {target}: {reason}")
    if status >= 500:
        return EngineUnavailable(f"the Docker engine failed to {target} ({status}): {reason}")
    return SandboxError(f"Docker refused to {target} ({status}): {reason}")


def engine_reason(error: BaseException) -> str:
    """Docker's own words behind an error :func:`engine_errors` raised, for a caller that
    phrases its own message (the engine's exception stays the error's ``__context__``)."""
    cause = error.__context__
    if isinstance(cause, Exception) and translate(cause, "") is not None:
        return explanation(cause)
    return one_line(str(error))


def explanation(exc: BaseException) -> str:
    """Docker's own reason for ``exc``, on one line."""
    return one_line(str(getattr(exc, "explanation", None) or exc))


def one_line(text: str) -> str:
    """``text`` as one short line: whitespace folded, engine ids cut to 12 digits as
    the docker CLI shows them, the length bounded."""
    return shorten(_LONG_ID.sub(r"\1", " ".join(text.split())), REASON_LIMIT)


def unreachable(exc: Exception) -> str:
    """What to do when the engine does not answer at all (the kernel's first cell shows it)."""
    where = os.environ.get("DOCKER_HOST", "unix:///var/run/docker.sock")
    reason = str(exc).splitlines()[0][:200] if str(exc) else type(exc).__name__
    return (
        f"cannot reach the Docker engine at {where} ({reason}); start it "
        "(`sudo systemctl start docker` or `sudo dockerd &`), check DOCKER_HOST and your "
        "permission on the socket, or use SANDBOX_KERNEL_BACKEND=local"
    )


_CWD = re.compile(r'chdir to cwd \("(?P<cwd>.*?)"\) set in config\.json failed: (?P<why>[^:]+)')


def exec_failure(command: str, code: int, message: bytes) -> ExecResult:
    """The engine could not start the command: say it as a shell would ("cmd: command
    not found", exit 127; "cmd: permission denied", 126), not in the runtime's words.

    The runtime says "no such file or directory" both for a missing program and for a
    missing working folder, so the folder is checked first.
    """
    text = message.decode(errors="replace")
    folder = _CWD.search(text)
    if folder:
        return ExecResult(
            code, f"{command}: cannot run it in {folder['cwd']}: {folder['why']}\n".encode()
        )
    if "executable file not found" in text or "no such file or directory" in text:
        return ExecResult(127, f"{command}: command not found in the sandbox\n".encode())
    if "permission denied" in text:
        return ExecResult(126, f"{command}: permission denied (not an executable file?)\n".encode())
    reason = (
        text.rsplit("unable to start container process:", 1)[-1].strip().removesuffix(": unknown")
    )
    return ExecResult(code, f"{command}: cannot run it: {one_line(reason)}\n".encode())


def create_failed(sandbox_id: str, runtime: str, error: SandboxError) -> SandboxFailed:
    """The one-line error for a refused create, naming the setting to change when known."""
    reason = engine_reason(error)
    if runtime and "runtime" in reason.lower():
        return SandboxFailed(
            f"Docker has no runtime {runtime!r} ({reason}); install it and register it "
            "with dockerd (gVisor: runsc), or unset SANDBOX_KERNEL_RUNTIME / c.SandboxConfig.runtime"
        )
    return SandboxFailed(f"Docker could not create {sandbox_id}: {reason}")
