"""The certificates sandboxes trust, made on the host for them.

A machine behind a TLS-intercepting proxy, or with a private package index, trusts a
certificate authority that images know nothing of: the host's ``pip`` works and the
sandbox's fails with ``CERTIFICATE_VERIFY_FAILED``. So sandboxes get a bundle made
here (``c.SandboxConfig.ca_bundle``):

* by default the host's own trust store (the file its OpenSSL reads: public
  certificates, and whatever authority the host's administrator added to it). Nothing
  in it is secret;
* with ``ca_bundle`` naming a file, that file's certificates in addition;
* with ``ca_bundle = "none"``, nothing: sandboxes keep what their image trusts.

The bundle is written to ``<state dir>/trust/`` (replaced whole by a rename, so a
reader never sees half of it, and running sandboxes see the new one), mounted
read-only in every sandbox at :data:`INSIDE`, and named by the variables that
OpenSSL, pip, requests, curl, git and Node read (:func:`trust_env`). It *replaces*
the image's store for them, which is why the host's public certificates are in it.
"""

from __future__ import annotations

import hashlib
import logging
import os
import re
from collections.abc import Mapping
from functools import lru_cache
from pathlib import Path

from .config import SandboxConfig
from .errors import SandboxError

log = logging.getLogger("sandbox_kernel")

#: The folder that holds the bundle inside a sandbox (a read-only mount).
INSIDE = "/etc/sandbox-kernel/trust"
BUNDLE = "ca-certificates.crt"
LIMIT = 16 << 20  # bytes of any one certificate file we read

# Where Linux distributions keep the system's bundle, after what OpenSSL says itself.
_KNOWN = (
    "/etc/ssl/certs/ca-certificates.crt",  # Debian, Ubuntu, Alpine, Arch
    "/etc/pki/tls/certs/ca-bundle.crt",  # Fedora, RHEL
    "/etc/ssl/ca-bundle.pem",  # openSUSE
    "/etc/ssl/cert.pem",  # macOS, Alpine
)


def host_store() -> Path | None:
    """The file of certificates this host's OpenSSL trusts (``SSL_CERT_FILE`` first,
    as OpenSSL reads it), or None when there is none."""
    import ssl  # not before a kernel's start needs it (see early_start)

    paths = ssl.get_default_verify_paths()
    for candidate in (
        os.environ.get("SSL_CERT_FILE"),
        paths.cafile,
        paths.openssl_cafile,
        *_KNOWN,
    ):
        if candidate and Path(candidate).is_file():
            return Path(candidate)
    return None


def _read(path: Path) -> bytes:
    with path.open("rb") as f:
        data = f.read(LIMIT + 1)
    if len(data) > LIMIT:
        raise SandboxError(f"{path} is larger than {LIMIT >> 20} MB: not a certificate bundle")
    return data


def bundle(ca_bundle: str) -> bytes:
    """What sandboxes trust under the setting ``ca_bundle`` (b"" for "none")."""
    if ca_bundle == "none":
        return b""
    parts = []
    store = host_store()
    if store is not None:
        parts.append(_read(store))
    if ca_bundle:
        try:
            parts.append(_read(Path(ca_bundle)))
        except OSError as exc:
            raise SandboxError(
                f"cannot read the CA bundle {ca_bundle} ({exc.strerror}); fix or unset "
                "SANDBOX_KERNEL_CA_BUNDLE / c.SandboxConfig.ca_bundle"
            ) from None
    return b"\n".join(part.rstrip(b"\n") for part in parts if part.strip()) + b"\n"


def _stamp(ca_bundle: str) -> str:
    """What the bundle is made of, as the file system says it (names, sizes, times): a
    bundle made from the same stamp needs no second look."""
    parts = [ca_bundle]
    for source in (host_store(), Path(ca_bundle) if ca_bundle not in ("", "none") else None):
        try:
            info = source.stat() if source is not None else None
        except OSError:
            info = None
        parts.append(f"{source}:{info.st_size}:{info.st_mtime_ns}" if info else f"{source}:-")
    return "|".join(parts)


def write_bundle(state_dir: str, ca_bundle: str) -> Path | None:
    """The host folder to mount at :data:`INSIDE`, its bundle up to date; None when
    sandboxes are to keep their image's store (``none``, or no certificate at all).
    Cheap when nothing changed (every kernel's start asks: see refresh in the backends)."""
    folder = Path(state_dir) / "trust"
    target = folder / BUNDLE
    stamp = _stamp(ca_bundle)
    stamp_file = Path(state_dir) / "trust.stamp"  # beside it: the sandboxes see only the bundle
    try:
        if target.is_file() and stamp_file.read_text() == stamp:
            return folder
    except OSError:
        pass
    data = bundle(ca_bundle)
    if not data.strip():
        return None
    try:
        folder.mkdir(parents=True, exist_ok=True)
        folder.chmod(0o755)  # read inside the sandbox, by its own user
        if not (target.is_file() and not target.is_symlink() and _same(target, data)):
            _replace(folder, BUNDLE, data, 0o644)
        _replace(stamp_file.parent, stamp_file.name, stamp.encode(), 0o600)
    except OSError as exc:
        raise SandboxError(
            f"cannot write the sandboxes' CA bundle in {folder} ({exc.strerror}); check "
            "SANDBOX_KERNEL_STATE_DIR / c.SandboxConfig.state_dir"
        ) from None
    return folder


def _replace(folder: Path, name: str, data: bytes, mode: int) -> None:
    """``folder/name`` replaced whole by a rename: readers see the old or the new."""
    temporary = folder / f".{name}.{os.getpid()}"
    fd = os.open(temporary, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_NOFOLLOW, mode)
    try:
        write_all(fd, data)
        os.fchmod(fd, mode)
    finally:
        os.close(fd)
    os.replace(temporary, folder / name)


def write_all(fd: int, data: bytes) -> None:
    """All of ``data`` to ``fd`` (one write may take less)."""
    view = memoryview(data)
    while view:
        view = view[os.write(fd, view) :]


def _same(path: Path, data: bytes) -> bool:
    try:
        return hashlib.sha256(_read(path)).digest() == hashlib.sha256(data).digest()
    except (OSError, SandboxError):
        return False


def trust_env() -> dict[str, str]:
    """The variables by which a sandbox's programs find the bundle where nothing else is
    configured: OpenSSL's default file (Python's ``ssl``, pip's system store from pip 24.2
    on, tools that take OpenSSL's defaults) and Node's extra certificates. Neither
    overrides a file a program or its configuration names (an image's ``pip.conf``
    ``cert``), so they are set in every container that has the bundle."""
    path = f"{INSIDE}/{BUNDLE}"
    return {"SSL_CERT_FILE": path, "NODE_EXTRA_CA_CERTS": path}


def named_env() -> dict[str, str]:
    """The variables that make the bundle *the* trust store of pip, requests, curl and
    git, over what their own configuration says (requests lets ``REQUESTS_CA_BUNDLE``
    override even pip's configured ``cert``): given to a sandbox's processes only when
    the administrator named a ``ca_bundle``, i.e. said that sandboxes trust it."""
    path = f"{INSIDE}/{BUNDLE}"
    return {
        "PIP_CERT": path,
        "REQUESTS_CA_BUNDLE": path,
        "CURL_CA_BUNDLE": path,
        "GIT_SSL_CAINFO": path,
    }


def passed_env(cfg: SandboxConfig, environ: Mapping[str, str] | None = None) -> dict[str, str]:
    """The variables (of ``environ``, this process's by default) that sandboxes inherit.

    Public settings flow by default; a credential never without someone's word: a value
    of a default name with a user or password in a URL is left out (and logged) unless
    ``pass_env`` was set in a configuration file or the environment."""
    env = os.environ if environ is None else environ
    on_purpose = "pass_env" in cfg.file_values or "pass_env" in cfg.asked
    passed = {}
    for name in cfg.pass_env:
        value = env.get(name)
        if value is None:
            continue
        if not on_purpose and _CREDENTIAL.search(value):
            _warn_credential(name)
            continue
        passed[name] = value
    return passed


_CREDENTIAL = re.compile(r"://[^/@\s]+@")


@lru_cache(maxsize=32)
def _warn_credential(name: str) -> None:
    log.warning(
        "not passing %s to sandboxes: it holds a credential; list it in "
        "c.SandboxConfig.pass_env (or SANDBOX_KERNEL_PASS_ENV) to pass it",
        name,
    )
