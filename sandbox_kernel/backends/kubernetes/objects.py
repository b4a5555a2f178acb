"""What a sandbox is made of in a cluster: names, labels and the objects' manifests.

A sandbox is a **home claim** (its own filesystem: ``$HOME``, so ``pip install --user``
survives), a **pod** (only while it runs) and a **NetworkPolicy**; the user's
**workspace claim** outlives all of them and is shared by the user's sandboxes. The
home claim is the sandbox's record: it carries our labels and the pod's manifest (as
annotations), so a stopped sandbox (no pod) is started again by any process from it.

Kubernetes names allow less than our ids do (lowercase letters, digits, '-'), and
label values less than our labels hold (no ':' or '/', at most 63 characters): object
names are the engine name made safe (a digest where it had to change), the selectors
we need are labels, and every label of ours travels whole in one annotation.
"""

from __future__ import annotations

import hashlib
import json
import re
from typing import Any

from ..base import (
    LABEL_FLAVOR,
    LABEL_IMAGE,
    LABEL_INSTALLATION,
    LABEL_MANAGED,
    LABEL_ROLE,
    LABEL_SCOPE,
    LABEL_SNAPSHOT_OF,
    LABEL_SPEC,
    LABEL_THREAD,
    LABEL_USER,
    LABEL_USER_ID,
    ROLE_FILES,
    WORKSPACE,
    SandboxInfo,
    Spec,
    engine_name,
    epoch_of,
)
from .egress import public_blocks

HOME = "/home/sandbox"
UID = 1000
CONTAINER = "sandbox"
ANNOTATION = "sandbox-kernel/"
A_LABELS = ANNOTATION + "labels"  # every label of ours, JSON
A_ID = ANNOTATION + "id"  # the sandbox id
A_POD = ANNOTATION + "pod"  # the pod's manifest (on the home claim)
A_STOPPED = ANNOTATION + "stopped"  # when it last stopped (epoch seconds)
A_LIMITS = ANNOTATION + "limits"  # cpus, memory, pids, disk
L_SANDBOX = "sandbox-kernel.sandbox"  # the object name of its sandbox
ROLE_SANDBOX = "sandbox"
ROLE_WORKSPACE = "workspace"
DEFAULT_PATH = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"
DEFAULT_DISK = 10 << 30

# The pod's main process: waits, reaps the orphans that come to it (it is PID 1 of the
# container), ends at once on SIGTERM; on the first start of a sandbox it lays the
# image's skeleton (/etc/skel) into the new, empty home claim.
IDLE = (
    "import os, shutil, signal, sys\n"
    "home = os.environ.get('HOME', '/home/sandbox')\n"
    "marker = os.path.join(home, '.sandbox-home')\n"
    "if sys.argv[1:] == ['home'] and not os.path.exists(marker):\n"
    "    try:\n"
    "        shutil.copytree('/etc/skel', home, symlinks=True, dirs_exist_ok=True)\n"
    "        open(marker, 'w').close()\n"
    "    except OSError:\n"
    "        pass\n"
    "signal.signal(signal.SIGTERM, lambda *a: os._exit(0))\n"
    "signal.signal(signal.SIGCHLD, lambda *a: None)\n"
    "while True:\n"
    "    try:\n"
    "        os.wait()\n"
    "    except ChildProcessError:\n"
    "        signal.pause()\n"
)


def object_name(installation: str, sandbox_id: str) -> str:
    """The Kubernetes name of a sandbox's objects (pod, home claim, policy): its engine
    name where that is a valid DNS label, else made one with a digest of it."""
    return dns_label(engine_name(installation, sandbox_id))


def dns_label(name: str, limit: int = 52) -> str:
    """``name`` as a DNS label of at most ``limit`` characters (room for "-home")."""
    safe = re.sub(r"[^a-z0-9-]", "-", name.lower()).strip("-")
    if safe == name and len(name) <= limit:
        return name
    digest = hashlib.sha256(name.encode()).hexdigest()[:10]
    return f"{safe[: limit - 11].rstrip('-')}-{digest}"


def home_claim(name: str) -> str:
    return f"{name}-home"


def workspace_claim(installation: str, user_id: str) -> str:
    return dns_label(f"sk-ws-{user_id}--i{installation[:8]}", 63)


def selector(**labels: str) -> str:
    return ",".join(f"{k}={v}" for k, v in labels.items())


def ours(installation: str, role: str = "") -> dict[str, str]:
    """The labels (as a selector) of this installation's objects of one role."""
    found = {LABEL_MANAGED: "1", LABEL_INSTALLATION: installation}
    if role:
        found[LABEL_ROLE] = role
    return found


def is_ours(obj: dict[str, Any] | None, installation: str) -> bool:
    labels = ((obj or {}).get("metadata") or {}).get("labels") or {}
    return labels.get(LABEL_MANAGED) == "1" and labels.get(LABEL_INSTALLATION) == installation


def k8s_labels(labels: dict[str, str], installation: str, role: str, name: str) -> dict[str, str]:
    """The selector labels of an object of ours (values Kubernetes accepts)."""
    return {
        LABEL_MANAGED: "1",
        LABEL_INSTALLATION: installation,
        LABEL_ROLE: role,
        L_SANDBOX: name,
        LABEL_USER_ID: labels.get(LABEL_USER_ID, ""),
        LABEL_SCOPE: labels.get(LABEL_SCOPE, "user") or "user",
    }


def disk_of(spec: Spec) -> int:
    """Bytes of a sandbox's own files: its flavor's disk (10 GiB for a flavor without one)."""
    return spec.disk or DEFAULT_DISK


def quantity(n: int) -> str:
    """Bytes as a Kubernetes quantity (whole MiB where it divides)."""
    return f"{n // (1 << 20)}Mi" if n % (1 << 20) == 0 else str(n)


def pod_manifest(
    name: str,
    namespace: str,
    labels: dict[str, str],
    annotations: dict[str, str],
    *,
    image: str,
    spec: Spec | None,
    workspace: str,
    home: str,
    runtime_class: str,
    service_account: str = "",
) -> dict[str, Any]:
    """A sandbox's pod (or, with ``home`` empty, a files pod): hardened as the Docker
    backend's containers are (non-root, no capability, no privilege escalation, the
    runtime's seccomp profile, no service-account token, no service links)."""
    volumes: list[dict[str, Any]] = [
        {"name": "workspace", "persistentVolumeClaim": {"claimName": workspace}}
    ]
    mounts: list[dict[str, Any]] = [{"name": "workspace", "mountPath": WORKSPACE}]
    if home:
        volumes.append({"name": "home", "persistentVolumeClaim": {"claimName": home}})
        mounts.append({"name": "home", "mountPath": HOME})
    # The administrator's mapped folders: claims of the namespace, by name.
    for i, mapped in enumerate(spec.volumes if spec is not None else ()):
        read_only = not mapped.writable
        volumes.append(
            {
                "name": f"mapped-{i}",
                "persistentVolumeClaim": {"claimName": mapped.source, "readOnly": read_only},
            }
        )
        mounts.append({"name": f"mapped-{i}", "mountPath": mapped.target, "readOnly": read_only})
    resources: dict[str, Any] = {}
    if spec is not None:
        disk = disk_of(spec)
        resources = {
            "limits": {
                "cpu": f"{spec.cpus:g}",
                "memory": quantity(spec.memory),
                "ephemeral-storage": quantity(disk),
            },
            # Idle sandboxes use little: they ask for a little (a node of N cores takes
            # 40 N of them by CPU), and may burst to their limits.
            "requests": {
                "cpu": "25m",
                "memory": quantity(min(spec.memory, 128 << 20)),
                "ephemeral-storage": quantity(min(disk, 1 << 30)),
            },
        }
    else:  # a files pod: a helper at a time, never user code
        resources = {
            "limits": {"cpu": "500m", "memory": "256Mi", "ephemeral-storage": "2Gi"},
            "requests": {"cpu": "10m", "memory": "32Mi"},
        }
    env = {
        "HOME": HOME,
        "USER": "sandbox",
        "LOGNAME": "sandbox",
        "PATH": DEFAULT_PATH,
        "PIP_BREAK_SYSTEM_PACKAGES": "1",
        "PYTHONUNBUFFERED": "1",
    }
    pod_spec: dict[str, Any] = {
        "automountServiceAccountToken": False,
        "enableServiceLinks": False,
        "hostname": "sandbox",
        "restartPolicy": "Always",
        "terminationGracePeriodSeconds": 2,
        "securityContext": {
            "runAsNonRoot": True,
            "runAsUser": UID,
            "runAsGroup": UID,
            "fsGroup": UID,
            "fsGroupChangePolicy": "OnRootMismatch",
            "seccompProfile": {"type": "RuntimeDefault"},
        },
        "containers": [
            {
                "name": CONTAINER,
                "image": image,
                "command": ["python3", "-I", "-c", IDLE, *(["home"] if home else [])],
                "workingDir": WORKSPACE,
                "env": [{"name": k, "value": v} for k, v in env.items()],
                "resources": resources,
                "securityContext": {
                    "allowPrivilegeEscalation": False,
                    "privileged": False,
                    "capabilities": {"drop": ["ALL"]},
                },
                "volumeMounts": mounts,
            }
        ],
        "volumes": volumes,
    }
    if service_account:
        pod_spec["serviceAccountName"] = service_account
    if runtime_class:
        pod_spec["runtimeClassName"] = runtime_class
    # All sandboxes of one user (and their files pod) on one node: a workspace claim
    # that only one node can mount at a time (ReadWriteOnce) is shared that way.
    user_id = labels.get(LABEL_USER_ID, "")
    if user_id:
        pod_spec["affinity"] = {
            "podAffinity": {
                "requiredDuringSchedulingIgnoredDuringExecution": [
                    {
                        "labelSelector": {
                            "matchLabels": {
                                LABEL_MANAGED: "1",
                                LABEL_INSTALLATION: labels[LABEL_INSTALLATION],
                                LABEL_USER_ID: user_id,
                            }
                        },
                        "topologyKey": "kubernetes.io/hostname",
                    }
                ]
            }
        }
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {
            "name": name,
            "namespace": namespace,
            "labels": labels,
            "annotations": annotations,
        },
        "spec": pod_spec,
    }


def claim_manifest(
    name: str,
    labels: dict[str, str],
    annotations: dict[str, str],
    size: int,
    storage_class: str,
    access_mode: str,
) -> dict[str, Any]:
    spec: dict[str, Any] = {
        "accessModes": [access_mode],
        "resources": {"requests": {"storage": quantity(size)}},
    }
    if storage_class:
        spec["storageClassName"] = storage_class
    return {
        "apiVersion": "v1",
        "kind": "PersistentVolumeClaim",
        "metadata": {"name": name, "labels": labels, "annotations": annotations},
        "spec": spec,
    }


def policy_manifest(
    name: str, labels: dict[str, str], network: bool, allowed: list[dict[str, Any]] | None = None
) -> dict[str, Any]:
    """The sandbox's NetworkPolicy: nothing comes in (exec does not use the network);
    out, with network, the public internet (:func:`.egress.public_blocks`: no other
    users' pods, nodes, the cloud's metadata service) and the cluster's DNS; without
    network, nothing. ``allowed``: an egress allowlist's rules (:mod:`.egress`), which
    then are all that goes out."""
    egress: list[dict[str, Any]] = []
    if network and allowed is not None:
        egress = allowed
    elif network:
        egress = [
            {"to": public_blocks()},
            {
                "to": [
                    {
                        "namespaceSelector": {},
                        "podSelector": {"matchLabels": {"k8s-app": "kube-dns"}},
                    }
                ],
                "ports": [{"protocol": "UDP", "port": 53}, {"protocol": "TCP", "port": 53}],
            },
        ]
    return {
        "apiVersion": "networking.k8s.io/v1",
        "kind": "NetworkPolicy",
        "metadata": {"name": name, "labels": labels},
        "spec": {
            "podSelector": {
                "matchLabels": {
                    L_SANDBOX: labels[L_SANDBOX],
                    LABEL_INSTALLATION: labels[LABEL_INSTALLATION],
                }
            },
            "policyTypes": ["Ingress", "Egress"],
            "ingress": [],
            "egress": egress,
        },
    }


def annotations_of(obj: dict[str, Any] | None) -> dict[str, str]:
    return ((obj or {}).get("metadata") or {}).get("annotations") or {}


def our_labels(obj: dict[str, Any] | None) -> dict[str, str]:
    """Every label of ours an object carries (from its annotation)."""
    try:
        found = json.loads(annotations_of(obj).get(A_LABELS, "{}"))
    except ValueError:
        found = {}
    return found if isinstance(found, dict) else {}


def pod_state(pod: dict[str, Any] | None) -> tuple[str, str]:
    """(state, reason) of a sandbox from its pod: running, creating, stopped or error."""
    if pod is None:
        return "stopped", ""
    if (pod.get("metadata") or {}).get("deletionTimestamp"):
        return "stopped", "stopping"
    status = pod.get("status") or {}
    phase = status.get("phase", "Pending")
    containers = status.get("containerStatuses") or []
    for container in containers:
        waiting = (container.get("state") or {}).get("waiting") or {}
        reason = waiting.get("reason", "")
        if reason in BROKEN:
            return "error", f"{reason}: {waiting.get('message', '')}".rstrip(": ")
        last = (container.get("lastState") or {}).get("terminated") or {}
        if last.get("reason") == "OOMKilled":
            return ("running" if container.get("ready") else "error"), "OOMKilled"
    if phase == "Running" and containers and all(c.get("ready") for c in containers):
        return "running", ""
    if phase in ("Failed", "Succeeded"):
        return "error", status.get("reason") or phase
    for condition in status.get("conditions") or []:
        if condition.get("type") == "PodScheduled" and condition.get("status") == "False":
            if condition.get("reason") == "Unschedulable":
                return "creating", f"unschedulable: {condition.get('message', '')}"
    return "creating", ""


BROKEN = {
    "ErrImagePull",
    "ImagePullBackOff",
    "ErrImageNeverPull",
    "InvalidImageName",
    "CreateContainerConfigError",
    "CreateContainerError",
    "CrashLoopBackOff",
    "RunContainerError",
}


def sandbox_info(
    installation: str,
    backend: str,
    record: dict[str, Any],
    pod: dict[str, Any] | None,
    isolation: str,
) -> SandboxInfo:
    """A sandbox as listings show it, from its record (home claim, or files pod) and pod."""
    labels = our_labels(record)
    notes = annotations_of(record)
    state, reason = pod_state(pod)
    try:
        limits = json.loads(notes.get(A_LIMITS, "{}"))
    except ValueError:
        limits = {}
    started = 0.0
    if pod is not None and state == "running":
        for container in (pod.get("status") or {}).get("containerStatuses") or []:
            started = epoch_of(
                ((container.get("state") or {}).get("running") or {}).get("startedAt")
            )
    meta = record.get("metadata") or {}
    return SandboxInfo(
        id=notes.get(A_ID, ""),
        backend=backend,
        scope=labels.get(LABEL_SCOPE, "user"),
        user=labels.get(LABEL_USER, ""),
        thread=labels.get(LABEL_THREAD, ""),
        state=state,
        image=labels.get(LABEL_IMAGE, ""),
        created=epoch_of(meta.get("creationTimestamp")),
        engine_id=str(meta.get("uid", "")),
        flavor=labels.get(LABEL_FLAVOR, ""),
        isolation=isolation,
        workspace=f"claim {labels.get('sandbox-kernel.workspace-claim', '')}",
        limits=limits if isinstance(limits, dict) else {},
        exit_reason=reason,
        finished=float(notes.get(A_STOPPED, "0") or 0) if state == "stopped" else 0.0,
        started=started,
        snapshot=labels.get(LABEL_SNAPSHOT_OF, ""),
        spec=labels.get(LABEL_SPEC, ""),
        installation=labels.get(LABEL_INSTALLATION, ""),
    )


def is_files(obj: dict[str, Any]) -> bool:
    return ((obj.get("metadata") or {}).get("labels") or {}).get(LABEL_ROLE) == ROLE_FILES
