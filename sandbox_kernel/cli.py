"""The ``sandbox-kernel`` command: a thin shell over the backends.

Every command prints one plain line on failure (what went wrong and what to do) and
exits non-zero: 1 for a sandbox or engine problem, 2 for bad arguments or settings.
"""

from __future__ import annotations

import argparse
import inspect
import json
import logging
import os
import re
import shutil
import sys
import tempfile
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from . import __version__
from .backends.base import SandboxInfo
from .config import ConfigError, SandboxConfig, load_config
from .errors import SandboxError, SandboxNotFound
from .identity import scope_key
from .kernelspec import DISPLAY_NAME, kernelspec, safe_flags
from .service import SandboxService
from .units import format_size

KERNEL_NAME = "sandbox"


def _config(args: argparse.Namespace) -> SandboxConfig:
    return load_config(
        backend=getattr(args, "backend", None),
        scope=getattr(args, "scope", None),
        image=getattr(args, "image", None),
        snapshot=getattr(args, "snapshot", None),
        flavor=getattr(args, "flavor", None) if getattr(args, "command", "") != "install" else None,
    )


def _service(args: argparse.Namespace) -> tuple[SandboxConfig, SandboxService]:
    cfg = _config(args)
    return cfg, SandboxService(cfg)


def _services(args: argparse.Namespace) -> tuple[SandboxConfig, list[SandboxService]]:
    """The engine's service, and with backend ``auto`` the local one too when it holds
    sandboxes: made while no engine answered, they are still yours to see and manage."""
    cfg, service = _service(args)
    services = [service]
    if cfg.backend == "auto" and service.backend.name != "local":
        local = SandboxService(service.config_with(backend="local"))
        if any((Path(cfg.state_dir) / "local").glob("*.json")):
            services.append(local)
    return cfg, services


def _service_of(services: list[SandboxService], sandbox_id: str | None) -> SandboxService:
    """The service whose backend has ``sandbox_id`` (the first one for none): an id that
    a Docker and a local sandbox share must be told apart by naming the backend."""
    if not sandbox_id:
        return services[0]
    found = [s for s in services if s.backend.find(sandbox_id)]
    if len(found) > 1:
        names = " and ".join(s.backend.name for s in found)
        raise _UsageError(
            f"{sandbox_id} names a {names} sandbox; say which with --backend "
            f"{found[0].backend.name} or --backend {found[1].backend.name}"
        )
    return found[0] if found else services[0]


def _user(cfg: SandboxConfig, args: argparse.Namespace) -> str | None:
    """Whose sandboxes a command acts on: yours, or everyone's with --all (administrators)."""
    return None if getattr(args, "all", False) else scope_key(cfg).user


def _age(seconds: float) -> str:
    seconds = max(0, int(seconds))
    for unit, size in (("d", 86400), ("h", 3600), ("m", 60)):
        if seconds >= size:
            return f"{seconds // size}{unit}"
    return f"{seconds}s"


def _print_table(items: list[dict[str, Any]], state_dir: str = "") -> None:
    rows = [
        (
            "ID",
            "STATE",
            "BACKEND",
            "SCOPE",
            "USER",
            "FLAVOR",
            "DISK",
            "IMAGE",
            "AGE",
            "KERNELS",
            "FOLDER",
        )
    ]
    now = time.time()
    for i in items:
        kernels = f"{i['kernels']}" + (
            f" ({len(i['busy_kernel_ids'])} busy)" if i["busy_kernel_ids"] else ""
        )
        rows.append(
            (
                i["id"],
                i["state"],
                i["backend"],
                i["scope"],
                i["user"],
                i["flavor"],
                _disk_column(i),
                i["image"],
                _age(now - i["created"]),
                kernels,
                _folder(i.get("work_folder") or ""),
            )
        )
    widths = [max(len(str(r[c])) for r in rows) for c in range(len(rows[0]))]
    for row in rows:
        print("  ".join(str(v).ljust(w) for v, w in zip(row, widths, strict=True)).rstrip())
    for i in items:
        if i.get("volumes"):
            mapped = ", ".join(f"{v['target']} ({v['mode']})" for v in i["volumes"])
            print(f"{i['id']}: mapped folders: {mapped}")
        if i.get("remake"):
            print(f"{i['id']}: outdated ({i['outdated']}); {i['remake']}")
        elif i.get("outdated"):
            print(
                f"{i['id']}: outdated ({i['outdated']}); `sandbox-kernel destroy {i['id']}` to remake it"
            )
        nxt = i.get("next") or {}
        if nxt.get("action"):
            print(f"{i['id']}: will {nxt['action']} in {_age(nxt['at'] - now)} ({nxt['reason']})")
        if i.get("disk_note"):
            print(f"{i['id']}: disk: {i['disk_note']}")
    for isolation in sorted({i["isolation"] for i in items if i["isolation"]}):
        print(f"isolation: {isolation}")
    guard = _guard_note(items, state_dir)
    if guard:
        print(guard)
    ids = [i["id"] for i in items]
    for shared in sorted({x for x in ids if ids.count(x) > 1}):
        print(f"{shared}: a sandbox of each backend has this id; name one with --backend")


def _guard_note(items: list[dict[str, Any]], state_dir: str) -> str:
    """One line when protected names made after a start are not refused by the kernel
    in the listed Docker sandboxes' writable folders (as the last start found), and why."""
    from .backends.lsm_guard import remembered

    if not any(i["backend"] == "docker" and i.get("work_folder") for i in items):
        return ""
    why = remembered(state_dir)
    return f"protected names made after a start: not refused by the kernel ({why})" if why else ""


def _folder(path: str) -> str:
    """The host folder a sandbox mounts at its own path (``~`` for the home), or where its
    cells run without one."""
    if not path:
        return "/workspace only"
    home = str(Path.home())
    return "~" + path[len(home) :] if path == home or path.startswith(home + "/") else path


def _disk_column(item: dict[str, Any]) -> str:
    """Disk use against its size: the sandbox's own files, then its workspace's ("-": not
    bounded, "?" for use the host cannot see)."""
    parts = []
    for key, prefix in (("disk", ""), ("workspace_disk", "ws ")):
        limit = (item.get("limits") or {}).get(key)
        used = (item.get("usage") or {}).get(key)
        if limit:
            shown = "?" if used is None else format_size(used)
            parts.append(f"{prefix}{shown}/{format_size(limit)}")
    return ", ".join(parts) or "-"


def cmd_list(args: argparse.Namespace) -> int:
    """List this user's sandboxes (or everyone's with --all)."""
    cfg, services = _services(args)
    items = [item for service in services for item in service.list(_user(cfg, args))]
    if args.json:
        print(json.dumps(items, indent=2))
    elif items:
        _print_table(items, cfg.state_dir)
    else:
        print("no sandboxes yet; `sandbox-kernel exec -- python3 -V` creates yours")
    return 0


def cmd_exec(args: argparse.Namespace) -> int:
    """Run a command in a sandbox; without an id, in the current user's (created if needed).

    `exec python3 -V`, `exec sk-alice ls -l` and `exec -- CMD` all work: a first word
    that is a sandbox id (sk-...) names the sandbox, unless -- comes first.
    """
    args.id, args.cmd = _id_and_command(args.words, args.cmd)
    if not args.cmd:
        raise _UsageError("nothing to run: give a command, e.g. `sandbox-kernel exec -- ls -l`")
    cfg, services = _services(args)
    service = _service_of(services, args.id)
    here = os.getcwd()
    if args.id:
        info = service.owned(_user(cfg, args), args.id)
    else:
        info = _own_sandbox(cfg, service, here)
    inside = info.work_folder and (
        here == info.work_folder or here.startswith(info.work_folder + "/")
    )
    result = service.exec(
        info,
        service.as_user(info, list(args.cmd)),
        timeout=args.timeout,
        cwd=here if inside else "",
    )
    sys.stdout.buffer.write(result.output)
    sys.stdout.flush()
    return result.exit_code


def cmd_shell(args: argparse.Namespace) -> int:
    """An interactive login shell in a sandbox; without an id, the current user's (created if needed).

    A real terminal inside the sandbox: colours, window resizing, Ctrl-C and
    full-screen programs work, and the shell's exit status is the command's. It
    starts where `exec` would run (the folder you are in when the sandbox has it,
    else /workspace). Standard input must be a terminal; `exec` runs commands without.
    """
    from .terminal import run_shell

    if not os.isatty(0):
        raise _UsageError(
            "standard input is not a terminal; `sandbox-kernel exec [ID] -- CMD` runs a "
            "command without one"
        )
    cfg, services = _services(args)
    service = _service_of(services, args.id)
    here = os.getcwd()
    if args.id:
        info = service.owned(_user(cfg, args), args.id)
        if info.state != "running":
            service.start(_user(cfg, args), args.id, progress=lambda m: print(m, file=sys.stderr))
            info = service.owned(_user(cfg, args), args.id)
    else:
        info = _own_sandbox(cfg, service, here)
    inside = info.work_folder and (
        here == info.work_folder or here.startswith(info.work_folder + "/")
    )
    return run_shell(service, info, cwd=here if inside else "")


def _own_sandbox(cfg: SandboxConfig, service: SandboxService, here: str) -> SandboxInfo:
    """Your sandbox for the folder ``here``, as a notebook's kernel here would have it
    (made or started as needed); what changed is said on stderr."""
    key = scope_key(cfg)
    ensured = service.ensure(
        key,
        progress=lambda m: print(m, file=sys.stderr),
        work_folder=service.work_folder(here, user=key.user),
    )
    lines = ([ensured.notice] if ensured.notice else []) + ensured.notes
    if service.backend.fallback and ensured.event == "created":
        lines.append(
            f"{service.backend.fallback}, so {ensured.info.id} runs on the local backend "
            f"({ensured.info.isolation}); start Docker for container isolation"
        )
    for line in lines:
        print(line, file=sys.stderr)
    return ensured.info


def _id_and_command(
    words: list[str], after_dashes: list[str] | None
) -> tuple[str | None, list[str]]:
    if after_dashes is not None:  # exec [ID] -- CMD
        if len(words) > 1:
            raise _UsageError(f"only a sandbox id may come before --, not {' '.join(words)!r}")
        return (words[0] if words else None), after_dashes
    if words and words[0].startswith("sk-"):
        return words[0], words[1:]
    return None, words


def _one(action: str):
    def run(args: argparse.Namespace) -> int:
        cfg, services = _services(args)
        user = _user(cfg, args)
        service = _service_of(services, args.id)
        if action == "destroy":
            try:
                gone = service.destroy(user, args.id)
            except SandboxNotFound:
                gone = False  # destroying what is gone is done: scripts may repeat it
            print(
                f"destroyed {args.id} (workspace kept)" if gone else f"{args.id} was already gone"
            )
            return 0
        item = getattr(service, action)(user, args.id)
        print(json.dumps(item, indent=2) if args.json else f"{item['id']}: {item['state']}")
        return 0

    run.__doc__ = {
        "stop": "Stop a sandbox; its filesystem is kept.",
        "start": "Start a stopped sandbox.",
        "destroy": "Remove a sandbox; the workspace folder is kept.",
    }[action]
    return run


def cmd_gc(args: argparse.Namespace) -> int:
    """Stop idle sandboxes, remove long-stopped ones and orphans (workspaces kept)."""
    from .lifecycle import gc

    cfg, service = _service(args)
    actions = gc(service.backend, cfg, dry_run=args.dry_run)
    if args.json:
        print(json.dumps([a.to_dict() for a in actions], indent=2))
        return 1 if any(a.error for a in actions) else 0
    if not actions:
        print("nothing to do now")
    for a in actions:
        state = (
            "would " + a.action
            if args.dry_run
            else (a.action if a.done else f"failed to {a.action}")
        )
        print(f"{a.sandbox_id}: {state} ({a.reason}){': ' + a.error if a.error else ''}")
    if args.dry_run:  # what is coming, and what is kept although it differs
        now = time.time()
        for item in service.list(None):
            nxt = item.get("next") or {}
            if nxt.get("action") and nxt["at"] > now:
                print(
                    f"{item['id']}: will {nxt['action']} in {_age(nxt['at'] - now)} ({nxt['reason']})"
                )
            if item.get("outdated"):
                print(f"{item['id']}: kept, although {item['outdated']}")
    return 1 if any(a.error for a in actions) else 0


def cmd_stats(args: argparse.Namespace) -> int:
    """Sandboxes of this installation by state and flavor, memory and CPU reserved and used, quota headroom."""
    cfg, service = _service(args)
    totals = service.stats(scope_key(cfg).user)
    if args.json:
        print(json.dumps(totals, indent=2))
        return 0
    print(
        f"backend: {totals['backend']}   sandboxes of this installation, all users: {totals['sandboxes']} (yours: {totals['yours']})"
    )
    print(
        "by state: " + (", ".join(f"{k} {v}" for k, v in sorted(totals["by_state"].items())) or "-")
    )
    print(
        "by flavor: "
        + (", ".join(f"{k} {v}" for k, v in sorted(totals["by_flavor"].items())) or "-")
    )
    mem = totals["memory"]
    print(f"memory: {format_size(mem['reserved'])} reserved, {format_size(mem['used'])} used")
    print(f"cpus reserved: {totals['cpus']['reserved']:g}")
    disk = totals["disk"]
    if disk["sandboxes"] or disk["workspaces"]:
        print(
            f"disk: sandboxes' own files {format_size(disk['sandboxes_used'])} used of "
            f"{format_size(disk['sandboxes'])}, workspaces {format_size(disk['workspaces_used'])} "
            f"used of {format_size(disk['workspaces'])}"
        )
    if disk["note"]:
        print(f"disk not bounded for new sandboxes: {disk['note']}")
    if disk["unbounded"]:
        print(f"disk not bounded (`list` says why): {', '.join(disk['unbounded'])}")
    quota = totals["quota"]
    left = quota["sandboxes_left"]
    print(
        f"quota: {quota['max_sandboxes'] or 'no'} sandboxes max ({'unlimited' if left is None else left} left)"
    )
    print(f"counted: {quota['counts']}")
    return 0


def cmd_snapshot(args: argparse.Namespace) -> int:
    """Snapshots of a sandbox's filesystem (create ID NAME | list | delete NAME); names are per user."""
    cfg, service = _service(args)
    user = scope_key(cfg).user
    if args.action is None:
        raise _UsageError(
            "snapshot needs an action: `snapshot create ID NAME`, `snapshot list` or `snapshot delete NAME`"
        )
    if args.action == "create":
        if not args.id or not args.name:
            raise _UsageError("usage: sandbox-kernel snapshot create ID NAME")
        snap = service.create_snapshot(_user(cfg, args), args.id, args.name)
        print(
            json.dumps(snap, indent=2)
            if args.json
            else f"snapshot {snap['name']} of {snap['source']} ({format_size(snap['size'])})"
        )
    elif args.action == "list":
        snaps = service.snapshots(_user(cfg, args))
        if args.json:
            print(json.dumps(snaps, indent=2))
        for s in snaps if not args.json else []:
            owner = f"  ({s['user']})" if args.all else ""
            print(
                f"{s['name']}  from {s['source']}  {format_size(s['size'])}  {_age(time.time() - s['created'])} ago{owner}"
            )
        if not snaps and not args.json:
            print("no snapshots")
    else:
        name = args.id
        if not name:
            raise _UsageError("usage: sandbox-kernel snapshot delete NAME")
        gone = service.delete_snapshot(user, name)
        print(f"deleted snapshot {name}" if gone else f"no snapshot named {name}")
    return 0


def cmd_install(args: argparse.Namespace) -> int:
    """Install the `sandbox` kernelspec, or a variant with its own settings."""
    from jupyter_client.kernelspec import KernelSpecManager

    if not re.fullmatch(r"[A-Za-z0-9][A-Za-z0-9._-]*", args.name):
        raise _UsageError(
            f"{args.name!r} cannot be a kernel name: use letters, digits, '-', '.' and '_' "
            "(e.g. sandbox-big); --display-name may hold any text"
        )
    env = {
        f"SANDBOX_KERNEL_{name.upper()}": value
        for name, value in (
            ("scope", args.scope),
            ("backend", args.backend),
            ("image", args.image),
            ("snapshot", args.snapshot),
            ("flavor", args.flavor),
        )
        if value
    }
    if args.image or args.snapshot:
        # Another image or snapshot: the variant's sandboxes are apart from your plain one
        # (a flavor alone resizes your sandbox instead).
        env["SANDBOX_KERNEL_VARIANT"] = args.name
    load_config(environ=env)  # refuse a variant that could never start
    spec = kernelspec(
        args.display_name or DISPLAY_NAME,
        env,
        python=sys.executable,
        flags=safe_flags(sys.executable),
    )
    shipped = Path(__file__).parent / "resources"
    with tempfile.TemporaryDirectory() as tmp:
        Path(tmp, "kernel.json").write_text(json.dumps(spec, indent=1) + "\n")
        for logo in shipped.glob("logo-*"):  # the launcher's icon (32, 64 and SVG)
            shutil.copy(logo, tmp)
        dest = KernelSpecManager().install_kernel_spec(
            tmp, args.name, user=args.user, prefix=sys.prefix if args.sys_prefix else args.prefix
        )
    print(f"installed kernelspec {args.name} in {dest}")
    return 0


def cmd_mcp(args: argparse.Namespace) -> int:
    """Serve the MCP tools for agents over stdio, acting for you (an MCP client starts it).

    Tools: execute_code, execute_command, get_sessions, stop_session, list_files,
    read_file, write_file, list_sandboxes and snapshots; they work in your sandbox, the
    one your notebooks use. Stdout carries the protocol only; messages go to stderr.
    """
    import anyio

    from .mcp_server import serve_stdio

    cfg, service = _service(args)
    anyio.run(serve_stdio, service, scope_key(cfg).user, os.getcwd())
    return 0


def cmd_doctor(args: argparse.Namespace) -> int:
    """Check in a few lines that this machine can run the kernel: the engine answers,
    the image is here, your sandbox for this folder starts (it is made if needed, and
    kept for your notebooks), it reaches the package index and can write its folders.
    Exit code 1 when something needs doing; each line says what."""
    from .doctor import examine

    cfg, service = _service(args)
    checks = examine(service, cfg, scope_key(cfg).user, os.getcwd())
    for check in checks:
        print(check)
    return 1 if any(c.state == "problem" for c in checks) else 0


def cmd_logs(args: argparse.Namespace) -> int:
    """What happened to a sandbox (made, started, resized, stopped by the lifecycle,
    lost, failed), oldest first, from this installation's state file; a kernel's own
    lines also go to its stderr: the Jupyter server's log, or a CI job's."""
    cfg, services = _services(args)
    service = _service_of(services, args.id)
    user = _user(cfg, args)
    try:
        service.owned(user, args.id)
    except SandboxNotFound:
        # Gone: its log is still yours to read if the id is one of yours.
        mine = scope_key(cfg).name
        if user is not None and args.id != mine and not args.id.startswith(mine + "--"):
            raise
    events = service.store.events(service.backend.name, args.id)
    if not events:
        print(f"nothing recorded for {args.id} yet")
    for at, line in events:
        print(f"{time.strftime('%Y-%m-%d %H:%M:%S', time.localtime(at))}  {line}")
    return 0


def cmd_uninstall(args: argparse.Namespace) -> int:
    """Remove what this installation made outside its Python environment, before `pip
    uninstall sandbox-kernel`: kernelspecs it installed (or whose Python is gone), every
    sandbox and snapshot of this installation (all users), the engine's network when no
    container uses it, the idmapped mounts' folder, the state folder; workspaces only
    with --workspaces. --dry-run lists it all and changes nothing."""
    from .cleanup import plan, run_steps

    cfg, services = _services(args)
    steps, kept = plan(services, args.workspaces)
    verb = "would remove" if args.dry_run else "removing"
    for step in steps:
        print(f"{verb} {step.what}")
    for what in kept:
        print(f"keeping {what}")
    if args.dry_run:
        return 0
    failed, said = run_steps(steps)
    for line in said:
        print(line)
    for what, why in failed:
        print(f"could not remove {what}: {why}", file=sys.stderr)
    if not failed:
        print("done; now: pip uninstall sandbox-kernel")
    return 1 if failed else 0


class _UsageError(Exception):
    pass


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="sandbox-kernel",
        description="Manage persistent sandboxes for the `sandbox` Jupyter kernel.",
    )
    parser.add_argument(
        "--version", action="version", version=f"sandbox-kernel {__version__}", help="say which"
    )
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")

    def add(name: str, func: Any, **kw: Any) -> argparse.ArgumentParser:
        doc = inspect.getdoc(func) or ""
        p = sub.add_parser(
            name,
            help=doc.splitlines()[0],
            description=doc,
            formatter_class=argparse.RawDescriptionHelpFormatter,
            **kw,
        )
        p.set_defaults(func=func)
        p.add_argument(
            "--backend",
            choices=["auto", "docker", "daytona", "local"],
            help="override SANDBOX_KERNEL_BACKEND",
        )
        return p

    p = add("list", cmd_list)
    p.add_argument("--json", action="store_true", help="machine-readable output")
    p.add_argument("--all", action="store_true", help="every user's sandboxes, not only yours")

    p = add("exec", cmd_exec, usage="sandbox-kernel exec [--timeout S] [ID] [--] CMD [ARG ...]")
    p.add_argument(
        "words",
        nargs=argparse.REMAINDER,
        metavar="[ID] CMD",
        help="sandbox id (default: yours, created if needed), then the command",
    )
    p.add_argument("--timeout", type=float, default=None, help="kill the command after S seconds")
    p.add_argument("--scope", choices=["user", "thread"], help="override SANDBOX_KERNEL_SCOPE")
    p.add_argument("--image", help="override SANDBOX_KERNEL_IMAGE for a new sandbox")
    p.add_argument("--snapshot", help="start a new sandbox from this snapshot")
    p.add_argument(
        "--flavor",
        help="flavor of a new sandbox (small, medium, large or one of c.SandboxConfig.flavors)",
    )
    p.add_argument("--all", action="store_true", help="any user's sandbox by id (administrators)")
    p.set_defaults(cmd=None)

    p = add("shell", cmd_shell, usage="sandbox-kernel shell [ID]")
    p.add_argument(
        "id", nargs="?", help="sandbox id, as `sandbox-kernel list` shows it (default: yours)"
    )
    p.add_argument("--scope", choices=["user", "thread"], help="override SANDBOX_KERNEL_SCOPE")
    p.add_argument("--image", help="override SANDBOX_KERNEL_IMAGE for a new sandbox")
    p.add_argument(
        "--flavor",
        help="flavor of a new sandbox (small, medium, large or one of c.SandboxConfig.flavors)",
    )
    p.add_argument("--all", action="store_true", help="any user's sandbox by id (administrators)")

    for action in ("stop", "start", "destroy"):
        p = add(action, _one(action))
        p.add_argument("id", help="sandbox id, as `sandbox-kernel list` shows it")
        p.add_argument("--json", action="store_true", help="machine-readable output")
        p.add_argument("--all", action="store_true", help="any user's sandbox (administrators)")

    p = add("gc", cmd_gc)
    p.add_argument("--dry-run", action="store_true", help="say what would be done, do nothing")
    p.add_argument("--json", action="store_true", help="machine-readable output")

    p = add("stats", cmd_stats)
    p.add_argument("--json", action="store_true", help="machine-readable output")

    p = add(
        "snapshot",
        cmd_snapshot,
        usage="sandbox-kernel snapshot {create ID NAME | list | delete NAME} [--json]",
    )
    p.add_argument("action", nargs="?", choices=["create", "list", "delete"])
    p.add_argument("id", nargs="?", help="sandbox id (create) or snapshot name (delete)")
    p.add_argument("name", nargs="?", help="snapshot name (create)")
    p.add_argument("--json", action="store_true", help="machine-readable output")
    p.add_argument(
        "--all",
        action="store_true",
        help="every user's snapshots (list), any user's sandbox (create)",
    )

    add("mcp", cmd_mcp)

    add("doctor", cmd_doctor)

    p = add("logs", cmd_logs)
    p.add_argument("id", help="sandbox id, as `sandbox-kernel list` shows it")
    p.add_argument("--all", action="store_true", help="any user's sandbox (administrators)")

    p = add("uninstall", cmd_uninstall)
    p.add_argument("--dry-run", action="store_true", help="say what would be removed, do nothing")
    p.add_argument(
        "--workspaces", action="store_true", help="remove every user's workspace folder too"
    )

    p = add("install", cmd_install)
    where = p.add_mutually_exclusive_group()
    where.add_argument("--user", action="store_true", help="install for this user only")
    where.add_argument(
        "--sys-prefix", action="store_true", help="install into sys.prefix (virtualenv)"
    )
    where.add_argument("--prefix", help="install under this prefix")
    p.add_argument("--name", default=KERNEL_NAME, help="kernelspec name (default: sandbox)")
    p.add_argument("--display-name", help="name shown in the launcher")
    p.add_argument("--scope", choices=["user", "thread"], help="scope baked into the variant")
    p.add_argument("--image", help="image baked into the variant (its sandboxes are its own)")
    p.add_argument(
        "--snapshot", help="snapshot of yours baked into the variant (its sandboxes are its own)"
    )
    p.add_argument(
        "--flavor",
        help="flavor baked into the variant (small, medium, large or one of c.SandboxConfig.flavors)",
    )
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    _log_warnings()
    parser = build_parser()
    argv = list(sys.argv[1:] if argv is None else argv)
    command: list[str] = []
    dashes = "--" in argv
    if dashes:  # everything after -- is the command to run, never our options
        at = argv.index("--")
        argv, command = argv[:at], argv[at + 1 :]
    args = parser.parse_args(argv)
    if args.command == "exec":
        args.cmd = command if dashes else None
    elif dashes:
        parser.error(f"`{args.command}` takes no command after --")
    try:
        code: int = args.func(args)
        sys.stdout.flush()  # a reader gone (`| head`) shows here, not as an error at exit
        return code
    except (ConfigError, _UsageError) as exc:
        print(f"sandbox-kernel: {exc}", file=sys.stderr)
        return 2
    except SandboxError as exc:
        print(f"sandbox-kernel: {exc}", file=sys.stderr)
        return 1
    except KeyboardInterrupt:
        return 130
    except BrokenPipeError:  # `sandbox-kernel list | head`: the reader has all it wanted
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return 0


def _log_warnings() -> None:
    """Warnings of the settings (an ignored or misspelt variable) as one plain line each."""
    log = logging.getLogger("sandbox_kernel")
    if not log.handlers:
        handler = logging.StreamHandler(sys.stderr)
        handler.setFormatter(logging.Formatter("sandbox-kernel: %(message)s"))
        log.addHandler(handler)
        log.propagate = False


if __name__ == "__main__":
    sys.exit(main())
