"""Daytona's API errors as ours, each with what to do, and its rate limit (429) waited
out with backoff."""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any, TypeVar

from daytona.common.errors import (
    DaytonaAuthenticationError,
    DaytonaConflictError,
    DaytonaError,
    DaytonaForbiddenError,
    DaytonaNotFoundError,
    DaytonaRateLimitError,
)

from ..base import EngineUnavailable, SandboxError

T = TypeVar("T")
# Rate-limit retries: 0.5 s doubling to 8 s, about 30 s in all before giving up.
RETRY_DELAYS = (0.5, 1, 2, 4, 8, 8, 8)


def call(fn: Callable[..., T], *args: Any, what: str = "", **kwargs: Any) -> T:
    """``fn(*args, **kwargs)``, one SDK call about ``what``: 429 retried with backoff,
    errors turned into ours with a clear message (not found and conflicts left to the
    caller: a missing sandbox, a lost create race)."""
    for delay in (*RETRY_DELAYS, None):
        try:
            return fn(*args, **kwargs)
        except DaytonaRateLimitError:
            if delay is None:
                raise EngineUnavailable(
                    f"Daytona kept answering 429 (rate limit) to {what or 'a request'} for "
                    "half a minute; wait a moment and try again, or raise your organization's limits"
                ) from None
            time.sleep(delay)
        except DaytonaAuthenticationError:
            raise EngineUnavailable(
                "Daytona refused the API key (401): check DAYTONA_API_KEY (and DAYTONA_API_URL)"
            ) from None
        except DaytonaForbiddenError as exc:
            raise SandboxError(
                f"Daytona refused {what or 'the request'} (403): {message(exc)}; "
                "the API key needs sandbox, volume and snapshot permissions"
            ) from None
        except (DaytonaNotFoundError, DaytonaConflictError):
            raise  # callers decide: a missing sandbox, a lost create race
        except DaytonaError as exc:
            status = getattr(exc, "status_code", None)
            code = f" ({status})" if status else ""
            said = f"Daytona failed to {what or 'answer'}{code}: {message(exc)}"
            if status and 400 <= status < 500:
                raise SandboxError(said) from None
            # 5xx and dropped connections: the service (or the sandbox's runner) is unwell.
            raise EngineUnavailable(said) from None
    raise AssertionError("unreachable")


def message(exc: DaytonaError) -> str:
    """The first line of a Daytona error (or its class name when it has none)."""
    return str(exc).strip().splitlines()[0] if str(exc).strip() else exc.__class__.__name__
