"""The test cluster's storage: binds each claim of storage class ``sk-hostpath`` to a new
hostPath volume, a folder under ROOT on the one node, and removes the folder and the
volume once the claim is gone. Like the hostPath provisioners of kind or minikube, for
a single-node test cluster only. Standard library only (it runs beside the cluster,
before any virtual environment exists).

    python3 -I hostpath-provisioner.py KUBECONFIG_DIR ROOT

KUBECONFIG_DIR holds ca.crt, admin.crt, admin.key and server (the API's URL).
"""

import http.client
import json
import os
import shutil
import ssl
import sys
import time
import urllib.parse

CLASS = "sk-hostpath"
PROVISIONER = "sandbox-kernel.test/hostpath"


class Api:
    def __init__(self, pki: str) -> None:
        with open(os.path.join(pki, "server")) as f:
            url = urllib.parse.urlsplit(f.read().strip())
        self.host, self.port = url.hostname, url.port or 443
        self.ctx = ssl.create_default_context(cafile=os.path.join(pki, "ca.crt"))
        self.ctx.load_cert_chain(os.path.join(pki, "admin.crt"), os.path.join(pki, "admin.key"))

    def call(self, method: str, path: str, body: object = None) -> tuple[int, dict]:
        conn = http.client.HTTPSConnection(self.host, self.port, context=self.ctx, timeout=30)
        try:
            data = json.dumps(body).encode() if body is not None else None
            conn.request(method, path, body=data, headers={"Content-Type": "application/json"})
            response = conn.getresponse()
            text = response.read()
            return response.status, json.loads(text) if text else {}
        finally:
            conn.close()

    def watch(self, path: str, version: str):
        """Events of a watch from ``version`` until the server ends it."""
        conn = http.client.HTTPSConnection(self.host, self.port, context=self.ctx, timeout=60)
        try:
            conn.request("GET", f"{path}?watch=1&resourceVersion={version}&timeoutSeconds=5")
            response = conn.getresponse()
            while True:
                line = response.readline()
                if not line:
                    return
                yield json.loads(line)
        finally:
            conn.close()


def folder_of(root: str, claim: dict) -> str:
    meta = claim["metadata"]
    return os.path.join(root, f"{meta['namespace']}-{meta['name']}-{meta['uid']}")


def provision(api: Api, root: str, claim: dict) -> None:
    spec, meta = claim.get("spec", {}), claim["metadata"]
    if spec.get("storageClassName") != CLASS or spec.get("volumeName"):
        return
    if claim.get("status", {}).get("phase") not in (None, "Pending"):
        return
    folder = folder_of(root, claim)
    os.makedirs(folder, exist_ok=True)
    # Owned by nobody in particular: pods run as their own non-root uid, and hostPath
    # volumes take no fsGroup, so the folder is open to any uid (sticky, like /tmp).
    os.chmod(folder, 0o1777)
    size = spec.get("resources", {}).get("requests", {}).get("storage", "1Gi")
    volume = {
        "apiVersion": "v1",
        "kind": "PersistentVolume",
        "metadata": {
            "name": f"pvc-{meta['uid']}",
            "annotations": {"pv.kubernetes.io/provisioned-by": PROVISIONER},
        },
        "spec": {
            "capacity": {"storage": size},
            "accessModes": spec.get("accessModes") or ["ReadWriteOnce"],
            "persistentVolumeReclaimPolicy": "Delete",
            "storageClassName": CLASS,
            "volumeMode": "Filesystem",
            "hostPath": {"path": folder, "type": "Directory"},
            "claimRef": {
                "apiVersion": "v1",
                "kind": "PersistentVolumeClaim",
                "namespace": meta["namespace"],
                "name": meta["name"],
                "uid": meta["uid"],
            },
        },
    }
    status, answer = api.call("POST", "/api/v1/persistentvolumes", volume)
    if status not in (201, 409):
        print(f"hostpath: could not make a volume for {meta['name']}: {answer}", flush=True)


def reclaim(api: Api, root: str) -> None:
    """Remove the volumes (and folders) whose claims are gone."""
    status, found = api.call("GET", "/api/v1/persistentvolumes")
    if status != 200:
        return
    for volume in found.get("items", []):
        spec = volume.get("spec", {})
        if spec.get("storageClassName") != CLASS:
            continue
        if volume.get("status", {}).get("phase") not in ("Released", "Failed"):
            continue
        path = spec.get("hostPath", {}).get("path", "")
        if path.startswith(root.rstrip("/") + "/"):
            shutil.rmtree(path, ignore_errors=True)
        api.call("DELETE", f"/api/v1/persistentvolumes/{volume['metadata']['name']}")


def main(pki: str, root: str) -> None:
    api = Api(pki)
    os.makedirs(root, exist_ok=True)
    while True:
        try:
            status, claims = api.call("GET", "/api/v1/persistentvolumeclaims")
            if status != 200:
                raise OSError(f"listing claims: {status}")
            for claim in claims.get("items", []):
                provision(api, root, claim)
            reclaim(api, root)
            version = claims["metadata"]["resourceVersion"]
            for event in api.watch("/api/v1/persistentvolumeclaims", version):
                if event.get("type") in ("ADDED", "MODIFIED"):
                    provision(api, root, event["object"])
                elif event.get("type") == "DELETED":
                    reclaim(api, root)
                elif event.get("type") == "ERROR":
                    break
            # The watch ends every few seconds: a resync then (released volumes, missed events).
        except (OSError, ValueError, http.client.HTTPException) as exc:
            print(f"hostpath: {exc}; retrying", flush=True)
            time.sleep(1)


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2])
