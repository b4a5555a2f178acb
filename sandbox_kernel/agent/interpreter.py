"""The kernel's interpreter (runs INSIDE the sandbox, stdlib only, Python 3.8+;
IPython is used when the image has it).

One per kernel: it reads requests (execute, complete, inspect, is_complete, history,
comms, input replies, interrupt, shutdown) from the kernel and answers with the
events of :mod:`.wire`. Cells run in the main thread; a reader thread takes requests
as they come, so an interrupt or an input reply acts while a cell runs. Its fds 0 and
1 belong to the protocol; user code gets /dev/null and pipes whose output becomes
streams (:mod:`.output`).
"""

import ast
import codeop
import json
import os
import signal
import sys
import threading
import traceback

from .output import Output, Stream, capture_fd
from .processes import kill_tree, watch_child
from .restrict import restrict_special_files
from .shell import (
    StdinNotImplementedError,
    install_comms,
    make_shell,
    mime_bundle,
    plain_display,
)
from .wire import Wire, send_result


class Agent:
    def __init__(self, wire):
        self.wire = wire
        self.output = Output(wire, int(os.environ.get("SANDBOX_AGENT_OUTPUT_LIMIT") or 10_000_000))
        self.cell_timeout = float(os.environ.get("SANDBOX_AGENT_self.cell_timeout") or 0)
        self.requests = []
        self.cond = threading.Condition()
        self.inputs = []
        self.running = False
        self.main_ident = threading.get_ident()
        self.execution_count = 0
        self.history = []  # (session, line, input)
        self.allow_stdin = False
        self.shell = None
        self.comms = None  # the comm manager, when the image has the comm package
        self.parent = {}  # the Jupyter request being handled (its msg_id), for ipywidgets' Output
        self.namespace = {"__name__": "__main__", "__builtins__": __builtins__}
        if not os.environ.get("SANDBOX_AGENT_NO_IPYTHON"):
            try:
                self.shell = make_shell(self)
            except ImportError:
                self.shell = None

    # -- the reader thread: requests queue up, interrupts and input replies act at once --
    def read_loop(self):
        while True:
            try:
                msg = self.wire.recv()
            except (OSError, ValueError):
                msg = None
            if msg is None:
                self.leave()  # the kernel is gone: never outlive it
            op = msg.get("op")
            if op == "interrupt":
                if self.running:
                    signal.pthread_kill(self.main_ident, signal.SIGINT)
            elif op == "input_reply":
                with self.cond:
                    self.inputs.append(msg.get("value", ""))
                    self.cond.notify_all()
            else:
                with self.cond:
                    self.requests.append(msg)
                    self.cond.notify_all()

    def leave(self):
        """End this interpreter and what its cells left running (background processes,
        daemons: they are all below us or our watcher, both subreapers)."""
        kill_tree(os.getpid())
        os._exit(0)

    def serve(self):
        threading.Thread(target=self.read_loop, daemon=True).start()
        while True:
            with self.cond:
                while not self.requests:
                    self.cond.wait()
                msg = self.requests.pop(0)
            op = msg.get("op")
            if op == "shutdown":
                self.output.flush()
                self.wire.send(ev="reply", content={"status": "ok", "restart": False})
                self.leave()
            request_id = msg.get("id")
            self.wire.send(ev="begin", id=request_id)  # what follows belongs to this request
            handler = getattr(self, "do_" + str(op), None)
            try:
                content = (
                    handler(msg)
                    if handler
                    else {
                        "status": "error",
                        "ename": "ValueError",
                        "evalue": "unknown op %r" % op,
                        "traceback": [],
                    }
                )
            except KeyboardInterrupt:
                content = {
                    "status": "error",
                    "ename": "KeyboardInterrupt",
                    "evalue": "",
                    "traceback": [],
                }
            except Exception as exc:  # an agent bug must not kill the interpreter
                content = {
                    "status": "error",
                    "ename": type(exc).__name__,
                    "evalue": str(exc),
                    "traceback": traceback.format_exc().splitlines(),
                }
            self.output.flush()
            self.wire.send(ev="reply", id=request_id, content=content)

    # -- comms (ipywidgets and friends) -------------------------------------------
    def do_comm(self, msg):
        """A comm_open / comm_msg / comm_close from the frontend, for the comm manager."""
        if self.comms is None:
            return {"status": "ok"}
        import base64

        jmsg = {
            "header": {"msg_type": msg.get("msg_type")},
            "content": msg.get("content") or {},
            "metadata": msg.get("metadata") or {},
            "buffers": [base64.b64decode(b) for b in msg.get("buffers") or []],
        }
        handler = getattr(self.comms, str(msg.get("msg_type")), None)
        if msg.get("msg_type") in ("comm_open", "comm_msg", "comm_close") and handler is not None:
            handler(None, None, jmsg)
        return {"status": "ok"}

    def do_comm_info(self, msg):
        target = msg.get("target_name")
        comms = {}
        if self.comms is not None:
            for comm_id, comm in self.comms.comms.items():
                if target is None or comm.target_name == target:
                    comms[comm_id] = {"target_name": comm.target_name}
        return {"status": "ok", "comms": comms}

    # -- input() ---------------------------------------------------------------
    def read_input(self, prompt="", password=False):
        if not self.allow_stdin:
            raise StdinNotImplementedError(
                "raw_input was called, but this frontend does not support input requests."
            )
        self.output.flush()
        with self.cond:
            self.inputs = []
        self.wire.send(ev="input_request", prompt=str(prompt), password=bool(password))
        with self.cond:
            while not self.inputs:
                self.cond.wait(0.1)  # a timeout keeps KeyboardInterrupt deliverable
            value = self.inputs.pop(0)
        if value == "\x04":
            raise EOFError
        return value

    # -- execute -----------------------------------------------------------------
    def do_execute(self, msg):
        if msg.get("cwd"):
            try:
                os.chdir(msg["cwd"])
            except OSError as exc:
                self.output.write("stderr", "could not change to %s: %s\n" % (msg["cwd"], exc))
        code = msg.get("code", "")
        self.parent = {
            "header": {"msg_id": str(msg.get("msg_id") or ""), "msg_type": "execute_request"}
        }
        silent = bool(msg.get("silent"))
        store = bool(msg.get("store_history", True)) and not silent
        self.allow_stdin = bool(msg.get("allow_stdin"))
        self.output.new_cell()
        timer = None
        if self.cell_timeout > 0:
            timer = threading.Timer(self.cell_timeout, self._timeout)
            timer.daemon = True
            self.timed_out = False
            timer.start()
        self.running = True
        try:
            if self.shell is not None:
                ok, error = self.shell.run(code, store, silent)
                count = self.shell.cell_count
            else:
                if store:
                    self.execution_count += 1
                ok, error = self.run_plain(code, silent)
                count = self.execution_count
        finally:
            self.running = False
            if timer:
                timer.cancel()
            self.output.drain()
        if store:
            self.history.append((1, count, code))
        if not ok:
            if error is None:
                error = {"ename": "Error", "evalue": "", "traceback": []}
            if (
                self.cell_timeout > 0
                and getattr(self, "timed_out", False)
                and error.get("ename") == "KeyboardInterrupt"
            ):
                error["evalue"] = (
                    "cell time limit of %g s reached (SANDBOX_KERNEL_self.cell_timeout)"
                    % self.cell_timeout
                )
            if not silent:
                self.output.flush()
                self.wire.send(ev="error", **error)
            return dict(status="error", execution_count=count, **error)
        user_expressions = {}
        for name, expr in (msg.get("user_expressions") or {}).items():
            user_expressions[name] = self.user_expression(expr)
        payload = []
        if self.shell is not None:  # `obj?` and friends page through payloads, as in ipykernel
            payload = self.shell.payload_manager.read_payload()
            self.shell.payload_manager.clear_payload()
        return {
            "status": "ok",
            "execution_count": count,
            "user_expressions": user_expressions,
            "payload": payload,
        }

    def _timeout(self):
        if self.running:
            self.timed_out = True
            signal.pthread_kill(self.main_ident, signal.SIGINT)

    def user_expression(self, expr):
        try:
            if self.shell is not None:
                return self.shell.user_expressions({"x": expr})["x"]
            value = eval(expr, self.namespace)
            return {"status": "ok", "data": mime_bundle(value), "metadata": {}}
        except Exception as exc:
            return {
                "status": "error",
                "ename": type(exc).__name__,
                "evalue": str(exc),
                "traceback": [],
            }

    def run_plain(self, code, silent):
        """exec everything but a trailing expression, whose value becomes the result."""
        try:
            tree = ast.parse(code, "<cell-%d>" % self.execution_count)
            last = None
            if tree.body and isinstance(tree.body[-1], ast.Expr):
                last = ast.Expression(tree.body.pop().value)
            exec(compile(tree, "<cell-%d>" % self.execution_count, "exec"), self.namespace)
            if last is not None:
                value = eval(
                    compile(last, "<cell-%d>" % self.execution_count, "eval"), self.namespace
                )
                if value is not None and not silent:
                    self.namespace["_"] = value
                    self.output.flush()
                    data = mime_bundle(value)
                    if self.output.allow(data):
                        send_result(self.wire, self.execution_count, data, {})
            return True, None
        except BaseException as exc:  # SystemExit and KeyboardInterrupt included: the cell failed
            if isinstance(exc, SystemExit) and not exc.code:
                return True, None
            tb = traceback.format_exception(type(exc), exc, exc.__traceback__)
            # Drop the agent's own frame from the top of the traceback.
            tb = [line for i, line in enumerate(tb) if not (i == 1 and "sandbox_agent/" in line)]
            return False, {
                "ename": type(exc).__name__,
                "evalue": str(exc),
                "traceback": [line.rstrip("\n") for line in tb],
            }

    # -- introspection -------------------------------------------------------------
    def do_complete(self, msg):
        code, pos = msg.get("code", ""), msg.get("cursor_pos")
        pos = len(code) if pos is None else pos
        if self.shell is not None:
            return self.shell.complete_content(code, pos)
        import rlcompleter

        start = pos
        while start > 0 and (code[start - 1].isalnum() or code[start - 1] in "_."):
            start -= 1
        token = code[start:pos]
        completer = rlcompleter.Completer(self.namespace)
        matches = []
        for i in range(1000):
            match = completer.complete(token, i)
            if match is None:
                break
            matches.append(match.rstrip("("))
        return {
            "status": "ok",
            "matches": sorted(set(matches)),
            "cursor_start": start,
            "cursor_end": pos,
            "metadata": {},
        }

    def do_inspect(self, msg):
        code, pos = msg.get("code", ""), msg.get("cursor_pos")
        pos = len(code) if pos is None else pos
        if self.shell is not None:
            return self.shell.inspect_content(code, pos, msg.get("detail_level", 0))
        start = end = min(pos, len(code))
        while start > 0 and (code[start - 1].isalnum() or code[start - 1] in "_."):
            start -= 1
        while end < len(code) and (code[end].isalnum() or code[end] == "_"):
            end += 1
        name = code[start:end]
        try:
            obj = eval(name, self.namespace) if name else None
        except Exception:
            obj = None
        if not name or obj is None and name not in self.namespace:
            return {"status": "ok", "found": False, "data": {}, "metadata": {}}
        import pydoc

        text = pydoc.plaintext.document(obj)
        return {"status": "ok", "found": True, "data": {"text/plain": text}, "metadata": {}}

    def do_is_complete(self, msg):
        code = msg.get("code", "")
        if self.shell is not None:
            return self.shell.is_complete_content(code)
        try:
            compiled = codeop.compile_command(code, "<cell>", "exec")
        except (SyntaxError, ValueError, OverflowError):
            return {"status": "invalid"}
        if (
            compiled is None
            or code.rstrip("\n").endswith(":")
            or (code.count("\n") and not code.endswith("\n"))
        ):
            if compiled is None:
                return {
                    "status": "incomplete",
                    "indent": "    " if code.rstrip().endswith(":") else "",
                }
        return {"status": "complete"}

    def do_history(self, msg):
        items = self.history
        kind = msg.get("hist_access_type", "tail")
        if kind == "search":
            import fnmatch

            pattern = msg.get("pattern") or "*"
            items = [h for h in items if fnmatch.fnmatch(h[2], pattern)]
            if msg.get("unique"):
                seen, unique = set(), []
                for h in reversed(items):
                    if h[2] not in seen:
                        seen.add(h[2])
                        unique.append(h)
                items = list(reversed(unique))
        elif kind == "range":
            start, stop = msg.get("start") or 0, msg.get("stop")
            items = [h for h in items if h[1] >= start and (stop is None or h[1] < stop)]
        n = msg.get("n")
        if n and kind in ("tail", "search"):
            items = items[-int(n) :]
        if msg.get("output"):
            history = [[s, line, [src, None]] for s, line, src in items]
        else:
            history = [list(h) for h in items]
        return {"status": "ok", "history": history}


def enable_user_site():
    """Put the user's site-packages on sys.path where Python would, before the system's,
    and run its ``.pth`` files; made first, so that a package the first ``%pip
    install`` of a fresh sandbox puts there is importable without a restart.

    The interpreter starts without it (``-s``): a cell can write there, and code of a
    ``.pth`` file runs at start-up, before this process restricts itself (see
    restrict.py). Here it runs after, as a cell would.
    """
    import site

    if os.getuid() != os.geteuid():
        return  # what Python itself does for a set-uid interpreter
    try:
        path = site.getusersitepackages()
        os.makedirs(path, exist_ok=True)
    except OSError:
        return
    if path in sys.path:
        return
    before = list(sys.path)
    site.addsitedir(path)
    added = [p for p in sys.path if p not in before]
    system = set(site.getsitepackages())
    at = next((i for i, p in enumerate(before) if p in system), len(before))
    sys.path[:] = before[:at] + added + before[at:]
    site.ENABLE_USER_SITE = True


def use_user_path():
    """Put the user's ``~/.local/bin`` first on PATH for what cells start (``pip install
    --user`` puts scripts there), as user_command.py does for the user's commands. The
    sandbox's own PATH leaves it out: the host's programs must not find a ``python3`` a
    cell planted there."""
    mine = os.path.expanduser("~/.local/bin")
    path = os.environ.get("PATH", "")
    if mine not in path.split(os.pathsep):
        os.environ["PATH"] = mine + os.pathsep + path if path else mine


def read_stdin_line(limit=512):
    """One line from fd 0, byte by byte (what follows is the protocol, not ours to read)."""
    line = b""
    while len(line) < limit:
        byte = os.read(0, 1)
        if not byte or byte == b"\n":
            break
        line += byte
    return line.decode("ascii", "replace").strip()


def connect_kernel():
    """The kernel's socket, past the engine's exec stream (the Docker backend's sockets
    module), or None: stdin and stdout stay the channel. The environment only says that
    there is one; its path and token come on stdin, right after the agent's source."""
    if os.environ.pop("SANDBOX_AGENT_CHANNEL", "") != "1":
        return None
    try:
        offer = json.loads(read_stdin_line() or "{}")
        path, token = offer.get("path"), offer.get("token")
    except (ValueError, AttributeError):
        return None
    if not isinstance(path, str) or not isinstance(token, str):
        return None
    import socket

    sock = socket.socket(socket.AF_UNIX)
    sock.settimeout(5)
    try:
        sock.connect(path)
        sock.sendall(token.encode("ascii", "replace") + b"\n")
    except OSError:
        sock.close()
        return None
    sock.settimeout(None)
    return sock


def send_ready(wire, channel=False, spare=False):
    """Tell the kernel we are here, before the slow part (building IPython's shell): the
    kernel answers kernel_info and its client settles meanwhile; requests wait in the pipe."""
    import importlib.util

    ipython = (
        not os.environ.get("SANDBOX_AGENT_NO_IPYTHON")
        and importlib.util.find_spec("IPython") is not None
    )
    wire.send(
        ev="ready",
        python_version="%d.%d.%d" % sys.version_info[:3],
        ipython=ipython,
        pid=os.getpid(),
        channel=channel,  # True: all else goes over the kernel's socket
        spare=spare,  # True: forked by the sandbox's warm spare
    )


def main(spare=False):
    """The kernel's interpreter: started cold by the start program, or forked by the
    warm spare (``spare``) with the kernel's fds and settings in place."""
    watch_child()
    kernel = connect_kernel()
    # The kernel's host folders: nothing here may plant links or FIFOs there, and no
    # user code has run yet (the user's site comes after).
    restrict_special_files(
        json.loads(os.environ.pop("SANDBOX_AGENT_NO_SPECIAL_FILES", "[]") or "[]")
    )
    wire = Wire()
    send_ready(wire, channel=kernel is not None, spare=spare)
    if kernel is not None:
        wire.move_to(kernel)
    enable_user_site()
    use_user_path()
    # fd 0 and 1 now belong to the protocol; user code gets /dev/null and pipes.
    devnull = os.open(os.devnull, os.O_RDONLY)
    os.dup2(devnull, 0)
    os.close(devnull)
    agent = Agent(wire)
    agent.output.start()
    capture_fd(1, "stdout", agent.output)
    capture_fd(2, "stderr", agent.output)
    sys.stdout = Stream(agent.output, "stdout")
    sys.stderr = Stream(agent.output, "stderr")
    sys.stdin = open(os.devnull)
    import builtins
    import getpass

    builtins.input = lambda prompt="": agent.read_input(prompt)
    getpass.getpass = lambda prompt="Password: ", stream=None: agent.read_input(
        prompt, password=True
    )
    agent.comms = install_comms(agent)
    if agent.shell is None:
        display, clear_output = plain_display(agent)
        builtins.display = display
        agent.namespace["display"] = display
        agent.namespace["clear_output"] = clear_output
    signal.signal(signal.SIGINT, signal.default_int_handler)
    # The working folder first, as ipykernel has it (cells import the notebook's modules);
    # the start left it out (see boot.py).
    sys.path.insert(0, "")
    agent.serve()
