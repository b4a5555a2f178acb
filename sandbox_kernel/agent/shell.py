"""The interpreter's Python side: IPython's shell when the image has IPython, plain
Python with ``display()`` and rich ``_repr_*_`` results when not, and comms for
ipywidgets (runs INSIDE the sandbox, stdlib only beyond IPython itself).
"""

import os
import sys
import threading

from .output import tidy_bundle
from .wire import send_display, send_result


class StdinNotImplementedError(RuntimeError):
    """Same name and meaning as IPython's: the frontend cannot answer input()."""


def mime_bundle(value):
    """text/plain plus whatever _repr_*_ methods the object offers."""
    data = {"text/plain": repr(value)}
    for method, mime in (
        ("_repr_html_", "text/html"),
        ("_repr_markdown_", "text/markdown"),
        ("_repr_svg_", "image/svg+xml"),
        ("_repr_png_", "image/png"),
        ("_repr_jpeg_", "image/jpeg"),
        ("_repr_latex_", "text/latex"),
        ("_repr_json_", "application/json"),
    ):
        fn = getattr(value, method, None)
        if callable(fn):
            try:
                out = fn()
            except Exception:
                continue
            if isinstance(out, tuple):
                out = out[0]
            if out is None:
                continue
            if isinstance(out, bytes):
                import base64

                out = base64.b64encode(out).decode("ascii")
            data[mime] = out
    return data


def plain_display(agent):
    """display(), update_display and clear_output for the stdlib path (no IPython)."""

    def display(*objs, display_id=None, update=False, raw=False, metadata=None, **_):
        agent.output.flush()
        transient = {"display_id": display_id} if display_id else {}
        for obj in objs:
            data = obj if raw else mime_bundle(obj)
            if not agent.output.allow(data):
                return
            send_display(agent.wire, data, metadata or {}, transient, update)

    def clear_output(wait=False):
        agent.output.flush()
        agent.wire.send(ev="clear", wait=bool(wait))

    return display, clear_output


def install_comms(agent):
    """Comms (ipywidgets, anything built on the ``comm`` package) talk to the frontend
    through our wire: the package lets a kernel supply its comm class and manager."""
    try:
        import comm
        from comm.base_comm import BaseComm, CommManager
    except ImportError:
        return None
    import base64

    class WireComm(BaseComm):
        def publish_msg(self, msg_type, data=None, metadata=None, buffers=None, **keys):
            agent.output.flush()
            content = dict(keys, data=data or {}, comm_id=self.comm_id)
            encoded = [base64.b64encode(bytes(b)).decode("ascii") for b in buffers or []]
            agent.wire.send(
                ev="comm",
                msg_type=msg_type,
                content=content,
                metadata=metadata or {},
                buffers=encoded,
            )

    manager = CommManager()
    comm.create_comm = WireComm
    comm.get_comm_manager = lambda: manager
    return manager


class ParentOnly:
    """Stands for ipykernel's kernel object where libraries only ask for the request
    being handled (``get_ipython().kernel.get_parent()``)."""

    def __init__(self, agent):
        self._agent = agent

    def get_parent(self, channel="shell"):
        return self._agent.parent


def import_ipython_core():
    """Import the part of IPython that a shell needs; the package's own ``__init__``
    (its terminal: prompt_toolkit, the embed machinery, a third of IPython's import
    time) waits until something asks the package for a name it has not got.

    Why: after a cold start says it is ready, the client's first cell would wait for
    the whole import, longer than the client's own settling. Nothing changes for the user but when: ``get_ipython``, which IPython's own
    modules take from the package as they load, is served from where it lives; any
    other name (``IPython.__version__``, ``IPython.embed``, ``from IPython import
    display``, ``dir(IPython)``) first runs the real ``__init__``, once, so every name is
    there as after a plain ``import IPython``. IPython 7, whose ``__init__`` also puts
    its extensions folder on sys.path (``%load_ext autoreload``), is imported whole at
    once. A package imported already is left as it is; a failed import leaves nothing
    behind and raises ImportError, as the plain import would."""
    import importlib.util

    stub = None
    if "IPython" not in sys.modules:
        spec = importlib.util.find_spec("IPython")
        if spec is None or spec.loader is None or spec.submodule_search_locations is None:
            raise ImportError("No module named 'IPython'")
        stub, complete = lazy_ipython(spec)
        sys.modules["IPython"] = stub
    try:
        if stub is not None:
            from IPython.core import release

            if tuple(release.version_info[:1]) < (8,):
                complete()
        import IPython.core.displayhook  # noqa: F401
        import IPython.core.displaypub  # noqa: F401
        import IPython.core.interactiveshell  # noqa: F401
    except BaseException:
        if stub is not None and sys.modules.get("IPython") is stub:
            for name in [n for n in sys.modules if n == "IPython" or n.startswith("IPython.")]:
                del sys.modules[name]
        raise


def lazy_ipython(spec):
    """IPython's package made but not run, and the function that runs its ``__init__``
    (see :func:`import_ipython_core`), once: other threads wait for it, and the thread
    running it sees the package partial, as during any import. If the ``__init__``
    fails, names it would have made raise AttributeError saying why (``hasattr`` and
    pickle's search of sys.modules expect nothing else), and it is not run again."""
    import importlib.util

    package = importlib.util.module_from_spec(spec)
    lock = threading.RLock()
    state = []  # "running", then "done" or the exception the __init__ raised

    def complete():
        with lock:
            if "__version__" in package.__dict__ and not state:
                state.append("done")  # importlib.reload ran it meanwhile
            if not state:
                state.append("running")
                try:
                    spec.loader.exec_module(package)
                    state[0] = "done"
                except Exception as exc:
                    state[0] = exc
            if state[0] == "done":
                for name, hook in (("__getattr__", __getattr__), ("__dir__", __dir__)):
                    if package.__dict__.get(name) is hook:
                        del package.__dict__[name]

    def __getattr__(name):
        if name == "get_ipython":
            from IPython.core.getipython import get_ipython

            return get_ipython
        complete()
        if package.__dict__.get("__getattr__") is not __getattr__:
            return getattr(package, name)  # whole now (its own __getattr__, if it has one)
        failed = state[0] if isinstance(state[0], Exception) else None
        why = " (its __init__ failed: %r)" % failed if failed else " (partially initialized)"
        raise AttributeError("module 'IPython' has no attribute %r%s" % (name, why)) from failed

    def __dir__():
        complete()
        return sorted(package.__dict__)

    package.__getattr__ = __getattr__
    package.__dir__ = __dir__
    return package, complete


def make_shell(agent):
    """An IPython InteractiveShell whose display machinery speaks our protocol."""
    import_ipython_core()
    from IPython.core.displayhook import DisplayHook
    from IPython.core.displaypub import DisplayPublisher
    from IPython.core.interactiveshell import InteractiveShell

    class Publisher(DisplayPublisher):
        def publish(
            self, data, metadata=None, source=None, *, transient=None, update=False, **kwargs
        ):
            agent.output.flush()
            data = tidy_bundle(data)
            if not agent.output.allow(data):
                return
            send_display(agent.wire, data, metadata or {}, transient or {}, update)

        def clear_output(self, wait=False):
            agent.output.flush()
            agent.wire.send(ev="clear", wait=bool(wait))

    class Hook(DisplayHook):
        def start_displayhook(self):
            self.msg = {"data": {}, "metadata": {}}

        def write_output_prompt(self):
            pass

        def write_format_data(self, format_dict, md_dict=None):
            self.msg["data"] = tidy_bundle(format_dict)
            self.msg["metadata"] = md_dict or {}

        def finish_displayhook(self):
            agent.output.flush()
            if not agent.output.allow(self.msg["data"]):
                return
            send_result(agent.wire, self.shell.cell_count, self.msg["data"], self.msg["metadata"])

    from traitlets import Type

    class Shell(InteractiveShell):
        displayhook_class = Type(Hook)
        display_pub_class = Type(Publisher)
        cell_count = 0

        def init_io(self):
            pass

        def enable_gui(self, gui=None):
            pass

        def ask_exit(self):
            pass

        def run(self, code, store, silent):
            """Run a cell; return (ok, error content) like the Jupyter reply needs.

            ``cell_count`` is the number Jupyter shows for the cell: its own when stored,
            else the last stored one's, as ipykernel reports. IPython versions differ
            in when they count (before or after running), so it is fixed here, before.
            """
            self.last_error = None
            self.cell_count = self.execution_count if store else self.execution_count - 1
            result = self.run_cell(code, store_history=store, silent=silent)
            if result.success:
                return True, None
            return False, self.last_error or {
                "ename": "Error",
                "evalue": str(result.error_in_exec or result.error_before_exec),
                "traceback": [],
            }

        def _showtraceback(self, etype, evalue, stb):
            self.last_error = {
                "ename": getattr(etype, "__name__", str(etype)),
                "evalue": str(evalue),
                "traceback": stb,
            }

        def complete_content(self, code, pos):
            from IPython.core.completer import provisionalcompleter

            with provisionalcompleter():
                completions = list(self.Completer.completions(code, pos))
            if completions:
                start = min(c.start for c in completions)
                end = max(c.end for c in completions)
                matches = [code[start : c.start] + c.text + code[c.end : end] for c in completions]
            else:
                start = end = pos
                matches = []
            seen = []
            for m in matches:
                if m not in seen:
                    seen.append(m)
            return {
                "status": "ok",
                "matches": seen,
                "cursor_start": start,
                "cursor_end": end,
                "metadata": {},
            }

        def inspect_content(self, code, pos, detail_level):
            from IPython.utils.tokenutil import token_at_cursor

            name = token_at_cursor(code, pos)
            try:
                bundle = self.object_inspect_mime(name, detail_level=detail_level)
                if not self.enable_html_pager:
                    bundle.pop("text/html", None)
                return {"status": "ok", "found": True, "data": bundle, "metadata": {}}
            except KeyError:
                return {"status": "ok", "found": False, "data": {}, "metadata": {}}

        def is_complete_content(self, code):
            status, indent = self.input_transformer_manager.check_complete(code)
            content = {"status": status}
            if status == "incomplete":
                content["indent"] = " " * (indent or 0)
            return content

    from traitlets.config import Config

    config = Config()
    # The kernel keeps the history it serves; IPython's SQLite history only costs start-up time.
    config.HistoryManager.enabled = False
    shell = Shell.instance(
        config=config, colors="NoColor" if os.environ.get("SANDBOX_AGENT_NO_COLOR") else "Linux"
    )
    # What ipywidgets' Output widget asks ipykernel (the request whose outputs it takes).
    shell.kernel = ParentOnly(agent)
    shell.enable_html_pager = False
    from IPython.core import page, payloadpage

    shell.set_hook("show_in_pager", page.as_hook(payloadpage.page), 99)
    shell.readline_use = False
    shell.autoindent = False
    shell.has_readline = False
    import builtins

    builtins.input = lambda prompt="": agent.read_input(prompt)
    shell.raw_input_original = builtins.input
    return shell
