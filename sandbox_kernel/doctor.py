"""``sandbox-kernel doctor``: whether this machine can run the kernel, in a few lines.

Each check is one line, ``ok: ...``, ``problem: <what is wrong>; <what to do>`` or
``skipped: <why>``, in the order a first notebook needs them: the engine answers, the
image is here, the sandbox starts, it reaches the package index, it can write its
folders. The sandbox checked is yours for the folder you are in, the one ``exec`` and a
notebook here use (made or started if needed, and kept: your first notebook then
starts at once); nothing else is made or changed.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from .backends.base import WORKSPACE, SandboxInfo
from .config import SandboxConfig
from .errors import SandboxError, shorten
from .identity import ScopeKey
from .service import SandboxService

INDEX_TIMEOUT = 10.0  # seconds the sandbox waits for the package index
EXEC_TIMEOUT = 45.0  # seconds any one check may take in the sandbox
DEFAULT_INDEX = "https://pypi.org/simple/"

# Asks the package index pip would use, through whatever proxy, certificates and pip
# configuration the sandbox has: pip itself (`pip index versions pip`, which reads its
# configuration as `%pip install` does) where the image has pip, else one GET of the
# index's page for pip (PIP_INDEX_URL, else PyPI). A password in the URL is never shown.
_INDEX_PROBE = r"""
import base64, json, os, re, ssl, subprocess, sys, urllib.error, urllib.parse, urllib.request
parts = urllib.parse.urlsplit(os.environ.get("PIP_INDEX_URL") or sys.argv[1])
host = parts.hostname or ""
host = "[%s]" % host if ":" in host else host
shown = urllib.parse.urlunsplit(parts._replace(netloc=host + (":%d" % parts.port if parts.port else "")))
out = {"url": shown, "trust": os.environ.get("SSL_CERT_FILE", "")}
seconds = float(sys.argv[2])
try:
    import pip  # noqa: F401 (only whether the image has it)
except ImportError:
    pip = None
if pip is not None:
    out["via"] = "pip"
    try:  # -vvv: only pip's debug lines say what the index answered, or why it did not
        done = subprocess.run(
            [sys.executable, "-m", "pip", "index", "versions", "pip", "--disable-pip-version-check",
             "--retries", "0", "--timeout", sys.argv[2], "-vvv"],
            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, universal_newlines=True,
            timeout=seconds * 2 + 10,
        )
        text = done.stdout
    except subprocess.TimeoutExpired:
        done, text = None, "no answer within %g s" % (seconds * 2 + 10)
    lines = [l.strip() for l in text.splitlines() if l.strip()]
    def first(*marks):
        return next((l for l in lines if any(m in l for m in marks)), "")
    answered = re.search(r'"GET [^"]*" (\d{3}) ', text)
    tls = first("CERTIFICATE_VERIFY_FAILED", "certificate verify failed", "SSLError")
    if tls:
        out["tls"], out["error"] = True, tls
    elif answered:
        out["status"] = int(answered.group(1))
    elif done is None:
        out["error"] = text
    else:
        out["error"] = first("Could not fetch URL", "Max retries", "Failed to establish", "timed out", "ProxyError") or (lines[-1] if lines else "pip said nothing")
else:
    out["via"] = "HTTP"
    request = urllib.request.Request(shown.rstrip("/") + "/pip/")
    if parts.username:
        pair = "%s:%s" % (urllib.parse.unquote(parts.username), urllib.parse.unquote(parts.password or ""))
        request.add_header("Authorization", "Basic " + base64.b64encode(pair.encode()).decode())
    try:
        with urllib.request.urlopen(request, timeout=seconds) as answer:
            out["status"] = answer.status
    except urllib.error.HTTPError as exc:
        out["status"] = exc.code
    except Exception as exc:
        reason = getattr(exc, "reason", exc)
        out["tls"] = isinstance(reason, ssl.SSLError)
        out["error"] = (str(reason) or type(reason).__name__)[:2000]
status = out.get("status")
out["reached"] = isinstance(status, int) and (status < 400 or status in (401, 403, 404))
out["error"] = str(out.get("error", ""))[:2000]
print(json.dumps(out))
"""

# Writes and removes a file in each folder given: what cells do there.
_WRITE_PROBE = r"""
import json, os, sys
said = {}
for folder in sys.argv[1:]:
    path = os.path.join(folder, ".sandbox-kernel-doctor-%d" % os.getpid())
    try:
        with open(path, "x") as f:
            f.write("ok")
        os.unlink(path)
        said[folder] = ""
    except OSError as exc:
        said[folder] = exc.strerror or str(exc)
print(json.dumps(said))
"""


@dataclass
class Check:
    """One line of the doctor's answer."""

    name: str
    state: str  # "ok" | "problem" | "skipped" | "limited" (a limit to know, nothing to fix)
    text: str

    def __str__(self) -> str:
        return f"{self.name:<10} {self.state}: {self.text}"


def examine(service: SandboxService, cfg: SandboxConfig, user: str, here: str) -> list[Check]:
    """Every check, in order; later ones are skipped when an earlier one failed."""
    engine, usable = _engine(service)
    checks = [engine]
    if not usable:
        skipped = ("image", "sandbox", "index", "workspace")
        return checks + [Check(n, "skipped", "no engine") for n in skipped]
    checks.append(_image(service, cfg, user))
    info = None
    if checks[-1].state == "problem":
        checks.append(Check("sandbox", "skipped", "nothing to make it from"))
    else:
        sandbox, info = _sandbox(service, user, here)
        checks.append(sandbox)
    if info is None:
        return checks + [Check(n, "skipped", "no sandbox") for n in ("index", "workspace")]
    checks += [_index(service, cfg, info), _writable(service, info, here)]
    return checks + ([_guard(cfg, info)] if info.backend == "docker" and info.work_folder else [])


def _engine(service: SandboxService) -> tuple[Check, bool]:
    """The engine's line, and whether sandboxes can be made at all."""
    try:
        backend = service.backend
    except SandboxError as exc:
        return Check("engine", "problem", str(exc)), False
    health = backend.health()
    if not health.ok:
        return Check("engine", "problem", health.message), False
    return _engine_line(backend.name, backend.fallback, health.message), True


def _engine_line(name: str, fallback: str, message: str) -> Check:
    if name == "local" and fallback:
        return Check(
            "engine",
            "problem",
            f"{fallback}, so sandboxes would be {message}: weaker than a container; start "
            "Docker for container isolation, or set SANDBOX_KERNEL_BACKEND=local to choose "
            "this on purpose",
        )
    return Check("engine", "ok", f"{message} (backend {name})")


def _image(service: SandboxService, cfg: SandboxConfig, user: str) -> Check:
    backend = service.backend
    if not backend.uses_images:
        return Check("image", "ok", "none needed (the local backend runs this host's Python)")
    if cfg.snapshot:
        try:
            service.owned_snapshot(user, cfg.snapshot)
        except SandboxError as exc:
            return Check("image", "problem", str(exc))
        return Check("image", "ok", f"sandboxes start from your snapshot {cfg.snapshot}")
    present = getattr(backend, "image_present", None)
    if present is None:  # Daytona: its snapshots live in the service
        return Check("image", "ok", f"{cfg.image} (made by the {backend.name} service)")
    try:
        if present(cfg.image):
            return Check("image", "ok", f"{cfg.image} is here")
        others = backend.local_images()  # type: ignore[attr-defined]
    except SandboxError as exc:
        return Check("image", "problem", str(exc))
    hint = f", e.g. {', '.join(others[:5])}" if others else ""
    return Check(
        "image",
        "problem",
        f"{cfg.image} is not here, and the first kernel would pull it from "
        f"{registry_of(cfg.image)}; where no registry answers, load it (`docker load -i "
        f"FILE`) or set SANDBOX_KERNEL_IMAGE to an image you have with python3{hint}",
    )


def registry_of(image: str) -> str:
    """Where Docker would pull ``image`` from, as a user would name it."""
    first, _, rest = image.partition("/")
    if rest and ("." in first or ":" in first or first == "localhost"):
        return first
    return "Docker Hub (docker.io)"


def _sandbox(service: SandboxService, user: str, here: str) -> tuple[Check, SandboxInfo | None]:
    try:
        work = service.work_folder(here, user=user)
        ensured = service.ensure(ScopeKey(user), work_folder=work)
    except SandboxError as exc:
        return Check("sandbox", "problem", str(exc)), None
    info = ensured.info
    how = {"existing": "was running", "created": "made now", "started": "started now"}.get(
        ensured.event, ensured.event
    )
    folder = f"cells here run in {here}" if info.work_folder else f"cells run in {WORKSPACE}"
    notes = "".join(f"; {note}" for note in ensured.notes)
    return Check("sandbox", "ok", f"{info.id} runs ({how}); {folder}{notes}"), info


def _run(service: SandboxService, info: SandboxInfo, script: str, *args: str) -> dict[str, Any]:
    """What ``script`` printed last, as JSON: written by the sandbox, so only its plain
    values are kept, and text without control characters (it reaches your terminal)."""
    result = service.exec(info, ["python3", "-I", "-c", script, *args], timeout=EXEC_TIMEOUT)
    text = result.output.decode("utf-8", "replace").strip()
    try:
        said = json.loads(text.splitlines()[-1])
    except (ValueError, IndexError):
        said = None
    if not isinstance(said, dict):
        raise SandboxError(
            f"the check did not run in {info.id} (exit code {result.exit_code}): {_plain(text[-200:])}"
        )
    return {
        str(k): _plain(v) if isinstance(v, str) else v
        for k, v in said.items()
        if isinstance(v, (str, int, bool)) and not isinstance(v, float)
    }


def _plain(text: str) -> str:
    """``text`` without control characters (no escape sequence reaches the terminal)."""
    return "".join(c if c.isprintable() else " " for c in text)


def _index(service: SandboxService, cfg: SandboxConfig, info: SandboxInfo) -> Check:
    if not cfg.network:
        return Check("index", "skipped", "sandboxes have no network (SANDBOX_KERNEL_NETWORK)")
    try:
        said = _run(service, info, _INDEX_PROBE, DEFAULT_INDEX, str(INDEX_TIMEOUT))
    except SandboxError as exc:
        return Check("index", "problem", str(exc))
    url, status = said.get("url", "the index"), said.get("status")
    if said.get("reached"):
        how = " to pip" if said.get("via") == "pip" else ""
        return Check("index", "ok", f"{url} answers from the sandbox (HTTP {status}{how})")
    if status == 407:
        return Check(
            "index",
            "problem",
            f"the proxy wants credentials to reach {url}: list your proxy variables in "
            "c.SandboxConfig.pass_env (SANDBOX_KERNEL_PASS_ENV) so sandboxes get them as they are",
        )
    if status is not None and not said.get("error"):
        return Check("index", "problem", f"{url} answered HTTP {status} to the sandbox")
    error = shorten(str(said.get("error") or "no answer"), 240)  # untrusted, and pip is wordy
    if said.get("tls"):
        remake = ""
        if not said.get("trust") and cfg.ca_bundle != "none":
            remake = (
                f"; {info.id} was made without this host's certificates: "
                f"`sandbox-kernel destroy {info.id}` (your files are kept) and it is made anew with them"
            )
        return Check(
            "index",
            "problem",
            f"the sandbox does not trust {url} ({error}): set SANDBOX_KERNEL_CA_BUNDLE / "
            "c.SandboxConfig.ca_bundle to a PEM file with the certificate authority of your "
            f"proxy or index{remake}",
        )
    return Check(
        "index",
        "problem",
        f"the sandbox cannot reach {url} ({error}): behind a proxy, set HTTPS_PROXY where "
        "you start Jupyter (sandboxes inherit it, see c.SandboxConfig.pass_env), or set "
        "PIP_INDEX_URL to an index you can reach",
    )


def _writable(service: SandboxService, info: SandboxInfo, here: str) -> Check:
    folders = [WORKSPACE]
    work = info.work_folder
    if work and (here == work or here.startswith(work.rstrip("/") + "/")):
        folders.append(here)
    try:
        said = _run(service, info, _WRITE_PROBE, *folders)
    except SandboxError as exc:
        return Check("workspace", "problem", str(exc))
    failed = {folder: why for folder, why in said.items() if why}
    if not failed:
        return Check("workspace", "ok", f"{' and '.join(folders)} writable from the sandbox")
    where = {WORKSPACE: info.workspace}
    text = "; ".join(
        f"cannot write {folder} ({why}): the host folder {where.get(folder, folder)} must be "
        f"writable by the sandbox's user ({info.file_owner or 'the server user'})"
        for folder, why in failed.items()
    )
    return Check("workspace", "problem", text)


def _guard(cfg: SandboxConfig, info: SandboxInfo) -> Check:
    """Whether the kernel refuses protected names the sandbox makes in its work folder
    after it started (see backends/lsm_guard.py): not a problem to fix, a limit to know."""
    from .backends.lsm_guard import remembered

    why = remembered(cfg.state_dir) if cfg.protected_paths else "protected_paths is empty"
    if why == "":
        return Check("guard", "ok", "protected names made after a start are refused by the kernel")
    return Check(
        "guard",
        "limited",
        f"protected names made after a start are not refused ({why or 'not known yet'}): "
        "a repository a cell makes in your folder takes effect at its next start; run git "
        "there only after that, or use work_mount = ro",
    )


def doctor_lines(service: SandboxService, cfg: SandboxConfig, user: str, here: str) -> list[str]:
    """The answer as printed; see :func:`examine`."""
    return [str(check) for check in examine(service, cfg, user, str(Path(here).resolve()))]
