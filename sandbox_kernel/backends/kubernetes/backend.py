"""Sandboxes on a Kubernetes cluster: a pod per scope key, its files on claims.

* A sandbox is a pod (only while it runs), a home claim (its own filesystem's part that
  must last: ``$HOME``, so packages installed with ``pip install --user`` survive a stop)
  and a NetworkPolicy, in the namespace the administrator names
  (``kubernetes_namespace``); the user's workspace claim is mounted at /workspace and
  outlives every sandbox of that user. Objects are found again by their deterministic
  names and our labels (see :mod:`.objects`), so every process agrees without sharing
  one; a name taken on create means another process won the race.
* Stop deletes the pod and keeps the claims; start makes the pod again from the
  manifest kept on the home claim; destroy removes the pod, the policy and the home
  claim, never the workspace.
* Pods are hardened by default: non-root, every capability dropped, no privilege
  escalation, the runtime's default seccomp profile, no service-account token, no
  service links, requests and limits from the flavor, ``runtimeClassName`` from the
  ``runtime`` setting (gVisor, Kata). The policy lets nothing in and, with network on,
  nothing out to private or link-local addresses (other users' pods, nodes, the cloud's
  metadata address).
* Processes run through the API server's exec subresource (:mod:`.stream`); files of a
  stopped sandbox are served by the user's **files pod** on the same workspace claim
  (``workspace_on_host = False``, as for Daytona), so file use never wakes a sandbox.
"""

from __future__ import annotations

import builtins
import json
import threading
import time
from collections.abc import Iterator
from typing import IO, Any

from ...agent import inline, program
from ...identity import ScopeKey, safe_id
from ...volumes import Volume
from ..base import (
    LABEL_IMAGE,
    LABEL_INSTALLATION,
    LABEL_MANAGED,
    LABEL_ROLE,
    LABEL_SCOPE,
    LABEL_USER,
    LABEL_USER_ID,
    LABEL_WORKSPACE,
    ROLE_FILES,
    WORKSPACE,
    AlreadyExists,
    Backend,
    Channel,
    EngineSettings,
    ExecResult,
    FileMissing,
    Health,
    NotSupported,
    Progress,
    SandboxError,
    SandboxFailed,
    SandboxInfo,
    SnapshotInfo,
    Spec,
    egress_of,
    files_sandbox_id,
    is_files_sandbox,
    not_found,
)
from ..base import Conflict as ConflictError
from . import objects as o
from .client import Api, ClusterConfig, load_config, q
from .egress import egress_note, kube_egress
from .programs import LAUNCH, PID_END, PID_PREFIX, READ, USAGE, WRITE
from .stream import ExecChannel, ExecPty, ExecStream

EXEC_OUTPUT_LIMIT = 64 << 20  # bytes of a command's output kept by exec()
EXEC_GRACE = 5.0  # seconds past an exec's limit before the host gives up on it
GONE_WAIT = 60.0  # seconds a stop waits for its pod to be gone
POLL = 0.05
ISOLATION = "Kubernetes pod (non-root, no capabilities, runtime's seccomp, network policy)"
CHUNK = 1 << 20


class KubernetesBackend(Backend):
    """Sandboxes as pods with persistent claims, through the Kubernetes API."""

    name = "kubernetes"
    workspace_on_host = False

    def __init__(self, settings: EngineSettings) -> None:
        super().__init__(settings)
        self._installation = settings.installation
        self._api: Api | None = None
        self._files_locks: dict[str, threading.Lock] = {}
        self._files_guard = threading.Lock()

    # -- the cluster ------------------------------------------------------------------
    @property
    def api(self) -> Api:
        if self._api is None:
            cfg: ClusterConfig = load_config(self.settings.kubernetes_namespace)
            self._api = Api(cfg)
        return self._api

    @property
    def namespace(self) -> str:
        return self.api.cfg.namespace

    def _ns(self, kind: str, name: str = "", group: str = "") -> str:
        base = f"/apis/{group}" if group else "/api/v1"
        path = f"{base}/namespaces/{q(self.namespace)}/{kind}"
        return f"{path}/{q(name)}" if name else path

    def health(self) -> Health:
        try:
            version = self.api.get("/version", what="ask its version").get("gitVersion", "?")
            self.api.get(self._ns("pods"), params={"limit": 1}, what="list pods")
        except SandboxError as exc:
            return Health(False, self.name, str(exc))
        return Health(
            True,
            self.name,
            f"Kubernetes {version} answers ({self.api.cfg.source}, namespace {self.namespace})",
        )

    # -- lookups ------------------------------------------------------------------------
    def _name(self, sandbox_id: str) -> str:
        return o.object_name(self._installation, sandbox_id)

    def _get(self, kind: str, name: str, what: str = "", group: str = "") -> Any:
        return self.api.maybe(self._ns(kind, name, group), what=what)

    def _record(self, sandbox_id: str) -> dict[str, Any] | None:
        """What says the sandbox exists: its home claim (a files sandbox: its pod)."""
        name = self._name(sandbox_id)
        kind, obj_name = (
            ("pods", name)
            if is_files_sandbox(sandbox_id)
            else (
                "persistentvolumeclaims",
                o.home_claim(name),
            )
        )
        found = self._get(kind, obj_name, f"look up {sandbox_id}")
        if found is None or (found.get("metadata") or {}).get("deletionTimestamp"):
            return None  # gone, or going (a claim waits for its pod to go first)
        if not o.is_ours(found, self._installation):
            raise SandboxFailed(
                f"a Kubernetes object named {obj_name} exists in namespace {self.namespace} "
                "but was not made by this sandbox-kernel installation; rename or delete it "
                "(we never touch objects that are not ours)"
            )
        if o.annotations_of(found).get(o.A_ID) != sandbox_id:
            return None  # another id that made the same name (never for ids of ours)
        return found

    def _pod(self, sandbox_id: str) -> dict[str, Any] | None:
        pod = self._get("pods", self._name(sandbox_id), f"look up {sandbox_id}")
        return pod if pod is not None and o.is_ours(pod, self._installation) else None

    def _info(self, record: dict[str, Any], pod: dict[str, Any] | None) -> SandboxInfo:
        isolation = ISOLATION + egress_note(egress_of(o.our_labels(record)))
        return o.sandbox_info(self._installation, self.name, record, pod, isolation)

    def find(self, sandbox_id: str) -> SandboxInfo | None:
        record = self._record(sandbox_id)
        if record is None:
            return None
        pod = record if is_files_sandbox(sandbox_id) else self._pod(sandbox_id)
        return self._info(record, pod)

    def list(self, user: str | None = None) -> builtins.list[SandboxInfo]:
        return self._listing(o.ROLE_SANDBOX, user)

    def files_sandboxes(self) -> builtins.list[SandboxInfo]:
        return self._listing(ROLE_FILES, None)

    def _listing(self, role: str, user: str | None) -> builtins.list[SandboxInfo]:
        labels = o.ours(self._installation, role)
        if user is not None:
            labels[LABEL_USER_ID] = ScopeKey(user).user_id
        params = {"labelSelector": o.selector(**labels)}
        pods = {
            p["metadata"]["name"]: p
            for p in self.api.get(self._ns("pods"), params=params, what="list sandboxes")["items"]
        }
        if role == ROLE_FILES:
            records = list(pods.values())
        else:
            records = self.api.get(
                self._ns("persistentvolumeclaims"), params=params, what="list sandboxes"
            )["items"]
        found = []
        for record in records:
            name = record["metadata"]["labels"].get(o.L_SANDBOX, "")
            found.append(self._info(record, pods.get(name)))
        return sorted((i for i in found if i.id), key=lambda i: i.id)

    # -- create, start, stop, destroy ------------------------------------------------------
    def create(
        self, sandbox_id: str, key: ScopeKey, spec: Spec, labels: dict[str, str], progress: Progress
    ) -> SandboxInfo:
        if spec.snapshot_ref:
            raise NotSupported(
                "the kubernetes backend has no snapshots (the cluster has no VolumeSnapshot "
                "support here); start from an image"
            )
        if spec.work_folder:
            raise NotSupported("the kubernetes backend cannot mount a folder of this host")
        self._check_claims(spec)
        name = self._name(sandbox_id)
        workspace = self._ensure_workspace(key.user, progress)
        full = {
            **labels,
            LABEL_WORKSPACE: f"claim {workspace}",
            "sandbox-kernel.workspace-claim": workspace,
        }
        selectors = o.k8s_labels(full, self._installation, o.ROLE_SANDBOX, name)
        limits = {
            "cpus": spec.cpus,
            "memory": spec.memory,
            "pids": spec.pids,
            "disk": o.disk_of(spec),
        }
        notes = {o.A_ID: sandbox_id, o.A_LABELS: json.dumps(full), o.A_LIMITS: json.dumps(limits)}
        pod = o.pod_manifest(
            name,
            self.namespace,
            selectors,
            notes,
            image=spec.image,
            spec=spec,
            workspace=workspace,
            home=o.home_claim(name),
            runtime_class=spec.runtime,
        )
        claim = o.claim_manifest(
            o.home_claim(name),
            selectors,
            {**notes, o.A_POD: json.dumps(pod)},
            o.disk_of(spec),
            self.settings.kubernetes_storage_class,
            "ReadWriteOnce",
        )
        progress(f"creating pod {name} in namespace {self.namespace} from {spec.source}")
        self._make_claim(sandbox_id, claim)
        self._ensure_policy(name, selectors, spec.network, spec.egress)
        return self._run_pod(sandbox_id, pod, progress)

    def check_volumes(self, volumes: tuple[Volume, ...]) -> None:
        """Mapped folders are claims of the sandboxes' namespace, by name."""
        for volume in volumes:
            if volume.on_host:
                raise NotSupported(
                    f"mapping '{volume}': the kubernetes backend mounts claims by name, not "
                    f"folders of this host; give {volume.target} the name of a persistent "
                    "volume claim in the sandboxes' namespace"
                )

    def _check_claims(self, spec: Spec) -> None:
        """Each mapped claim is there (a pod would otherwise wait for it for ever)."""
        self.check_volumes(spec.volumes)
        for volume in spec.volumes:
            if self._get("persistentvolumeclaims", volume.source) is None:
                raise SandboxFailed(
                    f"mapping '{volume}': namespace {self.namespace} has no claim named "
                    f"{volume.source!r}; create it or remove the mapping"
                )

    def _make_claim(self, sandbox_id: str, claim: dict[str, Any]) -> None:
        """Create the home claim of a new sandbox; AlreadyExists when another process
        made it first. A claim of a destroyed sandbox may still be going (it waits for
        its pod to end): then this waits for it to be gone."""
        name = claim["metadata"]["name"]
        deadline = time.monotonic() + GONE_WAIT
        while True:
            try:
                self.api.post(
                    self._ns("persistentvolumeclaims"), claim, what=f"create {sandbox_id}"
                )
                return
            except ConflictError:
                if self._record(sandbox_id) is not None:
                    raise AlreadyExists(f"{sandbox_id} was made by another process") from None
                found = self._get("persistentvolumeclaims", name)
                going = found is not None and (found.get("metadata") or {}).get("deletionTimestamp")
                if not going and found is not None:
                    raise SandboxFailed(f"the claim {name} of {sandbox_id} is in the way") from None
                if time.monotonic() > deadline:
                    raise SandboxFailed(
                        f"the claim {name} of the destroyed {sandbox_id} did not go within "
                        f"{GONE_WAIT:.0f} s; try again in a moment"
                    ) from None
                time.sleep(0.2)

    def _ensure_workspace(self, user: str, progress: Progress | None) -> str:
        """The user's workspace claim, made on first use (and never removed by us)."""
        user_id = safe_id(user)
        name = o.workspace_claim(self._installation, user_id)
        found = self._get("persistentvolumeclaims", name, f"look up the workspace of {user}")
        if found is not None:
            if not o.is_ours(found, self._installation):
                raise SandboxFailed(
                    f"a claim named {name} exists in namespace {self.namespace} but was not made "
                    "by this sandbox-kernel installation; rename or delete it"
                )
            return name
        if progress:
            progress(f"creating the workspace claim {name} for {user}")
        labels = {
            LABEL_MANAGED: "1",
            LABEL_INSTALLATION: self._installation,
            LABEL_ROLE: o.ROLE_WORKSPACE,
            LABEL_USER_ID: user_id,
        }
        claim = o.claim_manifest(
            name,
            labels,
            {o.A_LABELS: json.dumps({LABEL_USER: user, LABEL_USER_ID: user_id})},
            self.settings.kubernetes_workspace_size,
            self.settings.kubernetes_storage_class,
            "ReadWriteOnce",
        )
        try:
            self.api.post(self._ns("persistentvolumeclaims"), claim, what=f"create {name}")
        except ConflictError:
            pass  # made meanwhile by another process
        return name

    def _ensure_policy(
        self, name: str, labels: dict[str, str], network: bool, egress: tuple[str, ...] = ()
    ) -> None:
        allowed = kube_egress(egress)[0] if egress else None
        policy = o.policy_manifest(name, labels, network, allowed)
        path = self._ns("networkpolicies", group="networking.k8s.io/v1")
        try:
            self.api.post(path, policy, what=f"create the network policy of {name}")
        except ConflictError:
            self.api.request(
                "PUT",
                f"{path}/{q(name)}",
                {
                    **policy,
                    "metadata": {
                        **policy["metadata"],
                        "resourceVersion": self._get(
                            "networkpolicies", name, group="networking.k8s.io/v1"
                        )["metadata"]["resourceVersion"],
                    },
                },
                what=f"update the network policy of {name}",
            )

    def _run_pod(
        self, sandbox_id: str, pod: dict[str, Any], progress: Progress | None
    ) -> SandboxInfo:
        """Create ``pod`` (a pod of that name already there is used) and wait until it runs."""
        try:
            self.api.post(self._ns("pods"), pod, what=f"start {sandbox_id}")
        except ConflictError:
            pass  # started by another process meanwhile: wait for that one
        return self._wait_running(sandbox_id, progress)

    def _wait_running(self, sandbox_id: str, progress: Progress | None) -> SandboxInfo:
        deadline = time.monotonic() + self.settings.start_timeout
        said = ""
        name = self._name(sandbox_id)
        while True:
            pod = self._get("pods", name, f"look up {sandbox_id}")
            state, reason = o.pod_state(pod)
            if state == "running":
                record = pod if is_files_sandbox(sandbox_id) else self._record(sandbox_id)
                if record is None:
                    raise not_found(sandbox_id)
                return self._info(record, pod)
            if pod is None and time.monotonic() > deadline - self.settings.start_timeout + 5:
                raise SandboxFailed(f"the pod of {sandbox_id} went away while it was starting")
            if state == "error":
                raise SandboxFailed(
                    f"sandbox {sandbox_id} cannot start: {reason}"
                    + (
                        " (is the image in the node's runtime, or pullable?)"
                        if "Image" in reason
                        else ""
                    )
                )
            if reason and reason != said and progress:
                progress(f"sandbox {sandbox_id} waits: {reason}")
                said = reason
            if time.monotonic() > deadline:
                raise SandboxFailed(
                    f"timed out after {self.settings.start_timeout:.0f} s waiting for the pod of "
                    f"{sandbox_id} to run{': ' + reason if reason else ''}{self._claims_hint(pod)}"
                )
            time.sleep(POLL)

    def _claims_hint(self, pod: dict[str, Any] | None) -> str:
        """Why a pod may wait: a claim that never bound (no default storage class?)."""
        for volume in ((pod or {}).get("spec") or {}).get("volumes") or []:
            claim = (volume.get("persistentVolumeClaim") or {}).get("claimName")
            found = self._get("persistentvolumeclaims", claim) if claim else None
            if found is not None and (found.get("status") or {}).get("phase") != "Bound":
                return (
                    f" (its claim {claim} is not bound: does the cluster have a default storage "
                    "class, or is kubernetes_storage_class set to one that exists?)"
                )
        return ""

    def start(self, sandbox_id: str, progress: Progress | None = None) -> SandboxInfo:
        record = self._record(sandbox_id)
        if record is None:
            raise not_found(sandbox_id)
        pod = self._pod(sandbox_id)
        state, _ = o.pod_state(pod)
        if state == "running" and pod is not None:
            return self._info(record, pod)
        if pod is not None and (
            state == "error" or (pod.get("metadata") or {}).get("deletionTimestamp")
        ):
            self._delete_pod(sandbox_id, wait=True)
            pod = None
        if pod is None:
            if progress:
                progress(f"starting sandbox {sandbox_id}")
            try:
                manifest = json.loads(o.annotations_of(record)[o.A_POD])
            except (KeyError, ValueError):
                raise SandboxFailed(
                    f"sandbox {sandbox_id} has lost the record of its pod; destroy it and start anew"
                ) from None
            return self._run_pod(sandbox_id, manifest, progress)
        return self._wait_running(sandbox_id, progress)

    def _delete_pod(self, sandbox_id: str, *, wait: bool, grace: int = 1) -> bool:
        name = self._name(sandbox_id)
        gone = not self.api.delete(
            self._ns("pods", name),
            {"apiVersion": "v1", "kind": "DeleteOptions", "gracePeriodSeconds": grace},
            what=f"stop {sandbox_id}",
        )
        if wait and not gone:
            self.wait_until(
                lambda: self._get("pods", name) is None, GONE_WAIT, f"the pod of {sandbox_id} to go"
            )
        return not gone

    def stop(self, sandbox_id: str) -> SandboxInfo:
        record = self._record(sandbox_id)
        if record is None:
            raise not_found(sandbox_id)
        if is_files_sandbox(sandbox_id):
            self._delete_pod(sandbox_id, wait=True)
            info = self._info(record, None)
            return info
        if self._delete_pod(sandbox_id, wait=True):
            self.api.patch(
                self._ns("persistentvolumeclaims", o.home_claim(self._name(sandbox_id))),
                {"metadata": {"annotations": {o.A_STOPPED: f"{time.time():.3f}"}}},
                what=f"record the stop of {sandbox_id}",
            )
            record = self._record(sandbox_id) or record
        return self._info(record, None)

    def destroy(self, sandbox_id: str) -> bool:
        record = self._record(sandbox_id)
        if record is None:
            return False
        name = self._name(sandbox_id)
        self._delete_pod(sandbox_id, wait=False, grace=0)
        self.api.delete(
            self._ns("networkpolicies", name, group="networking.k8s.io/v1"),
            what=f"remove the network policy of {sandbox_id}",
        )
        if is_files_sandbox(sandbox_id):
            return True
        return self.api.delete(
            self._ns("persistentvolumeclaims", o.home_claim(name)), what=f"remove {sandbox_id}"
        )

    # -- the files pod ---------------------------------------------------------------------
    def files_sandbox(self, user: str, image: str, progress: Progress | None = None) -> SandboxInfo:
        sandbox_id = files_sandbox_id(user)
        with self._files_lock(sandbox_id):
            pod = self._pod(sandbox_id)
            if pod is not None and o.pod_state(pod)[0] == "running":
                return self._info(pod, pod)
            if pod is not None and o.pod_state(pod)[0] == "error":
                self._delete_pod(sandbox_id, wait=True)
                pod = None
            if pod is not None:
                return self._wait_running(sandbox_id, progress)
            name = self._name(sandbox_id)
            workspace = self._ensure_workspace(user, progress)
            user_id = safe_id(user)
            full = {
                LABEL_MANAGED: "1",
                LABEL_INSTALLATION: self._installation,
                LABEL_USER: user,
                LABEL_USER_ID: user_id,
                LABEL_SCOPE: "user",
                LABEL_ROLE: ROLE_FILES,
                LABEL_IMAGE: image,
                LABEL_WORKSPACE: f"claim {workspace}",
                "sandbox-kernel.workspace-claim": workspace,
            }
            selectors = o.k8s_labels(full, self._installation, ROLE_FILES, name)
            notes = {o.A_ID: sandbox_id, o.A_LABELS: json.dumps(full)}
            manifest = o.pod_manifest(
                name,
                self.namespace,
                selectors,
                notes,
                image=image,
                spec=None,
                workspace=workspace,
                home="",
                runtime_class="",
            )
            if progress:
                progress(f"creating the files pod {name} for the workspace of {user}")
            self._ensure_policy(name, selectors, network=False)
            return self._run_pod(sandbox_id, manifest, progress)

    def _files_lock(self, sandbox_id: str) -> threading.Lock:
        with self._files_guard:
            return self._files_locks.setdefault(sandbox_id, threading.Lock())

    # -- processes ----------------------------------------------------------------------
    def _running_pod(self, sandbox_id: str) -> str:
        pod = self._pod(sandbox_id)
        state, _ = o.pod_state(pod)
        if pod is None or state != "running":
            if pod is None and self._record(sandbox_id) is None:
                raise not_found(sandbox_id)
            raise SandboxError(
                f"sandbox {sandbox_id} is {state}; start it with `sandbox-kernel start {sandbox_id}`"
            )
        return str(pod["metadata"]["name"])

    def _stream(
        self,
        sandbox_id: str,
        cmd: builtins.list[str],
        *,
        cwd: str,
        env: dict[str, str] | None,
        stdin: bool,
        tty: bool = False,
        announce: bool = False,
    ) -> ExecStream:
        pod = self._running_pod(sandbox_id)
        if cwd != WORKSPACE or env or announce:
            cmd = inline(LAUNCH, cwd, json.dumps(env or {}), "1" if announce else "0", *cmd)
        return ExecStream.open(
            self.api, self.namespace, pod, o.CONTAINER, cmd, stdin=stdin, tty=tty
        )

    def open_channel(
        self,
        sandbox_id: str,
        cmd: builtins.list[str],
        *,
        cwd: str = WORKSPACE,
        env: dict[str, str] | None = None,
    ) -> Channel:
        return ExecChannel(self._stream(sandbox_id, cmd, cwd=cwd, env=env, stdin=True))

    def exec(
        self,
        sandbox_id: str,
        cmd: builtins.list[str],
        *,
        cwd: str = WORKSPACE,
        env: dict[str, str] | None = None,
        timeout: float | None = None,
    ) -> ExecResult:
        deadline = None
        if timeout:
            cmd = program("timeout_runner", str(timeout), *cmd)
            deadline = time.monotonic() + timeout + EXEC_GRACE
        stream = self._stream(sandbox_id, cmd, cwd=cwd, env=env, stdin=False)
        out = bytearray()
        timer = None
        if deadline is not None:
            timer = threading.Timer(deadline - time.monotonic(), stream.close)
            timer.daemon = True
            timer.start()
        try:
            while True:
                channel, data = stream.recv()
                if channel < 0:
                    break
                if len(out) < EXEC_OUTPUT_LIMIT:
                    out += data[: EXEC_OUTPUT_LIMIT - len(out)]
        finally:
            if timer is not None:
                timer.cancel()
            stream.close()
        code = stream.exit_code()
        if code is None:
            if deadline is not None and time.monotonic() >= deadline - 0.5:
                out += f"timed out after {timeout} s (the sandbox did not end it)\n".encode()
                return ExecResult(124, bytes(out))
            raise SandboxError(f"the process stream to {sandbox_id} ended without an exit status")
        failure = stream.failure()
        if failure and not out:
            return ExecResult(127 if "not found" in failure else 126, failure.encode())
        return ExecResult(code, bytes(out))

    def open_pty(
        self,
        sandbox_id: str,
        cmd: builtins.list[str],
        *,
        cwd: str = WORKSPACE,
        env: dict[str, str] | None = None,
        rows: int = 24,
        cols: int = 80,
    ) -> ExecPty:
        stream = self._stream(
            sandbox_id, cmd, cwd=cwd, env=env, stdin=True, tty=True, announce=True
        )
        pty = ExecPty(stream, lambda session: self._hang_up(sandbox_id, session))
        pty.resize(rows, cols)
        seen = b""
        while len(seen) < 64 and PID_END not in seen:
            chunk = ExecChannel.read(pty, 64)
            if not chunk:
                break
            seen += chunk
        head, end, rest = seen.partition(PID_END)
        number = head[len(PID_PREFIX) :]
        if end and head.startswith(PID_PREFIX) and number.isdigit():
            pty.start_with(rest, int(number))
        else:  # the command did not start: show what came
            pty.start_with(seen, 0)
        return pty

    def _hang_up(self, sandbox_id: str, session: int) -> None:
        try:
            self.exec(sandbox_id, program("hangup", str(session)), cwd="/", timeout=30)
        except SandboxError:
            pass  # the sandbox is gone: so is the session

    def start_spare(self, sandbox_id: str) -> None:
        return None  # no warm spare: an exec's processes end with the stream's session

    # -- files --------------------------------------------------------------------------
    def put_file(self, sandbox_id: str, path: str, data: bytes | IO[bytes]) -> None:
        stream = self._stream(
            sandbox_id, inline(WRITE, _in_workspace(path)), cwd=WORKSPACE, env=None, stdin=True
        )
        try:
            if isinstance(data, (bytes, bytearray)):
                chunks: Iterator[bytes] = (
                    bytes(data[at : at + CHUNK]) for at in range(0, len(data), CHUNK)
                )
            else:
                chunks = iter(lambda: data.read(CHUNK), b"")
            for chunk in chunks:
                if chunk:
                    stream.send(0, len(chunk).to_bytes(4, "big") + chunk)
            stream.send(0, b"\0\0\0\0")
            out = bytearray()
            while True:
                channel, chunk = stream.recv()
                if channel < 0:
                    break
                out += chunk[:4096]
        except OSError as exc:
            raise SandboxError(f"upload of {path!r} to {sandbox_id} failed: {exc}") from None
        finally:
            stream.close()
        if stream.exit_code() != 0:
            raise SandboxError(
                f"upload of {path!r} to {sandbox_id} failed: "
                f"{bytes(out[-300:]).decode('utf-8', 'replace').strip()}"
            )

    def get_file(self, sandbox_id: str, path: str) -> Iterator[bytes]:
        stream = self._stream(
            sandbox_id, inline(READ, _in_workspace(path)), cwd=WORKSPACE, env=None, stdin=False
        )
        return self._chunks(stream, path)

    def _chunks(self, stream: ExecStream, path: str) -> Iterator[bytes]:
        try:
            first = True
            while True:
                channel, data = stream.recv()
                if channel < 0:
                    break
                if channel != 1:
                    continue
                if first:
                    first = False
                    if data[:1] == b"E":
                        rest = data[1:].decode("utf-8", "replace")
                        if "No such file" in rest:
                            raise FileMissing(f"no file {path!r} in the workspace")
                        raise SandboxError(f"cannot read {path!r}: {rest[:300]}")
                    data = data[1:]
                if data:
                    yield data
            if first or stream.exit_code() not in (0, None):
                raise SandboxError(f"reading {path!r} failed: {stream.failure() or 'no answer'}")
        finally:
            stream.close()

    # -- usage --------------------------------------------------------------------------
    def usage(self, infos: builtins.list[SandboxInfo]) -> dict[str, dict[str, float]]:
        """Memory and CPU seconds per running sandbox, read from its own cgroup (one exec
        each: a cluster gives no cheaper live figure without a metrics server)."""
        found: dict[str, dict[str, float]] = {}
        for info in infos:
            try:
                result = self.exec(info.id, inline(USAGE), cwd="/", timeout=10)
                memory, cpu = result.output.split()[:2]
                found[info.id] = {"memory": float(int(memory)), "cpu_seconds": float(cpu)}
            except (SandboxError, ValueError):
                continue
        return found

    def disk_bound(self) -> str:
        return (
            "a sandbox's home claim is its flavor's disk and its workspace claim "
            "kubernetes_workspace_size: the storage class decides whether writes past them fail"
        )

    # -- snapshots ----------------------------------------------------------------------
    def create_snapshot(self, sandbox_id: str, ref: str, labels: dict[str, str]) -> SnapshotInfo:
        raise NotSupported(
            "the kubernetes backend cannot take snapshots here: it needs the cluster's "
            "VolumeSnapshot API (snapshot.storage.k8s.io) and a CSI driver that has it"
        )

    def list_snapshots(self) -> builtins.list[SnapshotInfo]:
        return []

    def delete_snapshot(self, ref: str) -> bool:
        return False


def _in_workspace(path: str) -> str:
    return path if path.startswith("/") else f"{WORKSPACE}/{path}"
