"""sandbox-kernel: a Jupyter kernel whose cells run inside a persistent sandbox."""

from importlib.metadata import PackageNotFoundError, version

try:  # one version for the package and its lab extension: labextension/package.json's
    __version__ = version("sandbox-kernel")
except PackageNotFoundError:  # a source tree used without installing it
    __version__ = "0+unknown"
