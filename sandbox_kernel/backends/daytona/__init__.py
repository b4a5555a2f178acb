"""The Daytona adapter: sandboxes through the ``daytona`` SDK (see :mod:`.backend`), our
agent over the daemon's PTY sessions (:mod:`.channel`), ports through Daytona's own
preview links (:mod:`.preview`), and the administrator's volumes by name (:mod:`.mapped`).

:class:`DaytonaBackend` is imported when first asked for: the SDK takes a second to
import, and the parts that need no SDK (preview links, egress rules) are imported alone.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from .backend import DaytonaBackend

__all__ = ["DaytonaBackend"]


def __getattr__(name: str) -> Any:
    if name == "DaytonaBackend":
        from .backend import DaytonaBackend

        return DaytonaBackend
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
