"""The brokers: a StatefulSet the operator rolls itself, its headless Service and its settings.

Broker ``n`` is the pod ``<c>-broker-n`` with node id ``n`` (the pod-index
label, Kubernetes >= 1.28) and its own volume ``data-<c>-broker-n``. The
StatefulSet's updateStrategy is OnDelete: Kubernetes never restarts a broker
on its own; the operator's roller restarts one at a time, after asking the
cluster that no partition would fall below min.insync.replicas. A pod is out
of date when its ``shoal.dev/template-hash`` annotation differs from
:func:`broker_template_hash`.

Settings the user gives (``spec.topicDefaults``, ``spec.brokers.config``)
travel in the ConfigMap ``<c>-config`` as SHOAL_* variables, which ``shoal
broker`` reads; the hash covers them, so changing one rolls the brokers.
"""

from __future__ import annotations

import hashlib
import json
import re
from collections.abc import Mapping, Sequence
from typing import Any, Final

from shoal.operator import endpoints
from shoal.operator.builders.common import (
    Manifest,
    Owner,
    container_security_context,
    disruption_budget,
    env_from_field,
    labels,
    metadata,
    pod_security_context,
    selector_labels,
    tmp_mount,
    tmp_volume,
    volume_claim,
)
from shoal.operator.cluster_spec import ClusterSpec
from shoal.operator.rack import SERVICE_ACCOUNT_DIR

COMPONENT: Final = "broker"
TEMPLATE_HASH: Final = "shoal.dev/template-hash"
DEFAULT_SERVICE_ACCOUNT: Final = "default"
"""The namespace's own account, which brokers without a rack label run as."""
POD_INDEX_LABEL: Final = "apps.kubernetes.io/pod-index"
DATA_VOLUME: Final = "data"
DATA_MOUNT: Final = "/var/lib/shoal"
RACK_VOLUME: Final = "rack"
RACK_DIR: Final = "/var/run/shoal"
RACK_FILE: Final = f"{RACK_DIR}/rack"
API_ACCESS_VOLUME: Final = "kube-api-access"
NODE_READER_ROLE: Final = "shoal-broker-node-reader"
"""The ClusterRole (get nodes) the Helm chart ships; brokers with a rack label are bound to it."""
STARTUP_PROBES: Final = 90
"""Fifteen minutes, at one probe every ten seconds, for log recovery."""
TERMINATION_GRACE_SECONDS: Final = 60
"""Longer than the broker's controlled shutdown (30 s by default) moving leadership away."""


def build_brokers(owner: Owner, spec: ClusterSpec, default_image: str) -> list[Manifest]:
    children = [
        config_map(owner, spec),
        _headless_service(owner),
        _stateful_set(owner, spec, default_image),
        disruption_budget(owner, endpoints.broker_name(owner.name), COMPONENT),
    ]
    if spec.rack_label is not None:
        children += [_service_account(owner), _node_reader_binding(owner)]
    return children


def broker_template_hash(spec: ClusterSpec, default_image: str) -> str:
    """A digest of what a broker pod runs: its pod template and the settings it reads.

    Built from the same functions as the StatefulSet, for a placeholder name,
    so whatever changes a broker pod (image, settings, resources, rack, a new
    operator's pod layout) changes the hash; the broker count, and anything
    only the gateway uses, does not.
    """
    owner = Owner("cluster", "namespace", "")
    content = {
        "pod": _pod_template(owner, spec, default_image),
        "config": config_map(owner, spec)["data"],
    }
    canonical = json.dumps(content, sort_keys=True, separators=(",", ":"))
    return hashlib.sha256(canonical.encode()).hexdigest()[:32]


def outdated_brokers(pods: Sequence[Mapping[str, Any]], template_hash: str) -> list[int]:
    """Node ids of the broker pods not running ``template_hash``, highest first.

    Highest first, as a StatefulSet's own rolling update goes. The node id is
    the pod-index label, or the pod name's ordinal suffix on older Kubernetes.
    """
    outdated = [
        _node_id(pod)
        for pod in pods
        if pod.get("metadata", {}).get("annotations", {}).get(TEMPLATE_HASH) != template_hash
    ]
    return sorted(outdated, reverse=True)


def _node_id(pod: Mapping[str, Any]) -> int:
    meta = pod.get("metadata", {})
    index = meta.get("labels", {}).get(POD_INDEX_LABEL)
    if index is not None:
        return int(index)
    match = re.search(r"-([0-9]+)$", meta.get("name", ""))
    if match is None:
        raise ValueError(f"pod {meta.get('name')!r} has no pod index")
    return int(match.group(1))


def config_map(owner: Owner, spec: ClusterSpec) -> Manifest:
    data = {f"SHOAL_{key.upper()}": value for key, value in spec.broker_config.items()}
    data["SHOAL_TOPIC_DEFAULTS"] = json.dumps(dict(spec.topic_defaults), sort_keys=True)
    return {
        "apiVersion": "v1",
        "kind": "ConfigMap",
        "metadata": metadata(owner, endpoints.config_name(owner.name), COMPONENT),
        "data": dict(sorted(data.items())),
    }


def _headless_service(owner: Owner) -> Manifest:
    return {
        "apiVersion": "v1",
        "kind": "Service",
        "metadata": metadata(owner, endpoints.broker_name(owner.name), COMPONENT),
        "spec": {
            "clusterIP": "None",
            # A broker's DNS name is its identity (advertised, registered in etcd): it must
            # resolve while the broker starts or recovers, not only once it is ready.
            "publishNotReadyAddresses": True,
            "selector": selector_labels(owner.name, COMPONENT),
            "ports": [
                {
                    "name": "kafka-internal",
                    "port": endpoints.BROKER_PORT,
                    "targetPort": "kafka-internal",
                    "protocol": "TCP",
                },
                {
                    "name": "metrics",
                    "port": endpoints.METRICS_PORT,
                    "targetPort": "metrics",
                    "protocol": "TCP",
                },
            ],
        },
    }


def _env(owner: Owner) -> list[dict[str, Any]]:
    host = f"$(POD_NAME).{endpoints.broker_name(owner.name)}.{owner.namespace}.svc"
    etcd_url = endpoints.in_cluster_endpoints(owner.namespace, owner.name, 0).etcd_url
    return [
        # First: the kubelet expands $(POD_NAME) only in variables defined after it.
        env_from_field("POD_NAME", "metadata.name"),
        env_from_field("SHOAL_NODE_ID", f"metadata.labels['{POD_INDEX_LABEL}']"),
        {"name": "SHOAL_LISTEN", "value": f"0.0.0.0:{endpoints.BROKER_PORT}"},
        {"name": "SHOAL_ADVERTISE", "value": f"{host}:{endpoints.BROKER_PORT}"},
        {"name": "SHOAL_ETCD", "value": etcd_url},
        # A directory inside the volume: its root may hold lost+found.
        {"name": "SHOAL_DATA_DIR", "value": f"{DATA_MOUNT}/data"},
        {"name": "SHOAL_METRICS_LISTEN", "value": f"0.0.0.0:{endpoints.METRICS_PORT}"},
        {"name": "SHOAL_LOG_FORMAT", "value": "json"},
    ]


def _broker_container(owner: Owner, spec: ClusterSpec, image: str) -> dict[str, Any]:
    mounts = [{"name": DATA_VOLUME, "mountPath": DATA_MOUNT}, tmp_mount()]
    if spec.rack_label is not None:
        # The rack is the node's label value, which only the init container can read.
        command = ["sh", "-c", f'SHOAL_RACK="$(cat {RACK_FILE})" exec shoal broker']
        mounts.append({"name": RACK_VOLUME, "mountPath": RACK_DIR, "readOnly": True})
    else:
        command = ["shoal", "broker"]
    container: dict[str, Any] = {
        "name": "broker",
        "image": image,
        "imagePullPolicy": spec.image_pull_policy,
        "command": command,
        "env": _env(owner),
        "envFrom": [{"configMapRef": {"name": endpoints.config_name(owner.name)}}],
        "ports": [
            {"name": "kafka-internal", "containerPort": endpoints.BROKER_PORT, "protocol": "TCP"},
            {"name": "metrics", "containerPort": endpoints.METRICS_PORT, "protocol": "TCP"},
        ],
        "readinessProbe": {
            "tcpSocket": {"port": "kafka-internal"},
            "periodSeconds": 5,
            "failureThreshold": 3,
        },
        # Recovery re-validates the log tails before the listener opens, which can take
        # minutes after a crash: liveness only counts once the broker has started.
        "startupProbe": {
            "tcpSocket": {"port": "kafka-internal"},
            "periodSeconds": 10,
            "failureThreshold": STARTUP_PROBES,
        },
        "livenessProbe": {
            "tcpSocket": {"port": "kafka-internal"},
            "periodSeconds": 10,
            "failureThreshold": 6,
        },
        "volumeMounts": mounts,
        "securityContext": container_security_context(),
    }
    if spec.broker_resources:
        container["resources"] = dict(spec.broker_resources)
    return container


def _rack_init_container(label: str, spec: ClusterSpec, image: str) -> dict[str, Any]:
    return {
        "name": "rack",
        "image": image,
        "imagePullPolicy": spec.image_pull_policy,
        "command": [
            "shoal",
            "rack-of-node",
            "--label",
            label,
            "--node",
            "$(NODE_NAME)",
            "--out",
            RACK_FILE,
        ],
        "env": [env_from_field("NODE_NAME", "spec.nodeName")],
        "volumeMounts": [
            {"name": RACK_VOLUME, "mountPath": RACK_DIR},
            {"name": API_ACCESS_VOLUME, "mountPath": str(SERVICE_ACCOUNT_DIR), "readOnly": True},
        ],
        "securityContext": container_security_context(),
    }


def _api_access_volume() -> dict[str, Any]:
    """The service account token, mounted only into the init container that needs it."""
    return {
        "name": API_ACCESS_VOLUME,
        "projected": {
            "sources": [
                # What the kubelet mounts by default, in the place `shoal rack-of-node` looks.
                {"serviceAccountToken": {"path": "token", "expirationSeconds": 3607}},
                {
                    "configMap": {
                        "name": "kube-root-ca.crt",
                        "items": [{"key": "ca.crt", "path": "ca.crt"}],
                    }
                },
                {
                    "downwardAPI": {
                        "items": [
                            {"path": "namespace", "fieldRef": {"fieldPath": "metadata.namespace"}}
                        ]
                    }
                },
            ]
        },
    }


def _pod_template(owner: Owner, spec: ClusterSpec, default_image: str) -> dict[str, Any]:
    image = spec.image or default_image
    pod: dict[str, Any] = {
        # The broker never talks to the Kubernetes API; only the rack init container does.
        "automountServiceAccountToken": False,
        "terminationGracePeriodSeconds": TERMINATION_GRACE_SECONDS,
        "securityContext": pod_security_context(),
        "containers": [_broker_container(owner, spec, image)],
        "volumes": [tmp_volume()],
    }
    if spec.rack_label is None:
        # Named even when it is the default: the API server copies
        # serviceAccountName into the deprecated serviceAccount field and back,
        # so a name the apply stops sending would live on through that copy
        # (and pods would ask for the removed rack ServiceAccount).
        pod["serviceAccountName"] = DEFAULT_SERVICE_ACCOUNT
    else:
        pod["serviceAccountName"] = endpoints.broker_name(owner.name)
        pod["initContainers"] = [_rack_init_container(spec.rack_label, spec, image)]
        pod["volumes"] += [{"name": RACK_VOLUME, "emptyDir": {}}, _api_access_volume()]
        pod["topologySpreadConstraints"] = [
            {
                "maxSkew": 1,
                "topologyKey": spec.rack_label,
                # Prefer spreading; never leave a broker unscheduled for want of a rack.
                "whenUnsatisfiable": "ScheduleAnyway",
                "labelSelector": {"matchLabels": selector_labels(owner.name, COMPONENT)},
            }
        ]
    return {"metadata": {"labels": labels(owner.name, COMPONENT)}, "spec": pod}


def _stateful_set(owner: Owner, spec: ClusterSpec, default_image: str) -> Manifest:
    name = endpoints.broker_name(owner.name)
    template = _pod_template(owner, spec, default_image)
    template["metadata"]["annotations"] = {TEMPLATE_HASH: broker_template_hash(spec, default_image)}
    return {
        "apiVersion": "apps/v1",
        "kind": "StatefulSet",
        "metadata": metadata(owner, name, COMPONENT),
        "spec": {
            "serviceName": name,
            "replicas": spec.brokers,
            # Brokers find each other through etcd, not by start order.
            "podManagementPolicy": "Parallel",
            # The operator restarts brokers itself, one at a time, when the cluster says
            # it is safe; Kubernetes must not roll them on its own.
            "updateStrategy": {"type": "OnDelete"},
            "persistentVolumeClaimRetentionPolicy": {
                # A deleted Cluster keeps its data unless the spec asks otherwise.
                "whenDeleted": "Delete" if spec.broker_delete_claim else "Retain",
                # Scaling down happens only after the operator moved every partition
                # off the brokers that go: their logs are garbage, and a stale log
                # would confuse a broker that later reuses the ordinal.
                "whenScaled": "Delete",
            },
            "selector": {"matchLabels": selector_labels(owner.name, COMPONENT)},
            "template": template,
            "volumeClaimTemplates": [
                volume_claim(
                    DATA_VOLUME,
                    COMPONENT,
                    owner.name,
                    spec.broker_storage.size,
                    spec.broker_storage.storage_class_name,
                )
            ],
        },
    }


def _service_account(owner: Owner) -> Manifest:
    return {
        "apiVersion": "v1",
        "kind": "ServiceAccount",
        "metadata": metadata(owner, endpoints.broker_name(owner.name), COMPONENT),
        "automountServiceAccountToken": False,
    }


def _node_reader_binding(owner: Owner) -> Manifest:
    """Lets the brokers' init container read its Node; cluster-scoped, hence no owner."""
    meta = {
        "name": endpoints.node_reader_binding_name(owner.namespace, owner.name),
        "labels": labels(owner.name, COMPONENT),
    }
    return {
        "apiVersion": "rbac.authorization.k8s.io/v1",
        "kind": "ClusterRoleBinding",
        "metadata": meta,
        "roleRef": {
            "apiGroup": "rbac.authorization.k8s.io",
            "kind": "ClusterRole",
            "name": NODE_READER_ROLE,
        },
        "subjects": [
            {
                "kind": "ServiceAccount",
                "name": endpoints.broker_name(owner.name),
                "namespace": owner.namespace,
            }
        ],
    }
