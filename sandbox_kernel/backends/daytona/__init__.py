"""The Daytona adapter: sandboxes through the ``daytona`` SDK (see :mod:`.backend`), our
agent over the daemon's PTY sessions (:mod:`.channel`), and ports through Daytona's own
preview links (:mod:`.preview`)."""

from .backend import DaytonaBackend

__all__ = ["DaytonaBackend"]
