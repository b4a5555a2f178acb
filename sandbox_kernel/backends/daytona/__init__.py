"""The Daytona adapter: sandboxes through the ``daytona`` SDK (see :mod:`.backend`), our
agent over the daemon's PTY sessions (:mod:`.channel`), ports through Daytona's own
preview links (:mod:`.preview`), and the administrator's volumes by name (:mod:`.mapped`)."""

from .backend import DaytonaBackend

__all__ = ["DaytonaBackend"]
