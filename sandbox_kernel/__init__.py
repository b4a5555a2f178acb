"""sandbox-kernel: a Jupyter kernel whose cells run inside a persistent sandbox."""


def __getattr__(name: str) -> str:
    """``__version__``, read from the installed package when first asked for: importing
    importlib.metadata costs about 30 ms, and a kernel's start seeks its sandbox before
    anything asks (see early_start)."""
    if name != "__version__":
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    from importlib.metadata import PackageNotFoundError, version

    try:  # one version for the package and its lab extension: labextension/package.json's
        value = version("sandbox-kernel")
    except PackageNotFoundError:  # a source tree used without installing it
        value = "0+unknown"
    globals()["__version__"] = value
    return value
