"""The Docker engine adapter: one container per sandbox (see :mod:`.backend`)."""

from .backend import DockerBackend

__all__ = ["DockerBackend"]
