"""NetworkPolicies: tenants reach the gateways, never the brokers or etcd.

The brokers' internal listener has no authentication, so only this
Cluster's brokers (replication) and gateways (the tenants' door) reach it,
plus the operator (Kafka admin protocol) from whichever namespace it runs
in. etcd serves clients to the same set and peers only to its members.
Metrics ports stay open to any namespace: Prometheus lives elsewhere. Only
ingress is restricted; the pods' own connections are not.
"""

from __future__ import annotations

from typing import Any

from shoal.operator import endpoints
from shoal.operator.builders import brokers, etcd, gateway
from shoal.operator.builders.common import Manifest, Owner, metadata, selector_labels
from shoal.operator.cluster_spec import ClusterSpec

OPERATOR_LABELS = {"app.kubernetes.io/name": "shoal", "app.kubernetes.io/component": "operator"}


def build_network_policies(owner: Owner, spec: ClusterSpec) -> list[Manifest]:
    members = [_pods(owner, brokers.COMPONENT), _pods(owner, gateway.COMPONENT)]
    return [
        _policy(
            owner,
            endpoints.broker_name(owner.name),
            brokers.COMPONENT,
            [
                _rule([*members, _operator()], [endpoints.BROKER_PORT]),
                _rule(None, [endpoints.METRICS_PORT]),
            ],
        ),
        _policy(
            owner,
            endpoints.etcd_name(owner.name),
            etcd.COMPONENT,
            [
                _rule(
                    [*members, _pods(owner, etcd.COMPONENT), _operator()],
                    [endpoints.ETCD_CLIENT_PORT],
                ),
                _rule([_pods(owner, etcd.COMPONENT)], [endpoints.ETCD_PEER_PORT]),
            ],
        ),
        _policy(
            owner, endpoints.gateway_name(owner.name), gateway.COMPONENT, [_gateway_rule(spec)]
        ),
    ]


def _policy(owner: Owner, name: str, component: str, ingress: list[dict[str, Any]]) -> Manifest:
    return {
        "apiVersion": "networking.k8s.io/v1",
        "kind": "NetworkPolicy",
        "metadata": metadata(owner, name, component),
        "spec": {
            "podSelector": {"matchLabels": selector_labels(owner.name, component)},
            "policyTypes": ["Ingress"],
            "ingress": ingress,
        },
    }


def _pods(owner: Owner, component: str) -> dict[str, Any]:
    """This Cluster's pods of one component (a podSelector alone means this namespace)."""
    return {"podSelector": {"matchLabels": selector_labels(owner.name, component)}}


def _operator() -> dict[str, Any]:
    return {"namespaceSelector": {}, "podSelector": {"matchLabels": OPERATOR_LABELS}}


def _rule(peers: list[dict[str, Any]] | None, ports: list[int]) -> dict[str, Any]:
    """Ingress to ``ports`` from ``peers``; None: from anywhere."""
    rule: dict[str, Any] = {"ports": [{"protocol": "TCP", "port": port} for port in ports]}
    if peers is not None:
        rule["from"] = peers
    return rule


def _gateway_rule(spec: ClusterSpec) -> dict[str, Any]:
    # Each listener's bootstrap port and every broker's port after it, as one range.
    ranges = [ports for ports in (gateway.kafka_ports(spec), gateway.mtls_ports(spec)) if ports]
    return {
        "ports": [
            *({"protocol": "TCP", "port": p[0][1], "endPort": p[-1][1]} for p in ranges),
            {"protocol": "TCP", "port": endpoints.GATEWAY_HTTP_PORT},
            {"protocol": "TCP", "port": endpoints.METRICS_PORT},
        ]
    }
