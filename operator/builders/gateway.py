"""The gateways: a Deployment of stateless ``shoal gateway`` pods and the Service tenants use.

``shoal gateway`` listens on a bootstrap port and one port per broker after
it (broker ``n`` at 9093+n; with a client CA, the mutual-TLS listener too, at
9292 and 9293+n), so the Service has a port per broker: scaling
the brokers changes the Service and the gateways' upstream list, and rolls
the gateways (one extra pod at a time, never fewer than asked for).
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
)
from shoal.operator.cluster_spec import ClusterSpec

COMPONENT: Final = "gateway"
TLS_VOLUME: Final = "tls"
TLS_DIR: Final = "/etc/shoal/tls"
CLIENT_CA_VOLUME: Final = "client-ca"
CLIENT_CA_DIR: Final = "/etc/shoal/client-ca"
CLIENT_CA_KEY: Final = "ca.crt"
"""The client CA Secret's key that is mounted (only it: a CA's Secret may hold its private key)."""


def build_gateway(owner: Owner, spec: ClusterSpec, default_image: str) -> list[Manifest]:
    name = endpoints.gateway_name(owner.name)
    return [
        _deployment(owner, spec, default_image),
        _service(owner, spec),
        disruption_budget(owner, name, COMPONENT),
    ]


def kafka_ports(spec: ClusterSpec) -> list[tuple[str, int]]:
    """(name, port) of the bootstrap port and every broker's port."""
    return [("kafka", endpoints.GATEWAY_KAFKA_PORT)] + [
        (f"broker-{n}", endpoints.gateway_broker_port(n)) for n in range(spec.brokers)
    ]


def mtls_ports(spec: ClusterSpec) -> list[tuple[str, int]]:
    """(name, port) of the mutual-TLS bootstrap port and every broker's port after it;
    none without a client CA."""
    if spec.gateway_client_ca_secret is None:
        return []
    return [("mtls", endpoints.GATEWAY_MTLS_PORT)] + [
        (f"mtls-broker-{n}", endpoints.gateway_mtls_broker_port(n)) for n in range(spec.brokers)
    ]


def _ports(spec: ClusterSpec) -> list[tuple[str, int]]:
    return [
        *kafka_ports(spec),
        *mtls_ports(spec),
        ("http", endpoints.GATEWAY_HTTP_PORT),
        ("metrics", endpoints.METRICS_PORT),
    ]


def _env(owner: Owner, spec: ClusterSpec) -> list[dict[str, Any]]:
    found = endpoints.in_cluster_endpoints(owner.namespace, owner.name, spec.brokers)
    listen = f"0.0.0.0:{endpoints.GATEWAY_KAFKA_PORT}"
    if spec.gateway_tls_secret is None:
        listeners = [{"name": "SHOAL_LISTEN", "value": listen}]
    else:
        listeners = [
            # Empty: no plaintext listener, the SASL_SSL one takes the same ports.
            {"name": "SHOAL_LISTEN", "value": ""},
            {"name": "SHOAL_TLS_LISTEN", "value": listen},
            {"name": "SHOAL_TLS_CERT", "value": f"{TLS_DIR}/tls.crt"},
            {"name": "SHOAL_TLS_KEY", "value": f"{TLS_DIR}/tls.key"},
        ]
    if spec.gateway_client_ca_secret is not None:
        # Same server certificate (SHOAL_TLS_CERT/KEY); clients sign in with theirs.
        listeners += [
            {"name": "SHOAL_MTLS_LISTEN", "value": f"0.0.0.0:{endpoints.GATEWAY_MTLS_PORT}"},
            {"name": "SHOAL_TLS_CLIENT_CA", "value": f"{CLIENT_CA_DIR}/{CLIENT_CA_KEY}"},
        ]
    advertise = (
        spec.gateway_advertise_host or f"{endpoints.gateway_name(owner.name)}.{owner.namespace}.svc"
    )
    return [
        # Quotas are split between gateways by id: the pod name is stable and unique.
        env_from_field("SHOAL_GATEWAY_ID", "metadata.name"),
        {"name": "SHOAL_ETCD", "value": found.etcd_url},
        *listeners,
        {"name": "SHOAL_ADVERTISE_HOST", "value": advertise},
        {"name": "SHOAL_UPSTREAM", "value": found.brokers_bootstrap},
        {"name": "SHOAL_HTTP_LISTEN", "value": f"0.0.0.0:{endpoints.GATEWAY_HTTP_PORT}"},
        {"name": "SHOAL_METRICS_LISTEN", "value": f"0.0.0.0:{endpoints.METRICS_PORT}"},
        {"name": "SHOAL_LOG_FORMAT", "value": "json"},
    ]


def _deployment(owner: Owner, spec: ClusterSpec, default_image: str) -> Manifest:
    mounts = [tmp_mount()]
    volumes: list[dict[str, Any]] = [tmp_volume()]
    if spec.gateway_tls_secret is not None:
        mounts.append({"name": TLS_VOLUME, "mountPath": TLS_DIR, "readOnly": True})
        volumes.append({"name": TLS_VOLUME, "secret": {"secretName": spec.gateway_tls_secret}})
    if spec.gateway_client_ca_secret is not None:
        mounts.append({"name": CLIENT_CA_VOLUME, "mountPath": CLIENT_CA_DIR, "readOnly": True})
        volumes.append(
            {
                "name": CLIENT_CA_VOLUME,
                "secret": {
                    "secretName": spec.gateway_client_ca_secret,
                    "items": [{"key": CLIENT_CA_KEY, "path": CLIENT_CA_KEY}],
                },
            }
        )
    container: dict[str, Any] = {
        "name": "gateway",
        "image": spec.image or default_image,
        "imagePullPolicy": spec.image_pull_policy,
        "command": ["shoal", "gateway"],
        "env": _env(owner, spec),
        "ports": [
            {"name": name, "containerPort": port, "protocol": "TCP"} for name, port in _ports(spec)
        ],
        "readinessProbe": {
            "httpGet": {"path": "/readyz", "port": "http"},
            "periodSeconds": 5,
            "failureThreshold": 3,
        },
        "livenessProbe": {
            "httpGet": {"path": "/healthz", "port": "http"},
            "initialDelaySeconds": 10,
            "periodSeconds": 10,
            "failureThreshold": 6,
        },
        "volumeMounts": mounts,
        "securityContext": container_security_context(),
    }
    if spec.gateway_resources:
        container["resources"] = dict(spec.gateway_resources)
    return {
        "apiVersion": "apps/v1",
        "kind": "Deployment",
        "metadata": metadata(owner, endpoints.gateway_name(owner.name), COMPONENT),
        "spec": {
            "replicas": spec.gateway_replicas,
            "selector": {"matchLabels": selector_labels(owner.name, COMPONENT)},
            # Tenants' connections move only to a gateway that is already ready.
            "strategy": {
                "type": "RollingUpdate",
                "rollingUpdate": {"maxUnavailable": 0, "maxSurge": 1},
            },
            "template": {
                "metadata": {"labels": labels(owner.name, COMPONENT)},
                "spec": {
                    "automountServiceAccountToken": False,
                    "securityContext": pod_security_context(),
                    "containers": [container],
                    "volumes": volumes,
                },
            },
        },
    }


def _service(owner: Owner, spec: ClusterSpec) -> Manifest:
    return {
        "apiVersion": "v1",
        "kind": "Service",
        "metadata": metadata(owner, endpoints.gateway_name(owner.name), COMPONENT),
        "spec": {
            "type": spec.gateway_service_type,
            "selector": selector_labels(owner.name, COMPONENT),
            "ports": [
                {"name": name, "port": port, "targetPort": name, "protocol": "TCP"}
                for name, port in _ports(spec)
            ],
        },
    }
