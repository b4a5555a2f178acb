"""The Kubernetes engine: a pod per sandbox, its files on persistent volume claims.

:mod:`.backend` is the adapter; :mod:`.objects` the names, labels and manifests;
:mod:`.client` reaches the API server (kubeconfig or in-cluster); :mod:`.stream` runs
processes through the exec subresource over :mod:`.websocket`.
"""

from .backend import KubernetesBackend

__all__ = ["KubernetesBackend"]
