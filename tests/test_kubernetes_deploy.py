"""The deployment the operators' page describes, on the test cluster: the Jupyter server
in a pod of the shipped manifests (deploy/kubernetes/rbac.yaml and server.yaml), finding
the cluster through its in-cluster settings and acting with no more than the shipped
Role. The one change to the manifests is the server's image: no registry is reachable
here, so the pod runs this checkout's environment (mounted read-only at the same path)
on the test image, whose Debian and Python are this machine's."""

from __future__ import annotations

import json
import sys
import time
import urllib.request
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml
from tornado.websocket import websocket_connect

from .conftest import TEST_IMAGE
from .helpers import run_over_websocket

pytestmark = pytest.mark.kubernetes
REPO = Path(__file__).resolve().parent.parent
DEPLOY = REPO / "deploy" / "kubernetes"


def clients() -> tuple[Any, Any, Any, Any]:
    from kubernetes import client, config

    config.load_kube_config()
    return (
        client.ApiClient(),
        client.CoreV1Api(),
        client.AppsV1Api(),
        client.AuthorizationV1Api(),
    )


@pytest.fixture
def deployed() -> Iterator[tuple[str, str, str]]:
    """The shipped manifests applied in a namespace of their own: (namespace, server URL, token)."""
    from kubernetes import utils

    api_client, core, apps, _ = clients()
    namespace = f"sk-deploy-{uuid.uuid4().hex[:6]}"
    core.create_namespace({"metadata": {"name": namespace}})
    token = uuid.uuid4().hex
    try:
        for doc in yaml.safe_load_all((DEPLOY / "rbac.yaml").read_text()):
            utils.create_from_dict(api_client, doc, namespace=namespace)
        for doc in yaml.safe_load_all((DEPLOY / "server.yaml").read_text()):
            if doc["kind"] == "Deployment":
                doc = _run_this_checkout(doc, token)
            utils.create_from_dict(api_client, doc, namespace=namespace)
        url = _wait_for_server(core, namespace)
        yield namespace, url, token
    finally:
        core.delete_namespace(namespace)


def _run_this_checkout(deployment: dict[str, Any], token: str) -> dict[str, Any]:
    pod = deployment["spec"]["template"]["spec"]
    (container,) = pod["containers"]
    container["image"] = TEST_IMAGE
    container["command"] = [
        str(Path(sys.prefix) / "bin" / "python"),
        "-m",
        "jupyter",
        "server",
        "--ip=0.0.0.0",
        "--port=8888",
        "--ServerApp.root_dir=/home/jovyan",
        "--ServerApp.jpserver_extensions={'jupyter_ext': True}",
        "--SandboxExtension.gc_interval=0",
    ]
    env = {e["name"]: e for e in container["env"]}
    env["SANDBOX_KERNEL_IMAGE"] = {"name": "SANDBOX_KERNEL_IMAGE", "value": TEST_IMAGE}
    env["SANDBOX_KERNEL_USER"] = {"name": "SANDBOX_KERNEL_USER", "value": "alice"}
    env["JUPYTER_TOKEN"] = {"name": "JUPYTER_TOKEN", "value": token}
    container["env"] = list(env.values())
    # This checkout, its virtual environment and the Python that made it, at their own
    # paths; a Python under /root (pyenv's) is reached through an empty /root, as the
    # image's own is closed to the server's uid.
    mounts = {str(REPO), str(Path(sys.prefix).resolve()), str(Path(sys.base_prefix).resolve())}
    if any(m.startswith("/root/") for m in mounts):
        pod["volumes"].append({"name": "root", "emptyDir": {}})
        container["volumeMounts"].append({"name": "root", "mountPath": "/root"})
    for i, path in enumerate(sorted(mounts)):
        pod["volumes"].append(
            {"name": f"checkout{i}", "hostPath": {"path": path, "type": "Directory"}}
        )
        container["volumeMounts"].append(
            {"name": f"checkout{i}", "mountPath": path, "readOnly": True}
        )
    return deployment


def _wait_for_server(core: Any, namespace: str) -> str:
    deadline = time.monotonic() + 240
    while time.monotonic() < deadline:
        pods = core.list_namespaced_pod(
            namespace, label_selector="app.kubernetes.io/component=server"
        ).items
        for pod in pods:
            ready = any(
                c.type == "Ready" and c.status == "True" for c in pod.status.conditions or []
            )
            if ready and pod.status.pod_ip:
                return f"http://{pod.status.pod_ip}:8888"
        time.sleep(0.5)
    logs = [core.read_namespaced_pod_log(p.metadata.name, namespace)[-2000:] for p in pods]
    raise AssertionError(f"the server's pod did not get ready: {logs}")


def call(url: str, token: str, method: str = "GET", body: bytes | None = None) -> Any:
    req = urllib.request.Request(
        url, data=body, method=method, headers={"Authorization": f"token {token}"}
    )
    with urllib.request.urlopen(req, timeout=300) as response:
        raw = response.read()
    return json.loads(raw) if raw and raw[:1] in b"[{" else raw


async def test_the_server_in_the_cluster_runs_kernels_in_pods(
    deployed: tuple[str, str, str],
) -> None:
    namespace, url, token = deployed
    _, core, _, authz = clients()
    assert call(f"{url}/api/sandboxes", token) == []
    kernel = call(f"{url}/api/kernels", token, "POST", json.dumps({"name": "sandbox"}).encode())
    ws = await websocket_connect(
        f"{url.replace('http', 'ws')}/api/kernels/{kernel['id']}/channels?token={token}"
    )
    out, reply = await run_over_websocket(
        ws, "import os, socket; print(socket.gethostname(), os.getuid(), os.getcwd())", timeout=240
    )
    assert reply["status"] == "ok", (out, reply)
    assert out.split() == ["sandbox", "1000", "/workspace"]
    ws.close()
    (item,) = call(f"{url}/api/sandboxes", token)
    assert (item["backend"], item["user"], item["state"]) == ("kubernetes", "alice", "running")
    pods = core.list_namespaced_pod(namespace, label_selector="sandbox-kernel.role=sandbox").items
    assert [p.metadata.annotations["sandbox-kernel/id"] for p in pods] == [item["id"]]
    # Files through the files pod, made by the server's account too.
    sid = item["id"]
    call(f"{url}/api/sandboxes/{sid}/files/from-rest.txt", token, "PUT", b"in the cluster")
    assert call(f"{url}/api/sandboxes/{sid}/files/from-rest.txt", token) == b"in the cluster"
    # The server's account holds the shipped Role and nothing more.
    account = f"system:serviceaccount:{namespace}:sandbox-kernel-server"
    for verb, resource, sub, allowed in (
        ("create", "pods", "", True),
        ("create", "pods", "exec", True),
        ("create", "persistentvolumeclaims", "", True),
        ("get", "secrets", "", False),
        ("list", "nodes", "", False),
        ("create", "pods", "", False),  # in another namespace (below)
    ):
        review = {
            "spec": {
                "user": account,
                "resourceAttributes": {
                    "namespace": namespace if allowed or resource != "pods" else "default",
                    "verb": verb,
                    "resource": resource,
                    "subresource": sub,
                },
            }
        }
        answer = authz.create_subject_access_review(review)
        assert answer.status.allowed is allowed, (verb, resource, sub)
    call(f"{url}/api/kernels/{kernel['id']}", token, "DELETE")
    call(f"{url}/api/sandboxes/{sid}", token, "DELETE")
    assert call(f"{url}/api/sandboxes", token) == []
