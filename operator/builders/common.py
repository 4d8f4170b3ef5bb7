"""What every child of a Cluster shares: labels, the owner reference, pod hardening.

Every child is owned by its Cluster (``controller: true``), so Kubernetes'
garbage collector removes it with the Cluster, and carries the recommended
``app.kubernetes.io/*`` labels. Selectors use only the labels that never
change for a pod's lifetime (name, instance, component): a StatefulSet's
selector is immutable.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Final

Manifest = dict[str, Any]

API_VERSION: Final = "shoal.dev/v1alpha1"
KIND: Final = "Cluster"
MANAGED_BY: Final = "shoal-operator"
RUN_AS: Final = 10001
"""The uid and gid every container runs as; volumes are group-owned by it (fsGroup)."""
TMP_VOLUME: Final = "tmp"


@dataclass(frozen=True, slots=True)
class Owner:
    """The Cluster whose children are being built."""

    name: str
    namespace: str
    uid: str

    def reference(self) -> dict[str, Any]:
        return {
            "apiVersion": API_VERSION,
            "kind": KIND,
            "name": self.name,
            "uid": self.uid,
            "controller": True,
            "blockOwnerDeletion": True,
        }


def selector_labels(cluster: str, component: str) -> dict[str, str]:
    return {
        "app.kubernetes.io/name": "shoal",
        "app.kubernetes.io/instance": cluster,
        "app.kubernetes.io/component": component,
    }


def labels(cluster: str, component: str) -> dict[str, str]:
    return {**selector_labels(cluster, component), "app.kubernetes.io/managed-by": MANAGED_BY}


def metadata(owner: Owner, name: str, component: str) -> dict[str, Any]:
    return {
        "name": name,
        "namespace": owner.namespace,
        "labels": labels(owner.name, component),
        "ownerReferences": [owner.reference()],
    }


def pod_security_context() -> dict[str, Any]:
    return {
        "runAsNonRoot": True,
        "runAsUser": RUN_AS,
        "runAsGroup": RUN_AS,
        "fsGroup": RUN_AS,
        "seccompProfile": {"type": "RuntimeDefault"},
    }


def container_security_context() -> dict[str, Any]:
    return {
        "allowPrivilegeEscalation": False,
        "readOnlyRootFilesystem": True,
        "capabilities": {"drop": ["ALL"]},
    }


def tmp_volume() -> dict[str, Any]:
    """A writable /tmp: root filesystems are read-only."""
    return {"name": TMP_VOLUME, "emptyDir": {}}


def tmp_mount() -> dict[str, Any]:
    return {"name": TMP_VOLUME, "mountPath": "/tmp"}  # noqa: S108 - a private emptyDir


def env_from_field(name: str, path: str) -> dict[str, Any]:
    return {"name": name, "valueFrom": {"fieldRef": {"fieldPath": path}}}


def disruption_budget(owner: Owner, name: str, component: str) -> Manifest:
    """At most one pod of the component evicted at a time (node drains, upgrades)."""
    return {
        "apiVersion": "policy/v1",
        "kind": "PodDisruptionBudget",
        "metadata": metadata(owner, name, component),
        "spec": {
            "maxUnavailable": 1,
            "selector": {"matchLabels": selector_labels(owner.name, component)},
        },
    }


def volume_claim(
    name: str, component: str, cluster: str, size: str, storage_class: str | None
) -> Manifest:
    """A StatefulSet's volumeClaimTemplate (no owner: the StatefulSet owns the claims)."""
    spec: dict[str, Any] = {
        "accessModes": ["ReadWriteOnce"],
        "resources": {"requests": {"storage": size}},
    }
    if storage_class is not None:
        spec["storageClassName"] = storage_class
    return {
        "apiVersion": "v1",
        "kind": "PersistentVolumeClaim",
        "metadata": {"name": name, "labels": labels(cluster, component)},
        "spec": spec,
    }
