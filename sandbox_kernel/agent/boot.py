# The start program of every program of ours in a sandbox, passed with `python3 -c`:
#   python3 -s -u -c <this file> N [ARG...]   the N bytes of a bundle follow on stdin
#   python3 -I -c "BUNDLE = {...}" + <this file> [ARG...]   the bundle is written in
# A bundle is {"version", "main", "modules": [[name, source], ...]}: the modules become
# the package `sandbox_agent` (each imported when first asked for) and MAIN's main()
# runs. A cell can write the working folder, which `-c` puts first on sys.path: it goes
# before the first import (os and sys are loaded already). Python 3.8 syntax, stdlib only.
import os
import sys

if sys.path and sys.path[0] in ("", os.getcwd()):
    del sys.path[0]


def read_bundle(size):
    """The bundle: exactly ``size`` bytes of stdin (what follows is the program's)."""
    import json

    data = b""
    while len(data) < size:
        chunk = os.read(0, size - len(data))
        if not chunk:
            sys.exit("sandbox agent: its source was cut short")
        data += chunk
    return json.loads(data.decode("utf-8"))


def install(bundle):
    """Make the bundle's modules importable as the package ``sandbox_agent``."""
    import importlib.util
    import types

    sources = dict(bundle["modules"])
    package = types.ModuleType("sandbox_agent")
    package.__path__ = []
    package.VERSION = bundle["version"]
    sys.modules["sandbox_agent"] = package

    class Loader:
        @staticmethod
        def create_module(spec):
            return None

        @staticmethod
        def exec_module(module):
            name = module.__name__.rpartition(".")[2]
            code = compile(sources[name], "sandbox_agent/%s.py" % name, "exec")
            exec(code, module.__dict__)

    class Finder:
        @staticmethod
        def find_spec(fullname, path=None, target=None):
            parent, _, name = fullname.rpartition(".")
            if parent == "sandbox_agent" and name in sources:
                return importlib.util.spec_from_loader(fullname, Loader)
            return None

    sys.meta_path.insert(0, Finder)
    return importlib.import_module("sandbox_agent." + bundle["main"])


if __name__ == "__main__":
    main_module = install(globals().get("BUNDLE") or read_bundle(int(sys.argv.pop(1))))
    sys.exit(main_module.main())
