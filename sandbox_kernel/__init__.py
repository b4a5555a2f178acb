"""sandbox-kernel: a Jupyter kernel whose cells run inside a persistent sandbox."""

__version__ = "0.1.0"
