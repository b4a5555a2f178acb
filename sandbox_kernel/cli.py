"""The ``sandbox-kernel`` command: a thin shell over the backends.

Every command prints one plain line on failure (what went wrong and what to do) and
exits non-zero: 1 for a sandbox or engine problem, 2 for bad arguments or settings.
"""

from __future__ import annotations

import argparse
import json
import shutil
import sys
import tempfile
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from .backends import Backend, SandboxError, make_backend
from .backends.base import SandboxInfo
from .config import ConfigError, SandboxConfig, load_config
from .identity import scope_key

KERNEL_NAME = "sandbox"
DISPLAY_NAME = "Python 3 (sandbox)"


def _config(args: argparse.Namespace) -> SandboxConfig:
    return load_config(
        backend=getattr(args, "backend", None),
        scope=getattr(args, "scope", None),
        image=getattr(args, "image", None),
        snapshot=getattr(args, "snapshot", None),
        flavor=getattr(args, "flavor", None) if getattr(args, "command", "") != "install" else None,
    )


def _backend(args: argparse.Namespace) -> tuple[SandboxConfig, Backend]:
    cfg = _config(args)
    return cfg, make_backend(cfg)


def _age(seconds: float) -> str:
    seconds = max(0, int(seconds))
    for unit, size in (("d", 86400), ("h", 3600), ("m", 60)):
        if seconds >= size:
            return f"{seconds // size}{unit}"
    return f"{seconds}s"


def _print_table(infos: list[SandboxInfo]) -> None:
    rows = [("ID", "STATE", "BACKEND", "SCOPE", "USER", "FLAVOR", "IMAGE", "AGE")]
    now = time.time()
    for i in infos:
        rows.append(
            (i.id, i.state, i.backend, i.scope, i.user, i.flavor, i.image, _age(now - i.created))
        )
    widths = [max(len(str(r[c])) for r in rows) for c in range(len(rows[0]))]
    for row in rows:
        print("  ".join(str(v).ljust(w) for v, w in zip(row, widths, strict=True)).rstrip())
    isolations = {i.isolation for i in infos if i.isolation}
    for isolation in sorted(isolations):
        print(f"isolation: {isolation}")


def cmd_list(args: argparse.Namespace) -> int:
    """List this user's sandboxes (or everyone's with --all)."""
    cfg, backend = _backend(args)
    user = None if args.all else scope_key(cfg).user
    infos = backend.list(user)
    if args.json:
        print(json.dumps([i.to_dict() for i in infos], indent=2))
    elif infos:
        _print_table(infos)
    else:
        print("no sandboxes yet; `sandbox-kernel exec -- python3 -V` creates yours")
    return 0


def cmd_exec(args: argparse.Namespace) -> int:
    """Run a command in a sandbox; without an id, in the current user's (created if needed)."""
    if not args.cmd:
        raise _UsageError("nothing to run: give a command after --, e.g. `sandbox-kernel exec -- ls`")
    cfg, backend = _backend(args)
    if args.id:
        sandbox_id = args.id
    else:
        ensured = backend.ensure(scope_key(cfg), progress=lambda m: print(m, file=sys.stderr))
        if ensured.notice:
            print(ensured.notice, file=sys.stderr)
        sandbox_id = ensured.info.id
    result = backend.exec(sandbox_id, list(args.cmd), timeout=args.timeout)
    sys.stdout.buffer.write(result.output)
    sys.stdout.flush()
    return result.exit_code


def _one(action: str):
    def run(args: argparse.Namespace) -> int:
        _, backend = _backend(args)
        if action == "destroy":
            gone = backend.destroy(args.id)
            print(f"destroyed {args.id} (workspace kept)" if gone else f"{args.id} was already gone")
            return 0
        info = getattr(backend, action)(args.id)
        print(json.dumps(info.to_dict(), indent=2) if args.json else f"{info.id}: {info.state}")
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

    cfg, backend = _backend(args)
    actions = gc(backend, cfg, dry_run=args.dry_run)
    if args.json:
        print(json.dumps([a.to_dict() for a in actions], indent=2))
    elif not actions:
        print("nothing to do")
    for a in actions if not args.json else []:
        state = "would " + a.action if args.dry_run else (a.action if a.done else f"failed to {a.action}")
        print(f"{a.sandbox_id}: {state} ({a.reason}){': ' + a.error if a.error else ''}")
    return 1 if any(a.error for a in actions) else 0


def cmd_stats(args: argparse.Namespace) -> int:
    """Sandboxes by state and flavor, memory and CPU reserved and used, quota headroom."""
    from .lifecycle import stats

    cfg, backend = _backend(args)
    totals = stats(backend, cfg)
    if args.json:
        print(json.dumps(totals, indent=2))
        return 0
    gib = 2**30
    print(f"backend: {totals['backend']}   sandboxes: {totals['sandboxes']}")
    print("by state: " + (", ".join(f"{k} {v}" for k, v in sorted(totals["by_state"].items())) or "-"))
    print("by flavor: " + (", ".join(f"{k} {v}" for k, v in sorted(totals["by_flavor"].items())) or "-"))
    mem = totals["memory"]
    print(f"memory: {mem['reserved'] / gib:.1f} GiB reserved, {mem['used'] / gib:.2f} GiB used")
    print(f"cpus reserved: {totals['cpus']['reserved']:g}")
    quota = totals["quota"]
    left = quota["sandboxes_left"]
    print(f"quota: {quota['max_sandboxes'] or 'no'} sandboxes max ({'unlimited' if left is None else left} left)")
    return 0


def cmd_snapshot(args: argparse.Namespace) -> int:
    """Snapshots of a sandbox's filesystem (create ID NAME | list | delete NAME)."""
    cfg, backend = _backend(args)
    if args.action == "create":
        if not args.id or not args.name:
            raise _UsageError("usage: sandbox-kernel snapshot create ID NAME")
        snap = backend.create_snapshot(args.id, args.name)
        print(json.dumps(snap.to_dict(), indent=2) if args.json else f"snapshot {snap.name} of {snap.source} ({snap.size / 2**20:.0f} MiB)")
    elif args.action == "list":
        snaps = backend.list_snapshots(None if args.all else scope_key(cfg).user)
        if args.json:
            print(json.dumps([s.to_dict() for s in snaps], indent=2))
        for s in snaps if not args.json else []:
            print(f"{s.name}  from {s.source}  {s.size / 2**20:.0f} MiB  {_age(time.time() - s.created)} ago")
        if not snaps and not args.json:
            print("no snapshots")
    else:
        name = args.id
        if not name:
            raise _UsageError("usage: sandbox-kernel snapshot delete NAME")
        gone = backend.delete_snapshot(name)
        print(f"deleted snapshot {name}" if gone else f"no snapshot named {name}")
    return 0


def cmd_install(args: argparse.Namespace) -> int:
    """Install the `sandbox` kernelspec, or a variant with its own settings."""
    from jupyter_client.kernelspec import KernelSpecManager

    env = {
        f"SANDBOX_KERNEL_{name.upper()}": value
        for name, value in (
            ("scope", args.scope),
            ("backend", args.backend),
            ("image", args.image),
            ("flavor", args.flavor),
        )
        if value
    }
    load_config(environ=env)  # refuse a variant that could never start
    spec: dict[str, Any] = {
        "argv": [sys.executable, "-m", "sandbox_kernel", "-f", "{connection_file}"],
        "display_name": args.display_name or DISPLAY_NAME,
        "language": "python",
        "interrupt_mode": "message",
        "metadata": {"debugger": False},
    }
    if env:
        spec["env"] = env
    shipped = Path(__file__).parent / "resources"
    with tempfile.TemporaryDirectory() as tmp:
        Path(tmp, "kernel.json").write_text(json.dumps(spec, indent=1) + "\n")
        for logo in shipped.glob("logo-*.png"):
            shutil.copy(logo, tmp)
        dest = KernelSpecManager().install_kernel_spec(
            tmp, args.name, user=args.user, prefix=sys.prefix if args.sys_prefix else args.prefix
        )
    print(f"installed kernelspec {args.name} in {dest}")
    return 0


class _UsageError(Exception):
    pass


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="sandbox-kernel",
        description="Manage persistent sandboxes for the `sandbox` Jupyter kernel.",
    )
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")

    def add(name: str, func: Any, **kw: Any) -> argparse.ArgumentParser:
        p = sub.add_parser(name, help=(func.__doc__ or "").strip().splitlines()[0], **kw)
        p.set_defaults(func=func)
        p.add_argument("--backend", choices=["auto", "docker", "daytona", "local"], help="override SANDBOX_KERNEL_BACKEND")
        return p

    p = add("list", cmd_list)
    p.add_argument("--json", action="store_true", help="machine-readable output")
    p.add_argument("--all", action="store_true", help="every user's sandboxes, not only yours")

    p = add("exec", cmd_exec, usage="sandbox-kernel exec [ID] [--timeout S] -- CMD [ARG ...]")
    p.add_argument("id", nargs="?", help="sandbox id (default: yours, created if needed)")
    p.add_argument("--timeout", type=float, default=None, help="kill the command after S seconds")
    p.add_argument("--scope", choices=["user", "thread"], help="override SANDBOX_KERNEL_SCOPE")
    p.add_argument("--image", help="override SANDBOX_KERNEL_IMAGE for a new sandbox")
    p.add_argument("--snapshot", help="start a new sandbox from this snapshot")
    p.add_argument("--flavor", choices=["small", "medium", "large"], help="flavor of a new sandbox")
    p.set_defaults(cmd=[])

    for action in ("stop", "start", "destroy"):
        p = add(action, _one(action))
        p.add_argument("id", help="sandbox id, as `sandbox-kernel list` shows it")
        p.add_argument("--json", action="store_true", help="machine-readable output")

    p = add("gc", cmd_gc)
    p.add_argument("--dry-run", action="store_true", help="say what would be done, do nothing")
    p.add_argument("--json", action="store_true", help="machine-readable output")

    p = add("stats", cmd_stats)
    p.add_argument("--json", action="store_true", help="machine-readable output")

    p = add("snapshot", cmd_snapshot, usage="sandbox-kernel snapshot {create ID NAME | list | delete NAME} [--json]")
    p.add_argument("action", choices=["create", "list", "delete"])
    p.add_argument("id", nargs="?", help="sandbox id (create) or snapshot name (delete)")
    p.add_argument("name", nargs="?", help="snapshot name (create)")
    p.add_argument("--json", action="store_true", help="machine-readable output")
    p.add_argument("--all", action="store_true", help="every user's snapshots")

    p = add("install", cmd_install)
    where = p.add_mutually_exclusive_group()
    where.add_argument("--user", action="store_true", help="install for this user only")
    where.add_argument("--sys-prefix", action="store_true", help="install into sys.prefix (virtualenv)")
    where.add_argument("--prefix", help="install under this prefix")
    p.add_argument("--name", default=KERNEL_NAME, help="kernelspec name (default: sandbox)")
    p.add_argument("--display-name", help="name shown in the launcher")
    p.add_argument("--scope", choices=["user", "thread"], help="scope baked into the variant")
    p.add_argument("--image", help="image baked into the variant")
    p.add_argument("--flavor", choices=["small", "medium", "large"], help="flavor baked into the variant")
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    parser = build_parser()
    argv = list(sys.argv[1:] if argv is None else argv)
    command: list[str] = []
    if "--" in argv:  # everything after -- is the command to run, never our options
        at = argv.index("--")
        argv, command = argv[:at], argv[at + 1 :]
    args = parser.parse_args(argv)
    if args.command == "exec":
        args.cmd = command or args.cmd
    elif command:
        parser.error(f"`{args.command}` takes no command after --")
    try:
        return args.func(args)
    except (ConfigError, _UsageError) as exc:
        print(f"sandbox-kernel: {exc}", file=sys.stderr)
        return 2
    except SandboxError as exc:
        print(f"sandbox-kernel: {exc}", file=sys.stderr)
        return 1
    except KeyboardInterrupt:
        return 130


if __name__ == "__main__":
    sys.exit(main())
