"""The Daytona adapter: sandboxes through the ``daytona`` SDK (see :mod:`.backend`) and
our agent over the daemon's PTY sessions (:mod:`.channel`)."""

from .backend import DaytonaBackend

__all__ = ["DaytonaBackend"]
