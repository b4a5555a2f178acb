"""`%pip install` behind a private CA, and what sandboxes inherit from the host.

A package index of the test's own, on this machine only: HTTPS with a certificate signed
by a certificate authority the test makes (no image and no host store trusts it),
serving a PEP 503 simple index and a wheel made by ``make_wheel``, listening on the
sandbox network's gateway address (a sandbox reaches the host there, and nothing
else does). A cell's ``%pip install`` from it fails until ``ca_bundle`` names the CA,
then works in the same sandbox; an index URL with a password reaches a sandbox only
when ``pass_env`` names it on purpose; ``sandbox-kernel doctor`` says which it is.
Real Docker, real pip in the sandbox; no traffic leaves the machine.
"""

from __future__ import annotations

import base64
import datetime
import hashlib
import http.server
import ipaddress
import json
import os
import ssl
import subprocess
import sys
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import docker
import pytest
from jupyter_client.manager import start_new_kernel

from sandbox_kernel.identity import ScopeKey
from sandbox_kernel.service import SandboxService

from .conftest import remove_user_containers
from .helpers import make_wheel
from .kernel_env import KernelEnv, make_kernel_env

pytestmark = pytest.mark.docker

USER, PASSWORD = "ci", "s3cret-index-password"


def make_pki(folder: Path, address: str) -> tuple[Path, Path, Path]:
    """A CA of the test's own, and a server certificate it signed for ``address``:
    (CA certificate, server certificate, server key), PEM files."""
    from cryptography import x509
    from cryptography.hazmat.primitives import hashes, serialization
    from cryptography.hazmat.primitives.asymmetric import ec
    from cryptography.x509.oid import NameOID

    now = datetime.datetime.now(datetime.timezone.utc)
    ca_key = ec.generate_private_key(ec.SECP256R1())
    ca_name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "sandbox-kernel test CA")])
    ca = (
        x509.CertificateBuilder()
        .subject_name(ca_name)
        .issuer_name(ca_name)
        .public_key(ca_key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - datetime.timedelta(hours=1))
        .not_valid_after(now + datetime.timedelta(days=1))
        .add_extension(x509.BasicConstraints(ca=True, path_length=None), critical=True)
        .add_extension(
            x509.KeyUsage(
                digital_signature=True,
                key_cert_sign=True,
                crl_sign=True,
                content_commitment=False,
                key_encipherment=False,
                data_encipherment=False,
                key_agreement=False,
                encipher_only=False,
                decipher_only=False,
            ),
            critical=True,
        )
        .add_extension(
            x509.SubjectKeyIdentifier.from_public_key(ca_key.public_key()), critical=False
        )
        .sign(ca_key, hashes.SHA256())
    )
    key = ec.generate_private_key(ec.SECP256R1())
    cert = (
        x509.CertificateBuilder()
        .subject_name(x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, address)]))
        .issuer_name(ca_name)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - datetime.timedelta(hours=1))
        .not_valid_after(now + datetime.timedelta(days=1))
        .add_extension(
            x509.SubjectAlternativeName([x509.IPAddress(ipaddress.ip_address(address))]),
            critical=False,
        )
        .add_extension(x509.BasicConstraints(ca=False, path_length=None), critical=True)
        .add_extension(
            x509.ExtendedKeyUsage([x509.oid.ExtendedKeyUsageOID.SERVER_AUTH]), critical=False
        )
        .add_extension(
            x509.AuthorityKeyIdentifier.from_issuer_public_key(ca_key.public_key()),
            critical=False,
        )
        .sign(ca_key, hashes.SHA256())
    )
    folder.mkdir(parents=True, exist_ok=True)
    paths = folder / "ca.pem", folder / "server.pem", folder / "server.key"
    paths[0].write_bytes(ca.public_bytes(serialization.Encoding.PEM))
    paths[1].write_bytes(cert.public_bytes(serialization.Encoding.PEM))
    paths[2].write_bytes(
        key.private_bytes(
            serialization.Encoding.PEM,
            serialization.PrivateFormat.PKCS8,
            serialization.NoEncryption(),
        )
    )
    return paths


class Index:
    """A PEP 503 simple index over HTTPS, in a thread; ``auth`` pages need a password."""

    def __init__(self, address: str, cert: Path, key: Path, wheels: dict[str, Path]) -> None:
        self.wheels = wheels  # project name -> wheel
        self.secured: set[str] = set()  # projects that need USER:PASSWORD
        self.requests: list[str] = []
        index = self

        class Handler(http.server.BaseHTTPRequestHandler):
            def log_message(self, *args: Any) -> None:
                pass

            def do_GET(self) -> None:
                index.requests.append(self.path)
                parts = [p for p in self.path.split("/") if p]
                project = parts[1] if len(parts) > 1 else ""
                project = next((n for n, w in index.wheels.items() if w.name in parts), project)
                if project in index.secured and not self._authorized():
                    self.send_response(401)
                    self.send_header("WWW-Authenticate", 'Basic realm="index"')
                    self.end_headers()
                    return
                if parts[:1] == ["simple"] and project in index.wheels:
                    wheel = index.wheels[project]
                    digest = hashlib.sha256(wheel.read_bytes()).hexdigest()
                    body = f'<a href="/files/{wheel.name}#sha256={digest}">{wheel.name}</a>'
                    self._send(body.encode(), "text/html")
                elif parts[:1] == ["files"] and project in index.wheels:
                    self._send(index.wheels[project].read_bytes(), "application/octet-stream")
                else:
                    self.send_response(404)
                    self.end_headers()

            def _authorized(self) -> bool:
                pair = base64.b64encode(f"{USER}:{PASSWORD}".encode()).decode()
                return self.headers.get("Authorization") == f"Basic {pair}"

            def _send(self, body: bytes, kind: str) -> None:
                self.send_response(200)
                self.send_header("Content-Type", kind)
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

        self.server = http.server.ThreadingHTTPServer((address, 0), Handler)
        context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
        context.load_cert_chain(cert, key)
        self.server.socket = context.wrap_socket(self.server.socket, server_side=True)
        self.url = f"https://{address}:{self.server.server_address[1]}/simple/"
        threading.Thread(target=self.server.serve_forever, daemon=True).start()

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()


@pytest.fixture
def setup(tmp_path: Path) -> Iterator[tuple[KernelEnv, Index, Path]]:
    """The test kernelspec, its user's sandbox (made first: the network's gateway is
    where the index listens) and the index, with its CA's certificate."""
    kenv = make_kernel_env(tmp_path / "k")
    SandboxService(kenv.config()).ensure(ScopeKey(kenv.user))
    network = docker.from_env().networks.get("sandbox-kernel")
    gateway = network.attrs["IPAM"]["Config"][0]["Gateway"]
    ca, cert, key = make_pki(tmp_path / "pki", gateway)
    wheels = {
        "sk-demo-pkg": make_wheel(tmp_path / "wheels"),
        "sk-auth-pkg": make_wheel(tmp_path / "wheels", name="sk_auth_pkg", version="2.0"),
    }
    index = Index(gateway, cert, key, wheels)
    index.secured.add("sk-auth-pkg")
    try:
        yield kenv, index, ca
    finally:
        index.close()
        remove_user_containers(kenv.user)


def set_kernel_env(kenv: KernelEnv, **values: str | None) -> None:
    """Change what the test kernelspec's kernels start with (None: unset)."""
    path = Path(kenv.jupyter_path) / "kernels" / "sandbox" / "kernel.json"
    spec = json.loads(path.read_text())
    for name, value in values.items():
        if value is None:
            spec["env"].pop(name, None)
        else:
            spec["env"][name] = value
    path.write_text(json.dumps(spec))


def cell(kenv: KernelEnv, code: str) -> tuple[dict[str, Any], str]:
    """Run ``code`` in a new kernel of the test kernelspec: (reply, everything shown)."""
    km, kc = start_new_kernel(kernel_name="sandbox", env=_without_proxies(os.environ))
    try:
        shown: list[str] = []
        reply = kc.execute_interactive(
            code,
            timeout=180,
            output_hook=lambda m: shown.append(
                m["content"].get("text", "") + "\n".join(m["content"].get("traceback", []))
            ),
        )
        return reply["content"], "".join(shown)
    finally:
        kc.stop_channels()
        km.shutdown_kernel(now=True)


def _without_proxies(environ: Any) -> dict[str, str]:
    """This process's environment without proxy settings: the index is on this host."""
    return {k: v for k, v in environ.items() if "proxy" not in k.lower()}


PIP = "%pip install --no-cache-dir --retries 0 --timeout 20 --disable-pip-version-check"


def test_pip_in_a_cell_trusts_the_index_only_with_ca_bundle(
    setup: tuple[KernelEnv, Index, Path], monkeypatch: pytest.MonkeyPatch
) -> None:
    kenv, index, ca = setup
    monkeypatch.setenv("JUPYTER_PATH", kenv.jupyter_path)
    install = f"{PIP} --index-url {index.url} sk_demo_pkg"
    reply, shown = cell(kenv, install + "\nimport sk_demo_pkg")
    assert reply["status"] == "error" and reply["ename"] == "ModuleNotFoundError", shown
    assert "CERTIFICATE_VERIFY_FAILED" in shown or "certificate verify failed" in shown, shown
    assert not any(r.startswith("/files/") for r in index.requests)  # TLS refused first
    # The administrator names the CA: the same sandbox trusts it from the next kernel on.
    set_kernel_env(kenv, SANDBOX_KERNEL_CA_BUNDLE=str(ca))
    reply, shown = cell(kenv, install + "\nimport sk_demo_pkg; print(sk_demo_pkg.VALUE)")
    assert reply["status"] == "ok" and "1.0" in shown, shown
    assert any(r.startswith("/files/sk_demo_pkg") for r in index.requests)
    # requests-style and curl-style tools read the same bundle; the host's public
    # certificates are in it too (the bundle replaces the image's own store).
    reply, shown = cell(
        kenv,
        "import os, ssl\n"
        "names = ('SSL_CERT_FILE', 'PIP_CERT', 'REQUESTS_CA_BUNDLE', 'CURL_CA_BUNDLE')\n"
        "paths = {os.environ[n] for n in names}\n"
        "text = open(paths.pop()).read()\n"
        "print(len(paths), text.count('BEGIN CERTIFICATE') > 1, os.access(os.environ['SSL_CERT_FILE'], os.W_OK))",
    )
    assert reply["status"] == "ok" and shown.strip() == "0 True False", shown


def test_a_password_in_an_index_url_reaches_sandboxes_only_on_purpose(
    setup: tuple[KernelEnv, Index, Path], monkeypatch: pytest.MonkeyPatch
) -> None:
    kenv, index, ca = setup
    monkeypatch.setenv("JUPYTER_PATH", kenv.jupyter_path)
    secret_url = index.url.replace("https://", f"https://{USER}:{PASSWORD}@")
    set_kernel_env(kenv, SANDBOX_KERNEL_CA_BUNDLE=str(ca), PIP_INDEX_URL=secret_url)
    reply, shown = cell(kenv, "import os; print(os.environ.get('PIP_INDEX_URL'))")
    assert reply["status"] == "ok" and shown.strip() == "None", shown
    # Named in pass_env: passed as it is, and pip (no --index-url) installs through it.
    set_kernel_env(kenv, SANDBOX_KERNEL_PASS_ENV="PIP_INDEX_URL")
    reply, shown = cell(kenv, f"{PIP} sk_auth_pkg\nimport sk_auth_pkg; print(sk_auth_pkg.VALUE)")
    assert reply["status"] == "ok" and "2.0" in shown, shown
    # Every door of the sandbox inherits the same: a command by `sandbox-kernel exec`.
    cfg = kenv.config()
    env = {
        **_without_proxies(kenv.environ()),
        "SANDBOX_KERNEL_BACKEND": "docker",
        "SANDBOX_KERNEL_IMAGE": cfg.image,
        "SANDBOX_KERNEL_WORKSPACE_ROOT": cfg.workspace_root,
        "SANDBOX_KERNEL_STATE_DIR": cfg.state_dir,
        "SANDBOX_KERNEL_USER": kenv.user,
        "SANDBOX_KERNEL_WORK_ROOT": "none",
        "SANDBOX_KERNEL_PASS_ENV": "PIP_INDEX_URL",
        "PIP_INDEX_URL": secret_url,
    }
    cli = Path(sys.executable).parent / "sandbox-kernel"
    done = subprocess.run(
        [str(cli), "exec", "--", "printenv", "PIP_INDEX_URL"],
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == 0 and done.stdout.strip() == secret_url, done.stderr


def test_doctor_says_whether_the_sandbox_reaches_the_index(
    setup: tuple[KernelEnv, Index, Path], tmp_path: Path
) -> None:
    kenv, index, ca = setup
    cfg = kenv.config()
    env = {
        **_without_proxies(kenv.environ()),
        "SANDBOX_KERNEL_BACKEND": "docker",
        "SANDBOX_KERNEL_IMAGE": cfg.image,
        "SANDBOX_KERNEL_WORKSPACE_ROOT": cfg.workspace_root,
        "SANDBOX_KERNEL_STATE_DIR": cfg.state_dir,
        "SANDBOX_KERNEL_USER": kenv.user,
        "SANDBOX_KERNEL_WORK_ROOT": "none",
        "PIP_INDEX_URL": index.url,  # passed by default: no credential in it
    }
    cli = Path(sys.executable).parent / "sandbox-kernel"

    def doctor(**extra: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            [str(cli), "doctor"],
            env={**env, **extra},
            cwd=tmp_path,
            capture_output=True,
            text=True,
            timeout=120,
        )

    done = doctor()
    lines = dict(line.split(None, 1) for line in done.stdout.splitlines())
    assert done.returncode == 1, done.stdout + done.stderr
    assert lines["engine"].startswith("ok: Docker engine") and lines["image"].startswith("ok:")
    assert lines["sandbox"].startswith(f"ok: sk-{kenv.user} runs")
    assert lines["index"].startswith(f"problem: the sandbox does not trust {index.url}")
    assert "SANDBOX_KERNEL_CA_BUNDLE" in lines["index"]
    assert lines["workspace"] == "ok: /workspace writable from the sandbox"
    done = doctor(SANDBOX_KERNEL_CA_BUNDLE=str(ca))
    lines = dict(line.split(None, 1) for line in done.stdout.splitlines())
    assert done.returncode == 0, done.stdout + done.stderr
    assert lines["index"] == f"ok: {index.url} answers from the sandbox (HTTP 404 to pip)"
    # A password in the index URL is used, never shown.
    secret_url = index.url.replace("https://", f"https://{USER}:{PASSWORD}@")
    done = doctor(
        SANDBOX_KERNEL_CA_BUNDLE=str(ca),
        PIP_INDEX_URL=secret_url,
        SANDBOX_KERNEL_PASS_ENV="PIP_INDEX_URL",
    )
    assert done.returncode == 0 and PASSWORD not in done.stdout + done.stderr, done.stdout


def test_an_engine_elsewhere_gets_the_bundle_copied_in(tmp_path: Path) -> None:
    """An engine that is not on this host cannot mount the host's bundle: the bundle is
    written into the new container before its first start instead (root's, read-only
    to the sandbox), with the same variables naming it. Shown here by making the
    backend speak to this engine as to a remote one (through the SDK, no host paths)."""
    kenv = make_kernel_env(tmp_path / "k")
    ca, _, _ = make_pki(tmp_path / "pki", "127.0.0.1")
    service = SandboxService(kenv.config(ca_bundle=str(ca)))
    backend: Any = service.backend
    backend._wire = None  # as for an engine reached over TCP or SSH
    try:
        info = service.ensure(ScopeKey(kenv.user)).info
        container = docker.from_env().containers.get(info.engine_id)
        assert not [m for m in container.attrs["Mounts"] if "trust" in m["Destination"]]
        said = backend.exec(
            info.id,
            [
                "python3",
                "-c",
                "import os; p = os.environ['SSL_CERT_FILE']; s = os.stat(p); "
                "print(p, s.st_uid, oct(s.st_mode & 0o777), os.access(p, os.W_OK))",
            ],
        )
        path = "/etc/sandbox-kernel/trust/ca-certificates.crt"
        assert said.output.decode().split() == [path, "0", "0o644", "False"], said.output
        copied = b"".join(backend.get_file(info.id, path))
        assert ca.read_bytes().strip() in copied and copied.count(b"BEGIN CERTIFICATE") > 1
    finally:
        remove_user_containers(kenv.user)
