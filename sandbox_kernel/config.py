"""Every setting of sandbox-kernel, in one traitlets Configurable.

The kernel, the CLI and the server extension each build a :class:`SandboxConfig` with
:func:`load_config`, so they agree on which engine, image, workspace and limits a user
gets without talking to each other. Sources, weakest first:

1. the trait defaults below;
2. ``sandbox_kernel_config.{json,py}`` in any Jupyter config directory
   (``jupyter --paths``), and any ``c.SandboxConfig.*`` in the server's own config when
   the server extension passes its config in;
3. ``SANDBOX_KERNEL_<TRAIT_NAME>`` environment variables (``SANDBOX_KERNEL_IMAGE``,
   ``SANDBOX_KERNEL_FLAVOR`` ...): the environment wins, so a kernelspec's ``env`` block
   can make a variant.

Bad values fail at once with :class:`ConfigError`, whose message names the setting
both ways (environment variable and config key) and says what is accepted.
"""

from __future__ import annotations

import difflib
import logging
import math
import os
import re
from collections.abc import Mapping
from functools import lru_cache
from pathlib import Path
from typing import Any

from jupyter_core.paths import jupyter_config_path, jupyter_data_dir
from traitlets import Bool, Dict, Enum, Float, Int, List, TraitError, Unicode, default, validate
from traitlets.config import Config, Configurable
from traitlets.config.loader import JSONFileConfigLoader, PyFileConfigLoader

from . import volumes as mappings
from .setting_values import (
    FLAVOR_NAME,
    ByteSize,
    check_egress,
    check_flavor,
    json_table,
    parse_size,
    short_trait_error,
    text_list,
)

log = logging.getLogger("sandbox_kernel")

ENV_PREFIX = "SANDBOX_KERNEL_"
# Settings the person at the keyboard decides (environment, kernelspec, notebook
# metadata win); every other setting is policy, which the administrator's
# configuration files fix when they set it (see docs/operators/settings.md).
PERSONAL = frozenset(
    {"scope", "thread", "flavor", "image", "snapshot", "user", "variant", "work_root", "work_mount"}
)
#: Paths a sandbox may never change inside a host folder it can write, at any depth (a
#: name, or a path of names; the last may hold * and ? as in shell patterns): what host
#: tools run or trust when the host user works in that folder (git, shells, editors,
#: Jupyter, pre-commit).
PROTECTED_PATHS = (
    ".git/config",
    ".git/hooks",
    ".git/modules",
    ".git/commondir",
    ".gitmodules",
    ".pre-commit-config.yaml",
    ".envrc",
    ".bashrc",
    ".bash_profile",
    ".bash_login",
    ".profile",
    ".zshrc",
    ".zprofile",
    ".zshenv",
    ".vscode",
    ".idea",
    ".devcontainer",
    ".jupyter",
    ".ipython",
    "jupyter_*_config.py",
    "jupyter_*_config.json",
    "ipython_config.py",
)
# An interpreter with IPython needs a few dozen threads and processes; fewer and the
# sandbox cannot run a cell (and says only "can't start new thread").
MIN_PIDS = 64
CONFIG_FILE_BASENAME = "sandbox_kernel_config"
#: The engines this package brings (see backends/__init__.py), and the entry-point group
#: through which other packages add theirs.
ENGINES = ("docker", "local", "daytona", "kubernetes")
ENGINE_ENTRY_POINTS = "sandbox_kernel.backends"

# Flavors fix CPUs, memory and disk together so a quota can count them. These three
# always exist; c.SandboxConfig.flavors adds others (or redefines these).
FLAVORS: dict[str, dict[str, Any]] = {
    "small": {"cpus": 1.0, "memory": 1 << 30, "disk": 10 << 30},
    "medium": {"cpus": 2.0, "memory": 2 << 30, "disk": 20 << 30},
    "large": {"cpus": 4.0, "memory": 4 << 30, "disk": 40 << 30},
}
# An MCP tool result: room for a few lines at least, and well under the 1 MiB an MCP
# client accepts in one message (the official client refuses more).
MIN_RESULT, MAX_RESULT = 4_000, 900_000


_ENV_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")
# Variables a sandbox's environment is made of by us, or that change how every program
# there starts (the host's own programs in the sandbox included): never passed on.
_NEVER_PASSED = re.compile(r"(PATH|HOME|USER|LOGNAME|SHELL|PWD|LD_.*|PYTHON.*|SANDBOX_.*)")
# What sandboxes inherit unless the administrator says otherwise: how to reach the network
# and the package index. A value that carries a credential (a password or token in a URL)
# is dropped from these unless ``pass_env`` was set on purpose (see :func:`passed_env`).
DEFAULT_PASS_ENV = (
    "HTTP_PROXY",
    "HTTPS_PROXY",
    "NO_PROXY",
    "http_proxy",
    "https_proxy",
    "no_proxy",
    "PIP_INDEX_URL",
    "PIP_EXTRA_INDEX_URL",
    "PIP_TRUSTED_HOST",
)


class ConfigError(ValueError):
    """A setting has a value we cannot run with; the message says which and why."""


def setting_names(trait_name: str) -> str:
    """How a user spells a setting, both ways, for error messages."""
    return f"{ENV_PREFIX}{trait_name.upper()} / c.SandboxConfig.{trait_name}"


class SandboxConfig(Configurable):
    """The shared settings. Trait names map 1:1 to ``SANDBOX_KERNEL_<NAME>`` variables."""

    backend = Unicode(
        "auto",
        help=(
            "Engine for sandboxes: docker, local, daytona, or an engine another package "
            f"registers (entry-point group {ENGINE_ENTRY_POINTS!r}). auto: docker when an "
            "engine answers, else local."
        ),
    ).tag(config=True)
    scope = Enum(
        ["user", "thread"],
        default_value="user",
        help="One sandbox per user (shared by all of their notebooks) or per notebook.",
    ).tag(config=True)
    image = Unicode(
        "python:3.12-slim",
        help="Docker image (or Daytona snapshot) for new sandboxes; it only needs python3.",
    ).tag(config=True)
    workspace_root = Unicode(
        help="Host folder holding one workspace folder per user, mounted at /workspace.",
    ).tag(config=True)
    shared_folder = Unicode(
        "", help="Optional host folder mounted read-only at /shared in every sandbox."
    ).tag(config=True)
    volumes = List(
        Unicode(),
        default_value=[],
        help=(
            "Folders mapped into every sandbox, 'host_dir:sandbox_dir[:ro|rw]' (ro by default), "
            "e.g. ['/data/corpora:/data', '/srv/cache:/cache:rw']; Daytona maps its volumes by "
            "name ('team-data:/team:rw'). A writable one is shared and guarded like the work folder."
        ),
    ).tag(config=True)
    work_root = Unicode(
        "auto",
        help=(
            "The host folder a user works in, mounted into sandboxes at the same path so cells "
            "run beside the notebook. auto: the root folder of the Jupyter server that started "
            "the kernel, else the notebook's git repository or folder; none: only /workspace; "
            "or a folder."
        ),
    ).tag(config=True)
    work_mount = Enum(
        ["rw", "ro"],
        default_value="rw",
        help=(
            "How the work folder is mounted: rw (cells write beside the notebook; the "
            "protected paths stay read-only) or ro (for code you do not trust: cells read "
            "it and write only /workspace)."
        ),
    ).tag(config=True)
    protected_paths = List(
        Unicode(),
        default_value=list(PROTECTED_PATHS),
        help=(
            "Paths a sandbox may not change inside a host folder it can write, at any depth "
            "(a name or a path of names; the last may hold * and ?): the files host tools "
            "run or trust there (git's config and hooks, shell and editor settings, "
            "Jupyter's config). Policy: read-only in the sandbox."
        ),
    ).tag(config=True)
    flavor = Unicode(
        "small",
        help="CPUs, memory and disk of new sandboxes: a name of the flavors table (small, medium, large built in).",
    ).tag(config=True)
    flavors = Dict(
        help=(
            "Flavors users may pick, by name: {'name': {'cpus': 2, 'memory': '2G', 'disk': '20G'}}. "
            "Added to the built-in small (1 CPU, 1 GiB, 10 GiB of disk), medium (2, 2 GiB, 20 GiB) and "
            "large (4, 4 GiB, 40 GiB); a built-in name given here is redefined. disk bounds the "
            "workspace and, apart, the sandbox's own files (home, /tmp) where the engine allows it."
        ),
    ).tag(config=True)
    network = Bool(True, help="Whether sandboxes can reach the network.").tag(config=True)
    egress_allow = List(
        Unicode(),
        default_value=[],
        help=(
            "Where sandboxes may connect, when network is on: names (pypi.org), wildcards "
            "(*.pythonhosted.org), * (any public name), addresses and networks (10.1.0.0/16), "
            "each with an optional :PORT (80 and 443 without). Enforced outside the sandbox by "
            "an egress proxy; private addresses need an exact name or a listed network, the "
            "machine's own (loopback, link-local metadata) a listed network. A flavor's "
            "egress_allow replaces it for that flavor. Empty: no restriction beyond network."
        ),
    ).tag(config=True)
    pids_limit = Int(
        512, help=f"Maximum number of processes and threads in one sandbox (at least {MIN_PIDS})."
    ).tag(config=True)
    runtime = Unicode(
        "",
        help=(
            "Docker runtime for new sandboxes (e.g. runsc for gVisor, which puts a user-space "
            "kernel between sandbox code and the host's); empty: the engine's default (runc)."
        ),
    ).tag(config=True)
    kubernetes_namespace = Unicode(
        "",
        help=(
            "Kubernetes namespace of the sandboxes' pods, claims and network policies "
            "(kubernetes backend); empty: the kubeconfig context's, or the server pod's own."
        ),
    ).tag(config=True)
    kubernetes_storage_class = Unicode(
        "",
        help=(
            "Storage class of the sandboxes' claims (workspace and home; kubernetes backend); "
            "empty: the cluster's default class."
        ),
    ).tag(config=True)
    kubernetes_workspace_size = ByteSize(
        10 << 30,
        help="Size of a user's workspace claim (kubernetes backend): bytes, or a size like 10G.",
    ).tag(config=True)
    user = Unicode("", help="Owner of the sandbox; else JUPYTERHUB_USER, else the OS user.").tag(
        config=True
    )
    thread = Unicode("", help="Notebook id for scope=thread; else derived from the notebook.").tag(
        config=True
    )
    state_dir = Unicode(help="Folder of the SQLite file that records sandboxes and activity.").tag(
        config=True
    )
    start_timeout = Float(
        300.0, help="Seconds to wait for a sandbox (and its image) to be ready."
    ).tag(config=True)
    cell_timeout = Float(
        0.0, help="Seconds a cell may run before it is interrupted; 0 means no limit."
    ).tag(config=True)
    output_limit = ByteSize(
        10_000_000,
        help="Output one cell may send before the rest is discarded: bytes, or a size like 10 MB.",
    ).tag(config=True)
    mcp_result_limit = ByteSize(
        100_000,
        help=(
            f"Bytes of one MCP tool result ({MIN_RESULT // 1000} KB to {MAX_RESULT // 1000} KB: MCP "
            "clients refuse a message over 1 MiB); a run's output past it keeps its head and "
            "tail, and the whole of it is written to /workspace/.sandbox-kernel/outputs/."
        ),
    ).tag(config=True)
    # Lifecycle (lifecycle.py); minutes, 0 disables.
    idle_stop = Float(
        15.0, help="Minutes without activity and without a live kernel before a stop."
    ).tag(config=True)
    idle_delete = Float(
        120.0, help="Minutes stopped before a sandbox is removed (workspace kept)."
    ).tag(config=True)
    files_idle_stop = Float(
        60.0,
        help=(
            "Minutes without file use before a user's files sandbox is stopped (Daytona: the "
            "sandbox that serves workspace files while code sandboxes sleep; 0: never)."
        ),
    ).tag(config=True)
    max_sandboxes = Int(100, help="Most sandboxes that may exist at once (0: no limit).").tag(
        config=True
    )
    max_total_memory = Unicode(
        "0",
        help="Most memory all sandboxes may reserve together, e.g. 64g or 65536m (0: no limit).",
    ).tag(config=True)
    max_age = Float(
        0.0, help="Minutes after which a sandbox is removed whatever its use (0: never)."
    ).tag(config=True)
    idle_stop_with_kernel = Float(
        0.0,
        help="Minutes without activity before a sandbox with a live but idle kernel is stopped (0: never).",
    ).tag(config=True)
    agent_idle_stop = Float(
        60.0,
        help=(
            "Minutes an agent's session (MCP execute_code) may go unused before its interpreter "
            "is ended (0: never); a live session counts as use of its sandbox, as a kernel does."
        ),
    ).tag(config=True)
    orphan_grace = Float(
        10.0,
        help="Minutes before a sandbox of ours with no owner record or an outdated spec is reaped.",
    ).tag(config=True)
    snapshot = Unicode("", help="Snapshot that new sandboxes start from instead of the image.").tag(
        config=True
    )
    variant = Unicode(
        "",
        help=(
            "A name for a kernelspec variant with its own image or snapshot: its sandboxes "
            "are apart from the user's plain ones (sandbox-kernel install sets it)."
        ),
    ).tag(config=True)
    ca_bundle = Unicode(
        "",
        help=(
            "Certificates sandboxes trust for TLS. Empty: the host's own trust store (public "
            "certificates, and any your administrator added, such as a TLS-intercepting "
            "proxy's), as OpenSSL's default file (SSL_CERT_FILE), which what a sandbox "
            "configures itself still overrides; a host file of PEM certificates: trusted in "
            "addition, and made the store of pip, requests, curl and git; none: nothing."
        ),
    ).tag(config=True)
    pass_env = List(
        Unicode(),
        default_value=list(DEFAULT_PASS_ENV),
        help=(
            "Names of environment variables sandboxes inherit from the process that runs their "
            "code (proxy and package index settings). By default a value carrying a credential "
            "(user:password@ in a URL) is not passed; naming the variables here on purpose "
            "passes them as they are."
        ),
    ).tag(config=True)
    allowed_flavors = List(
        Unicode(), default_value=[], help="Flavors users may choose (empty: all of them)."
    ).tag(config=True)
    allowed_images = List(
        Unicode(), default_value=[], help="Images users may choose (empty: any image)."
    ).tag(config=True)

    # Values of the configuration files, filled by load_config (not a setting).
    file_values: dict[str, Any] = {}
    # Settings given by the environment, a kernelspec, notebook metadata or a command's
    # option, i.e. asked for by whoever started this process (not a setting): a flavor
    # changes an existing sandbox only when asked for (see service.py).
    asked: frozenset[str] = frozenset()

    @default("flavors")
    def _default_flavors(self) -> dict[str, dict[str, Any]]:
        return {name: dict(sizes) for name, sizes in FLAVORS.items()}

    @validate("flavors")
    def _flavor_table(self, proposal: Any) -> dict[str, dict[str, Any]]:
        given = proposal["value"]
        table = {name: dict(sizes) for name, sizes in FLAVORS.items()}
        for name, entry in given.items():
            table[str(name)] = check_flavor(name, entry)
        return table

    @validate("egress_allow")
    def _egress(self, proposal: Any) -> list[str]:
        return check_egress(proposal["value"])

    @validate("flavor")
    def _flavor_name(self, proposal: Any) -> str:
        value = proposal["value"].strip()
        if not FLAVOR_NAME.fullmatch(value):
            raise TraitError(f"{value!r} is not a flavor name (letters, digits, '-', '_', '.')")
        return value

    @default("workspace_root")
    def _default_workspace_root(self) -> str:
        return str(Path(jupyter_data_dir()) / "sandbox-kernel" / "workspaces")

    @default("state_dir")
    def _default_state_dir(self) -> str:
        return str(Path(jupyter_data_dir()) / "sandbox-kernel")

    @validate("pids_limit", "output_limit", "max_sandboxes")
    def _non_negative_int(self, proposal: Any) -> int:
        name = proposal["trait"].name
        if proposal["value"] < 0 or (
            name in ("pids_limit", "output_limit") and proposal["value"] == 0
        ):
            raise TraitError(f"must be a positive number, got {proposal['value']}")
        if name == "pids_limit" and proposal["value"] < MIN_PIDS:
            raise TraitError(
                f"{proposal['value']} is too few for an interpreter to start; use at least {MIN_PIDS}"
            )
        return proposal["value"]

    @validate("mcp_result_limit")
    def _result_size(self, proposal: Any) -> int:
        if not MIN_RESULT <= proposal["value"] <= MAX_RESULT:
            raise TraitError(
                f"must be from {MIN_RESULT} to {MAX_RESULT} bytes (MCP clients refuse a message "
                "over 1 MiB)"
            )
        return proposal["value"]

    @validate("max_total_memory")
    def _memory_size(self, proposal: Any) -> str:
        parse_size(proposal["value"])
        return proposal["value"]

    @validate(
        "start_timeout",
        "cell_timeout",
        "idle_stop",
        "idle_delete",
        "files_idle_stop",
        "max_age",
        "idle_stop_with_kernel",
        "agent_idle_stop",
        "orphan_grace",
    )
    def _non_negative_float(self, proposal: Any) -> float:
        if not math.isfinite(proposal["value"]):
            raise TraitError(
                f"must be a finite number of seconds or minutes, got {proposal['value']} (0 means none)"
            )
        if proposal["value"] < 0:
            raise TraitError(f"must be zero or more, got {proposal['value']}")
        if proposal["trait"].name == "start_timeout" and proposal["value"] == 0:
            raise TraitError("must be more than zero")
        return proposal["value"]

    @validate("volumes")
    def _mappings(self, proposal: Any) -> list[str]:
        try:
            return [str(mappings.parse(text)) for text in proposal["value"]]
        except mappings.VolumeError as exc:
            raise TraitError(str(exc)) from None

    @validate("shared_folder")
    def _existing_folder(self, proposal: Any) -> str:
        value = proposal["value"]
        if value and not Path(value).expanduser().is_dir():
            raise TraitError(f"folder {value!r} does not exist; create it or unset the setting")
        return str(Path(value).expanduser().resolve()) if value else ""

    @validate("workspace_root", "state_dir")
    def _absolute_folder(self, proposal: Any) -> str:
        value = proposal["value"]
        if not value.strip():
            raise TraitError("must name a folder")
        if not Path(value).expanduser().is_absolute():
            # Relative to what? Each kernel starts in its notebook's folder.
            raise TraitError(f"{value!r} is not an absolute folder; write its full path (or ~/...)")
        path = Path(value).expanduser().resolve()
        if path.exists() and not path.is_dir():
            raise TraitError(f"{value!r} exists and is not a folder")
        probe = path
        while not probe.exists():
            probe = probe.parent
        if not probe.is_dir():
            raise TraitError(f"{value!r} cannot be created: {probe} is a file")
        if not os.access(probe, os.W_OK | os.X_OK):
            what = (
                "is not writable"
                if probe == path
                else f"cannot be created ({probe} is not writable)"
            )
            raise TraitError(f"{value!r} {what} by this user")
        return str(path)

    @validate("work_root")
    def _work_root(self, proposal: Any) -> str:
        value = proposal["value"].strip() or "auto"
        if value in ("auto", "none"):
            return value
        path = Path(value).expanduser()
        if not path.is_absolute():
            raise TraitError(f"{value!r} is not an absolute folder (or auto, or none)")
        if not path.is_dir():
            raise TraitError(f"folder {value!r} does not exist; create it, or use auto or none")
        return str(path.resolve())

    @validate("protected_paths")
    def _protected(self, proposal: Any) -> list[str]:
        found = []
        for raw in proposal["value"]:
            value = str(raw).strip().strip("/")
            parts = value.split("/")
            if not value or any(p in ("", ".", "..") for p in parts):
                raise TraitError(f"{raw!r} is not a relative path of names (like .git/config)")
            if any(c in part for part in parts[:-1] for c in "*?["):
                raise TraitError(f"{raw!r}: only its last name may hold * or ?")
            found.append(value)
        return found

    @validate("backend")
    def _backend_name(self, proposal: Any) -> str:
        value = proposal["value"].strip().lower() or "auto"
        if value == "auto" or value in ENGINES:
            return value
        from importlib.metadata import entry_points  # only for a name not built in

        others = sorted(ep.name for ep in entry_points(group=ENGINE_ENTRY_POINTS))
        if value in others:
            return value
        known = ", ".join(["auto", *ENGINES, *[o for o in others if o not in ENGINES]])
        raise TraitError(f"{value!r} is not an engine: use one of {known}")

    @validate("runtime")
    def _runtime_name(self, proposal: Any) -> str:
        value = proposal["value"].strip()
        if value and not all(c.isalnum() or c in "-_." for c in value):
            raise TraitError(f"{value!r} is not a runtime name (letters, digits, '-', '_', '.')")
        return value

    @validate("ca_bundle")
    def _ca_bundle(self, proposal: Any) -> str:
        value = proposal["value"].strip()
        if value in ("", "none"):
            return value
        path = Path(value).expanduser()
        if not path.is_absolute():
            raise TraitError(
                f"{value!r} is not an absolute path (or none, or empty for the host's)"
            )
        try:
            with path.open("rb") as f:
                head = f.read(CA_BUNDLE_LIMIT + 1)
        except OSError as exc:
            raise TraitError(f"cannot read {value!r}: {exc.strerror}") from None
        if len(head) > CA_BUNDLE_LIMIT or b"-----BEGIN CERTIFICATE-----" not in head:
            raise TraitError(
                f"{value!r} is not a file of PEM certificates (-----BEGIN CERTIFICATE----- ...)"
            )
        return str(path.resolve())

    @validate("pass_env")
    def _pass_env(self, proposal: Any) -> list[str]:
        names = list(dict.fromkeys(proposal["value"]))
        for name in names:
            if not _ENV_NAME.fullmatch(name):
                raise TraitError(f"{name!r} is not an environment variable name")
            if _NEVER_PASSED.fullmatch(name):
                raise TraitError(
                    f"{name} is not passed to sandboxes (they set their own, or it changes "
                    "how every program there starts)"
                )
        return names

    @validate("image")
    def _image_given(self, proposal: Any) -> str:
        if not proposal["value"].strip():
            raise TraitError("must name an image")
        return proposal["value"].strip()

    @property
    def mappings(self) -> tuple[mappings.Volume, ...]:
        """The folders mapped into every sandbox (``volumes``), parsed."""
        return tuple(mappings.parse(text) for text in self.volumes)

    @property
    def max_total_memory_bytes(self) -> int:
        """max_total_memory in bytes (0: no limit)."""
        return parse_size(self.max_total_memory)

    def flavor_sizes(self, name: str | None = None) -> dict[str, Any]:
        """{"cpus", "memory", "disk"} of flavor ``name`` (the configured one by default);
        :class:`ConfigError` naming the flavors there are for an unknown one."""
        name = self.flavor if name is None else name
        try:
            return self.flavors[name]
        except KeyError:
            raise ConfigError(
                f"unknown flavor {name!r} ({setting_names('flavor')}); flavors here: "
                f"{', '.join(sorted(self.flavors))} (c.SandboxConfig.flavors defines more)"
            ) from None

    def egress(self, flavor: str | None = None) -> tuple[str, ...]:
        """The egress allowlist of sandboxes of ``flavor`` (the configured one by default):
        the flavor's own when its entry has one, else egress_allow; () for no list (and
        always when network is off, which allows nothing)."""
        if not self.network:
            return ()
        own = self.flavor_sizes(flavor).get("egress_allow")
        return tuple(self.egress_allow if own is None else own)

    @property
    def cpus(self) -> float:
        """CPUs of the configured flavor."""
        return float(self.flavor_sizes()["cpus"])

    @property
    def memory(self) -> int:
        """Memory limit in bytes of the configured flavor."""
        return int(self.flavor_sizes()["memory"])

    @property
    def disk(self) -> int:
        """Disk size in bytes of the configured flavor (the workspace's, and the sandbox's own)."""
        return int(self.flavor_sizes()["disk"])


CA_BUNDLE_LIMIT = 16 << 20  # bytes: far more than any real bundle


def _file_config(paths: list[str]) -> Config:
    """Merge ``sandbox_kernel_config.{json,py}`` from the given Jupyter config dirs.

    jupyter_config_path() lists the user's dir first; later (system) files must not
    override it, so we load in reverse order, as Jupyter applications do.
    """
    merged = Config()
    for directory in reversed(paths):
        for loader_cls, suffix in ((JSONFileConfigLoader, ".json"), (PyFileConfigLoader, ".py")):
            filename = CONFIG_FILE_BASENAME + suffix
            if not (Path(directory) / filename).is_file():
                continue
            try:
                merged.merge(loader_cls(filename, path=directory).load_config())
            except Exception as exc:  # a broken file must say which file
                raise ConfigError(f"cannot read {Path(directory) / filename}: {exc}") from exc
    return merged


def _env_overrides(trait_names: list[str], environ: Mapping[str, str]) -> dict[str, str]:
    return {
        name: environ[ENV_PREFIX + name.upper()]
        for name in trait_names
        if environ.get(ENV_PREFIX + name.upper(), "") != ""
    }


# SANDBOX_KERNEL_* names that are not settings: set by the server extension for its
# kernels, a switch of the local backend, and the test suite's own switches.
OTHER_ENV = frozenset({"SERVER_ROOT", "NOTEBOOK_DIR", "OWNER_FROM", "LOCAL_NO_BWRAP"})
TEST_ENV_PREFIXES = ("TEST_", "REQUIRE_")


def unknown_env_names(environ: Mapping[str, str]) -> list[str]:
    """``SANDBOX_KERNEL_*`` variables that name no setting (a misspelt one is ignored
    otherwise: the user would wonder why their flavor did not apply)."""
    known = {name.upper() for name in SandboxConfig.class_trait_names(config=True)} | OTHER_ENV
    return sorted(
        key
        for key in environ
        if key.startswith(ENV_PREFIX)
        and key[len(ENV_PREFIX) :] not in known
        and not key[len(ENV_PREFIX) :].startswith(TEST_ENV_PREFIXES)
    )


@lru_cache(maxsize=64)
def _warn_unknown_env(names: tuple[str, ...]) -> None:
    """Once per process and set of names (load_config runs on every request)."""
    known = [ENV_PREFIX + n.upper() for n in SandboxConfig.class_trait_names(config=True)]
    for name in names:
        close = difflib.get_close_matches(name, known, n=1)
        hint = (
            f"; did you mean {close[0]}?" if close else f"; settings are {', '.join(sorted(known))}"
        )
        log.warning("ignoring %s: no such setting%s", name, hint)


def load_config(
    config: Config | None = None,
    environ: dict[str, str] | None = None,
    **overrides: Any,
) -> SandboxConfig:
    """Build the settings from config files, ``config`` (a server's), the environment and overrides.

    Raises :class:`ConfigError` naming the bad setting instead of a traitlets traceback.
    """
    env: Mapping[str, str] = os.environ if environ is None else environ
    unknown_env = unknown_env_names(env)
    if unknown_env:
        _warn_unknown_env(tuple(unknown_env))
    merged = _file_config(jupyter_config_path())
    if config is not None:
        merged.merge(config)
    section = merged.get("SandboxConfig", {})
    trait_names = SandboxConfig.class_trait_names(config=True)
    unknown = sorted(set(section) - set(trait_names))
    if unknown:
        raise ConfigError(
            f"unknown setting c.SandboxConfig.{unknown[0]}; known settings: {', '.join(sorted(trait_names))}"
        )
    cfg = SandboxConfig()
    _apply(cfg, [(k, v, f"c.SandboxConfig.{k}") for k, v in section.items()])
    # What the configuration files say: the administrator's policy, and the baseline
    # that personal choices (variants) are told apart from.
    cfg.file_values = {name: getattr(cfg, name) for name in section}
    later: list[tuple[str, Any, str]] = []
    for name, raw in _env_overrides(trait_names, env).items():
        later.append((name, raw, ENV_PREFIX + name.upper()))
    later.extend((k, v, k) for k, v in overrides.items() if v is not None)
    asked = set()
    for name, value, source in later:
        if name in section and name not in PERSONAL and value != section[name]:
            # The environment (a kernelspec, a user's shell) never loosens policy the
            # administrator wrote down; it says so in the log instead of failing.
            log.warning(
                "ignoring %s=%r: c.SandboxConfig.%s is set by the administrator's configuration",
                source,
                value,
                name,
            )
            continue
        _apply(cfg, [(name, value, source)])
        asked.add(name)
    cfg.asked = frozenset(asked)
    _check_allowed(cfg)
    _check_mappings(cfg)
    return cfg


def _apply(cfg: SandboxConfig, values: list[tuple[str, Any, str]]) -> None:
    trait_names = SandboxConfig.class_trait_names(config=True)
    for name, value, source in values:
        if name not in trait_names:
            raise ConfigError(f"unknown setting {name!r}")
        trait = cfg.traits()[name]
        try:
            if isinstance(value, str) and isinstance(trait, Dict):
                value = json_table(value)
            elif isinstance(value, str) and isinstance(trait, List):
                value = text_list(value)
            elif isinstance(value, str) and not isinstance(trait, Unicode):
                value = trait.from_string(value)
            setattr(cfg, name, value)
        except (TraitError, ValueError) as exc:
            accepted = ""
            if isinstance(trait, Enum):
                accepted = f" (accepted: {', '.join(map(str, trait.values or []))})"
            where = source if source != name else setting_names(name)
            # A table's or list's error names its entry; the whole would only drown it.
            shown = "" if isinstance(trait, (Dict, List)) else f" {value!r}"
            raise ConfigError(
                f"bad value{shown} for {where}: {short_trait_error(exc, trait)}{accepted}"
            ) from None


def _check_mappings(cfg: SandboxConfig) -> None:
    """The mapped folders together, against what no sandbox may see on this host."""
    guarded = mappings.guards(cfg.state_dir, cfg.workspace_root)
    try:
        mappings.check(cfg.mappings, guarded, cfg.shared_folder)
    except mappings.VolumeError as exc:
        raise ConfigError(f"bad value for {setting_names('volumes')}: {exc}") from None


def _check_allowed(cfg: SandboxConfig) -> None:
    """Personal choices stay among what the administrator allows."""
    cfg.flavor_sizes()  # a flavor the table does not have
    if cfg.allowed_flavors and cfg.flavor not in cfg.allowed_flavors:
        raise ConfigError(
            f"flavor {cfg.flavor!r} is not allowed here ({setting_names('flavor')}); "
            f"allowed: {', '.join(cfg.allowed_flavors)}"
        )
    if cfg.allowed_images and cfg.image not in cfg.allowed_images:
        raise ConfigError(
            f"image {cfg.image!r} is not allowed here ({setting_names('image')}); "
            f"allowed: {', '.join(cfg.allowed_images)}"
        )
