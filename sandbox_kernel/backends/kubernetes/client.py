"""How the backend reaches a Kubernetes API server: its settings and a small REST client.

The cluster comes from the usual places, as ``kubectl`` finds it: ``KUBECONFIG`` (the
first file of the list that exists), else ``~/.kube/config``, else the in-cluster
settings a pod gets (its service account's token and CA, ``KUBERNETES_SERVICE_HOST``).
A kubeconfig may authenticate with client certificates, a bearer token (or token file),
or an ``exec`` credential plugin (as cloud providers' kubeconfigs do).

Requests go over one kept-alive HTTPS connection per thread with the standard library
(no generated client: a kernel's start path stays light); answers are JSON, and every
error becomes one of ours with the server's own reason.
"""

from __future__ import annotations

import base64
import http.client
import json
import os
import ssl
import subprocess
import tempfile
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any
from urllib.parse import quote, urlencode, urlsplit

from ..base import (
    BadRequest,
    Conflict,
    EngineUnavailable,
    SandboxError,
    SandboxFailed,
    SandboxNotFound,
    epoch_of,
)

IN_CLUSTER = Path("/var/run/secrets/kubernetes.io/serviceaccount")
TIMEOUT = 30.0  # seconds for one API request
# A watch or long request may take longer; a dead connection is retried once.
RETRIES = 1


@dataclass
class ClusterConfig:
    """Where the API server is and how to prove who we are to it."""

    server: str
    namespace: str = "default"
    ca_file: str = ""
    insecure: bool = False
    cert_file: str = ""
    key_file: str = ""
    token: str = ""
    token_file: str = ""
    exec_plugin: dict[str, Any] = field(default_factory=dict)
    source: str = ""  # where it came from, for messages
    _token_expiry: float = 0.0
    _temp: list[str] = field(default_factory=list)

    def bearer(self) -> str:
        """The current bearer token, if this configuration uses one (read fresh: a
        projected service-account token is rotated on disk)."""
        if self.token_file:
            try:
                return Path(self.token_file).read_text().strip()
            except OSError as exc:
                raise EngineUnavailable(
                    f"cannot read the token file {self.token_file}: {exc}"
                ) from None
        if self.exec_plugin and (not self.token or time.time() > self._token_expiry - 60):
            self._run_exec_plugin()
        return self.token

    def _run_exec_plugin(self) -> None:
        plugin = self.exec_plugin
        env = dict(os.environ)
        for item in plugin.get("env") or []:
            env[str(item.get("name"))] = str(item.get("value"))
        command = [str(plugin.get("command")), *(str(a) for a in plugin.get("args") or [])]
        try:
            done = subprocess.run(command, env=env, capture_output=True, timeout=60, check=False)
        except (OSError, subprocess.TimeoutExpired) as exc:
            raise EngineUnavailable(
                f"the kubeconfig's credential plugin {command[0]!r} did not run: {exc}"
            ) from None
        try:
            status = json.loads(done.stdout)["status"]
        except (ValueError, KeyError, TypeError):
            raise EngineUnavailable(
                f"the kubeconfig's credential plugin {command[0]!r} gave no credential "
                f"(exit {done.returncode}): {done.stderr[-300:].decode('utf-8', 'replace').strip()}"
            ) from None
        self.token = str(status.get("token") or "")
        expiry = status.get("expirationTimestamp")
        self._token_expiry = epoch_of(expiry) if expiry else time.time() + 3600
        if status.get("clientCertificateData"):
            self.cert_file = self._keep(status["clientCertificateData"].encode())
            self.key_file = self._keep(status["clientKeyData"].encode())

    def _keep(self, data: bytes) -> str:
        """A private temporary file holding ``data`` (ssl loads certificates by path)."""
        fd, path = tempfile.mkstemp(prefix="sk-kube-")
        with os.fdopen(fd, "wb") as f:
            f.write(data)
        self._temp.append(path)
        return path

    def ssl_context(self) -> ssl.SSLContext:
        ctx = ssl.create_default_context(cafile=self.ca_file or None)
        if self.insecure:
            ctx.check_hostname = False
            ctx.verify_mode = ssl.CERT_NONE
        self.bearer()  # an exec plugin may hand out a client certificate
        if self.cert_file:
            ctx.load_cert_chain(self.cert_file, self.key_file or None)
        return ctx


def load_config(namespace: str = "") -> ClusterConfig:
    """The cluster's settings, as kubectl finds them (see the module's doc)."""
    paths = [p for p in os.environ.get("KUBECONFIG", "").split(os.pathsep) if p]
    if not paths:
        paths = [str(Path("~/.kube/config").expanduser())]
    for path in paths:
        if Path(path).is_file():
            cfg = _from_kubeconfig(Path(path))
            break
    else:
        if os.environ.get("KUBERNETES_SERVICE_HOST") and (IN_CLUSTER / "token").exists():
            cfg = _in_cluster()
        else:
            raise EngineUnavailable(
                "no Kubernetes cluster configured: set KUBECONFIG (or write ~/.kube/config), "
                "or run the server in a pod with a service account"
            )
    if namespace:
        cfg.namespace = namespace
    return cfg


def _in_cluster() -> ClusterConfig:
    host = os.environ["KUBERNETES_SERVICE_HOST"]
    port = os.environ.get("KUBERNETES_SERVICE_PORT", "443")
    if ":" in host:
        host = f"[{host}]"
    namespace = "default"
    try:
        namespace = (IN_CLUSTER / "namespace").read_text().strip() or namespace
    except OSError:
        pass
    return ClusterConfig(
        server=f"https://{host}:{port}",
        namespace=namespace,
        ca_file=str(IN_CLUSTER / "ca.crt"),
        token_file=str(IN_CLUSTER / "token"),
        source="the pod's service account",
    )


def _from_kubeconfig(path: Path) -> ClusterConfig:
    try:
        import yaml  # a kubeconfig is YAML (JSON is YAML too)

        doc = yaml.safe_load(path.read_text())
    except ImportError:
        doc = json.loads(path.read_text())
    except Exception as exc:
        raise EngineUnavailable(f"cannot read the kubeconfig {path}: {exc}") from None
    if not isinstance(doc, dict):
        raise EngineUnavailable(f"the kubeconfig {path} holds no configuration")

    def named(kind: str, name: str) -> dict[str, Any]:
        for item in doc.get(kind) or []:
            if isinstance(item, dict) and item.get("name") == name:
                return item
        raise EngineUnavailable(f"the kubeconfig {path} names {kind[:-1]} {name!r} but has none")

    current = doc.get("current-context")
    if not current:
        raise EngineUnavailable(f"the kubeconfig {path} has no current-context")
    context = named("contexts", current).get("context") or {}
    cluster = named("clusters", context.get("cluster", "")).get("cluster") or {}
    user = named("users", context.get("user", "")).get("user") or {} if context.get("user") else {}
    base = path.parent
    cfg = ClusterConfig(
        server=str(cluster.get("server", "")).rstrip("/"),
        namespace=str(context.get("namespace") or "default"),
        insecure=bool(cluster.get("insecure-skip-tls-verify")),
        token=str(user.get("token") or ""),
        token_file=_path(base, user.get("tokenFile")),
        exec_plugin=dict(user.get("exec") or {}),
        source=f"{path} (context {current})",
    )
    if not cfg.server:
        raise EngineUnavailable(f"the kubeconfig {path} gives no server for context {current!r}")
    cfg.ca_file = _file_or_data(cfg, base, cluster, "certificate-authority")
    cfg.cert_file = _file_or_data(cfg, base, user, "client-certificate")
    cfg.key_file = _file_or_data(cfg, base, user, "client-key")
    if user.get("username") and user.get("password"):
        raise EngineUnavailable(f"{cfg.source}: basic authentication is not supported; use a token")
    return cfg


def _path(base: Path, value: Any) -> str:
    return str(base / str(value)) if value else ""


def _file_or_data(cfg: ClusterConfig, base: Path, section: dict[str, Any], key: str) -> str:
    if section.get(f"{key}-data"):
        return cfg._keep(base64.b64decode(section[f"{key}-data"]))
    return _path(base, section.get(key))


class Api:
    """JSON requests to the API server; errors become ours, with the server's reason."""

    def __init__(self, cfg: ClusterConfig) -> None:
        self.cfg = cfg
        parts = urlsplit(cfg.server)
        self.secure = parts.scheme == "https"
        self.host = parts.hostname or "localhost"
        self.port = parts.port or (443 if self.secure else 80)
        self.prefix = parts.path.rstrip("/")
        self._ctx: ssl.SSLContext | None = None
        self._local = threading.local()

    @property
    def context(self) -> ssl.SSLContext | None:
        if self.secure and self._ctx is None:
            try:
                self._ctx = self.cfg.ssl_context()
            except (OSError, ssl.SSLError) as exc:
                raise EngineUnavailable(
                    f"cannot use the TLS settings of {self.cfg.source}: {exc}"
                ) from None
        return self._ctx

    def url(self, path: str, params: dict[str, Any] | None = None) -> str:
        scheme = "https" if self.secure else "http"
        query = f"?{urlencode(params, doseq=True)}" if params else ""
        return f"{scheme}://{self.host}:{self.port}{self.prefix}{path}{query}"

    def headers(self) -> dict[str, str]:
        token = self.cfg.bearer()
        return {"Authorization": f"Bearer {token}"} if token else {}

    def _connection(self, timeout: float) -> http.client.HTTPConnection:
        conn: http.client.HTTPConnection | None = getattr(self._local, "conn", None)
        if conn is None:
            if self.secure:
                conn = http.client.HTTPSConnection(
                    self.host, self.port, context=self.context, timeout=timeout
                )
            else:
                conn = http.client.HTTPConnection(self.host, self.port, timeout=timeout)
            self._local.conn = conn
        conn.timeout = timeout
        if conn.sock is not None:
            conn.sock.settimeout(timeout)
        return conn

    def _drop(self) -> None:
        conn = getattr(self._local, "conn", None)
        self._local.conn = None
        if conn is not None:
            conn.close()

    def request(
        self,
        method: str,
        path: str,
        body: Any = None,
        *,
        params: dict[str, Any] | None = None,
        what: str = "",
        timeout: float = TIMEOUT,
        content_type: str = "application/json",
    ) -> Any:
        """The decoded JSON answer of one request; an error status raises."""
        target = self.prefix + path + (f"?{urlencode(params, doseq=True)}" if params else "")
        data = json.dumps(body).encode() if body is not None else None
        headers = {"Accept": "application/json", **self.headers()}
        if data is not None:
            headers["Content-Type"] = content_type
        for attempt in range(RETRIES + 1):
            conn = self._connection(timeout)
            try:
                conn.request(method, target, body=data, headers=headers)
                response = conn.getresponse()
                raw = response.read()
                break
            except (OSError, http.client.HTTPException) as exc:
                self._drop()
                # A kept-alive connection the server closed: once more on a new one.
                if attempt < RETRIES and isinstance(
                    exc, (http.client.RemoteDisconnected, BrokenPipeError, ConnectionResetError)
                ):
                    continue
                raise EngineUnavailable(
                    f"cannot reach the Kubernetes API at {self.cfg.server} to {what or 'answer'} "
                    f"({exc.__class__.__name__}: {exc}); check KUBECONFIG and that the cluster runs"
                ) from None
        if response.status >= 400:
            raise error_of(response.status, raw, what)
        if not raw:
            return {}
        try:
            return json.loads(raw)
        except ValueError:
            raise SandboxError(
                f"the Kubernetes API answered {what or 'a request'} with something not JSON"
            ) from None

    def get(self, path: str, **kw: Any) -> Any:
        return self.request("GET", path, **kw)

    def maybe(self, path: str, what: str = "") -> Any:
        """GET ``path``; None when it is not there."""
        try:
            return self.request("GET", path, what=what)
        except SandboxNotFound:
            return None

    def post(self, path: str, body: Any, **kw: Any) -> Any:
        return self.request("POST", path, body, **kw)

    def patch(self, path: str, body: Any, **kw: Any) -> Any:
        return self.request("PATCH", path, body, content_type="application/merge-patch+json", **kw)

    def delete(self, path: str, body: Any = None, **kw: Any) -> bool:
        """Delete; False when it was not there."""
        try:
            self.request("DELETE", path, body, **kw)
        except SandboxNotFound:
            return False
        return True

    def watch(self, path: str, params: dict[str, Any], timeout: float) -> Iterator[dict[str, Any]]:
        """The events of one watch (a connection of its own), until ``timeout`` or its end."""
        params = {**params, "watch": "1", "timeoutSeconds": max(1, int(timeout))}
        if self.secure:
            conn: http.client.HTTPConnection = http.client.HTTPSConnection(
                self.host, self.port, context=self.context, timeout=timeout + 10
            )
        else:
            conn = http.client.HTTPConnection(self.host, self.port, timeout=timeout + 10)
        try:
            conn.request(
                "GET",
                self.prefix + path + "?" + urlencode(params),
                headers={"Accept": "application/json", **self.headers()},
            )
            response = conn.getresponse()
            if response.status >= 400:
                raise error_of(response.status, response.read(), "watch")
            while True:
                line = response.readline()
                if not line:
                    return
                try:
                    yield json.loads(line)
                except ValueError:
                    return
        except OSError:
            return
        finally:
            conn.close()


def error_of(status: int, raw: bytes, what: str) -> SandboxError:
    """Our error for an API answer's error status, with the server's message."""
    try:
        message = str(json.loads(raw).get("message") or "")
    except (ValueError, AttributeError):
        message = raw[:300].decode("utf-8", "replace").strip()
    doing = f" to {what}" if what else ""
    if status == 401:
        return EngineUnavailable(
            f"the Kubernetes API refused our credentials (401){doing}: check KUBECONFIG "
            "(an expired token or certificate?)"
        )
    if status == 403:
        return SandboxError(
            f"the Kubernetes API forbids it (403){doing}: {message}. The server's account "
            "needs the Role of deploy/kubernetes/rbac.yaml in the sandbox namespace"
        )
    if status == 404:
        return SandboxNotFound(message or f"not found{doing}")
    if status == 409:
        return Conflict(message or f"conflict{doing}")
    if status == 422 or status == 400:
        return BadRequest(f"the Kubernetes API refused{doing} ({status}): {message}")
    if status == 429 or status >= 500:
        return EngineUnavailable(f"the Kubernetes API failed{doing} ({status}): {message}")
    return SandboxFailed(f"the Kubernetes API refused{doing} ({status}): {message}")


def q(name: str) -> str:
    """A path segment, quoted."""
    return quote(name, safe="")
